//! Quantisation of f32 rows into ggml's block formats (for writing model files).

use super::dtype::DType;
use super::error::{Error, Result};
use ggml_sys as sys;

/// The types [`quantize`] writes: ggml's quantisers that need no importance matrix.
pub const QUANTIZABLE: &[DType] = &[
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// Quantises `values`, rows of `n_per_row`, into `dtype`'s blocks.
pub fn quantize(dtype: DType, values: &[f32], n_per_row: usize) -> Result<Vec<u8>> {
    let op = "quantize";
    if !QUANTIZABLE.contains(&dtype) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{dtype} is not a type this crate quantises to"),
        });
    }
    if n_per_row == 0
        || !n_per_row.is_multiple_of(dtype.block_size())
        || !values.len().is_multiple_of(n_per_row)
    {
        return Err(Error::InvalidShape {
            op,
            ne: vec![n_per_row as i64, (values.len() / n_per_row.max(1)) as i64],
            reason: format!("rows of {n_per_row} values must be a multiple of {dtype}'s block of {} and divide the {} values", dtype.block_size(), values.len()),
        });
    }
    // ggml asserts (aborts) on a type that needs an importance matrix when none is given.
    // SAFETY: compares its argument with three enum values; touches no memory, defined for
    // every `ggml_type` id.
    if unsafe { sys::ggml_quantize_requires_imatrix(dtype.id()) } {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{dtype} needs an importance matrix, which this crate does not supply"),
        });
    }
    // The block quantisers round scaled values to integers through a helper that asserts a
    // finite range (compiled out only under NDEBUG): refuse infinities and NaNs first. f16
    // and bf16 are plain conversions, defined for every value.
    if dtype.is_quantized() {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::InvalidArgument {
                op,
                reason: format!(
                    "value {i} ({}) is not finite; {dtype} cannot store it",
                    values[i]
                ),
            });
        }
    }
    let nrows = values.len() / n_per_row;
    let row = dtype
        .row_size(n_per_row as u64)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: "row size overflows".into(),
        })? as usize;
    let len = row
        .checked_mul(nrows)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: "output size overflows".into(),
        })?;
    let mut out = vec![0u8; len];
    // SAFETY: checked above against ggml's `ggml_quantize_chunk`: `dtype` is one of the types
    // its switch handles (QUANTIZABLE; any other hits `assert(false)`), and needs no importance
    // matrix (so the `imatrix != NULL` assertion cannot fire with a null one); `start` is 0,
    // so both `start % blck_size` and `start % n_per_row` assertions hold; `n_per_row` is a
    // multiple of the block size (the k-quants assert `n_per_row % QK_K == 0`) and the values
    // are finite (their rounding helper asserts a bounded magnitude); it reads exactly
    // `nrows * n_per_row` floats (`values.len()`) and writes `nrows` rows of
    // `ggml_row_size(dtype, n_per_row)` bytes (`out.len()`, computed with the same block and
    // type sizes as ggml's table), so both pointers cover what it touches.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            dtype.id(),
            values.as_ptr(),
            out.as_mut_ptr().cast(),
            0,
            nrows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    debug_assert_eq!(written, out.len());
    Ok(out)
}

/// Decodes rows of `n_per_row` values stored as `dtype`'s blocks (a quantised type, f16 or
/// bf16) into f32, with ggml's own decoder for the type.
pub fn dequantize(dtype: DType, bytes: &[u8], n_per_row: usize) -> Result<Vec<f32>> {
    let op = "dequantize";
    if !QUANTIZABLE.contains(&dtype) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{dtype} is not a type this crate decodes"),
        });
    }
    let row = dtype
        .row_size(n_per_row as u64)
        .filter(|&row| row > 0)
        .ok_or_else(|| Error::InvalidShape {
            op,
            ne: vec![n_per_row as i64],
            reason: format!(
                "rows of {n_per_row} values must be a positive multiple of {dtype}'s block of {}",
                dtype.block_size()
            ),
        })? as usize;
    if !bytes.len().is_multiple_of(row) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{} bytes are not whole rows of {row} bytes ({n_per_row} {dtype} values)",
                bytes.len()
            ),
        });
    }
    let nrows = bytes.len() / row;
    let mut out = vec![0.0f32; nrows * n_per_row];
    // SAFETY: `dtype` is one of ggml's types (its id is below GGML_TYPE_COUNT, which
    // ggml_get_type_traits asserts), so the call returns a pointer into ggml's static table.
    let to_float = unsafe { (*sys::ggml_get_type_traits(dtype.id())).to_float };
    let Some(to_float) = to_float else {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("ggml has no decoder for {dtype}"),
        });
    };
    for (src, dst) in bytes.chunks_exact(row).zip(out.chunks_exact_mut(n_per_row)) {
        // SAFETY: the decoder of `dtype` reads `n_per_row / block` blocks of `type_size`
        // bytes (one row: `src`, exactly `row` bytes) and writes `n_per_row` floats (`dst`);
        // the k-quant decoders assert `k % QK_K == 0`, which `row_size` checked (a multiple of
        // the block size). It only does arithmetic on the bytes: any bits decode, at worst to
        // NaN or infinity.
        unsafe { to_float(src.as_ptr().cast(), dst.as_mut_ptr(), n_per_row as i64) };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type decodes what it encoded, within its precision: f16 and q8_0 nearly
    /// exactly, q4_k within a few percent of the rows' range.
    #[test]
    fn dequantize_inverts_quantize() {
        let values: Vec<f32> = (0..512)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        for (dtype, bound) in [(DType::F16, 1e-3), (DType::Q8_0, 0.01), (DType::Q4_K, 0.2)] {
            let bytes = quantize(dtype, &values, 256).unwrap();
            let back = dequantize(dtype, &bytes, 256).unwrap();
            let diff = values
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < bound, "{dtype}: {diff}");
        }
        let q8 = quantize(DType::Q8_0, &values, 256).unwrap();
        let err = dequantize(DType::Q8_0, &q8[..q8.len() - 1], 256).unwrap_err();
        assert!(err.to_string().contains("whole rows"), "{err}");
        let err = dequantize(DType::Q4_K, &q8, 100).unwrap_err();
        assert!(err.to_string().contains("multiple of"), "{err}");
    }
}
