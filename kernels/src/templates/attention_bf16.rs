/// [`attention_tokens`] with bf16 products: Q, K, the probabilities and V rounded to bf16
/// pairs along each product's summed dimension, sums and softmax in f32.
#[inline(always)]
fn attention_tokens_bf16(
    config: &Config,
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
        if let Some(tiles) = super::amx::Tiles::configure(config) {
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
