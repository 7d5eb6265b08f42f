//! Tensor handles. A [`Tensor`] keeps its context alive; a [`TensorRef`] is a borrowed look at
//! any tensor of a graph (including operands from other contexts), used for inspection.

use super::buffer::BufferRef;
use super::context::ContextInner;
use super::dtype::DType;
use super::error::Operand;
use super::shape::Shape;
use ggml_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::rc::Rc;

/// Tensor flags ggml's schedulers read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorFlags {
    /// Marked with [`Tensor::mark_input`].
    pub input: bool,
    /// Marked with [`Tensor::mark_output`].
    pub output: bool,
    /// ggml's trainable-parameter flag (never set by this crate).
    pub param: bool,
}

mod sealed {
    /// Only this module's handles implement [`super::TensorView`]: its provided methods
    /// dereference `raw()`, so an outside impl returning a dangling pointer would make safe
    /// code read freed memory.
    pub trait Sealed {}
    impl Sealed for super::Tensor {}
    impl Sealed for super::TensorRef<'_> {}
}

/// Read access shared by [`Tensor`] and [`TensorRef`].
///
/// The trait is sealed: its methods read through the tensor pointer, so only the handles of
/// this module, which keep the tensor alive, implement it. An outside impl does not compile:
///
/// ```compile_fail,E0277
/// use da3::ggml::TensorView;
/// struct Dangling;
/// impl TensorView for Dangling {
///     fn raw(&self) -> std::ptr::NonNull<ggml_sys::ggml_tensor> {
///         std::ptr::NonNull::dangling()
///     }
/// }
/// ```
pub trait TensorView: sealed::Sealed {
    #[doc(hidden)]
    fn raw(&self) -> NonNull<sys::ggml_tensor>;

    /// The tensor's name ("" when unnamed).
    fn name(&self) -> String {
        // SAFETY: `raw` points at a live tensor (the handle keeps its context alive) whose
        // `name` field is a NUL-terminated array written only by ggml_set_name/format_name.
        let name = unsafe { CStr::from_ptr((*self.raw().as_ptr()).name.as_ptr()) };
        name.to_string_lossy().into_owned()
    }
    /// Extents in ggml order (`ne[0]` innermost, in elements).
    fn shape(&self) -> Shape {
        // SAFETY: live tensor, see `name`.
        let t = unsafe { &*self.raw().as_ptr() };
        let n_dims = unsafe { sys::ggml_n_dims(self.raw().as_ptr()) } as usize;
        Shape {
            ne: t.ne,
            n_dims: n_dims.max(1),
        }
    }
    /// All four extents in elements, innermost first (unused dims are 1).
    fn ne(&self) -> [i64; 4] {
        self.shape().ne
    }
    /// Strides in bytes.
    fn nb(&self) -> [usize; 4] {
        // SAFETY: live tensor, see `name`.
        unsafe { (*self.raw().as_ptr()).nb }
    }
    /// The element type.
    fn dtype(&self) -> DType {
        // SAFETY: live tensor, see `name`.
        let id = unsafe { (*self.raw().as_ptr()).type_ };
        DType::from_id(id).expect("ggml created a tensor of a type it knows")
    }
    /// Number of elements.
    fn nelements(&self) -> i64 {
        self.shape().nelements()
    }
    /// Bytes the data spans, strides included (for quantised types, whole blocks).
    fn nbytes(&self) -> usize {
        // SAFETY: live tensor.
        unsafe { sys::ggml_nbytes(self.raw().as_ptr()) }
    }
    /// Whether the elements are packed without gaps in ggml order (`ne[0]` innermost).
    fn is_contiguous(&self) -> bool {
        // SAFETY: live tensor.
        unsafe { sys::ggml_is_contiguous(self.raw().as_ptr()) }
    }
    /// Whether dims 0 and 1 are swapped in memory (`nb[0] > nb[1]`).
    fn is_transposed(&self) -> bool {
        // SAFETY: live tensor.
        unsafe { sys::ggml_is_transposed(self.raw().as_ptr()) }
    }
    /// ggml's name of the op that computes this tensor ("NONE" for leafs).
    fn op_name(&self) -> &'static str {
        // SAFETY: ggml_op_name returns a static string for every op value ggml creates.
        unsafe {
            let op = (*self.raw().as_ptr()).op;
            let name = if op == sys::GGML_OP_UNARY {
                sys::ggml_unary_op_name(sys::ggml_get_unary_op(self.raw().as_ptr()))
            } else {
                sys::ggml_op_name(op)
            };
            CStr::from_ptr(name).to_str().unwrap_or("?")
        }
    }
    /// True for tensors no op computes (weights, inputs).
    fn is_leaf_op(&self) -> bool {
        // SAFETY: live tensor.
        unsafe { (*self.raw().as_ptr()).op == sys::GGML_OP_NONE }
    }
    /// The input/output flags schedulers and allocators read.
    fn flags(&self) -> TensorFlags {
        // SAFETY: live tensor.
        let flags = unsafe { (*self.raw().as_ptr()).flags } as u32;
        TensorFlags {
            input: flags & sys::GGML_TENSOR_FLAG_INPUT != 0,
            output: flags & sys::GGML_TENSOR_FLAG_OUTPUT != 0,
            param: flags & sys::GGML_TENSOR_FLAG_PARAM != 0,
        }
    }
    /// The buffer holding the tensor's data, if any.
    fn buffer(&self) -> Option<BufferRef<'_>> {
        // SAFETY: live tensor; a non-NULL buffer is owned by a context, allocator or
        // scheduler that outlives the handle this borrow came from.
        let buffer = unsafe { (*self.raw().as_ptr()).buffer };
        NonNull::new(buffer).map(BufferRef::new)
    }
    /// Whether `data` is set (by a buffer, a host context, or a view of either).
    fn has_data(&self) -> bool {
        // SAFETY: live tensor.
        unsafe { !(*self.raw().as_ptr()).data.is_null() }
    }
    /// The tensor this one is a view of, if it is a view.
    fn view_source(&self) -> Option<TensorRef<'_>> {
        // SAFETY: live tensor; view_src outlives its views (same or kept-alive context).
        let src = unsafe { (*self.raw().as_ptr()).view_src };
        NonNull::new(src).map(TensorRef::new)
    }
    /// The op's operands, in ggml's order.
    fn sources(&self) -> Vec<TensorRef<'_>> {
        // SAFETY: live tensor; its sources are kept alive with it (see Context keep-alive).
        let srcs = unsafe { (*self.raw().as_ptr()).src };
        srcs.iter()
            .filter_map(|s| NonNull::new(*s))
            .map(TensorRef::new)
            .collect()
    }
    /// Identity of the underlying ggml tensor (for maps and sets).
    fn id(&self) -> usize {
        self.raw().as_ptr() as usize
    }
    /// The description error messages use.
    fn describe(&self) -> Operand {
        Operand {
            name: self.name(),
            dtype: self.dtype(),
            shape: self.shape(),
        }
    }
}

/// An owning handle to a tensor: keeps the context that holds its metadata (and, through
/// it, every context its operands live in) alive.
#[derive(Clone)]
pub struct Tensor {
    raw: NonNull<sys::ggml_tensor>,
    ctx: Rc<ContextInner>,
}

impl Tensor {
    pub(crate) fn from_raw(raw: NonNull<sys::ggml_tensor>, ctx: Rc<ContextInner>) -> Self {
        Tensor { raw, ctx }
    }
    pub(crate) fn ctx(&self) -> &Rc<ContextInner> {
        &self.ctx
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_tensor {
        self.raw.as_ptr()
    }

    /// Sets the name (ggml keeps at most 63 bytes; longer names are cut at a char boundary).
    /// A shared weight ([`super::Context::import`]) keeps its name: other threads read it.
    pub fn set_name(&self, name: &str) -> &Self {
        if super::shared::is_frozen_leaf(self.raw) {
            return self;
        }
        let mut end = name.len().min(sys::GGML_MAX_NAME as usize - 1);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        let mut bytes = name.as_bytes()[..end].to_vec();
        bytes.retain(|&b| b != 0);
        bytes.push(0);
        // SAFETY: live tensor; `bytes` is NUL-terminated and ggml copies at most
        // GGML_MAX_NAME - 1 bytes of it into the fixed-size name array.
        unsafe { sys::ggml_set_name(self.raw.as_ptr(), bytes.as_ptr().cast()) };
        self
    }
    /// Builder form of [`Tensor::set_name`].
    pub fn named(self, name: &str) -> Self {
        self.set_name(name);
        self
    }
    /// Marks the tensor as a graph input (schedulers place it before computing). Shared
    /// weights keep their flags.
    pub fn mark_input(&self) -> &Self {
        if super::shared::is_frozen_leaf(self.raw) {
            return self;
        }
        // SAFETY: live tensor; only sets a flag bit.
        unsafe { sys::ggml_set_input(self.raw.as_ptr()) };
        self
    }
    /// Marks the tensor as a graph output (allocators keep its memory to the end). Shared
    /// weights keep their flags (their memory is never reused anyway).
    pub fn mark_output(&self) -> &Self {
        if super::shared::is_frozen_leaf(self.raw) {
            return self;
        }
        // SAFETY: live tensor; only sets a flag bit.
        unsafe { sys::ggml_set_output(self.raw.as_ptr()) };
        self
    }
    /// A borrowed view for inspection.
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef::new(self.raw)
    }
}

impl TensorView for Tensor {
    fn raw(&self) -> NonNull<sys::ggml_tensor> {
        self.raw
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({})", self.describe())
    }
}

/// A borrowed look at a tensor reachable from a handle or a graph the borrow comes from.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    raw: NonNull<sys::ggml_tensor>,
    _borrow: PhantomData<&'a sys::ggml_tensor>,
}

impl<'a> TensorRef<'a> {
    pub(crate) fn new(raw: NonNull<sys::ggml_tensor>) -> Self {
        TensorRef {
            raw,
            _borrow: PhantomData,
        }
    }
    /// The op's operands with their source slots (ggml's `src[slot]`), valid as long as this
    /// reference.
    pub fn sources_with_slots(&self) -> Vec<(usize, TensorRef<'a>)> {
        // SAFETY: live tensor; its sources are kept alive with it (see Context keep-alive).
        let srcs = unsafe { (*self.raw.as_ptr()).src };
        srcs.iter()
            .enumerate()
            .filter_map(|(i, s)| NonNull::new(*s).map(|s| (i, TensorRef::new(s))))
            .collect()
    }
    /// The op's operands, valid as long as this reference.
    pub fn sources(&self) -> Vec<TensorRef<'a>> {
        self.sources_with_slots()
            .into_iter()
            .map(|(_, s)| s)
            .collect()
    }
    /// The tensor this one is a view of, valid as long as this reference.
    pub fn view_source(&self) -> Option<TensorRef<'a>> {
        // SAFETY: live tensor; view_src outlives its views.
        NonNull::new(unsafe { (*self.raw.as_ptr()).view_src }).map(TensorRef::new)
    }
}

impl TensorView for TensorRef<'_> {
    fn raw(&self) -> NonNull<sys::ggml_tensor> {
        self.raw
    }
}

impl fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorRef({})", self.describe())
    }
}

/// Element types host data can be read as or written from.
pub trait Element: Copy + Default + 'static {
    /// The ggml type whose memory layout this Rust type has.
    const DTYPE: DType;
}
impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
