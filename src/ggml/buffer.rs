//! Backend buffers and buffer types, and checked tensor data transfer.

use super::backend::Backend;
use super::context::Context;
use super::error::{Error, Result};
use super::tensor::{Element, Tensor, TensorView};
use ggml_sys as sys;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::NonNull;

/// What a buffer holds; schedulers place ops next to `Weights` buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferUsage {
    /// Unspecified (ggml's default).
    Any,
    /// Model weights: the scheduler runs ops on the backend that holds them.
    Weights,
    /// Intermediate results of a graph.
    Compute,
}

impl BufferUsage {
    fn raw(self) -> sys::ggml_backend_buffer_usage {
        match self {
            BufferUsage::Any => sys::GGML_BACKEND_BUFFER_USAGE_ANY,
            BufferUsage::Weights => sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS,
            BufferUsage::Compute => sys::GGML_BACKEND_BUFFER_USAGE_COMPUTE,
        }
    }
    fn from_raw(raw: sys::ggml_backend_buffer_usage) -> Self {
        match raw {
            sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS => BufferUsage::Weights,
            sys::GGML_BACKEND_BUFFER_USAGE_COMPUTE => BufferUsage::Compute,
            _ => BufferUsage::Any,
        }
    }
}

/// A kind of memory a backend allocates (host RAM, a GPU's memory, a remote server's).
/// Buffer types live in ggml's registry for the whole process.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct BufferType {
    raw: NonNull<sys::ggml_backend_buffer_type>,
}

impl BufferType {
    pub(crate) fn from_raw(raw: NonNull<sys::ggml_backend_buffer_type>) -> Self {
        BufferType { raw }
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_backend_buffer_type {
        self.raw.as_ptr()
    }
    /// "CPU", "CUDA0", "MTL0", "RPC0[127.0.0.1:50052]", ...
    pub fn name(&self) -> String {
        // SAFETY: registry-owned buffer type; the name is a static or type-owned C string.
        unsafe {
            CStr::from_ptr(sys::ggml_backend_buft_name(self.as_ptr()))
                .to_string_lossy()
                .into_owned()
        }
    }
    /// Whether the CPU can read this memory directly.
    pub fn is_host(&self) -> bool {
        // SAFETY: registry-owned buffer type.
        unsafe { sys::ggml_backend_buft_is_host(self.as_ptr()) }
    }
    /// Bytes this memory has available: for host memory the kernel's `MemAvailable` (on
    /// Linux; ggml reports all of RAM as free), for a device's what the device reports free;
    /// `usize::MAX` where nothing says.
    pub fn available_memory(&self) -> usize {
        if self.is_host() {
            if let Some(bytes) = host_memory_available() {
                return bytes;
            }
        }
        // SAFETY: registry-owned buffer type; the device may be NULL.
        let dev = unsafe { sys::ggml_backend_buft_get_device(self.as_ptr()) };
        match NonNull::new(dev) {
            Some(dev) => super::backend::Device::from_raw(dev).memory().0,
            None => usize::MAX,
        }
    }
    /// The CPU's own buffer type.
    pub fn cpu() -> Self {
        // SAFETY: returns a static buffer type.
        let raw = unsafe { sys::ggml_backend_cpu_buffer_type() };
        BufferType {
            raw: NonNull::new(raw).expect("the CPU buffer type is static"),
        }
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn host_memory_available() -> Option<usize> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl std::fmt::Debug for BufferType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BufferType({})", self.name())
    }
}

/// Owner of one backend buffer; frees it on drop. Held by the context whose tensors it backs.
pub(crate) struct Buffer {
    raw: NonNull<sys::ggml_backend_buffer>,
}

impl Buffer {
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_backend_buffer {
        self.raw.as_ptr()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: we own the buffer (allocated by us, freed once, here).
        unsafe { sys::ggml_backend_buffer_free(self.raw.as_ptr()) };
    }
}

/// A borrowed look at the buffer behind a tensor.
#[derive(Clone, Copy)]
pub struct BufferRef<'a> {
    raw: NonNull<sys::ggml_backend_buffer>,
    _borrow: PhantomData<&'a ()>,
}

impl BufferRef<'_> {
    pub(crate) fn new(raw: NonNull<sys::ggml_backend_buffer>) -> Self {
        BufferRef {
            raw,
            _borrow: PhantomData,
        }
    }
    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_backend_buffer {
        self.raw.as_ptr()
    }
    /// The kind of memory the buffer is.
    pub fn buffer_type(&self) -> BufferType {
        // SAFETY: live non-NULL buffer (the precondition ggml asserts).
        let raw = unsafe { sys::ggml_backend_buffer_get_type(self.as_ptr()) };
        BufferType::from_raw(NonNull::new(raw).expect("a buffer has a type"))
    }
    /// What the buffer was marked as holding.
    pub fn usage(&self) -> BufferUsage {
        // SAFETY: live non-NULL buffer.
        BufferUsage::from_raw(unsafe { sys::ggml_backend_buffer_get_usage(self.as_ptr()) })
    }
    /// Whether the CPU can read the buffer's memory directly.
    pub fn is_host(&self) -> bool {
        // SAFETY: live non-NULL buffer.
        unsafe { sys::ggml_backend_buffer_is_host(self.as_ptr()) }
    }
    /// Size in bytes.
    pub fn size(&self) -> usize {
        // SAFETY: live non-NULL buffer.
        unsafe { sys::ggml_backend_buffer_get_size(self.as_ptr()) }
    }
    /// Identity of the buffer (for grouping).
    pub fn id(&self) -> usize {
        self.raw.as_ptr() as usize
    }
    /// The address of the buffer's memory (meaningful to the CPU only for host buffers).
    fn base_address(&self) -> usize {
        // SAFETY: live non-NULL buffer.
        unsafe { sys::ggml_backend_buffer_get_base(self.as_ptr()) as usize }
    }
    /// Asks Linux to back the whole 2 MiB pages inside this buffer, if it is the CPU's own
    /// memory, with transparent huge pages (where the system leaves them to `madvise`, as
    /// Debian does): a model's weights and intermediate results are hundreds of MB read
    /// once per image, and with 4 KiB pages every few KB of a weight's panel cost a page
    /// walk. Advice only: nothing changes if the kernel declines it.
    pub(crate) fn advise_huge_pages(&self) {
        #[cfg(target_os = "linux")]
        {
            if self.buffer_type() != BufferType::cpu() {
                return;
            }
            const HUGE_PAGE: usize = 2 << 20;
            let base = self.base_address();
            let start = base.next_multiple_of(HUGE_PAGE);
            let end = (base + self.size()) / HUGE_PAGE * HUGE_PAGE;
            if end > start {
                // SAFETY: [start, end) lies inside the buffer's memory, which the buffer owns
                // and maps for its whole size; MADV_HUGEPAGE changes neither the contents nor
                // what may be accessed, only how the kernel backs the range.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE)
                };
            }
        }
    }
}

impl std::fmt::Debug for BufferRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferRef")
            .field("buffer_type", &self.buffer_type())
            .field("usage", &self.usage())
            .field("size", &self.size())
            .finish()
    }
}

impl Context {
    /// Allocates every tensor of this metadata-only context that has no memory yet in one
    /// buffer of `backend`'s default type. The buffer is owned by the context. Returns its
    /// size in bytes (0 when there was nothing to allocate).
    pub fn allocate_on(&self, backend: &Backend, usage: BufferUsage) -> Result<usize> {
        self.allocate_in(backend.default_buffer_type(), usage)
    }

    /// Like [`Context::allocate_on`] for an explicit buffer type. Tensors that do not fit in
    /// one buffer of the type (its maximum size: 1 GiB or the device's allocation limit on
    /// Vulkan, 4 GiB on Metal) go into several, each owned by the context.
    pub fn allocate_in(&self, buffer_type: BufferType, usage: BufferUsage) -> Result<usize> {
        // SAFETY: registry buffer type; get_max_size has no preconditions.
        let max_size = unsafe { sys::ggml_backend_buft_get_max_size(buffer_type.as_ptr()) };
        self.allocate_chunked(buffer_type, usage, max_size)
    }

    /// [`Context::allocate_in`] with buffers of at most `max_size` bytes (unless one tensor
    /// alone is larger). ggml's own `ggml_backend_alloc_ctx_tensors_from_buft` would wrap
    /// several buffers in a "multi buffer" whose parts the tensors point at, parts no context
    /// could name as its own; here each part is a buffer of the context.
    pub(crate) fn allocate_chunked(
        &self,
        buffer_type: BufferType,
        usage: BufferUsage,
        max_size: usize,
    ) -> Result<usize> {
        if !self.is_metadata_only() {
            return Err(Error::InvalidArgument {
                op: "allocate_in",
                reason: "a host context already holds its tensors' data".to_owned(),
            });
        }
        let pending: usize = self
            .tensors()
            .iter()
            .filter(|t| !t.has_data() && t.view_source().is_none())
            .map(|t| t.nbytes())
            .sum();
        if pending == 0 {
            return Ok(0);
        }
        let tensors = self.tensors();
        // SAFETY: registry buffer type; no preconditions.
        let alignment = unsafe { sys::ggml_backend_buft_get_alignment(buffer_type.as_ptr()) };
        let padded = |t: &Tensor| {
            // SAFETY: registry buffer type and a live tensor of this context.
            let size =
                unsafe { sys::ggml_backend_buft_get_alloc_size(buffer_type.as_ptr(), t.as_ptr()) };
            size.div_ceil(alignment) * alignment
        };
        // Consecutive runs of tensors that fit in `max_size`, as ggml plans them.
        let mut chunks: Vec<(usize, Vec<&Tensor>)> = Vec::new();
        for t in tensors
            .iter()
            .filter(|t| !t.has_data() && t.view_source().is_none())
        {
            let size = padded(t);
            match chunks.last_mut() {
                Some((used, members)) if *used + size <= max_size => {
                    *used += size;
                    members.push(t);
                }
                _ => chunks.push((size, vec![t])),
            }
        }
        let mut total = 0;
        for (bytes, members) in chunks {
            // Slack for a base address the buffer does not align.
            let bytes = bytes + alignment;
            // SAFETY: registry buffer type; returns NULL when the memory is not there.
            let raw = unsafe { sys::ggml_backend_buft_alloc_buffer(buffer_type.as_ptr(), bytes) };
            let raw = NonNull::new(raw).ok_or_else(|| Error::BufferAlloc {
                buffer_type: buffer_type.name(),
                bytes,
            })?;
            // SAFETY: the buffer we just got.
            unsafe { sys::ggml_backend_buffer_set_usage(raw.as_ptr(), usage.raw()) };
            let size = BufferRef::new(raw).size();
            BufferRef::new(raw).advise_huge_pages();
            // Owned by the context before any tensor points into it, so that an error below
            // never leaves a tensor pointing at freed memory.
            self.inner().attach_buffer(Buffer { raw });
            // SAFETY: a live buffer; ggml_tallocr_new reads its base and alignment.
            let mut tallocr = unsafe { sys::ggml_tallocr_new(raw.as_ptr()) };
            for t in members {
                // ggml_tallocr_alloc aborts when a tensor does not fit: check first, with its
                // own arithmetic (the buffer's alloc size, padded to its alignment).
                // SAFETY: live buffer and tensor.
                let need =
                    unsafe { sys::ggml_backend_buffer_get_alloc_size(raw.as_ptr(), t.as_ptr()) }
                        .div_ceil(tallocr.alignment)
                        * tallocr.alignment;
                if tallocr.offset + need > size {
                    return Err(Error::BufferAlloc {
                        buffer_type: buffer_type.name(),
                        bytes: need,
                    });
                }
                // SAFETY: a tensor of this context without data, a buffer with room for it
                // (checked above); ggml sets its data and buffer.
                let status = unsafe { sys::ggml_tallocr_alloc(&mut tallocr, t.as_ptr()) };
                if status != sys::GGML_STATUS_SUCCESS {
                    return Err(Error::BufferAlloc {
                        buffer_type: buffer_type.name(),
                        bytes: need,
                    });
                }
            }
            total += size;
        }
        // Views of allocated tensors take their source's buffer.
        for t in tensors
            .iter()
            .filter(|t| t.view_source().is_some() && t.buffer().is_none())
        {
            if t.view_source().is_none_or(|s| s.buffer().is_none()) {
                continue;
            }
            // SAFETY: a view whose source has a buffer; ggml points it into the source's data.
            let status = unsafe { sys::ggml_backend_view_init(t.as_ptr()) };
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(Error::BufferAlloc {
                    buffer_type: buffer_type.name(),
                    bytes: t.nbytes(),
                });
            }
        }
        Ok(total)
    }

    /// Gives a host context's tensors a real CPU buffer wrapping the context's own pool, so
    /// that ggml's schedulers see where they live (a tensor with data but no buffer is
    /// invisible to them). Views inherit it from their source. Returns how many tensors got
    /// the buffer.
    pub fn wrap_host_memory(&self, usage: BufferUsage) -> Result<usize> {
        if self.is_metadata_only() {
            return Err(Error::InvalidArgument {
                op: "wrap_host_memory",
                reason: "a metadata-only context has no host pool to wrap".to_owned(),
            });
        }
        // SAFETY: live host context; its pool is ggml-allocated with 64-byte alignment,
        // satisfying the CPU buffer's 32-byte alignment assertion.
        let (base, size) = unsafe {
            (
                sys::ggml_get_mem_buffer(self.raw()),
                sys::ggml_get_mem_size(self.raw()),
            )
        };
        // SAFETY: (base, size) is the live pool; the wrapper owns nothing and is freed with
        // the context (attached below), never after the pool.
        let raw = unsafe { sys::ggml_backend_cpu_buffer_from_ptr(base, size) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::BufferAlloc {
            buffer_type: "CPU (host pool)".into(),
            bytes: size,
        })?;
        // SAFETY: the buffer we just got.
        unsafe { sys::ggml_backend_buffer_set_usage(raw.as_ptr(), usage.raw()) };
        let mut wrapped = 0;
        for tensor in self.tensors() {
            let t = tensor.as_ptr();
            // SAFETY: live tensors of this context. Setting the field directly is what ggml
            // itself does for a tensor that already has data (tensor_alloc asserts data ==
            // NULL); the data pointer lies inside the wrapped pool.
            unsafe {
                if (*t).buffer.is_null() && !(*t).data.is_null() {
                    (*t).buffer = raw.as_ptr();
                    wrapped += 1;
                }
            }
        }
        self.inner().attach_buffer(Buffer { raw });
        Ok(wrapped)
    }
}

/// Shared weights are read by other threads: no write may reach their memory.
fn check_writable(tensor: &Tensor) -> Result<()> {
    if super::shared::holds_frozen_data(tensor) {
        return Err(Error::SharedWeights {
            operand: tensor.describe(),
        });
    }
    Ok(())
}

fn check_transfer<T: Element>(tensor: &Tensor, len: usize) -> Result<()> {
    if !tensor.has_data() {
        return Err(Error::NotAllocated {
            operand: tensor.describe(),
        });
    }
    if tensor.dtype() != T::DTYPE {
        return Err(Error::DataMismatch {
            operand: tensor.describe(),
            reason: format!(
                "host data is {}, the tensor is {}",
                T::DTYPE,
                tensor.dtype()
            ),
        });
    }
    if len as i64 != tensor.nelements() {
        return Err(Error::DataMismatch {
            operand: tensor.describe(),
            reason: format!(
                "host data has {len} values, the tensor {}",
                tensor.nelements()
            ),
        });
    }
    if !tensor.is_contiguous() {
        return Err(Error::NotContiguous {
            op: "tensor data transfer",
            operand: tensor.describe(),
        });
    }
    Ok(())
}

/// Copies host values into a tensor; the caller has established that its memory is live.
pub(crate) fn write_tensor<T: Element>(tensor: &Tensor, data: &[T]) -> Result<()> {
    check_writable(tensor)?;
    check_transfer::<T>(tensor, data.len())?;
    let bytes = std::mem::size_of_val(data);
    // SAFETY: sizes and contiguity checked; `data` is valid for `bytes`.
    unsafe { raw_set(tensor, data.as_ptr().cast(), bytes) };
    Ok(())
}

pub(crate) fn write_tensor_bytes(tensor: &Tensor, bytes: &[u8]) -> Result<()> {
    check_writable(tensor)?;
    if !tensor.has_data() {
        return Err(Error::NotAllocated {
            operand: tensor.describe(),
        });
    }
    if bytes.len() != tensor.nbytes() || !tensor.is_contiguous() {
        return Err(Error::DataMismatch {
            operand: tensor.describe(),
            reason: format!(
                "{} bytes given for {} contiguous bytes",
                bytes.len(),
                tensor.nbytes()
            ),
        });
    }
    // SAFETY: sizes checked; `bytes` valid.
    unsafe { raw_set(tensor, bytes.as_ptr().cast(), bytes.len()) };
    Ok(())
}

pub(crate) fn read_tensor_bytes(tensor: &Tensor) -> Result<Vec<u8>> {
    if !tensor.has_data() {
        return Err(Error::NotAllocated {
            operand: tensor.describe(),
        });
    }
    if !tensor.is_contiguous() {
        return Err(Error::NotContiguous {
            op: "tensor data transfer",
            operand: tensor.describe(),
        });
    }
    let mut out = vec![0u8; tensor.nbytes()];
    // SAFETY: a contiguous tensor with live memory of `nbytes` bytes; `out` is that long.
    unsafe {
        if tensor.buffer().is_some() {
            sys::ggml_backend_tensor_get(tensor.as_ptr(), out.as_mut_ptr().cast(), 0, out.len());
        } else {
            std::ptr::copy_nonoverlapping(
                (*tensor.as_ptr()).data.cast::<u8>(),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }
    Ok(out)
}

pub(crate) fn read_tensor<T: Element>(tensor: &Tensor) -> Result<Vec<T>> {
    check_transfer::<T>(tensor, tensor.nelements() as usize)?;
    let mut out = vec![T::default(); tensor.nelements() as usize];
    let bytes = std::mem::size_of_val(out.as_slice());
    // SAFETY: sizes checked; `out` is valid for `bytes`.
    unsafe {
        if tensor.buffer().is_some() {
            sys::ggml_backend_tensor_get(tensor.as_ptr(), out.as_mut_ptr().cast(), 0, bytes);
        } else {
            std::ptr::copy_nonoverlapping(
                (*tensor.as_ptr()).data.cast::<u8>(),
                out.as_mut_ptr().cast::<u8>(),
                bytes,
            );
        }
    }
    Ok(out)
}

/// # Safety
/// The tensor's memory must be live, contiguous and exactly `bytes` long.
unsafe fn raw_set(tensor: &Tensor, src: *const std::ffi::c_void, bytes: usize) {
    if tensor.buffer().is_some() {
        sys::ggml_backend_tensor_set(tensor.as_ptr(), src, 0, bytes);
    } else {
        // A host-context tensor without a buffer: plain memory in the context's pool.
        std::ptr::copy_nonoverlapping(
            src.cast::<u8>(),
            (*tensor.as_ptr()).data.cast::<u8>(),
            bytes,
        );
    }
}

impl Context {
    /// Copies `sources` (tensors with data: host memory or any backend's buffer) into new
    /// tensors of this metadata-only context, allocated in one `buffer_type` buffer. Returns
    /// the copies in order, named `<name>@<buffer type>`.
    pub fn upload_copies(
        &self,
        sources: &[super::tensor::TensorRef<'_>],
        buffer_type: BufferType,
        usage: BufferUsage,
    ) -> Result<Vec<Tensor>> {
        let mut copies = Vec::with_capacity(sources.len());
        for src in sources {
            if !src.has_data() {
                return Err(Error::NotAllocated {
                    operand: src.describe(),
                });
            }
            if !src.is_contiguous() {
                return Err(Error::NotContiguous {
                    op: "upload_copies",
                    operand: src.describe(),
                });
            }
            let copy = self.new_tensor(src.dtype(), src.shape().dims())?;
            copy.set_name(&format!("{}@{}", src.name(), buffer_type.name()));
            copies.push(copy);
        }
        self.allocate_in(buffer_type, usage)?;
        let mut staging = Vec::new();
        for (src, copy) in sources.iter().zip(&copies) {
            let bytes = src.nbytes();
            // SAFETY: `src` has live memory (data set outside any allocation means a context
            // owns it) of `bytes` contiguous bytes; `copy` was just allocated with the same
            // type and shape, so both transfers are in bounds.
            unsafe {
                let t = src.raw().as_ptr();
                if (*t).buffer.is_null() {
                    sys::ggml_backend_tensor_set(copy.as_ptr(), (*t).data, 0, bytes);
                } else {
                    staging.resize(bytes, 0u8);
                    sys::ggml_backend_tensor_get(t, staging.as_mut_ptr().cast(), 0, bytes);
                    sys::ggml_backend_tensor_set(copy.as_ptr(), staging.as_ptr().cast(), 0, bytes);
                }
            }
        }
        Ok(copies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::DType;

    /// Weights over a buffer type's maximum size go into several buffers, every one owned by
    /// the context (ggml's multi buffer made every tensor "not allocated" to our checks: the
    /// Vulkan backend's 1 GiB limit refused da3-large f32).
    #[test]
    fn tensors_over_the_maximum_size_go_into_several_owned_buffers() {
        let ctx = Context::metadata(8).unwrap();
        let n = 1 << 18; // 1 MiB of f32 each
        let tensors: Vec<Tensor> = (0..4)
            .map(|_| ctx.new_tensor(DType::F32, &[n]).unwrap())
            .collect();
        let view = ctx.view(&tensors[3], &[16], &[], 4 * 100).unwrap();
        let bytes = ctx
            .allocate_chunked(BufferType::cpu(), BufferUsage::Weights, (5 << 20) / 2)
            .unwrap();
        assert!(bytes >= 4 << 20, "{bytes}");
        assert_eq!(ctx.inner().with_buffers(|b| b.len()), 2);
        for (i, t) in tensors.iter().enumerate() {
            let values: Vec<f32> = (0..n).map(|j| (i as i64 * n + j) as f32).collect();
            ctx.write(t, &values).unwrap();
        }
        for (i, t) in tensors.iter().enumerate() {
            let back: Vec<f32> = ctx.read(t).unwrap();
            assert_eq!(back[0], (i as i64 * n) as f32);
            assert_eq!(back[n as usize - 1], (i as i64 * n + n - 1) as f32);
        }
        let seen: Vec<f32> = ctx.read(&view).unwrap();
        assert_eq!(seen[0], (3 * n + 100) as f32);
        // One buffer when everything fits.
        let one = Context::metadata(2).unwrap();
        one.new_tensor(DType::F32, &[n]).unwrap();
        one.allocate_in(BufferType::cpu(), BufferUsage::Weights)
            .unwrap();
        assert_eq!(one.inner().with_buffers(|b| b.len()), 1);
    }

    /// A CPU weights buffer is backed by transparent huge pages once written, where Linux
    /// gives them on `madvise` (Debian's default) or always; where it never does, the advice
    /// changes nothing and the data still reads back.
    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_buffers_get_huge_pages_where_the_system_gives_them() {
        let ctx = Context::metadata(1).unwrap();
        let n = 4 << 20; // 16 MiB of f32: several whole 2 MiB pages
        let t = ctx.new_tensor(DType::F32, &[n]).unwrap();
        ctx.allocate_in(BufferType::cpu(), BufferUsage::Weights)
            .unwrap();
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        ctx.write(&t, &values).unwrap();
        assert_eq!(ctx.read::<f32>(&t).unwrap(), values);
        let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        if !(mode.contains("[madvise]") || mode.contains("[always]")) {
            return;
        }
        // The huge pages of the mapping that holds the buffer's first whole 2 MiB page (the
        // advised range is a mapping of its own), from /proc/self/smaps.
        let first_page = t
            .buffer()
            .expect("allocated")
            .base_address()
            .next_multiple_of(2 << 20);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut huge_kib = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((lo, hi)) = range.split_once('-') {
                    if let (Ok(lo), Ok(hi)) =
                        (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
                    {
                        inside = (lo..hi).contains(&first_page);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kib) = line.strip_prefix("AnonHugePages:") {
                    huge_kib = kib
                        .trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<usize>()
                        .ok();
                }
            }
        }
        let huge_kib = huge_kib.expect("the buffer's mapping in /proc/self/smaps");
        assert!(huge_kib >= 2048, "{huge_kib} KiB of huge pages ({mode})");
    }
}
