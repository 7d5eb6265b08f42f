//! `da3 depth`: depth (and confidence, sky, pose) for one image.

use super::common::{check_outputs, input_files, load_input, DeviceArgs, ModelArgs};
use anyhow::{bail, Context as _};
use da3::da3::outputs::{fill_sky, write_atomically, write_pfm, write_png};
use da3::da3::{Colormap, LoadOptions};
use da3::residency::Policy;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Image to process (PNG or JPEG). Default: a built-in synthetic 640x427 image.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Depth as PFM (float32, rows bottom to top) at the processed resolution.
    #[arg(long)]
    pfm: Option<PathBuf>,
    /// Depth as an 8-bit PNG, near = bright.
    #[arg(long)]
    png: Option<PathBuf>,
    #[arg(long, default_value = "turbo", value_parser = ["turbo", "gray"])]
    colormap: String,
    /// Camera intrinsics and world-to-camera extrinsics as JSON (DualDPT models).
    #[arg(long, value_name = "F.json")]
    pose: Option<PathBuf>,
    /// Sky map as PFM (mono/metric models).
    #[arg(long)]
    sky: Option<PathBuf>,
    /// Longest side of the processed image, 14 to 2048 (a multiple of 14 is reached by
    /// resizing).
    #[arg(long, default_value_t = 504)]
    process_res: usize,
    /// What to do with operands the device cannot read: auto (mirror constant weights once,
    /// route anything else), route, mirror, strict.
    #[arg(long, default_value = "auto")]
    policy: Policy,
    #[command(flatten)]
    device: DeviceArgs,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.policy == Policy::Unchecked {
        bail!("--policy unchecked exists only inside `da3 repro`; use route, mirror or strict");
    }
    // Before any computing: an output that cannot be written fails now, not after inference.
    let outputs: Vec<(&str, &Path)> = [
        ("--pfm", &args.pfm),
        ("--png", &args.png),
        ("--pose", &args.pose),
        ("--sky", &args.sky),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
    .collect();
    check_outputs(&outputs, &input_files(&args.model, args.input.as_ref()))?;
    let image = load_input(args.input.as_ref())?;
    // Sizes are checked before the model is loaded or anything is allocated for them.
    da3::da3::preprocess::plan_resize(image.width, image.height, args.process_res)
        .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res))?;
    let (device, cpu) = args.device.backends()?;
    let options = LoadOptions {
        policy: args.policy,
        log_decisions: true,
        ..Default::default()
    };
    let mut model = args.model.load(device, cpu, &options)?;
    let has_sky = model.config().head.sky;
    if args.sky.is_some() && !has_sky {
        bail!(
            "--sky: {} has no sky head (only mono/metric models do)",
            model.config().name
        );
    }
    if args.pose.is_some() && model.config().cam_dim.is_none() {
        bail!(
            "--pose: {} has no camera decoder (only DualDPT models do)",
            model.config().name
        );
    }
    let mut prediction = model
        .infer(&image, args.process_res)
        .context("computing depth")?;
    let (w, h) = (prediction.width, prediction.height);
    let finite = prediction.depth.iter().filter(|v| v.is_finite()).count();
    if finite == 0 {
        bail!(
            "{}: every depth value is NaN or infinite (weights out of range?); nothing written",
            args.model.describe()
        );
    }
    if finite < prediction.depth.len() {
        log::warn!(
            "{} of {} depth values are NaN or infinite",
            prediction.depth.len() - finite,
            prediction.depth.len()
        );
    }
    if let Some(sky) = &prediction.sky {
        fill_sky(&mut prediction.depth, sky);
    }
    let (lo, hi) = prediction
        .depth
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    println!(
        "{}x{} -> {w}x{h} on {}: depth {lo:.4} .. {hi:.4}",
        image.width,
        image.height,
        model.device().name()
    );
    if let Some(path) = &args.pfm {
        write_pfm(path, &prediction.depth, w, h)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.png {
        let colormap = if args.colormap == "gray" {
            Colormap::Gray
        } else {
            Colormap::Turbo
        };
        write_png(path, &prediction.depth, w, h, colormap)?;
        println!("wrote {}", path.display());
    }
    if let (Some(path), Some(sky)) = (&args.sky, &prediction.sky) {
        write_pfm(path, sky, w, h)?;
        println!("wrote {}", path.display());
    }
    if let (Some(path), Some(pose)) = (&args.pose, &prediction.pose) {
        let json = serde_json::json!({
            "width": w,
            "height": h,
            "intrinsics": pose.intrinsics,
            "extrinsics_world_to_camera": pose.extrinsics,
        });
        write_atomically(path, |out| {
            serde_json::to_writer_pretty(out, &json).map_err(std::io::Error::other)
        })?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
