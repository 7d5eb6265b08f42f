//! The kernels' entry points: each runs one instance, the one its [`Config`] names (or, for
//! a few convolutions on AMD Zen 4, the AVX2 one where it pads a narrow map's rows less).

use super::{Config, KernelSet, Packing, PlaneRows, Src};
use std::ops::Range;

/// Output rows (and columns) of a Winograd tile: [`conv_winograd_rows`] is shared among
/// threads by bands of this many rows.
pub const WINOGRAD_TILE: usize = 4;

/// Whether a 3x3 convolution over a `w` x `h` map is faster by Winograd's F(4x4, 3x3) than
/// by the direct kernel, in the instance that runs it (`winograd_set`: its vectors pad the
/// rows of tiles).
pub fn winograd_pays(config: &Config, w: usize, h: usize) -> bool {
    match winograd_set(config, w) {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512Bf16 => super::avx512::winograd_pays(w, h),
        _ => super::portable::winograd_pays(w, h),
    }
}

/// The instance that runs Winograd over a map `w` pixels wide ([`set_for_width`]). On Zen 4
/// (2 threads), 144x96 128 -> 128 channels took 7.2 ms in AVX2 against 8.8 in AVX-512 (rows
/// padded to 160 pixels against 192), 72x48 2.6 against 3.3 (96 against 128); at 504 wide
/// (512 either way) 13.1 against 12.6.
fn winograd_set(config: &Config, w: usize) -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    return set_for_width(
        config,
        w,
        super::avx512::WINO_ROW_STEP,
        super::avx2::WINO_ROW_STEP,
    );
    #[cfg(not(target_arch = "x86_64"))]
    config.set()
}

/// The instance that runs the direct convolution over a map `w` pixels wide
/// ([`set_for_width`]): on Zen 4, 18x12 768 -> 128 channels took 3.3 ms in AVX2 (rows of 32
/// pixels) against 4.7 in AVX-512 (48).
fn direct_set(config: &Config, w: usize) -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    return set_for_width(
        config,
        w,
        super::avx512::CONV_ROW_STEP,
        super::avx2::CONV_ROW_STEP,
    );
    #[cfg(not(target_arch = "x86_64"))]
    config.set()
}

/// `config`'s set, but on AMD Zen 4 the AVX2 instance for a map `w` pixels wide where its
/// narrower vectors pad each row less (rows padded to `wide_step` pixels in AVX-512,
/// `narrow_step` in AVX2): the padding is computed and dropped, and Zen 4 runs AVX-512 as two
/// halves, so a vector of 16 lanes does no more than two of 8. (Where 512-bit vectors run
/// whole, as on Intel's AVX-512 cores, they stay: twice the work per instruction outweighs
/// the padding.)
#[cfg(target_arch = "x86_64")]
fn set_for_width(config: &Config, w: usize, wide_step: usize, narrow_step: usize) -> KernelSet {
    let set = config.set();
    let padded = |step: usize| w.div_ceil(step) * step;
    // A Config has the AVX-512 set only where the CPU also has AVX2, FMA and F16C
    // (Cpu::detect), which the AVX2 instance needs.
    if set == KernelSet::Avx512Bf16
        && padded(narrow_step) < padded(wide_step)
        && config.narrow_vectors_on_padding()
    {
        return KernelSet::Avx2;
    }
    set
}

/// The direct convolution of the rows `out` holds, in the instance `direct_set` picks for
/// the map's width.
pub fn conv_direct_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(
        direct_set(config, ne[0]),
        conv_direct_rows(config, srcs, out, ne, param)
    )
}

/// The transposed convolution of disjoint patches.
pub fn conv_transpose_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(
        config.set(),
        conv_transpose_rows(config, srcs, out, ne, param)
    )
}

/// [`conv_direct_rows`] with bf16 products.
pub fn conv_direct_rows_bf16(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(
        config.set(),
        conv_direct_rows_bf16(config, srcs, out, ne, param)
    )
}

/// The direct (or, on large maps, Winograd) convolution of output channels `channels`, in
/// the instance `direct_set` picks for the map's width.
pub fn conv_same_planes(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    run_in!(
        direct_set(config, ne[0]),
        conv_same_planes(config, srcs, out, ne, channels, param)
    )
}

/// Winograd's 3x3 convolution of the rows `out` holds, in the instance `winograd_set`
/// picks for the map's width.
pub fn conv_winograd_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(
        winograd_set(config, ne[0]),
        conv_winograd_rows(config, srcs, out, ne, param)
    )
}

/// Entry points running the instance of their [`Config`]'s set.
macro_rules! dispatch {
    ($($(#[$doc:meta])* $name:ident)*) => {
        $(
            $(#[$doc])*
            pub fn $name(
                config: &Config,
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                run_in!(config.set(), $name(config, srcs, out, ne, units, param))
            }
        )*
    };
}

dispatch!(
    /// [`conv_same_planes`] with bf16 products.
    conv_same_planes_bf16
    /// GELU (erf form) of rows.
    gelu_erf_rows
    /// Bilinear resampling with aligned corners of planes (plus a separable offset).
    bilinear_align_corners_planes
    /// Rows of the first source followed by those of the second.
    concat_rows
    /// A contiguous copy of a transposed matrix, by tiles.
    transpose_rows
    /// Attention in f32 over tokens (queries) `units`.
    attention_tokens
    /// Attention with bf16 products.
    attention_tokens_bf16
    /// LayerNorm of rows.
    layer_norm_rows
);

/// Entry points that may run int8 products (`$int8(srcs)` says whether a call does): as
/// [`dispatch!`]'s, except that the int8 products of the AVX2 set take 7-bit activations
/// where the [`Config`] says so.
macro_rules! dispatch_int8 {
    ($int8:expr; $($(#[$doc:meta])* $name:ident)*) => {
        $(
            $(#[$doc])*
            pub fn $name(
                config: &Config,
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                #[cfg(target_arch = "x86_64")]
                if $int8(srcs) && config.int8_activation_bits() == 7 {
                    // SAFETY: a Config takes 7 bits only in the AVX2 set, which it names only
                    // where the CPU has avx2, fma and f16c (Config::new from Cpu::detect), the
                    // features of this instance.
                    return unsafe {
                        super::avx2_int7::run::$name(config, srcs, out, ne, units, param)
                    };
                }
                run_in!(config.set(), $name(config, srcs, out, ne, units, param))
            }
        )*
    };
}

// Linear layers take int8 products for weights packed for them; attention's int8 kernel
// always does.
dispatch_int8!(|srcs: &[Src<'_>]| srcs[0].packing == Packing::Q8Records;
    /// A linear layer plus bias over rows `units` of the input.
    linear_bias_rows
    /// [`linear_bias_rows`], then GELU (erf form).
    linear_bias_gelu_rows
    /// `residual + scale * (linear + bias)`: a linear layer with its LayerScale and residual.
    linear_scaled_residual_rows
);
dispatch_int8!(|_: &[Src<'_>]| true;
    /// Attention with int8 scores and weighted values (quantised files).
    attention_tokens_int8
);
