//! The safe layer's one error type. Every ggml precondition that would `abort()` the process is
//! checked first and reported here, naming the op, the operands and their shapes.

use super::dtype::DType;
use super::gguf::GgufError;
use super::tensor::Shape;
use std::fmt;

/// A tensor as an error message names it: its name (or "unnamed"), type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    pub name: String,
    pub dtype: DType,
    pub shape: Shape,
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = if self.name.is_empty() {
            "unnamed"
        } else {
            &self.name
        };
        write!(f, "`{name}` {} {}", self.dtype, self.shape)
    }
}

/// Errors of the safe ggml layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // --- shapes and types -------------------------------------------------------------------
    /// Operands whose shapes do not fit the op.
    #[error("{op}: shapes do not fit ({reason}): {}", list(operands))]
    ShapeMismatch {
        op: &'static str,
        reason: String,
        operands: Vec<Operand>,
    },
    /// A shape that no tensor may have (zero or negative dims, too many dims, overflow).
    #[error("{op}: invalid shape {ne:?}: {reason}")]
    InvalidShape {
        op: &'static str,
        ne: Vec<i64>,
        reason: String,
    },
    /// An operand of a type the op does not take.
    #[error("{op}: {operand} has type {}, expected {expected}", operand.dtype)]
    DType {
        op: &'static str,
        operand: Operand,
        expected: String,
    },
    /// An op that needs a contiguous operand got a strided view.
    #[error("{op}: {operand} is not contiguous (make it so with `cont`)")]
    NotContiguous { op: &'static str, operand: Operand },
    /// A view reaching past the end of its source.
    #[error("{op}: view of {bytes} bytes at offset {offset} does not fit in {operand} ({available} bytes)")]
    ViewOutOfBounds {
        op: &'static str,
        operand: Operand,
        offset: usize,
        bytes: usize,
        available: usize,
    },
    /// A bad op argument (axis, stride, padding, mode).
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    // --- contexts and graphs ----------------------------------------------------------------
    /// The context's memory pool cannot hold another object.
    #[error("context memory pool exhausted: {needed} bytes needed, {available} of {capacity} left (create the context with a larger pool)")]
    ContextFull {
        needed: usize,
        available: usize,
        capacity: usize,
    },
    /// The graph cannot hold the nodes or leafs that expanding it would add.
    #[error("graph full: adding {tensor} needs {nodes} nodes and {leafs} leafs, the graph holds {capacity} of each")]
    GraphFull {
        tensor: String,
        nodes: usize,
        leafs: usize,
        capacity: usize,
    },
    /// ggml returned NULL where it should have created an object.
    #[error("ggml could not create {what}")]
    Creation { what: String },

    // --- data and buffers -------------------------------------------------------------------
    /// Reading or writing a tensor that has no memory behind it.
    #[error("tensor {operand} has no data: it is not allocated in a buffer owned by this context or allocation")]
    NotAllocated { operand: Operand },
    /// Writing into shared weights (a frozen context's memory, directly or through a view),
    /// which other threads may be reading.
    #[error("tensor {operand} holds shared weights (a frozen context), which cannot be written")]
    SharedWeights { operand: Operand },
    /// Host data whose size or element type does not match the tensor.
    #[error("tensor {operand}: {reason}")]
    DataMismatch { operand: Operand, reason: String },
    /// A buffer allocation failed on the backend.
    #[error("cannot allocate {bytes} bytes on {buffer_type}")]
    BufferAlloc { buffer_type: String, bytes: usize },

    // --- backends ----------------------------------------------------------------------------
    /// No device matched the request.
    #[error("no ggml device {wanted}; available: {available}")]
    DeviceNotFound { wanted: String, available: String },
    /// A backend could not be initialised.
    #[error("cannot initialise backend {name}: {reason}")]
    BackendInit { name: String, reason: String },
    /// An RPC endpoint that does not answer (ggml's own client would abort the process).
    #[error("RPC server {endpoint} is unreachable (start one with `da3 rpc-server --port PORT`)")]
    RpcUnreachable {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    /// A node whose op the backend cannot run.
    #[error("backend {backend} cannot run {op} for node `{node}`")]
    UnsupportedOp {
        backend: String,
        op: String,
        node: String,
    },
    /// Graph allocation failed.
    #[error("graph allocation failed on {backend}: {reason}")]
    Allocation { backend: String, reason: String },
    /// Graph computation did not succeed.
    #[error("graph compute on {backend} failed with status {status}")]
    Compute { backend: String, status: i32 },

    // --- files --------------------------------------------------------------------------------
    /// A GGUF file problem.
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

fn list(operands: &[Operand]) -> String {
    operands
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Result with the safe layer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
