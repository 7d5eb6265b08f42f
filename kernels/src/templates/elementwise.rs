/// GELU, `0.5 x (1 + erf(x / sqrt 2))`, on rows `rows` of the operand.
#[inline(always)]
fn gelu_erf_rows(
    _config: &Config,
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
    _config: &Config,
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
fn concat_rows(_config: &Config, srcs: &[Src<'_>], out: &mut [f32], ne: [usize; 4], rows: Range<usize>, _param: f32) {
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
    _config: &Config,
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

/// LayerNorm of rows `rows` of `srcs[0]` (rows of `ne[0]` values, strided over up to three
/// dims) with weight `srcs[1]` and bias `srcs[2]`, epsilon `eps`: the mean, then the
/// variance, over a row held in L1 (in f64 lanes), then one fused scale and shift.
#[inline(always)]
fn layer_norm_rows(
    _config: &Config,
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

