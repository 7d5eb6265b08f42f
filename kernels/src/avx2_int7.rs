//! AVX2 with FMA, the int8 products of quantised files (their linear layers and attention's
//! scores) on activations quantised to 7 bits ([`int8_activation_bits`]); every other kernel
//! runs in [`avx2`].
//!
//! `vpmaddubsw` multiplies unsigned bytes by signed ones and adds the pairs into an i16,
//! saturating: exact for activations offset to 1..127 (x + 64 for x in -63..63) by weights
//! in -128..127 (at most 32,512 in magnitude). With `vpmaddwd` by ones widening the pairs into
//! i32, that is two instructions of the multiply ports per 32 multiply-adds, as the exact
//! route's two `vpmaddwd` on widened bytes; but it needs neither the 6 shifts that widen the
//! weights nor a second broadcast per row, and one add instead of two, so the other ports stop
//! limiting it. Measured on Zen 4 held to AVX2 (`kernel_speed 1 products`, one core, int8
//! panels, DA3-small's block shapes): 171-182 GFLOP/s against 119-138 for the exact route.
//! The offset is undone by each block's correction: the packing's `-128 Σ w`, halved.

mod simd {
    avx2_vectors!();
    avx2_byte_words!();
    /// Activations in -63..63, each byte x + 64.
    pub const Q8_LEVELS: f32 = 63.0;
    pub const Q8_OFFSET: f32 = 64.0;
    /// 6 x 2 sums, two weight vectors, a broadcast and the ones take the 16 registers
    /// (5 x 2 ran as fast).
    pub const Q8_TILE: (usize, usize) = (6, 2);
    /// The start of a block's sums, `-64 Σ w`: half the packing's correction for an
    /// offset of 128 (an even number, so the shift is exact).
    /// # Safety
    /// `correction` is valid for reading LANES words.
    #[inline(always)]
    pub unsafe fn q8_init(correction: *const f32) -> __m256i {
        // SAFETY: as for `q8_load`.
        unsafe { _mm256_srai_epi32::<1>(q8_load(correction)) }
    }
    #[inline(always)]
    pub fn q8_dot(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
        // SAFETY: the instruction set as for `splat`.
        unsafe {
            let pairs = _mm256_maddubs_epi16(x, w);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}
macro_rules! instance_features {
    ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c")] $($item)* };
}
include!("templates/body.rs");
entries!(@int8 target_feature(enable = "avx2,fma,f16c"));
