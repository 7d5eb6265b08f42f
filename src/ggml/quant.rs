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
