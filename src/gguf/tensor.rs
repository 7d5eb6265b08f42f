//! Tensor descriptions and the layout rules the reader and the writer share: shapes checked
//! as ggml checks them, and the data alignment.

use super::{GgufError, Value, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
use crate::ggml::DType;

/// Description of one tensor in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (at most [`MAX_TENSOR_NAME_LEN`](super::MAX_TENSOR_NAME_LEN) bytes).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape in ggml order (`ne[0]` is the contiguous row); unused dimensions are 1.
    pub ne: [u64; 4],
    /// Number of dimensions stored in the file, `0..=4` (0 means a scalar).
    pub n_dims: usize,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Size of the tensor data in bytes.
    ///
    /// Infos returned by [`GgufFile`](super::GgufFile) are validated, so this is exact for
    /// them; for a hand-built info with an invalid shape it returns `u64::MAX`.
    pub fn nbytes(&self) -> u64 {
        self.dtype.nbytes(self.ne).unwrap_or(u64::MAX)
    }

    /// Number of elements (saturating; exact for validated infos).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().fold(1u64, |acc, &n| acc.saturating_mul(n))
    }

    /// The stored dimensions, `ne[0]` first (`&ne[..n_dims]`).
    pub fn shape(&self) -> &[u64] {
        &self.ne[..self.n_dims.min(MAX_DIMS)]
    }
}

/// Checks a tensor shape the way ggml does and returns it padded to four
/// dimensions together with the data size in bytes.
pub(super) fn check_shape(
    tensor: &str,
    dtype: DType,
    dims: &[u64],
) -> Result<([u64; 4], u64), GgufError> {
    if dims.len() > MAX_DIMS {
        return Err(GgufError::BadDims {
            tensor: tensor.to_owned(),
            n_dims: dims.len() as u64,
        });
    }
    let bad = |reason| GgufError::BadShape {
        tensor: tensor.to_owned(),
        ne: dims.to_vec(),
        reason,
    };
    // ggml stores dimensions as int64_t and rejects negative ones.
    if dims.iter().any(|&n| i64::try_from(n).is_err()) {
        return Err(bad("a dimension exceeds i64::MAX"));
    }
    let mut ne = [1u64; 4];
    ne[..dims.len()].copy_from_slice(dims);
    // Same left-to-right product as gguf.cpp: the element count must fit in int64_t.
    let count = ne.iter().try_fold(1u64, |acc, &n| {
        acc.checked_mul(n).filter(|&p| i64::try_from(p).is_ok())
    });
    if count.is_none() {
        return Err(bad("the element count overflows i64"));
    }
    if !ne[0].is_multiple_of(dtype.block_size() as u64) {
        return Err(GgufError::NotBlockAligned {
            tensor: tensor.to_owned(),
            dtype,
            ne0: ne[0],
        });
    }
    let nbytes = dtype
        .nbytes(ne)
        .ok_or_else(|| bad("the size in bytes overflows u64"))?;
    Ok((ne, nbytes))
}

pub(super) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

pub(super) fn check_alignment(alignment: u64) -> Result<u64, GgufError> {
    if alignment.is_power_of_two() && alignment <= u64::from(u32::MAX) {
        Ok(alignment)
    } else {
        Err(GgufError::BadAlignment(alignment))
    }
}

/// The alignment a metadata value selects: it must be a valid `u32`.
pub(super) fn alignment_from(value: Option<&Value>) -> Result<u64, GgufError> {
    match value {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) => check_alignment(u64::from(*a)),
        Some(v) => Err(GgufError::WrongType {
            key: ALIGNMENT_KEY.to_owned(),
            expected: "u32",
            found: v.type_name(),
        }),
    }
}
