//! What can be wrong with a model file's tensors, as data: a caller can tell a missing tensor
//! from a misshapen one, and every message names the tensor.

use crate::ggml::DType;

/// A tensor missing from the file, misshapen, of an unusable type or holding unusable values,
/// or a loader asked for something it cannot do. Each variant names the tensor (in the
/// architecture's naming) where there is one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum WeightError {
    /// The architecture needs a tensor the file does not have.
    #[error("tensor `{name}` is missing from the file")]
    MissingTensor {
        /// The tensor's name.
        name: String,
    },
    /// A tensor whose shape is not the one the architecture expects (PyTorch order,
    /// outermost first).
    #[error("tensor `{name}` has shape {got:?}, the architecture expects {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The shape the architecture expects.
        expected: Vec<usize>,
        /// The shape found.
        got: Vec<usize>,
    },
    /// A tensor stored in a type the model cannot use for it.
    #[error(
        "tensor `{name}` is stored as {dtype}, {}",
        expected.map_or("which this model cannot use for it".to_owned(), |e| format!("expected {e}"))
    )]
    TensorType {
        /// The tensor's name.
        name: String,
        /// The type it is stored as.
        dtype: DType,
        /// The types that would do, where the use names them.
        expected: Option<&'static str>,
    },
    /// A tensor holding NaN or infinity: a corrupt file.
    #[error(
        "tensor `{name}` holds NaN or infinity (first at element {element}); the file is corrupt"
    )]
    NonFinite {
        /// The tensor's name.
        name: String,
        /// The first element that is not finite.
        element: usize,
    },
    /// A tensor whose values do not survive a transform the plan applies at load (folding a
    /// norm or layer scale into it, storing it as f16).
    #[error("tensor `{name}` holds {value} at element {element} {reason}")]
    Unrepresentable {
        /// The tensor's name.
        name: String,
        /// The element.
        element: usize,
        /// Its value after the transform.
        value: f32,
        /// What the transform was.
        reason: &'static str,
    },
    /// A tensor declared twice by the architecture's loader.
    #[error("tensor `{name}` declared twice")]
    DeclaredTwice {
        /// The tensor's name.
        name: String,
    },
    /// A tensor asked of a loader that did not declare, read or load it.
    #[error("tensor `{name}` was not {what} with the model")]
    NotLoaded {
        /// The tensor's name.
        name: String,
        /// "declared", "read" or "loaded".
        what: &'static str,
    },
    /// Anything else the loader refuses, said in words (a row order, a recording loader's
    /// limits, widths that do not match).
    #[error("{0}")]
    Other(String),
}
