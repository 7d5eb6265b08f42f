//! ggml's single-backend graph allocator (`ggml_gallocr`): the fast path.

use super::backend::Backend;
use super::buffer::{self, BufferType};
use super::error::{Error, Result};
use super::graph::Graph;
use super::tensor::{Element, Tensor, TensorView};
use ggml_sys as sys;
use std::ptr::NonNull;

/// Allocates a graph's intermediate tensors in buffers of one type, reusing memory between
/// nodes. Tensors that already have data (weights) are left as they are: the allocator does
/// not check where they live, which is why the residency planner runs before it.
pub struct Gallocr {
    raw: NonNull<sys::ggml_gallocr>,
    buffer_type: BufferType,
    /// Graphs measured against the available memory, by (address, nodes, leafs).
    measured: std::collections::HashSet<(usize, usize, usize)>,
    /// Bytes a graph may need at most (default: what the device has available).
    memory_limit: Option<usize>,
    /// The size of the memory last given [`buffer::BufferRef::advise_huge_pages`]: the
    /// allocator replaces its memory only to grow it, so a new size means new memory.
    advised_size: usize,
}

impl Gallocr {
    /// An allocator placing intermediate tensors in buffers of `buffer_type`.
    pub fn new(buffer_type: BufferType) -> Result<Gallocr> {
        // SAFETY: registry buffer type; NULL on failure.
        let raw = unsafe { sys::ggml_gallocr_new(buffer_type.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::Creation {
            what: format!("a graph allocator for {}", buffer_type.name()),
        })?;
        Ok(Gallocr {
            raw,
            buffer_type,
            measured: Default::default(),
            memory_limit: None,
            advised_size: 0,
        })
    }
    /// Caps the memory one graph's intermediate results may take (instead of what the device
    /// reports available); a graph over it is refused by [`Gallocr::alloc`].
    pub fn set_memory_limit(&mut self, bytes: Option<usize>) {
        self.memory_limit = bytes;
        self.measured.clear();
    }
    /// Bytes `graph`'s intermediate results need, planned without allocating anything.
    pub fn measure(&mut self, graph: &Graph) -> Result<usize> {
        let mut size = 0usize;
        // SAFETY: live allocator (one buffer type, so `sizes` has one entry) and graph; with
        // NULL buffer ids every tensor goes to buffer 0. The planning asserts only when a
        // buffer cannot be allocated, and it allocates none.
        unsafe {
            sys::ggml_gallocr_reserve_n_size(
                self.raw.as_ptr(),
                graph.as_ptr(),
                std::ptr::null(),
                std::ptr::null(),
                &mut size,
            )
        };
        Ok(size)
    }
    /// Refuses a graph that needs more memory than the limit or the device has available,
    /// before allocating: on Linux a large allocation succeeds and the process is killed later,
    /// when the memory is touched. Once per graph.
    fn check_memory(&mut self, graph: &Graph) -> Result<()> {
        let key = (graph.as_ptr() as usize, graph.n_nodes(), graph.n_leafs());
        if self.measured.contains(&key) {
            return Ok(());
        }
        let need = self.measure(graph)?;
        // What the allocator holds already is reused, not allocated again.
        let held = self.buffer_size();
        let available = match self.memory_limit {
            Some(limit) => limit,
            None => held + self.buffer_type.available_memory(),
        };
        log::debug!(
            "graph of {} nodes needs {} MiB on {}, {} MiB available",
            graph.n_nodes(),
            need >> 20,
            self.buffer_type.name(),
            available >> 20
        );
        if need > available {
            // The measuring left the refused graph's plan in the allocator, which a later
            // graph of the same node count could take as its own over a buffer too small for
            // it: start from a fresh allocator.
            // SAFETY: a registry buffer type; NULL on failure.
            let fresh = unsafe { sys::ggml_gallocr_new(self.buffer_type.as_ptr()) };
            if let Some(fresh) = NonNull::new(fresh) {
                // SAFETY: owned, freed once; no allocation borrows it (`&mut self`).
                unsafe { sys::ggml_gallocr_free(self.raw.as_ptr()) };
                self.raw = fresh;
            }
            return Err(Error::ComputeMemory {
                buffer_type: self.buffer_type.name(),
                need_mib: need.div_ceil(1 << 20),
                available_mib: available >> 20,
            });
        }
        // The measured plan, with its buffer really allocated: `alloc` then finds the plan
        // valid and places the tensors in a buffer that holds them.
        self.reserve(graph)?;
        self.measured.insert(key);
        Ok(())
    }
    /// An allocator for `backend`'s own memory.
    pub fn for_backend(backend: &Backend) -> Result<Gallocr> {
        Self::new(backend.default_buffer_type())
    }
    /// The memory this allocator places tensors in.
    pub fn buffer_type(&self) -> BufferType {
        self.buffer_type
    }
    /// Sizes the buffer for `graph` (the worst case) ahead of time.
    pub fn reserve(&mut self, graph: &Graph) -> Result<()> {
        // SAFETY: live allocator and graph.
        if unsafe { sys::ggml_gallocr_reserve(self.raw.as_ptr(), graph.as_ptr()) } {
            Ok(())
        } else {
            Err(Error::Allocation {
                backend: self.buffer_type.name(),
                reason: "reserve failed".into(),
            })
        }
    }
    /// Bytes held by the allocator's buffer.
    pub fn buffer_size(&self) -> usize {
        // SAFETY: live allocator; buffer 0 always exists for a single-type allocator.
        unsafe { sys::ggml_gallocr_get_buffer_size(self.raw.as_ptr(), 0) }
    }
    /// Allocates `graph`. The returned [`Allocation`] borrows the allocator, so no other graph
    /// can be allocated (and move this graph's memory) while it is in use:
    ///
    /// ```compile_fail,E0499
    /// # use da3::ggml::*;
    /// # fn f(gallocr: &mut Gallocr, g1: &Graph, g2: &Graph) -> Result<()> {
    /// let first = gallocr.alloc(g1)?;
    /// let second = gallocr.alloc(g2)?; // error: `gallocr` is still borrowed by `first`
    /// first.compute(&Backend::cpu(1)?)?;
    /// # Ok(()) }
    /// ```
    pub fn alloc<'a>(&'a mut self, graph: &'a Graph) -> Result<Allocation<'a>> {
        self.check_memory(graph)?;
        let placed = graph.unallocated_tensors();
        // SAFETY: live allocator and graph; returns false (no abort) when a buffer cannot be
        // allocated.
        if unsafe { sys::ggml_gallocr_alloc_graph(self.raw.as_ptr(), graph.as_ptr()) } {
            // New memory for the intermediate results, before the first compute touches it.
            let size = self.buffer_size();
            if size != self.advised_size {
                self.advised_size = size;
                let mut advised = std::collections::HashSet::new();
                for node in graph.nodes() {
                    if let Some(buffer) = node.buffer() {
                        if advised.insert(buffer.id()) {
                            buffer.advise_huge_pages();
                        }
                    }
                }
            }
            Ok(Allocation {
                graph,
                buffer_type: self.buffer_type,
                _placed: Placed(placed),
                _allocator: std::marker::PhantomData,
            })
        } else {
            Placed(placed).release();
            Err(Error::Allocation {
                backend: self.buffer_type.name(),
                reason: "ggml_gallocr_alloc_graph failed".into(),
            })
        }
    }
}

impl Drop for Gallocr {
    fn drop(&mut self) {
        // SAFETY: owned, freed once.
        unsafe { sys::ggml_gallocr_free(self.raw.as_ptr()) };
    }
}

/// A graph whose memory is allocated; inputs are written and outputs read through it.
pub struct Allocation<'a> {
    graph: &'a Graph,
    buffer_type: BufferType,
    _placed: Placed,
    _allocator: std::marker::PhantomData<&'a mut Gallocr>,
}

/// The tensors an allocator gave memory to. When the allocation ends their pointers are
/// cleared, so no tensor outlives its memory with a dangling `data`/`buffer` (the next
/// allocation, or the residency pass, would otherwise read freed memory).
pub(crate) struct Placed(pub(crate) Vec<NonNull<sys::ggml_tensor>>);

impl Placed {
    pub(crate) fn release(&mut self) {
        for t in self.0.drain(..) {
            // SAFETY: tensors of a graph that is still borrowed (alive); plain field writes
            // undoing what the allocator set.
            unsafe {
                (*t.as_ptr()).data = std::ptr::null_mut();
                (*t.as_ptr()).buffer = std::ptr::null_mut();
            }
        }
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.release();
    }
}

pub(crate) fn check_member(graph: &Graph, tensor: &Tensor) -> Result<()> {
    if graph.contains(tensor) {
        Ok(())
    } else {
        Err(Error::NotAllocated {
            operand: tensor.describe(),
        })
    }
}

impl Allocation<'_> {
    /// The allocated graph.
    pub fn graph(&self) -> &Graph {
        self.graph
    }
    /// Writes an input of the graph.
    pub fn write<T: Element>(&self, tensor: &Tensor, data: &[T]) -> Result<()> {
        check_member(self.graph, tensor)?;
        buffer::write_tensor(tensor, data)
    }
    /// Writes raw bytes (any type: quantised blocks, packed weights) into an input of the
    /// graph; exactly the tensor's size.
    pub fn write_bytes(&self, tensor: &Tensor, bytes: &[u8]) -> Result<()> {
        check_member(self.graph, tensor)?;
        buffer::write_tensor_bytes(tensor, bytes)
    }
    /// Reads a tensor of the graph (mark outputs with [`Tensor::mark_output`] so that their
    /// memory is not reused by later nodes).
    pub fn read<T: Element>(&self, tensor: &Tensor) -> Result<Vec<T>> {
        check_member(self.graph, tensor)?;
        buffer::read_tensor(tensor)
    }
    /// Runs the graph on `backend`, which must be able to run every op (checked).
    pub fn compute(&self, backend: &Backend) -> Result<()> {
        if !backend.supports_buffer_type(self.buffer_type) {
            return Err(Error::InvalidArgument {
                op: "compute",
                reason: format!(
                    "{} cannot read the allocator's {} memory",
                    backend.name(),
                    self.buffer_type.name()
                ),
            });
        }
        compute_on(backend, self.graph)
    }
}

/// Time spent in one node, from [`Allocation::profile`].
#[derive(Debug, Clone)]
pub struct NodeTime {
    /// The node's name.
    pub name: String,
    /// ggml's name of the node's op.
    pub op: &'static str,
    /// The node's shape and its first two operands' (what a profile needs to tell nodes apart).
    pub shapes: [[i64; 4]; 3],
    /// Wall time of the node's compute, in seconds (backend call included).
    pub seconds: f64,
}

impl Allocation<'_> {
    /// Computes the graph one node at a time on `backend` and times each node (for finding
    /// where time goes; slower than [`Allocation::compute`] by the per-call overhead). Each
    /// node is computed `repeats` times in one call and timed as the mean: on a GPU the
    /// call's launch and wait then count once for all, so small kernels are not buried under
    /// them. Repeating a node recomputes it from the same sources, except where an op writes
    /// into its own source (its values are then not the graph's: profile a separate
    /// allocation).
    pub fn profile(&self, backend: &Backend, repeats: usize) -> Result<Vec<NodeTime>> {
        let n = self.graph.n_nodes();
        let repeats = repeats.max(1);
        // SAFETY: pure function of compile-time sizes.
        let per_graph = unsafe { sys::ggml_graph_overhead_custom(repeats, false) };
        // SAFETY: ggml allocates its own pool; freed below.
        let scratch = unsafe {
            sys::ggml_init(sys::ggml_init_params {
                mem_size: per_graph * n + 1024,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            })
        };
        let scratch = NonNull::new(scratch).ok_or_else(|| Error::Creation {
            what: "a profiling context".into(),
        })?;
        let mut times = Vec::with_capacity(n);
        let mut result = Ok(());
        for node in self.graph.nodes() {
            if !backend.supports_op(&node) {
                result = Err(Error::UnsupportedOp {
                    backend: backend.name(),
                    op: node.op_name().into(),
                    node: node.name(),
                });
                break;
            }
            // SAFETY: the pool holds n graphs of `repeats` nodes; the node belongs to this
            // allocated graph, so its sources are computed (earlier nodes) or allocated.
            let status = unsafe {
                let single = sys::ggml_new_graph_custom(scratch.as_ptr(), repeats, false);
                for _ in 0..repeats {
                    sys::ggml_graph_add_node(single, node.raw().as_ptr());
                }
                let started = std::time::Instant::now();
                let status = sys::ggml_backend_graph_compute(backend.as_ptr(), single);
                let sources = node.sources();
                let shape_of = |i: usize| sources.get(i).map_or([0; 4], |s| s.ne());
                times.push(NodeTime {
                    name: node.name(),
                    op: node.op_name(),
                    shapes: [node.ne(), shape_of(0), shape_of(1)],
                    seconds: started.elapsed().as_secs_f64() / repeats as f64,
                });
                status
            };
            if let Err(e) = compute_status(backend, status) {
                result = Err(e);
                break;
            }
        }
        // SAFETY: created above, freed once.
        unsafe { sys::ggml_free(scratch.as_ptr()) };
        result.map(|()| times)
    }
}

pub(crate) fn compute_on(backend: &Backend, graph: &Graph) -> Result<()> {
    if let Some(node) = graph.nodes().find(|n| !backend.supports_op(n)) {
        return Err(Error::UnsupportedOp {
            backend: backend.name(),
            op: node.op_name().into(),
            node: node.name(),
        });
    }
    // SAFETY: live backend and allocated graph whose ops the backend supports.
    let status = unsafe { sys::ggml_backend_graph_compute(backend.as_ptr(), graph.as_ptr()) };
    compute_status(backend, status)
}

/// A compute call's status as a result naming `backend`.
pub(crate) fn compute_status(backend: &Backend, status: sys::ggml_status) -> Result<()> {
    if status == sys::GGML_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Compute {
            backend: backend.name(),
            status,
        })
    }
}

impl std::fmt::Debug for Gallocr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gallocr")
            .field("buffer_type", &self.buffer_type)
            .field("buffer_size", &self.buffer_size())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Allocation<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Allocation")
            .field("graph", self.graph)
            .field("buffer_type", &self.buffer_type)
            .finish_non_exhaustive()
    }
}
