//! The transforms weights go through between the file and the device: type conversion and
//! checks, folding a norm or a layer scale into a linear layer, centring heads, reordering
//! rows, packing linear weights for the CPU kernels and requantising them for int8 products.
//! Which of them apply to a tensor is the plan's choice ([`super::weights::Loader`]) among
//! those the architecture allows ([`super::architecture::TensorSpec`]).

use super::architecture::{CentredOutputs, Role};
use super::weight_error::WeightError;
use super::weights::{ConvKernels, LinearPacking};
use super::Error;
use crate::ggml::{
    dequantize, pack_linear_panels, pack_linear_panels_bf16, pack_linear_panels_f16,
    pack_linear_panels_q8, quantize, Context, DType, Tensor, TensorView, LINEAR_PANEL,
    LINEAR_Q8_RECORD,
};
use crate::gguf::TensorInfo;

/// The layouts of a packed linear weight (see [`super::weights::Loader::pack_linears`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packing {
    F32,
    Bf16,
    /// An f16 weight kept in f16, widened to f32 as the products load it (CPUs without
    /// bf16 products: half the memory traffic of f32 panels).
    F16,
    /// A q8_0 weight for int8 products.
    Q8,
}

impl Packing {
    /// How a linear weight of PyTorch shape `shape`, kept as `dtype` on the device, is packed
    /// for the CPU kernels configured by `packing`; None where it stays as it is (outputs not
    /// a whole number of panels, or a type the kernels take as it is).
    pub(crate) fn choose(shape: &[usize], dtype: DType, packing: LinearPacking) -> Option<Packing> {
        let bf16_linears = packing.config.linear_bf16();
        match (shape, dtype) {
            (&[n_out, _], _) if !n_out.is_multiple_of(LINEAR_PANEL) => None,
            ([_, _], DType::F32) => Some(Packing::F32),
            (&[_, n_in], DType::F16 | DType::BF16) if bf16_linears && n_in % 2 == 0 => {
                Some(Packing::Bf16)
            }
            ([_, _], DType::F16) => Some(Packing::F16),
            // Other quantised types are decoded and stored as q8_0 for the int8 products:
            // a second rounding far finer than theirs (a q4_k step is 8 of q8_0's), for the
            // speed of int8 products over ggml's quantised ones.
            (&[_, n_in], dtype)
                if dtype.is_quantized() && packing.int8 && n_in % DType::Q8_0.block_size() == 0 =>
            {
                Some(Packing::Q8)
            }
            _ => None,
        }
    }

    /// The device type and ggml shape of a packed weight of `n_out` outputs of `n_in` inputs.
    pub(crate) fn layout(self, n_in: usize, n_out: usize) -> (DType, Vec<i64>) {
        let (dtype, row, depth) = match self {
            Packing::F32 => (DType::F32, LINEAR_PANEL, n_in),
            Packing::Bf16 => (DType::I32, LINEAR_PANEL, n_in / 2),
            Packing::F16 => (DType::F16, LINEAR_PANEL, n_in),
            Packing::Q8 => (DType::I8, LINEAR_Q8_RECORD, n_in / DType::Q8_0.block_size()),
        };
        (
            dtype,
            vec![row as i64, depth as i64, (n_out / LINEAR_PANEL) as i64],
        )
    }

    /// Writes weight `name`, the file's `data` of type `file`, packed into `tensor`.
    pub(crate) fn write(
        self,
        ctx: &Context,
        tensor: &Tensor,
        name: &str,
        file: &TensorInfo,
        data: &[u8],
    ) -> Result<(), Error> {
        // The file's ggml shape is [n_in, n_out], checked when declared.
        let (n_in, n_out) = (file.shape()[0] as usize, file.shape()[1] as usize);
        match self {
            Packing::F32 => {
                let plain = to_f32(name, file.dtype, data)?;
                ctx.write(tensor, &pack_linear_panels(&plain, n_in, n_out)?.0)?
            }
            Packing::Bf16 => {
                let plain = to_f32(name, file.dtype, data)?;
                ctx.write(tensor, &pack_linear_panels_bf16(&plain, n_in, n_out)?.0)?
            }
            Packing::F16 => {
                let plain = to_f32(name, file.dtype, data)?;
                ctx.write(tensor, &pack_linear_panels_f16(&plain, n_in, n_out)?.0)?
            }
            Packing::Q8 if file.dtype == DType::Q8_0 => {
                ctx.write_bytes(tensor, &pack_linear_panels_q8(data, n_in, n_out)?.0)?
            }
            Packing::Q8 => {
                let plain = dequantize(file.dtype, data, n_in)?;
                let q8 = quantize(DType::Q8_0, &plain, n_in)
                    .map_err(|e| WeightError::Other(format!("tensor `{name}`: {e}")))?;
                ctx.write_bytes(tensor, &pack_linear_panels_q8(&q8, n_in, n_out)?.0)?
            }
        }
        Ok(())
    }
}

/// Checks that `order` can store tensor `name` (`file` in the file) with its rows reordered:
/// a permutation of rows that are whole runs of its data (and of a quantised type's blocks).
pub(crate) fn check_row_order(name: &str, order: &[usize], file: &TensorInfo) -> Result<(), Error> {
    let mut sorted = order.to_vec();
    sorted.sort_unstable();
    if sorted.iter().enumerate().any(|(i, &j)| i != j) {
        return Err(WeightError::Other(format!(
            "tensor `{name}`: a row order must name each row once"
        ))
        .into());
    }
    let block = file.dtype.block_size();
    let values: usize = file.shape().iter().map(|&d| d as usize).product();
    let whole_rows =
        values.is_multiple_of(order.len()) && (values / order.len()).is_multiple_of(block);
    if !whole_rows {
        // PyTorch's order, as the other shape errors print it.
        let shape: Vec<u64> = file.shape().iter().rev().copied().collect();
        return Err(WeightError::Other(format!(
            "tensor `{name}` ({shape:?}, {}) cannot have its rows reordered as {} rows",
            file.dtype,
            order.len()
        ))
        .into());
    }
    Ok(())
}

/// Fails naming the tensor when f32, f16 or bf16 data holds a NaN or an infinity (one pass
/// over the bits as the data is copied; quantised types are not checked).
pub fn check_finite(name: &str, dtype: DType, bytes: &[u8]) -> Result<(), Error> {
    let first_bad = match dtype {
        DType::F32 => bytes.chunks_exact(4).position(|b| {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7F80_0000 == 0x7F80_0000
        }),
        DType::F16 => bytes
            .chunks_exact(2)
            .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7C00 == 0x7C00),
        DType::BF16 => bytes
            .chunks_exact(2)
            .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80),
        _ => None,
    };
    match first_bad {
        Some(element) => Err(WeightError::NonFinite {
            name: name.to_owned(),
            element,
        }
        .into()),
        None => Ok(()),
    }
}

/// The device type of a tensor of `role` stored as `file` in the file, and the type its data is
/// converted to on the way in (None: copied as is); None where the role cannot use the type.
pub(crate) fn storage(
    role: Role,
    file: DType,
    conv: ConvKernels,
) -> Option<(DType, Option<DType>)> {
    Some(match (role, file, conv) {
        // bf16 kernels become f16 too: ggml's direct convolution takes f16 or f32 kernels.
        (Role::ConvKernel, DType::F16, ConvKernels::AsFileHalf | ConvKernels::F16) => {
            (DType::F16, None)
        }
        (Role::ConvKernel, DType::BF16, ConvKernels::AsFileHalf) => (DType::F16, Some(DType::F16)),
        (Role::ConvKernel, DType::F32 | DType::BF16, ConvKernels::F16) => {
            (DType::F16, Some(DType::F16))
        }
        (_, DType::F32, _) => (DType::F32, None),
        (Role::F32 | Role::ConvKernel, DType::F16 | DType::BF16, _) => {
            (DType::F32, Some(DType::F32))
        }
        (Role::Matmul, dtype, _) if dtype_supported_for_matmul(dtype) => (dtype, None),
        _ => return None,
    })
}

fn dtype_supported_for_matmul(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// Converts little-endian f32/f16/bf16 bytes to f32 values.
pub fn to_f32(name: &str, dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, Error> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(WeightError::TensorType {
                name: name.to_owned(),
                dtype: other,
                expected: Some("f32, f16 or bf16"),
            }
            .into())
        }
    })
}

/// What a declared tensor's values are computed from when a LayerNorm's scale and shift or a
/// LayerScale is folded into the linear layer beside it ([`super::weights::Loader::fold_affine`]). Names are
/// the architecture's. With `W` [out, in] and bias `b`, a LayerNorm `n * g + s` before and a
/// LayerScale `l` after: `l * (W (n * g + s) + b) = W' n + b'`.
#[derive(Clone)]
pub(crate) enum Derive {
    /// `W'[o][i] = l[o] * W[o][i] * g[i]`, then centred where `centred` says.
    Weight {
        input_scale: Option<String>,
        output_scale: Option<String>,
        centred: Option<CentredOutputs>,
    },
    /// `b'[o] = l[o] * (b[o] + sum_i W[o][i] * s[i])`, from the file's weight `weight`, then
    /// centred where `centred` says.
    Bias {
        weight: String,
        input_shift: Option<String>,
        output_scale: Option<String>,
        centred: Option<CentredOutputs>,
    },
}

/// The values of a tensor with a norm or a layer scale folded in ([`Derive`]): `own` is the
/// tensor's file values as f32 (a weight's rows of `n_in` inputs, one per output, or a bias),
/// `read` reads another file tensor as f32.
pub(crate) fn derived_values(
    name: &str,
    mut own: Vec<f32>,
    n_in: usize,
    derive: &Derive,
    read: impl Fn(&str) -> Result<Vec<f32>, Error>,
) -> Result<Vec<f32>, Error> {
    // Each output's values (a weight row, or one bias value) times its layer scale.
    let scale_outputs = |values: &mut [f32], scale: &Option<String>, per_output: usize| {
        if let Some(scale) = scale {
            let l = read(scale)?;
            for (values, &l) in values.chunks_exact_mut(per_output).zip(&l) {
                values.iter_mut().for_each(|x| *x *= l);
            }
        }
        Ok::<_, Error>(())
    };
    match derive {
        Derive::Weight {
            input_scale,
            output_scale,
            centred,
        } => {
            if let Some(scale) = input_scale {
                let g = read(scale)?;
                for row in own.chunks_exact_mut(n_in) {
                    row.iter_mut().zip(&g).for_each(|(w, &g)| *w *= g);
                }
            }
            scale_outputs(&mut own, output_scale, n_in)?;
            if let Some(c) = centred {
                centre_runs(&mut own[..c.rows * n_in], c.group, n_in);
            }
        }
        Derive::Bias {
            weight,
            input_shift,
            output_scale,
            centred,
        } => {
            if let Some(shift) = input_shift {
                let s = read(shift)?;
                let w = read(weight)?;
                for (b, row) in own.iter_mut().zip(w.chunks_exact(s.len())) {
                    let dot: f64 = row.iter().zip(&s).map(|(&w, &s)| w as f64 * s as f64).sum();
                    *b += dot as f32;
                }
            }
            scale_outputs(&mut own, output_scale, 1)?;
            if let Some(c) = centred {
                centre_runs(&mut own[..c.rows], c.group, 1);
            }
        }
    }
    if let Some(i) = own.iter().position(|x| !x.is_finite()) {
        return Err(WeightError::Unrepresentable {
            name: name.to_owned(),
            element: i,
            value: own[i],
            reason: "once the norm or layer scale beside it is folded in",
        }
        .into());
    }
    Ok(own)
}

/// Subtracts from each of the `values`' runs of `group` rows (of `width` values each) the
/// run's mean row, summed in f64: the outputs the rows compute then have zero mean over each
/// run, whatever the input.
fn centre_runs(values: &mut [f32], group: usize, width: usize) {
    for run in values.chunks_exact_mut(group * width) {
        let mut mean = vec![0f64; width];
        for row in run.chunks_exact(width) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v as f64);
        }
        mean.iter_mut().for_each(|m| *m /= group as f64);
        for row in run.chunks_exact_mut(width) {
            row.iter_mut()
                .zip(&mean)
                .for_each(|(v, &m)| *v = (*v as f64 - m) as f32);
        }
    }
}

/// `data` as `order.len()` equal rows, row `i` of the result being row `order[i]` of `data`
/// (the caller checked that the rows divide the data).
pub(crate) fn reordered<T: Copy>(data: &[T], order: &[usize]) -> Vec<T> {
    let row = data.len() / order.len();
    order
        .iter()
        .flat_map(|&i| &data[i * row..(i + 1) * row])
        .copied()
        .collect()
}

/// Writes f32 `values` into `tensor` in its type (f32, f16 or bf16).
pub(crate) fn write_values(
    ctx: &Context,
    tensor: &Tensor,
    name: &str,
    values: &[f32],
) -> Result<(), Error> {
    match tensor.dtype() {
        DType::F16 => ctx.write(tensor, &to_f16(name, values)?)?,
        DType::BF16 => {
            let halves: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
            ctx.write(tensor, &halves)?
        }
        _ => ctx.write(tensor, values)?,
    }
    Ok(())
}

/// `values` rounded to f16; a finite value beyond f16's range (65504) is an error naming the
/// tensor, not an infinity in the weights.
fn to_f16(name: &str, values: &[f32]) -> Result<Vec<half::f16>, Error> {
    let halves: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
    match halves.iter().position(|h| !h.is_finite()) {
        Some(i) => Err(WeightError::Unrepresentable {
            name: name.to_owned(),
            element: i,
            value: values[i],
            reason: "beyond the range of f16, the type it is kept in",
        }
        .into()),
        None => Ok(halves),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Rows are whole runs of the data, moved intact (a quantised row's bytes included).
    #[test]
    fn reordered_moves_whole_rows() {
        let bytes: Vec<u8> = (0..12).collect();
        assert_eq!(
            reordered(&bytes, &[2, 0, 1]),
            [8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(reordered(&[1.0f32, 2.0, 3.0], &[0, 2, 1]), [1.0, 3.0, 2.0]);
    }

    /// A LayerNorm's scale and shift before a linear layer and a LayerScale after it, folded
    /// into the layer, give what the three compute in turn.
    #[test]
    fn folded_layer_computes_norm_affine_layer_and_scale() {
        let (n_in, n_out) = (5, 3);
        let w: Vec<f32> = (0..n_in * n_out).map(|i| (i as f32 * 0.37).sin()).collect();
        let b = vec![0.5, -1.25, 2.0];
        let g = vec![1.5, -0.5, 2.0, 0.25, 1.0];
        let s = vec![0.1, 0.2, -0.3, 0.4, -0.5];
        let l = vec![0.01, -2.0, 0.5];
        let tensors: HashMap<&str, Vec<f32>> = [
            ("w", w.clone()),
            ("n.weight", g.clone()),
            ("n.bias", s.clone()),
            ("ls", l.clone()),
        ]
        .into_iter()
        .collect();
        let read = |name: &str| Ok(tensors[name].clone());
        let w_derive = Derive::Weight {
            input_scale: Some("n.weight".into()),
            output_scale: Some("ls".into()),
            centred: None,
        };
        let b_derive = Derive::Bias {
            weight: "w".into(),
            input_shift: Some("n.bias".into()),
            output_scale: Some("ls".into()),
            centred: None,
        };
        let w2 = derived_values("w", w.clone(), n_in, &w_derive, read).unwrap();
        let b2 = derived_values("b", b.clone(), n_out, &b_derive, read).unwrap();
        let x = [0.3f32, -1.1, 0.8, 2.0, -0.2]; // a normalised token
        for o in 0..n_out {
            let row = &w[o * n_in..][..n_in];
            let unfolded = l[o]
                * (b[o]
                    + (0..n_in)
                        .map(|i| row[i] * (x[i] * g[i] + s[i]))
                        .sum::<f32>());
            let folded = b2[o] + (0..n_in).map(|i| w2[o * n_in + i] * x[i]).sum::<f32>();
            assert!(
                (unfolded - folded).abs() < 1e-5,
                "output {o}: {unfolded} vs {folded}"
            );
        }
        // Values that overflow once folded are an error naming the tensor.
        let huge = |name: &str| {
            Ok(if name == "ls" {
                vec![f32::MAX; 3]
            } else {
                tensors[name].clone()
            })
        };
        let err = derived_values("w", vec![4.0; 15], n_in, &w_derive, huge).unwrap_err();
        assert!(err.to_string().contains("`w`"), "{err}");
    }

    /// Heads centred at load: a LayerNorm of each head of the file's layer equals an RMS norm
    /// of the centred layer's head, and outputs past the centred rows (V) are untouched.
    #[test]
    fn centred_heads_turn_layer_norm_into_rms_norm() {
        let (n_in, n_out, head) = (4, 6, 2); // q and k: two heads of 2, then v: 2 outputs
        let w: Vec<f32> = (0..n_in * n_out).map(|i| (i as f32 * 0.71).cos()).collect();
        let b: Vec<f32> = (0..n_out).map(|i| 0.3 * i as f32 - 0.4).collect();
        let g = vec![1.5, -0.5, 2.0, 0.25];
        let s = vec![0.1, 0.2, -0.3, 0.4];
        let tensors: HashMap<&str, Vec<f32>> = [("w", w.clone()), ("n.weight", g), ("n.bias", s)]
            .into_iter()
            .collect();
        let read = |name: &str| Ok(tensors[name].clone());
        let centred = Some(CentredOutputs {
            rows: 4,
            group: head,
        });
        let w_derive = |centred| Derive::Weight {
            input_scale: Some("n.weight".into()),
            output_scale: None,
            centred,
        };
        let b_derive = |centred| Derive::Bias {
            weight: "w".into(),
            input_shift: Some("n.bias".into()),
            output_scale: None,
            centred,
        };
        let layer = |centred| {
            let w = derived_values("w", w.clone(), n_in, &w_derive(centred), read).unwrap();
            let b = derived_values("b", b.clone(), n_out, &b_derive(centred), read).unwrap();
            let x = [0.9f32, -1.3, 0.2, 1.7];
            (0..n_out)
                .map(|o| b[o] + (0..n_in).map(|i| w[o * n_in + i] * x[i]).sum::<f32>())
                .collect::<Vec<f32>>()
        };
        let (plain, centred_out) = (layer(None), layer(centred));
        let eps = 1e-6;
        for h in 0..2 {
            let run = |y: &[f32]| y[h * head..][..head].to_vec();
            let (p, c) = (run(&plain), run(&centred_out));
            let mean = p.iter().sum::<f32>() / head as f32;
            let var = p.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / head as f32;
            let ms = c.iter().map(|v| v * v).sum::<f32>() / head as f32;
            assert!(
                c.iter().sum::<f32>().abs() < 1e-5,
                "head {h} not centred: {c:?}"
            );
            for (p, c) in p.iter().zip(&c) {
                let layer_norm = (p - mean) / (var + eps).sqrt();
                let rms_norm = c / (ms + eps).sqrt();
                assert!(
                    (layer_norm - rms_norm).abs() < 1e-4,
                    "{layer_norm} vs {rms_norm}"
                );
            }
        }
        assert_eq!(plain[4..], centred_out[4..]);
    }

    #[test]
    fn convolution_kernels_are_f16_only_where_asked() {
        use ConvKernels::*;
        let conv = |file, asked| storage(Role::ConvKernel, file, asked);
        // The default: f32 whatever the file stores.
        assert_eq!(conv(DType::F32, F32), Some((DType::F32, None)));
        assert_eq!(conv(DType::F16, F32), Some((DType::F32, Some(DType::F32))));
        assert_eq!(conv(DType::BF16, F32), Some((DType::F32, Some(DType::F32))));
        // As the file: half types become f16 (bf16 converted), f32 stays.
        assert_eq!(conv(DType::F32, AsFileHalf), Some((DType::F32, None)));
        assert_eq!(conv(DType::F16, AsFileHalf), Some((DType::F16, None)));
        assert_eq!(
            conv(DType::BF16, AsFileHalf),
            Some((DType::F16, Some(DType::F16)))
        );
        // Always f16.
        assert_eq!(conv(DType::F32, F16), Some((DType::F16, Some(DType::F16))));
        assert_eq!(conv(DType::F16, F16), Some((DType::F16, None)));
        // No quantised kernels, and other roles ignore the choice.
        assert_eq!(conv(DType::Q8_0, F16), None);
        assert_eq!(
            storage(Role::F32, DType::F16, F16),
            Some((DType::F32, Some(DType::F32)))
        );
        assert_eq!(
            storage(Role::Matmul, DType::F16, F16),
            Some((DType::F16, None))
        );
    }

    #[test]
    fn kernels_beyond_the_f16_range_are_an_error_naming_the_tensor() {
        let err = to_f16("head.out1.weight", &[1.0, 7.0e4]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("head.out1.weight") && text.contains("element 1"),
            "{text}"
        );
        assert_eq!(
            to_f16("t", &[0.5, -65504.0]).unwrap(),
            [half::f16::from_f32(0.5), half::f16::from_f32(-65504.0)]
        );
    }
}
