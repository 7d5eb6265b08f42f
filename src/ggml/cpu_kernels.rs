//! Kernels of the CPU custom ops: safe Rust over slices (`cpu_ops.rs` hands them to ggml).

use super::cpu_ops::Src;
use std::ops::Range;

/// Values per vector register (AVX-512; narrower targets split the arrays). A block of
/// convolution output held in registers is `RO` channels (a const parameter) by `RP` vectors
/// of `V` consecutive pixels of one row; attention scores are blocked the same way over keys.
const V: usize = 16;
const RP: usize = 3;
const SPAN: usize = V * RP;

/// `a * b + c`, fused where the target has FMA (elsewhere `mul_add` is a slow library call).
#[inline(always)]
fn madd(a: f32, b: f32, c: f32) -> f32 {
    if cfg!(any(target_feature = "fma", target_arch = "aarch64")) {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The sizes of a stride-1 convolution with "same" zero padding.
struct Conv {
    kw: usize,
    kh: usize,
    w: usize,
    h: usize,
    /// Values per output channel in the kernel: IC * KH * KW.
    k_len: usize,
    /// A padded input row: `kw / 2` zeros, the row, zeros up to whole blocks and the far taps.
    padded_w: usize,
}

impl Conv {
    fn new(kernel: &Src<'_>, input: &Src<'_>) -> Conv {
        let [kw, kh, channels, _] = kernel.ne;
        let [w, h, _, _] = input.ne;
        Conv {
            kw,
            kh,
            w,
            h,
            k_len: kw * kh * channels,
            padded_w: w.div_ceil(SPAN) * SPAN + kw - 1,
        }
    }

    /// The input rows that output row `oy` reads, one per (channel, ky), zero-padded.
    fn fill_band(&self, band: &mut [f32], input: &[f32], oy: usize) {
        let (pad_x, pad_y) = (self.kw / 2, self.kh / 2);
        for (ck, row) in band.chunks_exact_mut(self.padded_w).enumerate() {
            let (c, ky) = (ck / self.kh, ck % self.kh);
            // Rows before the input wrap around to huge values, so one test covers both sides.
            let iy = (oy + ky).wrapping_sub(pad_y);
            let dst = &mut row[pad_x..pad_x + self.w];
            if iy < self.h {
                dst.copy_from_slice(&input[(c * self.h + iy) * self.w..][..self.w]);
            } else {
                dst.fill(0.0);
            }
        }
    }
}

/// Output channels `channels` (planes of `out`) of a "same" convolution: `srcs` are the
/// kernel [KW, KH, IC, OC], the input [W, H, IC, 1] and optionally a bias [OC].
pub(super) fn conv_same_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    channels: Range<usize>,
) {
    let (kernel, input) = (&srcs[0], &srcs[1]);
    let bias = |o: usize| srcs.get(2).map_or(0.0, |b| b.data[o]);
    let conv = Conv::new(kernel, input);
    let plane_len = conv.w * conv.h;
    let mut band = vec![0.0; conv.padded_w * conv.k_len / conv.kw];
    for oy in 0..conv.h {
        conv.fill_band(&mut band, input.data, oy);
        let mut o = channels.start;
        while o < channels.end {
            let planes = &mut out[(o - channels.start) * plane_len..];
            let weights = &kernel.data[o * conv.k_len..];
            o += match channels.end - o {
                4.. => conv_row::<4>(
                    &conv,
                    planes,
                    weights,
                    std::array::from_fn(|r| bias(o + r)),
                    &band,
                    oy,
                ),
                2.. => conv_row::<2>(
                    &conv,
                    planes,
                    weights,
                    std::array::from_fn(|r| bias(o + r)),
                    &band,
                    oy,
                ),
                _ => conv_row::<1>(&conv, planes, weights, [bias(o)], &band, oy),
            };
        }
    }
}

/// Row `oy` of `RO` output channels (the first planes of `planes`, weights from `weights`,
/// biases `bias`); returns `RO`. Four channels at most: with more, the compiler stops keeping
/// the accumulators in registers.
fn conv_row<const RO: usize>(
    conv: &Conv,
    planes: &mut [f32],
    weights: &[f32],
    bias: [f32; RO],
    band: &[f32],
    oy: usize,
) -> usize {
    let plane_len = conv.w * conv.h;
    for x0 in (0..conv.w).step_by(SPAN) {
        let mut acc: [[[f32; V]; RP]; RO] = std::array::from_fn(|r| [[bias[r]; V]; RP]);
        for (ck, row) in band.chunks_exact(conv.padded_w).enumerate() {
            for kx in 0..conv.kw {
                let k = ck * conv.kw + kx;
                let src = &row[x0 + kx..x0 + kx + SPAN];
                let xs: [[f32; V]; RP] =
                    std::array::from_fn(|p| src[p * V..(p + 1) * V].try_into().expect("V values"));
                let ws: [f32; RO] = std::array::from_fn(|r| weights[r * conv.k_len + k]);
                for (acc, &w) in acc.iter_mut().zip(&ws) {
                    for (acc, xs) in acc.iter_mut().zip(&xs) {
                        for (a, &x) in acc.iter_mut().zip(xs) {
                            *a = madd(w, x, *a);
                        }
                    }
                }
            }
        }
        // Vector by vector: taking a slice of `acc` would keep it out of registers, and whole
        // vectors stored as arrays compile to vector stores, not calls to a copy routine.
        let n = SPAN.min(conv.w - x0);
        for (r, acc) in acc.iter().enumerate() {
            let dst = &mut planes[r * plane_len + oy * conv.w + x0..][..n];
            for (dst, &v) in dst.chunks_mut(V).zip(acc) {
                match <&mut [f32; V]>::try_from(&mut *dst) {
                    Ok(whole) => *whole = v,
                    Err(_) => dst.copy_from_slice(&v[..dst.len()]),
                }
            }
        }
    }
    RO
}

/// GELU, `0.5 x (1 + erf(x / sqrt 2))`, on rows `rows` of the operand.
pub(super) fn gelu_erf_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    rows: Range<usize>,
) {
    let row_len = srcs[0].ne[0];
    let x = &srcs[0].data[rows.start * row_len..rows.end * row_len];
    for (y, &x) in out.iter_mut().zip(x) {
        *y = 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// erf in f32 within 5e-7 of the exact value: Eigen's rational approximation `x P(x²) / Q(x²)`
/// on [-4, 4] (erf rounds to ±1 beyond). Branch-free, so the loop above vectorises.
#[inline(always)]
fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = [
        -2.726_142_3e-10,
        2.770_681_4e-8,
        -2.101_024e-6,
        -5.692_506_4e-5,
        -7.349_906e-4,
        -2.954_600_1e-3,
        -1.609_603_3e-2,
    ];
    let q = [
        -1.456_607_2e-5,
        -2.133_740_6e-4,
        -1.682_827e-3,
        -7.373_329e-3,
        -1.426_474e-2,
    ];
    let horner = |c: &[f32]| c.iter().fold(0.0, |acc, &c| madd(acc, x2, c));
    x * horner(&p) / horner(&q)
}

/// Where an output coordinate samples its source with aligned corners: the two neighbours
/// and the weight of the second, in ggml's arithmetic.
fn bilinear_taps(out_len: usize, in_len: usize) -> Vec<(usize, usize, f32)> {
    let scale = if out_len > 1 && in_len > 1 {
        (out_len - 1) as f32 / (in_len - 1) as f32
    } else {
        out_len as f32 / in_len as f32
    };
    (0..out_len)
        .map(|i| {
            let x = i as f32 / scale;
            let x0 = (x.floor() as usize).min(in_len - 1);
            let x1 = (x0 + 1).min(in_len - 1);
            (x0, x1, (x - x0 as f32).clamp(0.0, 1.0))
        })
        .collect()
}

/// Planes `planes` of a bilinear resampling with aligned corners (`srcs[0]` [W, H, C, N] to
/// `ne`), value for value the formula of ggml's upscale kernel.
pub(super) fn bilinear_align_corners_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    planes: Range<usize>,
) {
    let [iw, ih, _, _] = srcs[0].ne;
    let (ow, oh) = (ne[0], ne[1]);
    let (xs, ys) = (bilinear_taps(ow, iw), bilinear_taps(oh, ih));
    for (plane, out) in planes.zip(out.chunks_exact_mut(ow * oh)) {
        let src = &srcs[0].data[plane * iw * ih..][..iw * ih];
        for (&(y0, y1, dy), out) in ys.iter().zip(out.chunks_exact_mut(ow)) {
            let (r0, r1) = (&src[y0 * iw..][..iw], &src[y1 * iw..][..iw]);
            for (&(x0, x1, dx), o) in xs.iter().zip(out) {
                let (a, b, c, d) = (r0[x0], r0[x1], r1[x0], r1[x1]);
                *o = a * (1.0 - dx) * (1.0 - dy)
                    + b * dx * (1.0 - dy)
                    + c * (1.0 - dx) * dy
                    + d * dx * dy;
            }
        }
    }
}

/// The attention kernel takes value rows of whole vectors.
pub(super) const ATTENTION_DV_MULTIPLE: usize = V;

/// Queries per tile: their scores against every key stay in the L2 cache.
const QT: usize = 24;
/// Register blocks of the two products, within the 32 vector registers: scores of 4 queries
/// by `SPAN` keys (12 accumulators), values of 6 queries by 64 columns (24 accumulators).
const SCORE_ROWS: usize = 4;
const VALUE_ROWS: usize = 6;

/// Tokens `tokens` (planes of `out`, each [Dv, H]) of attention over `srcs` q [D, Tq, H],
/// k [D, Tk, H] and v [Dv, Tk, H] (strided views with contiguous rows).
pub(super) fn attention_tokens(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    tokens: Range<usize>,
) {
    let (q, k, v) = (&srcs[0], &srcs[1], &srcs[2]);
    let [d, _, heads, _] = q.ne;
    let [dv, tk, _, _] = v.ne;
    let scale = 1.0 / (d as f32).sqrt();
    let tk_pad = tk.div_ceil(SPAN) * SPAN;
    let mut kt = vec![0.0f32; d * tk_pad];
    let mut scores = vec![0.0f32; QT * tk_pad];
    let mut acc = vec![0.0f32; QT * dv];
    for h in 0..heads {
        // K of this head transposed: kt[i][j] = k[j][i], rows padded with zeros.
        for j in 0..tk {
            let row = &k.data[j * k.nb[1] + h * k.nb[2]..][..d];
            for (i, &x) in row.iter().enumerate() {
                kt[i * tk_pad + j] = x;
            }
        }
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let n = QT.min(tokens.end - t0);
            let q_row = |r: usize| &q.data[(t0 + r) * q.nb[1] + h * q.nb[2]..][..d];
            attention_scores(&mut scores, &kt, tk_pad, d, n, &q_row);
            let sums: Vec<f32> = scores
                .chunks_exact_mut(tk_pad)
                .take(n)
                .map(|s| softmax_in_place(&mut s[..tk], scale))
                .collect();
            let v_row = |j: usize| &v.data[j * v.nb[1] + h * v.nb[2]..][..dv];
            attention_values(&mut acc, &scores, tk_pad, tk, dv, n, &v_row);
            for (r, sum) in sums.iter().enumerate() {
                let dst = &mut out[((t0 - tokens.start + r) * heads + h) * dv..][..dv];
                for (o, &a) in dst.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
                    *o = a / sum;
                }
            }
            t0 += n;
        }
    }
}

/// `scores[r][j] = q_r · k_j` for the first `n` rows, keys from `kt` [d][tk_pad].
fn attention_scores<'a>(
    scores: &mut [f32],
    kt: &[f32],
    tk_pad: usize,
    d: usize,
    n: usize,
    q_row: &impl Fn(usize) -> &'a [f32],
) {
    for r0 in (0..n).step_by(SCORE_ROWS) {
        // Rows past `n` repeat the last one; their results are dropped.
        let rows: [&[f32]; SCORE_ROWS] = std::array::from_fn(|r| q_row((r0 + r).min(n - 1)));
        for j0 in (0..tk_pad).step_by(SPAN) {
            let mut acc = [[[0.0f32; V]; RP]; SCORE_ROWS];
            for i in 0..d {
                let src = &kt[i * tk_pad + j0..][..SPAN];
                let ks: [[f32; V]; RP] =
                    std::array::from_fn(|p| src[p * V..(p + 1) * V].try_into().expect("V values"));
                let qs: [f32; SCORE_ROWS] = std::array::from_fn(|r| rows[r][i]);
                for (acc, &qv) in acc.iter_mut().zip(&qs) {
                    for (acc, ks) in acc.iter_mut().zip(&ks) {
                        for (a, &kv) in acc.iter_mut().zip(ks) {
                            *a = madd(qv, kv, *a);
                        }
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate().take(n - r0) {
                let dst = &mut scores[(r0 + r) * tk_pad + j0..][..SPAN];
                for (dst, &v) in dst.chunks_exact_mut(V).zip(acc) {
                    let dst: &mut [f32; V] = dst.try_into().expect("V values");
                    *dst = v;
                }
            }
        }
    }
}

/// `acc[r] = Σ_j p[r][j] v_j` for the first `n` rows of probabilities `p` (stride `tk_pad`).
fn attention_values<'a>(
    acc: &mut [f32],
    p: &[f32],
    tk_pad: usize,
    tk: usize,
    dv: usize,
    n: usize,
    v_row: &impl Fn(usize) -> &'a [f32],
) {
    for r0 in (0..n).step_by(VALUE_ROWS) {
        let mut c0 = 0;
        while c0 < dv {
            c0 += if dv - c0 >= 4 * V {
                values_block::<4>(acc, p, tk_pad, tk, dv, n, r0, c0, v_row)
            } else {
                values_block::<1>(acc, p, tk_pad, tk, dv, n, r0, c0, v_row)
            };
        }
    }
}

/// Rows `r0..r0 + VALUE_ROWS` and columns `c0..c0 + CV * V` of [`attention_values`]; returns the
/// columns done.
#[allow(clippy::too_many_arguments)]
fn values_block<'a, const CV: usize>(
    acc: &mut [f32],
    p: &[f32],
    tk_pad: usize,
    tk: usize,
    dv: usize,
    n: usize,
    r0: usize,
    c0: usize,
    v_row: &impl Fn(usize) -> &'a [f32],
) -> usize {
    let rows: [&[f32]; VALUE_ROWS] =
        std::array::from_fn(|r| &p[(r0 + r).min(n - 1) * tk_pad..][..tk]);
    let mut sums = [[[0.0f32; V]; CV]; VALUE_ROWS];
    // `j` picks a value row and a probability from each of the rows at once.
    #[allow(clippy::needless_range_loop)]
    for j in 0..tk {
        let src = &v_row(j)[c0..c0 + CV * V];
        let vs: [[f32; V]; CV] =
            std::array::from_fn(|c| src[c * V..(c + 1) * V].try_into().expect("V values"));
        let ps: [f32; VALUE_ROWS] = std::array::from_fn(|r| rows[r][j]);
        for (s, &pv) in sums.iter_mut().zip(&ps) {
            for (s, vs) in s.iter_mut().zip(&vs) {
                for (a, &x) in s.iter_mut().zip(vs) {
                    *a = madd(pv, x, *a);
                }
            }
        }
    }
    for (r, s) in sums.iter().enumerate().take(n - r0) {
        for (c, &v) in s.iter().enumerate() {
            let dst: &mut [f32; V] = (&mut acc[(r0 + r) * dv + c0 + c * V..][..V])
                .try_into()
                .expect("V values");
            *dst = v;
        }
    }
    CV * V
}

/// `s = exp(scale (s - max s))` in place; returns the sum. Reductions run in `V` lanes: a
/// serial one would not vectorise.
fn softmax_in_place(s: &mut [f32], scale: f32) -> f32 {
    let whole = s.len() / V * V;
    let mut lanes = [f32::NEG_INFINITY; V];
    for chunk in s[..whole].chunks_exact(V) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = lane.max(x);
        }
    }
    let max = s[whole..]
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0.0f32; V];
    for chunk in s[..whole].chunks_exact_mut(V) {
        for (lane, x) in lanes.iter_mut().zip(chunk) {
            *x = exp((*x - max) * scale);
            *lane += *x;
        }
    }
    for x in &mut s[whole..] {
        *x = exp((*x - max) * scale);
    }
    // The lanes and the tail summed in f64.
    s[whole..]
        .iter()
        .chain(&lanes)
        .map(|&x| x as f64)
        .sum::<f64>() as f32
}

/// e^x for x <= 0 to about 1 ulp (Cephes' polynomial on [-ln2/2, ln2/2] and an exponent
/// built from bits); branch-free so that loops over it vectorise. Underflows to 0 below -87.
#[inline(always)]
fn exp(x: f32) -> f32 {
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits, which then
    // become the exponent of 2^n (a float-to-int cast would not vectorise).
    const SHIFT: f32 = 12_582_912.0;
    let x = x.max(-87.0);
    let shifted = madd(x, std::f32::consts::LOG2_E, SHIFT);
    let n = shifted - SHIFT;
    let r = madd(n, -0.693_359_4, x);
    let r = madd(n, 2.121_944_4e-4, r);
    let c = [
        1.987_569_1e-4,
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ];
    let p = c.iter().fold(0.0, |acc, &c| madd(acc, r, c));
    let y = madd(p, r * r, r) + 1.0;
    let n_bits = shifted.to_bits().wrapping_sub(SHIFT.to_bits());
    y * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_is_within_a_few_ulp() {
        let worst = (0..=200_000)
            .map(|i| -87.0 * i as f32 / 200_000.0)
            .map(|x| ((super::exp(x) as f64 - (x as f64).exp()) / (x as f64).exp()).abs())
            .fold(0.0, f64::max);
        assert!(worst < 3e-7, "{worst}");
    }

    #[test]
    fn erf_is_within_5e_7() {
        // Reference: erf by its Taylor series in f64 (converges fast on [-3, 3]).
        let erf64 = |x: f64| {
            let (mut term, mut sum, mut n) = (x, x, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -x * x / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        };
        let worst = (0..=6000)
            .map(|i| -3.0 + i as f32 / 1000.0)
            .map(|x| (super::erf(x) as f64 - erf64(x as f64)).abs())
            .fold(0.0, f64::max);
        assert!(worst < 5e-7, "{worst}");
    }
}
