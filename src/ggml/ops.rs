//! Ops. Each one checks the preconditions ggml would `GGML_ASSERT` (and abort on) and returns
//! [`Error`] instead; the result lives in the context the op is called on, and that context
//! keeps the operands' contexts alive.

use super::context::Context;
use super::dtype::DType;
use super::error::{Error, Operand, Result};
use super::tensor::{Tensor, TensorView};
use ggml_sys as sys;

/// How [`Context::interpolate`] samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// Nearest neighbour.
    Nearest,
    /// Bilinear; `align_corners` as in PyTorch.
    Bilinear {
        /// Whether corner pixels of input and output align (PyTorch's `align_corners`).
        align_corners: bool,
    },
    /// Bicubic (a = -0.75); `align_corners` as in PyTorch.
    Bicubic {
        /// Whether corner pixels of input and output align (PyTorch's `align_corners`).
        align_corners: bool,
    },
}

/// Pooling kind for [`Context::pool_2d`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Maximum over the window.
    Max,
    /// Mean over the window.
    Avg,
}

/// Rotary embedding pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs (`x[2i]`, `x[2i+1]`).
    Normal,
    /// Rotate-half pairs (`x[i]`, `x[i + n_dims/2]`), as GPT-NeoX and DINOv2-style RoPE.
    Neox,
}

fn describe(tensors: &[&Tensor]) -> Vec<Operand> {
    tensors.iter().map(|t| t.describe()).collect()
}

pub(super) fn mismatch(op: &'static str, reason: impl Into<String>, tensors: &[&Tensor]) -> Error {
    Error::ShapeMismatch {
        op,
        reason: reason.into(),
        operands: describe(tensors),
    }
}

fn require_contiguous(op: &'static str, t: &Tensor) -> Result<()> {
    if t.is_contiguous() {
        Ok(())
    } else {
        Err(Error::NotContiguous {
            op,
            operand: t.describe(),
        })
    }
}

pub(super) fn require_dtype(op: &'static str, t: &Tensor, allowed: &[DType]) -> Result<()> {
    if allowed.contains(&t.dtype()) {
        return Ok(());
    }
    let expected = allowed
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" or ");
    Err(Error::DType {
        op,
        operand: t.describe(),
        expected,
    })
}

/// `b` can be broadcast into `a` (ggml_can_repeat).
fn can_repeat(b: &Tensor, a: &Tensor) -> bool {
    let (a, b) = (a.ne(), b.ne());
    (0..4).all(|i| b[i] > 0 && a[i] % b[i] == 0)
}

/// ggml's output-size formula for convolutions.
fn conv_out(size: i64, kernel: i64, stride: i32, pad: i32, dilation: i32) -> i64 {
    (size + 2 * pad as i64 - dilation as i64 * (kernel - 1) - 1) / stride as i64 + 1
}

/// The output width and height of a 2D convolution of `kernel [KW, KH, IC, OC]` over
/// `input [W, H, IC, N]`, after the checks ggml asserts (matching channels) or would divide by
/// (a positive stride and dilation), and a non-empty result.
fn conv_2d_output(
    kernel: &Tensor,
    input: &Tensor,
    stride: (i32, i32),
    padding: (i32, i32),
    dilation: (i32, i32),
) -> Result<(i64, i64)> {
    let (kn, inp) = (kernel.ne(), input.ne());
    if kn[2] != inp[2] {
        return Err(mismatch(
            "conv_2d",
            "kernel input channels (ne[2]) differ from the input's (ne[2])",
            &[kernel, input],
        ));
    }
    if stride.0 < 1
        || stride.1 < 1
        || dilation.0 < 1
        || dilation.1 < 1
        || padding.0 < 0
        || padding.1 < 0
    {
        return Err(Error::InvalidArgument {
            op: "conv_2d",
            reason: format!("stride {stride:?}, padding {padding:?}, dilation {dilation:?}"),
        });
    }
    let ow = conv_out(inp[0], kn[0], stride.0, padding.0, dilation.0);
    let oh = conv_out(inp[1], kn[1], stride.1, padding.1, dilation.1);
    if ow < 1 || oh < 1 {
        return Err(mismatch(
            "conv_2d",
            "the input is smaller than the kernel",
            &[kernel, input],
        ));
    }
    Ok((ow, oh))
}

/// A convolution's bias is a vector of the kernel's output channels, its `ne[dim]` (3 for
/// a convolution, 2 for a transposed one).
fn conv_bias_fits(op: &'static str, kernel: &Tensor, dim: usize, bias: &Tensor) -> Result<()> {
    let oc = kernel.ne()[dim];
    if bias.nelements() != oc || bias.ne()[0] != oc {
        return Err(mismatch(
            op,
            format!("the bias must be a vector of the kernel's output channels (ne[{dim}])"),
            &[kernel, bias],
        ));
    }
    Ok(())
}

impl Context {
    /// Wraps a freshly created op result and records the operands' contexts.
    pub(super) fn result(
        &self,
        raw: *mut sys::ggml_tensor,
        op: &str,
        operands: &[&Tensor],
    ) -> Result<Tensor> {
        for operand in operands {
            self.use_operand(operand);
        }
        self.wrap(raw, op)
    }

    /// Room for one more tensor object (ops allocate no data in metadata-only contexts).
    pub(super) fn reserve_result(&self, dtype: DType, ne: [i64; 4]) -> Result<()> {
        let data = if self.is_metadata_only() {
            0
        } else {
            let ne = ne.map(|d| d.max(0) as u64);
            dtype.nbytes(ne).unwrap_or(u64::MAX) as usize
        };
        self.inner()
            .reserve(std::mem::size_of::<sys::ggml_tensor>().saturating_add(data))
    }

    fn reserve_like(&self, t: &Tensor) -> Result<()> {
        self.reserve_result(t.dtype(), t.ne())
    }

    fn reserve_view(&self) -> Result<()> {
        self.inner()
            .reserve(std::mem::size_of::<sys::ggml_tensor>())
    }

    // --- matrix products --------------------------------------------------------------------

    /// `a[K, M] x b[K, N] -> [M, N]` (batched over dims 2 and 3, `a` broadcast over `b`):
    /// each output value is the dot product of a row of `a` and a row of `b`.
    /// `a` is f32, f16, bf16 or quantised; `b` f32, or of `a`'s type for f16 and bf16.
    pub fn mul_mat(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let (an, bn) = (a.ne(), b.ne());
        // The CPU kernel calls the type's dot product, which i32 has none of (a NULL call),
        // and converts `b` from f32 unless it already has the dot product's type.
        if a.dtype() == DType::I32 {
            return Err(Error::DType {
                op: "mul_mat",
                operand: a.describe(),
                expected: "f32, f16, bf16 or a quantised type".into(),
            });
        }
        let b_ok = b.dtype() == DType::F32
            || (matches!(a.dtype(), DType::F16 | DType::BF16) && b.dtype() == a.dtype())
            || (a.dtype() == DType::F32 && b.dtype() == DType::BF16);
        if !b_ok {
            return Err(Error::DType {
                op: "mul_mat",
                operand: b.describe(),
                expected: format!("f32 (or {}) for a {} `a`", a.dtype(), a.dtype()),
            });
        }
        if an[0] != bn[0] {
            return Err(mismatch(
                "mul_mat",
                "ne[0] (the reduced dimension) differs",
                &[a, b],
            ));
        }
        if bn[2] % an[2] != 0 || bn[3] % an[3] != 0 {
            return Err(mismatch(
                "mul_mat",
                "a's batch dims do not divide b's",
                &[a, b],
            ));
        }
        // ggml_mul_mat asserts `a` is not transposed; the CPU kernel also asserts nb[0] is the
        // element size of both operands (rows contiguous), which strided views break.
        for t in [a, b] {
            if t.is_transposed() || t.nb()[0] != t.dtype().type_size() {
                return Err(Error::NotContiguous {
                    op: "mul_mat",
                    operand: t.describe(),
                });
            }
        }
        self.reserve_result(DType::F32, [an[1], bn[1], bn[2], bn[3]])?;
        // SAFETY: preconditions of ggml_mul_mat checked above; live tensors and context.
        let raw = unsafe { sys::ggml_mul_mat(self.raw(), a.as_ptr(), b.as_ptr()) };
        self.result(raw, "mul_mat", &[a, b])
    }

    // --- element-wise -------------------------------------------------------------------------

    fn binary(
        &self,
        op: &'static str,
        a: &Tensor,
        b: &Tensor,
        f: unsafe extern "C" fn(
            *mut sys::ggml_context,
            *mut sys::ggml_tensor,
            *mut sys::ggml_tensor,
        ) -> *mut sys::ggml_tensor,
    ) -> Result<Tensor> {
        if !can_repeat(b, a) {
            return Err(mismatch(
                op,
                "b cannot be broadcast to a (each a.ne[i] must be a multiple of b.ne[i])",
                &[a, b],
            ));
        }
        // The CPU kernels (binary-ops.cpp) assert contiguous rows of `a` and abort on type pairs
        // other than these (the result has a's type); add also takes quantized `a` + f32 `b`
        // of the same shape.
        if a.nb()[0] != a.dtype().type_size() {
            return Err(Error::NotContiguous {
                op,
                operand: a.describe(),
            });
        }
        let (ta, tb) = (a.dtype(), b.dtype());
        let float_a = matches!(ta, DType::F32 | DType::F16 | DType::BF16);
        let quantized_add = op == "add"
            && ta.is_quantized()
            && tb == DType::F32
            && a.ne() == b.ne()
            && b.nb()[0] == tb.type_size();
        if !float_a && !quantized_add {
            return Err(Error::DType {
                op,
                operand: a.describe(),
                expected: "f32, f16 or bf16".into(),
            });
        }
        if float_a && tb != ta && tb != DType::F32 {
            let expected = if ta == DType::F32 {
                "f32".to_owned()
            } else {
                format!("{ta} or f32")
            };
            return Err(Error::DType {
                op,
                operand: b.describe(),
                expected,
            });
        }
        self.reserve_like(a)?;
        // SAFETY: ggml_can_repeat(b, a) holds; live tensors and context.
        let raw = unsafe { f(self.raw(), a.as_ptr(), b.as_ptr()) };
        self.result(raw, op, &[a, b])
    }
    /// `a + b`, `b` broadcast to `a`'s shape.
    pub fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary("add", a, b, sys::ggml_add)
    }
    /// `a - b`, `b` broadcast.
    pub fn sub(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary("sub", a, b, sys::ggml_sub)
    }
    /// `a * b` element-wise, `b` broadcast.
    pub fn mul(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary("mul", a, b, sys::ggml_mul)
    }
    /// `a / b` element-wise, `b` broadcast.
    pub fn div(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        self.binary("div", a, b, sys::ggml_div)
    }
    /// `a * s`, for a contiguous f32 or bf16 `a` (use [`Context::cont`] on a view first).
    pub fn scale(&self, a: &Tensor, s: f32) -> Result<Tensor> {
        self.check_scale("scale", a)?;
        self.reserve_like(a)?;
        // SAFETY: `a` is contiguous, so padded-1d (ggml_scale_impl's assertion), and of a
        // type the CPU kernel takes (its other assertions); live tensors and context.
        let raw = unsafe { sys::ggml_scale(self.raw(), a.as_ptr(), s) };
        self.result(raw, "scale", &[a])
    }

    /// `a * s + b`; the same preconditions as [`Context::scale`].
    pub fn scale_bias(&self, a: &Tensor, s: f32, b: f32) -> Result<Tensor> {
        self.check_scale("scale_bias", a)?;
        self.reserve_like(a)?;
        // SAFETY: as in `scale`.
        let raw = unsafe { sys::ggml_scale_bias(self.raw(), a.as_ptr(), s, b) };
        self.result(raw, "scale_bias", &[a])
    }

    /// ggml_scale_impl asserts `ggml_is_padded_1d(a)` (a permuted view aborts when the op is
    /// built); the CPU kernel (ops.cpp, `ggml_compute_forward_scale`) aborts on types other
    /// than f32 and bf16 and asserts a contiguous `a` for both.
    ///
    /// Contiguous does not imply padded-1d: ggml_is_contiguous skips dims of size 1, whose
    /// stride may then be anything (found by the graph_ops fuzz target).
    fn check_scale(&self, op: &'static str, a: &Tensor) -> Result<()> {
        require_dtype(op, a, &[DType::F32, DType::BF16])?;
        require_contiguous(op, a)?;
        let (ne, nb) = (a.ne(), a.nb());
        let padded_1d = nb[0] == a.dtype().type_size()
            && nb[2] as u64 == nb[1] as u64 * ne[1] as u64
            && nb[3] as u64 == nb[2] as u64 * ne[2] as u64;
        if !padded_1d {
            return Err(Error::NotContiguous {
                op,
                operand: a.describe(),
            });
        }
        Ok(())
    }

    fn unary(
        &self,
        op: &'static str,
        a: &Tensor,
        f: unsafe extern "C" fn(
            *mut sys::ggml_context,
            *mut sys::ggml_tensor,
        ) -> *mut sys::ggml_tensor,
    ) -> Result<Tensor> {
        // The CPU kernels (ops.cpp, unary-ops.cpp) abort on types other than these.
        require_dtype(op, a, &[DType::F32, DType::F16, DType::BF16])?;
        // ggml_unary_impl asserts ggml_is_contiguous_rows (which lets a row of one value have
        // any stride); the CPU kernels assert `nb[0]` is the element size regardless (found by
        // the graph_ops fuzz target).
        if a.nb()[0] != a.dtype().type_size() {
            return Err(Error::NotContiguous {
                op,
                operand: a.describe(),
            });
        }
        self.reserve_like(a)?;
        // SAFETY: rows contiguous (ggml_unary_impl's assertion), a float type the kernels
        // take; live tensors.
        let raw = unsafe { f(self.raw(), a.as_ptr()) };
        self.result(raw, op, &[a])
    }
    /// GELU with the exact erf form.
    pub fn gelu_erf(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("gelu_erf", a, sys::ggml_gelu_erf)
    }
    /// GELU, tanh approximation.
    pub fn gelu(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("gelu", a, sys::ggml_gelu)
    }
    /// SiLU, `x * sigmoid(x)`, element-wise (rows of `a` must be contiguous).
    pub fn silu(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("silu", a, sys::ggml_silu)
    }
    /// SwiGLU of the two halves of each row: `silu(a[..n]) * a[n..]` for rows of `2n` values
    /// -> `[n, ...]`; `a` contiguous. One node (ggml's GLU op), which every GPU backend runs:
    /// CUDA refuses SiLU on a strided view of one half.
    pub fn swiglu(&self, a: &Tensor) -> Result<Tensor> {
        const OP: &str = "swiglu";
        require_dtype(OP, a, &[DType::F32, DType::F16, DType::BF16])?;
        if !a.is_contiguous() {
            return Err(Error::NotContiguous {
                op: OP,
                operand: a.describe(),
            });
        }
        let ne = a.ne();
        if ne[0] % 2 != 0 {
            return Err(mismatch(
                OP,
                "rows of an odd length do not split in two halves",
                &[a],
            ));
        }
        self.reserve_result(a.dtype(), [ne[0] / 2, ne[1], ne[2], ne[3]])?;
        // SAFETY: `a` is contiguous (ggml_glu_impl's assertion, and the CPU kernel's) of a type
        // the kernels take, with an even row length; live tensors.
        let raw = unsafe { sys::ggml_swiglu(self.raw(), a.as_ptr()) };
        self.result(raw, OP, &[a])
    }
    /// ReLU, `max(x, 0)`, element-wise (rows of `a` must be contiguous).
    pub fn relu(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("relu", a, sys::ggml_relu)
    }
    /// `e^x` element-wise (rows of `a` must be contiguous).
    pub fn exp(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("exp", a, sys::ggml_exp)
    }
    /// `tanh(x)` element-wise (rows of `a` must be contiguous).
    pub fn tanh(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("tanh", a, sys::ggml_tanh)
    }
    /// `1 / (1 + e^-x)` element-wise (rows of `a` must be contiguous).
    pub fn sigmoid(&self, a: &Tensor) -> Result<Tensor> {
        self.unary("sigmoid", a, sys::ggml_sigmoid)
    }

    // --- normalisation --------------------------------------------------------------------------

    /// Normalises each row (over `ne[0]`) to zero mean and unit variance.
    pub fn norm(&self, a: &Tensor, eps: f32) -> Result<Tensor> {
        self.row_norm("norm", a, eps, sys::ggml_norm)
    }
    /// Root-mean-square normalisation of each row.
    pub fn rms_norm(&self, a: &Tensor, eps: f32) -> Result<Tensor> {
        self.row_norm("rms_norm", a, eps, sys::ggml_rms_norm)
    }

    fn row_norm(
        &self,
        op: &'static str,
        a: &Tensor,
        eps: f32,
        f: unsafe extern "C" fn(
            *mut sys::ggml_context,
            *mut sys::ggml_tensor,
            f32,
        ) -> *mut sys::ggml_tensor,
    ) -> Result<Tensor> {
        // The CPU kernels take f32 rows that are contiguous; the rows themselves may be strided.
        require_dtype(op, a, &[DType::F32])?;
        if a.nb()[0] != a.dtype().type_size() {
            return Err(Error::NotContiguous {
                op,
                operand: a.describe(),
            });
        }
        self.reserve_like(a)?;
        // SAFETY: f32 input with contiguous rows, as the kernels require; live tensors.
        let raw = unsafe { f(self.raw(), a.as_ptr(), eps) };
        self.result(raw, op, &[a])
    }
    /// LayerNorm over `ne[0]`: `norm(a) * weight + bias`, weight and bias of shape `[ne0]`.
    pub fn layer_norm(
        &self,
        a: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        for p in [weight, bias] {
            if p.ne()[0] != a.ne()[0] || p.nelements() != p.ne()[0] {
                return Err(mismatch(
                    "layer_norm",
                    "weight and bias must be vectors of a's ne[0]",
                    &[a, weight, bias],
                ));
            }
        }
        let n = self.norm(a, eps)?;
        let n = self.mul(&n, weight)?;
        self.add(&n, bias)
    }
    /// `rms_norm(a) * weight + bias` over `ne[0]`, weight and bias of shape `[ne0]`: a
    /// LayerNorm of rows whose mean is zero, in the three nodes ggml's CUDA and Metal backends
    /// fuse into one kernel (f32 operands).
    pub fn rms_norm_affine(
        &self,
        a: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        for p in [weight, bias] {
            if p.ne()[0] != a.ne()[0] || p.nelements() != p.ne()[0] {
                return Err(mismatch(
                    "rms_norm_affine",
                    "weight and bias must be vectors of a's ne[0]",
                    &[a, weight, bias],
                ));
            }
        }
        let n = self.rms_norm(a, eps)?;
        let n = self.mul(&n, weight)?;
        self.add(&n, bias)
    }

    /// Softmax over `ne[0]` of `a * scale + mask` (mask optional, f32 or f16, broadcast).
    pub fn soft_max_ext(
        &self,
        a: &Tensor,
        mask: Option<&Tensor>,
        scale: f32,
        max_bias: f32,
    ) -> Result<Tensor> {
        require_dtype("soft_max_ext", a, &[DType::F32])?;
        require_contiguous("soft_max_ext", a)?;
        if let Some(m) = mask {
            require_dtype("soft_max_ext", m, &[DType::F16, DType::F32])?;
            require_contiguous("soft_max_ext", m)?;
            let (an, mn) = (a.ne(), m.ne());
            if mn[0] != an[0] || mn[1] < an[1] || an[2] % mn[2] != 0 || an[3] % mn[3] != 0 {
                return Err(mismatch("soft_max_ext", "mask does not cover a", &[a, m]));
            }
        } else if max_bias > 0.0 {
            return Err(Error::InvalidArgument {
                op: "soft_max_ext",
                reason: "max_bias > 0 needs a mask".into(),
            });
        }
        self.reserve_like(a)?;
        let mask_ptr = mask.map_or(std::ptr::null_mut(), Tensor::as_ptr);
        // SAFETY: checks above mirror ggml_soft_max_impl's assertions.
        let raw =
            unsafe { sys::ggml_soft_max_ext(self.raw(), a.as_ptr(), mask_ptr, scale, max_bias) };
        let mut operands = vec![a];
        operands.extend(mask);
        self.result(raw, "soft_max_ext", &operands)
    }
    /// Plain softmax over `ne[0]`.
    pub fn soft_max(&self, a: &Tensor) -> Result<Tensor> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// Fused attention: `q [D, Tq, H, B]`, `k [D, Tk, Hk, B]`, `v [Dv, Tk, Hk, B]` (heads of
    /// k/v broadcast over q's), result `[Dv, H, Tq, B]`. Mask (f16) optional.
    pub fn flash_attn_ext(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        scale: f32,
    ) -> Result<Tensor> {
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        // The CPU kernel (ops.cpp, flash_attn_ext_f16_one_chunk) converts q's rows from f32
        // (another type would be read past its row end), and asserts a dot product for k's type
        // and a conversion for v's: i32 has neither.
        require_dtype("flash_attn_ext", q, &[DType::F32])?;
        for t in [k, v] {
            if t.dtype() == DType::I32 {
                return Err(Error::DType {
                    op: "flash_attn_ext",
                    operand: t.describe(),
                    expected: "f32, f16, bf16 or a quantised type".into(),
                });
            }
        }
        // The CPU kernel reads rows in place (q, k and v may be permuted views) but asserts
        // that each row is contiguous.
        for t in [q, k, v] {
            if t.nb()[0] != t.dtype().type_size() {
                return Err(Error::NotContiguous {
                    op: "flash_attn_ext",
                    operand: t.describe(),
                });
            }
        }
        if kn[0] != qn[0] || qn[2] % kn[2] != 0 || qn[3] % kn[3] != 0 {
            return Err(mismatch(
                "flash_attn_ext",
                "k must match q's head size and divide its heads",
                &[q, k],
            ));
        }
        if qn[3] != kn[3] || qn[3] != vn[3] {
            return Err(mismatch(
                "flash_attn_ext",
                "q, k and v batch sizes (ne[3]) differ",
                &[q, k, v],
            ));
        }
        if vn[1] != kn[1] || vn[2] != kn[2] {
            return Err(mismatch(
                "flash_attn_ext",
                "v must have k's length and heads",
                &[k, v],
            ));
        }
        if let Some(m) = mask {
            require_dtype("flash_attn_ext", m, &[DType::F16])?;
            require_contiguous("flash_attn_ext", m)?;
            let mn = m.ne();
            if qn[2] % mn[2] != 0 || qn[3] % mn[3] != 0 || mn[0] != kn[1] || mn[1] < qn[1] {
                return Err(mismatch(
                    "flash_attn_ext",
                    "mask does not cover q x k",
                    &[q, k, m],
                ));
            }
        }
        self.reserve_result(DType::F32, [vn[0], qn[2], qn[1], qn[3]])?;
        let mask_ptr = mask.map_or(std::ptr::null_mut(), Tensor::as_ptr);
        // SAFETY: checks above mirror ggml_flash_attn_ext's assertions.
        let raw = unsafe {
            sys::ggml_flash_attn_ext(
                self.raw(),
                q.as_ptr(),
                k.as_ptr(),
                v.as_ptr(),
                mask_ptr,
                scale,
                0.0,
                0.0,
            )
        };
        let mut operands = vec![q, k, v];
        operands.extend(mask);
        let out = self.result(raw, "flash_attn_ext", &operands)?;
        // SAFETY: `out` is a FLASH_ATTN_EXT node; f32 accumulation matches the reference.
        unsafe { sys::ggml_flash_attn_ext_set_prec(out.as_ptr(), sys::GGML_PREC_F32) };
        Ok(out)
    }

    /// Scaled dot-product attention, `softmax(q kᵀ · scale) v` per head, for `q [D, Tq, H]`,
    /// `k [D, Tk, H]` and `v [Dv, Tk, H]` (rows contiguous; permuted views are fine) ->
    /// `[Dv, H, Tq]`, which reshapes to `[Dv * H, Tq]`, by explicit products (every backend runs
    /// them). On the CPU, [`Context::cpu_attention`] or [`Context::flash_attn_ext`] fuse them.
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
        // Contiguous copies, as every backend's matrix product takes them.
        let (q, k) = (self.cont(q)?, self.cont(k)?);
        let v_t = self.cont(&self.permute(v, [1, 0, 2, 3])?)?; // [Tk, Dv, H]
        let scores = self.mul_mat(&k, &q)?; // [Tk, Tq, H]
        let probs = self.soft_max_ext(&scores, None, scale, 0.0)?;
        let out = self.mul_mat(&v_t, &probs)?; // [Dv, Tq, H]
        self.cont(&self.permute(&out, [0, 2, 1, 3])?)
    }

    /// Like [`Context::attention`] through the fused kernel with K and V rounded to f16
    /// (accumulation in f32): what GPU backends run fastest (CUDA would convert f32 K/V
    /// itself; Metal and Vulkan need f16). Not exact: about 1e-4 relative on DA3 depth.
    pub fn attention_half_kv(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        scale: f32,
    ) -> Result<Tensor> {
        let (k, v) = (self.cast(k, DType::F16)?, self.cast(v, DType::F16)?);
        self.flash_attn_ext(q, &k, &v, None, scale)
    }

    /// A copy converted to `dtype` (f32, f16 or bf16).
    pub fn cast(&self, a: &Tensor, dtype: DType) -> Result<Tensor> {
        for t in [a.dtype(), dtype] {
            if ![DType::F32, DType::F16, DType::BF16].contains(&t) {
                return Err(Error::DType {
                    op: "cast",
                    operand: a.describe(),
                    expected: "f32, f16 or bf16, to f32, f16 or bf16".into(),
                });
            }
        }
        self.reserve_result(dtype, a.ne())?;
        // SAFETY: float-to-float conversion of equal element counts (ggml_cpy's assertion).
        let raw = unsafe { sys::ggml_cast(self.raw(), a.as_ptr(), dtype.id()) };
        self.result(raw, "cast", &[a])
    }

    /// Rotary embedding of the first `n_dims` values of each row of `a [D, H, T, B]` by the
    /// positions `pos` (i32, length T), frequencies `freq_base^(-2i/n_dims)`.
    pub fn rope(
        &self,
        a: &Tensor,
        pos: &Tensor,
        n_dims: usize,
        mode: RopeMode,
        freq_base: f32,
    ) -> Result<Tensor> {
        self.rope_at(a, pos, 0, n_dims, mode, freq_base)
    }

    /// Like [`Context::rope`], rotating the `n_dims` values from `offset` in each row and
    /// copying the others. `a`'s rows must be contiguous; `a` itself may be a strided view.
    pub fn rope_at(
        &self,
        a: &Tensor,
        pos: &Tensor,
        offset: usize,
        n_dims: usize,
        mode: RopeMode,
        freq_base: f32,
    ) -> Result<Tensor> {
        require_dtype("rope", pos, &[DType::I32])?;
        // The CPU kernel (ggml_compute_forward_rope) aborts on other types.
        require_dtype("rope", a, &[DType::F32, DType::F16])?;
        if a.nb()[0] != a.dtype().type_size() {
            return Err(Error::NotContiguous {
                op: "rope",
                operand: a.describe(),
            });
        }
        if pos.nelements() != pos.ne()[0] || pos.ne()[0] != a.ne()[2] {
            return Err(mismatch(
                "rope",
                "positions must be a vector of a.ne[2] values",
                &[a, pos],
            ));
        }
        if n_dims == 0
            || !n_dims.is_multiple_of(2)
            || !offset.is_multiple_of(2)
            || (offset + n_dims) as i64 > a.ne()[0]
        {
            return Err(Error::InvalidArgument {
                op: "rope",
                reason: format!("offset {offset} and n_dims {n_dims} must be even and end at most at ne[0] = {}", a.ne()[0]),
            });
        }
        self.reserve_like(a)?;
        let mode = match mode {
            RopeMode::Normal => 0,
            RopeMode::Neox => sys::GGML_ROPE_TYPE_NEOX as i32,
        };
        // SAFETY: checks above mirror ggml_rope_impl's assertions (mode bit 0 clear, I32
        // vector positions of length ne[2]); no frequency-factor tensor.
        let raw = unsafe {
            sys::ggml_rope_ext(
                self.raw(),
                a.as_ptr(),
                pos.as_ptr(),
                std::ptr::null_mut(),
                n_dims as i32,
                mode,
                0,
                freq_base,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        };
        let out = self.result(raw, "rope", &[a, pos])?;
        // SAFETY: a ROPE node of mode Normal or Neox, never Vision (ggml_rope_set_offset's
        // assertions); the kernels assert the offset is even and ends in the row, checked above.
        unsafe { sys::ggml_rope_set_offset(out.as_ptr(), offset as i32) };
        Ok(out)
    }

    /// Two-axis rotary embedding in one node (ggml's vision mode): each row of
    /// `a [D, H, T, B]` rotates the pairs (`x[i]`, `x[i + D/2]`), the first `sections[0]`
    /// pairs by the positions `pos[..T]` and the next `sections[1]` by `pos[T..2T]`, with
    /// frequencies `freq_base^(-4j/D)` counted from `j = 0` again in the second section. `pos`
    /// is i32 of length 4T, ggml's layout for up to four axes (the last 2T are not read).
    /// `a`'s rows must be contiguous; `a` itself may be a strided view.
    pub fn rope_vision(
        &self,
        a: &Tensor,
        pos: &Tensor,
        sections: [usize; 2],
        freq_base: f32,
    ) -> Result<Tensor> {
        require_dtype("rope_vision", pos, &[DType::I32])?;
        // The CPU kernel (ggml_compute_forward_rope) aborts on other types.
        require_dtype("rope_vision", a, &[DType::F32, DType::F16])?;
        if a.nb()[0] != a.dtype().type_size() {
            return Err(Error::NotContiguous {
                op: "rope_vision",
                operand: a.describe(),
            });
        }
        if pos.nelements() != pos.ne()[0] || pos.ne()[0] != 4 * a.ne()[2] {
            return Err(mismatch(
                "rope_vision",
                "positions must be a vector of 4 x a.ne[2] values",
                &[a, pos],
            ));
        }
        let half = a.ne()[0] as usize / 2;
        if a.ne()[0] % 2 != 0 || sections[0] + sections[1] != half || half == 0 {
            return Err(Error::InvalidArgument {
                op: "rope_vision",
                reason: format!(
                    "sections {sections:?} must add up to half of ne[0] = {}",
                    a.ne()[0]
                ),
            });
        }
        self.reserve_like(a)?;
        let mut ggml_sections = [sections[0] as i32, sections[1] as i32, 0, 0];
        // SAFETY: checks above mirror ggml_rope_impl's assertions (vector I32 positions of
        // exactly 4 x ne[2] values for a multi-axis mode, no frequency-factor tensor) and the
        // kernels' for vision mode (n_dims = ne[0] / 2, no offset, sections adding up to at
        // most ne[0]); ggml copies the four sections into the node's parameters.
        let raw = unsafe {
            sys::ggml_rope_multi(
                self.raw(),
                a.as_ptr(),
                pos.as_ptr(),
                std::ptr::null_mut(),
                half as i32,
                ggml_sections.as_mut_ptr(),
                sys::GGML_ROPE_TYPE_VISION as i32,
                0,
                freq_base,
                1.0,
                0.0,
                1.0,
                0.0,
                0.0,
            )
        };
        self.result(raw, "rope_vision", &[a, pos])
    }

    // --- shape ----------------------------------------------------------------------------------

    /// Same data, new shape (`ne` innermost first). Needs a contiguous tensor.
    pub fn reshape(&self, a: &Tensor, ne: &[i64]) -> Result<Tensor> {
        require_contiguous("reshape", a)?;
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&d| d < 1) {
            return Err(Error::InvalidShape {
                op: "reshape",
                ne: ne.to_vec(),
                reason: "1 to 4 positive dims".into(),
            });
        }
        if ne.iter().product::<i64>() != a.nelements() {
            return Err(Error::InvalidShape {
                op: "reshape",
                ne: ne.to_vec(),
                reason: format!(
                    "{} elements cannot hold {}'s {}",
                    ne.iter().product::<i64>(),
                    a.name(),
                    a.nelements()
                ),
            });
        }
        if ne[0] % a.dtype().block_size() as i64 != 0 {
            return Err(Error::InvalidShape {
                op: "reshape",
                ne: ne.to_vec(),
                reason: "ne[0] not a multiple of the block size".into(),
            });
        }
        self.reserve_view()?;
        let mut n = [1i64; 4];
        n[..ne.len()].copy_from_slice(ne);
        // SAFETY: contiguous source with equal element count (ggml_reshape's assertions).
        let raw = unsafe {
            match ne.len() {
                1 => sys::ggml_reshape_1d(self.raw(), a.as_ptr(), n[0]),
                2 => sys::ggml_reshape_2d(self.raw(), a.as_ptr(), n[0], n[1]),
                3 => sys::ggml_reshape_3d(self.raw(), a.as_ptr(), n[0], n[1], n[2]),
                _ => sys::ggml_reshape_4d(self.raw(), a.as_ptr(), n[0], n[1], n[2], n[3]),
            }
        };
        self.result(raw, "reshape", &[a])
    }

    /// A strided view into `a`: shape `ne`, byte strides `nb[1..]` for dims 1.. (`nb[0]` is the
    /// element size), starting `offset` bytes into `a`. Must lie inside `a`.
    pub fn view(&self, a: &Tensor, ne: &[i64], nb: &[usize], offset: usize) -> Result<Tensor> {
        let op = "view";
        if ne.is_empty() || ne.len() > 4 || ne.iter().any(|&d| d < 1) || nb.len() + 1 != ne.len() {
            return Err(Error::InvalidShape {
                op,
                ne: ne.to_vec(),
                reason: "1 to 4 positive dims and one stride per dim after the first".into(),
            });
        }
        let dtype = a.dtype();
        if ne[0] % dtype.block_size() as i64 != 0 {
            return Err(Error::InvalidShape {
                op,
                ne: ne.to_vec(),
                reason: "ne[0] not a multiple of the block size".into(),
            });
        }
        let row = dtype.row_size(ne[0] as u64).unwrap_or(u64::MAX) as usize;
        // The bytes the view touches, and ggml's own (contiguous-size) bound.
        let mut extent = row;
        for (d, stride) in ne[1..].iter().zip(nb) {
            extent = extent.saturating_add((*d as usize - 1).saturating_mul(*stride));
        }
        let contiguous = ne[1..]
            .iter()
            .fold(row, |acc, &d| acc.saturating_mul(d as usize));
        // SAFETY: live tensor; plain field reads.
        let (root_bytes, base_offset) = unsafe {
            let t = &*a.as_ptr();
            let root = if t.view_src.is_null() {
                a.as_ptr()
            } else {
                t.view_src
            };
            (sys::ggml_nbytes(root), t.view_offs)
        };
        let fits_a = offset
            .checked_add(extent)
            .is_some_and(|end| end <= a.nbytes());
        let fits_root = base_offset
            .saturating_add(offset)
            .saturating_add(contiguous)
            <= root_bytes;
        if !fits_a || !fits_root {
            return Err(Error::ViewOutOfBounds {
                op,
                operand: a.describe(),
                offset,
                bytes: extent.max(contiguous),
                available: a.nbytes(),
            });
        }
        self.reserve_view()?;
        let mut n = [1i64; 4];
        n[..ne.len()].copy_from_slice(ne);
        let mut s = [row; 3];
        s[..nb.len()].copy_from_slice(nb);
        // SAFETY: the view lies inside `a` and inside its root (ggml's assertion), checked above.
        let raw = unsafe {
            match ne.len() {
                1 => sys::ggml_view_1d(self.raw(), a.as_ptr(), n[0], offset),
                2 => sys::ggml_view_2d(self.raw(), a.as_ptr(), n[0], n[1], s[0], offset),
                3 => {
                    sys::ggml_view_3d(self.raw(), a.as_ptr(), n[0], n[1], n[2], s[0], s[1], offset)
                }
                _ => sys::ggml_view_4d(
                    self.raw(),
                    a.as_ptr(),
                    n[0],
                    n[1],
                    n[2],
                    n[3],
                    s[0],
                    s[1],
                    s[2],
                    offset,
                ),
            }
        };
        self.result(raw, op, &[a])
    }

    /// Reorders axes: source axis `i` becomes axis `axes[i]` (ggml's convention).
    pub fn permute(&self, a: &Tensor, axes: [usize; 4]) -> Result<Tensor> {
        let mut seen = [false; 4];
        for &ax in &axes {
            if ax >= 4 || std::mem::replace(&mut seen[ax], true) {
                return Err(Error::InvalidArgument {
                    op: "permute",
                    reason: format!("axes {axes:?} are not a permutation of 0..4"),
                });
            }
        }
        self.reserve_view()?;
        // SAFETY: distinct axes in 0..4 (ggml_permute's assertions).
        let raw = unsafe {
            sys::ggml_permute(
                self.raw(),
                a.as_ptr(),
                axes[0] as i32,
                axes[1] as i32,
                axes[2] as i32,
                axes[3] as i32,
            )
        };
        self.result(raw, "permute", &[a])
    }
    /// Swaps dims 0 and 1 (a view).
    pub fn transpose(&self, a: &Tensor) -> Result<Tensor> {
        self.reserve_view()?;
        // SAFETY: ggml_transpose asserts nothing (it swaps ne/nb of a view); live tensors.
        let raw = unsafe { sys::ggml_transpose(self.raw(), a.as_ptr()) };
        self.result(raw, "transpose", &[a])
    }
    /// A contiguous copy.
    pub fn cont(&self, a: &Tensor) -> Result<Tensor> {
        self.reserve_like(a)?;
        // SAFETY: ggml_cont asserts nothing; the CPU kernel copies any type to itself
        // (ggml_compute_forward_dup_bytes); live tensors.
        let raw = unsafe { sys::ggml_cont(self.raw(), a.as_ptr()) };
        self.result(raw, "cont", &[a])
    }
    /// Joins along `dim`; other dims and the types must match.
    pub fn concat(&self, a: &Tensor, b: &Tensor, dim: usize) -> Result<Tensor> {
        if dim >= 4 {
            return Err(Error::InvalidArgument {
                op: "concat",
                reason: format!("dim {dim} outside 0..4"),
            });
        }
        if a.dtype() != b.dtype() {
            return Err(Error::DType {
                op: "concat",
                operand: b.describe(),
                expected: a.dtype().to_string(),
            });
        }
        let (an, bn) = (a.ne(), b.ne());
        if (0..4).any(|d| d != dim && an[d] != bn[d]) {
            return Err(mismatch(
                "concat",
                format!("dims other than {dim} differ"),
                &[a, b],
            ));
        }
        let mut ne = an;
        ne[dim] += bn[dim];
        self.reserve_result(a.dtype(), ne)?;
        // SAFETY: same type, other dims equal, dim in range (ggml_concat's assertions).
        let raw = unsafe { sys::ggml_concat(self.raw(), a.as_ptr(), b.as_ptr(), dim as i32) };
        self.result(raw, "concat", &[a, b])
    }
    /// Rows of `a` picked by i32 indices `rows` (`[n]` or `[n, a.ne2, a.ne3]`).
    ///
    /// Not checked (the data decides, after the graph is built): ggml's CPU kernel asserts
    /// that every index is in `0..a.ne[1]` and aborts the process otherwise. Write only
    /// indices in range.
    pub fn get_rows(&self, a: &Tensor, rows: &Tensor) -> Result<Tensor> {
        require_dtype("get_rows", rows, &[DType::I32])?;
        let (an, rn) = (a.ne(), rows.ne());
        if an[2] != rn[1] || an[3] != rn[2] || rn[3] != 1 {
            return Err(mismatch(
                "get_rows",
                "index batch dims must match a's dims 2 and 3",
                &[a, rows],
            ));
        }
        let out = if a.dtype() == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        self.reserve_result(out, [an[0], rn[0], rn[1], rn[2]])?;
        // SAFETY: checks above mirror ggml_get_rows's assertions.
        let raw = unsafe { sys::ggml_get_rows(self.raw(), a.as_ptr(), rows.as_ptr()) };
        self.result(raw, "get_rows", &[a, rows])
    }
    /// Zero padding after the end of each dim.
    pub fn pad(&self, a: &Tensor, pad: [i32; 4]) -> Result<Tensor> {
        require_dtype("pad", a, &[DType::F32])?;
        if pad.iter().any(|&p| p < 0) {
            return Err(Error::InvalidArgument {
                op: "pad",
                reason: format!("negative padding {pad:?}"),
            });
        }
        let ne = a.ne();
        self.reserve_result(a.dtype(), [0, 1, 2, 3].map(|i| ne[i] + pad[i] as i64))?;
        // SAFETY: non-negative padding.
        let raw = unsafe { sys::ggml_pad(self.raw(), a.as_ptr(), pad[0], pad[1], pad[2], pad[3]) };
        self.result(raw, "pad", &[a])
    }

    /// Item `b` of the batch (ne[3]) of `a`: a view of shape [ne0, ne1, ne2, 1].
    fn batch_item(&self, a: &Tensor, b: i64) -> Result<Tensor> {
        let [n0, n1, n2, _] = a.ne();
        let nb = a.nb();
        self.view(
            a,
            &[n0, n1, n2, 1],
            &[nb[1], nb[2], nb[3]],
            b as usize * nb[3],
        )
    }

    /// `f(b)` for every item of a batch of `n`, joined along dim 3: for the transposed
    /// convolution, whose CPU path takes one image at a time (a chain of concatenations,
    /// fine at the low resolutions it runs at; the kernels of `cpu_ops` take batches).
    fn per_batch(&self, n: i64, f: impl Fn(i64) -> Result<Tensor>) -> Result<Tensor> {
        let mut out = f(0)?;
        for b in 1..n {
            out = self.concat(&out, &f(b)?, 3)?;
        }
        Ok(out)
    }

    // --- images ---------------------------------------------------------------------------------

    /// 2D convolution in f32: `kernel [KW, KH, IC, OC]` over `input [W, H, IC, N]` ->
    /// `[OW, OH, OC, N]` (PyTorch weights (OC, IC, KH, KW) load as exactly this), by
    /// im2col and a matrix product. (On the CPU, [`Context::cpu_conv_2d_same`] computes stride-1
    /// "same" convolutions without the column matrix.)
    #[allow(clippy::too_many_arguments)]
    pub fn conv_2d(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        let columns = self.im2col(kernel, input, stride, padding, dilation, DType::F32)?;
        let (kn, cn) = (kernel.ne(), columns.ne());
        let columns_2d = self.reshape(&columns, &[cn[0], cn[1] * cn[2] * cn[3]])?;
        let kernel_2d = if kernel.is_contiguous() {
            self.reshape(kernel, &[kn[0] * kn[1] * kn[2], kn[3]])?
        } else {
            let k = self.cont(kernel)?;
            self.reshape(&k, &[kn[0] * kn[1] * kn[2], kn[3]])?
        };
        let product = self.mul_mat(&columns_2d, &kernel_2d)?; // [OW*OH*N, OC]
        if cn[3] == 1 {
            // One image: [OW*OH, OC] already is [OW, OH, OC, 1], no copy needed.
            return self.reshape(&product, &[cn[1], cn[2], kn[3], 1]);
        }
        let product = self.reshape(&product, &[cn[1], cn[2], cn[3], kn[3]])?; // [OW, OH, N, OC]
        let product = self.permute(&product, [0, 1, 3, 2])?;
        self.cont(&product)
    }

    /// [`Context::conv_2d`] plus a per-channel `bias [OC]`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv_2d_bias(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        let oc = kernel.ne()[3];
        conv_bias_fits("conv_2d", kernel, 3, bias)?;
        let y = self.conv_2d(kernel, input, stride, padding, dilation)?;
        self.add(&y, &self.reshape(bias, &[1, 1, oc])?)
    }

    /// [`Context::conv_2d`] (with `bias`, [`Context::conv_2d_bias`]) of `relu(input)`: a ReLU node,
    /// then the convolution. ([`Context::cpu_conv_2d_same`] applies the ReLU as it reads.)
    #[allow(clippy::too_many_arguments)]
    pub fn conv_2d_of_relu(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: Option<&Tensor>,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        // Checked before the ReLU node, so that an error names the caller's input.
        conv_2d_output(kernel, input, stride, padding, dilation)?;
        if let Some(b) = bias {
            conv_bias_fits("conv_2d", kernel, 3, b)?;
        }
        let x = self.relu(input)?;
        match bias {
            Some(b) => self.conv_2d_bias(kernel, &x, b, stride, padding, dilation),
            None => self.conv_2d(kernel, &x, stride, padding, dilation),
        }
    }

    /// 2D convolution by ggml's direct op (`GGML_OP_CONV_2D`, no column matrix in memory):
    /// `kernel [KW, KH, IC, OC]` (f32 or f16) over `input [W, H, IC, N]` (f32) ->
    /// `[OW, OH, OC, N]` in f32. With an f16 kernel, CUDA computes it as an implicit GEMM on
    /// tensor cores (the input rounded to f16, sums in f32) and the CPU rounds the input's
    /// patches to f16 the same way; with f32, a plain loop per output on CUDA: use
    /// [`Context::conv_2d`] for f32 kernels.
    pub fn conv_2d_direct(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        let (ow, oh) = conv_2d_output(kernel, input, stride, padding, dilation)?;
        require_dtype("conv_2d_direct", kernel, &[DType::F32, DType::F16])?;
        require_dtype("conv_2d_direct", input, &[DType::F32])?;
        // The CPU kernel asserts a contiguous kernel and reads the input through its base
        // pointer and ne; CUDA asserts both contiguous.
        for t in [kernel, input] {
            if !t.is_contiguous() {
                return Err(Error::NotContiguous {
                    op: "conv_2d_direct",
                    operand: t.describe(),
                });
            }
        }
        self.reserve_result(DType::F32, [ow, oh, kernel.ne()[3], input.ne()[3]])?;
        // SAFETY: matching channels, positive output size, contiguous f32 input and an f32 or
        // f16 contiguous kernel (ggml_conv_2d_direct's assertion and its kernels').
        let raw = unsafe {
            sys::ggml_conv_2d_direct(
                self.raw(),
                kernel.as_ptr(),
                input.as_ptr(),
                stride.0,
                stride.1,
                padding.0,
                padding.1,
                dilation.0,
                dilation.1,
            )
        };
        self.result(raw, "conv_2d_direct", &[kernel, input])
    }

    /// Unfolds image patches into columns: `[IC*KH*KW, OW, OH, N]`.
    pub fn im2col(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
        dtype: DType,
    ) -> Result<Tensor> {
        let (kn, inp) = (kernel.ne(), input.ne());
        let (ow, oh) = conv_2d_output(kernel, input, stride, padding, dilation)?;
        require_dtype("im2col", kernel, &[DType::F32, DType::F16, DType::BF16])?;
        // The CPU kernels (ops.cpp, ggml_compute_forward_im2col_f32/_f16) write f32 columns
        // from an f32 input, f16 columns from f16 or f32, and read the input's rows in place.
        if ![DType::F32, DType::F16].contains(&dtype) {
            return Err(Error::InvalidArgument {
                op: "im2col",
                reason: format!("columns of type {dtype}; the CPU kernel writes f32 or f16"),
            });
        }
        let inputs: &[DType] = if dtype == DType::F32 {
            &[DType::F32]
        } else {
            &[DType::F32, DType::F16]
        };
        require_dtype("im2col", input, inputs)?;
        if input.nb()[0] != input.dtype().type_size() {
            return Err(Error::NotContiguous {
                op: "im2col",
                operand: input.describe(),
            });
        }
        self.reserve_result(dtype, [kn[0] * kn[1] * kn[2], ow, oh, inp[3]])?;
        // SAFETY: channel match and positive output size (ggml_im2col's assertions).
        let raw = unsafe {
            sys::ggml_im2col(
                self.raw(),
                kernel.as_ptr(),
                input.as_ptr(),
                stride.0,
                stride.1,
                padding.0,
                padding.1,
                dilation.0,
                dilation.1,
                true,
                dtype.id(),
            )
        };
        self.result(raw, "im2col", &[kernel, input])
    }

    /// [`Context::conv_transpose_2d`] plus a per-channel `bias [OC]`: the
    /// transposed convolution, then the bias. ([`Context::cpu_conv_transpose_2d_bias`] writes
    /// each patch with its bias, for a kernel that is its stride.)
    pub fn conv_transpose_2d_bias(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: &Tensor,
        stride: i32,
    ) -> Result<Tensor> {
        conv_bias_fits("conv_transpose_2d", kernel, 2, bias)?;
        let oc = kernel.ne()[2];
        let y = self.conv_transpose_2d(kernel, input, stride)?;
        self.add(&y, &self.reshape(bias, &[1, 1, oc])?)
    }

    /// Transposed convolution, no padding: `kernel [KW, KH, OC, IC]` (PyTorch ConvTranspose
    /// weights (IC, OC, KH, KW)) over `input [W, H, IC, N]` -> `[(W-1)*s+KW, (H-1)*s+KH, OC, N]`.
    pub fn conv_transpose_2d(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        stride: i32,
    ) -> Result<Tensor> {
        let (kn, inp) = (kernel.ne(), input.ne());
        // The CPU kernel reads an f32 input and the kernel's rows in place, and asserts both
        // rows are contiguous (the input's found by the graph_ops fuzz target).
        require_dtype("conv_transpose_2d", input, &[DType::F32])?;
        for t in [kernel, input] {
            if t.nb()[0] != t.dtype().type_size() {
                return Err(Error::NotContiguous {
                    op: "conv_transpose_2d",
                    operand: t.describe(),
                });
            }
        }
        if kn[3] != inp[2] {
            return Err(mismatch(
                "conv_transpose_2d",
                "kernel ne[3] (input channels) differs from the input's ne[2]",
                &[kernel, input],
            ));
        }
        if stride < 1 {
            return Err(Error::InvalidArgument {
                op: "conv_transpose_2d",
                reason: format!("stride {stride}"),
            });
        }
        require_dtype("conv_transpose_2d", kernel, &[DType::F32, DType::F16])?;
        let s = stride as i64;
        if kn[0] == s && kn[1] == s && kernel.dtype() == DType::F32 {
            if inp[3] == 1 {
                return self.conv_transpose_2d_disjoint(kernel, input);
            }
            if input.is_contiguous() {
                return self.per_batch(inp[3], |b| {
                    self.conv_transpose_2d_disjoint(kernel, &self.batch_item(input, b)?)
                });
            }
        }
        let out = |i: i64, k: i64| (i - 1) * stride as i64 + k;
        self.reserve_result(
            DType::F32,
            [out(inp[0], kn[0]), out(inp[1], kn[1]), kn[2], inp[3]],
        )?;
        // SAFETY: channel match (ggml_conv_transpose_2d_p0's assertion).
        let raw = unsafe {
            sys::ggml_conv_transpose_2d_p0(self.raw(), kernel.as_ptr(), input.as_ptr(), stride)
        };
        self.result(raw, "conv_transpose_2d", &[kernel, input])
    }

    /// [`Context::conv_transpose_2d`] where the kernel is as large as the stride (upsampling
    /// layers): each input pixel writes its own s x s block of the output, so the op is one
    /// matrix product, `[IC, pixels]` by `[IC, (kx, ky, oc)]`, and two copies that interleave
    /// the taps with the pixels. ggml's own kernels visit every tap of every input channel for
    /// each output value and skip the 1 - 1/s² that do not land: on an H200 the two upsampling
    /// layers of DA3-large took 22 ms of a 48 ms forward that way.
    fn conv_transpose_2d_disjoint(&self, kernel: &Tensor, input: &Tensor) -> Result<Tensor> {
        let ([s, _, oc, ic], [w, h, _, _]) = (kernel.ne(), input.ne());
        let kernel = if kernel.is_contiguous() {
            kernel.clone()
        } else {
            self.cont(kernel)?
        };
        let pixels = self.cont(&self.transpose(&self.reshape(input, &[w * h, ic])?)?)?; // [IC, P]
        let taps = self.cont(&self.transpose(&self.reshape(&kernel, &[s * s * oc, ic])?)?)?; // [IC, Q]
        let product = self.mul_mat(&pixels, &taps)?; // [P, Q]: per (kx, ky, oc) a [W, H] plane
        let product = self.reshape(&product, &[w, h, s, s * oc])?;
        // [W, H, KW, KH*OC] -> [KW, W, H, KH*OC] = [OW, H, KH, OC] -> [OW, KH, H, OC] = [OW, OH, OC].
        let columns = self.cont(&self.permute(&product, [1, 2, 0, 3])?)?;
        let columns = self.reshape(&columns, &[s * w, h, s, oc])?;
        let rows = self.cont(&self.permute(&columns, [0, 2, 1, 3])?)?;
        self.reshape(&rows, &[s * w, s * h, oc, 1])
    }

    /// 2D pooling over dims 0 and 1.
    pub fn pool_2d(
        &self,
        a: &Tensor,
        pool: Pool,
        kernel: (i32, i32),
        stride: (i32, i32),
        padding: (f32, f32),
    ) -> Result<Tensor> {
        // The CPU kernel reads f32, and any other type as f16 (bf16 or i32 would be misread).
        require_dtype("pool_2d", a, &[DType::F32, DType::F16])?;
        if kernel.0 < 1 || kernel.1 < 1 || stride.0 < 1 || stride.1 < 1 {
            return Err(Error::InvalidArgument {
                op: "pool_2d",
                reason: format!("kernel {kernel:?}, stride {stride:?}"),
            });
        }
        // ggml stores the padding as int (a float out of int's range is undefined there).
        let padding_ok = |p: f32, k: i32| p.is_finite() && p >= 0.0 && p <= k as f32;
        if !padding_ok(padding.0, kernel.0) || !padding_ok(padding.1, kernel.1) {
            return Err(Error::InvalidArgument {
                op: "pool_2d",
                reason: format!("padding {padding:?}: 0 to the kernel size {kernel:?}"),
            });
        }
        // The CPU kernel reads rows as packed elements and walks the input plane by plane,
        // `nb[2]` apart, until `ggml_nbytes` of it, writing one output plane each time: a view
        // whose plane stride is 0 (size-1 dims keep any stride and still count as contiguous)
        // never ends, and one whose planes are closer than that writes more planes than the
        // output has (found by fuzzing: a heap overflow under ASan).
        let ne = a.ne();
        let nb = a.nb();
        let planes = (ne[2] * ne[3]) as usize;
        if !a.is_contiguous() || nb[2] == 0 || a.nbytes().div_ceil(nb[2]) != planes {
            return Err(mismatch(
                "pool_2d",
                "the input must be contiguous, its planes nb[2] apart (make it so with `cont`)",
                &[a],
            ));
        }
        // ggml's formula: the `+ 1` is in float and the sum truncated (0.5 -> 0, not 1).
        let out = |i: i64, k: i32, s: i32, p: f32| {
            ((i as f32 + 2.0 * p - k as f32) / s as f32 + 1.0) as i64
        };
        let (ow, oh) = (
            out(ne[0], kernel.0, stride.0, padding.0),
            out(ne[1], kernel.1, stride.1, padding.1),
        );
        if ow < 1 || oh < 1 {
            return Err(mismatch(
                "pool_2d",
                "the input is smaller than the kernel",
                &[a],
            ));
        }
        self.reserve_result(DType::F32, [ow, oh, ne[2], ne[3]])?;
        let op = match pool {
            Pool::Max => sys::GGML_OP_POOL_MAX,
            Pool::Avg => sys::GGML_OP_POOL_AVG,
        };
        // SAFETY: positive output size (ggml_pool_2d's assertions).
        let raw = unsafe {
            sys::ggml_pool_2d(
                self.raw(),
                a.as_ptr(),
                op,
                kernel.0,
                kernel.1,
                stride.0,
                stride.1,
                padding.0,
                padding.1,
            )
        };
        self.result(raw, "pool_2d", &[a])
    }

    /// `a` [W, H, C, N] plus a separable offset: `along_x` [W, 1, C, 1] added along each row
    /// and `along_y` [1, H, C, 1] along each column, the same for every item of the batch.
    /// Two broadcast adds ([`Context::cpu_bilinear_align_corners`] makes them one pass).
    pub fn add_separable(&self, a: &Tensor, along_x: &Tensor, along_y: &Tensor) -> Result<Tensor> {
        self.interpolate_add_separable(
            a,
            a.ne(),
            Interpolation::Bilinear {
                align_corners: true,
            },
            along_x,
            along_y,
        )
    }

    /// [`interpolate`](Self::interpolate) to `ne`, then [`add_separable`](Self::add_separable)
    /// of `along_x` [ne0, 1, ne2, 1] and `along_y` [1, ne1, ne2, 1]. A target of `a`'s own size
    /// adds without resampling.
    pub fn interpolate_add_separable(
        &self,
        a: &Tensor,
        ne: [i64; 4],
        mode: Interpolation,
        along_x: &Tensor,
        along_y: &Tensor,
    ) -> Result<Tensor> {
        let op = "interpolate_add_separable";
        require_dtype(op, a, &[DType::F32])?;
        for (factor, want) in [
            (along_x, [ne[0], 1, ne[2], 1]),
            (along_y, [1, ne[1], ne[2], 1]),
        ] {
            require_dtype(op, factor, &[DType::F32])?;
            if factor.ne() != want {
                let reason = format!("an offset factor should be {want:?} for a result of {ne:?}");
                return Err(mismatch(op, reason, &[a, factor]));
            }
        }
        let same_size = ne == a.ne();
        let resampled = if same_size {
            a.clone()
        } else {
            self.interpolate(a, ne, mode)?
        };
        self.add(&self.add(&resampled, along_x)?, along_y)
    }

    /// Resamples an f32 tensor to `ne`.
    pub fn interpolate(&self, a: &Tensor, ne: [i64; 4], mode: Interpolation) -> Result<Tensor> {
        require_dtype("interpolate", a, &[DType::F32])?;
        if ne.iter().any(|&d| d < 1) {
            return Err(Error::InvalidShape {
                op: "interpolate",
                ne: ne.to_vec(),
                reason: "every dim must be positive".into(),
            });
        }
        let flag = sys::GGML_SCALE_FLAG_ALIGN_CORNERS;
        let mode = match mode {
            Interpolation::Nearest => sys::GGML_SCALE_MODE_NEAREST,
            Interpolation::Bilinear { align_corners } => {
                sys::GGML_SCALE_MODE_BILINEAR | if align_corners { flag } else { 0 }
            }
            Interpolation::Bicubic { align_corners } => {
                sys::GGML_SCALE_MODE_BICUBIC | if align_corners { flag } else { 0 }
            }
        };
        self.reserve_result(DType::F32, ne)?;
        // SAFETY: f32 input and a valid mode without antialias (ggml_interpolate's assertions).
        let raw = unsafe {
            sys::ggml_interpolate(self.raw(), a.as_ptr(), ne[0], ne[1], ne[2], ne[3], mode)
        };
        self.result(raw, "interpolate", &[a])
    }
}
