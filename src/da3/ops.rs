//! The ops the model's layers build, resolved through the execution plan: where the plan runs
//! our CPU kernels ([`ExecutionPlan::cpu_kernels`]) and an op's operands are ones the kernel
//! takes, the kernel's node (`Context::cpu_*`); otherwise ggml's op of the same name. Every
//! other op is the graph context's own ([`Ops`] dereferences to it).
//!
//! [`ExecutionPlan::cpu_kernels`]: super::ExecutionPlan::cpu_kernels

use crate::ggml::{Context, CpuKernels, DType, Interpolation, Result, Tensor, TensorView};

/// A graph context and the plan's CPU kernels (None: ggml's ops everywhere).
pub(crate) struct Ops {
    ctx: Context,
    kernels: Option<CpuKernels>,
}

impl std::ops::Deref for Ops {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.ctx
    }
}

/// Whether a bias is what the kernels' fused convolutions add: `channels` contiguous f32.
fn fused_bias(bias: &Tensor, channels: i64) -> bool {
    bias.dtype() == DType::F32 && bias.is_contiguous() && bias.nelements() == channels
}

impl Ops {
    /// The ops of `ctx`, with `kernels` where the plan runs our CPU kernels.
    pub fn new(ctx: Context, kernels: Option<CpuKernels>) -> Ops {
        Ops { ctx, kernels }
    }

    /// GELU with the exact erf form.
    pub fn gelu_erf(&self, a: &Tensor) -> Result<Tensor> {
        match &self.kernels {
            Some(k) if Context::cpu_gelu_erf_applies(a) => self.ctx.cpu_gelu_erf(k, a),
            _ => self.ctx.gelu_erf(a),
        }
    }

    /// `norm(a) * weight + bias` over `ne[0]`.
    pub fn layer_norm(
        &self,
        a: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        match &self.kernels {
            Some(k) if Context::cpu_layer_norm_applies(a, weight, bias) => {
                self.ctx.cpu_layer_norm(k, a, weight, bias, eps)
            }
            _ => self.ctx.layer_norm(a, weight, bias, eps),
        }
    }

    /// Scaled dot-product attention (see [`Context::attention`]): on our kernels the fused
    /// kernel for the usual scale, else ggml's fused `flash_attn_ext` (both avoid the score
    /// matrices and the copies); elsewhere explicit products. A batch (`ne[3]`) of attentions
    /// is one node.
    pub fn attention(&self, q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> Result<Tensor> {
        match &self.kernels {
            Some(kernels) if Context::cpu_attention_applies(q, k, v, scale) => {
                self.ctx.cpu_attention(kernels, q, k, v)
            }
            Some(_) => self.ctx.flash_attn_ext(q, k, v, None, scale),
            None => self.ctx.attention(q, k, v, scale),
        }
    }

    /// A contiguous copy (a tiled transpose on our kernels where `a` is a transposed matrix).
    pub fn cont(&self, a: &Tensor) -> Result<Tensor> {
        match &self.kernels {
            Some(k) if Context::cpu_transpose_applies(a) => self.ctx.cpu_transpose(k, a),
            _ => self.ctx.cont(a),
        }
    }

    /// Joins along `dim` (row copies on our kernels for matrices joined along rows).
    pub fn concat(&self, a: &Tensor, b: &Tensor, dim: usize) -> Result<Tensor> {
        match &self.kernels {
            Some(k)
                if dim == 0 && Context::cpu_concat_rows_applies(a, b) && a.ne()[1] == b.ne()[1] =>
            {
                self.ctx.cpu_concat_rows(k, a, b)
            }
            _ => self.ctx.concat(a, b, dim),
        }
    }

    /// 2D convolution in f32 (see [`Context::conv_2d`]); stride-1 "same" convolutions on our
    /// kernels' direct (or Winograd) kernel.
    pub fn conv_2d(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        match &self.kernels {
            Some(k) if Context::cpu_conv_2d_applies(kernel, input, stride, padding, dilation) => {
                self.ctx.cpu_conv_2d_same(k, kernel, input, None, false)
            }
            _ => self.ctx.conv_2d(kernel, input, stride, padding, dilation),
        }
    }

    /// [`Ops::conv_2d`] plus a per-channel `bias [OC]`, which our kernels add as they write.
    pub fn conv_2d_bias(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        match &self.kernels {
            Some(k)
                if fused_bias(bias, kernel.ne()[3])
                    && Context::cpu_conv_2d_applies(kernel, input, stride, padding, dilation) =>
            {
                self.ctx
                    .cpu_conv_2d_same(k, kernel, input, Some(bias), false)
            }
            _ => self
                .ctx
                .conv_2d_bias(kernel, input, bias, stride, padding, dilation),
        }
    }

    /// [`Ops::conv_2d`] (with `bias`, [`Ops::conv_2d_bias`]) of `relu(input)`: on our kernels
    /// one node that passes the input through ReLU as it reads it, saving a pass over the map
    /// (not before AMX tiles); elsewhere a ReLU node, then the convolution.
    pub fn conv_2d_of_relu(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: Option<&Tensor>,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> Result<Tensor> {
        let fits = bias.is_none_or(|b| fused_bias(b, kernel.ne()[3]))
            && Context::cpu_conv_2d_applies(kernel, input, stride, padding, dilation);
        match &self.kernels {
            Some(k) if fits => self.ctx.cpu_conv_2d_same(k, kernel, input, bias, true),
            Some(_) => {
                let x = self.ctx.relu(input)?;
                match bias {
                    Some(b) => self.conv_2d_bias(kernel, &x, b, stride, padding, dilation),
                    None => self.conv_2d(kernel, &x, stride, padding, dilation),
                }
            }
            None => self
                .ctx
                .conv_2d_of_relu(kernel, input, bias, stride, padding, dilation),
        }
    }

    /// A transposed convolution plus a per-channel `bias [OC]` (one node on our kernels for a
    /// kernel that is its stride, 2 or 4).
    pub fn conv_transpose_2d_bias(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: &Tensor,
        stride: i32,
    ) -> Result<Tensor> {
        if let Some(k) = &self.kernels {
            if let Some(y) = self
                .ctx
                .cpu_conv_transpose_2d_bias(k, kernel, input, bias, stride)?
            {
                return Ok(y);
            }
        }
        self.ctx.conv_transpose_2d_bias(kernel, input, bias, stride)
    }

    /// Resamples an f32 tensor to `ne` (bilinear with aligned corners on our kernels).
    pub fn interpolate(&self, a: &Tensor, ne: [i64; 4], mode: Interpolation) -> Result<Tensor> {
        let aligned = mode
            == Interpolation::Bilinear {
                align_corners: true,
            };
        let fits = aligned
            && a.dtype() == DType::F32
            && a.is_contiguous()
            && ne[..2].iter().all(|&d| d >= 1)
            && ne[2..] == a.ne()[2..];
        match &self.kernels {
            Some(k) if fits => self
                .ctx
                .cpu_bilinear_align_corners(k, a, ne[0], ne[1], None),
            _ => self.ctx.interpolate(a, ne, mode),
        }
    }

    /// [`Ops::interpolate`] to `ne`, then a separable offset (see
    /// [`Context::interpolate_add_separable`]): one pass on our kernels' bilinear path.
    pub fn interpolate_add_separable(
        &self,
        a: &Tensor,
        ne: [i64; 4],
        mode: Interpolation,
        along_x: &Tensor,
        along_y: &Tensor,
    ) -> Result<Tensor> {
        let aligned = mode
            == Interpolation::Bilinear {
                align_corners: true,
            };
        let f32_contiguous = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
        let fits = (aligned || ne == a.ne())
            && ne[..2].iter().all(|&d| d >= 1)
            && ne[2..] == a.ne()[2..]
            && [a, along_x, along_y].into_iter().all(f32_contiguous)
            && along_x.ne() == [ne[0], 1, ne[2], 1]
            && along_y.ne() == [1, ne[1], ne[2], 1];
        match &self.kernels {
            Some(k) if fits => {
                let offset = Some((along_x, along_y));
                self.ctx
                    .cpu_bilinear_align_corners(k, a, ne[0], ne[1], offset)
            }
            _ => self
                .ctx
                .interpolate_add_separable(a, ne, mode, along_x, along_y),
        }
    }

    /// `a` plus a separable offset, `along_x` [W, 1, C, 1] and `along_y` [1, H, C, 1].
    pub fn add_separable(&self, a: &Tensor, along_x: &Tensor, along_y: &Tensor) -> Result<Tensor> {
        let aligned = Interpolation::Bilinear {
            align_corners: true,
        };
        self.interpolate_add_separable(a, a.ne(), aligned, along_x, along_y)
    }

    /// A linear layer with a weight packed into panels (only on our kernels).
    pub fn linear_panels(
        &self,
        panels: &Tensor,
        x: &Tensor,
        bias: &Tensor,
        gelu: bool,
    ) -> Result<Tensor> {
        self.ctx
            .linear_panels(self.packed_kernels()?, panels, x, bias, gelu)
    }

    /// `residual + scale * (x W^T + bias)` with a packed weight (only on our kernels).
    pub fn linear_panels_residual(
        &self,
        panels: &Tensor,
        x: &Tensor,
        bias: &Tensor,
        scale: &Tensor,
        residual: &Tensor,
    ) -> Result<Tensor> {
        self.ctx
            .linear_panels_residual(self.packed_kernels()?, panels, x, bias, scale, residual)
    }

    fn packed_kernels(&self) -> Result<&CpuKernels> {
        self.kernels
            .as_ref()
            .ok_or_else(|| crate::ggml::Error::InvalidArgument {
                op: "linear_panels",
                reason: "packed weights are only computed by the CPU kernels, which this \
                         model's plan does not run"
                    .into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{DType, KernelConfig};

    /// A graph without our kernels cannot compute a packed weight: the op says so instead of
    /// building a node that no backend but the CPU's would run.
    #[test]
    fn packed_weights_need_the_cpu_kernels() {
        let ctx = Context::metadata(16).unwrap();
        let panels = ctx.new_tensor(DType::F32, &[32, 4, 1]).unwrap();
        let bias = ctx.new_tensor(DType::F32, &[32]).unwrap();
        let x = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
        let without = Ops::new(ctx.clone(), None);
        let text = without
            .linear_panels(&panels, &x, &bias, false)
            .unwrap_err()
            .to_string();
        assert!(text.contains("CPU kernels"), "{text}");
        let with = Ops::new(ctx, Some(CpuKernels::f32(KernelConfig::detect())));
        let y = with.linear_panels(&panels, &x, &bias, false).unwrap();
        assert_eq!(y.ne(), [32, 3, 1, 1]);
    }

    /// Where the plan runs our kernels, ops whose operands they take become their nodes
    /// (named after the op); others, and every op without the kernels, stay ggml's.
    #[test]
    fn ops_take_our_kernels_only_where_they_apply() {
        let config = KernelConfig::detect();
        let ctx = Context::metadata(64).unwrap();
        let x = ctx.new_tensor(DType::F32, &[64, 10]).unwrap();
        let halves = ctx.new_tensor(DType::F16, &[64, 10]).unwrap();
        let with = Ops::new(ctx.clone(), Some(CpuKernels::f32(config)));
        let without = Ops::new(ctx, None);
        let custom = |t: &Tensor| t.op_name() == "CUSTOM";
        assert!(custom(&with.gelu_erf(&x).unwrap()));
        assert!(!custom(&without.gelu_erf(&x).unwrap()));
        // f16 rows are not the kernel's: ggml's op, as without the kernels.
        assert!(!custom(&with.gelu_erf(&halves).unwrap()));
        let t = with.transpose(&x).unwrap();
        assert!(custom(&with.cont(&t).unwrap()));
        assert!(!custom(&without.cont(&t).unwrap()));
    }
}
