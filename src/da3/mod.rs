//! Depth Anything 3: model files in depth-anything.cpp's GGUF layout, preprocessing as the
//! official InputProcessor, the backbone and DPT/DualDPT heads as ggml graphs, and outputs.
//!
//! Reference: the official PyPI package `depth-anything-3==0.1.1`. Three phases stay apart:
//! weights load once ([`Model::load`]), a graph is built once per processed resolution, and
//! each image is computed through the residency planner ([`crate::residency::Executor`]).

pub mod architecture;
mod backbone;
mod colormaps;
pub mod config;
pub mod convert;
pub mod export;
pub mod gaussians;
mod head;
mod layers;
pub mod metric;
mod model;
pub mod multiview;
pub mod nested;
mod ops;
pub mod outputs;
pub mod plan;
pub mod poses;
pub mod preprocess;
pub mod ray_pose;
mod request;
pub mod stream;
pub mod synthetic;
mod transforms;
mod weight_error;
mod weights;

pub use architecture::{Role, TensorSpec};
pub use config::{
    Config, DepthActivation, Family, Ffn, GaussianConfig, HeadKind, DA2_INPUT_SIZE, PRESETS,
};
pub use gaussians::Gaussians;
pub use metric::{DepthUnit, Focal, FocalSource, MetricFocal};
pub use model::{ConvPrecision, LoadOptions, Model, Session, DEFAULT_PROCESS_RES};
pub use multiview::RefViewStrategy;
pub use nested::{NestedModel, NestedSession};
pub use outputs::{Colormap, Pose, Prediction, RayMap};
pub use plan::{ExecutionPlan, PlanOverrides};
pub use poses::KnownPose;
pub use preprocess::{
    decode_image, decode_image_with, load_image, load_image_with, ReadOptions, ResizeMethod,
    RgbImage8 as Image, ToRgbImage,
};
#[allow(deprecated)]
pub use request::MultiPrediction;
pub use request::{Output, Predictor, Request, Timings};
pub use weight_error::WeightError;
pub use weights::{ConvKernels, LinearPacking, Loader};

use std::path::PathBuf;

/// Errors of the DA3 layer. `Display` (and `Debug`, so that a `main` returning this error
/// prints it readably) names the file, flag, tensor or device and the cause.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Hyperparameters that are missing, contradictory or unknown.
    #[error("model configuration: {0}")]
    Config(String),
    /// A tensor missing from the file, misshapen, of an unusable type or holding unusable
    /// values ([`WeightError`] says which).
    #[error("model weights: {0}")]
    Weights(#[from] WeightError),
    /// An input the model cannot take.
    #[error("input: {0}")]
    Input(String),
    /// An image that preprocessing could not open, decode or take (empty, too large, bad buffer).
    #[error(transparent)]
    Preprocess(#[from] preprocess::PreprocessError),
    /// An image the `image` crate could not open or decode.
    #[error("image: {0}")]
    Image(#[from] image::ImageError),
    /// A GGUF file that cannot be read or does not parse.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// An error of the safe ggml layer (shapes, memory, devices, compute).
    #[error(transparent)]
    Ggml(Box<crate::ggml::Error>),
    /// The residency planner refused (`strict`) or failed.
    #[error(transparent)]
    Residency(#[from] crate::residency::Error),
    /// A checkpoint that cannot be converted.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint file or folder.
        path: PathBuf,
        /// Why it cannot be converted.
        reason: String,
    },
    /// A model file that cannot be quantised (see [`convert::quantize`]).
    #[error("cannot quantize {path}: {reason}")]
    Quantize {
        /// The input file.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// An output file that could not be written (nothing is left half-written).
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file that could not be written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl std::fmt::Debug for Error {
    /// The message and its causes, one per line, as `anyhow` prints them: what a `main` that
    /// returns `Result<(), da3::Error>` shows. `{:#?}` gives the structure.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if f.alternate() {
            return self.fmt_structure(f);
        }
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        let mut first = true;
        while let Some(cause) = source {
            let text = cause.to_string();
            // Transparent variants repeat their source's message.
            if !self.to_string().ends_with(&text) {
                if first {
                    f.write_str("\n\nCaused by:")?;
                    first = false;
                }
                write!(f, "\n    {text}")?;
            }
            source = cause.source();
        }
        Ok(())
    }
}

impl Error {
    fn fmt_structure(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(m) => f.debug_tuple("Config").field(m).finish(),
            Error::Weights(e) => f.debug_tuple("Weights").field(e).finish(),
            Error::Input(m) => f.debug_tuple("Input").field(m).finish(),
            Error::Preprocess(e) => f.debug_tuple("Preprocess").field(e).finish(),
            Error::Image(e) => f.debug_tuple("Image").field(e).finish(),
            Error::Gguf(e) => f.debug_tuple("Gguf").field(e).finish(),
            Error::Ggml(e) => f.debug_tuple("Ggml").field(e).finish(),
            Error::Residency(e) => f.debug_tuple("Residency").field(e).finish(),
            Error::Checkpoint { path, reason } => f
                .debug_struct("Checkpoint")
                .field("path", path)
                .field("reason", reason)
                .finish(),
            Error::Quantize { path, reason } => f
                .debug_struct("Quantize")
                .field("path", path)
                .field("reason", reason)
                .finish(),
            Error::Output { path, source } => f
                .debug_struct("Output")
                .field("path", path)
                .field("source", source)
                .finish(),
        }
    }
}

impl From<crate::atomic_file::WriteError> for Error {
    fn from(e: crate::atomic_file::WriteError) -> Self {
        Error::Output {
            path: e.path,
            source: e.source,
        }
    }
}

impl From<crate::ggml::Error> for Error {
    fn from(e: crate::ggml::Error) -> Self {
        Error::Ggml(Box::new(e))
    }
}
