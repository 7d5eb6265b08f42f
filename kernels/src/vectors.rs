/// One x86 vector width: its type, lanes, registers and the four intrinsics used. The
/// functions are safe to call only because the module they are expanded into is private to
/// one kernel instance, whose code runs only inside that instance's `run` functions.
///
/// The vector helpers here and in the instances' `simd` modules use no closures around
/// intrinsics: a closure is a function of its own without the instance's features, and
/// where the compiler did not inline one its intrinsics became calls (the 7-bit instance's
/// `q8_bytes` in a build for the baseline target: its int8 layers at 55-85% of their speed).
#[cfg(target_arch = "x86_64")]
macro_rules! x86_vectors {
    ($f:ty, $lanes:expr, $registers:expr, $splat:ident, $fma:ident, $mul:ident, $add:ident, $sub:ident, $div:ident, $min:ident, $max:ident, $load:ident, $store:ident) => {
        use std::arch::x86_64::*;
        pub type F = $f;
        pub const LANES: usize = $lanes;
        pub const REGISTERS: usize = $registers;
        pub const FMA: bool = true;
        #[inline(always)]
        pub fn splat(x: f32) -> F {
            // SAFETY: only reached from this instance's `run` functions, compiled with the
            // instruction set and called only where the CPU has it (see `dispatch!`).
            unsafe { $splat(x) }
        }
        #[inline(always)]
        pub fn fma(a: F, b: F, c: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $fma(a, b, c) }
        }
        #[inline(always)]
        pub fn mul(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $mul(a, b) }
        }
        #[inline(always)]
        pub fn add(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $add(a, b) }
        }
        #[inline(always)]
        pub fn sub(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $sub(a, b) }
        }
        #[inline(always)]
        pub fn div(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $div(a, b) }
        }
        /// `b` where either is NaN, as `minps` does.
        #[inline(always)]
        pub fn min(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $min(a, b) }
        }
        /// `b` where either is NaN, as `maxps` does.
        #[inline(always)]
        pub fn max(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $max(a, b) }
        }
        // The lanes of a vector and back: for the bf16 fallback, which the AVX-512 set lacks.
        #[allow(dead_code)]
        #[inline(always)]
        pub fn to_lanes(v: F) -> [f32; LANES] {
            // SAFETY: a vector is LANES plain f32 values.
            unsafe { std::mem::transmute::<F, [f32; LANES]>(v) }
        }
        #[allow(dead_code)]
        #[inline(always)]
        pub fn from_lanes(lanes: [f32; LANES]) -> F {
            // SAFETY: as above.
            unsafe { std::mem::transmute::<[f32; LANES], F>(lanes) }
        }
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load(p: *const f32) -> F {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { $load(p) }
        }
        /// # Safety
        /// `p` is valid for writing LANES values.
        #[inline(always)]
        pub unsafe fn store(p: *mut f32, v: F) {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { $store(p, v) }
        }
    };
}

/// bf16 pairs multiplied lane by lane in f32, where the vector unit has no bf16 products:
/// nothing asks for them there, but such operands still compute correctly.
macro_rules! bf16_by_lanes {
    () => {
        pub type Bf16Splat = [f32; 2];
        #[inline(always)]
        pub fn bf16_splat(x: u32) -> [f32; 2] {
            super::super::bf16_unpack(x)
        }
        #[inline(always)]
        pub fn bf16_madd(acc: F, [x0, x1]: [f32; 2], b: F) -> F {
            let mut lanes = to_lanes(acc);
            for (a, b) in lanes.iter_mut().zip(to_lanes(b)) {
                let [b0, b1] = super::super::bf16_unpack(b.to_bits());
                *a = x1.mul_add(b1, x0.mul_add(b0, *a));
            }
            from_lanes(lanes)
        }
    };
}

/// The kernel entry points of one instance, as functions with the attribute `$attr` (its
/// `target_feature`; the instance's kernels are `#[inline(always)]`, so they are compiled
/// inside these, with those features).
macro_rules! entries {
    ($attr:meta) => {
        pub(super) mod run {
            use super::*;
            // The direct convolution whatever the kernel's size, and Winograd's whatever the
            // map's, for the tests that compare them.
            #[cfg(test)]
            entries!(@each $attr; conv_direct_planes conv_winograd_planes);
            entries!(@bands $attr; conv_winograd_rows conv_direct_rows conv_direct_rows_bf16
                conv_transpose_rows);
            entries!(@each $attr; conv_same_planes conv_same_planes_bf16 gelu_erf_rows
                bilinear_align_corners_planes concat_rows transpose_rows attention_tokens
                attention_tokens_bf16 attention_tokens_int8 linear_bias_rows linear_bias_gelu_rows
                linear_scaled_residual_rows layer_norm_rows);
        }
    };
    // Only the int8 products (linear layers, attention's scores): the 7-bit int8 instance
    // runs nothing else.
    (@int8 $attr:meta) => {
        pub(super) mod run {
            use super::*;
            entries!(@each $attr; linear_bias_rows linear_bias_gelu_rows
                linear_scaled_residual_rows attention_tokens_int8);
        }
    };
    (@bands $attr:meta; $($name:ident)*) => {
        $(
            #[$attr]
            pub(in super::super) fn $name(
                config: &Config,
                srcs: &[Src<'_>],
                out: &mut PlaneRows<'_>,
                ne: [usize; 4],
                param: f32,
            ) {
                super::$name(config, srcs, out, ne, param)
            }
        )*
    };
    (@each $attr:meta; $($name:ident)*) => {
        $(
            #[$attr]
            pub(in super::super) fn $name(
                config: &Config,
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                super::$name(config, srcs, out, ne, units, param)
            }
        )*
    };
}

/// The AVX2 vector unit the AVX2 sets share: f32 vectors, bf16 pairs lane by lane, and the
/// parts of the int8 products that do not depend on VNNI.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_vectors {
    () => {
        x86_vectors!(
            __m256,
            8,
            16,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_mul_ps,
            _mm256_add_ps,
            _mm256_sub_ps,
            _mm256_div_ps,
            _mm256_min_ps,
            _mm256_max_ps,
            _mm256_loadu_ps,
            _mm256_storeu_ps
        );
        bf16_by_lanes!();
        /// The int8 products' integer sums, eight i32 lanes.
        pub type I = __m256i;
        #[inline(always)]
        pub fn q8_to_f32(i: __m256i) -> F {
            // SAFETY: the instruction set as for `splat`.
            unsafe { _mm256_cvtepi32_ps(i) }
        }
        /// AMX tiles only with the AVX-512 set (every AMX CPU has it).
        pub const AMX_TILES: bool = false;
        /// A vector routine of its own: the body's formula vectorised by the compiler
        /// re-broadcast its six constants from memory for every vector (each broadcast an
        /// operation of a vector port on Zen 4) and started the fit from 0 by a multiply-add.
        pub const EXP2_VECTOR: bool = true;
        /// The body's `exp2_softmax` on a vector, bit for bit: `vroundps` rounds `t` to the
        /// nearest integer `n` (ties to even, as the body's added 1.5 * 2^23 does), the fit
        /// runs on `t - n`, and `2^n` is built in the exponent bits.
        #[inline(always)]
        pub fn exp2_softmax(t: F) -> F {
            // SAFETY: as for `splat`.
            unsafe {
                let t = _mm256_max_ps(t, _mm256_set1_ps(-100.0));
                let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
                let f = _mm256_sub_ps(t, n);
                let mut p = _mm256_set1_ps(super::EXP2_FIT[0]);
                for &c in &super::EXP2_FIT[1..] {
                    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
                }
                let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
                _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased)))
            }
        }
        /// LANES f16 values (bits) from `p`, widened to f32 (F16C).
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load_f16(p: *const u16) -> F {
            // SAFETY: as the caller promises (16 bytes); the instruction set (f16c, which
            // every AVX2 set requires) as for `splat`.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        pub(super) use super::super::to_bf16_pairs;
        /// Values `4 i + j` of `src` (`4 * LANES` of them) as vector `j`, the `i`s in the
        /// lane order 0 2 4 6 1 3 5 7 (two 4 x 4 transposes, one per 128-bit half; the
        /// Winograd transforms treat lanes alike, so their order does not matter as long as
        /// [`interleave4`] undoes it).
        #[inline(always)]
        pub fn deinterleave4(src: &[f32]) -> [F; 4] {
            assert!(src.len() >= 4 * LANES);
            // SAFETY: the assertion covers the four loads; the instruction set as for `splat`.
            unsafe {
                let p = src.as_ptr();
                let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
                let (c, d) = (_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
                transpose_halves(a, b, c, d)
            }
        }
        /// The inverse of [`deinterleave4`]: `dst[4 i + j]` is lane `i` of `v[j]`.
        #[inline(always)]
        pub fn interleave4(v: [F; 4], dst: &mut [f32]) {
            assert!(dst.len() >= 4 * LANES);
            let [a, b, c, d] = v;
            // SAFETY: the assertion covers the four stores; the instruction set as for `splat`.
            unsafe {
                let rows = transpose_halves(a, b, c, d);
                for (i, r) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add(8 * i), r);
                }
            }
        }
        /// A 4 x 4 transpose of each 128-bit half of four vectors, which
        /// [`deinterleave4`] and [`interleave4`] share (it is its own inverse).
        #[inline(always)]
        fn transpose_halves(a: F, b: F, c: F, d: F) -> [F; 4] {
            // SAFETY: the instruction set as for `splat`.
            unsafe {
                let (ab_lo, ab_hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
                let (cd_lo, cd_hi) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
                [
                    _mm256_shuffle_ps::<0x44>(ab_lo, cd_lo),
                    _mm256_shuffle_ps::<0xEE>(ab_lo, cd_lo),
                    _mm256_shuffle_ps::<0x44>(ab_hi, cd_hi),
                    _mm256_shuffle_ps::<0xEE>(ab_hi, cd_hi),
                ]
            }
        }
        /// The largest magnitude of a block.
        #[inline(always)]
        pub fn q8_max(values: &[f32; 32]) -> f32 {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32 values.
            unsafe {
                let sign = _mm256_set1_ps(-0.0);
                let mut v = [sign; 4];
                for (i, v) in v.iter_mut().enumerate() {
                    *v = _mm256_andnot_ps(sign, _mm256_loadu_ps(values.as_ptr().add(8 * i)));
                }
                let m = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
            }
        }
        /// The low bytes of the bits of `v * inverse + shift` for a block.
        #[inline(always)]
        pub fn q8_bytes(values: &[f32; 32], inverse: f32, shift: f32) -> [u8; 32] {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32
            // values and the store writes the 32 bytes of `out`.
            unsafe {
                let (m, s) = (_mm256_set1_ps(inverse), _mm256_set1_ps(shift));
                let low = _mm256_set1_epi32(0xff);
                let mut v = [_mm256_setzero_si256(); 4];
                for (i, v) in v.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(values.as_ptr().add(8 * i));
                    let bits = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(x, m), s));
                    *v = _mm256_and_si256(bits, low);
                }
                // Bytes 0..255 pass both unsigned packs unchanged; the packs work per
                // 128-bit half, so the dwords come out as a0 b0 c0 d0 | a1 b1 c1 d1.
                let packed = _mm256_packus_epi16(
                    _mm256_packus_epi32(v[0], v[1]),
                    _mm256_packus_epi32(v[2], v[3]),
                );
                let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
                let bytes = _mm256_permutevar8x32_epi32(packed, order);
                let mut out = [0u8; 32];
                _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, bytes);
                out
            }
        }
    };
}

/// The int8 operands of the AVX2 sets that multiply bytes as they are (`vpdpbusd`,
/// `vpmaddubsw`): weight vectors loaded as stored, activation words of four bytes broadcast.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_byte_words {
    () => {
        pub type Q8Weights = __m256i;
        /// An activation word as the tile reads it: four bytes.
        pub type Q8Word = u32;
        #[inline(always)]
        pub fn q8_word(bytes: u32) -> u32 {
            bytes
        }
        /// # Safety
        /// `p` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_load(p: *const f32) -> __m256i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm256_loadu_si256(p as *const __m256i) }
        }
        /// # Safety
        /// `x` is valid for reading.
        #[inline(always)]
        pub unsafe fn q8_splat(x: *const u32) -> __m256i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm256_set1_epi32(x.read() as i32) }
        }
    };
}

/// Runs kernel `$name` with `$args` in the instance of `$set`, which must be a [`Config`]'s
/// set or, in its place where that is the AVX-512 set, the AVX2 one (`set_for_width`).
///
/// [`Config`]: crate::Config
macro_rules! run_in {
    ($set:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $set {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a Config names this set only where Cpu::detect found avx512f,
            // avx512bf16, avx512vnni, avx2, fma and f16c, this instance's features.
            $crate::KernelSet::Avx512Bf16 => unsafe { $crate::avx512::run::$name($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: a Config names this set only where the CPU has avx2, fma, f16c and
            // avxvnni (Cpu::runs).
            $crate::KernelSet::Avx2Vnni => unsafe { $crate::avx2vnni::run::$name($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has avx2, fma and f16c: a Config names this set only where
            // Cpu::detect found at least them, and set_for_width only in place of the AVX-512
            // set, which detect finds only with them.
            $crate::KernelSet::Avx2 => unsafe { $crate::avx2::run::$name($($arg),*) },
            _ => $crate::portable::run::$name($($arg),*),
        }
    };
}

/// Calls `$f::<R>($args)` for a group of `$rows` output channels, with `R` the register
/// tile's rows for it: `CONV_CHANNELS`, 4, 2 or 1, the sizes the convolutions'
/// `channel_groups` makes (`CONV_CHANNELS` is the calling instance's).
macro_rules! by_group_rows {
    ($rows:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $rows {
            r if r == CONV_CHANNELS => $f::<CONV_CHANNELS>($($arg),*),
            4 => $f::<4>($($arg),*),
            2 => $f::<2>($($arg),*),
            _ => $f::<1>($($arg),*),
        }
    };
}
