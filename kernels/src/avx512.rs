//! AVX-512 with BF16 products.

mod simd {
    x86_vectors!(
        __m512,
        16,
        32,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_mul_ps,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_div_ps,
        _mm512_min_ps,
        _mm512_max_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps
    );
    /// Whether [`exp2_softmax`] is a vector routine of its own (else the body's formula
    /// lane by lane, which the compiler vectorises in its loops anyway).
    pub const EXP2_VECTOR: bool = true;
    /// The body's `exp2_softmax` on a vector, the same fit and the same rounding of `t`
    /// to the nearest integer `n`, with `vroundscaleps` for that and `vscalefps` for
    /// `p * 2^n` (no integer arithmetic on the exponent bits): 9 instructions per
    /// vector against 14, in the f32 attention's softmax.
    #[inline(always)]
    pub fn exp2_softmax(t: F) -> F {
        // SAFETY: as for `splat`.
        unsafe {
            let t = _mm512_max_ps(t, _mm512_set1_ps(-100.0));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
            let f = _mm512_sub_ps(t, n);
            let mut p = _mm512_set1_ps(super::EXP2_FIT[0]);
            for &c in &super::EXP2_FIT[1..] {
                p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
            }
            _mm512_scalef_ps(p, n)
        }
    }
    /// LANES f16 values (bits) from `p`, widened to f32.
    /// # Safety
    /// `p` is valid for reading LANES values.
    #[inline(always)]
    pub unsafe fn load_f16(p: *const u16) -> F {
        // SAFETY: as the caller promises (32 bytes); the instruction set as for `splat`.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
    /// The bf16 linear products run on AMX tiles where the CPU has them
    /// ([`crate::Config::amx_tiles`]): every AMX CPU has this set's features.
    pub const AMX_TILES: bool = true;
    /// [`super::super::to_bf16_pairs`] 16 values per `vcvtneps2bf16`, which rounds to
    /// nearest even as well (and flushes subnormals to zero).
    #[inline(always)]
    pub fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
        let whole = src.len() / LANES * LANES;
        for (chunk, words) in src[..whole]
            .chunks_exact(LANES)
            .zip(dst.chunks_exact_mut(LANES / 2))
        {
            // SAFETY: the load reads the 16 values of `chunk`, the store writes the 8
            // words of `words`; the instruction set (avx512bf16) as for `splat`.
            unsafe {
                let pairs = _mm512_cvtneps_pbh(_mm512_loadu_ps(chunk.as_ptr()));
                _mm256_storeu_si256(
                    words.as_mut_ptr() as *mut __m256i,
                    std::mem::transmute::<__m256bh, __m256i>(pairs),
                );
            }
        }
        if let Some(rest) = dst.get_mut(whole / 2..) {
            super::super::to_bf16_pairs(&src[whole..], rest);
        }
    }
    /// Values `4 i + j` of `src` (`4 * LANES` of them) as vector `j`, the `i`s in the
    /// lane order 0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15 (a 4 x 4 transpose per 128-bit
    /// quarter; see the AVX2 set's).
    #[inline(always)]
    pub fn deinterleave4(src: &[f32]) -> [F; 4] {
        assert!(src.len() >= 4 * LANES);
        // SAFETY: the assertion covers the four loads; the instruction set as for `splat`.
        unsafe {
            let p = src.as_ptr();
            let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
            let (c, d) = (_mm512_loadu_ps(p.add(32)), _mm512_loadu_ps(p.add(48)));
            transpose_quarters(a, b, c, d)
        }
    }
    /// The inverse of [`deinterleave4`]: `dst[4 i + j]` is lane `i` of `v[j]`.
    #[inline(always)]
    pub fn interleave4(v: [F; 4], dst: &mut [f32]) {
        assert!(dst.len() >= 4 * LANES);
        let [a, b, c, d] = v;
        // SAFETY: the assertion covers the four stores; the instruction set as for `splat`.
        unsafe {
            let rows = transpose_quarters(a, b, c, d);
            for (i, r) in rows.into_iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add(16 * i), r);
            }
        }
    }
    /// A 4 x 4 transpose of each 128-bit quarter of four vectors (its own inverse).
    #[inline(always)]
    fn transpose_quarters(a: F, b: F, c: F, d: F) -> [F; 4] {
        // SAFETY: the instruction set as for `splat`.
        unsafe {
            let (ab_lo, ab_hi) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
            let (cd_lo, cd_hi) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
            [
                _mm512_shuffle_ps::<0x44>(ab_lo, cd_lo),
                _mm512_shuffle_ps::<0xEE>(ab_lo, cd_lo),
                _mm512_shuffle_ps::<0x44>(ab_hi, cd_hi),
                _mm512_shuffle_ps::<0xEE>(ab_hi, cd_hi),
            ]
        }
    }
    pub type Bf16Splat = __m512bh;
    #[inline(always)]
    pub fn bf16_splat(x: u32) -> __m512bh {
        // SAFETY: the instruction set as for `splat`; the transmute reads 16 words as 32
        // bf16 values.
        unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x as i32)) }
    }
    #[inline(always)]
    pub fn bf16_madd(acc: F, x: __m512bh, b: F) -> F {
        // SAFETY: the instruction set (avx512bf16) as for `splat`; the transmute as above.
        unsafe { _mm512_dpbf16_ps(acc, x, std::mem::transmute::<F, __m512bh>(b)) }
    }
    // int8 products: activations offset to unsigned bytes, four per lane per `vpdpbusd`.
    pub type I = __m512i;
    pub type Q8Weights = __m512i;
    /// An activation word as the tile reads it: four bytes.
    pub type Q8Word = u32;
    pub const Q8_LEVELS: f32 = 127.0;
    /// Added to the activations: `vpdpbusd` multiplies unsigned bytes by signed ones.
    pub const Q8_OFFSET: f32 = 128.0;
    #[inline(always)]
    pub fn q8_word(bytes: u32) -> u32 {
        bytes
    }
    /// 6 x 2 integer sums with 12 f32 results take 24 of the 32 registers.
    pub const Q8_TILE: (usize, usize) = (6, 2);
    /// # Safety
    /// `p` is valid for reading LANES words.
    #[inline(always)]
    pub unsafe fn q8_load(p: *const f32) -> __m512i {
        // SAFETY: as the caller promises; the instruction set as for `splat`.
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    /// The start of a block's sums: its correction for the offset (see `Q8_OFFSET`).
    /// # Safety
    /// `correction` is valid for reading LANES words.
    #[inline(always)]
    pub unsafe fn q8_init(correction: *const f32) -> __m512i {
        // SAFETY: as for `q8_load`.
        unsafe { q8_load(correction) }
    }
    /// # Safety
    /// `x` is valid for reading.
    #[inline(always)]
    pub unsafe fn q8_splat(x: *const u32) -> __m512i {
        // SAFETY: as the caller promises; the instruction set as for `splat`.
        unsafe { _mm512_set1_epi32(x.read() as i32) }
    }
    #[inline(always)]
    pub fn q8_dot(acc: __m512i, x: __m512i, w: __m512i) -> __m512i {
        // SAFETY: the instruction set (avx512vnni) as for `splat`.
        unsafe { _mm512_dpbusd_epi32(acc, x, w) }
    }
    #[inline(always)]
    pub fn q8_to_f32(i: __m512i) -> F {
        // SAFETY: the instruction set as for `splat`.
        unsafe { _mm512_cvtepi32_ps(i) }
    }
    /// The largest magnitude of a block.
    #[inline(always)]
    pub fn q8_max(values: &[f32; 32]) -> f32 {
        // SAFETY: the instruction set as for `splat`; the loads read the block's 32 values.
        unsafe {
            let a = _mm512_abs_ps(_mm512_loadu_ps(values.as_ptr()));
            let b = _mm512_abs_ps(_mm512_loadu_ps(values.as_ptr().add(16)));
            _mm512_reduce_max_ps(_mm512_max_ps(a, b))
        }
    }
    /// The low bytes of the bits of `v * inverse + shift` for a block.
    #[inline(always)]
    pub fn q8_bytes(values: &[f32; 32], inverse: f32, shift: f32) -> [u8; 32] {
        // SAFETY: the instruction set as for `splat`; the loads read the block's 32
        // values and the stores write the 32 bytes of `out`.
        unsafe {
            let (m, s) = (_mm512_set1_ps(inverse), _mm512_set1_ps(shift));
            let mut out = [0u8; 32];
            for h in 0..2 {
                let v = _mm512_add_ps(
                    _mm512_mul_ps(_mm512_loadu_ps(values.as_ptr().add(16 * h)), m),
                    s,
                );
                let bytes = _mm512_cvtepi32_epi8(_mm512_castps_si512(v));
                _mm_storeu_si128(out.as_mut_ptr().add(16 * h) as *mut __m128i, bytes);
            }
            out
        }
    }
}
macro_rules! instance_features {
    ($($item:tt)*) => { #[target_feature(enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c")] $($item)* };
}
include!("templates/body.rs");
entries!(target_feature(
    enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c"
));
/// [`exp2_vector_and_lanes_for_tests`] compiled with this set's features.
///
/// # Safety
/// The CPU has the features of this set.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn exp2_lanes_for_tests(t: [f32; 16]) -> ([f32; 16], [f32; 16]) {
    exp2_vector_and_lanes_for_tests(t)
}
