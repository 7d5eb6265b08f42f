//! Depth Anything 3 on ggml's kernels, from safe Rust.
//!
//! Depth (with confidence, sky and camera pose where the model has them) from a photo:
//!
//! ```no_run
//! # fn main() -> Result<(), da3::Error> {
//! let model = da3::Model::open("depth-anything-small-f32.gguf")?; // device `auto`
//! let image = da3::load_image("photo.jpg")?;
//! let prediction = model.predict(&image)?;
//! prediction.save_png("depth.png", da3::Colormap::Turbo)?;
//! # Ok(()) }
//! ```
//!
//! - [`Model`] holds the weights, loaded once onto a device; it is `Send + Sync` and clones
//!   share the weights, so one model serves every thread of a program.
//! - [`Session`] holds what one computation at a time needs (graphs per resolution, their
//!   memory, the residency planner); it is single-threaded: make one per thread with
//!   [`Model::session`] and reuse it for many images.
//! - [`Request`] is one computation (an image or the views of a scene, process resolution,
//!   known cameras, reference view, rays); [`Session::run`] returns an [`Output`], one
//!   [`Prediction`] per view: depth (post-processed as the official code does), confidence,
//!   sky, pose, the processed image, and methods that write every export.
//! - [`Device`] and [`LoadOptions`] choose where and how to compute.
//!
//! Layers, each depending only on the ones before it:
//! - [`atomic_file`]: how every file is written (a temporary file renamed into place);
//! - [`ggml`]: a safe layer over ggml (all of the crate's `unsafe` code; the CPU kernels' is
//!   in the `da3-kernels` crate);
//! - [`gguf`]: GGUF files, the container of ggml models: format, reader, writer;
//! - [`residency`]: the pass that checks where every graph operand lives before computing,
//!   and the one compute entry point built on it;
//! - [`geometry`]: similarity transforms, their estimation and optimisation, depth fusion
//!   and meshes, with no knowledge of the model;
//! - the Depth Anything 3 model: GGUF loading, [`preprocess`]ing, graph, [`outputs`], and
//!   [`convert`]ing official checkpoints.
//!
//! The library prints nothing; it logs through the [`log`](https://docs.rs/log) crate.

#![warn(missing_docs)]

// Only the safe layer may hold `unsafe` code; the compiler enforces it for the rest.
#[deny(unsafe_code)]
pub mod atomic_file;
#[doc(hidden)]
#[deny(unsafe_code)]
pub mod da3;
#[deny(unsafe_code)]
pub mod geometry;
pub mod ggml;
#[deny(unsafe_code)]
pub mod gguf;
#[deny(unsafe_code)]
pub mod residency;

#[doc(hidden)]
pub use crate::da3::synthetic;
#[allow(deprecated)]
pub use crate::da3::MultiPrediction;
pub use crate::da3::{
    convert, decode_image, decode_image_with, export, gaussians, load_image, load_image_with,
    metric, multiview, nested, outputs, poses, preprocess, ray_pose, stream, Colormap, Config,
    ConvPrecision, DepthActivation, DepthUnit, Error, ExecutionPlan, Family, Focal, FocalSource,
    GaussianConfig, Gaussians, Image, KnownPose, LoadOptions, MetricFocal, Model, NestedModel,
    NestedSession, Output, PlanOverrides, Pose, Prediction, Predictor, RayMap, ReadOptions,
    RefViewStrategy, Request, ResizeMethod, Session, Timings, ToRgbImage, WeightError,
    DA2_INPUT_SIZE, DEFAULT_PROCESS_RES,
};
pub use crate::ggml::DeviceSpec as Device;
pub use crate::residency::Policy;
/// The `image` crate this library decodes with ([`load_image`] is the checked way to open a
/// file; [`Model::predict`] also takes a decoded `image::DynamicImage`).
pub use image;

/// The README's Rust code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
