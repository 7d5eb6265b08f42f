//! `da3 depth`: depth (and confidence, sky, pose) for one image, or for every view of one
//! scene (several `--input`s).

use super::common::{check_outputs, input_files, load_input, DeviceArgs, ModelArgs};
use anyhow::{bail, Context as _};
use da3::{Colormap, LoadOptions, Policy, RefViewStrategy};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Image to process (PNG or JPEG). Default: a built-in synthetic 640x427 image. Given
    /// several times: the views of one scene, predicted together (outputs in --out-dir).
    #[arg(long)]
    input: Vec<PathBuf>,
    /// Scene outputs, per view N (input order): viewN.pfm, viewN.png, viewN.sky.pfm (mono and
    /// metric models), and poses.json with every view's camera (DualDPT models).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// How a scene of three or more views picks its reference view (whose camera is the
    /// world frame): first, middle, saddle_balanced (the official default), saddle_sim_range.
    #[arg(long, value_name = "STRATEGY", default_value = "saddle_balanced")]
    ref_view: RefViewStrategy,
    /// Known cameras of the scene's views, as JSON: {"views": [...]} (or a bare array), each
    /// with `extrinsics` (world-to-camera, 3x4 or 4x4; `extrinsics_world_to_camera` as
    /// poses.json writes it) and `intrinsics` (3x3, pixels of the input image, or of
    /// `width` x `height` when given), matched to the inputs by `name` when every entry has
    /// one, else in order. Depth comes out in the cameras' units; view 0 is the reference.
    #[arg(long, value_name = "F.json", conflicts_with = "colmap")]
    poses: Option<PathBuf>,
    /// Known cameras from a COLMAP text model: a folder with cameras.txt and images.txt
    /// (images matched to the inputs by file name), as the official `colmap` command reads.
    #[arg(long, value_name = "DIR")]
    colmap: Option<PathBuf>,
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
    if args.input.len() > 1
        || args.out_dir.is_some()
        || args.poses.is_some()
        || args.colmap.is_some()
    {
        return run_scene(args);
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
    check_outputs(&outputs, &input_files(&args.model, args.input.first()))?;
    let image = load_input(args.input.first())?;
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
    let prediction = session.predict_rgb(&image).with_context(|| {
        format!(
            "computing depth with {}; nothing written",
            args.model.describe()
        )
    })?;
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

/// Several views of one scene (or one view with --out-dir): every view's depth and the
/// scene's poses in one folder.
fn run_scene(args: Args) -> anyhow::Result<ExitCode> {
    let Some(dir) = &args.out_dir else {
        bail!("several --input images (or known --poses / --colmap cameras) are one scene: name a folder for its outputs with --out-dir");
    };
    for (flag, path) in [
        ("--pfm", &args.pfm),
        ("--png", &args.png),
        ("--pose", &args.pose),
        ("--sky", &args.sky),
    ] {
        if path.is_some() {
            bail!("{flag}: a scene writes its outputs into --out-dir (viewN.pfm, viewN.png, viewN.sky.pfm, poses.json)");
        }
    }
    if !dir.is_dir() {
        bail!("--out-dir {}: not a folder", dir.display());
    }
    let images = if args.input.is_empty() {
        vec![load_input(None)?]
    } else {
        args.input
            .iter()
            .map(|path| load_input(Some(path)))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let mut sizes = Vec::new();
    for image in &images {
        let plan = da3::preprocess::plan_resize(image.width, image.height, args.process_res)
            .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res))?;
        sizes.push((plan.width, plan.height));
    }
    if let Some(i) = sizes.iter().position(|s| *s != sizes[0]) {
        bail!(
            "the views of a scene must reach one processed size: view 0 becomes {}x{}, view {i} {}x{}",
            sizes[0].0,
            sizes[0].1,
            sizes[i].0,
            sizes[i].1
        );
    }
    let options = LoadOptions {
        policy: args.policy,
        process_res: args.process_res,
        ..args.device.options()?
    };
    let model = args.model.load_for_results(&options)?;
    let config = model.config();
    let (has_sky, has_pose) = (config.head.sky, config.cam_dim.is_some());
    // Before any computing: every output can be written and none is an input.
    let view_file = |i: usize, ext: &str| dir.join(format!("view{i}.{ext}"));
    let mut planned: Vec<(String, PathBuf)> = Vec::new();
    for i in 0..images.len() {
        planned.push((format!("view {i} depth"), view_file(i, "pfm")));
        planned.push((format!("view {i} png"), view_file(i, "png")));
        if has_sky {
            planned.push((format!("view {i} sky"), view_file(i, "sky.pfm")));
        }
    }
    if has_pose {
        planned.push(("poses".to_owned(), dir.join("poses.json")));
    }
    let outputs: Vec<(&str, &Path)> = planned
        .iter()
        .map(|(what, path)| (what.as_str(), path.as_path()))
        .collect();
    let mut inputs = input_files(&args.model, None);
    inputs.extend(args.input.iter().map(|p| ("an input image", p.as_path())));
    if let Some(p) = &args.poses {
        inputs.push(("the --poses file", p.as_path()));
    }
    check_outputs(&outputs, &inputs)?;
    let names: Vec<String> = args.input.iter().map(|p| p.display().to_string()).collect();
    let known = match (&args.poses, &args.colmap) {
        (Some(path), _) => Some(
            da3::poses::read_poses_json(path)
                .with_context(|| format!("--poses {}", path.display()))?,
        ),
        (None, Some(dir)) => Some(
            da3::poses::read_colmap_text(dir)
                .with_context(|| format!("--colmap {}", dir.display()))?,
        ),
        _ => None,
    };
    let known = match known {
        Some(list) => {
            if !has_pose {
                bail!("known cameras need a model with a camera decoder and encoder (DualDPT); this one has none");
            }
            let input_sizes: Vec<(usize, usize)> =
                images.iter().map(|im| (im.width, im.height)).collect();
            Some(da3::poses::match_views(&list, &names, &input_sizes)?)
        }
        None => None,
    };

    let mut session = model.session()?;
    let scene = match &known {
        Some(poses) => session.predict_views_with_poses_at(&images, args.process_res, poses),
        None => session.predict_views_at(&images, args.process_res, args.ref_view),
    }
    .context("computing the scene")?;
    let colormap = if args.colormap == "gray" {
        Colormap::Gray
    } else {
        Colormap::Turbo
    };
    println!(
        "{} views -> {}x{} on {}: reference view {} ({})",
        images.len(),
        scene.views[0].width,
        scene.views[0].height,
        session.device().name(),
        scene.reference,
        scene.strategy
    );
    if let Some(scale) = scene.pose_scale {
        println!("known cameras: predicted depth divided by {scale:.6} to their units");
    }
    for (i, view) in scene.views.iter().enumerate() {
        let (lo, hi) = view.depth_range();
        println!("view {i}: depth {lo:.4} .. {hi:.4}");
        view.save_pfm(view_file(i, "pfm"))?;
        view.save_png(view_file(i, "png"), colormap)?;
        if has_sky {
            view.save_sky_pfm(view_file(i, "sky.pfm"))?;
        }
    }
    if has_pose {
        let names: Vec<String> = if args.input.is_empty() {
            vec!["built-in synthetic 640x427".to_owned()]
        } else {
            args.input.iter().map(|p| p.display().to_string()).collect()
        };
        scene.save_poses_json(dir.join("poses.json"), &names)?;
    }
    println!("wrote {} views to {}", scene.views.len(), dir.display());
    Ok(ExitCode::SUCCESS)
}
