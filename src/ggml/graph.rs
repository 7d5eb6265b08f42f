//! Computation graphs: built from output tensors, inspected by the residency planner.

use super::context::{Context, ContextInner};
use super::error::{Error, Result};
use super::tensor::{Tensor, TensorRef, TensorView};
use ggml_sys as sys;
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ptr::NonNull;
use std::rc::Rc;

/// A ggml compute graph. It lives in a context's pool and keeps alive every context whose
/// tensors it reaches.
pub struct Graph {
    raw: NonNull<sys::ggml_cgraph>,
    capacity: usize,
    /// Tensors already in the graph, mirrored so that expanding can be checked up front
    /// (ggml asserts, and aborts, when nodes or leafs overflow).
    visited: RefCell<HashSet<usize>>,
    /// Leafs in discovery order (ggml has no public accessor for them).
    leafs: RefCell<Vec<NonNull<sys::ggml_tensor>>>,
    n_nodes: Cell<usize>,
    contexts: RefCell<Vec<Rc<ContextInner>>>,
}

impl Context {
    /// A graph for up to `capacity` nodes (and as many leafs) in this context's pool.
    pub fn new_graph(&self, capacity: usize) -> Result<Graph> {
        if capacity == 0 {
            return Err(Error::InvalidArgument {
                op: "new_graph",
                reason: "capacity 0".into(),
            });
        }
        // The graph object without ggml's object header (which `reserve` adds back); added
        // before subtracting, as a small graph's overhead is less than a tensor's.
        // SAFETY: pure function of its arguments.
        let bytes = unsafe { sys::ggml_graph_overhead_custom(capacity, false) }
            + std::mem::size_of::<sys::ggml_tensor>()
            - unsafe { sys::ggml_tensor_overhead() };
        self.inner().reserve(bytes)?;
        // SAFETY: live context with room for the graph object (checked above).
        let raw = unsafe { sys::ggml_new_graph_custom(self.raw(), capacity, false) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::Creation {
            what: format!("a graph of {capacity} nodes"),
        })?;
        Ok(Graph {
            raw,
            capacity,
            visited: RefCell::new(HashSet::new()),
            leafs: RefCell::new(Vec::new()),
            n_nodes: Cell::new(0),
            contexts: RefCell::new(vec![self.inner().clone()]),
        })
    }
}

impl Graph {
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_cgraph {
        self.raw.as_ptr()
    }

    /// Adds `tensor` and everything it depends on.
    pub fn expand(&self, tensor: &Tensor) -> Result<()> {
        if tensor.is_leaf_op() && !self.contains(tensor) {
            return Err(Error::InvalidArgument {
                op: "graph expand",
                reason: format!(
                    "`{}` is computed by no op; expand the graph from an op's result",
                    tensor.name()
                ),
            });
        }
        let (new, nodes, new_leafs) = self.unvisited(tensor);
        let (total_nodes, total_leafs) =
            (self.n_nodes.get() + nodes, self.n_leafs() + new_leafs.len());
        if total_nodes > self.capacity || total_leafs > self.capacity {
            return Err(Error::GraphFull {
                tensor: tensor.name(),
                nodes: total_nodes,
                leafs: total_leafs,
                capacity: self.capacity,
            });
        }
        // SAFETY: live graph and tensor; the graph can hold every new node and leaf and its
        // hash set is sized for 2x capacity (checked above), so no GGML_ASSERT fires.
        unsafe { sys::ggml_build_forward_expand(self.as_ptr(), tensor.as_ptr()) };
        self.visited.borrow_mut().extend(new);
        self.n_nodes.set(total_nodes);
        self.leafs.borrow_mut().extend(new_leafs);
        let mut contexts = self.contexts.borrow_mut();
        if !contexts.iter().any(|c| Rc::ptr_eq(c, tensor.ctx())) {
            contexts.push(tensor.ctx().clone());
        }
        Ok(())
    }

    /// Tensors reachable from `tensor` not yet in the graph, split as ggml will count them.
    fn unvisited(&self, tensor: &Tensor) -> (Vec<usize>, usize, Vec<NonNull<sys::ggml_tensor>>) {
        let visited = self.visited.borrow();
        let mut seen = HashSet::new();
        let mut stack = vec![tensor.as_ref()];
        let (mut nodes, mut leafs) = (0, Vec::new());
        while let Some(t) = stack.pop() {
            if visited.contains(&t.id()) || !seen.insert(t.id()) {
                continue;
            }
            if t.is_leaf_op() && !t.flags().param {
                leafs.push(t.raw());
            } else {
                nodes += 1;
            }
            // Borrows end with this loop: the sources live as long as `tensor`.
            stack.extend(t.sources().into_iter().map(|s| TensorRef::new(s.raw())));
        }
        (seen.into_iter().collect(), nodes, leafs)
    }

    /// Whether the graph holds this tensor (as a node or a leaf).
    pub fn contains(&self, tensor: &impl TensorView) -> bool {
        self.visited.borrow().contains(&tensor.id())
    }
    /// Most nodes (and, separately, leafs) the graph can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Number of nodes (tensors an op computes).
    pub fn n_nodes(&self) -> usize {
        // SAFETY: live graph.
        unsafe { sys::ggml_graph_n_nodes(self.as_ptr()) as usize }
    }
    /// Number of leafs (tensors no op of the graph computes).
    pub fn n_leafs(&self) -> usize {
        self.leafs.borrow().len()
    }
    /// Node `i` in execution order.
    pub fn node(&self, i: usize) -> Option<TensorRef<'_>> {
        if i >= self.n_nodes() {
            return None;
        }
        // SAFETY: index in range; nodes live as long as the graph keeps their contexts.
        NonNull::new(unsafe { sys::ggml_graph_node(self.as_ptr(), i as i32) }).map(TensorRef::new)
    }
    /// Nodes in execution order.
    pub fn nodes(&self) -> impl Iterator<Item = TensorRef<'_>> + '_ {
        (0..self.n_nodes()).filter_map(move |i| self.node(i))
    }
    /// Leafs: tensors no op of the graph computes (weights, inputs, constants).
    pub fn leafs(&self) -> Vec<TensorRef<'_>> {
        self.leafs
            .borrow()
            .iter()
            .map(|&l| TensorRef::new(l))
            .collect()
    }
    /// A node or leaf by name.
    pub fn get(&self, name: &str) -> Option<TensorRef<'_>> {
        let c_name = std::ffi::CString::new(name).ok()?;
        // SAFETY: live graph, NUL-terminated name.
        NonNull::new(unsafe { sys::ggml_graph_get_tensor(self.as_ptr(), c_name.as_ptr()) })
            .map(TensorRef::new)
    }

    /// Tensors of the graph without memory (an allocator will place them).
    pub(crate) fn unallocated_tensors(&self) -> Vec<NonNull<sys::ggml_tensor>> {
        let mut out: Vec<_> = self
            .nodes()
            .filter(|t| !t.has_data())
            .map(|t| t.raw())
            .collect();
        out.extend(
            self.leafs
                .borrow()
                .iter()
                .copied()
                .filter(|t| !TensorRef::new(*t).has_data()),
        );
        out
    }

    /// Every context the graph reaches: its own, the expanded tensors', and (transitively)
    /// those their operands live in.
    fn reachable_contexts(&self) -> Vec<Rc<ContextInner>> {
        let mut out: Vec<Rc<ContextInner>> = Vec::new();
        let mut stack: Vec<Rc<ContextInner>> = self.contexts.borrow().clone();
        while let Some(ctx) = stack.pop() {
            if out.iter().any(|c| Rc::ptr_eq(c, &ctx)) {
                continue;
            }
            stack.extend(ctx.kept_alive());
            out.push(ctx);
        }
        out
    }

    /// Gives every host tensor the graph reaches (data in a host context's pool, no buffer)
    /// a real CPU buffer wrapping that pool, so that ggml's scheduler can see where it lives
    /// and copy it to the device that needs it. Returns how many tensors got a buffer.
    pub fn wrap_host_memory(&self, usage: super::buffer::BufferUsage) -> Result<usize> {
        let mut wrapped = 0;
        for ctx in self.reachable_contexts() {
            let ctx = Context::from_inner(ctx);
            if !ctx.is_metadata_only()
                && ctx
                    .tensors()
                    .iter()
                    .any(|t| t.buffer().is_none() && t.has_data())
            {
                wrapped += ctx.wrap_host_memory(usage)?;
            }
        }
        Ok(wrapped)
    }

    /// Makes `node` read `replacement` instead of its source in `slot` (same type and shape),
    /// and keeps the replacement's context alive with the graph.
    pub fn replace_source(
        &self,
        node: &TensorRef<'_>,
        slot: usize,
        replacement: &Tensor,
    ) -> Result<()> {
        let op = "replace_source";
        if !self.contains(node) || slot >= sys::GGML_MAX_SRC as usize {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "`{}` slot {slot} is not a source of this graph",
                    node.name()
                ),
            });
        }
        // SAFETY: a live node of this graph (checked); reading its source array.
        let current = unsafe { (*node.raw().as_ptr()).src[slot] };
        let Some(current) = NonNull::new(current).map(TensorRef::new) else {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("`{}` has no source {slot}", node.name()),
            });
        };
        if current.dtype() != replacement.dtype()
            || current.ne() != replacement.ne()
            || !replacement.is_contiguous()
        {
            return Err(Error::ShapeMismatch {
                op,
                reason: "the replacement must be a contiguous tensor of the same type and shape"
                    .into(),
                operands: vec![current.describe(), replacement.describe()],
            });
        }
        if !self.contains(replacement) && self.n_leafs() + 1 > self.capacity {
            return Err(Error::GraphFull {
                tensor: replacement.name(),
                nodes: self.n_nodes(),
                leafs: self.n_leafs() + 1,
                capacity: self.capacity,
            });
        }
        // SAFETY: same type and shape (checked); the replacement stays alive with the graph
        // (its context is recorded below) and its memory is owned by that context.
        unsafe { (*node.raw().as_ptr()).src[slot] = replacement.as_ptr() };
        if self.visited.borrow_mut().insert(replacement.id()) {
            self.leafs.borrow_mut().push(replacement.as_ref().raw());
        }
        let mut contexts = self.contexts.borrow_mut();
        if !contexts.iter().any(|c| Rc::ptr_eq(c, replacement.ctx())) {
            contexts.push(replacement.ctx().clone());
        }
        Ok(())
    }

    /// Every node's source pointers, to undo the scheduler's rewiring (see [`SourceSnapshot`]).
    pub(crate) fn snapshot_sources(&self) -> SourceSnapshot {
        // SAFETY: live nodes of this graph; copying their source arrays.
        SourceSnapshot(
            self.nodes()
                .map(|n| (n.raw(), unsafe { (*n.raw().as_ptr()).src }))
                .collect(),
        )
    }
}

/// ggml's scheduler points graph nodes at its own copies of split inputs (`node->src[j] =
/// copy`) and frees those copies at its next split, so a graph kept for reuse would hold
/// dangling sources. The snapshot puts the original sources back when the allocation ends.
pub(crate) struct SourceSnapshot(
    Vec<(
        NonNull<sys::ggml_tensor>,
        [*mut sys::ggml_tensor; sys::GGML_MAX_SRC as usize],
    )>,
);

impl Drop for SourceSnapshot {
    fn drop(&mut self) {
        for (node, srcs) in &self.0 {
            // SAFETY: nodes of a graph that outlives the allocation holding this snapshot;
            // restoring the pointers the graph had before the scheduler changed them.
            unsafe { (*node.as_ptr()).src = *srcs };
        }
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("nodes", &self.n_nodes())
            .field("leafs", &self.n_leafs())
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}
