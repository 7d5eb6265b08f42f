//! `da3 depth`: depth (and confidence, sky, pose) for one image, or for every view of one
//! scene (several `--input`s).

use super::common::{check_outputs, input_files, load_input, DeviceArgs, Loaded, ModelArgs};
use super::outputs::{
    check_colmap_folder, check_file_names, check_model, create_out_dir, named_outputs,
    write_exports, write_maps, Exports, Maps, OutputKind, Settings,
};
use super::remote::{self, Job, RemoteDevice, WorkerArgs};
use anyhow::{bail, Context as _};
use da3::{Config, DepthUnit, Device, Focal, LoadOptions, Output, Policy, Predictor};
use da3::{Prediction, RefViewStrategy};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Image to process (PNG, JPEG, WebP, TIFF, BMP, GIF). Default: a built-in synthetic
    /// 640x427 image. Given several times: the views of one scene, predicted together (outputs
    /// in --out-dir).
    #[arg(long)]
    input: Vec<PathBuf>,
    /// Scene outputs, per view N (input order): viewN.pfm, viewN.png, viewN.sky.pfm (mono and
    /// metric models), and poses.json with every view's camera (DualDPT models).
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// How a scene of three or more views picks its reference view (whose camera is the
    /// world frame): first, middle, saddle_balanced (the official default), saddle_sim_range,
    /// or a view's index (0 the first input) for any number of views.
    #[arg(long, value_name = "STRATEGY", default_value = "saddle_balanced")]
    ref_view: RefViewStrategy,
    /// Known cameras of the scene's views, as JSON: {"views": [...]} (or a bare array), each
    /// with `extrinsics` (world-to-camera, 3x4 or 4x4; `extrinsics_world_to_camera` as
    /// poses.json writes it) and `intrinsics` (3x3, pixels of the input image, or of
    /// `width` x `height` when given), matched to the inputs by `name` when every entry has
    /// one, else in order. Depth comes out in the cameras' units; view 0 is the reference.
    /// For the metric model: the intrinsics give the focal length its metres take, and the
    /// cameras place the views.
    #[arg(long, value_name = "F.json", conflicts_with = "poses_colmap")]
    poses: Option<PathBuf>,
    /// Known cameras from a COLMAP text model: a folder with cameras.txt and images.txt
    /// (images matched to the inputs by file name), as the official `colmap` command reads.
    /// (`--colmap DIR` writes one.)
    #[arg(long, value_name = "DIR")]
    poses_colmap: Option<PathBuf>,
    /// Cameras from the ray branch instead of the camera decoder (the official
    /// `--use-ray-pose`): a RANSAC homography per view, fixed-seed samples (DualDPT models
    /// whose file has the ray branch).
    #[arg(long, conflicts_with_all = ["poses", "poses_colmap"])]
    ray_pose: bool,
    /// The metric branch of a nested model (depth-anything.cpp's `...-nested-metric.gguf`,
    /// or a metric-large file): --model is then the any-view branch, and depth, poses and 3D
    /// exports come out in metres (the official DA3NESTED alignment); sky maps come from
    /// this branch.
    #[arg(long, value_name = "FILE.gguf", conflicts_with_all = ["poses", "poses_colmap"])]
    metric_model: Option<PathBuf>,
    /// Depth as PFM (float32, rows bottom to top) at the processed resolution.
    #[arg(long)]
    pfm: Option<PathBuf>,
    /// Depth as an 8-bit PNG, near = bright (--colormap).
    #[arg(long)]
    png: Option<PathBuf>,
    /// Depth as a 16-bit greyscale PNG, linear from its minimum (0) to its maximum (65535),
    /// the range in the PNG's text chunks depth_min / depth_max.
    #[arg(long, value_name = "F.png")]
    png16: Option<PathBuf>,
    /// Confidence as PFM (DualDPT models).
    #[arg(long, value_name = "F.pfm")]
    conf: Option<PathBuf>,
    /// Camera intrinsics and world-to-camera extrinsics as JSON (DualDPT models).
    #[arg(long, value_name = "F.json")]
    pose: Option<PathBuf>,
    /// Sky map as PFM (mono/metric models).
    #[arg(long)]
    sky: Option<PathBuf>,
    /// Coloured point cloud as binary PLY (world frame; confidence-filtered, sky dropped);
    /// for a scene, every view in one cloud.
    #[arg(long, value_name = "F.ply")]
    ply: Option<PathBuf>,
    /// Point cloud and camera frustums as glb (glTF 2.0), aligned as the official export.
    #[arg(long, value_name = "F.glb")]
    glb: Option<PathBuf>,
    /// COLMAP sparse model (cameras/images/points3D, .txt and .bin) in this folder.
    #[arg(long, value_name = "DIR")]
    colmap: Option<PathBuf>,
    /// depth, conf, extrinsics, intrinsics as the official mini_npz archive.
    #[arg(long, value_name = "F.npz")]
    npz: Option<PathBuf>,
    /// The scene's 3D Gaussians (one per pixel of every view, from the Gaussian head of
    /// DA3-GIANT) as a 3DGS PLY file, pruned as the official export prunes (image borders,
    /// the deepest 10% of each view).
    #[arg(long, value_name = "F.ply")]
    gs_ply: Option<PathBuf>,
    /// A video of the scene's 3D Gaussians rendered along --gs-trajectory, colour beside
    /// depth, at the processed size (MP4; needs the `ffmpeg` program).
    #[arg(long, value_name = "F.mp4")]
    gs_video: Option<PathBuf>,
    /// The camera path of --gs-video: extend (the official default: the views' cameras
    /// interpolated and smoothed, with a wander and a dolly zoom at the middle), smooth,
    /// original, wander, dolly-zoom. One view always gets a wander.
    #[arg(long, default_value = "extend", value_name = "PATH")]
    gs_trajectory: da3::gaussians::Trajectory,
    /// Scene mode: the maps written per view N into --out-dir (viewN.pfm, viewN.png,
    /// viewN.depth16.png, viewN.conf.pfm, viewN.sky.pfm). Default: pfm,png and sky where the
    /// model has a sky head.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    view_maps: Option<Vec<ViewMap>>,
    #[command(flatten)]
    settings: Settings,
    /// Read the inputs' pixels as stored, ignoring their EXIF orientation (as the official
    /// loader does), instead of upright.
    #[arg(long)]
    ignore_exif_orientation: bool,
    /// Print one JSON object on stdout instead of the text lines: the device, the reference
    /// view and scales, each view's sizes, depth range and camera, and the files written.
    #[arg(long)]
    json: bool,
    /// Size of the processed image, 14 to 2048 (multiples of 14 are reached by resizing):
    /// the longest side for Depth Anything 3 (default 504), the shortest side's lower bound
    /// for Depth Anything V2 (default 518).
    #[arg(long)]
    process_res: Option<usize>,
    /// What to do with operands the device cannot read: auto (mirror constant weights once,
    /// route anything else), route, mirror, strict.
    #[arg(long, default_value = "auto")]
    policy: Policy,
    #[command(flatten)]
    device: DeviceArgs,
    /// For an `rpc:` device: seconds to wait for the model to load, and then for the result,
    /// before the device counts as stalled (its worker process is killed; exit 1).
    #[arg(long, value_name = "SECS", default_value_t = remote::DEFAULT_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..))]
    device_timeout: u64,
}

/// What `--view-maps` may name: the per-view maps of a scene (its cameras go to poses.json,
/// its 3D exports to --ply/--glb/--npz/--colmap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ViewMap {
    /// depth PFM (viewN.pfm)
    Pfm,
    /// 8-bit colour-mapped depth (viewN.png)
    Png,
    /// 16-bit depth (viewN.depth16.png)
    Png16,
    /// confidence PFM (viewN.conf.pfm)
    Conf,
    /// sky PFM (viewN.sky.pfm)
    Sky,
}

impl From<ViewMap> for OutputKind {
    fn from(map: ViewMap) -> Self {
        match map {
            ViewMap::Pfm => OutputKind::Pfm,
            ViewMap::Png => OutputKind::Png,
            ViewMap::Png16 => OutputKind::Png16,
            ViewMap::Conf => OutputKind::Conf,
            ViewMap::Sky => OutputKind::Sky,
        }
    }
}

impl Args {
    /// The process resolution the sizes are checked at before the model is loaded (DA3's
    /// rule; a DA2 model checks its own when it preprocesses).
    fn process_res_checked(&self) -> usize {
        self.process_res.unwrap_or(da3::DEFAULT_PROCESS_RES)
    }

    fn read_options(&self) -> da3::ReadOptions {
        da3::ReadOptions {
            apply_orientation: !self.ignore_exif_orientation,
        }
    }

    fn exports(&self) -> Exports {
        Exports {
            ply: self.ply.clone(),
            glb: self.glb.clone(),
            npz: self.npz.clone(),
            colmap: self.colmap.clone(),
            gs_ply: self.gs_ply.clone(),
            gs_video: self.gs_video.clone(),
            gs_trajectory: self.gs_trajectory,
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.policy == Policy::Unchecked {
        bail!("--policy unchecked exists only inside `da3 repro`; use route, mirror or strict");
    }
    args.settings.check()?;
    if args.input.len() > 1
        || args.out_dir.is_some()
        || args.poses.is_some()
        || args.poses_colmap.is_some()
    {
        return run_scene(args);
    }
    if args.view_maps.is_some() {
        bail!("--view-maps: only a scene (several --input, or --out-dir) writes per-view maps");
    }
    let maps = Maps {
        pfm: args.pfm.clone(),
        png: args.png.clone(),
        png16: args.png16.clone(),
        conf: args.conf.clone(),
        sky: args.sky.clone(),
        pose: args.pose.clone(),
    };
    let exports = args.exports();
    check_file_names(&maps, &exports)?;
    // Before any computing: an output that cannot be written fails now, not after inference.
    let export_files = exports.files();
    let mut outputs: Vec<(&str, &Path)> = maps.files();
    outputs.extend(export_files.iter().map(|(f, p)| (*f, p.as_path())));
    let mut inputs = input_files(&args.model, args.input.first());
    if let Some(p) = &args.metric_model {
        inputs.push(("the --metric-model file", p.as_path()));
    }
    check_outputs(&outputs, &inputs)?;
    if let Some(dir) = &exports.colmap {
        check_colmap_folder(dir)?;
    }
    if exports.gs_video.is_some() {
        super::video::check_ffmpeg("--gs-video")?;
    }
    let image = load_input(args.input.first(), &args.read_options())?;
    // After the input: a video named by --input gets its own advice first.
    if maps.files().is_empty() && !exports.any() {
        bail!(
            "no output asked for: name at least one of --png, --pfm, --png16, --conf, --sky, \
             --pose, --ply, --glb, --npz, --colmap, --gs-ply, --gs-video (or --out-dir for a \
             folder of maps)"
        );
    }
    let job = Job {
        images: std::slice::from_ref(&image),
        names: vec![input_name(args.input.first())],
        process_res: args.process_res,
        reference: RefViewStrategy::default(),
        ray_pose: args.ray_pose,
        poses: None,
        gaussians: args.exports().gaussians(),
    };
    // Sizes are checked before the model is loaded or anything is allocated for them.
    job.request()
        .processed_plans(args.process_res_checked())
        .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res_checked()))?;
    let options = LoadOptions {
        policy: args.policy,
        process_res: args.process_res,
        gaussians: args.exports().gaussians(),
        ..args.device.options()?
    };
    let (mut predictor, config) = Compute::start(&args, &options)?;
    check_model(&config, &maps, &exports, &args.settings)?;
    let output = predictor.run(&job, args.settings.focal().as_ref(), || {
        format!(
            "computing depth with {}; nothing written",
            args.model.describe()
        )
    })?;
    let prediction = &output.views[0];
    let (lo, hi) = prediction.depth_range();
    if !args.json {
        outln!(
            "{}x{} -> {}x{} on {}: {} {lo:.4} .. {hi:.4} ({})",
            image.width,
            image.height,
            prediction.width,
            prediction.height,
            predictor.device_name(),
            match prediction.depth_unit {
                DepthUnit::Disparity => "disparity",
                _ => "depth",
            },
            prediction.depth_unit
        );
        if let Some(line) = metric_line(prediction) {
            outln!("{line}");
        }
        if let Some(scale) = output.metric_scale {
            outln!("nested model: any-view depth times {scale:.6} to the metric branch's metres");
        }
    }
    let mut written = write_maps(prediction, &maps, &args.settings)?;
    written.extend(write_exports(&output, &exports, &args.settings)?);
    if args.json {
        let summary = run_summary(&output, &predictor.device_name(), &written);
        outln!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    for path in written {
        outln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--json`: what a run computed and wrote, for scripts: the device, the reference view and
/// scales, each view's input and processed sizes and depth range, and the files written.
fn run_summary(output: &da3::Output, device: &str, written: &[PathBuf]) -> serde_json::Value {
    let views: Vec<serde_json::Value> = output
        .views
        .iter()
        .map(|v| {
            let (lo, hi) = v.depth_range();
            serde_json::json!({
                "name": v.name,
                "input_size": [v.input_size.0, v.input_size.1],
                "processed_size": [v.width, v.height],
                "depth_min": lo,
                "depth_max": hi,
                "pose": v.pose.map(|p| serde_json::json!({
                    "intrinsics": p.intrinsics,
                    "extrinsics_world_to_camera": p.extrinsics,
                })),
            })
        })
        .collect();
    serde_json::json!({
        "device": device,
        "reference": output.reference,
        "ref_view_strategy": output.strategy.name(),
        "pose_scale": output.pose_scale,
        "metric_scale": output.metric_scale,
        "views": views,
        "written": written,
    })
}

/// How a metric model's depth reached metres: the focal length and where it came from.
fn metric_line(view: &Prediction) -> Option<String> {
    let focal = view
        .metric_focal
        .filter(|_| view.depth_unit == DepthUnit::Metres)?;
    Some(format!(
        "metric model: depth in metres = focal {:.2} px (of the {}x{} processed image; {}) x \
         output / 300",
        focal.pixels, view.width, view.height, focal.source
    ))
}

/// The file name of an input (COLMAP's image name).
fn input_name(input: Option<&PathBuf>) -> String {
    input
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "synthetic.png".into())
}

/// Several views of one scene (or one view with --out-dir): every view's depth and the
/// scene's poses in one folder.
fn run_scene(args: Args) -> anyhow::Result<ExitCode> {
    let Some(dir) = &args.out_dir else {
        bail!("several --input images (or known --poses / --poses-colmap cameras) are one scene: name a folder for its outputs with --out-dir");
    };
    for (flag, path) in [
        ("--pfm", &args.pfm),
        ("--png", &args.png),
        ("--png16", &args.png16),
        ("--conf", &args.conf),
        ("--pose", &args.pose),
        ("--sky", &args.sky),
    ] {
        if path.is_some() {
            bail!("{flag}: a scene writes its maps into --out-dir (viewN.pfm, viewN.png, viewN.sky.pfm, poses.json; --view-maps chooses)");
        }
    }
    create_out_dir(dir)?;
    let images = if args.input.is_empty() {
        vec![load_input(None, &args.read_options())?]
    } else {
        args.input
            .iter()
            .map(|path| load_input(Some(path), &args.read_options()))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    // The names carried to poses.json (and, as file names, to the COLMAP model).
    let names: Vec<String> = match args.input.is_empty() {
        true => vec![input_name(None)],
        false => args.input.iter().map(|p| p.display().to_string()).collect(),
    };
    let mut scene = Job {
        images: &images,
        names: names.clone(),
        process_res: args.process_res,
        reference: args.ref_view,
        ray_pose: args.ray_pose,
        poses: None,
        gaussians: args.exports().gaussians(),
    };
    scene
        .request()
        .processed_plans(args.process_res_checked())
        .map_err(|e| anyhow::anyhow!("--process-res {}: {e}", args.process_res_checked()))?;
    let options = LoadOptions {
        policy: args.policy,
        process_res: args.process_res,
        camera_encoder: args.poses.is_some() || args.poses_colmap.is_some(),
        gaussians: args.exports().gaussians(),
        ..args.device.options()?
    };
    let (mut predictor, config) = Compute::start(&args, &options)?;
    let (has_sky, has_pose) = (config.head.sky, config.cam_dim.is_some());
    // The metric model's cameras are the pinholes of its focal lengths, in poses.json too.
    let has_camera = has_pose || config.is_metric();
    let view_maps = match &args.view_maps {
        Some(list) => list.iter().map(|&m| OutputKind::from(m)).collect(),
        None if has_sky => vec![OutputKind::Pfm, OutputKind::Png, OutputKind::Sky],
        None => vec![OutputKind::Pfm, OutputKind::Png],
    };
    let exports = args.exports();
    let per_view: Vec<Maps> = (0..images.len())
        .map(|i| named_outputs(dir, &format!("view{i}"), &view_maps).0)
        .collect();
    check_model(&config, &per_view[0], &exports, &args.settings)?;
    // Before any computing: every output can be written and none is an input.
    let mut planned: Vec<(String, PathBuf)> = Vec::new();
    for (i, maps) in per_view.iter().enumerate() {
        for (flag, path) in maps.files() {
            planned.push((format!("view {i} {}", &flag[2..]), path.to_path_buf()));
        }
    }
    if has_camera {
        planned.push(("poses".to_owned(), dir.join("poses.json")));
    }
    for (flag, path) in exports.files() {
        planned.push((flag.to_owned(), path));
    }
    let outputs: Vec<(&str, &Path)> = planned
        .iter()
        .map(|(what, path)| (what.as_str(), path.as_path()))
        .collect();
    let mut inputs = input_files(&args.model, None);
    if let Some(p) = &args.metric_model {
        inputs.push(("the --metric-model file", p.as_path()));
    }
    inputs.extend(args.input.iter().map(|p| ("an input image", p.as_path())));
    if let Some(p) = &args.poses {
        inputs.push(("the --poses file", p.as_path()));
    }
    check_outputs(&outputs, &inputs)?;
    if let Some(colmap) = &exports.colmap {
        check_colmap_folder(colmap)?;
    }
    if exports.gs_video.is_some() {
        super::video::check_ffmpeg("--gs-video")?;
    }
    let known = match (&args.poses, &args.poses_colmap) {
        (Some(path), _) => Some(
            da3::poses::read_poses_json(path)
                .with_context(|| format!("--poses {}", path.display()))?,
        ),
        (None, Some(dir)) => Some(
            da3::poses::read_colmap_text(dir)
                .with_context(|| format!("--poses-colmap {}", dir.display()))?,
        ),
        _ => None,
    };
    let known = match known {
        Some(list) => {
            if !has_pose && !config.is_metric() {
                bail!("known cameras need a model with a camera decoder and encoder (DualDPT), or the metric model (for their focal lengths); this one is neither");
            }
            let input_sizes: Vec<(usize, usize)> =
                images.iter().map(|im| (im.width, im.height)).collect();
            Some(da3::poses::match_views(&list, &names, &input_sizes)?)
        }
        None => None,
    };

    scene.poses = known.as_deref();
    let focal = args.settings.focal();
    let scene = predictor.run(&scene, focal.as_ref(), || "computing the scene".to_owned())?;
    let text = !args.json;
    if text {
        outln!(
            "{} views -> {}x{} on {}: reference view {} ({})",
            images.len(),
            scene.views[0].width,
            scene.views[0].height,
            predictor.device_name(),
            scene.reference,
            scene.strategy
        );
        if let Some(scale) = scene.pose_scale {
            outln!("known cameras: predicted depth divided by {scale:.6} to their units");
        }
        if let Some(scale) = scene.metric_scale {
            outln!("nested model: any-view depth times {scale:.6} to the metric branch's metres");
        }
    }
    let mut written = Vec::new();
    for (i, (view, maps)) in scene.views.iter().zip(&per_view).enumerate() {
        let (lo, hi) = view.depth_range();
        if text {
            outln!("view {i}: depth {lo:.4} .. {hi:.4} ({})", view.depth_unit);
            if let Some(line) = metric_line(view) {
                outln!("view {i}: {line}");
            }
        }
        written.extend(write_maps(view, maps, &args.settings)?);
    }
    if has_camera {
        let path = dir.join("poses.json");
        scene.save_poses_json(&path)?;
        written.push(path);
    }
    let exported = write_exports(&scene, &exports, &args.settings)?;
    if !text {
        written.extend(exported);
        let summary = run_summary(&scene, &predictor.device_name(), &written);
        outln!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("wrote {} views to {}", scene.views.len(), dir.display());
    for path in exported {
        outln!("wrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Where `da3 depth` computes: a predictor in this process, or for an `rpc:` device a worker
/// process ([`remote`]), so that a remote device that dies or stalls is an error, not the end
/// of this process.
enum Compute {
    Local(Box<dyn Predictor>),
    Remote(RemoteDevice),
}

impl Compute {
    /// Loads the model on the device; with the configuration the outputs are checked against.
    fn start(args: &Args, options: &LoadOptions) -> anyhow::Result<(Compute, Config)> {
        args.model.warn_if_builtin();
        let metric_model = args.metric_model.as_deref();
        if !matches!(options.device, Device::Rpc(_)) {
            let model = Loaded::load(&args.model, metric_model, options)?;
            return Ok((Compute::Local(model.predictor()?), model.config()));
        }
        let config = Loaded::config_of_files(&args.model, metric_model)?;
        let worker = WorkerArgs::new(
            &args.model,
            args.metric_model.clone(),
            args.device.clone(),
            options,
        )
        .with_focal(args.settings.focal().as_ref());
        let mut remote = RemoteDevice::start(&worker, Duration::from_secs(args.device_timeout))?;
        match remote.wait_ready() {
            Ok(Ok(())) => Ok((Compute::Remote(remote), config)),
            Ok(Err(load_error)) => Err(load_error),
            Err(failure) => bail!("--device {}: {failure}; nothing written", remote.device),
        }
    }

    /// Computes `job` (a metric model's metres at `focal`, which a remote worker was started
    /// with); its errors in the context `what` gives, a remote device's failure named after
    /// the device.
    fn run(
        &mut self,
        job: &Job,
        focal: Option<&Focal>,
        what: impl Fn() -> String,
    ) -> anyhow::Result<Output> {
        match self {
            Compute::Local(predictor) => predictor.run(&job.request_with(focal)).with_context(what),
            Compute::Remote(remote) => match remote.run(job) {
                Ok(result) => result.with_context(what),
                Err(failure) => bail!("--device {}: {failure}; nothing written", remote.device),
            },
        }
    }

    fn device_name(&self) -> String {
        match self {
            Compute::Local(predictor) => predictor.device_name(),
            Compute::Remote(remote) => remote.device_name().to_owned(),
        }
    }
}
