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
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    epilogue: Epilogue,
) {
    if srcs[0].packing == Packing::Q8Records {
        return linear_rows_q8(srcs, out, ne, rows, epilogue);
    }
    let (n, k) = (ne[0], srcs[1].ne[0]);
    // The packed rows of one block, allocated once for every block: f32 words (for f32 and
    // f16 weights), or bf16 pairs with a weight of bf16 pairs (and the pairs of one group
    // before packing).
    let bf16 = srcs[0].packing == Packing::Bf16Pairs;
    let depth = if bf16 { k / 2 } else { k };
    // AMX tiles take a bf16 weight whose depth fills whole tiles (every DA3 layer's does).
    #[cfg(target_arch = "x86_64")]
    let tiles = if bf16 && simd::AMX_TILES && depth.is_multiple_of(super::amx::TILE_PAIRS) {
        super::amx::Tiles::configure(config)
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
    let bf16 = panels.packing == Packing::Bf16Pairs;
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
    let halves = (panels.packing == Packing::F16).then(|| panels.halves());
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


#[inline(always)]
fn linear_bias_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(config, srcs, out, ne, rows, Epilogue::Bias)
}

#[inline(always)]
fn linear_bias_gelu_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(config, srcs, out, ne, rows, Epilogue::BiasGelu)
}

/// `residual + scale * (x W^T + b)`: srcs 3 and 4 are `scale` [N] and `residual` [N, T].
#[inline(always)]
fn linear_scaled_residual_rows(
    config: &Config,
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    rows: Range<usize>,
    _param: f32,
) {
    linear_rows(config, srcs, out, ne, rows, Epilogue::ScaledResidual)
}
