//! Contexts: ggml's arena for tensor metadata (and, for host contexts, tensor data).

use super::buffer::Buffer;
use super::dtype::DType;
use super::error::{Error, Result};
use super::tensor::{Element, Tensor, TensorView};
use ggml_sys as sys;
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

/// ggml aligns every object in a context pool to this many bytes (GGML_MEM_ALIGN).
const MEM_ALIGN: usize = 16;

pub(crate) struct ContextInner {
    raw: NonNull<sys::ggml_context>,
    no_alloc: bool,
    /// Buffers holding this context's tensors; freed with the context.
    buffers: RefCell<Vec<Buffer>>,
    /// Contexts whose tensors are operands of this context's ops.
    keep_alive: RefCell<Vec<Rc<ContextInner>>>,
    /// What this context's custom nodes point ggml to as their user data (the CPU kernels'
    /// calls): boxed, so that each stays where it is, and freed with the context, after
    /// every graph holding its node (graphs keep their contexts alive).
    node_data: RefCell<Vec<Box<dyn std::any::Any + Send + Sync>>>,
    /// Frozen contexts whose tensors this context's ops use (see [`Context::import`]).
    imports: super::shared::Imports,
}

impl ContextInner {
    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.raw.as_ptr()
    }
    pub(crate) fn owns_buffer(&self, buffer: *mut sys::ggml_backend_buffer) -> bool {
        self.buffers.borrow().iter().any(|b| b.as_ptr() == buffer)
    }
    pub(crate) fn with_buffers<R>(&self, f: impl FnOnce(&[Buffer]) -> R) -> R {
        f(&self.buffers.borrow())
    }
    pub(crate) fn imports(&self) -> &super::shared::Imports {
        &self.imports
    }
    pub(crate) fn attach_buffer(&self, buffer: Buffer) {
        self.buffers.borrow_mut().push(buffer);
    }
    pub(crate) fn kept_alive(&self) -> Vec<Rc<ContextInner>> {
        self.keep_alive.borrow().clone()
    }
    pub(crate) fn keep(self: &Rc<Self>, other: &Rc<ContextInner>) {
        if Rc::ptr_eq(self, other) {
            return;
        }
        let mut kept = self.keep_alive.borrow_mut();
        if !kept.iter().any(|k| Rc::ptr_eq(k, other)) {
            kept.push(other.clone());
        }
    }
    /// Bytes of pool left, as ggml computes it for the next object.
    fn available(&self) -> (usize, usize) {
        // SAFETY: live context.
        let (used, size) = unsafe {
            (
                sys::ggml_used_mem(self.raw()),
                sys::ggml_get_mem_size(self.raw()),
            )
        };
        (size.saturating_sub(used), size)
    }
    /// Fails instead of letting ggml abort when an object of `size` bytes does not fit.
    pub(crate) fn reserve(&self, size: usize) -> Result<()> {
        // SAFETY: ggml_tensor_overhead is a pure function of compile-time sizes.
        let object_header =
            unsafe { sys::ggml_tensor_overhead() } - std::mem::size_of::<sys::ggml_tensor>();
        let needed = size.div_ceil(MEM_ALIGN) * MEM_ALIGN + object_header;
        let (available, capacity) = self.available();
        if needed > available {
            return Err(Error::ContextFull {
                needed,
                available,
                capacity,
            });
        }
        Ok(())
    }
}

impl Drop for ContextInner {
    fn drop(&mut self) {
        self.buffers.borrow_mut().clear();
        // SAFETY: the context was created by ggml_init and is freed exactly once, here; no
        // tensor handle outlives this (they hold an Rc to us).
        unsafe { sys::ggml_free(self.raw.as_ptr()) };
    }
}

/// An arena of tensors.
///
/// A *host* context ([`Context::host`]) also holds tensor data in its pool; a
/// *metadata-only* context ([`Context::metadata`]) holds shapes only, and its tensors get
/// memory from a backend buffer ([`Context::allocate_on`]) or a graph allocator.
///
/// ```
/// use da3::ggml::{Context, DType, TensorView};
/// let ctx = Context::metadata(16).unwrap();
/// let w = ctx.new_tensor(DType::F32, &[64, 32]).unwrap().named("w");
/// assert_eq!(w.shape().dims(), &[64, 32]);
/// assert!(ctx.new_tensor(DType::F32, &[0, 4]).is_err()); // zero dims are refused, not aborted
/// ```
#[derive(Clone)]
pub struct Context {
    inner: Rc<ContextInner>,
}

impl Context {
    fn init(mem_size: usize, no_alloc: bool) -> Result<Self> {
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc,
        };
        // SAFETY: ggml allocates (and later frees) its own pool of `mem_size` bytes.
        let raw = unsafe { sys::ggml_init(params) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::Creation {
            what: format!("a context of {mem_size} bytes"),
        })?;
        Ok(Context {
            inner: Rc::new(ContextInner {
                raw,
                no_alloc,
                buffers: RefCell::new(Vec::new()),
                keep_alive: RefCell::new(Vec::new()),
                node_data: RefCell::new(Vec::new()),
                imports: Default::default(),
            }),
        })
    }

    /// A context for up to `max_tensors` tensors whose data lives in backend buffers, plus
    /// room for one graph of [`Context::GRAPH_SIZE`] nodes.
    pub fn metadata(max_tensors: usize) -> Result<Self> {
        Self::metadata_with_graph(max_tensors, Self::GRAPH_SIZE)
    }

    /// Default graph capacity in nodes.
    pub const GRAPH_SIZE: usize = 2048;

    /// Like [`Context::metadata`] with room for one graph of `graph_size` nodes.
    pub fn metadata_with_graph(max_tensors: usize, graph_size: usize) -> Result<Self> {
        // SAFETY: pure functions of compile-time sizes.
        let size = unsafe {
            max_tensors * sys::ggml_tensor_overhead()
                + sys::ggml_graph_overhead_custom(graph_size, false)
        };
        Self::init(size, true)
    }

    /// A context whose pool of `mem_size` bytes also holds tensor data, in host memory.
    pub fn host(mem_size: usize) -> Result<Self> {
        Self::init(mem_size, false)
    }
    pub(crate) fn from_inner(inner: Rc<ContextInner>) -> Self {
        Context { inner }
    }
    pub(crate) fn inner(&self) -> &Rc<ContextInner> {
        &self.inner
    }
    pub(crate) fn into_inner(self) -> Rc<ContextInner> {
        self.inner
    }
    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.inner.raw()
    }
    /// Keeps `data` as long as this context, at an address that does not move: the user
    /// data of a custom node of this context.
    pub(crate) fn hold_node_data<T: Send + Sync + 'static>(&self, data: Box<T>) -> *const T {
        let at: *const T = &*data;
        self.inner.node_data.borrow_mut().push(data);
        at
    }
    /// Whether tensor data lives outside the pool.
    pub fn is_metadata_only(&self) -> bool {
        self.inner.no_alloc
    }
    /// Bytes used and total in the pool.
    pub fn memory(&self) -> (usize, usize) {
        // SAFETY: live context.
        unsafe {
            (
                sys::ggml_used_mem(self.raw()),
                sys::ggml_get_mem_size(self.raw()),
            )
        }
    }

    pub(crate) fn wrap(&self, raw: *mut sys::ggml_tensor, what: &str) -> Result<Tensor> {
        let raw = NonNull::new(raw).ok_or_else(|| Error::Creation {
            what: what.to_owned(),
        })?;
        Ok(Tensor::from_raw(raw, self.inner.clone()))
    }

    /// Records that this context's tensors use `operand` (so its context stays alive).
    pub(crate) fn use_operand(&self, operand: &Tensor) {
        self.inner.keep(operand.ctx());
    }

    /// A new tensor with `ne` in ggml order (innermost first), 1 to 4 dims, each at least 1.
    pub fn new_tensor(&self, dtype: DType, ne: &[i64]) -> Result<Tensor> {
        let op = "new_tensor";
        let invalid = |reason: String| Error::InvalidShape {
            op,
            ne: ne.to_vec(),
            reason,
        };
        if ne.is_empty() || ne.len() > 4 {
            return Err(invalid(format!(
                "{} dims; ggml tensors have 1 to 4",
                ne.len()
            )));
        }
        if let Some(d) = ne.iter().find(|&&d| d < 1) {
            return Err(invalid(format!("dimension {d} is not positive")));
        }
        let mut ne4 = [1u64; 4];
        for (dst, &d) in ne4.iter_mut().zip(ne) {
            *dst = d as u64;
        }
        if ne4[0] % dtype.block_size() as u64 != 0 {
            return Err(invalid(format!(
                "{dtype} stores blocks of {} values; ne[0] = {} is not a multiple",
                dtype.block_size(),
                ne4[0]
            )));
        }
        let count_fits = ne4
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .is_some_and(|n| n <= i64::MAX as u64);
        let data_size = dtype
            .nbytes(ne4)
            .filter(|&n| n <= isize::MAX as u64 && count_fits);
        let data_size = data_size.ok_or_else(|| invalid("size overflows".to_owned()))? as usize;
        let data = if self.inner.no_alloc { 0 } else { data_size };
        self.inner
            .reserve(std::mem::size_of::<sys::ggml_tensor>() + data)?;
        let ne64: Vec<i64> = ne.to_vec();
        // SAFETY: type id valid (from DType), 1..=4 positive dims whose product and byte size
        // fit, and the pool has room for the object (checked above): no GGML_ASSERT can fire.
        let raw =
            unsafe { sys::ggml_new_tensor(self.raw(), dtype.id(), ne.len() as i32, ne64.as_ptr()) };
        self.wrap(raw, "a tensor")
    }

    /// Finds a tensor of this context by name.
    pub fn tensor(&self, name: &str) -> Option<Tensor> {
        let c_name = std::ffi::CString::new(name).ok()?;
        // SAFETY: live context, NUL-terminated name; returns NULL when absent.
        let raw = unsafe { sys::ggml_get_tensor(self.raw(), c_name.as_ptr()) };
        NonNull::new(raw).map(|raw| Tensor::from_raw(raw, self.inner.clone()))
    }

    /// Every tensor of the context, in creation order.
    pub fn tensors(&self) -> Vec<Tensor> {
        let mut out = Vec::new();
        // SAFETY: iterating a live context's object list; each returned pointer is a tensor.
        let mut cur = unsafe { sys::ggml_get_first_tensor(self.raw()) };
        while let Some(raw) = NonNull::new(cur) {
            out.push(Tensor::from_raw(raw, self.inner.clone()));
            // SAFETY: as above.
            cur = unsafe { sys::ggml_get_next_tensor(self.raw(), cur) };
        }
        out
    }

    /// Writes host data into a tensor whose memory this context owns: its own pool (host
    /// context) or a buffer from [`Context::allocate_on`].
    pub fn write<T: Element>(&self, tensor: &Tensor, data: &[T]) -> Result<()> {
        self.check_owned(tensor)?;
        super::buffer::write_tensor(tensor, data)
    }

    /// Writes raw bytes (any type, e.g. quantised blocks) into a tensor this context owns.
    pub fn write_bytes(&self, tensor: &Tensor, bytes: &[u8]) -> Result<()> {
        self.check_owned(tensor)?;
        super::buffer::write_tensor_bytes(tensor, bytes)
    }

    /// Reads a tensor whose memory this context owns.
    pub fn read<T: Element>(&self, tensor: &Tensor) -> Result<Vec<T>> {
        self.check_owned(tensor)?;
        super::buffer::read_tensor(tensor)
    }

    /// Reads the raw bytes (any type, e.g. quantised blocks) of a tensor this context owns.
    pub fn read_bytes(&self, tensor: &Tensor) -> Result<Vec<u8>> {
        self.check_owned(tensor)?;
        super::buffer::read_tensor_bytes(tensor)
    }

    fn check_owned(&self, tensor: &Tensor) -> Result<()> {
        let owned = Rc::ptr_eq(tensor.ctx(), &self.inner)
            && tensor.has_data()
            && match tensor.buffer() {
                Some(b) => self.inner.owns_buffer(b.as_ptr()),
                None => !self.inner.no_alloc,
            };
        if owned {
            Ok(())
        } else {
            Err(Error::NotAllocated {
                operand: tensor.describe(),
            })
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (used, size) = self.memory();
        f.debug_struct("Context")
            .field("metadata_only", &self.is_metadata_only())
            .field("tensors", &self.tensors().len())
            .field("pool_used", &used)
            .field("pool_size", &size)
            .finish_non_exhaustive()
    }
}
