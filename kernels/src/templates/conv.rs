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
    config: &Config,
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
    if (kw, kh) == (3, 3) && config.winograd() && super::winograd_pays(config, w, h) {
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
    _config: &Config,
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
    _config: &Config,
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
    config: &Config,
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
        if let Some(tiles) = super::amx::Tiles::configure(config) {
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
fn conv_direct_rows(_config: &Config, srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
    conv_rows(srcs, out, 0..ne[2], false, relu_input(param))
}

/// [`conv_direct_rows`] with bf16 products (vectors; AMX tiles take whole planes).
#[inline(always)]
fn conv_direct_rows_bf16(_config: &Config, srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
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
fn conv_transpose_rows(_config: &Config, srcs: &[Src<'_>], out: &mut PlaneRows<'_>, _ne: [usize; 4], _param: f32) {
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

