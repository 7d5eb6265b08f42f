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
    _config: &Config,
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
    _config: &Config,
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
