//! CUDA kernels of our own, beside ggml's CUDA backend, on the same device memory.
//!
//! A leaf crate: it knows neither ggml nor the model. Callers hand it device pointers, shapes
//! and strides; which node of which graph runs here is the caller's execution plan. Today it
//! holds fused attention through cuDNN's scaled dot-product attention (cuDNN 9, loaded at
//! run time through the cuDNN frontend, so a binary with this crate starts where cuDNN is
//! missing and says so when an [`Attention`] is asked for).

use std::ffi::{c_char, c_int, CStr, CString};
use std::fmt;
use std::ptr::NonNull;

#[repr(C)]
struct RawAttention {
    _private: [u8; 0],
}

extern "C" {
    fn da3_cuda_last_error() -> *const c_char;
    fn da3_cuda_attention_new(
        device: c_int,
        library: *const c_char,
        out: *mut *mut RawAttention,
    ) -> c_int;
    fn da3_cuda_attention_free(state: *mut RawAttention);
    fn da3_cuda_cudnn_version() -> usize;
    fn da3_cuda_attention_run(
        state: *mut RawAttention,
        q: *const f32,
        q_strides: *const i64,
        k: *const f32,
        k_strides: *const i64,
        v: *const f32,
        v_strides: *const i64,
        out: *mut f32,
        d: i64,
        tq: i64,
        tkv: i64,
        h: i64,
        b: i64,
        scale: f32,
    ) -> c_int;
}

/// What went wrong on the CUDA side, as its library said it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaError(pub String);

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CudaError {}

fn last_error() -> CudaError {
    // SAFETY: returns a pointer to this thread's NUL-terminated message, alive until the next
    // failing call on this thread; copied at once.
    let message = unsafe { CStr::from_ptr(da3_cuda_last_error()) };
    CudaError(message.to_string_lossy().into_owned())
}

/// The cuDNN library file searched for when none is named: cuDNN 9's entry library.
pub const DEFAULT_CUDNN_LIBRARY: &str = "libcudnn.so.9";

/// One operand of [`Attention::run`]: a device pointer to f32 values laid out as ggml's
/// `[d, t, h, b]` with rows of `d` contiguous and these strides, in elements, for `t`, `h`
/// and `b`.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    pub data: *const f32,
    pub strides: [i64; 3],
}

/// The sizes of one attention: head size `d`, `tq` queries, `tkv` keys and values, `h` heads,
/// a batch of `b`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub d: i64,
    pub tq: i64,
    pub tkv: i64,
    pub h: i64,
    pub b: i64,
}

/// Fused attention on one device through cuDNN: its handle, a stream of its own, the f16
/// copies of Q, K, V and O, the workspace, and one built cuDNN graph per shape.
pub struct Attention {
    raw: NonNull<RawAttention>,
}

// SAFETY: the state is used by one caller at a time (`run` takes `&mut self`); CUDA handles,
// streams and device memory may be used from any host thread.
unsafe impl Send for Attention {}

impl Attention {
    /// Loads cuDNN (`library`: a file name for the dynamic loader, or a path; default
    /// [`DEFAULT_CUDNN_LIBRARY`]) and makes a handle on CUDA device `device`.
    pub fn new(device: u32, library: Option<&str>) -> Result<Attention, CudaError> {
        let library = CString::new(library.unwrap_or(DEFAULT_CUDNN_LIBRARY))
            .map_err(|_| CudaError("the cuDNN library name holds a NUL byte".into()))?;
        let device = c_int::try_from(device)
            .map_err(|_| CudaError(format!("CUDA device {device} is out of range")))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a NUL-terminated name and a valid out-pointer; on failure nothing is kept.
        let status = unsafe { da3_cuda_attention_new(device, library.as_ptr(), &mut raw) };
        if status != 0 {
            return Err(last_error());
        }
        NonNull::new(raw)
            .map(|raw| Attention { raw })
            .ok_or_else(|| CudaError("no attention state was returned".into()))
    }

    /// The loaded cuDNN's version number (e.g. 92801 for 9.28.1).
    pub fn cudnn_version(&self) -> usize {
        // SAFETY: reads the loaded library's version; cuDNN is loaded (`self` exists).
        unsafe { da3_cuda_cudnn_version() }
    }

    /// `softmax(q kᵀ · scale) v` per head into `out`, ggml's `[d, h, tq, b]` contiguous f32,
    /// computed in f16 with f32 softmax and sums. Returns when `out` is written.
    ///
    /// # Safety
    /// `q` must address `[d, tq, h, b]`, `k` and `v` `[d, tkv, h, b]` f32 values with their
    /// strides, and `out` `d * h * tq * b` writable f32 values, all device memory of this
    /// state's device that no other stream writes while this runs.
    pub unsafe fn run(
        &mut self,
        shape: AttentionShape,
        q: Operand,
        k: Operand,
        v: Operand,
        out: *mut f32,
        scale: f32,
    ) -> Result<(), CudaError> {
        let AttentionShape { d, tq, tkv, h, b } = shape;
        // SAFETY: the caller vouches for the pointers (above); strides are 3 values each.
        let status = unsafe {
            da3_cuda_attention_run(
                self.raw.as_ptr(),
                q.data,
                q.strides.as_ptr(),
                k.data,
                k.strides.as_ptr(),
                v.data,
                v.strides.as_ptr(),
                out,
                d,
                tq,
                tkv,
                h,
                b,
                scale,
            )
        };
        if status == 0 {
            Ok(())
        } else {
            Err(last_error())
        }
    }
}

impl Drop for Attention {
    fn drop(&mut self) {
        // SAFETY: made by da3_cuda_attention_new, freed once.
        unsafe { da3_cuda_attention_free(self.raw.as_ptr()) };
    }
}

impl fmt::Debug for Attention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attention")
            .field("cudnn_version", &self.cudnn_version())
            .finish()
    }
}
