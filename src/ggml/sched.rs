//! ggml's multi-backend scheduler (`ggml_backend_sched`): splits a graph between backends and
//! copies tensors across, at a per-compute cost.

use super::alloc::{check_member, Placed};
use super::backend::Backend;
use super::buffer;
use super::error::{Error, Result};
use super::graph::{Graph, SourceSnapshot};
use super::tensor::{Element, Tensor, TensorView};
use ggml_sys as sys;
use std::ptr::NonNull;

/// ggml's limit on backends per scheduler (GGML_SCHED_MAX_BACKENDS).
pub const MAX_BACKENDS: usize = 16;

/// A scheduler over backends in priority order, the CPU last.
pub struct Sched {
    raw: NonNull<sys::ggml_backend_sched>,
    backends: Vec<Backend>,
    graph_size: usize,
}

impl Sched {
    /// `backends` in priority order with the CPU last (ggml requires it); `graph_size` bounds
    /// nodes + leafs of the graphs it will take; `op_offload` lets it move ops on weights
    /// held in host memory to a GPU.
    pub fn new(backends: &[Backend], graph_size: usize, op_offload: bool) -> Result<Sched> {
        let invalid = |reason: String| Error::InvalidArgument {
            op: "sched",
            reason,
        };
        if backends.is_empty() || backends.len() > MAX_BACKENDS {
            return Err(invalid(format!(
                "{} backends; 1 to {MAX_BACKENDS} allowed",
                backends.len()
            )));
        }
        if !backends.last().is_some_and(Backend::is_cpu) {
            return Err(invalid("the last backend must be the CPU".into()));
        }
        let mut raw_backends: Vec<_> = backends.iter().map(Backend::as_ptr).collect();
        // SAFETY: 1..=16 live backends with the CPU last; NULL buffer types mean defaults.
        let raw = unsafe {
            sys::ggml_backend_sched_new(
                raw_backends.as_mut_ptr(),
                std::ptr::null_mut(),
                backends.len() as i32,
                graph_size,
                false,
                op_offload,
            )
        };
        let raw = NonNull::new(raw).ok_or_else(|| Error::Creation {
            what: "a scheduler".into(),
        })?;
        Ok(Sched {
            raw,
            backends: backends.to_vec(),
            graph_size,
        })
    }

    /// The backends in priority order; pins and [`SchedAllocation::backend_index_of`] index it.
    pub fn backends(&self) -> &[Backend] {
        &self.backends
    }

    fn check_size(&self, graph: &Graph) -> Result<()> {
        let needed = graph.n_nodes() + graph.n_leafs();
        if needed > self.graph_size {
            return Err(Error::GraphFull {
                tensor: "scheduler graph".into(),
                nodes: graph.n_nodes(),
                leafs: graph.n_leafs(),
                capacity: self.graph_size,
            });
        }
        Ok(())
    }

    /// Sizes the backends' compute buffers for `graph` ahead of time.
    pub fn reserve(&mut self, graph: &Graph) -> Result<()> {
        self.check_size(graph)?;
        // SAFETY: live scheduler and graph within its size.
        if unsafe { sys::ggml_backend_sched_reserve(self.raw.as_ptr(), graph.as_ptr()) } {
            Ok(())
        } else {
            Err(Error::Allocation {
                backend: "sched".into(),
                reason: "reserve failed".into(),
            })
        }
    }

    /// Resets, pins `pins` (tensor, index into [`Sched::backends`]) and allocates `graph`.
    pub fn alloc<'a>(
        &'a mut self,
        graph: &'a Graph,
        pins: &[(&Tensor, usize)],
    ) -> Result<SchedAllocation<'a>> {
        self.check_size(graph)?;
        // SAFETY: live scheduler.
        unsafe { sys::ggml_backend_sched_reset(self.raw.as_ptr()) };
        for (tensor, index) in pins {
            let backend = self
                .backends
                .get(*index)
                .ok_or_else(|| Error::InvalidArgument {
                    op: "sched pin",
                    reason: format!("backend index {index} of {}", self.backends.len()),
                })?;
            check_member(graph, tensor)?;
            // SAFETY: live scheduler, one of its backends, a tensor of the graph.
            unsafe {
                sys::ggml_backend_sched_set_tensor_backend(
                    self.raw.as_ptr(),
                    tensor.as_ptr(),
                    backend.as_ptr(),
                )
            };
        }
        let placed = Placed(graph.unallocated_tensors());
        let sources = graph.snapshot_sources();
        // SAFETY: live scheduler and graph within its size.
        if !unsafe { sys::ggml_backend_sched_alloc_graph(self.raw.as_ptr(), graph.as_ptr()) } {
            return Err(Error::Allocation {
                backend: "sched".into(),
                reason: "ggml_backend_sched_alloc_graph failed".into(),
            });
        }
        Ok(SchedAllocation {
            sched: self,
            graph,
            _sources: sources,
            _placed: placed,
        })
    }
}

impl Drop for Sched {
    fn drop(&mut self) {
        // SAFETY: owned, freed once, before the backends (held in `backends`) are released.
        unsafe { sys::ggml_backend_sched_free(self.raw.as_ptr()) };
    }
}

/// A graph allocated by a scheduler.
pub struct SchedAllocation<'a> {
    sched: &'a mut Sched,
    graph: &'a Graph,
    /// Dropped first: sources restored before the placed tensors are cleared.
    _sources: SourceSnapshot,
    _placed: Placed,
}

impl SchedAllocation<'_> {
    /// The allocated graph.
    pub fn graph(&self) -> &Graph {
        self.graph
    }
    /// Writes an input of the graph (type, length and membership checked).
    pub fn write<T: Element>(&self, tensor: &Tensor, data: &[T]) -> Result<()> {
        check_member(self.graph, tensor)?;
        buffer::write_tensor(tensor, data)
    }
    /// Reads a tensor of the graph (mark outputs so that their memory is not reused).
    pub fn read<T: Element>(&self, tensor: &Tensor) -> Result<Vec<T>> {
        check_member(self.graph, tensor)?;
        buffer::read_tensor(tensor)
    }
    /// How many pieces the graph was cut into (one per backend change).
    pub fn n_splits(&self) -> usize {
        // SAFETY: live scheduler.
        unsafe { sys::ggml_backend_sched_get_n_splits(self.sched.raw.as_ptr()) as usize }
    }
    /// Index into the scheduler's backends of the backend that runs `node`.
    pub fn backend_index_of(&self, node: &impl TensorView) -> Option<usize> {
        // SAFETY: live scheduler and tensor; NULL when unassigned.
        let backend = unsafe {
            sys::ggml_backend_sched_get_tensor_backend(self.sched.raw.as_ptr(), node.raw().as_ptr())
        };
        self.sched
            .backends
            .iter()
            .position(|b| b.as_ptr() == backend)
    }
    /// Computes the graph split by split, copying tensors between backends as needed.
    pub fn compute(&self) -> Result<()> {
        // SAFETY: live scheduler with this graph allocated.
        let status = unsafe {
            sys::ggml_backend_sched_graph_compute(self.sched.raw.as_ptr(), self.graph.as_ptr())
        };
        if status == sys::GGML_STATUS_SUCCESS {
            Ok(())
        } else {
            Err(Error::Compute {
                backend: "sched".into(),
                status,
            })
        }
    }
}

impl std::fmt::Debug for Sched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sched")
            .field("backends", &self.backends)
            .field("graph_size", &self.graph_size)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SchedAllocation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedAllocation")
            .field("graph", self.graph)
            .field("backends", &self.sched.backends)
            .field("splits", &self.n_splits())
            .finish_non_exhaustive()
    }
}
