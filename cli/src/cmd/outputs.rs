//! What `da3 depth` and `da3 batch` write for a prediction: maps (depth PFM/PNG/16-bit PNG,
//! confidence, sky, pose) and 3D exports (PLY, glb, COLMAP, npz) of one view or a scene.

use anyhow::{bail, Context as _};
use da3::export::{ExportOptions, GaussianPlyOptions};
use da3::gaussians::Trajectory;
use da3::{Colormap, Config, Focal, Prediction};
use std::borrow::Cow;
use std::path::{Path, PathBuf};

/// Where each map of one view goes (`None`: not written).
#[derive(Debug, Default, Clone)]
pub struct Maps {
    pub pfm: Option<PathBuf>,
    pub png: Option<PathBuf>,
    pub png16: Option<PathBuf>,
    pub conf: Option<PathBuf>,
    pub sky: Option<PathBuf>,
    pub pose: Option<PathBuf>,
}

/// Where the 3D exports of a view or scene go.
#[derive(Debug, Default, Clone)]
pub struct Exports {
    pub ply: Option<PathBuf>,
    pub glb: Option<PathBuf>,
    pub npz: Option<PathBuf>,
    /// A folder (created if missing; its parent must exist).
    pub colmap: Option<PathBuf>,
    /// The scene's 3D Gaussians as a 3DGS PLY (models with a Gaussian head).
    pub gs_ply: Option<PathBuf>,
    /// A video of the Gaussians rendered along `gs_trajectory` (MP4, through ffmpeg).
    pub gs_video: Option<PathBuf>,
    pub gs_trajectory: Trajectory,
}

impl Maps {
    /// `(flag, path)` of every map that is set.
    pub fn files(&self) -> Vec<(&'static str, &Path)> {
        [
            ("--pfm", &self.pfm),
            ("--png", &self.png),
            ("--png16", &self.png16),
            ("--conf", &self.conf),
            ("--sky", &self.sky),
            ("--pose", &self.pose),
        ]
        .into_iter()
        .filter_map(|(flag, p)| p.as_deref().map(|p| (flag, p)))
        .collect()
    }
}

impl Exports {
    /// `(flag, path)` of every export file that is set (the COLMAP folder's files included).
    pub fn files(&self) -> Vec<(&'static str, PathBuf)> {
        let mut files: Vec<(&'static str, PathBuf)> = [
            ("--ply", &self.ply),
            ("--glb", &self.glb),
            ("--npz", &self.npz),
            ("--gs-ply", &self.gs_ply),
            ("--gs-video", &self.gs_video),
        ]
        .into_iter()
        .filter_map(|(flag, p)| p.clone().map(|p| (flag, p)))
        .collect();
        // A COLMAP folder that does not exist yet is checked by [`check_colmap_folder`].
        if let Some(dir) = self.colmap.as_ref().filter(|d| d.is_dir()) {
            for name in COLMAP_FILES {
                files.push(("--colmap", dir.join(name)));
            }
        }
        files
    }
    /// Whether any export is asked for.
    pub fn any(&self) -> bool {
        self.ply.is_some()
            || self.glb.is_some()
            || self.npz.is_some()
            || self.colmap.is_some()
            || self.gaussians()
    }
    /// Whether an export needs the scene's 3D Gaussians.
    pub fn gaussians(&self) -> bool {
        self.gs_ply.is_some() || self.gs_video.is_some()
    }
    pub fn needs_camera(&self) -> bool {
        self.ply.is_some() || self.glb.is_some() || self.colmap.is_some()
    }
}

const COLMAP_FILES: [&str; 6] = [
    "cameras.txt",
    "images.txt",
    "points3D.txt",
    "cameras.bin",
    "images.bin",
    "points3D.bin",
];

/// What `--outputs` (batch) and `--view-maps` (scene) may name, each written as
/// `<dir>/<stem><suffix>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputKind {
    /// depth PFM (<name>.pfm)
    Pfm,
    /// 8-bit colour-mapped depth (<name>.png)
    Png,
    /// 16-bit depth (<name>.depth16.png)
    Png16,
    /// confidence PFM (<name>.conf.pfm)
    Conf,
    /// sky PFM (<name>.sky.pfm)
    Sky,
    /// camera JSON (<name>.pose.json)
    Pose,
    /// point cloud (<name>.ply)
    Ply,
    /// point cloud and camera (<name>.glb)
    Glb,
    /// mini_npz archive (<name>.npz)
    Npz,
    /// COLMAP model folder (<name>.colmap/)
    Colmap,
}

/// The files `outputs` name for `<dir>/<stem>...`.
pub fn named_outputs(dir: &Path, stem: &str, outputs: &[OutputKind]) -> (Maps, Exports) {
    let f = |suffix: &str| Some(dir.join(format!("{stem}{suffix}")));
    let (mut m, mut e) = (Maps::default(), Exports::default());
    for o in outputs {
        match o {
            OutputKind::Pfm => m.pfm = f(".pfm"),
            OutputKind::Png => m.png = f(".png"),
            OutputKind::Png16 => m.png16 = f(".depth16.png"),
            OutputKind::Conf => m.conf = f(".conf.pfm"),
            OutputKind::Sky => m.sky = f(".sky.pfm"),
            OutputKind::Pose => m.pose = f(".pose.json"),
            OutputKind::Ply => e.ply = f(".ply"),
            OutputKind::Glb => e.glb = f(".glb"),
            OutputKind::Npz => e.npz = f(".npz"),
            OutputKind::Colmap => e.colmap = f(".colmap"),
        }
    }
    (m, e)
}

/// How outputs are written (shared by `depth` and `batch`).
#[derive(clap::Args, Debug, Clone)]
pub struct Settings {
    /// Colour map of the 8-bit depth PNG (near = bright).
    #[arg(long, default_value = "turbo", value_parser = ["turbo", "inferno", "viridis", "gray"])]
    pub colormap: String,
    /// Write the depth, confidence and sky maps (PFM, PNG, 16-bit PNG) at the input image's
    /// size (bilinear, pixel centres aligned) instead of the processed resolution. 3D exports
    /// and the npz stay at the processed resolution, where the intrinsics apply.
    #[arg(long)]
    pub resize_to_input: bool,
    /// Most points in a PLY or glb (evenly subsampled beyond it; official default 1000000).
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_points: u64,
    /// Confidence percentile below which PLY/glb/COLMAP points are dropped (the official
    /// conf_thresh_percentile), 0 to 100.
    #[arg(long, default_value_t = 40.0)]
    pub conf_percentile: f64,
    /// The horizontal field of view in degrees of the camera: for the mono model the pinhole
    /// camera --ply/--glb/--colmap assume (without it they refuse); for the metric model
    /// (DA3METRIC-LARGE) the focal length its metres take (after --focal and known poses).
    #[arg(long, value_name = "DEGREES")]
    pub fov: Option<f32>,
    /// For the metric model (DA3METRIC-LARGE): the focal length in pixels of the input image,
    /// which brings its output to metres (focal x output / 300, the focal brought to the
    /// processed image). Without it: --fov, else the image's EXIF 35 mm focal length, else a
    /// 60 degree horizontal field of view (with a warning).
    #[arg(long, value_name = "PX")]
    pub focal: Option<f64>,
}

impl Settings {
    pub fn colormap(&self) -> anyhow::Result<Colormap> {
        Ok(self.colormap.parse()?)
    }

    /// The focal length a metric model's metres take: --focal, else --fov.
    pub fn focal(&self) -> Option<Focal> {
        match (self.focal, self.fov) {
            (Some(px), _) => Some(Focal::Pixels(px)),
            (None, Some(deg)) => Some(Focal::Fov(f64::from(deg))),
            (None, None) => None,
        }
    }

    /// Refuses settings that cannot work, before anything is loaded.
    pub fn check(&self) -> anyhow::Result<()> {
        if !(0.0..=100.0).contains(&self.conf_percentile) {
            bail!(
                "--conf-percentile {}: a percentile is 0 to 100",
                self.conf_percentile
            );
        }
        if let Some(fov) = self.fov {
            if !(fov > 0.0 && fov < 180.0) {
                bail!("--fov {fov}: a field of view is between 0 and 180 degrees");
            }
        }
        if let Some(focal) = self.focal {
            if !(focal.is_finite() && focal > 0.0) {
                bail!("--focal {focal}: a focal length is a positive number of pixels");
            }
        }
        self.colormap()?;
        Ok(())
    }
}

/// Refuses, before any computing, outputs the model cannot produce.
pub fn check_model(
    config: &Config,
    maps: &Maps,
    exports: &Exports,
    settings: &Settings,
) -> anyhow::Result<()> {
    if exports.gaussians() && config.gaussians.is_none() {
        bail!(
            "--gs-ply/--gs-video: {} has no 3D Gaussian head (DA3-GIANT has one)",
            config.name
        );
    }
    if config.predicts_disparity() && exports.any() {
        bail!(
            "--ply/--glb/--npz/--colmap: {} is a relative Depth Anything V2 model, whose output \
             is a disparity known only up to a scale and a shift: it places no points (a DA2 \
             metric model with --fov does, or a DA3 model)",
            config.name
        );
    }
    let has_pose = config.cam_dim.is_some();
    // The metric model's camera is the pinhole of the focal length its metres take.
    let has_camera = has_pose || config.is_metric();
    if settings.focal.is_some() && !config.is_metric() {
        bail!(
            "--focal: {} is not the metric model (DA3METRIC-LARGE), whose output the focal \
             length brings to metres; this one's depth does not take it",
            config.name
        );
    }
    for (set, has, flag, what) in [
        (
            maps.sky.is_some(),
            config.head.sky,
            "--sky",
            "no sky head (only mono/metric models do)",
        ),
        (
            maps.pose.is_some(),
            has_camera,
            "--pose",
            "no camera decoder (only DualDPT models and the metric model do)",
        ),
        (
            maps.conf.is_some(),
            config.head.output_dim >= 2,
            "--conf",
            "no confidence output (only DualDPT models do)",
        ),
        (
            exports.needs_camera() && settings.fov.is_none(),
            has_camera,
            "--ply/--glb/--colmap",
            "no camera decoder to place points (pass --fov DEGREES to assume a pinhole camera)",
        ),
    ] {
        if set && !has {
            bail!("{flag}: {} has {what}", config.name);
        }
    }
    Ok(())
}

impl Settings {
    /// The library's export options for these settings.
    pub fn export_options(&self) -> ExportOptions {
        ExportOptions {
            max_points: Some(self.max_points as usize),
            confidence_percentile: self.conf_percentile,
            assumed_fov: self.fov,
            ..ExportOptions::default()
        }
    }
}

/// Writes the maps of one view; returns the paths written.
pub fn write_maps(
    prediction: &Prediction,
    maps: &Maps,
    settings: &Settings,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let resized = match settings.resize_to_input {
        true => Cow::Owned(prediction.resize_to_input()?),
        false => Cow::Borrowed(prediction),
    };
    let mut write = |path: &Option<PathBuf>,
                     save: &dyn Fn(&Path) -> Result<(), da3::Error>|
     -> anyhow::Result<()> {
        if let Some(path) = path {
            save(path)?;
            written.push(path.clone());
        }
        Ok(())
    };
    write(&maps.pfm, &|path| resized.save_pfm(path))?;
    let colormap = settings.colormap()?;
    write(&maps.png, &|path| resized.save_png(path, colormap))?;
    write(&maps.png16, &|path| resized.save_png16(path))?;
    write(&maps.conf, &|path| resized.save_confidence_pfm(path))?;
    write(&maps.sky, &|path| resized.save_sky_pfm(path))?;
    // The camera stays at the processed resolution, where its intrinsics apply.
    write(&maps.pose, &|path| prediction.save_pose_json(path))?;
    Ok(written)
}

/// Writes the 3D exports of the views of one scene (or one view) in their common world
/// frame; returns the paths written.
pub fn write_exports(
    output: &da3::Output,
    exports: &Exports,
    settings: &Settings,
) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    if let Some(path) = &exports.npz {
        output.save_npz(path)?;
        written.push(path.clone());
    }
    if exports.needs_camera() && settings.fov.is_none() && output.views[0].camera().is_none() {
        bail!(
            "--ply/--glb/--colmap need a camera: this model predicts none (mono/metric); \
             pass --fov DEGREES to assume a pinhole camera"
        );
    }
    let options = settings.export_options();
    if let Some(path) = &exports.ply {
        output.save_ply(path, &options)?;
        written.push(path.clone());
    }
    if let Some(path) = &exports.glb {
        output.save_glb(path, &options)?;
        written.push(path.clone());
    }
    if let Some(dir) = &exports.colmap {
        output
            .save_colmap(dir, &options)
            .with_context(|| format!("--colmap {}", dir.display()))?;
        written.push(dir.clone());
    }
    if let Some(path) = &exports.gs_ply {
        output
            .save_gaussian_ply(path, &GaussianPlyOptions::default())
            .with_context(|| format!("--gs-ply {}", path.display()))?;
        written.push(path.clone());
    }
    if let Some(path) = &exports.gs_video {
        write_gaussian_video(output, path, exports.gs_trajectory, settings.colormap()?)
            .with_context(|| format!("--gs-video {}", path.display()))?;
        written.push(path.clone());
    }
    Ok(written)
}

/// Renders the scene's Gaussians from every camera of `trajectory` (at the processed size)
/// and encodes the frames, colour beside depth, as an MP4.
fn write_gaussian_video(
    output: &da3::Output,
    path: &Path,
    trajectory: Trajectory,
    colormap: Colormap,
) -> anyhow::Result<()> {
    let gaussians = output
        .gaussians
        .as_ref()
        .context("no 3D Gaussians were computed")?;
    let poses: Vec<da3::Pose> = output
        .views
        .iter()
        .map(|v| v.pose)
        .collect::<Option<_>>()
        .context("every view needs a camera")?;
    let path_poses = da3::gaussians::camera_path(&poses, trajectory);
    // One depth range for every frame: the views' 2nd and 98th percentiles.
    let depths: Vec<f32> = output
        .views
        .iter()
        .flat_map(|v| {
            v.depth
                .iter()
                .copied()
                .filter(|d| d.is_finite() && *d > 0.0)
        })
        .collect();
    if depths.is_empty() {
        bail!("no positive depth to place the Gaussians by");
    }
    let near = da3::outputs::quantile(depths.clone(), 0.02);
    let far = da3::outputs::quantile(depths, 0.98);
    let (w, h) = (gaussians.width, gaussians.height);
    let frames = path_poses.iter().map(|pose| {
        Ok(da3::gaussians::render(gaussians, pose, w, h, 0).beside_depth(colormap, near, far))
    });
    let count = super::video::encode_mp4(path, 2 * w, h, frames)?;
    log::info!("{count} frames along the {trajectory:?} path");
    Ok(())
}

/// Refuses file names that would mislead: `-` (taken for standard output, which these flags
/// do not write to) and an extension that names another format (`--ply x.glb` would be a PLY
/// named .glb).
pub fn check_file_names(maps: &Maps, exports: &Exports) -> anyhow::Result<()> {
    let expected: [(&str, &Option<PathBuf>, &[&str]); 11] = [
        ("--pfm", &maps.pfm, &["pfm"]),
        ("--png", &maps.png, &["png"]),
        ("--png16", &maps.png16, &["png"]),
        ("--conf", &maps.conf, &["pfm"]),
        ("--sky", &maps.sky, &["pfm"]),
        ("--pose", &maps.pose, &["json"]),
        ("--ply", &exports.ply, &["ply"]),
        ("--glb", &exports.glb, &["glb"]),
        ("--npz", &exports.npz, &["npz"]),
        ("--gs-ply", &exports.gs_ply, &["ply"]),
        ("--gs-video", &exports.gs_video, &["mp4"]),
    ];
    for (flag, path, extensions) in expected {
        let Some(path) = path else { continue };
        if path.as_os_str() == "-" {
            bail!("{flag} -: writing to standard output is not supported; name a file");
        }
        let extension = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match extension {
            Some(e) if extensions.contains(&e.as_str()) => {}
            Some(e) if KNOWN_EXTENSIONS.contains(&e.as_str()) => bail!(
                "{flag} {}: a .{e} name for a {} file; name it .{}",
                path.display(),
                &flag[2..],
                extensions[0]
            ),
            // No extension, or one of the user's own: their choice.
            _ => {}
        }
    }
    Ok(())
}

/// Extensions of the formats `da3` writes or reads, which a file of another format must not
/// carry.
const KNOWN_EXTENSIONS: [&str; 12] = [
    "pfm", "png", "json", "ply", "glb", "gltf", "npz", "npy", "jpg", "jpeg", "txt", "bin",
];

/// The scene's output folder: created when missing (its parent must exist), refused when a
/// file is in the way.
pub fn create_out_dir(dir: &Path) -> anyhow::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if dir.exists() {
        bail!("--out-dir {}: not a folder", dir.display());
    }
    std::fs::create_dir(dir)
        .with_context(|| format!("--out-dir {}: cannot create it", dir.display()))
}

/// The folder the COLMAP model goes to: absent (its parent must exist) or a folder.
pub fn check_colmap_folder(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        if !dir.is_dir() {
            bail!("--colmap {}: not a folder", dir.display());
        }
        return Ok(());
    }
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !parent.is_dir() {
        bail!(
            "--colmap {}: the folder {} does not exist",
            dir.display(),
            parent.display()
        );
    }
    Ok(())
}
