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
    let nrows = values.len() / n_per_row;
    let row = dtype
        .row_size(n_per_row as u64)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: "row size overflows".into(),
        })? as usize;
    let mut out = vec![0u8; row * nrows];
    // SAFETY: a type that needs no importance matrix (checked, so the imatrix assertion cannot
    // fire), start 0, whole rows of a block multiple; `out` holds exactly nrows rows.
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
