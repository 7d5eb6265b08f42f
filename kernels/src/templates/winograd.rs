// The 3x3 "same" convolution by Winograd's minimal filtering, F(4x4, 3x3) (Lavin and Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2015), compiled once per instruction set
// beside `body.rs`, whose register tile runs its products.
//
// A 6x6 patch of input `d` and a 3x3 kernel `g` give a 4x4 block of outputs as
// `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A`: 36 multiplications where the direct convolution takes 144.
// Summed over input channels, the element-wise products become 36 matrix products (one per
// point of the 6x6 transform) of the transformed kernels [OC x IC] by the transformed patches
// [IC x tiles]: the register tile's work, at 4x fewer multiply-adds than the direct kernel.
// The transforms are additions and small multiples, vectorised over tiles; for the head's
// channel counts (32 to 256) they cost a fraction of the products they save. The points
// 0, ±1, ±2 keep the transforms' constants small: f32 results stay within 3e-6 of the largest
// output of the direct convolution's (the direct kernel's own rounding is about 1e-7), and
// DA3's depth within 2e-5 of the official code's, as before.

/// Output pixels per tile side, and the input patch side (`WINO_OUT + 3 - 1`).
const WINO_OUT: usize = super::WINOGRAD_TILE;
const WINO_IN: usize = 6;
/// Pixels each row of a map is padded to by Winograd's rows of tiles (a vector of tiles).
/// (Read by the choice between the AVX-512 and AVX2 instances only.)
#[allow(dead_code)]
pub(super) const WINO_ROW_STEP: usize = WINO_OUT * LANES;
/// Points of the transform: one matrix product each.
const WINO_POINTS: usize = WINO_IN * WINO_IN;
/// Tiles transformed and multiplied together: the register tile's columns, so that one
/// product of a point covers them.
const WINO_TILES: usize = CONV_SPAN;

/// Tiles (vector-padded, see [`conv3x3_winograd_planes`]) from which a map's convolution runs
/// faster by Winograd than by the direct kernel. Below, transforming every kernel (36 values
/// per input and output channel, per call) and the padding of short rows to whole vectors
/// cost more than the products save: on DA3's head at 504x336 (2 threads, AVX-512 Zen 4) the
/// 18x12 maps (48 tiles) ran 2.3x slower than direct and the 36x24 ones (96 tiles) 1.3x
/// slower, while 72x48 (384 tiles) ran 1.4x faster.
#[allow(dead_code)]
const WINO_MIN_TILES: usize = 256;

/// Whether a `w` x `h` map is large enough for [`conv3x3_winograd_planes`] to pay.
/// (`super::winograd_pays` reads the AVX-512 and portable instances' only: AVX2's vectors
/// have the portable ones' lanes.)
#[allow(dead_code)]
#[inline(always)]
pub(super) fn winograd_pays(w: usize, h: usize) -> bool {
    w.div_ceil(WINO_OUT).div_ceil(LANES) * LANES * h.div_ceil(WINO_OUT) >= WINO_MIN_TILES
}

/// `Bᵀ d` on one axis of the patches of a vector of tiles.
#[inline(always)]
fn wino_input_1d([d0, d1, d2, d3, d4, d5]: [simd::F; WINO_IN]) -> [simd::F; WINO_IN] {
    use simd::{add, fma, splat, sub};
    let (a, b) = (sub(d3, d1), sub(d4, d2));
    [
        fma(splat(4.0), d0, fma(splat(-5.0), d2, d4)),
        fma(splat(-4.0), add(d1, d2), add(d3, d4)),
        fma(splat(4.0), sub(d1, d2), sub(d4, d3)),
        fma(splat(2.0), a, b),
        fma(splat(-2.0), a, b),
        fma(splat(4.0), d1, fma(splat(-5.0), d3, d5)),
    ]
}

/// `Aᵀ m` on one axis of the transformed blocks of a vector of tiles.
#[inline(always)]
fn wino_output_1d([m0, m1, m2, m3, m4, m5]: [simd::F; WINO_IN]) -> [simd::F; WINO_OUT] {
    use simd::{add, fma, splat, sub};
    let (s12, d12, s34, d34) = (add(m1, m2), sub(m1, m2), add(m3, m4), sub(m3, m4));
    [
        add(add(m0, s12), s34),
        fma(splat(2.0), d34, d12),
        fma(splat(4.0), s34, s12),
        add(fma(splat(8.0), d34, d12), m5),
    ]
}

/// A vector of `values` (at least LANES of them).
#[inline(always)]
fn vector_of(values: &[f32]) -> simd::F {
    let mut lanes = [0.0f32; LANES];
    lanes.copy_from_slice(&values[..LANES]);
    simd::from_lanes(lanes)
}

/// `G g` on one axis of a kernel. Multiplications by the reciprocals, not divisions: every
/// thread transforms every kernel of a call, and with eight divisions per axis that was 40%
/// of the non-product time at 72x48, 128 -> 128 channels (the reciprocals round within an
/// ulp of the quotients).
#[inline(always)]
fn wino_kernel_1d([g0, g1, g2]: [f32; 3]) -> [f32; WINO_IN] {
    const SIXTH: f32 = 1.0 / 6.0;
    const TWELFTH: f32 = 1.0 / 12.0;
    const TWENTY_FOURTH: f32 = 1.0 / 24.0;
    let (far, mid) = (g0 * TWENTY_FOURTH + g2 * SIXTH, g1 * TWELFTH);
    [
        g0 * 0.25,
        -(g0 + g1 + g2) * SIXTH,
        -(g0 - g1 + g2) * SIXTH,
        far + mid,
        far - mid,
        g2,
    ]
}

/// `G g Gᵀ` of a 3x3 kernel (`g[ky * 3 + kx]`), point `l * 6 + k` for row point `l`.
#[inline(always)]
fn wino_kernel(g: &[f32]) -> [f32; WINO_POINTS] {
    // Plain calls, not `[0, 1, 2].map(..)`: the closure of `map` is compiled outside the
    // instruction set's `target_feature` context and called per kernel, with a `vzeroupper`
    // and a stall on its result each time (most of a small map's convolution on AVX-512).
    let rows = [
        wino_kernel_1d([g[0], g[1], g[2]]),
        wino_kernel_1d([g[3], g[4], g[5]]),
        wino_kernel_1d([g[6], g[7], g[8]]),
    ];
    let mut u = [0.0; WINO_POINTS];
    for k in 0..WINO_IN {
        let column = wino_kernel_1d([rows[0][k], rows[1][k], rows[2][k]]);
        for (l, &x) in column.iter().enumerate() {
            u[l * WINO_IN + k] = x;
        }
    }
    u
}

/// The values of one point (or pixel column) for the tiles of a block.
type Lanes = [f32; WINO_TILES];
/// Vectors of tiles per block.
const WINO_VECTORS: usize = WINO_TILES / LANES;
/// Where each vector of a block's tiles starts, (tile row, tile column), or None past the
/// last tile.
type WinoBlock = [Option<(usize, usize)>; WINO_VECTORS];

/// Scratch rows of the transforms of one vector of tiles (written before read).
struct WinoScratch {
    /// One input row's pixels from x0 - 1: patch t reads span[4t..4t + 6].
    span: [f32; WINO_OUT * LANES + WINO_OUT],
    /// The patches transformed along x: `along_x[k][i]` for row `i`.
    along_x: [[simd::F; WINO_IN]; WINO_IN],
    /// One output row, pixel 4t + b.
    pixels: [f32; WINO_OUT * LANES],
}

/// Output channels `channels` (planes of `out`) of a 3x3 "same" convolution by F(4x4, 3x3):
/// `srcs` as [`conv_same_planes`]'s (kernel [3, 3, IC, OC], input [W, H, IC, 1], optional
/// bias [OC]), the input through ReLU where `relu`.
#[inline(always)]
fn conv3x3_winograd_planes(srcs: &[Src<'_>], out: &mut [f32], channels: Range<usize>, relu: bool) {
    let [w, h, ..] = srcs[1].ne;
    let mut out = PlaneRows::whole(out, [w, h, channels.len()]);
    conv3x3_winograd(srcs, &mut out, channels, relu)
}

/// Every output channel of the rows `out` holds (whole tiles' rows, but for the map's last)
/// of a 3x3 "same" convolution by F(4x4, 3x3), `srcs` as [`conv_same_planes`]'s: a thread's
/// band, so that each input channel's patches are transformed once, not once per thread. A
/// positive `param` passes the input through ReLU.
#[inline(always)]
fn conv_winograd_rows(_config: &Config, srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
    conv3x3_winograd(srcs, out, 0..ne[2], relu_input(param))
}

/// Output channels `channels` (planes `0..channels.len()` of `out`) of the tiles whose rows
/// `out` holds, of a 3x3 "same" convolution by F(4x4, 3x3), of the input through ReLU where
/// `relu`.
///
/// The tiles go in row-major order over a grid whose rows are padded to whole vectors, so
/// that a vector of tiles never spans two tile rows, and a block of `WINO_TILES` tiles may
/// (a block per row end would waste up to a block per row: a quarter of the work at 144
/// pixels wide).
#[inline(always)]
fn conv3x3_winograd(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    channels: Range<usize>,
    relu: bool,
) {
    let (kernel, input) = (&srcs[0], &srcs[1]);
    let [w, h, ic, _] = input.ne;
    debug_assert!(kernel.ne[..3] == [3, 3, ic]);
    let plane_len = w * h;
    let oc = channels.len();
    let rows = out.rows();
    if rows.is_empty() || oc == 0 {
        return;
    }
    assert!(rows.start.is_multiple_of(WINO_OUT), "a band starts on a row of tiles");
    // The channels in groups for the register tile, as in `conv_planes`.
    let groups = channel_groups(oc);
    // Transformed kernels, point by point, each group's rows packed for the tile:
    // u[p * u_stride + i * ic + c * r + row] for the group (i, r). One cache line between
    // points past the OC x IC values: at a multiple of 4 KB apart, as DA3's channel counts
    // give, a kernel's 36 points would be stored to one set of the L1 cache.
    let u_stride = oc * ic + 64 / std::mem::size_of::<f32>();
    let mut u = super::Scratch::take(&super::SCRATCH_0, WINO_POINTS * u_stride, 0.0);
    for &(i, r) in &groups {
        for row in 0..r {
            let o = channels.start + i + row;
            for c in 0..ic {
                let t = wino_kernel(&kernel.data[(o * ic + c) * 9..][..9]);
                for (p, &x) in t.iter().enumerate() {
                    u[p * u_stride + i * ic + c * r + row] = x;
                }
            }
        }
    }
    // One block of tiles: the transformed patches [point][channel], then one group's
    // products [point][row].
    // Each point's rows `v_stride` rows apart, an odd number: a vector of tiles is stored
    // to every point at once, and at `ic` rows apart (a multiple of 4 KB for DA3's channel
    // counts) the 36 stores fell in one set of the L1 cache, which holds 8.
    let v_stride = ic | 1;
    // (Apart: the products right after the patches in one vector ran 15% slower at 504x336.)
    let mut v_scratch = super::Scratch::take(&super::SCRATCH_1, WINO_POINTS * v_stride * WINO_TILES, 0.0);
    let mut m_scratch = super::Scratch::take(&super::SCRATCH_2, WINO_POINTS * CONV_CHANNELS * WINO_TILES, 0.0);
    let (v, m) = (v_scratch.as_chunks_mut().0, m_scratch.as_chunks_mut().0);
    let mut scratch = WinoScratch {
        span: [0.0; WINO_OUT * LANES + WINO_OUT],
        along_x: [[simd::splat(0.0); WINO_IN]; WINO_IN],
        pixels: [0.0; WINO_OUT * LANES],
    };
    // The tiles of the band's tile rows.
    let tiles_x = w.div_ceil(WINO_OUT).div_ceil(LANES) * LANES;
    let tiles = tiles_x * rows.end.div_ceil(WINO_OUT);
    let first_tile = tiles_x * (rows.start / WINO_OUT);
    let block_at = |first: usize| -> WinoBlock {
        std::array::from_fn(|g| {
            let tile = first + g * LANES;
            (tile < tiles).then(|| (tile / tiles_x, tile % tiles_x))
        })
    };
    let plane = |c: usize| &input.data[c * plane_len..][..plane_len];
    for first in (first_tile..tiles).step_by(WINO_TILES) {
        let block = block_at(first);
        let next_block = block_at(first + WINO_TILES);
        for c in 0..ic {
            // The rows of the channel WINO_PREFETCH_AHEAD on: in this block, else one of the
            // next block's (every one of them, however few the channels).
            let ahead = c + WINO_PREFETCH_AHEAD;
            let ahead_block = if ahead < ic { &block } else { &next_block };
            for at in ahead_block.iter().flatten() {
                wino_prefetch_rows(plane(ahead % ic), (w, h), *at, scratch.span.len());
            }
            let plane = plane(c);
            for (g, &at) in block.iter().enumerate() {
                let at = at.map(|(ty, tx)| (w, h, ty, tx));
                wino_patches(plane, at, g, &mut scratch, &mut v[c..], (v_stride, relu));
            }
        }
        let v = (*v).as_flattened();
        for &(i, r) in &groups {
            let bias = |row: usize| srcs.get(2).map_or(0.0, |b| b.data[channels.start + i + row]);
            let planes = (&mut *out, i);
            let u = (&u[i * ic..], u_stride);
            let s = &mut scratch;
            let block = ((w, h), block);
            by_group_rows!(r, wino_group(u, (v, v_stride), ic, m, planes, &bias, block, s));
        }
    }
}

/// Input channels between a channel's patches and the prefetch of the rows they will read:
/// the rows of one block's tiles lie in as many streams as channels times six, too many for
/// the hardware's prefetchers, and at 504x336 (64 -> 32 channels, a 43 MB input) the loads
/// of the rows waited for memory for a fifth of the time outside the products.
const WINO_PREFETCH_AHEAD: usize = 4;

/// Asks for the input rows that [`wino_patches`] will read for the vector of tiles starting
/// at tile `tx0` of tile row `ty` of `plane` (`w` x `h`): `span_len` pixels from `4 tx0 - 1`
/// of each of its six rows. A hint, as [`super::prefetch_part`].
#[inline(always)]
fn wino_prefetch_rows(
    plane: &[f32],
    (w, h): (usize, usize),
    (ty, tx0): (usize, usize),
    span_len: usize,
) {
    let x0 = (WINO_OUT * tx0).saturating_sub(1).min(w);
    let n = (w - x0).min(span_len);
    for i in 0..WINO_IN {
        let iy = (WINO_OUT * ty + i).wrapping_sub(1);
        if iy < h {
            super::prefetch_part(&plane[iy * w + x0..][..n], 0, 1);
        }
    }
}

/// The transformed patches `Bᵀ d B` of the vector `g` of a block's tiles, which start at tile
/// `tx0` of tile row `ty` of one input channel (`plane`, `w` x `h`): point `p` into lanes
/// `g * LANES..` of `v[p * stride]` (the channel's slot of each point's rows). Pixels
/// outside the plane (the padding, and tiles past the edge) are 0, and so is a vector past
/// the last tile (`None`). Where `relu`, the pixels pass through ReLU first.
#[inline(always)]
fn wino_patches(
    plane: &[f32],
    at: Option<(usize, usize, usize, usize)>,
    g: usize,
    s: &mut WinoScratch,
    v: &mut [Lanes],
    (stride, relu): (usize, bool),
) {
    let Some((w, h, ty, tx0)) = at else {
        for p in 0..WINO_POINTS {
            v[p * stride][g * LANES..][..LANES].fill(0.0);
        }
        return;
    };
    let x0 = WINO_OUT * tx0;
    let span_len = s.span.len();
    for i in 0..WINO_IN {
        let iy = (WINO_OUT * ty + i).wrapping_sub(1);
        if iy >= h {
            for k in 0..WINO_IN {
                s.along_x[k][i] = simd::splat(0.0);
            }
            continue;
        }
        let row = &plane[iy * w..][..w];
        let span: &[f32] = if x0 >= 1 && x0 - 1 + span_len <= w {
            &row[x0 - 1..][..span_len]
        } else {
            // The first and last vectors of a row: zeros where the span leaves the row.
            s.span.fill(0.0);
            let first = x0.saturating_sub(1).min(w);
            let skip = first + 1 - x0.min(first + 1);
            let n = (w - first).min(span_len - skip);
            s.span[skip..][..n].copy_from_slice(&row[first..][..n]);
            &s.span
        };
        // Columns 4 and 5 of a patch are columns 0 and 1 of the next tile's.
        let [d0, d1, d2, d3] = simd::deinterleave4(span);
        let [d4, d5, _, _] = simd::deinterleave4(&span[WINO_OUT..]);
        let mut d = [d0, d1, d2, d3, d4, d5];
        if relu {
            // `maxps` gives its second operand for NaN: 0, as ggml's ReLU. (A loop, not
            // `map`, whose closure would be compiled without the instance's features.)
            for x in &mut d {
                *x = simd::max(*x, simd::splat(0.0));
            }
        }
        for (k, x) in wino_input_1d(d).into_iter().enumerate() {
            s.along_x[k][i] = x;
        }
    }
    for k in 0..WINO_IN {
        for (l, x) in wino_input_1d(s.along_x[k]).into_iter().enumerate() {
            v[(l * WINO_IN + k) * stride][g * LANES..][..LANES].copy_from_slice(&simd::to_lanes(x));
        }
    }
}

/// The `R` output channels of one group for one block of tiles: the 36 products of the
/// group's transformed kernels (`u`, packed, point `p` at `p * u_stride`) by the block's
/// patches (`v`, [point][IC][tile], point `p` at `p * v_stride` rows), then `Aᵀ m A` plus
/// the bias into `R` planes of `out` from `first` (`w` x `h`), each vector of tiles at its
/// place (`block`, as for [`wino_patches`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn wino_group<const R: usize>(
    (u, u_stride): (&[f32], usize),
    (v, v_stride): (&[f32], usize),
    ic: usize,
    m: &mut [Lanes],
    (out, first): (&mut PlaneRows<'_>, usize),
    bias: &impl Fn(usize) -> f32,
    ((w, h), block): ((usize, usize), WinoBlock),
    s: &mut WinoScratch,
) {
    for p in 0..WINO_POINTS {
        let mut acc = [[[0.0f32; LANES]; CONV_VECTORS]; R];
        let patches = &v[p * v_stride * WINO_TILES..];
        tile(F32, &mut acc, &u[p * u_stride..][..R * ic], patches, (ic, WINO_TILES), (1, 0));
        for (row, acc) in acc.iter().enumerate() {
            m[p * R + row].copy_from_slice(acc.as_flattened());
        }
    }
    for (g, at) in block.iter().enumerate() {
        let Some((ty, tx0)) = *at else { break };
        let x0 = WINO_OUT * tx0;
        if x0 >= w {
            continue;
        }
        let width = (w - x0).min(WINO_OUT * LANES);
        for row in 0..R {
            let bias = simd::splat(bias(row));
            // Along y: along_y[a][k].
            let mut along_y = [[simd::splat(0.0); WINO_IN]; WINO_OUT];
            for k in 0..WINO_IN {
                let points = std::array::from_fn(|l| {
                    vector_of(&m[(l * WINO_IN + k) * R + row][g * LANES..])
                });
                for (a, y) in wino_output_1d(points).into_iter().enumerate() {
                    along_y[a][k] = y;
                }
            }
            for (a, along_y) in along_y.into_iter().enumerate() {
                let oy = WINO_OUT * ty + a;
                if oy >= h {
                    break;
                }
                // Pixel 4t + b is lane t of y[b].
                let y = wino_output_1d(along_y).map(|y| simd::add(y, bias));
                let dst = &mut out.row_mut(first + row, oy)[x0..][..width];
                if width == WINO_OUT * LANES {
                    // Straight into the row: a copy of variable length is a call to
                    // `memcpy`, after which every live vector is reloaded from the stack.
                    simd::interleave4(y, dst);
                } else {
                    simd::interleave4(y, &mut s.pixels);
                    dst.copy_from_slice(&s.pixels[..width]);
                }
            }
        }
    }
}
