//! The safe layer's one error type. Every ggml precondition that would `abort()` the process is
//! checked first and reported here, naming the op, the operands and their shapes.

use super::dtype::DType;
use super::shape::Shape;
use std::fmt;

/// A tensor as an error message names it: its name (or "unnamed"), type and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The tensor's name ("" when unnamed; shown as "unnamed").
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape, in ggml order (`ne[0]` innermost).
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
        /// The op that refused its operands.
        op: &'static str,
        /// What does not fit.
        reason: String,
        /// The operands involved, in the op's order.
        operands: Vec<Operand>,
    },
    /// A shape that no tensor may have (zero or negative dims, too many dims, overflow).
    #[error("{op}: invalid shape {ne:?}: {reason}")]
    InvalidShape {
        /// The op (or constructor) given the shape.
        op: &'static str,
        /// The requested extents, in ggml order (`ne[0]` innermost).
        ne: Vec<i64>,
        /// Why the shape is refused.
        reason: String,
    },
    /// An operand of a type the op does not take.
    #[error("{op}: {operand} has type {}, expected {expected}", operand.dtype)]
    DType {
        /// The op that refused the type.
        op: &'static str,
        /// The operand of the wrong type.
        operand: Operand,
        /// The types the op takes.
        expected: String,
    },
    /// An op that needs a contiguous operand got a strided view.
    #[error("{op}: {operand} is not contiguous (make it so with `cont`)")]
    NotContiguous {
        /// The op that needs contiguous data.
        op: &'static str,
        /// The strided operand.
        operand: Operand,
    },
    /// A view reaching past the end of its source.
    #[error("{op}: view of {bytes} bytes at offset {offset} does not fit in {operand} ({available} bytes)")]
    ViewOutOfBounds {
        /// The op that made the view.
        op: &'static str,
        /// The source tensor.
        operand: Operand,
        /// Start of the view in the source, in bytes.
        offset: usize,
        /// Bytes the view would span from `offset`.
        bytes: usize,
        /// Size of the source's data, in bytes.
        available: usize,
    },
    /// A bad op argument (axis, stride, padding, mode).
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The op (or call) given the argument.
        op: &'static str,
        /// What is wrong with it.
        reason: String,
    },

    /// A kernel of our own could not compute a node it takes (beside the backend's).
    #[error("{kernel}: node `{node}`: {reason}")]
    NodeKernel {
        /// The kernel ([`NodeKernel::name`](super::NodeKernel::name)).
        kernel: String,
        /// The node it was computing.
        node: String,
        /// What its library said.
        reason: String,
    },

    // --- contexts and graphs ----------------------------------------------------------------
    /// The context's memory pool cannot hold another object.
    #[error("context memory pool exhausted: {needed} bytes needed, {available} of {capacity} left (create the context with a larger pool)")]
    ContextFull {
        /// Bytes the next object needs (aligned, with ggml's object header).
        needed: usize,
        /// Bytes left in the pool.
        available: usize,
        /// The pool's total size in bytes.
        capacity: usize,
    },
    /// The graph cannot hold the nodes or leafs that expanding it would add.
    #[error("graph full: adding {tensor} needs {nodes} nodes and {leafs} leafs, the graph holds {capacity} of each")]
    GraphFull {
        /// Name of the tensor being expanded (or what was being added).
        tensor: String,
        /// Nodes the graph would hold after expanding.
        nodes: usize,
        /// Leafs the graph would hold after expanding.
        leafs: usize,
        /// The graph's capacity, in nodes and in leafs each.
        capacity: usize,
    },
    /// ggml returned NULL where it should have created an object.
    #[error("ggml could not create {what}")]
    Creation {
        /// The object ggml failed to create.
        what: String,
    },

    // --- data and buffers -------------------------------------------------------------------
    /// Reading or writing a tensor that has no memory behind it.
    #[error("tensor {operand} has no data: it is not allocated in a buffer owned by this context or allocation")]
    NotAllocated {
        /// The tensor without memory (or not in the allocated graph).
        operand: Operand,
    },
    /// Writing into shared weights (a frozen context's memory, directly or through a view),
    /// which other threads may be reading.
    #[error("tensor {operand} holds shared weights (a frozen context), which cannot be written")]
    SharedWeights {
        /// The shared weight (or view of one) that a write targeted.
        operand: Operand,
    },
    /// Host data whose size or element type does not match the tensor.
    #[error("tensor {operand}: {reason}")]
    DataMismatch {
        /// The tensor.
        operand: Operand,
        /// How the host data differs (element type, count of elements or bytes).
        reason: String,
    },
    /// A buffer allocation failed on the backend.
    #[error("cannot allocate {bytes} bytes on {buffer_type}")]
    BufferAlloc {
        /// The buffer type's name.
        buffer_type: String,
        /// The size asked for, in bytes.
        bytes: usize,
    },

    /// A graph whose intermediate results need more memory than its device has available,
    /// refused before anything is allocated.
    #[error(
        "this graph needs {need_mib} MiB for its intermediate results on {buffer_type}, which \
         has {available_mib} MiB available (fewer views or a smaller processing resolution \
         need less)"
    )]
    ComputeMemory {
        /// The buffer type's name.
        buffer_type: String,
        /// MiB the graph needs.
        need_mib: usize,
        /// MiB available on the device.
        available_mib: usize,
    },

    // --- backends ----------------------------------------------------------------------------
    /// No device matched the request.
    #[error("no ggml device {wanted}; available: {available}")]
    DeviceNotFound {
        /// The request, in words ("named `CUDA0`", "of kind Gpu").
        wanted: String,
        /// The registry's device names, comma-separated.
        available: String,
    },
    /// A backend could not be initialised.
    #[error("cannot initialise backend {name}: {reason}")]
    BackendInit {
        /// The device's name.
        name: String,
        /// Why initialisation failed.
        reason: String,
    },
    /// An RPC endpoint that does not answer (ggml's own client would abort the process).
    #[error("RPC server {endpoint} is unreachable (start one with `da3 rpc-server --port PORT`)")]
    RpcUnreachable {
        /// The server's `HOST:PORT`.
        endpoint: String,
        /// The connection error.
        #[source]
        source: std::io::Error,
    },
    /// An RPC endpoint that accepts connections but does not complete ggml's HELLO exchange.
    #[error("RPC server {endpoint} refused the handshake: {reason}")]
    RpcHandshake {
        /// The server's `HOST:PORT`.
        endpoint: String,
        /// What went wrong.
        reason: String,
    },
    /// A node whose op the backend cannot run.
    #[error("backend {backend} cannot run {op} for node `{node}`")]
    UnsupportedOp {
        /// The backend's name.
        backend: String,
        /// ggml's name of the node's op.
        op: String,
        /// The node's name.
        node: String,
    },
    /// Graph allocation failed.
    #[error("graph allocation failed on {backend}: {reason}")]
    Allocation {
        /// The buffer type or backend that allocated ("sched" for the scheduler).
        backend: String,
        /// Which allocation call failed.
        reason: String,
    },
    /// Graph computation did not succeed.
    #[error("graph compute on {backend} failed with status {status}")]
    Compute {
        /// The backend that computed ("sched" for the scheduler).
        backend: String,
        /// ggml's `ggml_status` code (anything but `GGML_STATUS_SUCCESS`).
        status: i32,
    },
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
