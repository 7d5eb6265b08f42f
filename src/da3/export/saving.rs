//! The exports of a result, as methods: [`Output::save_ply`] and the others write a scene's
//! views into one world frame, [`Prediction::save_ply`] and the others one view's, from what
//! the prediction carries (the processed image, the input's size and name). The functions of
//! the parent module stay for callers that assemble [`View`]s themselves.

use super::{
    assumed_pose, point_cloud, write_colmap, write_gaussian_ply, write_glb, write_mini_npz,
    write_ply, CloudOptions, ColmapFormat, GaussianPlyOptions, GlbOptions, PointCloud, View,
    ViewerScene,
};
use crate::da3::outputs::Prediction;
use crate::da3::request::Output;
use crate::da3::Error;
use std::path::Path;

/// How the 3D exports of a result are made.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExportOptions {
    /// Most points in a PLY or glb (evenly subsampled beyond it; official default 1,000,000);
    /// `None`: no cap. COLMAP models are never capped, as the official export.
    pub max_points: Option<usize>,
    /// Confidence percentile below which points are dropped (the official
    /// `conf_thresh_percentile`, 40), 0 to 100.
    pub confidence_percentile: f64,
    /// For models that predict no camera (mono): the horizontal field of view in degrees of
    /// the pinhole camera the exports assume ([`assumed_pose`]). Without it such a prediction
    /// has no 3D export. A metric prediction has the camera of its focal length
    /// ([`Prediction::camera`]), which this does not replace.
    pub assumed_fov: Option<f32>,
    /// The glb's camera frustums.
    pub glb: GlbOptions,
}

impl Default for ExportOptions {
    /// The official exports' defaults.
    fn default() -> Self {
        ExportOptions {
            max_points: Some(1_000_000),
            confidence_percentile: 40.0,
            assumed_fov: None,
            glb: GlbOptions::default(),
        }
    }
}

impl ExportOptions {
    /// The points of a PLY or glb: the official glb export's rule at this percentile.
    fn cloud(&self) -> CloudOptions {
        CloudOptions {
            lower_percentile: self.confidence_percentile,
            upper_percentile: self.confidence_percentile.max(90.0),
            max_points: self.max_points,
            ..Default::default()
        }
    }

    /// The points of a COLMAP model: the official COLMAP export's rule at this percentile.
    fn colmap(&self) -> CloudOptions {
        CloudOptions {
            lower_percentile: self.confidence_percentile,
            upper_percentile: self.confidence_percentile,
            ..CloudOptions::colmap()
        }
    }
}

/// The exportable views of `predictions`: each with its predicted camera, or the assumed one
/// of `options` for a model that predicts none.
fn views<'a>(
    predictions: &'a [Prediction],
    options: &ExportOptions,
) -> Result<Vec<View<'a>>, Error> {
    predictions
        .iter()
        .map(|p| {
            let view =
                match (p.camera(), options.assumed_fov) {
                    (Some(pose), _) => View::with_pose(p, &p.image, pose)?,
                    (None, Some(fov)) => {
                        View::with_pose(p, &p.image, assumed_pose(p.width, p.height, fov))?
                    }
                    (None, None) => return Err(Error::Input(
                        "a 3D export needs a camera, and this model predicts none (mono/metric): \
                         give ExportOptions::assumed_fov (da3: --fov DEGREES) to assume a \
                         pinhole camera"
                            .to_owned(),
                    )),
                };
            // COLMAP names images by file name.
            let name = Path::new(&p.name)
                .file_name()
                .map_or_else(|| p.name.clone(), |n| n.to_string_lossy().into_owned());
            Ok(view.named(name, p.input_size))
        })
        .collect()
}

fn cloud_of(views: &[View<'_>], options: &CloudOptions) -> Result<PointCloud, Error> {
    let cloud = point_cloud(views, options)?;
    log::info!(
        "{} points{}",
        cloud.len(),
        cloud
            .confidence_threshold
            .map(|t| format!(" (confidence >= {t:.3})"))
            .unwrap_or_default()
    );
    Ok(cloud)
}

fn save_ply(predictions: &[Prediction], path: &Path, options: &ExportOptions) -> Result<(), Error> {
    let views = views(predictions, options)?;
    write_ply(path, &cloud_of(&views, &options.cloud())?)
}

fn save_glb(predictions: &[Prediction], path: &Path, options: &ExportOptions) -> Result<(), Error> {
    let views = views(predictions, options)?;
    let cloud = cloud_of(&views, &options.cloud())?;
    write_glb(path, &cloud, &views, &options.glb)
}

fn save_colmap(
    predictions: &[Prediction],
    dir: &Path,
    options: &ExportOptions,
) -> Result<(), Error> {
    let views = views(predictions, options)?;
    if !dir.is_dir() {
        std::fs::create_dir(dir).map_err(|source| Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    let cloud = point_cloud(&views, &options.colmap())?;
    write_colmap(dir, &cloud, &views, ColmapFormat::Text)?;
    write_colmap(dir, &cloud, &views, ColmapFormat::Binary)
}

fn viewer_scene(predictions: &[Prediction], options: &ExportOptions) -> Result<ViewerScene, Error> {
    let views = views(predictions, options)?;
    let cloud = point_cloud(&views, &options.cloud())?;
    ViewerScene::new(&cloud, &views, &options.glb)
}

impl Output {
    /// The scene as the HTML viewer draws it ([`super::write_viewer`]): the points of
    /// [`Output::point_cloud`] and a frustum per camera.
    pub fn viewer_scene(&self, options: &ExportOptions) -> Result<ViewerScene, Error> {
        viewer_scene(&self.views, options)
    }

    /// The scene's coloured point cloud in the reference view's world frame, filtered as the
    /// official glb export filters.
    pub fn point_cloud(&self, options: &ExportOptions) -> Result<PointCloud, Error> {
        point_cloud(&views(&self.views, options)?, &options.cloud())
    }

    /// Writes every view's points, in one world frame, as a binary PLY.
    pub fn save_ply(&self, path: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_ply(&self.views, path.as_ref(), options)
    }

    /// Writes the scene as glb (glTF 2.0): the points and a frustum per camera.
    pub fn save_glb(&self, path: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_glb(&self.views, path.as_ref(), options)
    }

    /// Writes the scene as a COLMAP sparse model (text and binary) into the folder `dir`,
    /// created if needed (its parent must exist); cameras at the inputs' sizes.
    pub fn save_colmap(&self, dir: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_colmap(&self.views, dir.as_ref(), options)
    }

    /// Writes depth, confidence, extrinsics and intrinsics of every view as the official
    /// `mini_npz` archive.
    pub fn save_npz(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let views: Vec<&Prediction> = self.views.iter().collect();
        write_mini_npz(path.as_ref(), &views)
    }

    /// Writes the scene's 3D Gaussians ([`crate::Request::gaussians`]) as a 3DGS PLY file,
    /// pruned as the official export prunes ([`GaussianPlyOptions::default`]); returns how many
    /// were written.
    pub fn save_gaussian_ply(
        &self,
        path: impl AsRef<Path>,
        options: &GaussianPlyOptions,
    ) -> Result<usize, Error> {
        let gaussians = self.gaussians.as_ref().ok_or_else(|| {
            Error::Input("no 3D Gaussians: the request did not ask for them".to_owned())
        })?;
        let depth: Vec<&[f32]> = self.views.iter().map(|v| v.depth.as_slice()).collect();
        write_gaussian_ply(path.as_ref(), gaussians, &depth, options)
    }
}

impl Prediction {
    /// This view as the HTML viewer draws it: its points and its camera's frustum.
    pub fn viewer_scene(&self, options: &ExportOptions) -> Result<ViewerScene, Error> {
        viewer_scene(std::slice::from_ref(self), options)
    }

    /// Writes this view's points as a binary PLY.
    pub fn save_ply(&self, path: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_ply(std::slice::from_ref(self), path.as_ref(), options)
    }

    /// Writes this view as glb (glTF 2.0): its points and its camera's frustum.
    pub fn save_glb(&self, path: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_glb(std::slice::from_ref(self), path.as_ref(), options)
    }

    /// Writes this view as a COLMAP sparse model (text and binary) into the folder `dir`,
    /// created if needed.
    pub fn save_colmap(&self, dir: impl AsRef<Path>, options: &ExportOptions) -> Result<(), Error> {
        save_colmap(std::slice::from_ref(self), dir.as_ref(), options)
    }

    /// Writes depth, confidence and the camera as the official `mini_npz` archive.
    pub fn save_npz(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        write_mini_npz(path.as_ref(), &[self])
    }
}
