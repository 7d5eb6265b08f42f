//! `da3 stream`: a long video, a folder or a glob of frames as one reconstruction: windows of
//! frames predicted as scenes and chained by Sim(3) on their shared frames, optional loop
//! closure and a fused mesh (see `da3::stream`). Outputs in the official DA3-Streaming layout
//! (`camera_poses.txt`, `intrinsic.txt`, `pcd/combined_pcd.ply`) plus `poses.json` and
//! `mesh.ply`/`mesh.glb`.
//!
//! The first Ctrl-C stops reading frames: the frames so far are finished (last window,
//! loops, fusion) and every file is written whole. A second Ctrl-C aborts, leaving no
//! temporary file.

use super::common::{DeviceArgs, Loaded, ModelArgs};
use super::inputs::{expand_inputs, IMAGE_EXTENSIONS};
use super::video;
use anyhow::{bail, Context as _};
use da3::stream::{LoopOptions, MeshOptions, Reconstruction, Stream, StreamOptions};
use da3::{LoadOptions, Predictor};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// The frames: a video (.mp4 .mov .mkv .webm .avi .m4v, decoded at --fps by the ffmpeg
    /// program), a folder (its images, sorted by name) or a glob pattern (quote it).
    #[arg(value_name = "INPUT")]
    input: String,
    /// Folder for the outputs (created if missing).
    #[arg(long, value_name = "DIR")]
    out_dir: PathBuf,
    /// Frames per window: each window is one multi-view prediction.
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u16).range(2..=512))]
    window: u16,
    /// Frames shared by consecutive windows, on which they are aligned.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=511))]
    overlap: u16,
    /// Find revisits and close the loops (a Sim(3) pose graph over the windows).
    #[arg(long)]
    loop_closure: bool,
    /// Refine each window's alignment by point-to-plane ICP.
    #[arg(long)]
    icp: bool,
    /// Fuse the depth into a TSDF volume and write mesh.ply and mesh.glb.
    #[arg(long)]
    mesh: bool,
    /// Voxel size of the mesh in the reconstruction's units (default: the median depth /
    /// 128).
    #[arg(long, value_name = "SIZE", requires = "mesh")]
    voxel_size: Option<f64>,
    /// Most voxel blocks of the TSDF (8x8x8 voxels, about 6 KiB each): its memory bound
    /// (default about 200 MB).
    #[arg(long, default_value_t = da3::geometry::tsdf::DEFAULT_MAX_BLOCKS, requires = "mesh")]
    max_blocks: usize,
    /// Most points of pcd/combined_pcd.ply (0: no cloud).
    #[arg(long, default_value_t = 2_000_000)]
    max_points: usize,
    /// The metric branch of a nested model (as `da3 depth --metric-model`): every window in
    /// metres, so the reconstruction is.
    #[arg(long, value_name = "FILE.gguf")]
    metric_model: Option<PathBuf>,
    /// Frames per second taken from a video.
    #[arg(long, default_value_t = 2.0)]
    fps: f64,
    /// Longest side of the processed frames, 14 to 2048 (default: the model's, 504).
    #[arg(long)]
    process_res: Option<usize>,
    #[command(flatten)]
    device: DeviceArgs,
}

/// The files a stream writes in --out-dir.
struct Files {
    poses_txt: PathBuf,
    intrinsics_txt: PathBuf,
    poses_json: PathBuf,
    cloud: Option<PathBuf>,
    mesh_ply: Option<PathBuf>,
    mesh_glb: Option<PathBuf>,
}

impl Files {
    fn new(dir: &Path, args: &Args) -> Files {
        Files {
            poses_txt: dir.join("camera_poses.txt"),
            intrinsics_txt: dir.join("intrinsic.txt"),
            poses_json: dir.join("poses.json"),
            cloud: (args.max_points > 0).then(|| dir.join("pcd").join("combined_pcd.ply")),
            mesh_ply: args.mesh.then(|| dir.join("mesh.ply")),
            mesh_glb: args.mesh.then(|| dir.join("mesh.glb")),
        }
    }

    fn all(&self) -> Vec<(&'static str, &Path)> {
        let mut files = vec![
            ("camera_poses.txt", self.poses_txt.as_path()),
            ("intrinsic.txt", self.intrinsics_txt.as_path()),
            ("poses.json", self.poses_json.as_path()),
        ];
        for (what, path) in [
            ("the cloud", &self.cloud),
            ("mesh.ply", &self.mesh_ply),
            ("mesh.glb", &self.mesh_glb),
        ] {
            if let Some(p) = path {
                files.push((what, p.as_path()));
            }
        }
        files
    }

    fn write(&self, reconstruction: &Reconstruction) -> anyhow::Result<Vec<PathBuf>> {
        let mut written = Vec::new();
        let mut done = |path: &Path, result: Result<(), da3::Error>| -> anyhow::Result<()> {
            result.with_context(|| format!("writing {}", path.display()))?;
            written.push(path.to_path_buf());
            Ok(())
        };
        done(
            &self.poses_txt,
            reconstruction.save_camera_poses_txt(&self.poses_txt),
        )?;
        done(
            &self.intrinsics_txt,
            reconstruction.save_intrinsics_txt(&self.intrinsics_txt),
        )?;
        done(
            &self.poses_json,
            reconstruction.save_poses_json(&self.poses_json),
        )?;
        if let Some(p) = &self.cloud {
            done(p, reconstruction.save_cloud_ply(p))?;
        }
        if let Some(p) = &self.mesh_ply {
            done(p, reconstruction.save_mesh_ply(p))?;
        }
        if let Some(p) = &self.mesh_glb {
            done(p, reconstruction.save_mesh_glb(p))?;
        }
        Ok(written)
    }
}

fn check(args: &Args) -> anyhow::Result<()> {
    if args.overlap >= args.window {
        bail!(
            "--overlap {} with --window {}: windows must share fewer frames than they hold",
            args.overlap,
            args.window
        );
    }
    if !(args.fps.is_finite() && args.fps > 0.0 && args.fps <= 1000.0) {
        bail!(
            "--fps {}: frames per second is above 0 and at most 1000",
            args.fps
        );
    }
    if let Some(v) = args.voxel_size {
        if !(v.is_finite() && v > 0.0) {
            bail!("--voxel-size {v}: give a positive size");
        }
    }
    if args.max_blocks == 0 {
        bail!("--max-blocks 0 keeps nothing: give a budget of 1 or more blocks");
    }
    if let Some(p) = args.process_res {
        da3::Request::check_process_res(p)
            .map_err(|e| anyhow::anyhow!("--process-res {p}: {e}"))?;
    }
    Ok(())
}

fn options(args: &Args) -> StreamOptions {
    StreamOptions {
        window: usize::from(args.window),
        overlap: usize::from(args.overlap),
        process_res: args.process_res,
        icp: args.icp.then(Default::default),
        loop_closure: args.loop_closure.then(LoopOptions::default),
        mesh: args.mesh.then_some(MeshOptions {
            voxel_size: args.voxel_size,
            max_blocks: args.max_blocks,
        }),
        max_points: args.max_points,
        ..StreamOptions::default()
    }
}

/// The frames as files in order, and the temporary folder of a video's decoded frames.
fn frames(args: &Args) -> anyhow::Result<(Vec<PathBuf>, Option<da3::atomic_file::TemporaryDir>)> {
    let path = Path::new(&args.input);
    if video::is_video(path) {
        if !path.is_file() {
            bail!("{}: no such video file", path.display());
        }
        // Registered for the signal handler's cleanup: an interrupted run leaves no frames.
        let dir = da3::atomic_file::TemporaryDir::new("da3-frames.")
            .context("a temporary folder for video frames")?;
        let frames = video::extract_frames(path, args.fps, dir.path())?;
        return Ok((frames, Some(dir)));
    }
    if path.is_file() {
        bail!(
            "{}: one image is not a stream; give a video, a folder of frames or a glob pattern",
            path.display()
        );
    }
    let (frames, skipped) = expand_inputs(std::slice::from_ref(&args.input))?;
    for p in &skipped {
        log::warn!("{}: not an image format da3 reads; skipped", p.display());
    }
    if frames.is_empty() {
        bail!(
            "{}: no frames (folders are searched for {} files)",
            args.input,
            IMAGE_EXTENSIONS.join(", ")
        );
    }
    if let Some(missing) = frames.iter().find(|p| !p.exists()) {
        bail!("{}: no such file, folder or video", missing.display());
    }
    Ok((frames, None))
}

pub fn run(args: Args, stop: Arc<AtomicBool>) -> anyhow::Result<ExitCode> {
    check(&args)?;
    std::fs::create_dir_all(&args.out_dir)
        .with_context(|| format!("--out-dir {}", args.out_dir.display()))?;
    let files = Files::new(&args.out_dir, &args);
    if let Some(cloud) = &files.cloud {
        if let Some(dir) = cloud.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let mut inputs = super::common::input_files(&args.model, None);
    if let Some(p) = &args.metric_model {
        inputs.push(("the --metric-model file", p.as_path()));
    }
    super::common::check_outputs(&files.all(), &inputs)?;
    let (frames, _frames_dir) = frames(&args)?;

    args.model.warn_if_builtin();
    let load = LoadOptions {
        process_res: args.process_res,
        ..args.device.options()?
    };
    let loaded = Loaded::load(&args.model, args.metric_model.as_deref(), &load)?;
    let predictor = loaded.predictor()?;
    let device = predictor.device_name();
    let mut stream = Stream::new(predictor, options(&args))?;

    let bar = ProgressBar::new(frames.len() as u64);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30} {pos}/{len} frames  {per_sec}  ETA {eta}  {wide_msg}",
            )
            .expect("a valid template"),
        );
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let started = Instant::now();
    let mut interrupted = false;
    for (i, path) in frames.iter().enumerate() {
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        let image = da3::load_image(path)?;
        let name = path.file_name().map_or_else(
            || format!("frame{i:06}"),
            |n| n.to_string_lossy().into_owned(),
        );
        let placed = stream
            .push(image, name)
            .with_context(|| format!("frame {i} ({})", path.display()))?;
        if let Some(last) = placed.last() {
            bar.set_message(format!(
                "placed {} frames (window {})",
                last.index + 1,
                last.window
            ));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if interrupted {
        log::warn!(
            "interrupted: finishing the {} frames read so far (Ctrl-C again to abort)",
            stream.frames_pushed()
        );
    }
    if stream.frames_pushed() == 0 {
        bail!("interrupted before the first frame; nothing written");
    }
    let reconstruction = stream.finish()?;
    let written = files.write(&reconstruction)?;
    let seconds = started.elapsed().as_secs_f64();
    report(&reconstruction, &device, seconds, &written);
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

fn report(r: &Reconstruction, device: &str, seconds: f64, written: &[PathBuf]) {
    let t = &r.timings;
    let model = t.model.as_secs_f64();
    let overhead = (t.alignment + t.loop_closure + t.fusion).as_secs_f64();
    outln!(
        "{} frames in {} windows on {device}: {:.2} frames/s ({} views predicted, {:.2} views/s \
         in the model); alignment {:.2} s, loop closure {:.2} s, fusion {:.2} s: {:.1}% of the \
         model's {:.2} s",
        r.frames.len(),
        r.windows.len(),
        r.frames.len() as f64 / seconds.max(1e-9),
        t.predicted_views,
        t.predicted_views as f64 / model.max(1e-9),
        t.alignment.as_secs_f64(),
        t.loop_closure.as_secs_f64(),
        t.fusion.as_secs_f64(),
        100.0 * overhead / model.max(1e-9),
        model
    );
    let accepted = r.loops.iter().filter(|l| l.accepted).count();
    if !r.loops.is_empty() || r.optimization.is_some() {
        outln!(
            "loop closure: {} candidate(s) verified, {accepted} accepted",
            r.loops.len()
        );
    }
    if let Some(mesh) = &r.mesh {
        outln!(
            "mesh: {} vertices, {} triangles (voxel {:.4})",
            mesh.vertices.len(),
            mesh.triangles.len(),
            r.voxel_size.unwrap_or(0.0)
        );
    }
    for path in written {
        outln!("wrote {}", path.display());
    }
}
