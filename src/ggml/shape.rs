//! Tensor shapes in ggml order: a plain value, used by the handles and by the errors that
//! describe their operands.

use std::fmt;

/// A tensor's extent in ggml order: `ne[0]` is the innermost (contiguous) dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// Extent of each of the 4 dims in elements, innermost first; unused dims are 1.
    pub ne: [i64; 4],
    /// Dims up to the last one larger than 1 (1 to 4, as `ggml_n_dims`); later dims are 1.
    pub n_dims: usize,
}

impl Shape {
    /// The first `n_dims` extents, innermost first.
    pub fn dims(&self) -> &[i64] {
        &self.ne[..self.n_dims]
    }
    /// Number of elements (product of all four extents).
    pub fn nelements(&self) -> i64 {
        self.ne.iter().product()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dims: Vec<String> = self.dims().iter().map(i64::to_string).collect();
        write!(f, "[{}]", dims.join(", "))
    }
}
