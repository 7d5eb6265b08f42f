// The kernels, compiled once per instruction set: each instance module (`avx512.rs`,
// `avx2.rs`, `avx2vnni.rs`, `avx2_int7.rs`, `portable.rs`) includes this file, with `simd`
// naming that instance's vector unit, and calls it from functions compiled for those features
// (`entries!`). Everything here is `#[inline(always)]`, so that it is compiled inside those
// functions (with their features), not on its own for the baseline. One template per op
// family, each included here.

use super::{
    bf16_bits, bf16_pair, Config, Packing, PlaneRows, Src, PANEL, Q8_BLOCK, Q8_CORRECTIONS,
    Q8_RECORD, Q8_SCALES,
};
use std::ops::Range;

/// Lanes of the element-wise loops (softmax): the compiler vectorises arrays of this width.
const V: usize = 16;

/// `a * b + c`, fused where the target has FMA (elsewhere `mul_add` is a slow library call).
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if simd::FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

include!("conv.rs");
include!("winograd.rs");
include!("elementwise.rs");
include!("attention.rs");
include!("attention_bf16.rs");
include!("linear.rs");
include!("products.rs");

/// [`exp2_softmax`] for the crate's unit tests.
#[cfg(test)]
#[allow(dead_code)]
pub(super) fn exp2_softmax_for_tests(t: f32) -> f32 {
    exp2_softmax(t)
}

/// [`simd::exp2_softmax`] on a vector of `t`, beside [`exp2_softmax`] on each lane, for the
/// crate's unit tests (through this instance's test entry).
#[cfg(test)]
#[allow(dead_code)]
#[inline(always)]
fn exp2_vector_and_lanes_for_tests(t: [f32; LANES]) -> ([f32; LANES], [f32; LANES]) {
    let vector = simd::to_lanes(simd::exp2_softmax(simd::from_lanes(t)));
    let mut lanes = t;
    for x in &mut lanes {
        *x = exp2_softmax(*x);
    }
    (vector, lanes)
}

/// [`exp`] for the crate's unit tests.
#[cfg(test)]
#[allow(dead_code)]
pub(super) fn exp_for_tests(x: f32) -> f32 {
    exp(x)
}
