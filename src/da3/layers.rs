//! The layers the architecture is built of, bound to loaded weights by name
//! ([`BoundWeights`]): their shapes, and whether a transform changed how they compute, come
//! from the architecture's table and the loader's choices, not from the callers.

use super::ops::Ops;
use super::weights::BoundWeights;
use super::Error;
use crate::ggml::{DType, Tensor, TensorView};

/// `y = x W^T + b` with W stored as PyTorch (out, in), or packed for the CPU kernel. Every
/// linear layer of DA3 has a bias; a norm before it or a layer scale after it may be folded
/// in ([`super::architecture::Fold`]).
pub struct Linear {
    /// The weight, PyTorch (out, in) in ggml order, or packed panels.
    pub weight: Tensor,
    /// The bias [out].
    pub bias: Tensor,
    packed: bool,
}

impl Linear {
    /// Linear layer `prefix` (`{prefix}.weight`, `{prefix}.bias`).
    pub fn bind(w: &BoundWeights<'_>, prefix: &str) -> Result<Self, Error> {
        let name = format!("{prefix}.weight");
        Ok(Linear {
            weight: w.tensor(&name)?,
            bias: w.tensor(&format!("{prefix}.bias"))?,
            packed: w.packed(&name),
        })
    }
    /// `x`: [n_in, T] -> [n_out, T].
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        if self.packed {
            return Ok(g.linear_panels(&self.weight, x, &self.bias, false)?);
        }
        Ok(g.add(&g.mul_mat(&self.weight, x)?, &self.bias)?)
    }
    /// `residual + scale * forward(x)` (a layer-scaled residual branch), fused into the
    /// product where it is packed; `residual + forward(x)` without a scale (one folded into
    /// the layer).
    pub fn forward_scaled_residual(
        &self,
        g: &Ops,
        x: &Tensor,
        scale: Option<&Tensor>,
        residual: &Tensor,
    ) -> Result<Tensor, Error> {
        match scale {
            Some(scale) if self.packed => {
                Ok(g.linear_panels_residual(&self.weight, x, &self.bias, scale, residual)?)
            }
            Some(scale) => Ok(g.add(residual, &g.mul(&self.forward(g, x)?, scale)?)?),
            None => Ok(g.add(residual, &self.forward(g, x)?)?),
        }
    }
    /// GELU (erf form) of [`Linear::forward`], fused into the product where it is packed.
    pub fn forward_gelu(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        if self.packed {
            return Ok(g.linear_panels(&self.weight, x, &self.bias, true)?);
        }
        Ok(g.gelu_erf(&self.forward(g, x)?)?)
    }
}

/// LayerNorm over ne[0].
pub struct Norm {
    /// Scale and shift; none where they are folded into the next linear layer.
    affine: Option<(Tensor, Tensor)>,
    eps: f32,
    /// The rows normalised have zero mean already (centred by the layer computing them, see
    /// [`super::architecture::CentredOutputs`]): an RMS norm computes the LayerNorm.
    centred_input: bool,
}

impl Norm {
    /// LayerNorm `prefix` (`{prefix}.weight`, `{prefix}.bias`), or only the normalisation
    /// where its scale and shift were folded into the linear layer after it.
    pub fn bind(w: &BoundWeights<'_>, prefix: &str, eps: f32) -> Result<Self, Error> {
        let (weight, bias) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let affine = match w.folded_away(&weight) {
            true => None,
            false => Some((w.tensor(&weight)?, w.tensor(&bias)?)),
        };
        Ok(Norm {
            affine,
            eps,
            centred_input: false,
        })
    }
    /// [`Norm::bind`] for rows that the layer computing them centres, where `centred`.
    pub fn bind_centred(
        w: &BoundWeights<'_>,
        prefix: &str,
        eps: f32,
        centred: bool,
    ) -> Result<Self, Error> {
        Ok(Norm {
            centred_input: centred,
            ..Self::bind(w, prefix, eps)?
        })
    }
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        Ok(match (&self.affine, self.centred_input) {
            (Some((weight, bias)), true) => g.rms_norm_affine(x, weight, bias, self.eps)?,
            (Some((weight, bias)), false) => g.layer_norm(x, weight, bias, self.eps)?,
            (None, true) => g.rms_norm(x, self.eps)?,
            (None, false) => g.norm(x, self.eps)?,
        })
    }
}

/// A 2D convolution with PyTorch weights (out, in, kh, kw), padded by half its kernel.
pub struct Conv {
    /// The kernel, PyTorch (out, in, kh, kw) in ggml order.
    pub weight: Tensor,
    /// The bias [out], where the convolution has one.
    pub bias: Option<Tensor>,
    /// The step between windows.
    pub stride: i32,
    /// Zeros around the input on each side.
    pub padding: i32,
}

impl Conv {
    /// Convolution `prefix` (`{prefix}.weight` and, where the architecture has one,
    /// `{prefix}.bias`), stride 1.
    pub fn bind(w: &BoundWeights<'_>, prefix: &str) -> Result<Self, Error> {
        Self::bind_strided(w, prefix, 1)
    }
    /// [`Conv::bind`] with windows `stride` apart.
    pub fn bind_strided(w: &BoundWeights<'_>, prefix: &str, stride: i32) -> Result<Self, Error> {
        let name = format!("{prefix}.weight");
        let kernel = w.spec(&name)?.shape[3];
        let bias = format!("{prefix}.bias");
        Ok(Conv {
            weight: w.tensor(&name)?,
            bias: match w.has(&bias) {
                true => Some(w.tensor(&bias)?),
                false => None,
            },
            stride,
            padding: (kernel / 2) as i32,
        })
    }
    /// `x`: a map [W, H, C_in, 1] -> [W', H', C_out, 1].
    /// f16 kernels ([`super::weights::Loader::conv_kernels`]) run ggml's direct convolution; f32 ones
    /// [`Context::conv_2d`] (the CPU kernels' direct f32 convolution where they apply, else
    /// im2col and a matrix product). (f16 columns and a cuBLAS product were slower on an
    /// H200: ggml's im2col kernel wrote DA3-large's 1.1 GB of columns in 3.5 ms, where the
    /// direct convolution takes 4.0 ms in all.)
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        let (stride, padding) = ((self.stride, self.stride), (self.padding, self.padding));
        if self.weight.dtype() == DType::F16 {
            let y = g.conv_2d_direct(&self.weight, x, stride, padding, (1, 1))?;
            return match &self.bias {
                Some(bias) => add_channel_bias(g, &y, bias),
                None => Ok(y),
            };
        }
        Ok(match &self.bias {
            Some(bias) => g.conv_2d_bias(&self.weight, x, bias, stride, padding, (1, 1))?,
            None => g.conv_2d(&self.weight, x, stride, padding, (1, 1))?,
        })
    }
    /// [`Conv::forward`] of `relu(x)`: on the CPU kernels, ReLU applied as the convolution
    /// reads its input ([`Context::conv_2d_of_relu`]), not as a pass of its own.
    pub fn forward_of_relu(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        // f16 kernels take ggml's direct convolution (see `forward`), which has no ReLU on
        // its input: a node of its own.
        if self.weight.dtype() == DType::F16 {
            return self.forward(g, &g.relu(x)?);
        }
        let (stride, padding) = ((self.stride, self.stride), (self.padding, self.padding));
        let bias = self.bias.as_ref();
        Ok(g.conv_2d_of_relu(&self.weight, x, bias, stride, padding, (1, 1))?)
    }
}

/// A transposed convolution (kernel == stride, no padding), PyTorch weights (in, out, k, k).
pub struct ConvTranspose {
    /// The kernel, PyTorch (in, out, k, k) in ggml order.
    pub weight: Tensor,
    /// The bias [out].
    pub bias: Tensor,
    /// The kernel's side, and the step between windows.
    pub stride: i32,
}

impl ConvTranspose {
    /// Transposed convolution `prefix` (`{prefix}.weight`, `{prefix}.bias`).
    pub fn bind(w: &BoundWeights<'_>, prefix: &str) -> Result<Self, Error> {
        let name = format!("{prefix}.weight");
        Ok(ConvTranspose {
            stride: w.spec(&name)?.shape[3] as i32,
            weight: w.tensor(&name)?,
            bias: w.tensor(&format!("{prefix}.bias"))?,
        })
    }
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        Ok(g.conv_transpose_2d_bias(&self.weight, x, &self.bias, self.stride)?)
    }
}

/// Adds a per-channel bias [C] to a map [W, H, C, N].
fn add_channel_bias(g: &Ops, map: &Tensor, bias: &Tensor) -> Result<Tensor, Error> {
    let bias = g.reshape(bias, &[1, 1, bias.nelements()])?;
    Ok(g.add(map, &bias)?)
}
