//! What one computation asks for ([`Request`]) and what it returns ([`Output`]), and the
//! [`Predictor`] trait both kinds of session implement.
//!
//! A request holds the images (one, or the views of one scene), how they are preprocessed
//! (process resolution and [`ResizeMethod`]), the known cameras if any, how the reference view
//! is chosen, and which optional outputs to compute. Every prediction goes through
//! [`Predictor::run`]; `Model::predict` and `Session::predict` are one-liners over it.

use super::metric::{self, Focal};
use super::multiview::RefViewStrategy;
use super::outputs::Prediction;
use super::poses::KnownPose;
use super::preprocess::{ResizeMethod, RgbImage8};
use super::Error;
use crate::atomic_file;
use std::path::Path;

/// One computation: an image, or the views of one scene, and how to predict them.
///
/// ```no_run
/// # fn main() -> Result<(), da3::Error> {
/// use da3::{Predictor, Request};
/// let model = da3::Model::open("da3-base.gguf")?;
/// let images = [da3::load_image("a.jpg")?, da3::load_image("b.jpg")?];
/// let scene = model.session()?.run(&Request::new(&images).process_res(336))?;
/// println!("reference view {}", scene.reference);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Request<'a> {
    pub(crate) images: &'a [RgbImage8],
    pub(crate) names: Vec<String>,
    pub(crate) process_res: Option<usize>,
    pub(crate) resize: ResizeMethod,
    pub(crate) poses: Option<&'a [KnownPose]>,
    pub(crate) reference: RefViewStrategy,
    pub(crate) rays: bool,
    pub(crate) ray_pose: bool,
    pub(crate) gaussians: bool,
    pub(crate) raw: bool,
    pub(crate) focal: Option<Focal>,
}

impl<'a> Request<'a> {
    /// The images of one scene (one image is a scene of one view), predicted together at the
    /// model's process resolution, the reference view by the official default strategy.
    pub fn new(images: &'a [RgbImage8]) -> Request<'a> {
        Request {
            images,
            names: Vec::new(),
            process_res: None,
            resize: ResizeMethod::default(),
            poses: None,
            reference: RefViewStrategy::default(),
            rays: false,
            ray_pose: false,
            gaussians: false,
            raw: false,
            focal: None,
        }
    }

    /// One image.
    pub fn image(image: &'a RgbImage8) -> Request<'a> {
        Request::new(std::slice::from_ref(image))
    }

    /// The longest side (shortest for the `lower_bound` methods) of the processed images
    /// (default: the model's, [`crate::LoadOptions::process_res`]).
    pub fn process_res(mut self, process_res: usize) -> Self {
        self.process_res = Some(process_res);
        self
    }

    /// How images reach the processed size (default `upper_bound_resize`, the official one).
    pub fn resize(mut self, method: ResizeMethod) -> Self {
        self.resize = method;
        self
    }

    /// The images' names, one per image, carried to the outputs ([`Prediction::name`]: the
    /// COLMAP image names and `poses.json`'s). Default `image0.png`, `image1.png`, ...
    pub fn names(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.names = names.into_iter().map(Into::into).collect();
        self
    }

    /// The known camera of every view (world-to-camera extrinsics and intrinsics in pixels
    /// of that input image), through the camera encoder: depth comes out in the units of the
    /// given cameras and the poses are the given ones (the official
    /// `inference(images, extrinsics, intrinsics)`, see [`crate::poses`]); view 0 is the
    /// reference. The model must be loaded with [`crate::LoadOptions::camera_encoder`].
    pub fn poses(mut self, poses: &'a [KnownPose]) -> Self {
        self.poses = Some(poses);
        self
    }

    /// How the reference view (whose camera is the world frame) is chosen when there are
    /// three or more views and no known poses (default `saddle_balanced`, the official one).
    pub fn reference(mut self, strategy: RefViewStrategy) -> Self {
        self.reference = strategy;
        self
    }

    /// Also compute the DualDPT ray branch into [`Prediction::rays`] (the official forward
    /// computes and drops it). An error at [`Predictor::run`] for a model without one.
    pub fn rays(mut self, on: bool) -> Self {
        self.rays = on;
        self
    }

    /// Take each view's camera from the DualDPT ray branch instead of the camera decoder (the
    /// official `use_ray_pose`; see [`crate::ray_pose`]). Not with known poses.
    pub fn ray_pose(mut self, on: bool) -> Self {
        self.ray_pose = on;
        self
    }

    /// Also compute the scene's 3D Gaussians into [`Output::gaussians`] (the official
    /// `infer_gs`): one per pixel of every view, placed by the predicted depth and cameras.
    /// The model must have a Gaussian head (DA3-GIANT) loaded with
    /// [`crate::LoadOptions::gaussians`]; not with known poses.
    pub fn gaussians(mut self, on: bool) -> Self {
        self.gaussians = on;
        self
    }

    /// The focal length that brings a metric model's output to metres (`focal / 300` times
    /// the output, as the official README says; see [`crate::metric`]). Without it a metric
    /// model takes the known poses' intrinsics, else the image's EXIF 35 mm-equivalent focal
    /// length, else assumes a 60 degree horizontal field of view (with a warning). Other
    /// models ignore it.
    pub fn focal(mut self, focal: Focal) -> Self {
        self.focal = Some(focal);
        self
    }

    /// The network's outputs before the official post-processing (no sky fill, no alignment
    /// to known cameras or to a nested model's metric branch): what parity tests compare.
    pub fn raw_outputs(mut self, on: bool) -> Self {
        self.raw = on;
        self
    }

    /// Refuses a process resolution no image can be processed at (below the patch size or
    /// above [`crate::preprocess::MAX_PROCESS_RES`]), before any image is read.
    pub fn check_process_res(process_res: usize) -> Result<(), Error> {
        Ok(crate::preprocess::check_process_res(process_res)?)
    }

    /// The images.
    pub fn images(&self) -> &'a [RgbImage8] {
        self.images
    }

    /// The name of image `index` ([`Request::names`]).
    pub fn name(&self, index: usize) -> String {
        self.names
            .get(index)
            .cloned()
            .unwrap_or_else(|| format!("image{index}.png"))
    }

    /// The process resolution: the request's, else `model_default`.
    pub fn process_res_or(&self, model_default: usize) -> usize {
        self.process_res.unwrap_or(model_default)
    }

    /// The checks that need no model: some images, names and poses one per image, options
    /// that go together, a reference view inside the scene.
    pub(crate) fn check(&self) -> Result<(), Error> {
        let views = self.images.len();
        if views == 0 {
            return Err(Error::Input(
                "a request needs at least one image".to_owned(),
            ));
        }
        if !self.names.is_empty() && self.names.len() != views {
            return Err(Error::Input(format!(
                "{} name(s) for {views} image(s): give one per image",
                self.names.len()
            )));
        }
        if let Some(poses) = self.poses {
            if poses.len() != views {
                return Err(Error::Input(format!(
                    "{} camera pose(s) for {views} view(s): give one per view",
                    poses.len()
                )));
            }
            if self.ray_pose {
                return Err(Error::Input(
                    "known poses and ray pose do not go together: with known poses the output \
                     cameras are the given ones (turn ray pose off)"
                        .to_owned(),
                ));
            }
            if self.gaussians {
                return Err(Error::Input(
                    "3D Gaussians with known poses are not supported: the Gaussians are \
                     placed by the predicted cameras (leave the poses out)"
                        .to_owned(),
                ));
            }
        }
        if let Some(focal) = &self.focal {
            metric::check_focal(focal, views)?;
        }
        if let RefViewStrategy::View(v) = self.reference {
            if v >= views {
                return Err(Error::Input(format!(
                    "reference view {v} of a scene of {views} view(s) (the first is 0)"
                )));
            }
        }
        Ok(())
    }
}

/// What a [`Request`] returns: a prediction for every view, in the input order, and what
/// the scene shares.
#[derive(Debug, Clone)]
pub struct Output {
    /// One prediction per input image (poses in the reference view's world frame), each
    /// with the processed image and the input's size and name, which the exports need.
    pub views: Vec<Prediction>,
    /// The reference view (index into `views`): the one whose camera defines the scene's
    /// world frame in the predicted poses.
    pub reference: usize,
    /// The strategy that was asked for (below three views none selects: view 0; with known
    /// poses none selects either, and this is `First`).
    pub strategy: RefViewStrategy,
    /// With known poses: the scale the predicted depth was divided by to reach the units of
    /// the given cameras (the official Umeyama alignment, see [`crate::poses`]); none for a
    /// metric model, whose depth is in metres at the given focal lengths.
    pub pose_scale: Option<f64>,
    /// From a nested model: the scale that brought the any-view depth and camera
    /// translations to the metric branch's metres (see [`crate::nested`]).
    pub metric_scale: Option<f64>,
    /// The scene's 3D Gaussians, when the request asked ([`Request::gaussians`]), in the
    /// world frame of the views' poses.
    pub gaussians: Option<super::gaussians::Gaussians>,
    /// Where the request's time went.
    pub timings: Timings,
}

/// Where a request's time went: preprocessing the images (decoded images in, network input
/// out), then the network and post-processing (graphs, upload, compute, download, the
/// official post-processing). `da3 bench` reports the second as the network's time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Resizing and normalising every view (views in parallel).
    pub preprocess: std::time::Duration,
    /// Everything after preprocessing.
    pub compute: std::time::Duration,
}

/// The former name of [`Output`].
#[deprecated(since = "0.2.0", note = "renamed `Output`")]
pub type MultiPrediction = Output;

impl Output {
    /// The prediction of the only view; an error naming the count for a scene of several.
    pub fn into_single(mut self) -> Result<Prediction, Error> {
        if self.views.len() != 1 {
            return Err(Error::Input(format!(
                "a single prediction was asked for a scene of {} views",
                self.views.len()
            )));
        }
        Ok(self.views.swap_remove(0))
    }

    /// Writes the scene's cameras as JSON: `reference`, `ref_view_strategy` and `views`, one
    /// entry per view in input order (`index`, `name`, `width`, `height`, `intrinsics`,
    /// `extrinsics_world_to_camera`, `reference`), `depth_unit` ([`crate::DepthUnit::name`]);
    /// with known poses also `known_poses` and `pose_scale`; for a metric model its pinhole
    /// cameras ([`Prediction::camera`]) and each view's `focal_source`. An error when the
    /// model has no camera decoder and is not metric. The file reads back as
    /// known poses ([`crate::poses::read_poses_json`]; the intrinsics refer to `width` x
    /// `height`, the processed size).
    pub fn save_poses_json(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let mut views = Vec::with_capacity(self.views.len());
        for (i, view) in self.views.iter().enumerate() {
            let pose = view.camera().ok_or_else(|| {
                Error::Input(
                    "this model has no camera decoder (only DualDPT models and, with its focal \
                     length, the metric model do)"
                        .into(),
                )
            })?;
            let mut entry = serde_json::json!({
                "index": i,
                "name": view.name,
                "width": view.width,
                "height": view.height,
                "reference": i == self.reference,
                "intrinsics": pose.intrinsics,
                "extrinsics_world_to_camera": pose.extrinsics,
            });
            if let (None, Some(focal)) = (view.pose, view.metric_focal) {
                entry["focal_source"] = serde_json::json!(focal.source.to_string());
            }
            views.push(entry);
        }
        let unit = self.views.first().map(|v| v.depth_unit).unwrap_or_default();
        let mut json = serde_json::json!({
            "reference": self.reference,
            "ref_view_strategy": self.strategy.name(),
            "depth_unit": unit.name(),
            "views": views,
        });
        if let Some(scale) = self.pose_scale {
            json["known_poses"] = serde_json::json!(true);
            json["pose_scale"] = serde_json::json!(scale);
        }
        Ok(atomic_file::write(path.as_ref(), |out| {
            serde_json::to_writer_pretty(&mut *out, &json).map_err(std::io::Error::other)?;
            out.write_all(b"\n")
        })?)
    }
}

/// Something that predicts depth from a [`Request`]: a [`crate::Session`] of one model, a
/// [`crate::NestedSession`] of the nested pair, or a stand-in in tests. Single-threaded, as
/// sessions are; make one per thread.
pub trait Predictor {
    /// Preprocesses the request's images, computes them as one scene and post-processes the
    /// outputs as the official code does.
    ///
    /// # Errors
    /// An input the model cannot take ([`Error::Input`], [`Error::Preprocess`]), or a failure
    /// of the device.
    fn run(&mut self, request: &Request<'_>) -> Result<Output, Error>;

    /// The name of the device that computes (`CPU`, `CUDA0`, ...).
    fn device_name(&self) -> String;

    /// Frees what computing holds between requests (graphs and their compute buffers, the
    /// largest memory beside the weights); the next request allocates them again. A driver
    /// that is done predicting calls it (a stream before it fuses). By default, nothing.
    ///
    /// # Errors
    /// A device that cannot make a new allocator.
    fn release_buffers(&mut self) -> Result<(), Error> {
        Ok(())
    }

    /// Depth (and confidence, sky, pose, where the model has them) for one image at the
    /// default settings.
    fn predict_image(&mut self, image: &RgbImage8) -> Result<Prediction, Error> {
        self.run(&Request::image(image))?.into_single()
    }
}

/// A boxed predictor predicts (the CLI picks a session or a nested session at run time).
impl<P: Predictor + ?Sized> Predictor for Box<P> {
    fn run(&mut self, request: &Request<'_>) -> Result<Output, Error> {
        (**self).run(request)
    }

    fn device_name(&self) -> String {
        (**self).device_name()
    }

    fn release_buffers(&mut self) -> Result<(), Error> {
        (**self).release_buffers()
    }
}

/// A borrowed predictor predicts (a stream can borrow a session it does not own).
impl<P: Predictor + ?Sized> Predictor for &mut P {
    fn run(&mut self, request: &Request<'_>) -> Result<Output, Error> {
        (**self).run(request)
    }

    fn device_name(&self) -> String {
        (**self).device_name()
    }

    fn release_buffers(&mut self) -> Result<(), Error> {
        (**self).release_buffers()
    }
}
