//! `da3 depth`: depth (and confidence, sky, pose) for one image.

use super::common::{check_outputs, input_files, load_input, DeviceArgs, ModelArgs};
use anyhow::{bail, Context as _};
use da3::{Colormap, LoadOptions, Policy};
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
    da3::preprocess::plan_resize(image.width, image.height, args.process_res)
        .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res))?;
    let options = LoadOptions {
        policy: args.policy,
        process_res: args.process_res,
        ..args.device.options()?
    };
    let model = args.model.load_for_results(&options)?;
    let config = model.config();
    if args.sky.is_some() && !config.head.sky {
        bail!(
            "--sky: {} has no sky head (only mono/metric models do)",
            config.name
        );
    }
    if args.pose.is_some() && config.cam_dim.is_none() {
        bail!(
            "--pose: {} has no camera decoder (only DualDPT models do)",
            config.name
        );
    }
    let mut session = model.session()?;
    let prediction = session.predict_rgb(&image).context("computing depth")?;
    let (lo, hi) = prediction.depth_range();
    println!(
        "{}x{} -> {}x{} on {}: depth {lo:.4} .. {hi:.4}",
        image.width,
        image.height,
        prediction.width,
        prediction.height,
        session.device().name()
    );
    if let Some(path) = &args.pfm {
        prediction.save_pfm(path)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.png {
        let colormap = if args.colormap == "gray" {
            Colormap::Gray
        } else {
            Colormap::Turbo
        };
        prediction.save_png(path, colormap)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.sky {
        prediction.save_sky_pfm(path)?;
        println!("wrote {}", path.display());
    }
    if let Some(path) = &args.pose {
        prediction.save_pose_json(path)?;
        println!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
