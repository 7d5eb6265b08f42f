// The kernels, compiled once per instruction set: `cpu_kernels.rs` includes this file in a
// module per variant, with `simd` naming that variant's vector unit, and calls it from
// functions compiled for those features. Everything here is `#[inline(always)]`, so that it
// is compiled inside those functions (with their features), not on its own for the baseline.

use super::{
    bf16_bits, bf16_pair, DType, PlaneRows, Src, PANEL, Q8_BLOCK, Q8_CORRECTIONS, Q8_RECORD,
    Q8_SCALES,
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
    /// Whether the input passes through ReLU as it is read.
    relu: bool,
}

impl Conv {
    #[inline(always)]
    fn new(kernel: &Src<'_>, input: &Src<'_>, relu: bool) -> Conv {
        let [kw, kh, channels, _] = kernel.ne;
        let [w, h, _, _] = input.ne;
        Conv {
            kw,
            kh,
            w,
            h,
            k_len: kw * kh * channels,
            padded_w: w.div_ceil(CONV_SPAN) * CONV_SPAN + kw - 1,
            relu,
        }
    }

    /// [`Conv::fill_band`] as words of bf16 pairs: row `p` holds rows `2p` and `2p + 1` of the
    /// band (the second zero past the last), pixel by pixel, in f32 slots.
    #[inline(always)]
    fn fill_pair_band(&self, band: &mut [f32], input: &[f32], oy: usize) {
        let (pad_x, pad_y) = (self.kw / 2, self.kh / 2);
        let taps = self.k_len / self.kw;
        let row = |ck: usize| -> Option<&[f32]> {
            let (c, ky) = (ck / self.kh, ck % self.kh);
            let iy = (oy + ky).wrapping_sub(pad_y);
            (ck < taps && iy < self.h).then(|| &input[(c * self.h + iy) * self.w..][..self.w])
        };
        let relu = self.relu;
        let act = |x: f32| if relu { relu_of(x) } else { x };
        for (p, dst) in band.chunks_exact_mut(self.padded_w).enumerate() {
            let dst = &mut dst[pad_x..pad_x + self.w];
            match (row(2 * p), row(2 * p + 1)) {
                (Some(lo), Some(hi)) => {
                    for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                        *d = f32::from_bits(bf16_bits(act(l)) | bf16_bits(act(h)) << 16);
                    }
                }
                (Some(lo), None) => {
                    for (d, &l) in dst.iter_mut().zip(lo) {
                        *d = f32::from_bits(bf16_bits(act(l)));
                    }
                }
                (None, Some(hi)) => {
                    for (d, &h) in dst.iter_mut().zip(hi) {
                        *d = f32::from_bits(bf16_bits(act(h)) << 16);
                    }
                }
                (None, None) => dst.fill(0.0),
            }
        }
    }

    /// The input rows that output row `oy` reads, one per (channel, ky), zero-padded.
    #[inline(always)]
    fn fill_band(&self, band: &mut [f32], input: &[f32], oy: usize) {
        let (pad_x, pad_y) = (self.kw / 2, self.kh / 2);
        for (ck, row) in band.chunks_exact_mut(self.padded_w).enumerate() {
            let (c, ky) = (ck / self.kh, ck % self.kh);
            // Rows before the input wrap around to huge values, so one test covers both sides.
            let iy = (oy + ky).wrapping_sub(pad_y);
            let dst = &mut row[pad_x..pad_x + self.w];
            if iy < self.h {
                let src = &input[(c * self.h + iy) * self.w..][..self.w];
                if self.relu {
                    for (d, &x) in dst.iter_mut().zip(src) {
                        *d = relu_of(x);
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            } else {
                dst.fill(0.0);
            }
        }
    }
}

/// Output channels computed together by the convolution kernel, each over `CONV_VECTORS`
/// vectors of consecutive pixels: 24 accumulators with AVX-512, 12 with AVX2. With AVX2's 16
/// registers the tile is 6 x 2 (12 sums, 2 input vectors, a broadcast), not 4 x 3, which
/// needed all 16: compiled with LLVM's generic tuning (a build without `target-cpu`) that
/// spilled on every step and ran at 60-68 GFLOP/s against 104-154 for 6 x 2 (Zen 3, 2 threads).
const CONV_CHANNELS: usize = if simd::REGISTERS >= 32 { 8 } else { 6 };
const CONV_VECTORS: usize = if simd::REGISTERS >= 32 { 3 } else { 2 };
const CONV_SPAN: usize = CONV_VECTORS * LANES;
/// Pixels each row of a map is padded to by the direct convolution (its span).
/// (Read by the choice between the AVX-512 and AVX2 instances only.)
#[allow(dead_code)]
pub(super) const CONV_ROW_STEP: usize = CONV_SPAN;

/// Output channels `channels` (planes of `out`) of a "same" convolution: `srcs` are the
/// kernel [KW, KH, IC, OC], the input [W, H, IC, 1] and optionally a bias [OC].
#[inline(always)]
fn conv_same_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    let [kw, kh, ..] = srcs[0].ne;
    let [w, h, ..] = srcs[1].ne;
    let relu = relu_input(param);
    // The same decision as the graph's (`Context::conv_2d_bias`), which asks the instance
    // that would run Winograd, not necessarily this one.
    if (kw, kh) == (3, 3) && super::winograd_convolutions() && super::winograd_pays(w, h) {
        conv3x3_winograd_planes(srcs, out, channels, relu)
    } else {
        conv_planes(srcs, out, channels, false, relu)
    }
}

/// Whether a convolution kernel's parameter asks for the input through ReLU (a positive
/// parameter; 0 for the input as it is).
#[inline(always)]
fn relu_input(param: f32) -> bool {
    param > 0.0
}

/// ReLU as ggml computes it: `x` where it is above 0, else 0 (NaN and -0 included).
#[inline(always)]
fn relu_of(x: f32) -> f32 {
    if x > 0.0 {
        x
    } else {
        0.0
    }
}

/// [`conv_same_planes`] by the direct kernel whatever the kernel's size (for the tests that
/// set it beside Winograd's).
#[cfg(test)]
#[inline(always)]
fn conv_direct_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    conv_planes(srcs, out, channels, false, relu_input(param))
}

/// [`conv_same_planes`] of a 3x3 kernel by Winograd whatever the map's size (for the tests
/// that set it beside the direct kernel).
#[cfg(test)]
#[inline(always)]
fn conv_winograd_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    conv3x3_winograd_planes(srcs, out, channels, relu_input(param))
}

/// [`conv_same_planes`] with bf16 products: the input rows of each pair of (channel, ky)
/// taps, and the matching weights, as bf16 pairs; sums in f32.
#[inline(always)]
fn conv_same_planes_bf16(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    let relu = relu_input(param);
    // The tiles' input ring takes the input as it is (the graph gives them no ReLU'd one).
    #[cfg(target_arch = "x86_64")]
    if simd::AMX_TILES && !relu && super::amx_convolution_fits(srcs[0].ne) {
        if let Some(tiles) = super::amx::Tiles::configure() {
            return conv_planes_amx(&tiles, srcs, out, channels);
        }
    }
    conv_planes(srcs, out, channels, true, relu)
}

/// [`conv_same_planes_bf16`] on AMX tiles, for kernels that [`super::amx_convolution_fits`].
/// The products pair consecutive input channels: the weights of each output channel as one
/// run of channel pairs per kernel position (ky, kx), and the input through a ring of KH
/// rows per channel pair (bf16 pairs, zero-padded to blocks of 32 pixels and the kernel's
/// reach), each input row converted once as the output rows pass. A block of 32 output
/// channels by 32 pixels is then one tile product over KH x KW segments, each a position's
/// weights against the ring shifted by (ky, kx), summed in the tiles' f32.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn conv_planes_amx(
    tiles: &super::amx::Tiles,
    srcs: &[Src<'_>],
    out: &mut [f32],
    channels: Range<usize>,
) {
    use super::amx::BLOCK;
    let (kernel, input) = (&srcs[0], &srcs[1]);
    let bias = |o: usize| srcs.get(2).map_or(0.0, |b| b.data[o]);
    let [kw, kh, ic, _] = kernel.ne;
    let [w, h, ..] = input.ne;
    let (pad_x, pad_y, pairs) = (kw / 2, kh / 2, ic / 2);
    let (k_len, positions) = (kw * kh * ic, kw * kh);
    // Row of output channel o: per position (ky, kx), the pairs (w[o][2q][ky][kx],
    // w[o][2q + 1][ky][kx]); rows past the last channel stay zero.
    let row_len = positions * pairs;
    let groups = channels.len().div_ceil(BLOCK);
    let mut weights = vec![0u32; groups * BLOCK * row_len];
    for (o, row) in channels.clone().zip(weights.chunks_exact_mut(row_len)) {
        let w = &kernel.data[o * k_len..][..k_len];
        for (position, run) in row.chunks_exact_mut(pairs).enumerate() {
            let (ky, kx) = (position / kw, position % kw);
            let tap = |c: usize| w[(c * kh + ky) * kw + kx];
            for (q, word) in run.iter_mut().enumerate() {
                *word = bf16_pair(tap(2 * q), tap(2 * q + 1));
            }
        }
    }
    // The ring: per channel pair, KH rows of `padded_w` words; input row iy (from -pad_y)
    // in row (iy + pad_y) % KH, pixel x at pad_x + x. Padding is never written.
    let padded_w = w.div_ceil(BLOCK) * BLOCK + kw - 1;
    let pair_stride = kh * padded_w;
    let mut ring = vec![0.0f32; pairs * pair_stride];
    let mut next_row = 0;
    let mut sums = [0.0f32; BLOCK * BLOCK];
    let mut segments = vec![[0usize; 2]; positions];
    let plane_len = w * h;
    for oy in 0..h {
        // Rows up to oy + KH - 1 - pad_y, counted from -pad_y (row r is input row r - pad_y).
        while next_row < oy + kh {
            let slot = next_row % kh;
            let iy = next_row.wrapping_sub(pad_y);
            for q in 0..pairs {
                let dst = &mut ring[q * pair_stride + slot * padded_w + pad_x..][..w];
                if iy < h {
                    let lo = &input.data[(2 * q * h + iy) * w..][..w];
                    let hi = &input.data[((2 * q + 1) * h + iy) * w..][..w];
                    for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                        *d = f32::from_bits(bf16_pair(l, h));
                    }
                } else {
                    dst.fill(0.0);
                }
            }
            next_row += 1;
        }
        for g in 0..groups {
            let count = BLOCK.min(channels.len() - g * BLOCK);
            for x0 in (0..w).step_by(BLOCK) {
                for (position, segment) in segments.iter_mut().enumerate() {
                    let (ky, kx) = (position / kw, position % kw);
                    let a = g * BLOCK * row_len + position * pairs;
                    *segment = [a, (oy + ky) % kh * padded_w + x0 + kx];
                }
                // A last block of 16 channels or fewer (a 32-channel layer split between two
                // threads) takes half the tile products.
                let rows = if count <= BLOCK / 2 { BLOCK / 2 } else { BLOCK };
                tiles.product_segments(
                    (&weights, row_len, rows),
                    (&ring, pair_stride),
                    &segments,
                    pairs,
                    (&mut sums, BLOCK),
                    false,
                );
                let n = BLOCK.min(w - x0);
                for (r, sums) in sums.chunks_exact(BLOCK).take(count).enumerate() {
                    let c = g * BLOCK + r;
                    let b = bias(channels.start + c);
                    let dst = &mut out[c * plane_len + oy * w + x0..][..n];
                    for (d, &s) in dst.iter_mut().zip(sums) {
                        *d = s + b;
                    }
                }
            }
        }
    }
}

/// Output channels `0..count` in groups for the convolutions' register tile, as (first,
/// rows): [`CONV_CHANNELS`] at a time, then 4, 2 and 1 for what is left.
#[inline(always)]
fn channel_groups(count: usize) -> Vec<(usize, usize)> {
    let mut groups = Vec::new();
    let mut o = 0;
    while o < count {
        let r = [CONV_CHANNELS, 4, 2, 1]
            .into_iter()
            .find(|&r| count - o >= r)
            .unwrap_or(1);
        groups.push((o, r));
        o += r;
    }
    groups
}

/// A kernel row's operands: f32 weights over an f32 band, or bf16 pairs over a pair band.
#[derive(Clone, Copy)]
enum Taps<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u32]),
}

/// The direct convolution of output channels `channels` (planes of `out`), bf16 products
/// where `bf16`, the input through ReLU where `relu`.
#[inline(always)]
fn conv_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    channels: Range<usize>,
    bf16: bool,
    relu: bool,
) {
    let [w, h, ..] = srcs[1].ne;
    let mut out = PlaneRows::whole(out, [w, h, channels.len()]);
    conv_rows(srcs, &mut out, channels, bf16, relu)
}

/// The direct convolution of every output channel of the rows `out` holds: a thread's band
/// (each input row is then gathered once, not once per thread, and a convolution of few
/// output channels keeps every thread busy). A positive `param` passes the input through
/// ReLU.
#[inline(always)]
fn conv_direct_rows(srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
    conv_rows(srcs, out, 0..ne[2], false, relu_input(param))
}

/// [`conv_direct_rows`] with bf16 products (vectors; AMX tiles take whole planes).
#[inline(always)]
fn conv_direct_rows_bf16(srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
    conv_rows(srcs, out, 0..ne[2], true, relu_input(param))
}

/// The direct convolution of output channels `channels` (planes `0..channels.len()` of
/// `out`) over the rows `out` holds.
#[inline(always)]
fn conv_rows(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    channels: Range<usize>,
    bf16: bool,
    relu: bool,
) {
    if out.rows().is_empty() {
        return;
    }
    let (kernel, input) = (&srcs[0], &srcs[1]);
    let bias = |o: usize| srcs.get(2).map_or(0.0, |b| b.data[o]);
    let conv = Conv::new(kernel, input, relu);
    let taps = conv.k_len / conv.kw;
    // bf16: weights of this thread's channels as pairs of consecutive (channel, ky) rows at
    // the same kx, so that a step of the tile is one kx over one pair of band rows.
    let pair_rows = taps.div_ceil(2);
    let pair_len = pair_rows * conv.kw;
    let mut pair_weights = vec![0u32; if bf16 { channels.len() * pair_len } else { 0 }];
    for (o, dst) in channels
        .clone()
        .zip(pair_weights.chunks_exact_mut(pair_len.max(1)))
    {
        let w = &kernel.data[o * conv.k_len..][..conv.k_len];
        for (i, word) in dst.iter_mut().enumerate() {
            let (p, kx) = (i / conv.kw, i % conv.kw);
            let hi = (2 * p + 1 < taps).then(|| w[(2 * p + 1) * conv.kw + kx]);
            *word = bf16_pair(w[2 * p * conv.kw + kx], hi.unwrap_or(0.0));
        }
    }
    // The channels in groups of CONV_CHANNELS, then of 4, 2 and 1 for what is left, each
    // group's weights packed for the tile.
    let groups = channel_groups(channels.len());
    let mut packed = vec![0.0f32; if bf16 { 0 } else { channels.len() * conv.k_len }];
    let mut packed_pairs = vec![0u32; pair_weights.len()];
    for &(i, r) in &groups {
        if bf16 {
            let rows: Vec<&[u32]> = (i..i + r).map(|c| &pair_weights[c * pair_len..]).collect();
            pack_rows(&rows, pair_len, &mut packed_pairs[i * pair_len..]);
        } else {
            let rows: Vec<&[f32]> = (i..i + r)
                .map(|c| &kernel.data[(channels.start + c) * conv.k_len..])
                .collect();
            pack_rows(&rows, conv.k_len, &mut packed[i * conv.k_len..]);
        }
    }
    // A 1x1 kernel reads the input planes where they are, over the band's pixels as one run,
    // unless they lie a multiple of 1 KB apart: then a span's values of every channel fall
    // in a few sets of the L1 cache (288x192, 64 -> 64 channels: 4.0 ms through the band,
    // 4.3 in place; 36x24, 768 -> 384: 3.5 through the band, 2.6 in place).
    let planes_alias = (conv.w * conv.h * std::mem::size_of::<f32>()).is_multiple_of(1024);
    if (conv.kw, conv.kh) == (1, 1) && !bf16 && !relu && !planes_alias {
        return conv1x1_rows(&conv, input.data, out, (&packed, &groups), channels.start, &bias);
    }
    let band_rows = if bf16 { pair_rows } else { taps };
    let mut band = vec![0.0; conv.padded_w * band_rows];
    for oy in out.rows() {
        if bf16 {
            conv.fill_pair_band(&mut band, input.data, oy);
        } else {
            conv.fill_band(&mut band, input.data, oy);
        }
        for &(i, r) in &groups {
            let o = channels.start + i;
            let planes = (&mut *out, i);
            let weights = if bf16 {
                Taps::Bf16(&packed_pairs[i * pair_len..])
            } else {
                Taps::F32(&packed[i * conv.k_len..])
            };
            by_group_rows!(r, conv_row(&conv, planes, weights, o, &bias, &band, oy));
        }
    }
}

/// A 1x1 convolution of the rows `out` holds: their pixels as one run, CONV_SPAN at a time,
/// each span's IC input values read from the planes in place (`plane_len` apart), for every
/// group of output channels (`groups` of `packed` weights, as [`conv_rows`] packs them; the
/// first is channel `o`). A band copy per output row, as the 3x3 kernels make, cost as much
/// as a third of the products at 64 channels. The last span of the map, which would read
/// past the last plane, goes through a zero-padded copy of its pixels.
#[inline(always)]
fn conv1x1_rows(
    conv: &Conv,
    input: &[f32],
    out: &mut PlaneRows<'_>,
    (packed, groups): (&[f32], &[(usize, usize)]),
    o: usize,
    bias: &impl Fn(usize) -> f32,
) {
    let (w, plane_len, ic) = (conv.w, conv.w * conv.h, conv.k_len);
    let rows = out.rows();
    let (start, end) = (rows.start * w, rows.end * w);
    let mut tail = Vec::new();
    for x0 in (start..end).step_by(CONV_SPAN) {
        let n = CONV_SPAN.min(end - x0);
        let (b, stride): (&[f32], usize) = if (ic - 1) * plane_len + x0 + CONV_SPAN <= input.len() {
            (&input[x0..], plane_len)
        } else {
            tail.clear();
            tail.resize(ic * CONV_SPAN, 0.0);
            for (c, dst) in tail.chunks_exact_mut(CONV_SPAN).enumerate() {
                let from = (c * plane_len + x0).min(input.len());
                let there = (input.len() - from).min(plane_len - x0).min(CONV_SPAN);
                dst[..there].copy_from_slice(&input[from..][..there]);
            }
            (&tail, CONV_SPAN)
        };
        for &(i, r) in groups {
            let weights = &packed[i * ic..];
            by_group_rows!(r, conv1x1_span(out, (weights, ic), (b, stride), (x0, n, w), o + i, i, bias));
        }
    }
}

/// One span of [`conv1x1_rows`] for `R` output channels from `o` (planes from `first` of
/// `out`): pixels `x0..x0 + n` of the map (`w` wide), stored row by row.
#[inline(always)]
fn conv1x1_span<const R: usize>(
    out: &mut PlaneRows<'_>,
    (weights, ic): (&[f32], usize),
    (b, stride): (&[f32], usize),
    (x0, n, w): (usize, usize, usize),
    o: usize,
    first: usize,
    bias: &impl Fn(usize) -> f32,
) {
    let mut acc: [[[f32; LANES]; CONV_VECTORS]; R] =
        std::array::from_fn(|r| [[bias(o + r); LANES]; CONV_VECTORS]);
    tile(F32, &mut acc, &weights[..R * ic], b, (ic, stride), (1, 0));
    for (r, acc) in acc.iter().enumerate() {
        let values = &acc.as_flattened()[..n];
        let mut done = 0;
        while done < n {
            let (y, x) = ((x0 + done) / w, (x0 + done) % w);
            let len = (w - x).min(n - done);
            out.row_mut(first + r, y)[x..][..len].copy_from_slice(&values[done..][..len]);
            done += len;
        }
    }
}

/// A transposed convolution whose kernel is its stride `s` (each input pixel's patch of
/// outputs overlaps no other), plus a bias: `srcs` are the kernel [s, s, OC, IC], the input
/// [W, H, IC, 1] and the bias [OC]; `out` holds whole input rows' `s` output rows. As a
/// product: the OC x s x s (channel, dy, dx) "virtual channels" by the input's pixels, each
/// sum stored at its place in the `s` x `s` patch. ggml's route (transposed copies of the
/// input and the kernel, a product, two permuting copies and a bias pass) took 3.2 ms of
/// DA3-small's head at 36x24, 48 channels, s = 4.
#[inline(always)]
fn conv_transpose_rows(srcs: &[Src<'_>], out: &mut PlaneRows<'_>, _ne: [usize; 4], _param: f32) {
    let (kernel, input, bias) = (&srcs[0], &srcs[1], &srcs[2].data);
    let [s, _, oc, ic] = kernel.ne;
    let [w, h, ..] = input.ne;
    let rows = out.rows();
    if rows.is_empty() || s == 0 {
        return;
    }
    // Virtual channel v = (o s + dy) s + dx; its weights over the input channels are
    // kernel[c q + v], q apart: transposed to rows, then packed for the tile in groups.
    let q = oc * s * s;
    let mut rows_of_v = super::Scratch::take(&super::SCRATCH_0, q * ic, 0.0);
    for (c, weights) in kernel.data.chunks_exact(q).take(ic).enumerate() {
        for (v, &x) in weights.iter().enumerate() {
            rows_of_v[v * ic + c] = x;
        }
    }
    let groups = channel_groups(q);
    let mut packed = super::Scratch::take(&super::SCRATCH_1, q * ic, 0.0);
    for &(v, r) in &groups {
        let group: Vec<&[f32]> = (v..v + r).map(|v| &rows_of_v[v * ic..]).collect();
        pack_rows(&group, ic, &mut packed[v * ic..]);
    }
    // One input row of every channel, zero-padded to whole spans.
    let padded_w = w.div_ceil(CONV_SPAN) * CONV_SPAN;
    let mut band = super::Scratch::take(&super::SCRATCH_2, ic * padded_w, 0.0);
    for y in rows.start / s..rows.end.div_ceil(s) {
        for (c, row) in band.chunks_exact_mut(padded_w).enumerate() {
            row[..w].copy_from_slice(&input.data[(c * h + y) * w..][..w]);
            row[w..].fill(0.0);
        }
        for x0 in (0..w).step_by(CONV_SPAN) {
            let n = CONV_SPAN.min(w - x0);
            let b = (&band[x0..], padded_w);
            for &(v, r) in &groups {
                let a = (&packed[v * ic..], ic);
                let at = ((x0, n, y, s), v);
                by_group_rows!(r, conv_transpose_span(out, a, b, at, bias));
            }
        }
    }
}

/// `R` virtual channels from `v` of [`conv_transpose_rows`] over input pixels `x0..x0 + n`
/// of row `y`: the sums, plus their channel's bias, each at its place in its patch.
#[inline(always)]
fn conv_transpose_span<const R: usize>(
    out: &mut PlaneRows<'_>,
    (weights, ic): (&[f32], usize),
    (band, stride): (&[f32], usize),
    ((x0, n, y, s), v): ((usize, usize, usize, usize), usize),
    bias: &[f32],
) {
    let mut acc = [[[0.0f32; LANES]; CONV_VECTORS]; R];
    tile(F32, &mut acc, &weights[..R * ic], band, (ic, stride), (1, 0));
    for (r, acc) in acc.iter().enumerate() {
        let v = v + r;
        let (o, dy, dx) = (v / (s * s), v / s % s, v % s);
        let row = &mut out.row_mut(o, y * s + dy)[x0 * s..];
        for (j, &sum) in acc.as_flattened()[..n].iter().enumerate() {
            row[j * s + dx] = sum + bias[o];
        }
    }
}

/// Row `oy` of `R` output channels from `o` (planes from `first` of `out`, their weights
/// packed for the tile first in `weights`).
#[inline(always)]
fn conv_row<const R: usize>(
    conv: &Conv,
    (out, first): (&mut PlaneRows<'_>, usize),
    weights: Taps<'_>,
    o: usize,
    bias: &impl Fn(usize) -> f32,
    band: &[f32],
    oy: usize,
) {
    let rows = band.len() / conv.padded_w;
    for x0 in (0..conv.w).step_by(CONV_SPAN) {
        let mut acc: [[[f32; LANES]; CONV_VECTORS]; R] =
            std::array::from_fn(|r| [[bias(o + r); LANES]; CONV_VECTORS]);
        let steps = ((rows, conv.padded_w), (conv.kw, 1));
        match weights {
            Taps::F32(w) => {
                tile(F32, &mut acc, &w[..R * conv.k_len], &band[x0..], steps.0, steps.1);
            }
            Taps::Bf16(w) => {
                let a = &w[..R * rows * conv.kw];
                tile(Bf16Pairs, &mut acc, a, &band[x0..], steps.0, steps.1);
            }
        }
        let n = CONV_SPAN.min(conv.w - x0);
        for (r, acc) in acc.iter().enumerate() {
            out.row_mut(first + r, oy)[x0..][..n].copy_from_slice(&acc.as_flattened()[..n]);
        }
    }
}

/// GELU, `0.5 x (1 + erf(x / sqrt 2))`, on rows `rows` of the operand.
#[inline(always)]
fn gelu_erf_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
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
    let horner = |c: &[f32]| c.iter().fold(0.0, |acc, &c| madd(acc, x2, c));
    x * horner(&ERF_P) / horner(&ERF_Q)
}

/// The numerator's and denominator's coefficients of [`erf`], highest power first.
const ERF_P: [f32; 7] = [
    -2.726_142_3e-10,
    2.770_681_4e-8,
    -2.101_024e-6,
    -5.692_506_4e-5,
    -7.349_906e-4,
    -2.954_600_1e-3,
    -1.609_603_3e-2,
];
const ERF_Q: [f32; 5] = [
    -1.456_607_2e-5,
    -2.133_740_6e-4,
    -1.682_827e-3,
    -7.373_329e-3,
    -1.426_474e-2,
];

/// GELU of a vector: [`gelu_erf_rows`]' arithmetic lane by lane, so the two agree bit for
/// bit.
#[inline(always)]
fn gelu_vector(x: simd::F) -> simd::F {
    let e = erf_vector(simd::mul(x, simd::splat(std::f32::consts::FRAC_1_SQRT_2)));
    simd::mul(simd::mul(simd::splat(0.5), x), simd::add(simd::splat(1.0), e))
}

/// [`erf`] of a vector, operation for operation.
#[inline(always)]
fn erf_vector(x: simd::F) -> simd::F {
    // NaN stays NaN: `min` and `max` return their second operand where one is NaN.
    let x = simd::max(simd::splat(-4.0), simd::min(simd::splat(4.0), x));
    let x2 = simd::mul(x, x);
    let horner = |c: &[f32]| {
        c.iter()
            .fold(simd::splat(0.0), |acc, &c| simd::fma(acc, x2, simd::splat(c)))
    };
    simd::div(simd::mul(x, horner(&ERF_P)), horner(&ERF_Q))
}

/// Where an output coordinate samples its source with aligned corners: the two neighbours
/// and the weight of the second, in ggml's arithmetic.
#[inline(always)]
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
/// `ne`), value for value the formula of ggml's upscale kernel; a map of the output's size is
/// copied. With `srcs[1]` [W', 1, C, 1] and `srcs[2]` [1, H', C, 1] (the output's W' and H'),
/// each plane of channel `c` then gets `srcs[1]`'s value of its column and `srcs[2]`'s of its
/// row added (a separable offset such as DA3's UV embedding), in the same pass.
#[inline(always)]
fn bilinear_align_corners_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    planes: Range<usize>,
    _param: f32,
) {
    let [iw, ih, _, _] = srcs[0].ne;
    let (ow, oh) = (ne[0], ne[1]);
    let (xs, ys) = (bilinear_taps(ow, iw), bilinear_taps(oh, ih));
    let offset = match srcs {
        [_, along_x, along_y] => Some((along_x.data, along_y.data, along_x.ne[2])),
        _ => None,
    };
    // Separable: every input row resampled across once (the gathers), then each output row
    // is a blend of two of those rows, a loop that vectorises.
    let mut across = vec![0.0f32; if (iw, ih) == (ow, oh) { 0 } else { ih * ow }];
    for (plane, out) in planes.zip(out.chunks_exact_mut(ow * oh)) {
        let src = &srcs[0].data[plane * iw * ih..][..iw * ih];
        if (iw, ih) == (ow, oh) {
            out.copy_from_slice(src);
        } else {
            for (row, dst) in src.chunks_exact(iw).zip(across.chunks_exact_mut(ow)) {
                for (&(x0, x1, dx), d) in xs.iter().zip(dst) {
                    *d = madd(row[x1] - row[x0], dx, row[x0]);
                }
            }
            for (&(y0, y1, dy), out) in ys.iter().zip(out.chunks_exact_mut(ow)) {
                let (r0, r1) = (&across[y0 * ow..][..ow], &across[y1 * ow..][..ow]);
                for ((o, &a), &b) in out.iter_mut().zip(r0).zip(r1) {
                    *o = madd(b - a, dy, a);
                }
            }
        }
        if let Some((along_x, along_y, channels)) = offset {
            let c = plane % channels;
            let (along_x, along_y) = (&along_x[c * ow..][..ow], &along_y[c * oh..][..oh]);
            for (out, &y) in out.chunks_exact_mut(ow).zip(along_y) {
                for (o, &x) in out.iter_mut().zip(along_x) {
                    *o = *o + x + y;
                }
            }
        }
    }
}

/// Rows `rows` of `[a | b]`: each output row is a row of `srcs[0]` then one of `srcs[1]`.
#[inline(always)]
fn concat_rows(srcs: &[Src<'_>], out: &mut [f32], ne: [usize; 4], rows: Range<usize>, _param: f32) {
    let (a, b) = (&srcs[0], &srcs[1]);
    let (na, nb) = (a.ne[0], b.ne[0]);
    for (r, dst) in rows.zip(out.chunks_exact_mut(ne[0])) {
        dst[..na].copy_from_slice(&a.data[r * a.nb[1]..][..na]);
        dst[na..].copy_from_slice(&b.data[r * b.nb[1]..][..nb]);
    }
}

/// Rows `rows` of a transposed matrix made contiguous: `srcs[0]` is the view [n0, n1] whose
/// element (i, j) lies at `i * nb[0] + j`, so output row `j` gathers column `j` of the
/// matrix underneath.
#[inline(always)]
fn transpose_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    // Tiles of 16 source rows: the lines read for one output row serve the next 15 too.
    const TILE: usize = 16;
    let src = &srcs[0];
    let (n0, stride) = (ne[0], src.nb[0]);
    for i0 in (0..n0).step_by(TILE) {
        let i1 = (i0 + TILE).min(n0);
        for (j, dst) in rows.clone().zip(out.chunks_exact_mut(n0)) {
            for (i, d) in (i0..i1).zip(&mut dst[i0..i1]) {
                *d = src.data[i * stride + j];
            }
        }
    }
}

/// The attention kernel takes value rows of whole vectors.
/// Value rows are whole vectors (the dispatcher promises multiples of 16).
const _: () = assert!(super::ATTENTION_DV_MULTIPLE.is_multiple_of(LANES));

/// Queries per tile of the bf16 kernel: their scores against every key stay in the L2 cache.
const QT: usize = 24;
/// Queries per tile of the f32 kernel, which passes over all the keys and values of a head
/// once per tile: more queries per tile, fewer passes.
const FLASH_QT: usize = 96;
/// Register tiles of the two products: scores of `SCORE_ROWS` queries by `SCORE_VECTORS`
/// vectors of keys, weighted values of `VALUE_ROWS` queries by `VALUE_VECTORS` vectors of
/// columns (24 accumulators each with AVX-512, 12 with AVX2).
const SCORE_ROWS: usize = if simd::REGISTERS >= 32 { 8 } else { 4 };
const SCORE_VECTORS: usize = 3;
const SCORE_SPAN: usize = SCORE_VECTORS * LANES;
/// With 16 registers, 3 x 4 would need 12 accumulators, 4 value vectors and a broadcast: one
/// more than there are, and the compiler's spills and register shuffles ran the product at
/// a third of its speed; 6 x 2 needs 15.
const VALUE_ROWS: usize = 6;
const VALUE_VECTORS: usize = if simd::REGISTERS >= 32 { 4 } else { 2 };
/// Keys per block of the f32 kernel's running softmax, whole spans of every set: a block's
/// transposed keys and its values (60 KB each for heads of 64) stay in L2 while every query
/// of a tile passes over them, however long the sequence. Without blocks, a scene of 8 views
/// (6,920 keys) streamed 1.8 MB of keys and of values from L3 for every few queries.
const KEY_BLOCK: usize = 240;
const _: () = assert!(KEY_BLOCK.is_multiple_of(SCORE_SPAN));
/// The f32 kernel's score tile, transposed: `KEY_ROWS` keys by `QUERY_VECTORS` vectors of
/// queries (6 x 2 = 12 accumulators with AVX2, 8 x 3 = 24 with AVX-512). Scores come out
/// keys by queries, which is how the weighted values read them (a query per row of the
/// tile, a key per step) and how the softmax wants them (a vector of queries per key: their
/// maxima, exponentials and sums are element-wise, with no packing and no reduction across
/// lanes).
const KEY_ROWS: usize = if simd::REGISTERS >= 32 { 8 } else { 6 };
const QUERY_VECTORS: usize = if simd::REGISTERS >= 32 { 3 } else { 2 };
const QUERY_SPAN: usize = QUERY_VECTORS * LANES;
const _: () = assert!(KEY_BLOCK.is_multiple_of(KEY_ROWS));
const _: () = assert!(FLASH_QT.is_multiple_of(QUERY_SPAN) && FLASH_QT.is_multiple_of(VALUE_ROWS));

/// Tokens `tokens` (planes of `out`, each [Dv, H]) of attention over `srcs` q [D, Tq, H],
/// k [D, Tk, H] and v [Dv, Tk, H] (strided views with contiguous rows): per head and tile of
/// queries, the keys block by block with a running (online) softmax, as flash attention does:
/// each block's scores are exponentiated against the largest score so far, and when a later
/// block raises it, the sums and weighted values so far are rescaled. Scores are computed
/// and kept keys by queries ([`KEY_ROWS`]).
#[inline(always)]
fn attention_tokens(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    tokens: Range<usize>,
    _param: f32,
) {
    attention_flash::<false>(srcs, out, tokens)
}

/// [`attention_tokens`] with both products in int8, as the int8 linear layers compute theirs
/// ([`q8_tile`]), for heads (queries and values) of whole blocks of 32 values. Scores: per
/// head, the keys less their mean (which moves all the scores of a query by the same amount,
/// so the softmax is unchanged, and leaves the quantisation only the keys' spread) quantised
/// block by block as those layers quantise their inputs ([`quantize_block`]: 8 bits, or 7 in
/// the AVX2 route that takes 7-bit activations); per tile of queries, the queries quantised
/// to 8 bits per block (scale `max |q| / 127`) and packed as a q8_0 weight's panels.
/// Weighted values: per head, the values less their mean per channel packed the same way
/// ([`pack_q8_values`]); per block of keys of the running softmax ([`Q8_KEY_BLOCK`]), the
/// probabilities quantised per query and block of 32 keys relative to that block's largest
/// ([`quantize_probabilities`]), so a block of small probabilities keeps its own 7 bits
/// instead of rounding to zero against the row's largest. The softmax (exponentials, maxima,
/// the sums that divide) stays f32.
#[inline(always)]
fn attention_tokens_int8(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    tokens: Range<usize>,
    _param: f32,
) {
    attention_flash::<true>(srcs, out, tokens)
}

/// Panels of int8 queries per tile of [`FLASH_QT`] queries.
const QUERY_PANELS: usize = FLASH_QT / PANEL;
/// Keys per block of the int8 kernel's running softmax: whole groups of its score tile's
/// [`Q8_ROWS`] keys and whole blocks of 32 for the probabilities' quantisation, the
/// smallest such multiple at or above [`KEY_BLOCK`] (288 keys for groups of 6, 320 for 5).
pub(super) const Q8_KEY_BLOCK: usize = {
    let (mut a, mut b) = (Q8_ROWS, Q8_BLOCK);
    while b != 0 {
        (a, b) = (b, a % b);
    }
    let multiple = Q8_ROWS / a * Q8_BLOCK;
    KEY_BLOCK.div_ceil(multiple) * multiple
};
const _: () = assert!(
    FLASH_QT.is_multiple_of(PANEL)
        && PANEL.is_multiple_of(Q8_SPAN)
        && Q8_KEY_BLOCK.is_multiple_of(Q8_ROWS)
        && Q8_KEY_BLOCK.is_multiple_of(Q8_BLOCK)
        && Q8_KEY_BLOCK >= KEY_BLOCK
);

/// [`attention_tokens`] (`INT8` false) or [`attention_tokens_int8`].
#[inline(always)]
fn attention_flash<const INT8: bool>(srcs: &[Src<'_>], out: &mut [f32], tokens: Range<usize>) {
    let (q, k, v) = (&srcs[0], &srcs[1], &srcs[2]);
    let [d, _, heads, _] = q.ne;
    let [dv, tk, _, _] = v.ne;
    let log2_scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
    if INT8 {
        assert!(
            d.is_multiple_of(Q8_BLOCK) && dv.is_multiple_of(Q8_BLOCK),
            "int8 attention takes heads of whole blocks"
        );
    }
    let key_block = if INT8 { Q8_KEY_BLOCK } else { KEY_BLOCK };
    // f32: the keys of a head packed for the score tile, KEY_ROWS at a time (zeros past the
    // last). int8: the keys less their mean, [tk][d].
    let key_groups = tk.div_ceil(KEY_ROWS);
    let keys_len = if INT8 { tk * d } else { key_groups * KEY_ROWS * d };
    let mut keys = super::Scratch::take(&super::SCRATCH_0, keys_len, 0.0);
    // int8: the keys quantised and packed for the tile, Q8_ROWS at a time; their mean.
    let (blocks, quads) = (d / Q8_BLOCK, d / 4);
    let q8_groups = if INT8 { tk.div_ceil(Q8_ROWS) } else { 0 };
    let mut key_quads: Vec<simd::Q8Word> = vec![Default::default(); q8_groups * Q8_ROWS * quads];
    let mut key_scales = vec![0f32; q8_groups * Q8_ROWS * blocks];
    let mut key_mean = vec![0f32; if INT8 { d } else { 0 }];
    // int8: a head's values less their mean as int8 panels, and a key block's probabilities
    // quantised ([`pack_q8_values`], [`quantize_probabilities`]).
    let value_blocks = if INT8 { tk.div_ceil(Q8_BLOCK) } else { 0 };
    let mut value_panels = vec![0f32; dv / PANEL * value_blocks * Q8_RECORD];
    let mut value_mean = vec![0f32; if INT8 { dv } else { 0 }];
    let probability_steps = if INT8 { Q8_KEY_BLOCK / 4 } else { 0 };
    let mut probability_words: Vec<simd::Q8Word> =
        vec![Default::default(); probability_steps * PROBABILITY_STEP];
    let mut probability_scales = vec![0f32; probability_steps / 8 * PROBABILITY_STEP];
    // The tile's queries: f32 transposed, [d][FLASH_QT], or int8 panels; a block's scores,
    // then probabilities, [key_block][FLASH_QT]; the weighted values [FLASH_QT][dv].
    let queries_len = if INT8 {
        QUERY_PANELS * blocks * Q8_RECORD
    } else {
        d * FLASH_QT
    };
    let mut queries = super::Scratch::take(&super::SCRATCH_1, queries_len, 0.0);
    let mut scores = super::Scratch::take(&super::SCRATCH_2, key_block * FLASH_QT, 0.0);
    let mut acc = super::Scratch::take(&super::SCRATCH_3, FLASH_QT * dv, 0.0);
    // A row of zeros: the keys past the last and the queries past a tile's end.
    let zeros = vec![0.0f32; d];
    for h in 0..heads {
        let k_row = |j: usize| &k.data[j * k.nb[1] + h * k.nb[2]..][..d];
        if INT8 {
            mean_of_rows(k_row, tk, &mut key_mean);
            for (j, dst) in keys.chunks_exact_mut(d).enumerate() {
                for ((c, &x), &m) in dst.iter_mut().zip(k_row(j)).zip(&key_mean) {
                    *c = x - m;
                }
            }
            for g in 0..q8_groups {
                let rows: [&[f32]; Q8_ROWS] = std::array::from_fn(|r| {
                    let j = g * Q8_ROWS + r;
                    if j < tk {
                        &keys[j * d..][..d]
                    } else {
                        &zeros
                    }
                });
                pack_q8_rows(
                    &rows,
                    &mut key_quads[g * Q8_ROWS * quads..][..Q8_ROWS * quads],
                    &mut key_scales[g * Q8_ROWS * blocks..][..Q8_ROWS * blocks],
                );
            }
        } else {
            for (g, dst) in keys.chunks_exact_mut(KEY_ROWS * d).enumerate() {
                let rows: [&[f32]; KEY_ROWS] = std::array::from_fn(|r| {
                    let j = g * KEY_ROWS + r;
                    if j < tk {
                        k_row(j)
                    } else {
                        &zeros
                    }
                });
                pack_rows(&rows, d, dst);
            }
        }
        // The values of this head from their first row: row j at j * nb[1].
        let v_head = &v.data[h * v.nb[2]..];
        if INT8 {
            let values = (v_head, v.nb[1]);
            pack_q8_values(values, (tk, dv), &mut value_mean, &mut value_panels);
        }
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let n = FLASH_QT.min(tokens.end - t0);
            // Whole vectors of queries: a tile's last span may be narrower than QUERY_SPAN
            // (a thread's share of 433 tokens ends in one query, which a full span would
            // have charged as 48).
            let width = n.div_ceil(LANES) * LANES;
            let rows: [&[f32]; FLASH_QT] = std::array::from_fn(|r| {
                if r < n {
                    &q.data[(t0 + r) * q.nb[1] + h * q.nb[2]..][..d]
                } else {
                    &zeros
                }
            });
            if INT8 {
                pack_q8_queries(&rows, blocks, &mut queries);
            } else {
                pack_rows(&rows, d, &mut queries);
            }
            let mut maxima = [f32::NEG_INFINITY; FLASH_QT];
            let mut sums = [0.0f64; FLASH_QT];
            for j0 in (0..tk).step_by(key_block) {
                let len = key_block.min(tk - j0);
                // The block's largest score per query, raised tile by tile while the tile is
                // at hand (a pass of its own over the block's scores kept a running maximum
                // in memory, one masked store per row, and took a fifth of the time outside
                // the products).
                let mut block_max = maxima;
                if INT8 {
                    for kg in 0..len.div_ceil(Q8_ROWS) {
                        let g = j0 / Q8_ROWS + kg;
                        let group = &key_quads[g * Q8_ROWS * quads..][..Q8_ROWS * quads];
                        let group_scales = &key_scales[g * Q8_ROWS * blocks..][..Q8_ROWS * blocks];
                        let present = (len - kg * Q8_ROWS).min(Q8_ROWS);
                        let mut c0 = 0;
                        while c0 < width {
                            let panel = &queries[c0 / PANEL * blocks * Q8_RECORD + c0 % PANEL..];
                            let tile_scores = &mut scores[kg * Q8_ROWS * FLASH_QT + c0..];
                            let maxima = &mut block_max[c0..];
                            let keys = (group, group_scales, present);
                            if width - c0 >= Q8_SPAN {
                                q8_scores::<Q8_VECTORS>(keys, panel, blocks, tile_scores, maxima);
                                c0 += Q8_SPAN;
                            } else {
                                q8_scores::<1>(keys, panel, blocks, tile_scores, maxima);
                                c0 += LANES;
                            }
                        }
                    }
                } else {
                    for kg in 0..len.div_ceil(KEY_ROWS) {
                        let group = &keys[(j0 / KEY_ROWS + kg) * KEY_ROWS * d..][..KEY_ROWS * d];
                        // The group's keys that exist: the rest are zeros past the last key.
                        let present = (len - kg * KEY_ROWS).min(KEY_ROWS);
                        let mut c0 = 0;
                        while c0 < width {
                            let queries = &queries[c0..];
                            let tile_scores = &mut scores[kg * KEY_ROWS * FLASH_QT + c0..];
                            let maxima = &mut block_max[c0..];
                            if width - c0 >= QUERY_SPAN {
                                score_tile::<QUERY_VECTORS>(group, queries, d, tile_scores, maxima, present);
                                c0 += QUERY_SPAN;
                            } else {
                                score_tile::<1>(group, queries, d, tile_scores, maxima, present);
                                c0 += LANES;
                            }
                        }
                    }
                }
                // The rescaling of what the earlier blocks summed where this block raised
                // the maximum.
                if j0 > 0 {
                    for r in 0..n {
                        if block_max[r] > maxima[r] {
                            let rescale = exp2_softmax((maxima[r] - block_max[r]) * log2_scale);
                            sums[r] *= rescale as f64;
                            for a in &mut acc[r * dv..(r + 1) * dv] {
                                *a *= rescale;
                            }
                        }
                    }
                }
                maxima = block_max;
                let shift = maxima.map(|m| -m * log2_scale);
                let mut block_sums = [0.0f32; FLASH_QT];
                // int8: 32 keys at a time, each block quantised for the weighted values while
                // its probabilities are in the L1 cache.
                let keys_per_pass = if INT8 { Q8_BLOCK } else { len };
                let (words, scales) = (&mut probability_words, &mut probability_scales);
                let passes = scores[..len * FLASH_QT].chunks_mut(keys_per_pass * FLASH_QT);
                for (b, rows) in passes.enumerate() {
                    if simd::EXP2_VECTOR {
                        exp2_block(rows, width, log2_scale, &shift, &mut block_sums);
                    } else {
                        for row in rows.chunks_exact_mut(FLASH_QT) {
                            let row = &mut row[..width];
                            for ((x, &shift), s) in row.iter_mut().zip(&shift).zip(&mut block_sums) {
                                *x = exp2_softmax(madd(*x, log2_scale, shift));
                                *s += *x;
                            }
                        }
                    }
                    if INT8 {
                        quantize_probabilities(rows, b, width, words, scales);
                    }
                }
                for (sum, &b) in sums.iter_mut().zip(&block_sums) {
                    *sum += b as f64;
                }
                // The weighted values, int8: the register tile's rows are Q8_ROWS queries, their
                // probabilities' words read in place; the last group may reach past `width`
                // into columns this block did not write, which feed only rows past `n`, not
                // stored.
                if INT8 {
                    let (words, scales) = (&probability_words, &probability_scales);
                    let (blocks, first) = (len.div_ceil(Q8_BLOCK), j0 / Q8_BLOCK);
                    for r0 in (0..n).step_by(Q8_ROWS) {
                        let rows = (&words[r0..], &scales[r0..], PROBABILITY_STEP);
                        let stored = Q8_ROWS.min(n - r0);
                        for c0 in (0..dv).step_by(Q8_SPAN) {
                            let record = ((c0 / PANEL) * value_blocks + first) * Q8_RECORD;
                            let panel = &value_panels[record + c0 % PANEL..];
                            let mut tile = [[[0.0; LANES]; Q8_VECTORS]; Q8_ROWS];
                            for (r, tile) in tile.iter_mut().enumerate().take(stored) {
                                if j0 > 0 {
                                    let row = &acc[(r0 + r) * dv + c0..][..Q8_SPAN];
                                    tile.as_flattened_mut().copy_from_slice(row);
                                }
                            }
                            q8_tile(&mut tile, rows, panel, blocks);
                            for (r, tile) in tile.iter().enumerate().take(stored) {
                                let row = &mut acc[(r0 + r) * dv + c0..][..Q8_SPAN];
                                row.copy_from_slice(tile.as_flattened());
                            }
                        }
                    }
                    continue;
                }
                // f32: a query per tile row, its probabilities FLASH_QT apart. A group of
                // VALUE_ROWS queries may reach past `width` as the int8 groups do.
                let values = &v_head[j0 * v.nb[1]..];
                for r0 in (0..n).step_by(VALUE_ROWS) {
                    let p = (&scores[r0..], FLASH_QT);
                    let mut c0 = 0;
                    while c0 < dv {
                        let accumulate = j0 > 0;
                        let at = (r0, c0, dv);
                        c0 += if dv - c0 >= VALUE_VECTORS * LANES {
                            values_block::<VALUE_VECTORS>(&mut acc, p, (values, v.nb[1]), len, at, accumulate)
                        } else {
                            values_block::<1>(&mut acc, p, (values, v.nb[1]), len, at, accumulate)
                        };
                    }
                }
            }
            for (r, &sum) in sums.iter().take(n).enumerate() {
                let sum = sum as f32;
                let dst = &mut out[((t0 - tokens.start + r) * heads + h) * dv..][..dv];
                for (o, &a) in dst.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
                    *o = a / sum;
                }
                if INT8 {
                    for (o, &m) in dst.iter_mut().zip(&value_mean) {
                        *o += m;
                    }
                }
            }
            t0 += n;
        }
    }
}

/// The queries of a tile (`rows`, whole blocks of 32 values) as int8 weights in
/// [`QUERY_PANELS`] panels of `blocks` records ([`super::q8_record_column`]): each block
/// quantised to -127..127 with the scale `max |q| / 127`.
#[inline(always)]
fn pack_q8_queries(rows: &[&[f32]; FLASH_QT], blocks: usize, panels: &mut [f32]) {
    for (c, row) in rows.iter().enumerate() {
        let (p, column) = (c / PANEL, c % PANEL);
        for (b, chunk) in row.chunks_exact(Q8_BLOCK).enumerate() {
            let record = &mut panels[(p * blocks + b) * Q8_RECORD..][..Q8_RECORD];
            pack_q8_weight_block(chunk.try_into().expect("a block"), column, true, record);
        }
    }
}

/// One block of 32 values of a weight packed as it runs (attention's queries, its values)
/// into column `column` of `record`: quantised to -127..127 with the scale `max |w| / 127`,
/// with the offset correction where `offset_activations` ([`super::q8_record_column`]).
#[inline(always)]
fn pack_q8_weight_block(
    values: &[f32; Q8_BLOCK],
    column: usize,
    offset_activations: bool,
    record: &mut [f32],
) {
    let max = simd::q8_max(values);
    let inverse = if max != 0.0 { 127.0 / max } else { 0.0 };
    let quants = simd::q8_bytes(values, inverse, ROUNDING_SHIFT);
    super::q8_record_column(column, &quants, max / 127.0, offset_activations, |i, word| {
        record[i] = f32::from_bits(word)
    });
}

/// Words of the quantised probabilities per step of four keys: a column per query of a tile,
/// and the overhang of the last group of rows that [`q8_tile`] reads (rows it does not store).
const PROBABILITY_STEP: usize = FLASH_QT + Q8_ROWS;

/// The values of a head (`tk` rows of `dv`, row j at `values[j * stride..]`) as the weight of
/// the int8 weighted values: less their mean per channel (`mean`, which [`attention_flash`]
/// adds back to the results, since the probabilities of a query sum to one after normalising),
/// each channel's block of 32 keys (zeros past the last) quantised to -127..127 with the scale
/// `max |v| / 127` ([`quantize_columns`], channels in lanes) into column `c % PANEL` of panel
/// `c / PANEL`, whose block b is record `(c / PANEL) * tk.div_ceil(32) + b` of `panels`
/// ([`super::q8_record_column`]'s layout). No offset correction: the probabilities are
/// unsigned bytes as they are.
#[inline(always)]
fn pack_q8_values(
    (values, stride): (&[f32], usize),
    (tk, dv): (usize, usize),
    mean: &mut [f32],
    panels: &mut [f32],
) {
    let blocks = tk.div_ceil(Q8_BLOCK);
    mean_of_rows(|j| &values[j * stride..][..dv], tk, mean);
    for c in (0..dv).step_by(LANES) {
        let m = simd::from_lanes(mean[c..][..LANES].try_into().expect("LANES channels"));
        let column = c % PANEL;
        for b in 0..blocks {
            let j0 = b * Q8_BLOCK;
            let rows = (&values[j0 * stride + c..], stride, tk - j0);
            let record = &mut panels[((c / PANEL) * blocks + b) * Q8_RECORD..][..Q8_RECORD];
            let scales = quantize_columns(rows, m, |q, words| {
                for (dst, word) in record[q * PANEL + column..][..LANES].iter_mut().zip(words) {
                    *dst = f32::from_bits(word);
                }
            });
            record[Q8_SCALES + column..][..LANES].copy_from_slice(&scales);
            record[Q8_CORRECTIONS + column..][..LANES].fill(0.0);
        }
    }
}

/// The mean of `count` rows (`row(j)`, as long as `mean`) into `mean`, summed in row order
/// in f32: what attention's keys and values are centred by before they are quantised.
#[inline(always)]
fn mean_of_rows<'a>(row: impl Fn(usize) -> &'a [f32], count: usize, mean: &mut [f32]) {
    mean.fill(0.0);
    for j in 0..count {
        for (m, &x) in mean.iter_mut().zip(row(j)) {
            *m += x;
        }
    }
    let inverse = 1.0 / count as f32;
    mean.iter_mut().for_each(|m| *m *= inverse);
}

/// The first LANES values of `x` as a vector (bounds checked, unlike `simd::load`).
#[inline(always)]
fn load_vector(x: &[f32]) -> simd::F {
    simd::from_lanes(x[..LANES].try_into().expect("LANES values"))
}

/// A block of 32 rows quantised column by column, LANES columns at a time: row i is the
/// vector at `x[i * stride..]` less `offset` for i < `rows`, zeros after; each lane's 32 values
/// to -127..127 with the scale `max |x| / 127`, rounded to even, four rows to a word
/// (`put(q, words)` for rows 4q .. 4q + 3, a word per column); returns the scales. For blocks
/// laid out across vectors, as attention's values and probabilities are. Plain loops, no
/// closures over vectors: a closure is compiled without the instance's features, and in a
/// build for the x86-64 baseline its vector operations stayed calls.
#[inline(always)]
fn quantize_columns(
    (x, stride, rows): (&[f32], usize, usize),
    offset: simd::F,
    mut put: impl FnMut(usize, [u32; LANES]),
) -> [f32; LANES] {
    let zero = simd::splat(0.0);
    let rows = rows.min(Q8_BLOCK);
    let mut max = zero;
    for i in 0..rows {
        let v = simd::sub(load_vector(&x[i * stride..]), offset);
        max = simd::max(max, simd::max(v, simd::sub(zero, v)));
    }
    let max = simd::to_lanes(max);
    let mut inverse = [0.0; LANES];
    let mut scales = [0.0; LANES];
    for l in 0..LANES {
        if max[l] > 0.0 {
            inverse[l] = 127.0 / max[l];
        }
        scales[l] = max[l] / 127.0;
    }
    let inverse = simd::from_lanes(inverse);
    let shift = simd::splat(ROUNDING_SHIFT);
    for q in 0..Q8_BLOCK / 4 {
        // A product then an add, not a fused multiply-add: the product rounded to f32 first,
        // as `q8_bytes` and the tests' definition round it. The rounded bytes are the low
        // bytes of the sums' bits (`ROUNDING_SHIFT`); zero rows round to zero.
        let mut rounded = [[ROUNDING_SHIFT; LANES]; 4];
        for (k, rounded) in rounded.iter_mut().enumerate() {
            let i = 4 * q + k;
            if i < rows {
                let v = simd::sub(load_vector(&x[i * stride..]), offset);
                *rounded = simd::to_lanes(simd::add(simd::mul(v, inverse), shift));
            }
        }
        let mut words = [0u32; LANES];
        for (l, word) in words.iter_mut().enumerate() {
            for (k, rounded) in rounded.iter().enumerate() {
                *word |= (rounded[l].to_bits() & 0xff) << (8 * k);
            }
        }
        put(q, words);
    }
    scales
}

/// The probabilities of block `b` of 32 keys (`rows`: up to 32 rows of [`FLASH_QT`], the
/// first `width` columns, whole vectors) quantised as the int8 weighted values' activations:
/// per query (zeros for keys past the rows), by [`quantize_columns`] with queries in lanes:
/// probabilities are not negative, so their bytes are 0..127, which every set's products
/// take exactly as unsigned bytes without an offset (and the sign's bit is not lost to it).
/// Query r's word of keys 4s .. 4s + 3 (of the key block) goes to
/// `words[s * PROBABILITY_STEP + r]`, its scale to `scales[b * PROBABILITY_STEP + r]`: the
/// layout [`q8_tile`] reads with a step of [`PROBABILITY_STEP`].
#[inline(always)]
fn quantize_probabilities(
    rows: &[f32],
    b: usize,
    width: usize,
    words: &mut [simd::Q8Word],
    scales: &mut [f32],
) {
    let keys = rows.len() / FLASH_QT;
    for r in (0..width).step_by(LANES) {
        let block = (&rows[r..], FLASH_QT, keys);
        let block_scales = quantize_columns(block, simd::splat(0.0), |q, quads| {
            let dst = &mut words[(b * Q8_BLOCK / 4 + q) * PROBABILITY_STEP + r..][..LANES];
            for (dst, quad) in dst.iter_mut().zip(quads) {
                *dst = simd::q8_word(quad);
            }
        });
        scales[b * PROBABILITY_STEP + r..][..LANES].copy_from_slice(&block_scales);
    }
}

/// One int8 score tile: the scores of the [`Q8_ROWS`] keys of `keys` (packed quads, their
/// scales, and how many exist) by `C` vectors of queries (`panel`, from the tile's first
/// column), written to `scores` (rows FLASH_QT apart), with `maxima[..C * LANES]` raised to
/// the largest score of the keys that exist (a NaN leaves a maximum as it was): as
/// [`score_tile`], from the int8 tile's sums ([`q8_sums`]) while they are in registers.
#[inline(always)]
fn q8_scores<const C: usize>(
    (keys, key_scales, present): (&[simd::Q8Word], &[f32], usize),
    panel: &[f32],
    blocks: usize,
    scores: &mut [f32],
    maxima: &mut [f32],
) {
    assert!(
        blocks > 0
            && panel.len() >= (blocks - 1) * Q8_RECORD + Q8_CORRECTIONS + C * LANES
            && keys.len() >= blocks * Q8_BLOCK / 4 * Q8_ROWS
            && key_scales.len() >= blocks * Q8_ROWS
            && C * LANES <= PANEL
            && scores.len() >= (Q8_ROWS - 1) * FLASH_QT + C * LANES
            && maxima.len() >= C * LANES
            && present <= Q8_ROWS
    );
    // Out of line for the reason `tile_steps` is.
    let run_steps: Q8ScoreSteps<C> = std::hint::black_box(q8_score_steps::<C>);
    // SAFETY: the assertion is what `q8_score_steps` needs; the instruction set of this
    // instance is present, since its code runs only inside its `run` functions.
    unsafe { run_steps((keys, key_scales, present), panel, blocks, scores, maxima) }
}

/// The type of [`q8_score_steps`] as a function pointer.
type Q8ScoreSteps<const C: usize> =
    unsafe fn((&[simd::Q8Word], &[f32], usize), &[f32], usize, &mut [f32], &mut [f32]);

instance_features! {
/// The loop of [`q8_scores`].
///
/// # Safety
/// As [`q8_sums`] needs for `Q8_ROWS` rows (`keys` and `key_scales` its `x` and `dx`),
/// `scores` holds `(Q8_ROWS - 1) * FLASH_QT + C * LANES` values, `maxima` `C * LANES`,
/// `present <= Q8_ROWS`, and the CPU has this instance's features.
#[inline(never)]
unsafe fn q8_score_steps<const C: usize>(
    (keys, key_scales, present): (&[simd::Q8Word], &[f32], usize),
    panel: &[f32],
    blocks: usize,
    scores: &mut [f32],
    maxima: &mut [f32],
) {
    // SAFETY: as the caller promises.
    unsafe {
        let zeros = [[simd::splat(0.0); C]; Q8_ROWS];
        let c = q8_sums::<Q8_ROWS, C>(zeros, (keys, key_scales, Q8_ROWS), panel, blocks);
        store_scores(&c, scores, maxima, present);
    }
}
}

/// The probabilities of a block of scores in place, `2^(log2_scale x + shift)` for the
/// shift of each query (column), by [`simd::exp2_softmax`]; adds each column's sum to
/// `sums`. Rows of [`FLASH_QT`] columns, the first `width` (whole vectors) computed.
#[inline(always)]
fn exp2_block(
    scores: &mut [f32],
    width: usize,
    log2_scale: f32,
    shift: &[f32; FLASH_QT],
    sums: &mut [f32; FLASH_QT],
) {
    const VECTORS: usize = FLASH_QT / LANES;
    let vector = |x: &[f32]| -> simd::F {
        let mut lanes = [0.0; LANES];
        lanes.copy_from_slice(&x[..LANES]);
        simd::from_lanes(lanes)
    };
    let vectors = width / LANES;
    let shifts: [simd::F; VECTORS] = std::array::from_fn(|v| vector(&shift[v * LANES..]));
    let mut totals = [simd::splat(0.0); VECTORS];
    let scale = simd::splat(log2_scale);
    for row in scores.chunks_exact_mut(FLASH_QT) {
        for (v, x) in row.chunks_exact_mut(LANES).take(vectors).enumerate() {
            let p = simd::exp2_softmax(simd::fma(vector(x), scale, shifts[v]));
            x.copy_from_slice(&simd::to_lanes(p));
            totals[v] = simd::add(totals[v], p);
        }
    }
    for (v, total) in totals.iter().enumerate().take(vectors) {
        for (s, t) in sums[v * LANES..][..LANES].iter_mut().zip(simd::to_lanes(*total)) {
            *s += t;
        }
    }
}

/// One score tile of the f32 kernel: the scores of [`KEY_ROWS`] keys (`keys`, packed as for
/// [`tile`]) by `C` vectors of queries (`queries`: [d][FLASH_QT] from the tile's first
/// column), written to `scores` (rows FLASH_QT apart), and `maxima[..C * LANES]` raised lane
/// by lane to the largest score of the first `present` keys (a NaN score leaves a maximum as
/// it was). [`tile`] did the products through an accumulator array in memory, which the
/// maxima and the copy into `scores` then read again: with heads of 64 a tile has only 64
/// steps, and that traffic made the score product the slower half of attention.
#[inline(always)]
fn score_tile<const C: usize>(
    keys: &[f32],
    queries: &[f32],
    d: usize,
    scores: &mut [f32],
    maxima: &mut [f32],
    present: usize,
) {
    assert!(
        d > 0
            && keys.len() >= d * KEY_ROWS
            && queries.len() >= (d - 1) * FLASH_QT + C * LANES
            && scores.len() >= (KEY_ROWS - 1) * FLASH_QT + C * LANES
            && maxima.len() >= C * LANES
            && present <= KEY_ROWS
    );
    // Out of line for the reason `tile_steps` is.
    let run_steps: ScoreTileSteps<C> = std::hint::black_box(score_tile_steps::<C>);
    // SAFETY: the assertion is what `score_tile_steps` needs; the instruction set of this
    // instance is present, since its code runs only inside its `run` functions.
    unsafe { run_steps(keys, queries, d, scores, maxima, present) }
}

/// The type of [`score_tile_steps`] as a function pointer.
type ScoreTileSteps<const C: usize> =
    unsafe fn(&[f32], &[f32], usize, &mut [f32], &mut [f32], usize);

instance_features! {
/// The loop of [`score_tile`].
///
/// # Safety
/// `d > 0`, `keys` holds `d * KEY_ROWS` values, `queries` `(d - 1) * FLASH_QT + C * LANES`,
/// `scores` `(KEY_ROWS - 1) * FLASH_QT + C * LANES`, `maxima` `C * LANES`, `present <=
/// KEY_ROWS`, and the CPU has this instance's features.
#[inline(never)]
unsafe fn score_tile_steps<const C: usize>(
    keys: &[f32],
    queries: &[f32],
    d: usize,
    scores: &mut [f32],
    maxima: &mut [f32],
    present: usize,
) {
    // SAFETY: as the caller promises, every access is in bounds: step i reads KEY_ROWS keys
    // at i * KEY_ROWS and C vectors of queries at i * FLASH_QT; row r of the scores is
    // written at r * FLASH_QT, C vectors; C vectors of maxima are read and written.
    unsafe {
        let mut c = [[simd::splat(0.0); C]; KEY_ROWS];
        let (mut kp, mut qp) = (keys.as_ptr(), queries.as_ptr());
        for _ in 0..d {
            let q: [simd::F; C] = std::array::from_fn(|v| simd::load(qp.add(v * LANES)));
            for (r, c) in c.iter_mut().enumerate() {
                let k = simd::splat(*kp.add(r));
                for (c, &q) in c.iter_mut().zip(&q) {
                    *c = simd::fma(k, q, *c);
                }
            }
            kp = kp.add(KEY_ROWS);
            qp = qp.add(FLASH_QT);
        }
        store_scores(&c, scores, maxima, present);
    }
}
}

/// A score tile's rows `c` written to `scores` (rows FLASH_QT apart), and `maxima` raised
/// lane by lane to the largest of the first `present` rows (a NaN score leaves a maximum as
/// it was).
///
/// # Safety
/// `scores` holds `(R - 1) * FLASH_QT + C * LANES` values, `maxima` `C * LANES`; inlined only
/// into functions compiled with this instance's features.
#[inline(always)]
unsafe fn store_scores<const R: usize, const C: usize>(
    c: &[[simd::F; C]; R],
    scores: &mut [f32],
    maxima: &mut [f32],
    present: usize,
) {
    // SAFETY: as the caller promises: row r's C vectors at r * FLASH_QT, C vectors of maxima.
    unsafe {
        let sp = scores.as_mut_ptr();
        for (r, c) in c.iter().enumerate() {
            for (v, &c) in c.iter().enumerate() {
                simd::store(sp.add(r * FLASH_QT + v * LANES), c);
            }
        }
        let mp = maxima.as_mut_ptr();
        for v in 0..C {
            let mut m = simd::load(mp.add(v * LANES));
            for row in c.iter().take(present) {
                m = simd::max(row[v], m);
            }
            simd::store(mp.add(v * LANES), m);
        }
    }
}

/// [`attention_tokens`] with bf16 products: Q, K, the probabilities and V rounded to bf16
/// pairs along each product's summed dimension, sums and softmax in f32.
#[inline(always)]
fn attention_tokens_bf16(
    srcs: &[Src<'_>],
    out: &mut [f32],
    _ne: [usize; 4],
    tokens: Range<usize>,
    _param: f32,
) {
    let (q, k, v) = (&srcs[0], &srcs[1], &srcs[2]);
    let [d, _, heads, _] = q.ne;
    let [dv, tk, _, _] = v.ne;
    // AMX tiles take heads that fill whole tiles (DA3's heads of 64 do).
    #[cfg(target_arch = "x86_64")]
    if simd::AMX_TILES
        && d.is_multiple_of(2 * super::amx::TILE_PAIRS)
        && dv.is_multiple_of(super::amx::BLOCK)
    {
        if let Some(tiles) = super::amx::Tiles::configure() {
            return attention_tokens_amx(&tiles, srcs, out, tokens);
        }
    }
    let (d2, tk2) = (d.div_ceil(2), tk.div_ceil(2));
    let scale = 1.0 / (d as f32).sqrt();
    let tk_pad = tk.div_ceil(SCORE_SPAN) * SCORE_SPAN;
    let pair_at =
        |row: &[f32], i: usize| bf16_pair(row[2 * i], row.get(2 * i + 1).copied().unwrap_or(0.0));
    // Words of bf16 pairs, in f32 slots for the tile: kt[i][j] = (k_j[2i], k_j[2i + 1]),
    // vp[j][c] = (v_2j[c], v_2j+1[c]).
    let mut kt = vec![0.0f32; d2 * tk_pad];
    let mut vp = vec![0.0f32; tk2 * dv];
    let (mut qp, mut pp) = (vec![0u32; QT * d2], vec![0u32; QT * tk2]);
    // One group of rows of each, packed for the tile.
    let mut group_q = vec![0u32; SCORE_ROWS * d2];
    let mut group_p = vec![0u32; VALUE_ROWS * tk2];
    let mut scores = vec![0.0f32; QT * tk_pad];
    let mut acc = vec![0.0f32; QT * dv];
    for h in 0..heads {
        let k_row = |j: usize| &k.data[j * k.nb[1] + h * k.nb[2]..][..d];
        for j in 0..tk {
            let row = k_row(j);
            for i in 0..d2 {
                kt[i * tk_pad + j] = f32::from_bits(pair_at(row, i));
            }
        }
        let v_row = |j: usize| &v.data[j * v.nb[1] + h * v.nb[2]..][..dv];
        for (j2, dst) in vp.chunks_exact_mut(dv).enumerate() {
            let (lo, hi) = (v_row(2 * j2), (2 * j2 + 1 < tk).then(|| v_row(2 * j2 + 1)));
            for (c, w) in dst.iter_mut().enumerate() {
                *w = f32::from_bits(bf16_pair(lo[c], hi.map_or(0.0, |hi| hi[c])));
            }
        }
        let mut t0 = tokens.start;
        while t0 < tokens.end {
            let n = QT.min(tokens.end - t0);
            for (r, dst) in qp.chunks_exact_mut(d2).take(n).enumerate() {
                simd::to_bf16_pairs(&q.data[(t0 + r) * q.nb[1] + h * q.nb[2]..][..d], dst);
            }
            for r0 in (0..n).step_by(SCORE_ROWS) {
                let rows: [&[u32]; SCORE_ROWS] =
                    std::array::from_fn(|r| &qp[(r0 + r).min(n - 1) * d2..][..d2]);
                pack_rows(&rows, d2, &mut group_q);
                for j0 in (0..tk_pad).step_by(SCORE_SPAN) {
                    let mut tile_acc = [[[0.0f32; LANES]; SCORE_VECTORS]; SCORE_ROWS];
                    tile(
                        Bf16Pairs,
                        &mut tile_acc,
                        &group_q,
                        &kt[j0..],
                        (d2, tk_pad),
                        (1, 0),
                    );
                    for (r, t) in tile_acc.iter().enumerate().take(n - r0) {
                        scores[(r0 + r) * tk_pad + j0..][..SCORE_SPAN]
                            .copy_from_slice(t.as_flattened());
                    }
                }
            }
            let mut sums = [0.0f32; QT];
            for (r, (s, dst)) in scores
                .chunks_exact_mut(tk_pad)
                .zip(pp.chunks_exact_mut(tk2))
                .take(n)
                .enumerate()
            {
                sums[r] = softmax_in_place(&mut s[..tk], scale);
                simd::to_bf16_pairs(&s[..tk], dst);
            }
            for r0 in (0..n).step_by(VALUE_ROWS) {
                let rows: [&[u32]; VALUE_ROWS] =
                    std::array::from_fn(|r| &pp[(r0 + r).min(n - 1) * tk2..][..tk2]);
                pack_rows(&rows, tk2, &mut group_p);
                let mut c0 = 0;
                while c0 < dv {
                    c0 += if dv - c0 >= VALUE_VECTORS * LANES {
                        values_block_bf16::<VALUE_VECTORS>(
                            &mut acc,
                            &group_p,
                            &vp,
                            (tk2, dv),
                            n,
                            r0,
                            c0,
                        )
                    } else {
                        values_block_bf16::<1>(&mut acc, &group_p, &vp, (tk2, dv), n, r0, c0)
                    };
                }
            }
            for (r, sum) in sums.iter().enumerate().take(n) {
                let dst = &mut out[((t0 - tokens.start + r) * heads + h) * dv..][..dv];
                for (o, &a) in dst.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
                    *o = a / sum;
                }
            }
            t0 += n;
        }
    }
}

/// [`attention_tokens_bf16`] on AMX tiles, for heads of a multiple of 32 values and value
/// rows of a multiple of 32: per head, the keys transposed and the values paired once, as
/// the vector kernel does (padded with zeros to blocks of 32 keys); per tile of 32 queries,
/// their scores against every block of keys from the tiles, an exact softmax in f32, the
/// probabilities as bf16 pairs (zero past the last key), and the weighted values from the
/// tiles. Queries past the end of `tokens` repeat the last one; their results are dropped.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn attention_tokens_amx(
    tiles: &super::amx::Tiles,
    srcs: &[Src<'_>],
    out: &mut [f32],
    tokens: Range<usize>,
) {
    use super::amx::BLOCK;
    let (q, k, v) = (&srcs[0], &srcs[1], &srcs[2]);
    let [d, _, heads, _] = q.ne;
    let [dv, tk, _, _] = v.ne;
    let (d2, tk_pad) = (d / 2, tk.div_ceil(BLOCK) * BLOCK);
    let tk2 = tk_pad / 2;
    let log2_scale = std::f32::consts::LOG2_E / (d as f32).sqrt();
    // Words of bf16 pairs, in f32 slots for the tiles: kt[i][j] = (k_j[2i], k_j[2i + 1]),
    // vp[j][c] = (v_2j[c], v_2j+1[c]); keys past `tk` are never written and stay zero.
    let mut kt = vec![0.0f32; d2 * tk_pad];
    let mut vp = vec![0.0f32; tk2 * dv];
    let (mut qp, mut key) = (vec![0u32; BLOCK * d2], vec![0u32; d2]);
    // Probabilities as bf16 pairs: pairs past the last key are never written and stay zero.
    let mut pp = vec![0u32; BLOCK * tk2];
    let mut scores = vec![0.0f32; BLOCK * tk_pad];
    let mut acc = vec![0.0f32; BLOCK * dv];
    for h in 0..heads {
        for j in 0..tk {
            simd::to_bf16_pairs(&k.data[j * k.nb[1] + h * k.nb[2]..][..d], &mut key);
            for (i, &word) in key.iter().enumerate() {
                kt[i * tk_pad + j] = f32::from_bits(word);
            }
        }
        let v_row = |j: usize| &v.data[j * v.nb[1] + h * v.nb[2]..][..dv];
        for (j2, dst) in vp.chunks_exact_mut(dv).take(tk.div_ceil(2)).enumerate() {
            let (lo, hi) = (v_row(2 * j2), (2 * j2 + 1 < tk).then(|| v_row(2 * j2 + 1)));
            for (c, w) in dst.iter_mut().enumerate() {
                *w = f32::from_bits(bf16_pair(lo[c], hi.map_or(0.0, |hi| hi[c])));
            }
        }
        for t0 in tokens.clone().step_by(BLOCK) {
            let n = BLOCK.min(tokens.end - t0);
            for (r, dst) in qp.chunks_exact_mut(d2).enumerate() {
                let token = t0 + r.min(n - 1);
                simd::to_bf16_pairs(&q.data[token * q.nb[1] + h * q.nb[2]..][..d], dst);
            }
            for j0 in (0..tk_pad).step_by(BLOCK) {
                let keys = (&kt[j0..], tk_pad);
                tiles.product_32x32((&qp, d2), keys, d2, (&mut scores[j0..], tk_pad), false);
            }
            let mut sums = [0.0f32; BLOCK];
            for (r, (s, dst)) in scores
                .chunks_exact(tk_pad)
                .zip(pp.chunks_exact_mut(tk2))
                .take(n)
                .enumerate()
            {
                sums[r] = softmax_to_bf16_pairs(&s[..tk], log2_scale, dst);
            }
            for c0 in (0..dv).step_by(BLOCK) {
                let values = (&vp[c0..], dv);
                tiles.product_32x32((&pp, tk2), values, tk2, (&mut acc[c0..], dv), false);
            }
            for (r, sum) in sums.iter().enumerate().take(n) {
                let dst = &mut out[((t0 - tokens.start + r) * heads + h) * dv..][..dv];
                for (o, &a) in dst.iter_mut().zip(&acc[r * dv..(r + 1) * dv]) {
                    *o = a / sum;
                }
            }
        }
    }
}

/// Rows `r0..r0 + VALUE_ROWS` (probabilities as bf16 pairs, packed) and columns `c0..c0 + C * LANES`
/// of the weighted values in bf16; returns the columns done.
#[inline(always)]
fn values_block_bf16<const C: usize>(
    acc: &mut [f32],
    rows: &[u32],
    vp: &[f32],
    (steps, dv): (usize, usize),
    n: usize,
    r0: usize,
    c0: usize,
) -> usize {
    let mut sums = [[[0.0f32; LANES]; C]; VALUE_ROWS];
    tile(Bf16Pairs, &mut sums, rows, &vp[c0..], (steps, dv), (1, 0));
    for (r, s) in sums.iter().enumerate().take(n - r0) {
        acc[(r0 + r) * dv + c0..][..C * LANES].copy_from_slice(s.as_flattened());
    }
    C * LANES
}

/// Rows `r0..r0 + VALUE_ROWS` and columns `c0..c0 + C * LANES` of the weighted values
/// `acc[r] (+)= Σ_j p[r][j] v_j` over `keys` keys: the probabilities of step j at
/// `p[j * p_step..]`, value row j at `j * v_stride` of `v`; added to what `acc` holds when
/// `accumulate`, else replacing it. Returns the columns done.
#[inline(always)]
fn values_block<const C: usize>(
    acc: &mut [f32],
    p: (&[f32], usize),
    (v, v_stride): (&[f32], usize),
    keys: usize,
    (r0, c0, dv): (usize, usize, usize),
    accumulate: bool,
) -> usize {
    let mut sums = [[[0.0f32; LANES]; C]; VALUE_ROWS];
    if accumulate {
        for (r, s) in sums.iter_mut().enumerate() {
            s.as_flattened_mut()
                .copy_from_slice(&acc[(r0 + r) * dv + c0..][..C * LANES]);
        }
    }
    tile_a_strided(F32, &mut sums, p, &v[c0..], (keys, v_stride), (1, 0));
    for (r, s) in sums.iter().enumerate() {
        acc[(r0 + r) * dv + c0..][..C * LANES].copy_from_slice(s.as_flattened());
    }
    C * LANES
}

/// One block of the running softmax: with `max` the largest score of the blocks before
/// (negative infinity for the first), `s = exp(scale (s - m))` in place for `m` the larger of
/// `max` and this block's largest; returns `m` and the sum of the new values (in f64).
#[inline(always)]
fn softmax_block(s: &mut [f32], scale: f32, max: f32) -> (f32, f64) {
    let whole = s.len() / V * V;
    let mut lanes = [max; V];
    for chunk in s[..whole].chunks_exact(V) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            // A plain comparison: `f32::max`'s NaN rule costs a blend per lane.
            *lane = if x > *lane { x } else { *lane };
        }
    }
    let max = s[whole..]
        .iter()
        .chain(&lanes)
        .copied()
        .fold(max, f32::max);
    (max, exp_and_sum(s, scale, max))
}

/// The softmax of a row of scores, `p = 2^(log2_scale (s - max s))` by [`exp2_softmax`]
/// (the probabilities are rounded to bf16, far coarser than its 5e-7), written as bf16
/// pairs into `dst` (the last pair of an odd row zero in its high half); returns the sum of
/// the f32 probabilities. One pass for the maximum, one for the rest.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn softmax_to_bf16_pairs(s: &[f32], log2_scale: f32, dst: &mut [u32]) -> f32 {
    let whole = s.len() / V * V;
    let mut lanes = [f32::NEG_INFINITY; V];
    for chunk in s[..whole].chunks_exact(V) {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = if x > *lane { x } else { *lane };
        }
    }
    let max = s[whole..]
        .iter()
        .chain(&lanes)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    let shift = -max * log2_scale;
    let mut sums = [0.0f32; V];
    for (chunk, words) in s[..whole].chunks_exact(V).zip(dst.chunks_exact_mut(V / 2)) {
        let p: [f32; V] = std::array::from_fn(|i| exp2_softmax(madd(chunk[i], log2_scale, shift)));
        for (sum, &p) in sums.iter_mut().zip(&p) {
            *sum += p;
        }
        simd::to_bf16_pairs(&p, words);
    }
    let tail: Vec<f32> = s[whole..]
        .iter()
        .map(|&x| exp2_softmax(madd(x, log2_scale, shift)))
        .collect();
    simd::to_bf16_pairs(&tail, &mut dst[whole / 2..]);
    let total: f64 = tail.iter().chain(&sums).map(|&x| x as f64).sum();
    total as f32
}

/// `s = exp(scale (s - max s))` in place; returns the sum.
#[inline(always)]
fn softmax_in_place(s: &mut [f32], scale: f32) -> f32 {
    softmax_block(s, scale, f32::NEG_INFINITY).1 as f32
}

/// `s = exp(scale (s - max))` in place; returns the sum in f64. Reductions run in `V` lanes
/// (here and in [`softmax_block`]): a serial one would not vectorise.
#[inline(always)]
fn exp_and_sum(s: &mut [f32], scale: f32, max: f32) -> f64 {
    let whole = s.len() / V * V;
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
    s[whole..].iter().chain(&lanes).map(|&x| x as f64).sum()
}

/// 2^t for t <= 0, to 5e-7 relative (a degree-5 fit of 2^f on [-1/2, 1/2] and an exponent
/// built from bits), for the f32 attention's softmax: e^(s (x - m)) is 2^(x c - m c) with
/// c = s log2(e) folded into one multiply-add per score, half the instructions of [`exp`].
/// Arguments below -100 give 2^-100 (not 0, and never a subnormal: see
/// [`EXP_FLUSH_BELOW`]), 1e-30 of the row's largest probability.
#[inline(always)]
fn exp2_softmax(t: f32) -> f32 {
    const SHIFT: f32 = 12_582_912.0;
    let t = t.max(-100.0);
    let shifted = t + SHIFT;
    let f = t - (shifted - SHIFT);
    let p = EXP2_FIT.iter().fold(0.0, |acc, &c| madd(acc, f, c));
    let n_bits = shifted.to_bits().wrapping_sub(SHIFT.to_bits());
    p * f32::from_bits(n_bits.wrapping_add(127) << 23)
}

/// The coefficients of [`exp2_softmax`]'s fit of 2^f on [-1/2, 1/2], highest power first.
const EXP2_FIT: [f32; 6] = [
    1.326_091_5e-3,
    9.670_18e-3,
    5.550_712_3e-2,
    2.402_222_5e-1,
    // The fit's linear term was within 2e-7 of ln 2.
    std::f32::consts::LN_2,
    1.0,
];

/// Below this, [`exp`] is 0: a softmax probability under e^-60 (1e-26 of the row's largest)
/// adds nothing an f32 sum can hold, and kept, its products with the values can be subnormal,
/// for which Intel cores take a microcode assist per instruction (on a Xeon, f32 attention
/// took half the time once these were flushed).
const EXP_FLUSH_BELOW: f32 = -60.0;

/// e^x for x <= 0 to about 1 ulp (Cephes' polynomial on [-ln2/2, ln2/2] and an exponent
/// built from bits), 0 below [`EXP_FLUSH_BELOW`]; branch-free so that loops over it
/// vectorise.
#[inline(always)]
fn exp(x: f32) -> f32 {
    let flushed = x < EXP_FLUSH_BELOW;
    // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits, which then
    // become the exponent of 2^n (a float-to-int cast would not vectorise).
    const SHIFT: f32 = 12_582_912.0;
    let x = x.max(EXP_FLUSH_BELOW);
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
    let e = y * f32::from_bits(n_bits.wrapping_add(127) << 23);
    if flushed {
        0.0
    } else {
        e
    }
}

/// Result rows computed together: `GEMM_ROWS` x `SPAN` accumulators fill most of the vector
/// registers (32 with AVX-512, 16 with AVX2) and leave room for the panel's vectors and a
/// broadcast.
const GEMM_ROWS: usize = if simd::REGISTERS >= 32 { 12 } else { 6 };
/// Columns of a panel computed together: two vectors.
const SPAN: usize = 2 * LANES;
use simd::LANES;

/// What is applied to a product before it is stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Epilogue {
    Bias,
    BiasGelu,
    ScaledResidual,
}

/// Rows `rows` of `x W^T + b`, then the epilogue: `srcs` are the panels of W
/// ([PANEL, K, N / PANEL]), `x` [K, T], `b` [N], and for [`Epilogue::ScaledResidual`] a scale
/// [N] and a residual [N, T]; `out` holds the rows' N values each.
#[inline(always)]
fn linear_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    epilogue: Epilogue,
) {
    if srcs[0].dtype == DType::I8 {
        return linear_rows_q8(srcs, out, ne, rows, epilogue);
    }
    let (n, k) = (ne[0], srcs[1].ne[0]);
    // The packed rows of one block, allocated once for every block: f32 words (for f32 and
    // f16 weights), or bf16 pairs with a weight of bf16 pairs (and the pairs of one group
    // before packing).
    let bf16 = srcs[0].dtype == DType::I32;
    let depth = if bf16 { k / 2 } else { k };
    // AMX tiles take a bf16 weight whose depth fills whole tiles (every DA3 layer's does).
    #[cfg(target_arch = "x86_64")]
    let tiles = if bf16 && simd::AMX_TILES && depth.is_multiple_of(super::amx::TILE_PAIRS) {
        super::amx::Tiles::configure()
    } else {
        None
    };
    #[cfg(target_arch = "x86_64")]
    let vectors = tiles.is_none();
    #[cfg(not(target_arch = "x86_64"))]
    let vectors = true;
    let len = LINEAR_ROW_BLOCK.min(rows.len()).div_ceil(GEMM_ROWS) * GEMM_ROWS * depth;
    // On AMX tiles, a block's rows as pairs in groups of the tiles' rows.
    #[cfg(target_arch = "x86_64")]
    let pairs_len = if vectors {
        len
    } else {
        let tile_rows = super::amx::BLOCK;
        LINEAR_ROW_BLOCK.min(rows.len()).div_ceil(tile_rows) * tile_rows * depth
    };
    #[cfg(not(target_arch = "x86_64"))]
    let pairs_len = len;
    let mut packed = PackedRows {
        f32: super::Scratch::take(&super::SCRATCH_0, if bf16 { 0 } else { len }, 0.0),
        pairs: super::Scratch::take(&super::SCRATCH_PAIRS_0, if bf16 { pairs_len } else { 0 }, 0),
        group_pairs: super::Scratch::take(
            &super::SCRATCH_PAIRS_1,
            if bf16 && vectors { GEMM_ROWS * depth } else { 0 },
            0,
        ),
        sums: Vec::new(),
    };
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + LINEAR_ROW_BLOCK).min(rows.end);
        let block = &mut out[(start - rows.start) * n..(end - rows.start) * n];
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = &tiles {
            linear_block_amx(tiles, srcs, block, ne, start..end, epilogue, &mut packed.pairs);
            start = end;
            continue;
        }
        linear_block(srcs, block, ne, start..end, epilogue, &mut packed);
        start = end;
    }
}

/// [`linear_block`] on AMX tiles, for a bf16 weight whose depth is a multiple of
/// [`super::amx::TILE_PAIRS`]: the block's input rows as bf16 pairs, row by row, in groups
/// of 32 (rows past the end repeat the last one; their results are dropped); per panel (32
/// columns) and group, a 32 x 32 block of sums from the tiles, then the bias and the
/// epilogue. `pairs` is the buffer the rows are converted into.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn linear_block_amx(
    tiles: &super::amx::Tiles,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    epilogue: Epilogue,
    pairs: &mut [u32],
) {
    use super::amx::BLOCK;
    const _: () = assert!(PANEL == BLOCK, "a panel is one block of tile columns");
    let (panels, x, bias) = (&srcs[0], &srcs[1], &srcs[2].data);
    let (k, n, count) = (x.ne[0], ne[0], rows.len());
    if count == 0 {
        return;
    }
    let depth = k / 2;
    let groups = count.div_ceil(BLOCK);
    let pairs = &mut pairs[..groups * BLOCK * depth];
    for (r, row) in pairs.chunks_exact_mut(depth).enumerate() {
        let source = rows.start + r.min(count - 1);
        simd::to_bf16_pairs(&x.data[source * x.nb[1]..][..k], row);
    }
    let mut sums = [0.0f32; BLOCK * BLOCK];
    // Each panel stays in L1/L2 while the block's groups of rows pass over it. (Asking for
    // the next panel ahead, as `linear_block` does, made da3-base's f16 file 3.5% slower on
    // a Sapphire Rapids Xeon, three alternating rounds: the tiles' loads did not wait for it.)
    for (p, panel) in panels.data.chunks_exact(depth * PANEL).enumerate() {
        let col = p * PANEL;
        let bias = &bias[col..col + PANEL];
        for g in 0..groups {
            let group = &pairs[g * BLOCK * depth..][..BLOCK * depth];
            tiles.product_32x32((group, depth), (panel, PANEL), depth, (&mut sums, BLOCK), false);
            for r in 0..BLOCK.min(count - g * BLOCK) {
                let acc = &sums[r * BLOCK..][..BLOCK];
                let row = g * BLOCK + r;
                let dst = &mut out[row * n + col..][..PANEL];
                store_with_epilogue(epilogue, acc, Some(bias), srcs, (rows.start + row, col), dst);
            }
        }
    }
}

/// The buffers [`linear_block`] packs a block's rows into, and the sums of a panel's
/// tiles between slices of its depth.
struct PackedRows {
    f32: super::Scratch<f32>,
    pairs: super::Scratch<u32>,
    group_pairs: super::Scratch<u32>,
    sums: Vec<[[[f32; LANES]; 2]; GEMM_ROWS]>,
}

/// Rows of a thread's share taken at a time by [`linear_rows`]: their packed copy (at most
/// 2.4 MB, for 3,072 inputs) stays in cache while every panel of the weight passes over it.
/// Packing a whole share at once did not: a scene of 8 views gives each of 2 threads 3,460
/// rows, 10.6 MB per thread at 768 inputs, which streamed from memory once per panel.
const LINEAR_ROW_BLOCK: usize = 192;
const _: () = assert!(LINEAR_ROW_BLOCK.is_multiple_of(GEMM_ROWS));

/// Steps of a panel (inputs, or input pairs of a bf16 weight) that [`linear_block`] takes
/// at a time: 24 KB of an f32 panel, for L1 (48 KB on Intel since Ice Lake, 32 KB on Zen 3)
/// beside a group's 9 KB of packed rows; the sums of a full row block (24 KB) pass through
/// it too, once per slice. On a Sapphire Rapids Xeon 96 to 256 steps measured alike, and
/// whole panels within 3% (slower in four alternating rounds of six).
const LINEAR_DEPTH_BLOCK: usize = 192;

/// [`linear_rows`] for one block of rows.
#[inline(always)]
fn linear_block(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    epilogue: Epilogue,
    packed: &mut PackedRows,
) {
    let (panels, x, bias) = (&srcs[0], &srcs[1], &srcs[2].data);
    let (k, n, count) = (x.ne[0], ne[0], rows.len());
    if count == 0 {
        return;
    }
    let x_row = |r: usize| &x.data[(rows.start + r) * x.nb[1]..][..k];
    // The block's input rows packed for the tile once, for every panel, in groups of
    // GEMM_ROWS (rows past the end repeat the last one; their results are dropped); with a
    // bf16 weight, as bf16 pairs.
    let bf16 = panels.dtype == DType::I32;
    let depth = if bf16 { k / 2 } else { k };
    let groups = count.div_ceil(GEMM_ROWS);
    let group_len = GEMM_ROWS * depth;
    let last = |r: usize| r.min(count - 1);
    let PackedRows {
        f32: x_packed,
        pairs: x_pairs,
        group_pairs: pairs,
        ..
    } = packed;
    if bf16 {
        for (g, dst) in x_pairs
            .chunks_exact_mut(group_len.max(1))
            .take(groups)
            .enumerate()
        {
            for (r, row) in pairs.chunks_exact_mut(depth.max(1)).enumerate() {
                simd::to_bf16_pairs(x_row(last(g * GEMM_ROWS + r)), row);
            }
            let rows: [&[u32]; GEMM_ROWS] = std::array::from_fn(|r| &pairs[r * depth..]);
            pack_rows(&rows, depth, dst);
        }
    } else {
        for (g, dst) in x_packed
            .chunks_exact_mut(group_len.max(1))
            .take(groups)
            .enumerate()
        {
            let rows: [&[f32]; GEMM_ROWS] =
                std::array::from_fn(|r| x_row(last(g * GEMM_ROWS + r)));
            pack_rows(&rows, depth, dst);
        }
    }
    // An f16 weight: its panels as halves, two per word of `data`.
    let halves = (panels.dtype == DType::F16).then(|| panels.halves());
    let panel_words = if halves.is_some() {
        depth * PANEL / 2
    } else {
        depth * PANEL
    };
    // Each panel (at most a few hundred KB) stays in L2 while the block's rows sweep past
    // it, and a slice of LINEAR_DEPTH_BLOCK of its steps in L1 while every group of rows
    // passes over it (whole panels of 768 inputs and more, 96 KB and up, came from L2 for
    // every group; on a Sapphire Rapids Xeon, alternating end to end, whole panels were
    // 0-3% slower in four rounds of six, within that machine's drift). The sums
    // of every group and span wait in `acc` between slices, and the epilogue runs once the
    // last slice is summed.
    let spans = PANEL / SPAN;
    let acc = &mut packed.sums;
    for (p, panel) in panels.data.chunks_exact(panel_words).enumerate() {
        let col = p * PANEL;
        let bias: [[[f32; LANES]; 2]; PANEL / SPAN] = std::array::from_fn(|s| {
            std::array::from_fn(|v| {
                bias[col + s * SPAN + v * LANES..][..LANES]
                    .try_into()
                    .expect("LANES values")
            })
        });
        acc.clear();
        acc.extend((0..spans * groups).map(|i| [bias[i / groups]; GEMM_ROWS]));
        // The next panel, a part before each tile of this one.
        let next = panels.data.get((p + 1) * panel_words..(p + 2) * panel_words);
        let tiles = depth.div_ceil(LINEAR_DEPTH_BLOCK) * spans * groups;
        let mut tile_index = 0;
        for first in (0..depth).step_by(LINEAR_DEPTH_BLOCK) {
            let steps = LINEAR_DEPTH_BLOCK.min(depth - first);
            for span in 0..spans {
                for g in 0..groups {
                    if let Some(next) = next {
                        super::prefetch_part(next, tile_index, tiles);
                        tile_index += 1;
                    }
                    let acc = &mut acc[span * groups + g];
                    let held = GEMM_ROWS.min(count - g * GEMM_ROWS);
                    let xs = g * group_len + first * GEMM_ROWS..;
                    let b_at = first * PANEL + span * SPAN;
                    let outer = (steps, PANEL);
                    if bf16 {
                        let (xs, b) = (&x_pairs[xs], &panel[b_at..]);
                        group_tile(Bf16Pairs, acc, held, xs, b, outer);
                    } else if let Some(halves) = halves {
                        let b = &halves[p * depth * PANEL + b_at..];
                        group_tile(F16Weights, acc, held, &x_packed[xs], b, outer);
                    } else {
                        group_tile(F32, acc, held, &x_packed[xs], &panel[b_at..], outer);
                    }
                }
            }
        }
        for span in 0..spans {
            let col = col + span * SPAN;
            for (g, acc) in acc[span * groups..][..groups].iter_mut().enumerate() {
                let r0 = g * GEMM_ROWS;
                for (r, acc) in acc.iter().enumerate().take(GEMM_ROWS.min(count - r0)) {
                    let dst = &mut out[(r0 + r) * n + col..][..SPAN];
                    let at = (rows.start + r0 + r, col);
                    store_with_epilogue(epilogue, acc.as_flattened(), None, srcs, at, dst);
                }
            }
        }
    }
}

/// Rows of the tile that takes a group holding no more (the last of a thread's share:
/// 865 tokens split over 2 threads leave one a group of a single row, which a full tile
/// would have charged as 12, and the other thread waited for it).
const TAIL_ROWS: usize = GEMM_ROWS / 3;

/// [`tile`] for a group of packed rows of which `held` are real: on [`TAIL_ROWS`] rows where
/// that covers them.
#[inline(always)]
fn group_tile<P: Products>(
    products: P,
    acc: &mut [[[f32; LANES]; 2]; GEMM_ROWS],
    held: usize,
    a: &[P::Scalar],
    b: &[P::B],
    outer: (usize, usize),
) {
    if held <= TAIL_ROWS {
        let acc: &mut [[[f32; LANES]; 2]; TAIL_ROWS] =
            (&mut acc[..TAIL_ROWS]).try_into().expect("TAIL_ROWS rows");
        tile_a_strided(products, acc, (a, GEMM_ROWS), b, outer, (1, 0));
    } else {
        tile(products, acc, a, b, outer, (1, 0));
    }
}

/// The epilogue on the products of result row `row`, columns from `col` (`acc`, biased, or
/// plus `bias` where given), stored at `dst`: in vectors, straight from the sums a tile
/// stored (a scalar epilogue and a copy of its result were a fifth of a residual layer's
/// time: the copy's vector loads of values just stored one by one stalled).
#[inline(always)]
fn store_with_epilogue(
    epilogue: Epilogue,
    acc: &[f32],
    bias: Option<&[f32]>,
    srcs: &[Src<'_>],
    (row, col): (usize, usize),
    dst: &mut [f32],
) {
    let width = acc.len();
    assert!(dst.len() == width && width.is_multiple_of(LANES));
    let bias = bias.map(|b| &b[..width]);
    let (scale, residual) = match epilogue {
        Epilogue::ScaledResidual => {
            let residual = &srcs[4];
            let at = row * residual.nb[1] + col;
            (&srcs[3].data[col..][..width], &residual.data[at..][..width])
        }
        Epilogue::Bias | Epilogue::BiasGelu => (&[][..], &[][..]),
    };
    for i in (0..width).step_by(LANES) {
        // SAFETY: i + LANES <= width, the length of `acc`, `dst` (asserted) and, where they
        // are read, `bias`, `scale` and `residual` (sliced to it above).
        unsafe {
            let mut y = simd::load(acc.as_ptr().add(i));
            if let Some(bias) = bias {
                y = simd::add(y, simd::load(bias.as_ptr().add(i)));
            }
            y = match epilogue {
                Epilogue::Bias => y,
                Epilogue::BiasGelu => gelu_vector(y),
                Epilogue::ScaledResidual => {
                    let s = simd::load(scale.as_ptr().add(i));
                    simd::fma(y, s, simd::load(residual.as_ptr().add(i)))
                }
            };
            simd::store(dst.as_mut_ptr().add(i), y);
        }
    }
}

/// Rows of the int8 kernel's register tile, and vectors of columns (each set's choice for its
/// registers, `simd::Q8_TILE`).
const Q8_ROWS: usize = simd::Q8_TILE.0;
const Q8_VECTORS: usize = simd::Q8_TILE.1;
const Q8_SPAN: usize = Q8_VECTORS * LANES;
const _: () = assert!(PANEL.is_multiple_of(Q8_SPAN));

/// [`linear_rows`] with a weight packed for int8 products ([`super::pack_panels_q8`],
/// `srcs[0]` [Q8_RECORD words, K / 32, N / PANEL]): each block of 32 inputs of a row is
/// quantised as ggml quantises a q8_0 product's activations (scale `max |x| / 127` kept as
/// f16, values `x · 127 / max |x|` rounded to even), the integer sums of a block are exact,
/// and each is scaled by the weight's and the input's scales into the f32 result: ggml's
/// `vec_dot_q8_0_q8_0` for a whole tile of rows and columns at a time.
#[inline(always)]
fn linear_rows_q8(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    epilogue: Epilogue,
) {
    let (panels, x, bias) = (&srcs[0], &srcs[1], &srcs[2].data);
    let (n, k) = (ne[0], x.ne[0]);
    let blocks = k / Q8_BLOCK;
    let quads = k / 4;
    let block_rows = LINEAR_ROW_BLOCK.min(rows.len());
    let max_groups = block_rows.div_ceil(Q8_ROWS);
    let mut x_quads: Vec<simd::Q8Word> = vec![Default::default(); max_groups * Q8_ROWS * quads];
    let mut x_scales = vec![0f32; max_groups * Q8_ROWS * blocks];
    let mut start = rows.start;
    while start < rows.end {
        let end = (start + LINEAR_ROW_BLOCK).min(rows.end);
        let count = end - start;
        let groups = count.div_ceil(Q8_ROWS);
        // The block's rows quantised and packed for the tile in groups of Q8_ROWS (rows past
        // the end repeat the last one; their results are dropped).
        for g in 0..groups {
            let rows: [&[f32]; Q8_ROWS] = std::array::from_fn(|r| {
                let row = start + (g * Q8_ROWS + r).min(count - 1);
                &x.data[row * x.nb[1]..][..k]
            });
            pack_q8_rows(
                &rows,
                &mut x_quads[g * Q8_ROWS * quads..][..Q8_ROWS * quads],
                &mut x_scales[g * Q8_ROWS * blocks..][..Q8_ROWS * blocks],
            );
        }
        let block_out = &mut out[(start - rows.start) * n..(end - rows.start) * n];
        let record_len = blocks * Q8_RECORD;
        for (p, panel) in panels.data.chunks_exact(record_len).enumerate() {
            // The next panel, a part before each tile of this one (as in `linear_block`).
            let next = panels.data.get((p + 1) * record_len..(p + 2) * record_len);
            let tiles = PANEL / Q8_SPAN * groups;
            let mut tile_index = 0;
            for span in (0..PANEL).step_by(Q8_SPAN) {
                let col = p * PANEL + span;
                let bias: [[f32; LANES]; Q8_VECTORS] = std::array::from_fn(|v| {
                    bias[col + v * LANES..][..LANES]
                        .try_into()
                        .expect("LANES values")
                });
                for g in 0..groups {
                    if let Some(next) = next {
                        super::prefetch_part(next, tile_index, tiles);
                        tile_index += 1;
                    }
                    let mut acc = [bias; Q8_ROWS];
                    let rows = (
                        &x_quads[g * Q8_ROWS * quads..][..Q8_ROWS * quads],
                        &x_scales[g * Q8_ROWS * blocks..][..Q8_ROWS * blocks],
                        Q8_ROWS,
                    );
                    q8_tile(&mut acc, rows, &panel[span..], blocks);
                    let r0 = g * Q8_ROWS;
                    for (r, acc) in acc.iter().enumerate().take(Q8_ROWS.min(count - r0)) {
                        let dst = &mut block_out[(r0 + r) * n + col..][..Q8_SPAN];
                        let at = (start + r0 + r, col);
                        store_with_epilogue(epilogue, acc.as_flattened(), None, srcs, at, dst);
                    }
                }
            }
        }
        start = end;
    }
}

/// `rows` (whole blocks of 32 values each) quantised block by block ([`quantize_block`]) and
/// packed for [`q8_tile`] as the rows of its register tile: word q of block b of row r at
/// `quads[(b * 8 + q) * Q8_ROWS + r]`, its scale at `scales[b * Q8_ROWS + r]`.
#[inline(always)]
fn pack_q8_rows(rows: &[&[f32]; Q8_ROWS], quads: &mut [simd::Q8Word], scales: &mut [f32]) {
    for (r, values) in rows.iter().enumerate() {
        for (b, chunk) in values.chunks_exact(Q8_BLOCK).enumerate() {
            let (scale, words) = quantize_block(chunk.try_into().expect("a block"));
            scales[b * Q8_ROWS + r] = scale;
            for (q, word) in words.into_iter().enumerate() {
                quads[(b * Q8_BLOCK / 4 + q) * Q8_ROWS + r] = simd::q8_word(word);
            }
        }
    }
}

/// Values are rounded to the nearest integer, ties to even, by adding 1.5 * 2^23 (and an
/// offset, even, so the ties still go to the even value): the integer is then the low bits of
/// the sum's mantissa, and for values within [-128, 255] its low byte is the byte (the two's
/// complement of a negative one; 1.5 * 2^23 is a multiple of 256). A float-to-int cast
/// saturates; in vectors this is one add and one narrowing.
const ROUNDING_SHIFT: f32 = 12_582_912.0;

/// One block of 32 inputs quantised as ggml's `quantize_row_q8_0` does for a product's
/// activations: the scale (rounded through f16, as ggml stores it) and the bytes, four per
/// word, offset to unsigned where the set's products take them so ([`simd::Q8_OFFSET`]).
/// The 7-bit set ([`simd::Q8_LEVELS`] 63) quantises the same way to -63..63.
#[inline(always)]
fn quantize_block(values: &[f32; Q8_BLOCK]) -> (f32, [u32; Q8_BLOCK / 4]) {
    let max = simd::q8_max(values);
    let inverse = if max != 0.0 { simd::Q8_LEVELS / max } else { 0.0 };
    let bytes = simd::q8_bytes(values, inverse, ROUNDING_SHIFT + simd::Q8_OFFSET);
    let words = std::array::from_fn(|q| {
        u32::from_le_bytes([bytes[4 * q], bytes[4 * q + 1], bytes[4 * q + 2], bytes[4 * q + 3]])
    });
    (half::f16::from_f32(max / simd::Q8_LEVELS).to_f32(), words)
}

/// The int8 register tile: `acc[r][v] += Σ_b dx[b][r] dw_b[v] Σ_i x_b[i][r] w_b[i][v]` over
/// `blocks` blocks of 32 inputs, with `x` the rows' packed quads (`[K / 4][x_step]` words, the
/// tile's rows first in each step), `dx` their scales (`[K / 32][x_step]`) and `panel` a
/// panel's records from the tile's first column ([`q8_sums`]).
#[inline(always)]
fn q8_tile<const R: usize, const C: usize>(
    acc: &mut [[[f32; LANES]; C]; R],
    (x, dx, x_step): (&[simd::Q8Word], &[f32], usize),
    panel: &[f32],
    blocks: usize,
) {
    if blocks == 0 {
        return;
    }
    let last_read = (blocks - 1) * Q8_RECORD + Q8_CORRECTIONS + C * LANES;
    assert!(
        panel.len() >= last_read
            && x_step >= R
            && x.len() >= (blocks * Q8_BLOCK / 4 - 1) * x_step + R
            && dx.len() >= (blocks - 1) * x_step + R
            && C * LANES <= PANEL
    );
    let run_steps: Q8TileSteps<R, C> = std::hint::black_box(q8_tile_steps::<R, C>);
    // SAFETY: the assertion is what `q8_tile_steps` needs; the instruction set of this
    // instance is present, since its code runs only inside its `run` functions.
    unsafe { run_steps(acc, (x, dx, x_step), panel, blocks) }
}

/// The type of [`q8_tile_steps`] as a function pointer (called as [`tile`] calls its loop).
type Q8TileSteps<const R: usize, const C: usize> =
    unsafe fn(&mut [[[f32; LANES]; C]; R], (&[simd::Q8Word], &[f32], usize), &[f32], usize);

instance_features! {
/// The loop of [`q8_tile`] (a function of its own for the reason `tile_steps` is).
///
/// # Safety
/// As for [`q8_sums`], and the CPU has this instance's features.
#[inline(never)]
unsafe fn q8_tile_steps<const R: usize, const C: usize>(
    acc: &mut [[[f32; LANES]; C]; R],
    rows: (&[simd::Q8Word], &[f32], usize),
    panel: &[f32],
    blocks: usize,
) {
    // SAFETY: `acc` holds R x C vectors; the rest as the caller promises.
    unsafe {
        let c = std::array::from_fn(|r| std::array::from_fn(|v| simd::load(acc[r][v].as_ptr())));
        let c = q8_sums::<R, C>(c, rows, panel, blocks);
        for (acc, c) in acc.iter_mut().zip(&c) {
            for (acc, &c) in acc.iter_mut().zip(c) {
                simd::store(acc.as_mut_ptr(), c);
            }
        }
    }
}
}

/// The products of the int8 register tile added to `c`, in registers: `c[r][v] += Σ_b dx[b][r]
/// dw_b[v] Σ_i x_b[i][r] w_b[i][v]` ([`q8_tile`]). Row r's word of step s (block s / 8, its
/// inputs 4 (s % 8) .. + 3) is `x[s * x_step + r]`, its scale of block b `dx[b * x_step + r]`:
/// rows packed for the tile (`x_step` R), or a wider matrix's rows read in place.
///
/// # Safety
/// `panel` holds `(blocks - 1) * Q8_RECORD + Q8_CORRECTIONS + C * LANES` words, `x`
/// `(blocks * 8 - 1) * x_step + R`, `dx` `(blocks - 1) * x_step + R`, `x_step >= R` and
/// `C * LANES <= PANEL`; inlined only into functions compiled with this instance's features.
#[inline(always)]
unsafe fn q8_sums<const R: usize, const C: usize>(
    mut c: [[simd::F; C]; R],
    (x, dx, x_step): (&[simd::Q8Word], &[f32], usize),
    panel: &[f32],
    blocks: usize,
) -> [[simd::F; C]; R] {
    // SAFETY: as the caller promises, every read is in bounds: block b reads C vectors at
    // b * Q8_RECORD + q * PANEL (q < 8), + Q8_SCALES and + Q8_CORRECTIONS, all below the
    // promised length since C * LANES <= PANEL; words s * x_step + r (s < 8 * blocks, r < R)
    // of `x` and b * x_step + r of `dx`.
    unsafe {
        let mut xp = x.as_ptr();
        for b in 0..blocks {
            let record = panel.as_ptr().add(b * Q8_RECORD);
            let mut sums: [[simd::I; C]; R] = std::array::from_fn(|_| {
                std::array::from_fn(|v| simd::q8_init(record.add(Q8_CORRECTIONS + v * LANES)))
            });
            for q in 0..Q8_BLOCK / 4 {
                let w: [simd::Q8Weights; C] =
                    std::array::from_fn(|v| simd::q8_load(record.add(q * PANEL + v * LANES)));
                for (r, sums) in sums.iter_mut().enumerate() {
                    let xs = simd::q8_splat(xp.add(r));
                    for (s, &w) in sums.iter_mut().zip(&w) {
                        *s = simd::q8_dot(*s, xs, w);
                    }
                }
                xp = xp.add(x_step);
            }
            let scales: [simd::F; C] =
                std::array::from_fn(|v| simd::load(record.add(Q8_SCALES + v * LANES)));
            for (r, (c, sums)) in c.iter_mut().zip(&sums).enumerate() {
                let row_scale = simd::splat(*dx.get_unchecked(b * x_step + r));
                for ((c, &s), &w_scale) in c.iter_mut().zip(sums).zip(&scales) {
                    *c = simd::fma(simd::q8_to_f32(s), simd::mul(w_scale, row_scale), *c);
                }
            }
        }
        c
    }
}

/// How the register tile multiplies: f32 FMAs (over f32 or f16 values of `b`), or pairs of
/// bf16 summed into f32.
trait Products: Copy {
    /// A value of a row of `a`: an f32, or a word holding two bf16.
    type Scalar: Copy;
    type Splat: Copy;
    /// A value of `b`: an f32 (or a word of two bf16, read through an f32 slot), or f16 bits.
    type B: Copy;
    fn splat(x: Self::Scalar) -> Self::Splat;
    /// LANES values of `b` from `p` as a vector of this product's operands.
    ///
    /// # Safety
    /// `p` is valid for reading LANES values, and the CPU has this instance's features.
    unsafe fn load_b(p: *const Self::B) -> simd::F;
    /// `acc + x · b`, with `b` read as this product's operands.
    fn madd(acc: simd::F, x: Self::Splat, b: simd::F) -> simd::F;
}

/// f32 products: one FMA per lane.
#[derive(Clone, Copy)]
struct F32;

impl Products for F32 {
    type Scalar = f32;
    type Splat = simd::F;
    type B = f32;
    #[inline(always)]
    fn splat(x: f32) -> simd::F {
        simd::splat(x)
    }
    #[inline(always)]
    unsafe fn load_b(p: *const f32) -> simd::F {
        // SAFETY: as the caller promises.
        unsafe { simd::load(p) }
    }
    #[inline(always)]
    fn madd(acc: simd::F, x: simd::F, b: simd::F) -> simd::F {
        simd::fma(x, b, acc)
    }
}

/// f32 products over f16 values of `b` (an f16 weight packed as panels), widened as they are
/// loaded (`vcvtph2ps`): the f32 kernel's arithmetic on half the weight bytes.
#[derive(Clone, Copy)]
struct F16Weights;

impl Products for F16Weights {
    type Scalar = f32;
    type Splat = simd::F;
    type B = u16;
    #[inline(always)]
    fn splat(x: f32) -> simd::F {
        simd::splat(x)
    }
    #[inline(always)]
    unsafe fn load_b(p: *const u16) -> simd::F {
        // SAFETY: as the caller promises.
        unsafe { simd::load_f16(p) }
    }
    #[inline(always)]
    fn madd(acc: simd::F, x: simd::F, b: simd::F) -> simd::F {
        simd::fma(x, b, acc)
    }
}

/// bf16 products: every word of `a` and of `b` (read through f32 slots) is a pair of bf16,
/// multiplied pairwise and summed into an f32 lane (`vdpbf16ps`: twice the multiply-adds of
/// an f32 FMA).
#[derive(Clone, Copy)]
struct Bf16Pairs;

impl Products for Bf16Pairs {
    type Scalar = u32;
    type Splat = simd::Bf16Splat;
    type B = f32;
    #[inline(always)]
    fn splat(x: u32) -> Self::Splat {
        simd::bf16_splat(x)
    }
    #[inline(always)]
    unsafe fn load_b(p: *const f32) -> simd::F {
        // SAFETY: as the caller promises.
        unsafe { simd::load(p) }
    }
    #[inline(always)]
    fn madd(acc: simd::F, x: Self::Splat, b: simd::F) -> simd::F {
        simd::bf16_madd(acc, x, b)
    }
}

/// A register tile: `acc[r][c..c + LANES] (+)= Σ_i a[i][r] b_i[c..c + LANES]` for `R` rows
/// and `C` vectors of columns, over `outer * inner` steps `i`; step `i = o * inner + n` reads
/// `b` at `o * outer_stride + n * inner_stride`. `a` is packed ([`pack_rows`]): the `R` row
/// values of step `i` at `a[i * R..]`, so that one pointer walks them all (with a pointer per
/// row, 16 general registers did not hold them, and the loop reloaded them from the stack).
/// Starts from the values in `acc` (bias, or a partial sum); every read is checked up front.
/// One kernel serves the matrix product (inner 1), the direct convolution (a kernel row of
/// taps, one value apart, per input row) and both products of attention.
#[inline(always)]
fn tile<P: Products, const R: usize, const C: usize>(
    products: P,
    acc: &mut [[[f32; LANES]; C]; R],
    a: &[P::Scalar],
    b: &[P::B],
    outer: (usize, usize),
    inner: (usize, usize),
) {
    tile_a_strided(products, acc, (a, R), b, outer, inner)
}

/// [`tile`] with the `R` row values of step `i` at `a[i * a_step..]`: the packing of `a`
/// with `a_step` = R, or rows that already lie that way in a wider matrix (attention's
/// probabilities, keys by queries).
#[inline(always)]
fn tile_a_strided<P: Products, const R: usize, const C: usize>(
    products: P,
    acc: &mut [[[f32; LANES]; C]; R],
    (a, a_step): (&[P::Scalar], usize),
    b: &[P::B],
    outer: (usize, usize),
    inner: (usize, usize),
) {
    let steps = outer.0 * inner.0;
    if steps == 0 {
        return;
    }
    let last_read = (outer.0 - 1) * outer.1 + (inner.0 - 1) * inner.1 + C * LANES;
    assert!(b.len() >= last_read && a_step >= R && a.len() >= (steps - 1) * a_step + R);
    // Called through an opaque pointer: `#[inline(never)]` alone did not keep every instance
    // out of line in builds without `target-cpu` (`nm` showed 2 of about 10 left), and the
    // reason for a loop of its own (sums not competing with the kernel's registers) then
    // no longer held. One indirect call per tile, against hundreds of steps inside it.
    let run_steps: TileSteps<P, R, C> = std::hint::black_box(tile_steps::<P, R, C>);
    // SAFETY: the assertion is what `tile_steps` needs; the instruction set of this instance
    // is present, since its code runs only inside its `run` functions.
    unsafe { run_steps(products, acc, (a, a_step), b, outer, inner) }
}

/// The type of [`tile_steps`] as a function pointer.
type TileSteps<P, const R: usize, const C: usize> = unsafe fn(
    P,
    &mut [[[f32; LANES]; C]; R],
    (&[<P as Products>::Scalar], usize),
    &[<P as Products>::B],
    (usize, usize),
    (usize, usize),
);

/// `rows` packed for [`tile`]: `dst[i * R + r] = rows[r][i]` for the first `steps` values
/// of the `R` rows. Four rows by four steps at a time, a 4 x 4 transpose the compiler keeps
/// in vector registers: value by value, the packing took 5-20% of a linear layer's time on
/// one thread (the most where the layer has few outputs to share it: 384).
#[inline(always)]
fn pack_rows<T: Copy>(rows: &[&[T]], steps: usize, dst: &mut [T]) {
    let n = rows.len();
    let dst = &mut dst[..steps * n];
    let whole = steps - steps % 4;
    let mut r0 = 0;
    while r0 + 4 <= n {
        let quad: [&[T]; 4] = std::array::from_fn(|r| &rows[r0 + r][..steps]);
        for i in (0..whole).step_by(4) {
            let v: [[T; 4]; 4] =
                std::array::from_fn(|r| quad[r][i..i + 4].try_into().expect("4 values"));
            for j in 0..4 {
                let column: [T; 4] = std::array::from_fn(|r| v[r][j]);
                dst[(i + j) * n + r0..][..4].copy_from_slice(&column);
            }
        }
        r0 += 4;
    }
    for (r, row) in rows.iter().enumerate() {
        let from = if r < r0 { whole } else { 0 };
        for (i, &x) in row[..steps].iter().enumerate().skip(from) {
            dst[i * n + r] = x;
        }
    }
}

instance_features! {
/// The loop of [`tile`], a function of its own: inlined into the kernels, the accumulators
/// competed with their loop variables for registers and spilled (AVX2 ran 1.7x slower).
///
/// # Safety
/// `b` holds `(outer - 1) * outer_stride + (inner - 1) * inner_stride + C * LANES` values,
/// `a` `(outer * inner - 1) * a_step + R` values, and the CPU has this instance's features.
#[inline(never)]
unsafe fn tile_steps<P: Products, const R: usize, const C: usize>(
    _products: P,
    acc: &mut [[[f32; LANES]; C]; R],
    (a, a_step): (&[P::Scalar], usize),
    b: &[P::B],
    (outer, outer_stride): (usize, usize),
    (inner, inner_stride): (usize, usize),
) {
    // SAFETY: as the caller promises, every read is in bounds: step i = (o, n) loads C
    // vectors from `b` at o * outer_stride + n * inner_stride and the R values from
    // i * a_step of `a`; `acc` holds R x C vectors of LANES values.
    unsafe {
        let mut c: [[simd::F; C]; R] =
            std::array::from_fn(|r| std::array::from_fn(|v| simd::load(acc[r][v].as_ptr())));
        let mut ap = a.as_ptr();
        // One step: C vectors of `b` at `bp` by the R values at `ap`.
        let step = |c: &mut [[simd::F; C]; R], ap: *const P::Scalar, bp: *const P::B| {
            let bv: [simd::F; C] = std::array::from_fn(|v| P::load_b(bp.add(v * LANES)));
            for (r, c) in c.iter_mut().enumerate() {
                let x = P::splat(*ap.add(r));
                for (c, &bv) in c.iter_mut().zip(&bv) {
                    *c = P::madd(*c, x, bv);
                }
            }
        };
        if inner == 1 {
            // Matrix products: one loop, not a loop of one-step loops (whose bookkeeping
            // cost as many instructions as the step's multiply-adds).
            let mut bp = b.as_ptr();
            for _ in 0..outer {
                step(&mut c, ap, bp);
                bp = bp.add(outer_stride);
                ap = ap.add(a_step);
            }
        } else {
            for o in 0..outer {
                let mut bp = b.as_ptr().add(o * outer_stride);
                for _ in 0..inner {
                    step(&mut c, ap, bp);
                    bp = bp.add(inner_stride);
                    ap = ap.add(a_step);
                }
            }
        }
        for (acc, c) in acc.iter_mut().zip(&c) {
            for (acc, &c) in acc.iter_mut().zip(c) {
                simd::store(acc.as_mut_ptr(), c);
            }
        }
    }
}
}

#[inline(always)]
fn linear_bias_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(srcs, out, ne, rows, Epilogue::Bias)
}

#[inline(always)]
fn linear_bias_gelu_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(srcs, out, ne, rows, Epilogue::BiasGelu)
}

/// `residual + scale * (x W^T + b)`: srcs 3 and 4 are `scale` [N] and `residual` [N, T].
#[inline(always)]
fn linear_scaled_residual_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(srcs, out, ne, rows, Epilogue::ScaledResidual)
}

/// LayerNorm of rows `rows` of `srcs[0]` (rows of `ne[0]` values, strided over up to three
/// dims) with weight `srcs[1]` and bias `srcs[2]`, epsilon `eps`: the mean, then the
/// variance, over a row held in L1 (in f64 lanes), then one fused scale and shift.
#[inline(always)]
fn layer_norm_rows(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    eps: f32,
) {
    let (x, weight, bias) = (&srcs[0], srcs[1].data, srcs[2].data);
    let n = ne[0];
    for (r, dst) in rows.zip(out.chunks_exact_mut(n)) {
        let (i1, i23) = (r % ne[1], r / ne[1]);
        let (i2, i3) = (i23 % ne[2], i23 / ne[2]);
        let row = &x.data[i1 * x.nb[1] + i2 * x.nb[2] + i3 * x.nb[3]..][..n];
        let mean = lane_sum(row, |v| v as f64) / n as f64;
        let var = lane_sum(row, |v| {
            let d = v as f64 - mean;
            d * d
        }) / n as f64;
        let rstd = (1.0 / (var + eps as f64).sqrt()) as f32;
        let mean = mean as f32;
        for (((o, &v), &w), &b) in dst.iter_mut().zip(row).zip(weight).zip(bias) {
            *o = madd((v - mean) * rstd, w, b);
        }
    }
}

/// `Σ f(v)` over `values`, accumulated in `V` lanes so that the loop vectorises.
#[inline(always)]
fn lane_sum(values: &[f32], f: impl Fn(f32) -> f64) -> f64 {
    let mut lanes = [0.0f64; V];
    let whole = values.len() / V * V;
    for chunk in values[..whole].chunks_exact(V) {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += f(v);
        }
    }
    lanes.iter().sum::<f64>() + values[whole..].iter().map(|&v| f(v)).sum::<f64>()
}

/// [`exp2_softmax`] for the unit tests of `cpu_kernels.rs`.
#[cfg(test)]
#[allow(dead_code)]
pub(super) fn exp2_softmax_for_tests(t: f32) -> f32 {
    exp2_softmax(t)
}

/// [`simd::exp2_softmax`] on a vector of `t`, beside [`exp2_softmax`] on each lane, for the
/// unit tests of `cpu_kernels.rs` (through this instance's test entry).
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

/// [`exp`] for the unit tests of `cpu_kernels.rs`.
#[cfg(test)]
#[allow(dead_code)]
pub(super) fn exp_for_tests(x: f32) -> f32 {
    exp(x)
}
