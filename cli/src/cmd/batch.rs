//! `da3 batch`: many images (files, folders, globs, video frames) with one model load per
//! device and one session per device reused for every image; outputs named after the inputs.

use super::common::{ModelArgs, MAX_THREADS};
use super::outputs::{check_model, named_outputs, write_exports, write_maps, OutputKind, Settings};
use super::video;
use anyhow::{bail, Context as _};
use da3::atomic_file;
use da3::{load_image, Request};
use da3::{Device, LoadOptions, Policy};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::collections::{HashMap, HashSet};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Images, folders (their .png/.jpg/.jpeg files, sorted, not recursive), glob patterns
    /// (quote them: 'shots/*.jpg') and videos (.mp4 .mov .mkv .webm .avi .m4v, decoded at
    /// --fps by the ffmpeg program).
    #[arg(value_name = "INPUT")]
    inputs: Vec<String>,
    /// More inputs, as the positional ones.
    #[arg(long = "input", value_name = "INPUT")]
    more_inputs: Vec<String>,
    /// Folder for the outputs and summary.json (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Outputs per image, comma-separated (see the list below).
    #[arg(long, value_delimiter = ',', default_value = "pfm,png")]
    outputs: Vec<OutputKind>,
    /// Frames per second taken from each video.
    #[arg(long, default_value_t = 1.0)]
    fps: f64,
    #[command(flatten)]
    settings: Settings,
    /// Longest side of the processed image, 14 to 2048.
    #[arg(long, default_value_t = da3::DEFAULT_PROCESS_RES)]
    process_res: usize,
    /// What to do with operands the device cannot read: auto, route, mirror, strict.
    #[arg(long, default_value = "auto")]
    policy: Policy,
    /// Where to compute, comma-separated for several devices at once (`cpu,rpc:HOST:PORT,...`):
    /// each device loads the model and takes the next image when it is free; results are
    /// in input order either way.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    device: Vec<Device>,
    /// CPU threads of the local CPU device (0: one per physical core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg"];

fn extension_in(path: &Path, list: &[&str]) -> bool {
    path.extension()
        .is_some_and(|e| list.contains(&e.to_string_lossy().to_lowercase().as_str()))
}

/// Files, folders and globs to a list of paths (folders and globs sorted, duplicates dropped).
fn expand_inputs(inputs: &[String]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for input in inputs {
        let path = Path::new(input);
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .with_context(|| format!("reading folder {input}"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && extension_in(p, IMAGE_EXTENSIONS))
                .collect();
            files.sort();
            out.extend(files);
        } else if !path.exists() && input.contains(['*', '?', '[']) {
            let mut files: Vec<PathBuf> = glob::glob(input)
                .with_context(|| format!("glob pattern {input}"))?
                .filter_map(Result::ok)
                .filter(|p| p.is_file())
                .collect();
            if files.is_empty() {
                bail!("{input}: the pattern matches no file");
            }
            files.sort();
            out.extend(files);
        } else {
            // A missing file is reported with the results, not here.
            out.push(path.to_path_buf());
        }
    }
    let mut seen = HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    Ok(out)
}

/// One image to compute.
struct Job {
    /// The input as the user named it.
    input: PathBuf,
    /// For a video frame: its number (from 0) and time in seconds.
    frame: Option<(usize, f64)>,
    /// The file to decode (the input, or an extracted frame).
    source: PathBuf,
    /// Output names start with this.
    stem: String,
}

/// What became of one input (or a video that could not be decoded).
struct Outcome {
    input: PathBuf,
    frame: Option<(usize, f64)>,
    device: Option<String>,
    result: anyhow::Result<(Vec<PathBuf>, (usize, usize))>,
    seconds: f64,
}

impl Outcome {
    fn json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({ "input": self.input });
        if let Some((n, t)) = self.frame {
            v["frame"] = n.into();
            v["time"] = t.into();
        }
        if let Some(d) = &self.device {
            v["device"] = d.clone().into();
        }
        match &self.result {
            Ok((written, (w, h))) => {
                v["status"] = "ok".into();
                v["processed_size"] = serde_json::json!([w, h]);
                v["outputs"] = serde_json::json!(written);
            }
            Err(e) => {
                v["status"] = "failed".into();
                v["error"] = format!("{e:#}").into();
            }
        }
        v["seconds"] = self.seconds.into();
        v
    }
}

/// Unique output stems (`photo`, `photo-2`, ...).
struct Stems(HashMap<String, usize>);

impl Stems {
    fn next(&mut self, stem: String) -> String {
        let n = self.0.entry(stem.clone()).or_insert(0);
        *n += 1;
        if *n == 1 {
            stem
        } else {
            format!("{stem}-{n}")
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.policy == Policy::Unchecked {
        bail!("--policy unchecked exists only inside `da3 repro`; use route, mirror or strict");
    }
    args.settings.check()?;
    if !(args.fps.is_finite() && args.fps > 0.0 && args.fps <= 1000.0) {
        bail!(
            "--fps {}: frames per second is above 0 and at most 1000",
            args.fps
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let limit = (4 * cpus).min(MAX_THREADS);
    if args.threads > limit {
        bail!("--threads {}: at most {limit} (4 per CPU available here, {cpus}, and never more than {MAX_THREADS})", args.threads);
    }
    if args.device.is_empty() {
        bail!("--device: name at least one device");
    }
    let mut seen = HashSet::new();
    if let Some(d) = args.device.iter().find(|d| !seen.insert(d.to_string())) {
        bail!("--device: {d} is named twice (one session per device)");
    }
    let mut all: Vec<String> = args.inputs.clone();
    all.extend(args.more_inputs.iter().cloned());
    if all.is_empty() {
        bail!("no inputs: name images, folders, glob patterns or videos");
    }
    let inputs = expand_inputs(&all)?;
    if inputs.is_empty() {
        bail!("no input images (folders are searched for .png, .jpg and .jpeg files)");
    }
    // Sizes are checked before the model is loaded.
    da3::Request::check_process_res(args.process_res)
        .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res))?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("--out-dir {}", args.out_dir.display()))?;
    let summary_path = args.out_dir.join("summary.json");
    super::common::check_outputs(&[("the summary", summary_path.as_path())], &[])?;

    // Models first (one per device, each on its own), so that a device that does not work
    // fails the run before anything is computed.
    let mut models = Vec::new();
    for device in &args.device {
        let options = LoadOptions {
            device: device.clone(),
            threads: args.threads,
            policy: args.policy,
            process_res: args.process_res,
            log_decisions: args.device.len() == 1,
            plan: super::plan::overrides(&[])?,
            ..LoadOptions::default()
        };
        let model = if models.is_empty() {
            args.model.load_for_results(&options)?
        } else {
            args.model.load(&options)?
        };
        models.push((device.to_string(), model));
    }
    let (maps, exports) = named_outputs(Path::new(""), "", &args.outputs);
    check_model(models[0].1.config(), &maps, &exports, &args.settings)?;

    // Inputs to jobs: videos become their frames, extracted into a temporary folder.
    let frames_dir = tempfile::Builder::new()
        .prefix("da3-frames.")
        .tempdir()
        .context("a temporary folder for video frames")?;
    let mut stems = Stems(HashMap::new());
    let mut jobs = Vec::new();
    let mut failed_early = Vec::new();
    for (i, input) in inputs.iter().enumerate() {
        let base = input
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into());
        if video::is_video(input) {
            let t0 = Instant::now();
            let dir = frames_dir.path().join(i.to_string());
            match video::extract_frames(input, args.fps, &dir) {
                Ok(frames) => {
                    let stem = stems.next(base);
                    for (n, frame) in frames.into_iter().enumerate() {
                        jobs.push(Job {
                            input: input.clone(),
                            frame: Some((n, n as f64 / args.fps)),
                            source: frame,
                            stem: format!("{stem}-{n:06}"),
                        });
                    }
                }
                Err(error) => failed_early.push((
                    jobs.len(),
                    Outcome {
                        input: input.clone(),
                        frame: None,
                        device: None,
                        result: Err(error),
                        seconds: t0.elapsed().as_secs_f64(),
                    },
                )),
            }
        } else {
            jobs.push(Job {
                input: input.clone(),
                frame: None,
                source: input.clone(),
                stem: stems.next(base),
            });
        }
    }
    // No output may be one of the inputs (an input inside --out-dir named like an output).
    let input_ids: HashSet<(u64, u64)> = inputs.iter().filter_map(|p| file_id(p)).collect();

    let bar = ProgressBar::new(jobs.len() as u64);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} images  {per_sec}  ETA {eta}  {wide_msg}",
            )
            .expect("a valid template"),
        );
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    for (_, outcome) in &failed_early {
        report_failure(&bar, outcome);
    }

    let started = Instant::now();
    let jobs = Arc::new(jobs);
    let next = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<(usize, Outcome)>();
    let settings = Arc::new(args.settings.clone());
    let outputs = Arc::new(args.outputs.clone());
    let input_ids = Arc::new(input_ids);
    let mut workers = Vec::new();
    for (name, model) in models {
        let (jobs, next, tx) = (jobs.clone(), next.clone(), tx.clone());
        let (settings, outputs, input_ids) = (settings.clone(), outputs.clone(), input_ids.clone());
        let (out_dir, process_res) = (args.out_dir.clone(), args.process_res);
        let worker = std::thread::Builder::new()
            .name(format!("da3 {name}"))
            .spawn(move || {
                let mut session = match model.session() {
                    Ok(s) => s,
                    Err(e) => return Err(anyhow::Error::new(e).context(format!("--device {name}"))),
                };
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = jobs.get(i) else {
                        return Ok(());
                    };
                    let t0 = Instant::now();
                    let result = (|| {
                        let (maps, exports) = named_outputs(&out_dir, &job.stem, &outputs);
                        let mut planned: Vec<PathBuf> =
                            maps.files().iter().map(|(_, p)| p.to_path_buf()).collect();
                        planned.extend(exports.files().into_iter().map(|(_, p)| p));
                        if let Some(p) = planned
                            .iter()
                            .find(|p| file_id(p).is_some_and(|id| input_ids.contains(&id)))
                        {
                            bail!(
                                "output {} is one of the inputs; refusing to overwrite it",
                                p.display()
                            );
                        }
                        let image = load_image(&job.source)?;
                        let name = match job.frame {
                            Some(_) => format!("{}.png", job.stem),
                            None => job
                                .input
                                .file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_else(|| job.stem.clone()),
                        };
                        let request = Request::image(&image)
                            .process_res(process_res)
                            .names([name]);
                        let output = session.run(&request)?;
                        let prediction = &output.views[0];
                        let mut written = write_maps(prediction, &maps, &settings)?;
                        written.extend(write_exports(&output, &exports, &settings)?);
                        Ok((written, (prediction.width, prediction.height)))
                    })();
                    let outcome = Outcome {
                        input: job.input.clone(),
                        frame: job.frame,
                        device: Some(name.clone()),
                        result,
                        seconds: t0.elapsed().as_secs_f64(),
                    };
                    if tx.send((i, outcome)).is_err() {
                        return Ok(());
                    }
                }
            })
            .context("starting a worker thread")?;
        workers.push(worker);
    }
    drop(tx);
    let mut results: Vec<Option<Outcome>> = (0..jobs.len()).map(|_| None).collect();
    for (i, outcome) in rx {
        if outcome.result.is_err() {
            report_failure(&bar, &outcome);
        }
        bar.set_message(outcome.input.display().to_string());
        results[i] = Some(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut worker_errors = Vec::new();
    for worker in workers {
        match worker.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => worker_errors.push(e),
            Err(_) => worker_errors.push(anyhow::anyhow!("a worker thread panicked")),
        }
    }
    // Input order: each job's outcome, with failed videos where their frames would be.
    let mut ordered: Vec<Outcome> = Vec::new();
    let mut early = failed_early.into_iter().peekable();
    for (i, outcome) in results.into_iter().enumerate() {
        while let Some((_, o)) = early.next_if(|(at, _)| *at == i) {
            ordered.push(o);
        }
        ordered.push(outcome.unwrap_or_else(|| Outcome {
            input: jobs[i].input.clone(),
            frame: jobs[i].frame,
            device: None,
            result: Err(anyhow::anyhow!("not computed: no device could take it")),
            seconds: 0.0,
        }));
    }
    ordered.extend(early.map(|(_, o)| o));
    let failed = ordered.iter().filter(|o| o.result.is_err()).count();
    let summary = serde_json::json!({
        "model": args.model.describe(),
        "devices": args.device.iter().map(|d| d.to_string()).collect::<Vec<_>>(),
        "inputs": inputs.len(),
        "images": jobs.len(),
        "ok": ordered.len() - failed,
        "failed": failed,
        "seconds": started.elapsed().as_secs_f64(),
        "results": ordered.iter().map(Outcome::json).collect::<Vec<_>>(),
    });
    atomic_file::write(&summary_path, |out| {
        serde_json::to_writer_pretty(&mut *out, &summary).map_err(std::io::Error::other)?;
        out.write_all(b"\n")
    })?;
    for e in &worker_errors {
        eprintln!("Error: {e:#}");
    }
    outln!(
        "{} of {} images done, {failed} failed; summary in {}",
        ordered.len() - failed,
        ordered.len(),
        summary_path.display()
    );
    Ok(if failed > 0 || !worker_errors.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn report_failure(bar: &ProgressBar, outcome: &Outcome) {
    if let Err(e) = &outcome.result {
        let what = match outcome.frame {
            Some((n, _)) => format!("{} frame {n}", outcome.input.display()),
            None => outcome.input.display().to_string(),
        };
        bar.suspend(|| eprintln!("{what}: {e:#} (skipped)"));
    }
}

/// Device and inode of an existing file.
#[cfg(unix)]
fn file_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}
#[cfg(not(unix))]
fn file_id(_path: &Path) -> Option<(u64, u64)> {
    None
}
