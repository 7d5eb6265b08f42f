//! AVX2 with FMA.

mod simd {
    avx2_vectors!();
    // int8 products without VNNI on ggml's 8-bit activations (`DA3_INT8_ACTIVATION_BITS=8`;
    // by default this set's int8 layers run in `avx2_int7`), by `vpmaddwd` on bytes
    // widened to i16: each lane sums two exact products into i32, 16 multiply-adds per
    // instruction. The `vpmaddubsw` route (unsigned by signed bytes in pairs saturating
    // at i16, so |w| and x with w's sign, then `vpmaddwd` by ones) takes three
    // instructions per 32 multiply-adds, and measured on Zen 4 `vpsignb`, `vpmaddubsw`
    // and `vpmaddwd` all issue on the same two ports, two per cycle together; the shifts
    // that widen the bytes here issue on others.
    //
    // A weight word holds bytes k .. k + 3 of one column, a lane per column. Its 16-bit
    // halves shifted left by 8 then arithmetically right by 8 give (k, k + 2) as i16,
    // shifted right by 8 alone (k + 1, k + 3): two `vpmaddwd` against the activations'
    // (x_k, x_k+2) and (x_k+1, x_k+3), each broadcast as a 32-bit pair, sum the word's
    // four products into the column's lane.
    /// A vector of weights as its (k, k + 2) and (k + 1, k + 3) pairs of i16.
    pub type Q8Weights = (__m256i, __m256i);
    /// An activation word: (x_k, x_k+2) then (x_k+1, x_k+3), each value an i16.
    pub type Q8Word = u64;
    pub const Q8_LEVELS: f32 = 127.0;
    pub const Q8_OFFSET: f32 = 0.0;
    /// Four signed bytes (k .. k + 3) as the pairs of i16 the tile broadcasts.
    #[inline(always)]
    pub fn q8_word(bytes: u32) -> u64 {
        let [b0, b1, b2, b3] = bytes.to_le_bytes().map(|b| b as i8 as i16 as u16 as u64);
        b0 | b2 << 16 | b1 << 32 | b3 << 48
    }
    /// # Safety
    /// `p` is valid for reading LANES words.
    #[inline(always)]
    pub unsafe fn q8_load(p: *const f32) -> Q8Weights {
        // SAFETY: as the caller promises; the instruction set as for `splat`.
        unsafe {
            let w = _mm256_loadu_si256(p as *const __m256i);
            (
                _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w)),
                _mm256_srai_epi16::<8>(w),
            )
        }
    }
    /// # Safety
    /// Reads nothing: without the offset, blocks start from zero.
    #[inline(always)]
    pub unsafe fn q8_init(_correction: *const f32) -> __m256i {
        // SAFETY: the instruction set as for `splat`.
        unsafe { _mm256_setzero_si256() }
    }
    /// Broadcast from memory, each half by its own load: a 64-bit value taken into a
    /// general register first costs two moves and two shuffles per row.
    /// # Safety
    /// `x` is valid for reading.
    #[inline(always)]
    pub unsafe fn q8_splat(x: *const u64) -> (__m256i, __m256i) {
        // SAFETY: as the caller promises, `x` holds two 32-bit halves; the instruction
        // set as for `splat`.
        unsafe {
            let halves = x as *const i32;
            (
                _mm256_set1_epi32(halves.read_unaligned()),
                _mm256_set1_epi32(halves.add(1).read_unaligned()),
            )
        }
    }
    #[inline(always)]
    pub fn q8_dot(
        acc: __m256i,
        (x_even, x_odd): (__m256i, __m256i),
        (w_even, w_odd): Q8Weights,
    ) -> __m256i {
        // SAFETY: the instruction set as for `splat`.
        unsafe {
            let even = _mm256_madd_epi16(w_even, x_even);
            _mm256_add_epi32(_mm256_add_epi32(acc, even), _mm256_madd_epi16(w_odd, x_odd))
        }
    }
    /// Five rows of two vectors of columns: 10 sums, 4 weight vectors and a row's two
    /// activation pairs take the 16 registers (the f32 results wait in memory between
    /// blocks of 32 inputs). Each broadcast then feeds two products: counting Zen 4's
    /// broadcasts from memory as vector operations predicted each tile's speed (about 18
    /// multiply-adds per cycle for 6 x 1, 20 for 5 x 2), and this ran 125-140 GFLOP/s on
    /// one core against 106-134 for 6 x 1 and 4 x 1 (DA3's 865 tokens are 173 groups).
    pub const Q8_TILE: (usize, usize) = (5, 2);
}
macro_rules! instance_features {
    ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c")] $($item)* };
}
include!("templates/body.rs");
entries!(target_feature(enable = "avx2,fma,f16c"));
/// [`exp2_vector_and_lanes_for_tests`] compiled with this set's features.
///
/// # Safety
/// The CPU has the features of this set.
#[cfg(test)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn exp2_lanes_for_tests(t: [f32; 8]) -> ([f32; 8], [f32; 8]) {
    exp2_vector_and_lanes_for_tests(t)
}
