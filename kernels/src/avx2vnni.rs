//! AVX2 with FMA and AVX-VNNI (Intel Alder Lake and later, AMD Zen 5): the AVX2 kernels with
//! `vpdpbusd` on 256-bit vectors for the int8 products.

mod simd {
    avx2_vectors!();
    // int8 products as with AVX-512: offset activations, four bytes per lane.
    avx2_byte_words!();
    pub const Q8_LEVELS: f32 = 127.0;
    pub const Q8_OFFSET: f32 = 128.0;
    /// One `vpdpbusd` per product: 3 x 2 sums, their 6 results, two weight vectors and a
    /// broadcast fit the 16 registers.
    pub const Q8_TILE: (usize, usize) = (3, 2);
    /// The start of a block's sums: its correction for the offset.
    /// # Safety
    /// `correction` is valid for reading LANES words.
    #[inline(always)]
    pub unsafe fn q8_init(correction: *const f32) -> __m256i {
        // SAFETY: as for `q8_load`.
        unsafe { q8_load(correction) }
    }
    #[inline(always)]
    pub fn q8_dot(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
        // SAFETY: the instruction set (avxvnni) as for `splat`.
        unsafe { _mm256_dpbusd_avx_epi32(acc, x, w) }
    }
}
macro_rules! instance_features {
    ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c,avxvnni")] $($item)* };
}
include!("templates/body.rs");
entries!(target_feature(enable = "avx2,fma,f16c,avxvnni"));
