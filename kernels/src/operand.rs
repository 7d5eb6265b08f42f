//! The operands of a kernel call: sources as slices with ggml's shape and strides ([`Src`]),
//! and a band of a result's rows that one thread writes ([`PlaneRows`]).

use std::ops::Range;

/// How a source's values are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// f32 values.
    F32,
    /// A weight packed as f16 panels: two halves per word ([`crate::pack_panels`] rounded).
    F16,
    /// A weight packed as pairs of bf16, one per word ([`crate::pack_panels_bf16`]).
    Bf16Pairs,
    /// A q8_0 weight packed as records for int8 products ([`crate::pack_panels_q8`]).
    Q8Records,
}

/// An operand as a kernel sees it: f32 data from its first value to its last, ggml's shape
/// and its strides in values (contiguous rows: `nb[0]` is 1).
#[derive(Clone, Copy)]
pub struct Src<'a> {
    pub data: &'a [f32],
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    /// f32, or for a packed weight (read through `data` as words) how it was packed.
    pub packing: Packing,
}

impl Src<'_> {
    /// The data as f16 bits, two per word (a weight packed as f16 panels).
    pub fn halves(&self) -> &[u16] {
        // SAFETY: `data` is a live slice of f32, 4-byte aligned and so 2-byte aligned; its
        // bytes read as twice as many u16 cover exactly the same memory, borrowed as long.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u16, self.data.len() * 2) }
    }
}

/// Rows `rows` of every plane of a result of `planes` planes of `width` x `height`, written
/// by one thread: a map split among threads by rows, not by planes (a kernel whose work on
/// a row serves every output channel, Winograd's input transform, would otherwise repeat it
/// on each thread).
pub struct PlaneRows<'a> {
    data: *mut f32,
    shape: [usize; 3],
    rows: Range<usize>,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> PlaneRows<'a> {
    /// Every row of the `planes` planes of `width` x `height` in `data`.
    pub fn whole(data: &'a mut [f32], [width, height, planes]: [usize; 3]) -> Self {
        let len = width
            .checked_mul(height)
            .and_then(|n| n.checked_mul(planes));
        assert!(
            len.is_some_and(|len| data.len() >= len),
            "planes past the result"
        );
        PlaneRows {
            data: data.as_mut_ptr(),
            shape: [width, height, planes],
            rows: 0..height,
            _borrow: std::marker::PhantomData,
        }
    }

    /// Rows `rows` of the planes at `data`.
    ///
    /// # Safety
    /// `data` holds `width * height * planes` f32 values, valid for writes for `'a`, and no
    /// other reference to rows `rows` of any plane is used for `'a` (other threads' bands
    /// cover other rows).
    pub unsafe fn band(
        data: *mut f32,
        [width, height, planes]: [usize; 3],
        rows: Range<usize>,
    ) -> Self {
        PlaneRows {
            data,
            shape: [width, height, planes],
            rows: rows.start.min(height)..rows.end.min(height),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Only rows `rows` of these (what a thread would be given).
    pub fn narrowed(self, rows: Range<usize>) -> Self {
        let start = rows.start.clamp(self.rows.start, self.rows.end);
        PlaneRows {
            rows: start..rows.end.clamp(start, self.rows.end),
            ..self
        }
    }

    /// The rows this band may write.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// Row `y` (one of [`PlaneRows::rows`]) of plane `plane`.
    pub fn row_mut(&mut self, plane: usize, y: usize) -> &mut [f32] {
        let [width, height, planes] = self.shape;
        assert!(
            plane < planes && self.rows.contains(&y),
            "row {y} of plane {plane} outside rows {:?} of {planes} planes",
            self.rows
        );
        // SAFETY: within the `width * height * planes` values at `data` (plane < planes,
        // y < height), a row of this band, which no one else uses for 'a (`whole` holds the
        // only borrow of them; `band`'s caller keeps other threads to other rows); `&mut
        // self` keeps one row at a time.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.add((plane * height + y) * width), width)
        }
    }
}
