//! Nodes of a graph computed by kernels of our own instead of the backend's, between
//! segments of the graph that the backend computes. ggml 0.26 has no custom-op hook for GPU
//! backends, so the node stays ggml's op (its sources, its shape and the allocator's liveness
//! of its memory are ggml's) and only its computation is ours: the backend computes the nodes
//! before it, the kernel writes the node's memory, the backend goes on after it. Which nodes a
//! kernel takes is the execution plan's decision, made when a model is loaded.

use super::alloc::{compute_status, Allocation};
use super::backend::Backend;
use super::error::{Error, Result};
use super::tensor::{TensorRef, TensorView};
use ggml_sys as sys;
use std::ptr::NonNull;

/// Kernels of our own that compute some nodes in place of the backend.
pub trait NodeKernel {
    /// What computes the nodes (for errors, reports and plans).
    fn name(&self) -> String;
    /// Whether `node` is computed here, decided from its op, types and shapes alone.
    fn takes(&self, node: &TensorRef<'_>) -> bool;
    /// Computes `node` (one it [takes](NodeKernel::takes)) into the node's memory. Its
    /// sources are computed and every operand's memory has been checked to be the device's.
    fn compute(&self, node: &TensorRef<'_>) -> Result<()>;
}

/// Runs of the graph's nodes: the backend's, or one node of the kernel's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Nodes `start..end` for the backend.
    Backend { start: usize, end: usize },
    /// Node `index` for the kernel.
    Kernel { index: usize },
}

/// Splits `0..n` at the nodes `taken` says are the kernel's.
pub(crate) fn segments(n: usize, taken: impl Fn(usize) -> bool) -> Vec<Segment> {
    let mut out = Vec::new();
    let mut start = 0;
    for index in 0..n {
        if taken(index) {
            if start < index {
                out.push(Segment::Backend { start, end: index });
            }
            out.push(Segment::Kernel { index });
            start = index + 1;
        }
    }
    if start < n {
        out.push(Segment::Backend { start, end: n });
    }
    out
}

impl Allocation<'_> {
    /// Runs the graph on `backend`, with the nodes `kernel` takes computed by it: the backend
    /// computes the runs of nodes between them, one call (and one wait) per run. The backend
    /// must support every node it computes (checked first). Whether the kernel may read each
    /// operand where it lives is the caller's to check before (the residency planner does).
    pub fn compute_with(&self, backend: &Backend, kernel: &dyn NodeKernel) -> Result<()> {
        let graph = self.graph();
        let nodes: Vec<TensorRef<'_>> = graph.nodes().collect();
        let plan = segments(nodes.len(), |i| kernel.takes(&nodes[i]));
        if !plan.iter().any(|s| matches!(s, Segment::Kernel { .. })) {
            return self.compute(backend);
        }
        if let Some(node) = plan
            .iter()
            .filter_map(|s| match s {
                Segment::Backend { start, end } => Some(&nodes[*start..*end]),
                Segment::Kernel { .. } => None,
            })
            .flatten()
            .find(|n| !backend.supports_op(*n))
        {
            return Err(Error::UnsupportedOp {
                backend: backend.name(),
                op: node.op_name().into(),
                node: node.name(),
            });
        }
        let longest = plan
            .iter()
            .map(|s| match s {
                Segment::Backend { start, end } => end - start,
                Segment::Kernel { .. } => 0,
            })
            .max()
            .unwrap_or(0);
        let scratch = ScratchGraph::new(longest.max(1))?;
        for segment in plan {
            match segment {
                Segment::Backend { start, end } => {
                    scratch.compute(backend, &nodes[start..end])?;
                }
                Segment::Kernel { index } => kernel.compute(&nodes[index])?,
            }
        }
        Ok(())
    }
}

/// A graph of some nodes of an allocated graph, in a pool of its own (ggml's graph views are
/// internal API): what a backend computes between two nodes of our kernels.
struct ScratchGraph {
    ctx: NonNull<sys::ggml_context>,
    capacity: usize,
}

impl ScratchGraph {
    fn new(capacity: usize) -> Result<ScratchGraph> {
        // SAFETY: pure function of its argument.
        let bytes = unsafe { sys::ggml_graph_overhead_custom(capacity, false) };
        // SAFETY: ggml allocates its own pool of this size; freed in Drop.
        let ctx = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: bytes + 1024,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        let ctx = NonNull::new(ctx).ok_or_else(|| Error::Creation {
            what: format!("a pool for a graph of {capacity} nodes"),
        })?;
        Ok(ScratchGraph { ctx, capacity })
    }

    /// Computes `nodes` (at most the capacity; of an allocated graph, in its order, every
    /// source computed before or among them) on `backend`.
    fn compute(&self, backend: &Backend, nodes: &[TensorRef<'_>]) -> Result<()> {
        debug_assert!(nodes.len() <= self.capacity);
        // SAFETY: the pool holds one graph of `capacity` nodes: it is reset first so that
        // each segment's graph reuses the room; the nodes belong to an allocated graph whose
        // earlier nodes are computed, and the backend supports each (checked by the caller).
        let status = unsafe {
            sys::ggml_reset(self.ctx.as_ptr());
            let graph = sys::ggml_new_graph_custom(self.ctx.as_ptr(), self.capacity, false);
            for node in nodes {
                sys::ggml_graph_add_node(graph, node.raw().as_ptr());
            }
            sys::ggml_backend_graph_compute(backend.as_ptr(), graph)
        };
        compute_status(backend, status)
    }
}

impl Drop for ScratchGraph {
    fn drop(&mut self) {
        // SAFETY: created in `new`, freed once.
        unsafe { sys::ggml_free(self.ctx.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_split_at_taken_nodes_only() {
        use Segment::*;
        assert_eq!(segments(0, |_| true), vec![]);
        assert_eq!(segments(4, |_| false), vec![Backend { start: 0, end: 4 }]);
        assert_eq!(
            segments(5, |i| i == 0 || i == 2 || i == 3),
            vec![
                Kernel { index: 0 },
                Backend { start: 1, end: 2 },
                Kernel { index: 2 },
                Kernel { index: 3 },
                Backend { start: 4, end: 5 },
            ]
        );
        assert_eq!(
            segments(3, |i| i == 2),
            vec![Backend { start: 0, end: 2 }, Kernel { index: 2 }]
        );
    }
}
