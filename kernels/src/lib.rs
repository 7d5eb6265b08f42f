//! CPU kernels for DA3's graphs: linear layers (f32, f16, bf16 and int8 products, AMX tiles),
//! attention (f32, bf16, int8), direct and Winograd convolutions, transposed convolutions,
//! LayerNorm, GELU, bilinear resampling and layout copies. Safe Rust over slices, except the
//! register tiles and vector helpers, written with intrinsics. No knowledge of ggml or of the
//! model: a kernel takes its operands as [`Src`] slices with ggml-style shapes and strides,
//! writes a range of its result, and runs with a [`Config`] its caller decided once.
//!
//! The kernels (`templates/`) are compiled once per instruction set — AVX-512 with BF16 and
//! VNNI ([`KernelSet::Avx512Bf16`]), AVX2 with FMA and AVX-VNNI, AVX2 with FMA, and portable
//! arrays — each inside functions enabling those features (`#[target_feature]`); which one
//! runs is the [`Config`]'s set, found from what the CPU has ([`Cpu::detect`]), not from the
//! features the crate was built with. So a build for the baseline x86-64 target runs the AVX2
//! or AVX-512 kernels on a CPU that has them.
//!
//! ```
//! use da3_kernels::{Config, Cpu, KernelSet, Request};
//! let cpu = Cpu::detect();
//! let config = Config::new(&cpu, &Request { set: Some(KernelSet::Avx2), ..Request::default() });
//! assert!(cpu.runs(config.set()));
//! ```

// The instruction-set vocabularies' macros and the dispatch macros, defined before the
// modules that expand them.
#[macro_use]
mod vectors;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
mod avx2_int7;
#[cfg(target_arch = "x86_64")]
mod avx2vnni;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod cpu;
mod dispatch;
mod operand;
mod packing;
mod portable;
mod scratch;
#[cfg(test)]
mod tests;

pub use cpu::{amx_convolution_fits, Config, Cpu, KernelSet, Request};
pub use dispatch::{
    attention_tokens, attention_tokens_bf16, attention_tokens_int8, bilinear_align_corners_planes,
    concat_rows, conv_direct_rows, conv_direct_rows_bf16, conv_same_planes, conv_same_planes_bf16,
    conv_transpose_rows, conv_winograd_rows, gelu_erf_rows, layer_norm_rows, linear_bias_gelu_rows,
    linear_bias_rows, linear_scaled_residual_rows, transpose_rows, winograd_pays, WINOGRAD_TILE,
};
pub use operand::{Packing, PlaneRows, Src};
pub use packing::{
    pack_panels, pack_panels_bf16, pack_panels_q8, q8_record_column, to_bf16_pairs, Q8_BLOCK,
    Q8_RECORD,
};

use packing::{bf16_bits, bf16_pair, bf16_unpack, prefetch_part, Q8_CORRECTIONS, Q8_SCALES};
use scratch::Scratch;
#[allow(unused_imports)]
use scratch::{SCRATCH_0, SCRATCH_1, SCRATCH_2, SCRATCH_3, SCRATCH_PAIRS_0, SCRATCH_PAIRS_1};

/// Output columns per panel of a packed matrix-product weight: the same for every kernel
/// set (two AVX-512 vectors, four AVX2 ones), so that packed weights do not depend on the
/// CPU.
pub const PANEL: usize = 32;
/// The attention kernel takes value rows of whole vectors of every set.
pub const ATTENTION_DV_MULTIPLE: usize = 16;

/// A kernel that writes units `units` of a result of shape `ne` into `out`, which holds
/// exactly those (rows of `ne[0]` values or planes of `ne[0] * ne[1]`, as the kernel
/// documents); `param` is the kernel's scalar parameter (an epsilon), unused by most.
pub type KernelFn = fn(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
);

/// A kernel that writes the rows `out` holds of a result of shape `ne` (one item of a batch);
/// `param` as for [`KernelFn`].
pub type BandFn =
    fn(config: &Config, srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32);

use std::ops::Range;
