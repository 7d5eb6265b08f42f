//! A safe layer over ggml: contexts, tensors, ops, graphs, backends, buffers, the graph
//! allocator, the scheduler and the RPC backend (with the relay that guards its server); the
//! adapter that runs our CPU kernels (`da3-kernels`) as custom nodes; the hook that computes
//! chosen nodes by kernels of our own between segments of a graph (our CUDA attention,
//! `da3-cuda`); read-only file maps.
//! GGUF files are read and written a layer above, in `da3::gguf` (this module knows nothing
//! of them).
//!
//! Every precondition ggml would `abort()` on is checked first and returned as an [`Error`];
//! every raw handle has one owner that frees it. This module holds all of the crate's
//! `unsafe` code (the CPU kernels' own is in `da3-kernels`).
//!
//! ```
//! use da3::ggml::{Backend, Context, DType, Gallocr, TensorView};
//! # fn main() -> da3::ggml::Result<()> {
//! let backend = Backend::cpu(1)?;
//! let ctx = Context::metadata(8)?;
//! let a = ctx.new_tensor(DType::F32, &[2, 2])?.named("a");
//! a.mark_input();
//! let y = ctx.scale(&a, 3.0)?.named("y");
//! y.mark_output();
//! let graph = ctx.new_graph(8)?;
//! graph.expand(&y)?;
//! let mut gallocr = Gallocr::for_backend(&backend)?;
//! let run = gallocr.alloc(&graph)?;
//! run.write(&a, &[1.0f32, 2.0, 3.0, 4.0])?;
//! run.compute(&backend)?;
//! assert_eq!(run.read::<f32>(&y)?, vec![3.0, 6.0, 9.0, 12.0]);
//! # Ok(()) }
//! ```

mod alloc;
mod attention_node;
mod backend;
mod buffer;
mod context;
mod cpu_ops;
#[cfg(feature = "cuda-kernels")]
mod cuda_attention;
pub mod dtype;
mod error;
mod graph;
mod mapped;
mod node_kernel;
mod ops;
pub mod profile;
mod quant;
pub mod rpc;
mod sched;
mod shape;
mod shared;
mod tensor;

pub use alloc::{Allocation, Gallocr, NodeTime};
pub use attention_node::{fused_attention, FusedAttention};
pub use backend::{
    cpu_features, default_threads, ggml_version, Backend, Device, DeviceCaps, DeviceKind,
    DeviceSpec,
};
pub use buffer::{BufferRef, BufferType, BufferUsage};
pub use context::Context;
pub use cpu_ops::{
    pack_linear_panels, pack_linear_panels_bf16, pack_linear_panels_f16, pack_linear_panels_q8,
    Cpu, CpuKernels, KernelConfig, KernelRequest, KernelSet, LINEAR_PANEL, LINEAR_Q8_RECORD,
};
#[cfg(feature = "cuda-kernels")]
pub use cuda_attention::CudaAttention;
pub use dtype::DType;
pub use error::{Error, Operand, Result};
pub use graph::Graph;
pub use mapped::MappedFile;
pub use node_kernel::NodeKernel;
pub use ops::{Interpolation, Pool, RopeMode};
pub use quant::{dequantize, quantize, QUANTIZABLE};
pub use sched::{Sched, SchedAllocation, MAX_BACKENDS};
pub use shape::Shape;
pub use shared::SharedContext;
pub use tensor::{Element, Tensor, TensorFlags, TensorRef, TensorView};
