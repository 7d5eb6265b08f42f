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
