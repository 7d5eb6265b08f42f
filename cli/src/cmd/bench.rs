//! `da3 bench`: load time, first and steady-state compute, memory, residency decision.

use super::common::{check_outputs, input_files, load_input, DeviceArgs, ModelArgs};
use da3::atomic_file::write as write_atomically;
use da3::{LoadOptions, Policy, Prediction, RefViewStrategy, Request, Session, Timings};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Image (PNG, JPEG, WebP, TIFF, BMP or GIF). Default: the built-in synthetic 640x427 image.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Timed runs after the first.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Time a scene of this many views (copies of the image) through one graph, as
    /// `da3 depth` with several inputs computes it; the medians are per scene.
    #[arg(long, default_value_t = 1)]
    views: usize,
    /// The reference-view strategy of a scene (--views 3 and more select).
    #[arg(long, value_name = "STRATEGY", default_value = "saddle_balanced")]
    ref_view: RefViewStrategy,
    /// Size of the processed image: the longest side for Depth Anything 3 (default 504), the
    /// shortest side's lower bound for Depth Anything V2 (default 518).
    #[arg(long)]
    process_res: Option<usize>,
    #[arg(long, default_value = "auto")]
    policy: Policy,
    /// Load with the crashing engine's layout (camera token and final norm in host memory,
    /// no buffer), to measure what `--policy route` and `mirror` cost.
    #[arg(long)]
    crash_layout: bool,
    /// After the timed runs, compute the scene's graph once more one node at a time (each node
    /// 20 times in a row on a GPU, so that a launch counts once) and print the time of each
    /// class of op, with the products' GFLOP/s: where the time goes.
    #[arg(long)]
    profile: bool,
    /// Also write the results as JSON.
    #[arg(long, value_name = "F.json")]
    json: Option<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
}

/// Peak resident memory of this process (Linux), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let pos = p * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.runs == 0 {
        anyhow::bail!("--runs must be at least 1");
    }
    if args.views == 0 {
        anyhow::bail!("--views must be at least 1");
    }
    if let Some(path) = &args.json {
        check_outputs(
            &[("--json", path)],
            &input_files(&args.model, args.input.as_ref()),
        )?;
    }
    let image = load_input(args.input.as_ref(), &Default::default())?;
    // One image, or the same image as every view of a scene (through the scene graph).
    let images = vec![image.clone(); args.views];
    let mut request = Request::new(&images).reference(args.ref_view);
    if let Some(res) = args.process_res {
        request = request.process_res(res);
    }
    // Sizes are checked before the model is loaded or anything is allocated for them (by
    // DA3's rule; a DA2 model checks its own when it preprocesses).
    let res = args.process_res.unwrap_or(da3::DEFAULT_PROCESS_RES);
    request
        .processed_plans(res)
        .map_err(|e| anyhow::anyhow!("--process-res {res}: {e}"))?;
    let load_options = args.device.options()?;
    let device = args.device.device.resolve()?;
    let device_name = device.name();
    let (free_before, total) = device.memory();
    let started = Instant::now();
    let host_only = if args.crash_layout {
        super::repro::CRASH_LAYOUT
            .iter()
            .map(|s| s.to_string())
            .collect()
    } else {
        Vec::new()
    };
    let model = args.model.load(&LoadOptions {
        policy: args.policy,
        host_only,
        process_res: args.process_res,
        ..load_options
    })?;
    let mut model = model.session()?;
    let load_s = started.elapsed().as_secs_f64();
    // Timed from the image in memory to the post-processed result (preprocessing included).
    let predict = |session: &mut Session| -> Result<(Prediction, Timings), da3::Error> {
        let mut scene = session.run(&request)?;
        Ok((scene.views.swap_remove(0), scene.timings))
    };
    let started = Instant::now();
    let (first, _) = predict(&mut model)?;
    let first_s = started.elapsed().as_secs_f64();
    let mut times = Vec::with_capacity(args.runs);
    // The request's own split: preprocessing, then the network with upload, download and
    // post-processing (what benchmarks of other engines time from a preprocessed tensor).
    let (mut preprocess_times, mut network_times) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..args.runs {
        let started = Instant::now();
        let (prediction, timings) = predict(&mut model)?;
        times.push(started.elapsed().as_secs_f64());
        preprocess_times.push(timings.preprocess.as_secs_f64());
        network_times.push(timings.compute.as_secs_f64());
        last = Some(prediction);
    }
    preprocess_times.sort_by(f64::total_cmp);
    network_times.sort_by(f64::total_cmp);
    let (preprocess_median, network_median) = (
        percentile(&preprocess_times, 0.5),
        percentile(&network_times, 0.5),
    );
    // Reused graphs, allocations and device-side replays must not change the result.
    let last = last.expect("at least one run");
    let processed = (last.width, last.height);
    let drift = first
        .depth
        .iter()
        .zip(&last.depth)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let depth_mean = last.depth.iter().map(|&d| d as f64).sum::<f64>() / last.depth.len() as f64;
    times.sort_by(f64::total_cmp);
    let (median, p90, min) = (percentile(&times, 0.5), percentile(&times, 0.9), times[0]);
    let (free_after, _) = model.device().device().memory();
    let report = model.last_report().map(|r| r.summary()).unwrap_or_default();
    let rss = peak_rss();

    outln!(
        "model      {} ({})",
        args.model.describe(),
        model.model().config().name
    );
    // `--threads 0` means one per physical core: say how many that was.
    let threads = match args.device.threads {
        0 => da3::ggml::default_threads(),
        n => n,
    };
    outln!(
        "device     {device_name}, {threads} threads, {}x{} -> {}x{}",
        image.width,
        image.height,
        processed.0,
        processed.1
    );
    outln!("ggml cpu   {}", da3::ggml::cpu_features());
    outln!("plan       {}", model.model().plan());
    outln!(
        "convs      {}",
        if model.model().uses_half_convolutions() {
            "f16 kernels, ggml's direct convolution"
        } else {
            "f32 kernels"
        }
    );
    let folded = model.model().folded_layers();
    if folded > 0 {
        outln!("folded     norms and layer scales into {folded} linear layers");
    }
    if model.model().uses_vision_rope() {
        outln!("rope       one vision-mode node per query and key (heads laid out at load)");
    }
    if model.model().uses_centred_qk_heads() {
        outln!("qk-norm    RMS norms of heads centred at load (one fused kernel on GPUs)");
    }
    outln!("load       {:.1} ms", load_s * 1e3);
    outln!(
        "first      {:.1} ms (graph build, allocation, compute)",
        first_s * 1e3
    );
    if args.views == 1 {
        outln!(
            "per image  median {:.1} ms, p90 {:.1} ms, min {:.1} ms over {} runs",
            median * 1e3,
            p90 * 1e3,
            min * 1e3,
            args.runs
        );
    } else {
        outln!(
            "per scene  {} views: median {:.1} ms ({:.1} ms per view, {:.1} views/s), p90 {:.1} ms, min {:.1} ms over {} runs",
            args.views,
            median * 1e3,
            median * 1e3 / args.views as f64,
            args.views as f64 / median,
            p90 * 1e3,
            min * 1e3,
            args.runs
        );
    }
    outln!(
        "split      median preprocessing {:.2} ms, network {:.2} ms ({:.1} views/s: upload, \
         compute, download, post-processing)",
        preprocess_median * 1e3,
        network_median * 1e3,
        args.views as f64 / network_median
    );
    outln!("depth      mean {depth_mean:.6}, last run vs first: max abs difference {drift:.3e}");
    if let Some(rss) = rss {
        outln!("peak RSS   {:.1} MiB", rss as f64 / (1u64 << 20) as f64);
    }
    if total > 0 && !model.device().is_cpu() {
        outln!(
            "device mem {:.1} MiB used by this process (free before/after)",
            free_before.saturating_sub(free_after) as f64 / (1u64 << 20) as f64
        );
    }
    outln!("{report}");
    let profile = if args.profile {
        // On a device each node runs 20 times per call, so that the launch and the wait count
        // once.
        let repeats = if model.device().is_cpu() { 1 } else { 20 };
        let times = model.profile_scene(processed.0, processed.1, args.views, repeats)?;
        let classes = da3::ggml::profile::op_classes(&times);
        outln!(
            "profile    one node at a time ({repeats} call(s) each; nodes our CUDA kernels take \
             are timed as ggml computes them), by class of op:\n{}",
            da3::ggml::profile::op_class_table(&classes, 25).trim_end()
        );
        classes
    } else {
        Vec::new()
    };
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "model": args.model.describe(),
            "preset": model.model().config().name,
            "depth_mean": depth_mean,
            "depth_drift_first_to_last": drift,
            "device": device_name,
            "threads": threads,
            "cpu": da3::ggml::cpu_features(),
            "plan": model.model().plan().to_json(),
            "input": [image.width, image.height],
            "views": args.views,
            "processed": [processed.0, processed.1],
            "load_ms": load_s * 1e3,
            "first_ms": first_s * 1e3,
            "median_ms": median * 1e3,
            "p90_ms": p90 * 1e3,
            "min_ms": min * 1e3,
            "preprocess_median_ms": preprocess_median * 1e3,
            "network_median_ms": network_median * 1e3,
            "runs_ms": times.iter().map(|t| t * 1e3).collect::<Vec<_>>(),
            "peak_rss_bytes": rss,
            "device_bytes_used": if total > 0 { Some(free_before.saturating_sub(free_after)) } else { None },
            "half_convolutions": model.model().uses_half_convolutions(),
            "folded_layers": folded,
            "vision_rope": model.model().uses_vision_rope(),
            "centred_qk_heads": model.model().uses_centred_qk_heads(),
            "crash_layout": args.crash_layout,
            "policy": format!("{:?}", args.policy),
            "residency": report,
            "profile": profile.iter().map(|c| serde_json::json!({
                "class": c.class, "ms": c.seconds * 1e3, "nodes": c.nodes, "gflop": c.flops / 1e9,
            })).collect::<Vec<_>>(),
        });
        write_atomically(path, |out| {
            serde_json::to_writer_pretty(out, &json).map_err(std::io::Error::other)
        })?;
    }
    Ok(ExitCode::SUCCESS)
}
