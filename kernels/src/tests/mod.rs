//! The kernels against their definitions, in every instance this CPU runs.

use super::*;
use std::ops::Range;

/// The kernels' configuration in these tests: this CPU's defaults (Winograd on, AMX tiles
/// where the CPU and OS have them).
fn config() -> Config {
    Config::detect()
}

/// Deterministic values in [-2, 2).
fn values_2(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 4.0 - 2.0
        })
        .collect()
}

/// The largest absolute difference of two equally long slices.
fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// `values` (rows of `k`) as ggml's q8_0 blocks, by its reference quantiser: per 32 values
/// the scale `max |x| / 127` as f16, then `round(x / scale)` as signed bytes.
fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / Q8_BLOCK * (2 + Q8_BLOCK));
    for block in values.chunks_exact(Q8_BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        out.extend(half::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|v| (v * id).round() as i8 as u8));
    }
    out
}

// The portable instance's entries (it runs everywhere), with [`config`].
fn portable_attention_tokens(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::attention_tokens(&config(), srcs, out, ne, units, param)
}
fn portable_attention_tokens_bf16(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::attention_tokens_bf16(&config(), srcs, out, ne, units, param)
}
fn portable_attention_tokens_int8(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::attention_tokens_int8(&config(), srcs, out, ne, units, param)
}
fn portable_conv_direct_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::conv_direct_planes(&config(), srcs, out, ne, units, param)
}
fn portable_conv_same_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::conv_same_planes(&config(), srcs, out, ne, units, param)
}
fn portable_conv_same_planes_bf16(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::conv_same_planes_bf16(&config(), srcs, out, ne, units, param)
}
fn portable_conv_winograd_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::conv_winograd_planes(&config(), srcs, out, ne, units, param)
}
fn portable_conv_winograd_rows(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    super::portable::run::conv_winograd_rows(&config(), srcs, out, ne, param)
}
fn portable_gelu_erf_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::gelu_erf_rows(&config(), srcs, out, ne, units, param)
}
fn portable_linear_bias_gelu_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::linear_bias_gelu_rows(&config(), srcs, out, ne, units, param)
}
fn portable_linear_bias_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::linear_bias_rows(&config(), srcs, out, ne, units, param)
}
fn portable_linear_scaled_residual_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    units: Range<usize>,
    param: f32,
) {
    super::portable::run::linear_scaled_residual_rows(&config(), srcs, out, ne, units, param)
}
#[test]
fn exp_is_accurate_and_flushes_before_subnormals() {
    let mut x = 0.0f32;
    while x > -90.0 {
        let ours = super::portable::exp_for_tests(x);
        if x < -60.0 {
            assert_eq!(ours, 0.0, "exp({x})");
        } else {
            let exact = (x as f64).exp() as f32;
            let ulps = (ours.to_bits() as i64 - exact.to_bits() as i64).abs();
            assert!(ulps <= 2, "exp({x}) = {ours}, exact {exact}: {ulps} ulp");
        }
        assert!(
            ours == 0.0 || ours.is_normal(),
            "exp({x}) = {ours} is subnormal"
        );
        x -= 0.0137;
    }
}

/// The vector 2^t of the AVX-512 set (rounding and scaling by `vroundscaleps` and
/// `vscalefps`) and of the AVX2 one (`vroundps`, exponent bits) equal the formula lane by
/// lane, bit for bit, from 0 past the clamp, ties of the rounding (t = -0.5, -1.5, ...)
/// and a NaN (the clamp's -100) included.
#[cfg(target_arch = "x86_64")]
#[test]
fn vector_exp2_equals_the_formula() {
    let avx512 = Cpu::detect().best() == KernelSet::Avx512Bf16;
    let avx2 = std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c");
    let mut t = 0.0f32;
    let mut step = 0;
    while t > -130.0 {
        let lanes: [f32; 16] = std::array::from_fn(|i| match i {
            15 if step == 3 => f32::NAN,
            14 => t.floor() - 0.5,
            _ => t - i as f32 * 0.0371,
        });
        // (inputs, vector, formula) per vector of each set.
        let mut results: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = Vec::new();
        if avx512 {
            // SAFETY: the CPU has the AVX-512 set's features (detected above).
            let (v, f) = unsafe { super::avx512::exp2_lanes_for_tests(lanes) };
            results.push((lanes.to_vec(), v.to_vec(), f.to_vec()));
        }
        if avx2 {
            for half in lanes.chunks_exact(8) {
                // SAFETY: the CPU has the AVX2 set's features (detected above).
                let (v, f) = unsafe { super::avx2::exp2_lanes_for_tests(half.try_into().unwrap()) };
                results.push((half.to_vec(), v.to_vec(), f.to_vec()));
            }
        }
        for (inputs, vector, formula) in results {
            for ((v, f), t) in vector.iter().zip(&formula).zip(&inputs) {
                assert_eq!(v.to_bits(), f.to_bits(), "2^{t}: {v} against {f}");
            }
        }
        step += 1;
        t -= 0.59;
    }
}

/// The f32 attention's 2^t: within 5e-7 (4 ulp) of f64's down to the clamp at -100, 2^-100
/// below it, never subnormal; exactly 1 at 0 (the row's largest score).
#[test]
fn softmax_exp2_is_accurate_and_clamped() {
    let mut t = 0.0f32;
    while t > -130.0 {
        let ours = super::portable::exp2_softmax_for_tests(t) as f64;
        let exact = 2f64.powf((t as f64).max(-100.0));
        assert!(
            (ours / exact - 1.0).abs() < 5e-7,
            "2^{t} = {ours}, exact {exact}"
        );
        assert!((ours as f32).is_normal(), "2^{t} = {ours} is subnormal");
        t -= 0.0173;
    }
    assert_eq!(super::portable::exp2_softmax_for_tests(0.0), 1.0);
}

/// A kernel entry point (every instance's have this type).
type Entry = fn(&[Src<'_>], &mut [f32], [usize; 4], Range<usize>, f32);

/// The f32 and bf16 entry points of each instance this CPU runs: the portable one always
/// (its bf16 products multiply lane by lane), so the bf16 kernels' packing is checked on
/// every machine, not only on those with AVX512_BF16.
fn instances() -> Vec<(&'static str, [Entry; 6])> {
    let mut sets: Vec<(&'static str, [Entry; 6])> = vec![(
        "portable",
        [
            portable_attention_tokens,
            portable_attention_tokens_bf16,
            portable_conv_same_planes,
            portable_conv_same_planes_bf16,
            portable_linear_bias_rows,
            portable_linear_bias_rows,
        ],
    )];
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() != KernelSet::Portable {
        sets.push((
            "avx2",
            [
                avx2_attention,
                avx2_attention_bf16,
                avx2_conv,
                avx2_conv_bf16,
                avx2_linear,
                avx2_linear,
            ],
        ));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().runs(KernelSet::Avx2Vnni) {
        sets.push((
            "avx2vnni",
            [
                avx2vnni_attention,
                avx2vnni_attention_bf16,
                avx2vnni_conv,
                avx2vnni_conv_bf16,
                avx2vnni_linear,
                avx2vnni_linear,
            ],
        ));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() == KernelSet::Avx512Bf16 {
        sets.push((
            "avx512bf16",
            [
                avx512_attention,
                avx512_attention_bf16,
                avx512_conv,
                avx512_conv_bf16,
                avx512_linear,
                avx512_linear,
            ],
        ));
    }
    sets
}

/// Safe entry points to the x86 instances, for [`instances`], which offers each only
/// where the CPU has its features.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_entries {
    ($($name:ident = $module:ident::$kernel:ident;)*) => {
        $(
            fn $name(srcs: &[Src<'_>], out: &mut [f32], ne: [usize; 4], units: Range<usize>, param: f32) {
                // SAFETY: `instances` and `convolution_instances` list this entry only
                // where the CPU has the features its instance is compiled for
                // (Cpu::runs).
                unsafe { super::$module::run::$kernel(&config(), srcs, out, ne, units, param) }
            }
        )*
    };
}
#[cfg(target_arch = "x86_64")]
x86_entries! {
    avx2_attention = avx2::attention_tokens;
    avx2_attention_bf16 = avx2::attention_tokens_bf16;
    avx2_conv = avx2::conv_same_planes;
    avx2_conv_bf16 = avx2::conv_same_planes_bf16;
    avx2_linear = avx2::linear_bias_rows;
    avx2vnni_attention = avx2vnni::attention_tokens;
    avx2vnni_attention_bf16 = avx2vnni::attention_tokens_bf16;
    avx2vnni_conv = avx2vnni::conv_same_planes;
    avx2vnni_conv_bf16 = avx2vnni::conv_same_planes_bf16;
    avx2vnni_linear = avx2vnni::linear_bias_rows;
    avx512_attention = avx512::attention_tokens;
    avx512_attention_bf16 = avx512::attention_tokens_bf16;
    avx512_conv = avx512::conv_same_planes;
    avx512_conv_bf16 = avx512::conv_same_planes_bf16;
    avx512_linear = avx512::linear_bias_rows;
    avx2_linear_gelu = avx2::linear_bias_gelu_rows;
    avx2vnni_linear_gelu = avx2vnni::linear_bias_gelu_rows;
    avx512_linear_gelu = avx512::linear_bias_gelu_rows;
    avx2_linear_residual = avx2::linear_scaled_residual_rows;
    avx2vnni_linear_residual = avx2vnni::linear_scaled_residual_rows;
    avx512_linear_residual = avx512::linear_scaled_residual_rows;
    avx2_gelu = avx2::gelu_erf_rows;
    avx2vnni_gelu = avx2vnni::gelu_erf_rows;
    avx512_gelu = avx512::gelu_erf_rows;
    avx2_conv_direct = avx2::conv_direct_planes;
    avx2vnni_conv_direct = avx2vnni::conv_direct_planes;
    avx512_conv_direct = avx512::conv_direct_planes;
    avx2_conv_winograd = avx2::conv_winograd_planes;
    avx2_attention_int8 = avx2::attention_tokens_int8;
    avx2int7_attention_int8 = avx2_int7::attention_tokens_int8;
    avx2vnni_attention_int8 = avx2vnni::attention_tokens_int8;
    avx512_attention_int8 = avx512::attention_tokens_int8;
    avx2vnni_conv_winograd = avx2vnni::conv_winograd_planes;
    avx512_conv_winograd = avx512::conv_winograd_planes;
}

/// Each instance's linear layers (bias, bias and GELU, scaled residual) and its
/// standalone GELU.
fn linear_instances() -> Vec<(&'static str, [Entry; 4])> {
    let mut sets: Vec<(&'static str, [Entry; 4])> = vec![(
        "portable",
        [
            portable_linear_bias_rows,
            portable_linear_bias_gelu_rows,
            portable_linear_scaled_residual_rows,
            portable_gelu_erf_rows,
        ],
    )];
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() != KernelSet::Portable {
        let entries = [
            avx2_linear,
            avx2_linear_gelu,
            avx2_linear_residual,
            avx2_gelu,
        ];
        sets.push(("avx2", entries));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().runs(KernelSet::Avx2Vnni) {
        sets.push((
            "avx2vnni",
            [
                avx2vnni_linear,
                avx2vnni_linear_gelu,
                avx2vnni_linear_residual,
                avx2vnni_gelu,
            ],
        ));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() == KernelSet::Avx512Bf16 {
        sets.push((
            "avx512bf16",
            [
                avx512_linear,
                avx512_linear_gelu,
                avx512_linear_residual,
                avx512_gelu,
            ],
        ));
    }
    sets
}

/// Values in [-1, 1) from a seed: [`values_2`] halved.
fn values(n: usize, seed: u32) -> Vec<f32> {
    let values = values_2(n, seed);
    values.into_iter().map(|x| 0.5 * x).collect()
}

/// A contiguous f32 operand of shape `ne` over `data`.
fn src(data: &[f32], ne: [usize; 4]) -> Src<'_> {
    let nb = [1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]];
    Src {
        data,
        ne,
        nb,
        packing: Packing::F32,
    }
}

/// One kernel's operands (for its f32 and its bf16 entry), output shape, units and the
/// bound of its bf16 difference.
struct Case<'a> {
    what: &'static str,
    srcs: &'a [Src<'a>],
    srcs_bf16: &'a [Src<'a>],
    ne: [usize; 4],
    units: usize,
    bound: f32,
}

/// Every instance's f32 kernels agree with the portable ones, and its bf16 kernels stay
/// within bf16 rounding of its f32 ones: attention over several key blocks and query
/// tiles, a 3x3 convolution with a partial channel group, a product with partial row
/// groups.
#[test]
fn every_instance_agrees_and_its_bf16_kernels_stay_close() {
    // Attention: q [64, 100, 2], k and v [64, 500, 2] -> [64, 2, 100].
    let (d, tq, tk, heads) = (64, 100, 500, 2);
    let (q, k, v) = (
        values(d * tq * heads, 1),
        values(d * tk * heads, 2),
        values(d * tk * heads, 3),
    );
    let attention = [
        src(&q, [d, tq, heads, 1]),
        src(&k, [d, tk, heads, 1]),
        src(&v, [d, tk, heads, 1]),
    ];
    // Convolution: kernel [3, 3, 5, 7], input [20, 9, 5, 1], bias [7] -> [20, 9, 7].
    let (w, h, ic, oc) = (20, 9, 5, 7);
    let (kernel, input, bias) = (values(9 * ic * oc, 4), values(w * h * ic, 5), values(oc, 6));
    let conv = [
        src(&kernel, [3, 3, ic, oc]),
        src(&input, [w, h, ic, 1]),
        src(&bias, [oc, 1, 1, 1]),
    ];
    // Product: x [96, 13] times W^T for W [64, 96], bias [64].
    let (kd, n, t) = (96, 64, 13);
    let weight = values(kd * n, 7);
    let panels = pack_panels(&weight, kd, n);
    let panels_bf16: Vec<f32> = pack_panels_bf16(&weight, kd, n)
        .into_iter()
        .map(|w| f32::from_bits(w as u32))
        .collect();
    let (x, b) = (values(kd * t, 8), values(n, 9));
    let panel_ne = [PANEL, kd, n / PANEL, 1];
    let linear = [
        src(&panels, panel_ne),
        src(&x, [kd, t, 1, 1]),
        src(&b, [n, 1, 1, 1]),
    ];
    let mut linear_bf16 = [
        src(&panels_bf16, [PANEL, kd / 2, n / PANEL, 1]),
        src(&x, [kd, t, 1, 1]),
        src(&b, [n, 1, 1, 1]),
    ];
    linear_bf16[0].packing = Packing::Bf16Pairs;
    let cases = [
        Case {
            what: "attention",
            srcs: &attention,
            srcs_bf16: &attention,
            ne: [d, heads, tq, 1],
            units: tq,
            bound: 2e-3,
        },
        Case {
            what: "convolution",
            srcs: &conv,
            srcs_bf16: &conv,
            ne: [w, h, oc, 1],
            units: oc,
            bound: 3e-2,
        },
        Case {
            what: "product",
            srcs: &linear,
            srcs_bf16: &linear_bf16,
            ne: [n, t, 1, 1],
            units: t,
            bound: 5e-2,
        },
    ];
    let run = |entry: Entry, srcs: &[Src<'_>], ne: [usize; 4], units: usize| {
        let mut out = vec![f32::NAN; ne.iter().product()];
        entry(srcs, &mut out, ne, 0..units, 0.0);
        out
    };
    let sets = instances();
    for (c, case) in cases.iter().enumerate() {
        let (what, ne, units) = (case.what, case.ne, case.units);
        let (srcs, srcs_bf16, bound) = (case.srcs, case.srcs_bf16, case.bound);
        let reference = run(sets[0].1[2 * c], srcs, ne, units);
        assert!(reference.iter().all(|x| x.is_finite()), "{what}");
        for (set, entries) in &sets {
            let f32_out = run(entries[2 * c], srcs, ne, units);
            let diff = max_abs_difference(&reference, &f32_out);
            assert!(
                diff < 1e-5,
                "{set} {what}: f32 differs from portable by {diff}"
            );
            let bf16_out = run(entries[2 * c + 1], srcs_bf16, ne, units);
            let diff = max_abs_difference(&f32_out, &bf16_out);
            assert!(
                diff > 0.0 && diff < bound,
                "{set} {what}: bf16 differs from f32 by {diff}"
            );
        }
    }
}

mod attention;
mod convolution;
mod linear;
