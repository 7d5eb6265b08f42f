//! Every op of the safe ggml layer, computed on the CPU backend and compared with a reference
//! written here in plain Rust from the op's mathematical definition (never computed by ggml).
//!
//! Tensors are described in ggml order: `ne[0]` is the innermost (contiguous) dimension, so a
//! PyTorch tensor of shape (N, C, H, W) is `[W, H, C, N]` here. References accumulate in f64.
//!
//! Tolerances: unless a test says otherwise, `|got - want| <= 1e-5 * max(|want|, 1)`. Inputs are
//! O(1), so the floor of 1 only matters for results that cancel to nearly zero, where a purely
//! relative bound would demand more than f32 arithmetic can give. Set `DA3_TEST_SHOW_ERRORS=1`
//! (with `--nocapture`) to print the worst error of every comparison.

use da3::ggml::{
    Allocation, Backend, BufferUsage, Context, DType, Element, Gallocr, Graph, Interpolation, Pool,
    RopeMode, Sched, SchedAllocation, Tensor, TensorView,
};
use half::f16;
use std::cell::{Cell, RefCell};
use std::ops::Deref;

/// The default tolerance (see the module docs).
const TOL: f64 = 1e-5;

// --- host-side arrays ---------------------------------------------------------------------------

/// A dense host array in ggml order (`ne[0]` innermost), padded to four dims.
#[derive(Clone, Debug)]
struct Array {
    ne: [usize; 4],
    data: Vec<f32>,
}

fn dims4(ne: &[usize]) -> [usize; 4] {
    assert!((1..=4).contains(&ne.len()), "1 to 4 dims");
    let mut out = [1; 4];
    out[..ne.len()].copy_from_slice(ne);
    out
}

fn to_usize(ne: &[i64]) -> Vec<usize> {
    ne.iter().map(|&d| d as usize).collect()
}

fn to_i64(ne: &[usize]) -> Vec<i64> {
    ne.iter().map(|&d| d as i64).collect()
}

/// Every index of a shape, in memory order.
fn indices(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
        })
    })
}

impl Array {
    /// An array whose element at each index is `f(index)`.
    fn from_fn(ne: &[usize], mut f: impl FnMut([usize; 4]) -> f64) -> Array {
        let ne = dims4(ne);
        let data = indices(ne).map(|i| f(i) as f32).collect();
        Array { ne, data }
    }
    fn offset(&self, i: [usize; 4]) -> usize {
        assert!(
            i.iter().zip(&self.ne).all(|(i, n)| i < n),
            "index {i:?} outside {:?}",
            self.ne
        );
        i[0] + self.ne[0] * (i[1] + self.ne[1] * (i[2] + self.ne[2] * i[3]))
    }
    fn at(&self, i: [usize; 4]) -> f64 {
        self.data[self.offset(i)] as f64
    }
    /// The element at `i`, or 0 when any coordinate (possibly negative) lies outside.
    fn at_or_zero(&self, i: [i64; 4]) -> f64 {
        if i.iter()
            .zip(&self.ne)
            .all(|(&i, &n)| i >= 0 && (i as usize) < n)
        {
            self.at(i.map(|i| i as usize))
        } else {
            0.0
        }
    }
    /// The element at `i` with each coordinate taken modulo the extent (ggml's broadcast).
    fn at_repeated(&self, i: [usize; 4]) -> f64 {
        self.at([0, 1, 2, 3].map(|d| i[d] % self.ne[d]))
    }
    fn map(&self, f: impl Fn(f64) -> f64) -> Array {
        Array {
            ne: self.ne,
            data: self.data.iter().map(|&x| f(x as f64) as f32).collect(),
        }
    }
    /// The values rounded to f16 (what an f16 tensor holding them stores).
    fn rounded_to_f16(&self) -> Array {
        self.map(|x| f16::from_f64(x).to_f64())
    }
}

/// Asserts equal shapes and `|got - want| <= tol * max(|want|, 1)` everywhere; reports the worst
/// element.
fn assert_close(got: &Array, want: &Array, tol: f64, what: &str) {
    assert_eq!(got.ne, want.ne, "{what}: shape");
    let mut worst: Option<(usize, f64)> = None;
    for (i, (&g, &w)) in got.data.iter().zip(&want.data).enumerate() {
        let (g, w) = (g as f64, w as f64);
        let err = (g - w).abs() / w.abs().max(1.0);
        assert!(
            !g.is_nan() || w.is_nan(),
            "{what}: NaN at flat index {i} (want {w})"
        );
        if g == w {
            continue;
        }
        if !matches!(worst, Some((_, e)) if e >= err) {
            worst = Some((i, err));
        }
    }
    if std::env::var_os("DA3_TEST_SHOW_ERRORS").is_some() {
        eprintln!(
            "{what}: worst scaled error {:e}",
            worst.map_or(0.0, |(_, e)| e)
        );
    }
    if let Some((i, err)) = worst {
        assert!(
            err <= tol,
            "{what}: flat index {i} got {} want {} (scaled error {err:.3e} > {tol:e})",
            got.data[i],
            want.data[i]
        );
    }
}

// --- the graph harness --------------------------------------------------------------------------

/// Host data for an input tensor.
enum Feed {
    F32(Vec<f32>),
    F16(Vec<f16>),
    I32(Vec<i32>),
}

/// Builds one graph in a metadata context: inputs (marked input) with deterministic data, ops
/// through `Deref<Target = Context>`, and [`Harness::run`] to compute an output on the CPU.
struct Harness {
    ctx: Context,
    /// A 64-bit LCG (Knuth's MMIX constants): deterministic pseudo-random inputs.
    state: Cell<u64>,
    feeds: RefCell<Vec<(Tensor, Feed)>>,
}

impl Deref for Harness {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.ctx
    }
}

enum Allocator {
    Gallocr,
    Sched,
}

impl Harness {
    fn new() -> Harness {
        Harness {
            ctx: Context::metadata(512).unwrap(),
            state: Cell::new(0x2545_f491_4f6c_dd1d),
            feeds: RefCell::new(Vec::new()),
        }
    }

    /// A pseudo-random value in [-1, 1).
    fn next(&self) -> f64 {
        let s = self
            .state
            .get()
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.state.set(s);
        (s >> 40) as f64 / (1u64 << 24) as f64 * 2.0 - 1.0
    }

    fn random(&self, ne: &[i64]) -> Array {
        Array::from_fn(&to_usize(ne), |_| self.next())
    }

    fn new_input(&self, dtype: DType, ne: &[i64], feed: Feed) -> Tensor {
        let n = self.feeds.borrow().len();
        let t = self
            .ctx
            .new_tensor(dtype, ne)
            .unwrap()
            .named(&format!("in{n}"));
        t.mark_input();
        self.feeds.borrow_mut().push((t.clone(), feed));
        t
    }

    /// An f32 input holding `values` (its shape is the array's).
    fn input_from(&self, values: &Array) -> Tensor {
        self.new_input(
            DType::F32,
            &to_i64(&values.ne),
            Feed::F32(values.data.clone()),
        )
    }

    /// An f32 input of pseudo-random values in [-1, 1).
    fn input(&self, ne: &[i64]) -> (Tensor, Array) {
        let values = self.random(ne);
        (self.input_from(&values), values)
    }

    /// An f16 input of pseudo-random values; the array holds the f16-rounded values.
    fn input_f16(&self, ne: &[i64]) -> (Tensor, Array) {
        let values = self.random(ne).rounded_to_f16();
        let feed = Feed::F16(values.data.iter().map(|&x| f16::from_f32(x)).collect());
        (self.new_input(DType::F16, ne, feed), values)
    }

    fn input_i32(&self, ne: &[i64], values: &[i32]) -> Tensor {
        self.new_input(DType::I32, ne, Feed::I32(values.to_vec()))
    }

    /// Computes `out` on the CPU backend through a graph allocator.
    fn run(&self, out: &Tensor) -> Array {
        self.run_with(out, Allocator::Gallocr)
    }

    fn run_with(&self, out: &Tensor, allocator: Allocator) -> Array {
        out.set_name("out");
        out.mark_output();
        let graph = self.ctx.new_graph(256).unwrap();
        graph.expand(out).unwrap();
        let backend = Backend::cpu(1).unwrap();
        let data = match allocator {
            Allocator::Gallocr => {
                let mut gallocr = Gallocr::for_backend(&backend).unwrap();
                let run = gallocr.alloc(&graph).unwrap();
                self.write_inputs(&run);
                run.compute(&backend).unwrap();
                run.read::<f32>(out).unwrap()
            }
            Allocator::Sched => {
                let mut sched = Sched::new(std::slice::from_ref(&backend), 512, false).unwrap();
                let run = sched.alloc(&graph, &[]).unwrap();
                self.write_inputs(&run);
                run.compute().unwrap();
                assert_eq!(
                    run.n_splits(),
                    1,
                    "a CPU-only scheduler runs the graph in one piece"
                );
                assert_eq!(run.backend_index_of(out), Some(0));
                run.read::<f32>(out).unwrap()
            }
        };
        Array {
            ne: out.ne().map(|d| d as usize),
            data,
        }
    }

    /// Writes the data of every input the allocated graph uses.
    fn write_inputs(&self, run: &impl WriteInput) {
        for (t, feed) in self
            .feeds
            .borrow()
            .iter()
            .filter(|(t, _)| run.graph().contains(t))
        {
            match feed {
                Feed::F32(v) => run.write_input(t, v),
                Feed::F16(v) => run.write_input(t, v),
                Feed::I32(v) => run.write_input(t, v),
            }
        }
    }
}

/// Writing inputs, as both kinds of allocation offer it.
trait WriteInput {
    fn graph(&self) -> &Graph;
    fn write_input<T: Element>(&self, t: &Tensor, data: &[T]);
}

impl WriteInput for Allocation<'_> {
    fn graph(&self) -> &Graph {
        Allocation::graph(self)
    }
    fn write_input<T: Element>(&self, t: &Tensor, data: &[T]) {
        self.write(t, data).unwrap();
    }
}

impl WriteInput for SchedAllocation<'_> {
    fn graph(&self) -> &Graph {
        SchedAllocation::graph(self)
    }
    fn write_input<T: Element>(&self, t: &Tensor, data: &[T]) {
        self.write(t, data).unwrap();
    }
}

// --- matrix products ----------------------------------------------------------------------------

/// `out[m, n, i2, i3] = sum_k a[k, m, i2 / (B2/A2), i3 / (B3/A3)] * b[k, n, i2, i3]`: `a`'s batch
/// dims are broadcast over `b`'s in blocks (b's batch index divided by the ratio, as
/// grouped-query attention shares a head), not tiled.
fn ref_mul_mat(a: &Array, b: &Array) -> Array {
    let [k, m, a2, a3] = a.ne;
    let [kb, n, b2, b3] = b.ne;
    assert_eq!(k, kb);
    Array::from_fn(&[m, n, b2, b3], |[i, j, i2, i3]| {
        (0..k)
            .map(|kk| a.at([kk, i, i2 / (b2 / a2), i3 / (b3 / a3)]) * b.at([kk, j, i2, i3]))
            .sum()
    })
}

#[test]
fn mul_mat_is_a_row_by_row_dot_product() {
    let g = Harness::new();
    let (a, av) = g.input(&[32, 5]);
    let (b, bv) = g.input(&[32, 7]);
    let y = g.mul_mat(&a, &b).unwrap();
    assert_eq!(y.shape().dims(), &[5, 7]);
    assert_close(&g.run(&y), &ref_mul_mat(&av, &bv), TOL, "mul_mat");
}

#[test]
fn mul_mat_batches_over_dims_2_and_3() {
    let g = Harness::new();
    let (a, av) = g.input(&[16, 3, 2, 3]);
    let (b, bv) = g.input(&[16, 4, 2, 3]);
    let y = g.mul_mat(&a, &b).unwrap();
    assert_close(&g.run(&y), &ref_mul_mat(&av, &bv), TOL, "batched mul_mat");
}

#[test]
fn mul_mat_broadcasts_a_over_b_batches_in_blocks() {
    let g = Harness::new();
    let (a, av) = g.input(&[8, 3, 2, 1]);
    let (b, bv) = g.input(&[8, 4, 6, 2]);
    let y = g.mul_mat(&a, &b).unwrap();
    assert_eq!(y.shape().dims(), &[3, 4, 6, 2]);
    assert_close(&g.run(&y), &ref_mul_mat(&av, &bv), TOL, "broadcast mul_mat");
}

// --- element-wise binary ops ---------------------------------------------------------------------

fn ref_binary(a: &Array, b: &Array, f: fn(f64, f64) -> f64) -> Array {
    Array::from_fn(&a.ne, |i| f(a.at(i), b.at_repeated(i)))
}

type BinaryOp = fn(&Context, &Tensor, &Tensor) -> da3::ggml::Result<Tensor>;

/// An op, its name and its definition on one pair of values.
type BinaryCase = (&'static str, BinaryOp, fn(f64, f64) -> f64);

const BINARY_OPS: [BinaryCase; 4] = [
    ("add", Context::add, |x, y| x + y),
    ("sub", Context::sub, |x, y| x - y),
    ("mul", Context::mul, |x, y| x * y),
    ("div", Context::div, |x, y| x / y),
];

/// Each binary op with `b` of shape `b_ne` broadcast over `a` of shape `a_ne`. Divisors are kept
/// away from zero (magnitude 0.5 to 1.5) so that division is well conditioned.
fn check_binary_broadcast(a_ne: &[i64], b_ne: &[i64]) {
    for (name, op, f) in BINARY_OPS {
        let g = Harness::new();
        let (a, av) = g.input(a_ne);
        let bv = g.random(b_ne).map(|x| x.signum() * (0.5 + x.abs()));
        let b = g.input_from(&bv);
        let y = op(&g, &a, &b).unwrap();
        assert_eq!(y.ne(), a.ne());
        assert_close(
            &g.run(&y),
            &ref_binary(&av, &bv, f),
            TOL,
            &format!("{name} {a_ne:?} with {b_ne:?}"),
        );
    }
}

#[test]
fn binary_ops_on_equal_shapes() {
    check_binary_broadcast(&[5, 4, 3, 2], &[5, 4, 3, 2]);
}

#[test]
fn binary_ops_broadcast_a_row_vector() {
    check_binary_broadcast(&[6, 4, 3], &[6]);
}

#[test]
fn binary_ops_broadcast_a_column() {
    check_binary_broadcast(&[6, 4, 3], &[1, 4, 3]);
}

#[test]
fn binary_ops_broadcast_a_scalar_like_tensor() {
    check_binary_broadcast(&[6, 4, 3, 2], &[1, 1, 1, 1]);
}

#[test]
fn binary_ops_broadcast_over_batch_dims() {
    check_binary_broadcast(&[6, 4, 3, 2], &[6, 4, 1, 2]);
    check_binary_broadcast(&[6, 4, 3, 2], &[6, 4, 3, 1]);
}

/// ggml's broadcast is tiling: any `b.ne[i]` dividing `a.ne[i]` repeats (numpy would refuse a
/// size-2 axis against a size-6 one).
#[test]
fn binary_ops_tile_a_dividing_operand() {
    check_binary_broadcast(&[6, 4, 2], &[2, 2, 1]);
}

#[test]
fn add_reads_a_permuted_view_and_a_transposed_operand() {
    let g = Harness::new();
    let (x, xv) = g.input(&[4, 3, 2]);
    // A permuted view keeping ne[0] innermost: rows contiguous, the tensor is not.
    let a = g.permute(&x, [0, 2, 1, 3]).unwrap();
    assert!(!a.is_contiguous());
    assert_eq!(a.shape().dims(), &[4, 2, 3]);
    let av = Array::from_fn(&[4, 2, 3], |[i0, i1, i2, _]| xv.at([i0, i2, i1, 0]));
    let (b, bv) = g.input(&[4, 2, 3]);
    let y = g.add(&a, &b).unwrap();
    assert_close(
        &g.run(&y),
        &ref_binary(&av, &bv, |x, y| x + y),
        TOL,
        "add on a permuted view",
    );

    // A transposed `b`: its rows are strided, which ggml reads element by element.
    let g = Harness::new();
    let (a, av) = g.input(&[4, 3]);
    let (z, zv) = g.input(&[3, 4]);
    let b = g.transpose(&z).unwrap();
    let bv = Array::from_fn(&[4, 3], |[i0, i1, ..]| zv.at([i1, i0, 0, 0]));
    let y = g.mul(&a, &b).unwrap();
    assert_close(
        &g.run(&y),
        &ref_binary(&av, &bv, |x, y| x * y),
        TOL,
        "mul by a transposed operand",
    );
}

#[test]
fn scale_multiplies_by_a_constant() {
    let g = Harness::new();
    let (a, av) = g.input(&[7, 3, 2]);
    let y = g.scale(&a, -2.5).unwrap();
    assert_close(&g.run(&y), &av.map(|x| -2.5 * x), TOL, "scale");
}

// --- unary ops ----------------------------------------------------------------------------------

/// erf to about 1e-15: the Maclaurin series below 3 (terms peak near 3^19/9! ~ 3e3, so f64
/// cancellation costs under 1e-12), the classic continued fraction for erfc above.
fn erf(x: f64) -> f64 {
    let ax = x.abs();
    let value = if ax < 3.0 {
        let (mut term, mut sum, mut n) = (ax, ax, 0.0);
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -ax * ax / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))
        let mut k = ax;
        for n in (1..=80).rev() {
            k = ax + n as f64 / 2.0 / k;
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * k)
    };
    value.copysign(x)
}

#[test]
fn reference_erf_matches_published_values() {
    // Abramowitz & Stegun table 7.1 / high-precision values.
    for (x, want) in [
        (0.0, 0.0),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (2.0, 0.9953222650189527),
        (2.9, 0.9999589021219005),
        (3.0, 0.9999779095030014),
        (3.5, 0.9999992569016276),
        (4.0, 0.9999999845827421),
        (6.0, 1.0),
    ] {
        assert!(
            (erf(x) - want).abs() < 1e-12,
            "erf({x}) = {} want {want}",
            erf(x)
        );
        assert!((erf(-x) + want).abs() < 1e-12);
    }
}

type UnaryOp = fn(&Context, &Tensor) -> da3::ggml::Result<Tensor>;

/// `op` on inputs spread over [-4, 4) against `f` element-wise.
fn check_unary(name: &str, op: UnaryOp, f: fn(f64) -> f64) {
    let g = Harness::new();
    let xv = g.random(&[33, 5, 2]).map(|x| 4.0 * x);
    let x = g.input_from(&xv);
    let y = op(&g, &x).unwrap();
    assert_close(&g.run(&y), &xv.map(f), TOL, name);
}

#[test]
fn gelu_erf_is_exact_gelu() {
    check_unary("gelu_erf", Context::gelu_erf, |x| {
        0.5 * x * (1.0 + erf(x / 2f64.sqrt()))
    });
}

#[test]
fn silu_is_x_times_sigmoid() {
    check_unary("silu", Context::silu, |x| x / (1.0 + (-x).exp()));
}

/// DINOv2-giant's FFN gate: each row `[x | g]` of `2n` values gives `silu(x) * g`.
#[test]
fn swiglu_is_silu_of_the_first_half_times_the_second() {
    let g = Harness::new();
    let xv = g.random(&[34, 5, 2]).map(|x| 4.0 * x);
    let x = g.input_from(&xv);
    let y = g.swiglu(&x).unwrap();
    assert_eq!(y.ne(), [17, 5, 2, 1]);
    let want = Array::from_fn(&[17, 5, 2], |[i, r, b, _]| {
        let (a, gate) = (xv.at([i, r, b, 0]), xv.at([i + 17, r, b, 0]));
        a / (1.0 + (-a).exp()) * gate
    });
    assert_close(&g.run(&y), &want, TOL, "swiglu");
    // An odd row and a strided view are refused before ggml sees them.
    let odd = g.input_from(&g.random(&[33, 2]));
    assert!(g.swiglu(&odd).unwrap_err().to_string().contains("halves"));
    let half = g.view(&x, &[16, 5, 2], &[x.nb()[1], x.nb()[2]], 0).unwrap();
    assert!(g.swiglu(&half).is_err());
}

#[test]
fn relu_clamps_negatives() {
    check_unary("relu", Context::relu, |x| x.max(0.0));
}

#[test]
fn exp_is_exp() {
    check_unary("exp", Context::exp, f64::exp);
}

#[test]
fn tanh_is_tanh() {
    check_unary("tanh", Context::tanh, f64::tanh);
}

#[test]
fn sigmoid_is_logistic() {
    check_unary("sigmoid", Context::sigmoid, |x| 1.0 / (1.0 + (-x).exp()));
}

// --- normalisation ------------------------------------------------------------------------------

/// Rows with a non-zero mean and a spread, so that normalisation has something to remove.
fn offset_rows(g: &Harness, ne: &[i64]) -> Array {
    g.random(ne).map(|x| 3.0 * x + 1.5)
}

fn ref_rows(a: &Array, f: impl Fn(&[f64]) -> Vec<f64>) -> Array {
    let rows: Vec<Vec<f64>> = a
        .data
        .chunks(a.ne[0])
        .map(|r| f(&r.iter().map(|&x| x as f64).collect::<Vec<_>>()))
        .collect();
    Array {
        ne: a.ne,
        data: rows.concat().into_iter().map(|x| x as f32).collect(),
    }
}

fn ref_norm(a: &Array, eps: f64) -> Array {
    ref_rows(a, |r| {
        let mean = r.iter().sum::<f64>() / r.len() as f64;
        let var = r.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / r.len() as f64;
        r.iter().map(|x| (x - mean) / (var + eps).sqrt()).collect()
    })
}

#[test]
fn norm_standardises_each_row() {
    let g = Harness::new();
    let xv = offset_rows(&g, &[24, 5, 3]);
    let x = g.input_from(&xv);
    let y = g.norm(&x, 1e-5).unwrap();
    assert_close(&g.run(&y), &ref_norm(&xv, 1e-5), TOL, "norm");
}

#[test]
fn norm_eps_is_added_to_the_variance() {
    // A large eps makes its placement visible: (x - mean) / sqrt(var + eps).
    let g = Harness::new();
    let xv = offset_rows(&g, &[16, 4]);
    let x = g.input_from(&xv);
    let y = g.norm(&x, 0.5).unwrap();
    assert_close(&g.run(&y), &ref_norm(&xv, 0.5), TOL, "norm with eps 0.5");
}

#[test]
fn layer_norm_scales_and_shifts_the_normalised_rows() {
    let g = Harness::new();
    let xv = offset_rows(&g, &[24, 5, 2]);
    let x = g.input_from(&xv);
    let (w, wv) = g.input(&[24]);
    let (b, bv) = g.input(&[24]);
    let y = g.layer_norm(&x, &w, &b, 1e-6).unwrap();
    let n = ref_norm(&xv, 1e-6);
    let want = Array::from_fn(&[24, 5, 2], |i| {
        n.at(i) * wv.at([i[0], 0, 0, 0]) + bv.at([i[0], 0, 0, 0])
    });
    assert_close(&g.run(&y), &want, TOL, "layer_norm");
}

#[test]
fn rms_norm_divides_by_the_root_mean_square() {
    let g = Harness::new();
    let xv = offset_rows(&g, &[24, 5, 3]);
    let x = g.input_from(&xv);
    let y = g.rms_norm(&x, 1e-3).unwrap();
    let want = ref_rows(&xv, |r| {
        let ms = r.iter().map(|x| x * x).sum::<f64>() / r.len() as f64;
        r.iter().map(|x| x / (ms + 1e-3).sqrt()).collect()
    });
    assert_close(&g.run(&y), &want, TOL, "rms_norm");
}

// --- softmax and attention ----------------------------------------------------------------------

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

#[test]
fn soft_max_normalises_rows() {
    let g = Harness::new();
    let xv = g.random(&[9, 4, 2]).map(|x| 5.0 * x);
    let x = g.input_from(&xv);
    let y = g.soft_max(&x).unwrap();
    assert_close(&g.run(&y), &ref_rows(&xv, softmax), TOL, "soft_max");
}

#[test]
fn soft_max_ext_scales_then_adds_a_broadcast_f32_mask() {
    let (tk, tq, heads) = (7usize, 4usize, 3usize);
    let g = Harness::new();
    let (a, av) = g.input(&[tk as i64, tq as i64, heads as i64]);
    // The mask has more rows than `a` (ggml allows padding) and one head, broadcast over three;
    // it blocks keys more than two ahead of the query with -inf and biases the rest.
    let mask = Array::from_fn(&[tk, tq + 2], |[j, i, ..]| {
        if j > i + 2 {
            f64::NEG_INFINITY
        } else {
            0.25 * ((j * 3 + i) % 5) as f64
        }
    });
    let m = g.input_from(&mask);
    let scale = 0.7;
    let y = g.soft_max_ext(&a, Some(&m), scale, 0.0).unwrap();
    let mut want = Array::from_fn(&[tk, tq, heads], |_| 0.0);
    for h in 0..heads {
        for i in 0..tq {
            let logits: Vec<f64> = (0..tk)
                .map(|j| scale as f64 * av.at([j, i, h, 0]) + mask.at([j, i, 0, 0]))
                .collect();
            for (j, p) in softmax(&logits).into_iter().enumerate() {
                let o = want.offset([j, i, h, 0]);
                want.data[o] = p as f32;
            }
        }
    }
    assert_close(&g.run(&y), &want, TOL, "soft_max_ext");
}

/// Naive attention: `out[c, h, t] = sum_j softmax_j(scale * q[:, t, h] . k[:, j, kh] + mask[j, t])
/// * v[c, j, kh]` with `kh = h / (H / Hk)`; the result is laid out `[Dv, H, Tq, 1]`.
fn ref_attention(q: &Array, k: &Array, v: &Array, mask: Option<&Array>, scale: f64) -> Array {
    let [d, tq, h, _] = q.ne;
    let [_, tk, hk, _] = k.ne;
    let dv = v.ne[0];
    let mut out = Array::from_fn(&[dv, h, tq], |_| 0.0);
    for head in 0..h {
        let kh = head / (h / hk);
        for t in 0..tq {
            let logits: Vec<f64> = (0..tk)
                .map(|j| {
                    let dot: f64 = (0..d)
                        .map(|c| q.at([c, t, head, 0]) * k.at([c, j, kh, 0]))
                        .sum();
                    scale * dot + mask.map_or(0.0, |m| m.at([j, t, 0, 0]))
                })
                .collect();
            let p = softmax(&logits);
            for c in 0..dv {
                let o = out.offset([c, head, t, 0]);
                out.data[o] = (0..tk).map(|j| p[j] * v.at([c, j, kh, 0])).sum::<f64>() as f32;
            }
        }
    }
    out
}

struct Attention {
    d: i64,
    dv: i64,
    tq: i64,
    tk: i64,
    heads: i64,
    kv_heads: i64,
    kv_type: DType,
    masked: bool,
}

fn check_flash_attn(c: Attention, tol: f64) {
    let g = Harness::new();
    let (q, qv) = g.input(&[c.d, c.tq, c.heads, 1]);
    let kv = |ne: &[i64]| {
        if c.kv_type == DType::F16 {
            g.input_f16(ne)
        } else {
            g.input(ne)
        }
    };
    let (k, kvals) = kv(&[c.d, c.tk, c.kv_heads, 1]);
    let (v, vvals) = kv(&[c.dv, c.tk, c.kv_heads, 1]);
    // An f16 mask (the type flash attention takes): the last query row sees only the first key.
    let maskv = Array::from_fn(&[c.tk as usize, c.tq as usize], |[j, t, ..]| {
        if t + 1 == c.tq as usize && j > 0 {
            f64::NEG_INFINITY
        } else {
            0.5 * ((j + 2 * t) % 3) as f64 - 0.5
        }
    });
    let mask = c.masked.then(|| {
        let feed: Vec<f16> = maskv.data.iter().map(|&x| f16::from_f32(x)).collect();
        g.new_input(DType::F16, &to_i64(&maskv.ne), Feed::F16(feed))
    });
    let scale = 1.0 / (c.d as f32).sqrt();
    let y = g.flash_attn_ext(&q, &k, &v, mask.as_ref(), scale).unwrap();
    assert_eq!(y.ne(), [c.dv, c.heads, c.tq, 1]);
    let want = ref_attention(
        &qv,
        &kvals,
        &vvals,
        c.masked.then_some(&maskv),
        scale as f64,
    );
    let what = format!(
        "flash_attn_ext D={} Dv={} Tq={} Tk={} H={}/{} {:?}",
        c.d, c.dv, c.tq, c.tk, c.heads, c.kv_heads, c.kv_type
    );
    assert_close(&g.run(&y), &want, tol, &what);
}

#[test]
fn flash_attn_ext_with_f32_kv_matches_naive_attention() {
    let c = Attention {
        d: 16,
        dv: 16,
        tq: 5,
        tk: 9,
        heads: 3,
        kv_heads: 3,
        kv_type: DType::F32,
        masked: false,
    };
    check_flash_attn(c, TOL);
}

#[test]
fn flash_attn_ext_with_f32_kv_applies_an_f16_mask() {
    let c = Attention {
        d: 16,
        dv: 16,
        tq: 6,
        tk: 11,
        heads: 2,
        kv_heads: 2,
        kv_type: DType::F32,
        masked: true,
    };
    check_flash_attn(c, TOL);
}

#[test]
fn flash_attn_ext_shares_kv_heads_between_query_heads() {
    // Grouped heads (query head h reads kv head h / 2) and a value size unlike the key size.
    let c = Attention {
        d: 8,
        dv: 12,
        tq: 4,
        tk: 7,
        heads: 4,
        kv_heads: 2,
        kv_type: DType::F32,
        masked: false,
    };
    check_flash_attn(c, TOL);
}

#[test]
fn flash_attn_ext_tiled_path_for_many_queries() {
    // 64 or more query rows take the CPU backend's tiled kernel (GGML_FA_TILE_Q = 64).
    let c = Attention {
        d: 32,
        dv: 32,
        tq: 70,
        tk: 80,
        heads: 2,
        kv_heads: 2,
        kv_type: DType::F32,
        masked: true,
    };
    check_flash_attn(c, TOL);
}

/// With f16 K/V the CPU kernel rounds each query row to f16 for the K dot products and
/// accumulates V*softmax in an f16 buffer, so results carry f16 rounding (2^-11 ~ 4.9e-4
/// relative per step); the reference uses the same f16-rounded K and V but an exact query and
/// f64 accumulation. Observed worst scaled error: 2.9e-4. 2e-3 leaves margin for other sizes
/// while still catching any layout, masking or scaling mistake (those give errors of O(0.1)).
/// With f32 K/V the kernel stays in f32 and the default 1e-5 holds (observed <= 7.5e-8).
#[test]
fn flash_attn_ext_with_f16_kv_matches_to_f16_precision() {
    let c = Attention {
        d: 16,
        dv: 16,
        tq: 5,
        tk: 9,
        heads: 2,
        kv_heads: 2,
        kv_type: DType::F16,
        masked: true,
    };
    check_flash_attn(c, 2e-3);
}

#[test]
fn flash_attn_ext_with_f16_kv_tiled_path() {
    // The tiled kernel converts f16 K/V tiles to f32 and keeps the query in f32.
    let c = Attention {
        d: 32,
        dv: 32,
        tq: 64,
        tk: 70,
        heads: 2,
        kv_heads: 1,
        kv_type: DType::F16,
        masked: false,
    };
    check_flash_attn(c, 2e-3);
}

// --- rope ---------------------------------------------------------------------------------------

/// Rotates the pairs of each row of `a [D, H, T]`: pair `i < n_dims/2` by
/// `theta_i = pos[t] * base^(-2i/n_dims)`; Neox pairs `(i, i + n_dims/2)`, Normal pairs
/// `(2i, 2i+1)`; values from `n_dims` on pass through.
fn ref_rope(a: &Array, pos: &[i32], n_dims: usize, mode: RopeMode, base: f64) -> Array {
    let mut out = a.clone();
    for [_, h, t, b] in indices([1, a.ne[1], a.ne[2], a.ne[3]]) {
        for i in 0..n_dims / 2 {
            let theta = pos[t] as f64 * base.powf(-2.0 * i as f64 / n_dims as f64);
            let (x, y) = match mode {
                RopeMode::Neox => (i, i + n_dims / 2),
                RopeMode::Normal => (2 * i, 2 * i + 1),
            };
            let (x0, x1) = (a.at([x, h, t, b]), a.at([y, h, t, b]));
            let (ox, oy) = (out.offset([x, h, t, b]), out.offset([y, h, t, b]));
            out.data[ox] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
            out.data[oy] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
        }
    }
    out
}

fn check_rope(mode: RopeMode, n_dims: usize) {
    let g = Harness::new();
    let pos = [0, 1, 4, 9, 13];
    let (a, av) = g.input(&[12, 3, pos.len() as i64]);
    let p = g.input_i32(&[pos.len() as i64], &pos);
    let y = g.rope(&a, &p, n_dims, mode, 100.0).unwrap();
    let want = ref_rope(&av, &pos, n_dims, mode, 100.0);
    assert_close(
        &g.run(&y),
        &want,
        TOL,
        &format!("rope {mode:?} n_dims={n_dims}"),
    );
}

#[test]
fn rope_neox_rotates_half_split_pairs() {
    check_rope(RopeMode::Neox, 12);
}

#[test]
fn rope_neox_leaves_dims_past_n_dims_alone() {
    check_rope(RopeMode::Neox, 8);
}

#[test]
fn rope_normal_rotates_adjacent_pairs() {
    check_rope(RopeMode::Normal, 12);
}

#[test]
fn rope_normal_leaves_dims_past_n_dims_alone() {
    check_rope(RopeMode::Normal, 6);
}

/// Vision-mode RoPE of `a [D, H, T]`: pairs `(i, i + D/2)`; pair `i < sections[0]` by
/// `pos[t] * base^(-4i/D)`, pair `sections[0] + j` by `pos[T + t] * base^(-4j/D)`.
fn ref_rope_vision(a: &Array, pos: &[i32], sections: [usize; 2], base: f64) -> Array {
    let (d, tokens) = (a.ne[0], a.ne[2]);
    let mut out = a.clone();
    for [_, h, t, b] in indices([1, a.ne[1], tokens, a.ne[3]]) {
        for i in 0..d / 2 {
            let (p, j) = match i < sections[0] {
                true => (pos[t], i),
                false => (pos[tokens + t], i - sections[0]),
            };
            let theta = p as f64 * base.powf(-4.0 * j as f64 / d as f64);
            let (x0, x1) = (a.at([i, h, t, b]), a.at([i + d / 2, h, t, b]));
            let (ox, oy) = (out.offset([i, h, t, b]), out.offset([i + d / 2, h, t, b]));
            out.data[ox] = (x0 * theta.cos() - x1 * theta.sin()) as f32;
            out.data[oy] = (x0 * theta.sin() + x1 * theta.cos()) as f32;
        }
    }
    out
}

#[test]
fn rope_vision_rotates_two_axes_in_one_node() {
    let g = Harness::new();
    // Row positions, then column positions; the last two axes are not read.
    let rows = [0, 1, 1, 2, 3];
    let cols = [0, 1, 2, 1, 4];
    let pos: Vec<i32> = [&rows[..], &cols, &[7; 5], &[9; 5]].concat();
    let (a, av) = g.input(&[16, 3, 5]);
    let p = g.input_i32(&[20], &pos);
    for sections in [[4, 4], [6, 2]] {
        let y = g.rope_vision(&a, &p, sections, 100.0).unwrap();
        let want = ref_rope_vision(&av, &pos, sections, 100.0);
        assert_close(&g.run(&y), &want, TOL, &format!("rope_vision {sections:?}"));
    }
}

/// DA3's 2D RoPE (each half of a head rotate-half by one axis) is one vision-mode node once
/// the head's second and third quarters swap places: what the backbone relies on.
#[test]
fn rope_vision_with_swapped_quarters_equals_two_half_head_ropes() {
    let g = Harness::new();
    let (d, tokens) = (16usize, 5usize);
    let ys = [0, 1, 1, 2, 3];
    let xs = [0, 1, 2, 1, 4];
    let (a, av) = g.input(&[d as i64, 2, tokens as i64]);
    let py = g.input_i32(&[tokens as i64], &ys);
    let px = g.input_i32(&[tokens as i64], &xs);
    let halves = g.rope_at(&a, &py, 0, d / 2, RopeMode::Neox, 100.0).unwrap();
    let halves = g
        .rope_at(&halves, &px, d / 2, d / 2, RopeMode::Neox, 100.0)
        .unwrap();
    let quarter = |i: usize| [0, 2, 1, 3][i / (d / 4)] * (d / 4) + i % (d / 4);
    let swapped = Array::from_fn(&[d, 2, tokens], |[i, h, t, _]| av.at([quarter(i), h, t, 0]));
    let b = g.input_from(&swapped);
    let pos: Vec<i32> = [&ys[..], &xs, &[0; 5], &[0; 5]].concat();
    let p = g.input_i32(&[4 * tokens as i64], &pos);
    let vision = g.rope_vision(&b, &p, [d / 4, d / 4], 100.0).unwrap();
    let (halves, vision) = (g.run(&halves), g.run(&vision));
    let unswapped = Array::from_fn(&[d, 2, tokens], |[i, h, t, _]| {
        vision.at([quarter(i), h, t, 0])
    });
    assert_close(&unswapped, &halves, TOL, "vision rope of swapped quarters");
}

// --- shape ops ----------------------------------------------------------------------------------

#[test]
fn reshape_keeps_the_data_in_order() {
    let g = Harness::new();
    let (a, av) = g.input(&[4, 6, 2]);
    for ne in [&[48][..], &[8, 6], &[3, 8, 2], &[2, 2, 3, 4]] {
        let y = g.reshape(&a, ne).unwrap();
        assert_eq!(y.shape().dims(), ne);
        let want = Array {
            ne: dims4(&to_usize(ne)),
            data: av.data.clone(),
        };
        assert_close(&g.run(&y), &want, 0.0, &format!("reshape to {ne:?}"));
    }
}

#[test]
fn contiguous_view_selects_a_range() {
    let g = Harness::new();
    let (a, av) = g.input(&[6, 5]);
    let y = g.view(&a, &[7], &[], 3 * 4).unwrap();
    assert!(y.is_contiguous());
    let want = Array::from_fn(&[7], |[i, ..]| av.data[3 + i] as f64);
    assert_close(&g.run(&y), &want, 0.0, "1D view");
}

#[test]
fn strided_2d_view_with_offset_is_a_sub_block() {
    let g = Harness::new();
    let (a, av) = g.input(&[6, 5]);
    // Rows 1..5, columns 2..5 of `a`: same row stride, offset to (2, 1).
    let row = 6 * 4;
    let v = g.view(&a, &[3, 4], &[row], (6 + 2) * 4).unwrap();
    assert!(!v.is_contiguous());
    let y = g.cont(&v).unwrap();
    let want = Array::from_fn(&[3, 4], |[i0, i1, ..]| av.at([i0 + 2, i1 + 1, 0, 0]));
    assert_close(&g.run(&y), &want, 0.0, "2D strided view");
}

#[test]
fn strided_3d_view_skips_planes() {
    let g = Harness::new();
    let (a, av) = g.input(&[4, 3, 4]);
    // Every other plane, columns 1..3: plane stride doubled, offset one element.
    let (nb1, nb2) = (4 * 4, 2 * 4 * 3 * 4);
    let v = g.view(&a, &[2, 3, 2], &[nb1, nb2], 4).unwrap();
    let y = g.cont(&v).unwrap();
    let want = Array::from_fn(&[2, 3, 2], |[i0, i1, i2, _]| av.at([i0 + 1, i1, 2 * i2, 0]));
    assert_close(&g.run(&y), &want, 0.0, "3D strided view");
}

#[test]
fn permute_moves_axis_i_to_position_axes_i() {
    let g = Harness::new();
    let (a, av) = g.input(&[2, 3, 4, 5]);
    for axes in [[2, 0, 3, 1], [0, 2, 1, 3], [3, 2, 1, 0]] {
        let y = g.cont(&g.permute(&a, axes).unwrap()).unwrap();
        let mut ne = [0; 4];
        for i in 0..4 {
            ne[axes[i]] = av.ne[i];
        }
        // out[j] = a[i] where j[axes[i]] = i[i].
        let want = Array::from_fn(&ne, |j| av.at([0, 1, 2, 3].map(|i| j[axes[i]])));
        assert_close(&g.run(&y), &want, 0.0, &format!("permute {axes:?}"));
    }
}

#[test]
fn transpose_swaps_the_first_two_dims() {
    let g = Harness::new();
    let (a, av) = g.input(&[3, 5, 2]);
    let y = g.cont(&g.transpose(&a).unwrap()).unwrap();
    let want = Array::from_fn(&[5, 3, 2], |[i0, i1, i2, _]| av.at([i1, i0, i2, 0]));
    assert_close(&g.run(&y), &want, 0.0, "transpose");
}

#[test]
fn concat_joins_along_each_dim() {
    for dim in 0..4 {
        let g = Harness::new();
        let a_ne = [2i64, 3, 2, 2];
        let mut b_ne = a_ne;
        b_ne[dim] = 3;
        let (a, av) = g.input(&a_ne);
        let (b, bv) = g.input(&b_ne);
        let y = g.concat(&a, &b, dim).unwrap();
        let mut ne = av.ne;
        ne[dim] += bv.ne[dim];
        let want = Array::from_fn(&ne, |i| {
            if i[dim] < av.ne[dim] {
                av.at(i)
            } else {
                let mut j = i;
                j[dim] -= av.ne[dim];
                bv.at(j)
            }
        });
        assert_close(&g.run(&y), &want, 0.0, &format!("concat along {dim}"));
    }
}

#[test]
fn get_rows_gathers_rows_by_index() {
    let g = Harness::new();
    let (a, av) = g.input(&[5, 6]);
    let rows = [5, 0, 3, 3];
    let r = g.input_i32(&[4], &rows);
    let y = g.get_rows(&a, &r).unwrap();
    let want = Array::from_fn(&[5, 4], |[i0, j, ..]| av.at([i0, rows[j] as usize, 0, 0]));
    assert_close(&g.run(&y), &want, 0.0, "get_rows");
}

#[test]
fn get_rows_gathers_per_batch() {
    let g = Harness::new();
    let (a, av) = g.input(&[3, 4, 2]);
    let rows = [3, 1, 1, 0, 2, 3]; // [3 picks, 2 batches]
    let r = g.input_i32(&[3, 2], &rows);
    let y = g.get_rows(&a, &r).unwrap();
    let want = Array::from_fn(&[3, 3, 2], |[i0, j, b, _]| {
        av.at([i0, rows[j + 3 * b] as usize, b, 0])
    });
    assert_close(&g.run(&y), &want, 0.0, "batched get_rows");
}

#[test]
fn pad_appends_zeros_after_each_dim() {
    let g = Harness::new();
    let (a, av) = g.input(&[3, 2, 2, 1]);
    let y = g.pad(&a, [2, 1, 0, 1]).unwrap();
    let want = Array::from_fn(&[5, 3, 2, 2], |i| av.at_or_zero(i.map(|x| x as i64)));
    assert_close(&g.run(&y), &want, 0.0, "pad");
}

// --- images -------------------------------------------------------------------------------------

/// PyTorch `conv2d` (cross-correlation, zero padding): kernel `[KW, KH, IC, OC]`, input
/// `[W, H, IC, N]`, output `[OW, OH, OC, N]`.
fn ref_conv_2d(
    k: &Array,
    x: &Array,
    s: (usize, usize),
    p: (usize, usize),
    d: (usize, usize),
) -> Array {
    let [kw, kh, ic, oc] = k.ne;
    let [w, h, _, n] = x.ne;
    let ow = (w + 2 * p.0 - d.0 * (kw - 1) - 1) / s.0 + 1;
    let oh = (h + 2 * p.1 - d.1 * (kh - 1) - 1) / s.1 + 1;
    Array::from_fn(&[ow, oh, oc, n], |[ox, oy, o, b]| {
        let mut sum = 0.0;
        for c in 0..ic {
            for ky in 0..kh {
                for kx in 0..kw {
                    let ix = (ox * s.0 + kx * d.0) as i64 - p.0 as i64;
                    let iy = (oy * s.1 + ky * d.1) as i64 - p.1 as i64;
                    sum += k.at([kx, ky, c, o]) * x.at_or_zero([ix, iy, c as i64, b as i64]);
                }
            }
        }
        sum
    })
}

fn check_conv_2d(stride: (i32, i32), padding: (i32, i32), dilation: (i32, i32)) {
    let g = Harness::new();
    let (k, kv) = g.input(&[3, 3, 2, 4]);
    let (x, xv) = g.input(&[9, 7, 2, 2]);
    let y = g.conv_2d(&k, &x, stride, padding, dilation).unwrap();
    let u = |(a, b): (i32, i32)| (a as usize, b as usize);
    let want = ref_conv_2d(&kv, &xv, u(stride), u(padding), u(dilation));
    let what = format!("conv_2d stride {stride:?} padding {padding:?} dilation {dilation:?}");
    assert_close(&g.run(&y), &want, TOL, &what);
}

#[test]
fn conv_2d_stride_1_padding_1() {
    check_conv_2d((1, 1), (1, 1), (1, 1));
}

#[test]
fn conv_2d_stride_2_padding_1() {
    check_conv_2d((2, 2), (1, 1), (1, 1));
}

#[test]
fn conv_2d_dilation_2_padding_1() {
    check_conv_2d((1, 1), (1, 1), (2, 2));
}

#[test]
fn conv_2d_with_different_width_and_height_parameters() {
    check_conv_2d((2, 1), (1, 0), (1, 2));
}

/// ggml's direct convolution (`GGML_OP_CONV_2D`, what GPUs run on tensor cores with an f16
/// kernel) against the reference: with an f32 kernel to f32 precision; with an f16 kernel the
/// CPU rounds each input patch to f16 as well, so the reference takes the f16-rounded kernel
/// and input (sums in f32 either way).
fn check_conv_2d_direct(half: bool, stride: (i32, i32), padding: (i32, i32), batch: i64) {
    let g = Harness::new();
    let (k, kv) = if half {
        g.input_f16(&[3, 3, 5, 4])
    } else {
        g.input(&[3, 3, 5, 4])
    };
    let (x, xv) = g.input(&[9, 7, 5, batch]);
    let y = g.conv_2d_direct(&k, &x, stride, padding, (1, 1)).unwrap();
    let u = |(a, b): (i32, i32)| (a as usize, b as usize);
    let xv = if half { xv.rounded_to_f16() } else { xv };
    let want = ref_conv_2d(&kv, &xv, u(stride), u(padding), (1, 1));
    let what = format!("conv_2d_direct f16 {half} stride {stride:?} padding {padding:?}");
    assert_close(&g.run(&y), &want, TOL, &what);
}

#[test]
fn conv_2d_direct_with_an_f32_kernel_is_the_convolution() {
    check_conv_2d_direct(false, (1, 1), (1, 1), 1);
    check_conv_2d_direct(false, (2, 2), (1, 0), 2);
}

#[test]
fn conv_2d_direct_with_an_f16_kernel_rounds_the_inputs_to_f16() {
    check_conv_2d_direct(true, (1, 1), (1, 1), 1);
    check_conv_2d_direct(true, (2, 1), (0, 1), 2);
}

/// PyTorch `conv_transpose2d` with padding 0: kernel `[KW, KH, OC, IC]` (PyTorch weights
/// (IC, OC, KH, KW)), `out[ix*s + kx, iy*s + ky, o, b] += x[ix, iy, c, b] * k[kx, ky, o, c]`.
fn ref_conv_transpose_2d(k: &Array, x: &Array, s: usize) -> Array {
    let [kw, kh, oc, _] = k.ne;
    let [w, h, _, n] = x.ne;
    let mut out = Array::from_fn(&[(w - 1) * s + kw, (h - 1) * s + kh, oc, n], |_| 0.0);
    let mut acc = vec![0f64; out.data.len()];
    for [ix, iy, c, b] in indices(x.ne) {
        for [kx, ky, o, _] in indices([kw, kh, oc, 1]) {
            acc[out.offset([ix * s + kx, iy * s + ky, o, b])] +=
                x.at([ix, iy, c, b]) * k.at([kx, ky, o, c]);
        }
    }
    out.data = acc.into_iter().map(|v| v as f32).collect();
    out
}

fn check_conv_transpose_2d(kernel: i64, stride: i32) {
    check_conv_transpose_2d_batch(kernel, stride, 2);
}

fn check_conv_transpose_2d_batch(kernel: i64, stride: i32, batch: i64) {
    let g = Harness::new();
    let (k, kv) = g.input(&[kernel, kernel, 2, 3]);
    let (x, xv) = g.input(&[4, 3, 3, batch]);
    let y = g.conv_transpose_2d(&k, &x, stride).unwrap();
    let want = ref_conv_transpose_2d(&kv, &xv, stride as usize);
    assert_close(
        &g.run(&y),
        &want,
        TOL,
        &format!("conv_transpose_2d kernel {kernel} stride {stride}"),
    );
}

#[test]
fn conv_transpose_2d_stride_2() {
    check_conv_transpose_2d(2, 2);
}

#[test]
fn conv_transpose_2d_stride_2_with_overlapping_kernel() {
    check_conv_transpose_2d(3, 2);
}

#[test]
fn conv_transpose_2d_stride_4() {
    check_conv_transpose_2d(4, 4);
}

/// One image with the kernel as large as the stride: a matrix product and an interleave.
#[test]
fn conv_transpose_2d_upsampling_one_image() {
    check_conv_transpose_2d_batch(2, 2, 1);
    check_conv_transpose_2d_batch(4, 4, 1);
    check_conv_transpose_2d_batch(3, 2, 1);
}

#[test]
fn conv_transpose_2d_stride_larger_than_kernel_leaves_zeros() {
    check_conv_transpose_2d(2, 4);
}

/// PyTorch `max_pool2d` / `avg_pool2d` (count_include_pad=True: the divisor is always the kernel
/// area, padding counted as zeros); output size `floor((in + 2p - k) / s) + 1`.
fn ref_pool_2d(
    x: &Array,
    pool: Pool,
    k: (usize, usize),
    s: (usize, usize),
    p: (usize, usize),
) -> Array {
    let [w, h, c, n] = x.ne;
    let (ow, oh) = ((w + 2 * p.0 - k.0) / s.0 + 1, (h + 2 * p.1 - k.1) / s.1 + 1);
    Array::from_fn(&[ow, oh, c, n], |[ox, oy, ch, b]| {
        let window = indices([k.0, k.1, 1, 1]).filter_map(|[kx, ky, ..]| {
            let (ix, iy) = (
                (ox * s.0 + kx) as i64 - p.0 as i64,
                (oy * s.1 + ky) as i64 - p.1 as i64,
            );
            (ix >= 0 && iy >= 0 && (ix as usize) < w && (iy as usize) < h)
                .then(|| x.at([ix as usize, iy as usize, ch, b]))
        });
        match pool {
            Pool::Max => window.fold(f64::NEG_INFINITY, f64::max),
            Pool::Avg => window.sum::<f64>() / (k.0 * k.1) as f64,
        }
    })
}

fn check_pool_2d(pool: Pool, kernel: (i32, i32), stride: (i32, i32), padding: (i32, i32)) {
    let g = Harness::new();
    let (x, xv) = g.input(&[7, 6, 3, 2]);
    let y = g
        .pool_2d(
            &x,
            pool,
            kernel,
            stride,
            (padding.0 as f32, padding.1 as f32),
        )
        .unwrap();
    let u = |(a, b): (i32, i32)| (a as usize, b as usize);
    let want = ref_pool_2d(&xv, pool, u(kernel), u(stride), u(padding));
    let what = format!("pool_2d {pool:?} kernel {kernel:?} stride {stride:?} padding {padding:?}");
    assert_close(&g.run(&y), &want, TOL, &what);
}

#[test]
fn pool_2d_max() {
    check_pool_2d(Pool::Max, (2, 2), (2, 2), (0, 0));
    check_pool_2d(Pool::Max, (3, 2), (2, 1), (1, 0));
}

#[test]
fn pool_2d_avg_counts_padding_as_zeros() {
    check_pool_2d(Pool::Avg, (2, 2), (2, 2), (0, 0));
    check_pool_2d(Pool::Avg, (3, 3), (1, 1), (1, 1));
}

// --- interpolation ------------------------------------------------------------------------------

/// PyTorch's source coordinate for output index `dst` (`area_pixel_compute_source_index`):
/// align_corners maps the corner pixels onto each other; otherwise pixel centres map, and
/// linear (not cubic) modes clamp negative coordinates to 0.
fn source_coord(
    dst: usize,
    size_in: usize,
    size_out: usize,
    align_corners: bool,
    cubic: bool,
) -> f64 {
    if align_corners {
        if size_out > 1 {
            dst as f64 * (size_in - 1) as f64 / (size_out - 1) as f64
        } else {
            0.0
        }
    } else {
        let s = (dst as f64 + 0.5) * size_in as f64 / size_out as f64 - 0.5;
        if cubic {
            s
        } else {
            s.max(0.0)
        }
    }
}

/// PyTorch's `nearest` source index (`nearest_idx`): identity and exact 2x are special-cased,
/// otherwise `floor(dst * (in / out))` in f32, clamped.
fn nearest_index(dst: usize, size_in: usize, size_out: usize) -> usize {
    if size_in == size_out {
        dst
    } else if size_out == 2 * size_in {
        dst >> 1
    } else {
        let scale = size_in as f32 / size_out as f32;
        ((dst as f32 * scale).floor() as usize).min(size_in - 1)
    }
}

/// PyTorch cubic convolution weights (A = -0.75) for the four taps around fraction `t`.
fn cubic_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// `F.interpolate` of `x` over dims 0 and 1 (W and H) to `(ow, oh)`.
fn ref_interpolate(x: &Array, ow: usize, oh: usize, mode: Interpolation) -> Array {
    let [w, h, c, n] = x.ne;
    let px = |ix: i64, iy: i64, ch: usize, b: usize| {
        x.at([
            ix.clamp(0, w as i64 - 1) as usize,
            iy.clamp(0, h as i64 - 1) as usize,
            ch,
            b,
        ])
    };
    Array::from_fn(&[ow, oh, c, n], |[ox, oy, ch, b]| match mode {
        Interpolation::Nearest => x.at([nearest_index(ox, w, ow), nearest_index(oy, h, oh), ch, b]),
        Interpolation::Bilinear { align_corners } => {
            let (sx, sy) = (
                source_coord(ox, w, ow, align_corners, false),
                source_coord(oy, h, oh, align_corners, false),
            );
            let (x0, y0) = (sx.floor() as i64, sy.floor() as i64);
            let (lx, ly) = (sx - x0 as f64, sy - y0 as f64);
            let row = |iy| px(x0, iy, ch, b) * (1.0 - lx) + px(x0 + 1, iy, ch, b) * lx;
            row(y0) * (1.0 - ly) + row(y0 + 1) * ly
        }
        Interpolation::Bicubic { align_corners } => {
            let (sx, sy) = (
                source_coord(ox, w, ow, align_corners, true),
                source_coord(oy, h, oh, align_corners, true),
            );
            let (x0, y0) = (sx.floor() as i64, sy.floor() as i64);
            let (wx, wy) = (cubic_weights(sx - x0 as f64), cubic_weights(sy - y0 as f64));
            (0..4)
                .map(|j| {
                    wy[j]
                        * (0..4)
                            .map(|i| wx[i] * px(x0 - 1 + i as i64, y0 - 1 + j as i64, ch, b))
                            .sum::<f64>()
                })
                .sum()
        }
    })
}

/// Resizes `[w, h, 2, 1]` to `[ow, oh, 2, 1]` with `mode`.
fn check_interpolate(mode: Interpolation, from: (i64, i64), to: (i64, i64)) {
    check_interpolate_tol(mode, from, to, TOL);
}

fn check_interpolate_tol(mode: Interpolation, (w, h): (i64, i64), (ow, oh): (i64, i64), tol: f64) {
    let g = Harness::new();
    let (x, xv) = g.input(&[w, h, 2, 1]);
    let y = g.interpolate(&x, [ow, oh, 2, 1], mode).unwrap();
    let want = ref_interpolate(&xv, ow as usize, oh as usize, mode);
    assert_close(
        &g.run(&y),
        &want,
        tol,
        &format!("interpolate {mode:?} {w}x{h} -> {ow}x{oh}"),
    );
}

const RESIZES: [((i64, i64), (i64, i64)); 5] = [
    ((4, 3), (8, 6)),  // exact 2x up
    ((5, 4), (9, 7)),  // fractional up
    ((4, 4), (16, 4)), // 4x along W only
    ((8, 6), (3, 4)),  // fractional down
    ((9, 6), (3, 2)),  // exact 1/3 down
];

#[test]
fn interpolate_nearest_matches_pytorch() {
    for (from, to) in RESIZES {
        check_interpolate(Interpolation::Nearest, from, to);
    }
}

/// A known divergence, pinned so that it stays visible: ggml computes the nearest source index as
/// `(int)(dst / (out / in))` in f32, PyTorch as `floor(dst * (in / out))` in f32. Where
/// `dst * in / out` is an exact integer the two roundings can land on either side of it. Resizing
/// 14 -> 16, output 8 maps exactly to source 7: PyTorch picks 7, ggml picks 6 (1 / 0.142857149f
/// = 6.99999976). Over all sizes up to 512, ggml misses the exact index in 34142 outputs and
/// PyTorch in 13454; they disagree in 46868 (of ~67M).
#[test]
fn interpolate_nearest_differs_from_pytorch_at_exact_boundaries() {
    let g = Harness::new();
    let xv = Array::from_fn(&[14], |[i, ..]| i as f64); // each value is its own index
    let x = g.input_from(&xv);
    let y = g
        .interpolate(&x, [16, 1, 1, 1], Interpolation::Nearest)
        .unwrap();
    let got = g.run(&y);
    let pytorch: Vec<f32> = (0..16).map(|d| nearest_index(d, 14, 16) as f32).collect();
    assert_eq!(pytorch[8], 7.0);
    assert_eq!(got.data[8], 6.0, "ggml rounds 8 / (16/14) down to 6");
    for d in (0..16).filter(|&d| d != 8) {
        assert_eq!(got.data[d], pytorch[d], "output {d}");
    }
}

#[test]
fn interpolate_bilinear_matches_pytorch() {
    for align_corners in [false, true] {
        for (from, to) in RESIZES {
            check_interpolate(Interpolation::Bilinear { align_corners }, from, to);
        }
    }
}

#[test]
fn interpolate_bicubic_matches_pytorch() {
    for align_corners in [false, true] {
        for (from, to) in RESIZES {
            check_interpolate(Interpolation::Bicubic { align_corners }, from, to);
        }
    }
}

/// Sizes like the model's: a 37x28 patch grid up to 518x392 pixels and back down.
///
/// Looser tolerance, because source coordinates reach ~500 here: ggml computes them in f32 as
/// `(dst + 0.5) / (out / in) - 0.5`, whose rounding (f32 spacing is 3e-5 between 256 and 512)
/// moves a coordinate by up to ~6e-5 pixel, and a unit-range image changes by up to ~3 per pixel
/// (bicubic overshoots). PyTorch's f32 `(dst + 0.5) * (in / out) - 0.5` has errors of the same
/// size in general, but is exact when `in / out` is (518 -> 37 is exactly 14), so there ggml
/// differs from PyTorch: observed 5.9e-5 (bilinear) and 9.7e-5 (bicubic) against the exact f64
/// reference, versus <= 8e-6 for the upsampling cases.
#[test]
fn interpolate_at_model_sizes_matches_pytorch() {
    for align_corners in [false, true] {
        for (from, to) in [
            ((37, 28), (518, 392)),
            ((518, 392), (37, 28)),
            ((74, 56), (37, 28)),
        ] {
            for mode in [
                Interpolation::Bilinear { align_corners },
                Interpolation::Bicubic { align_corners },
            ] {
                check_interpolate_tol(mode, from, to, 2e-4);
            }
        }
    }
}

#[test]
fn interpolate_to_a_single_pixel() {
    // Degenerate sizes exercise the align_corners special cases (PyTorch maps everything to the
    // first pixel when the output has one pixel and align_corners is set).
    for mode in [
        Interpolation::Nearest,
        Interpolation::Bilinear {
            align_corners: false,
        },
        Interpolation::Bilinear {
            align_corners: true,
        },
        Interpolation::Bicubic {
            align_corners: false,
        },
        Interpolation::Bicubic {
            align_corners: true,
        },
    ] {
        check_interpolate(mode, (5, 4), (1, 1));
        check_interpolate(mode, (1, 1), (3, 2));
    }
}

// --- schedulers and host memory -----------------------------------------------------------------

#[test]
fn sched_on_the_cpu_computes_what_gallocr_computes() {
    let g = Harness::new();
    let (w, wv) = g.input(&[16, 8]);
    let (x, xv) = g.input(&[16, 5]);
    let (b, bv) = g.input(&[8]);
    let y = g
        .gelu_erf(&g.add(&g.mul_mat(&w, &x).unwrap(), &b).unwrap())
        .unwrap();
    let by_gallocr = g.run_with(&y, Allocator::Gallocr);
    let by_sched = g.run_with(&y, Allocator::Sched);
    assert_eq!(
        by_gallocr.data, by_sched.data,
        "same kernels, same thread count: identical bits"
    );
    let h = ref_binary(&ref_mul_mat(&wv, &xv), &bv, |x, y| x + y);
    assert_close(
        &by_sched,
        &h.map(|x| 0.5 * x * (1.0 + erf(x / 2f64.sqrt()))),
        TOL,
        "sched",
    );
}

#[test]
fn host_context_weights_feed_a_graph_of_another_context() {
    let g = Harness::new();
    let wv = g.random(&[16, 6]);
    let host = Context::host(1 << 16).unwrap();
    let w = host.new_tensor(DType::F32, &[16, 6]).unwrap().named("w");
    host.write(&w, &wv.data).unwrap();
    // Data in the host pool, but no backend buffer.
    assert!(w.has_data());
    assert!(w.buffer().is_none());

    let (x, xv) = g.input(&[16, 3]);
    let y = g.mul_mat(&w, &x).unwrap();
    let want = ref_mul_mat(&wv, &xv);
    // The graph allocator leaves tensors that have data alone; the CPU reads the pointer.
    assert_close(&g.run(&y), &want, TOL, "mul_mat with host weights");
    assert!(
        w.buffer().is_none(),
        "the allocator gave the host tensor no buffer"
    );

    // Wrapping the pool gives the tensor a real CPU buffer (ggml names it "CPU_Mapped").
    assert_eq!(host.wrap_host_memory(BufferUsage::Any).unwrap(), 1);
    let buffer = w.buffer().expect("wrapped host tensors have a buffer");
    assert!(buffer.is_host());
    assert!(
        buffer.buffer_type().name().starts_with("CPU"),
        "{}",
        buffer.buffer_type().name()
    );
    assert_eq!(buffer.usage(), BufferUsage::Any);
    assert!(Backend::cpu(1)
        .unwrap()
        .supports_buffer_type(buffer.buffer_type()));
    assert_eq!(host.read::<f32>(&w).unwrap(), wv.data);

    // Both allocators still compute the same product from the wrapped memory.
    assert_close(
        &g.run_with(&y, Allocator::Gallocr),
        &want,
        TOL,
        "gallocr after wrapping",
    );
    assert_close(
        &g.run_with(&y, Allocator::Sched),
        &want,
        TOL,
        "sched after wrapping",
    );
}

/// A GGUF file's tensors land in a backend buffer with their names, shapes, types and bytes.
#[test]
fn gguf_tensors_load_into_a_backend_buffer() {
    use da3::gguf::{GgufFile, GgufWriter};
    let values: Vec<f32> = (0..64).map(|i| i as f32 * 0.25 - 3.0).collect();
    let mut writer = GgufWriter::new();
    writer
        .add_tensor(
            "w",
            DType::F32,
            &[16, 4],
            values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .unwrap();
    let q8 = da3::ggml::quantize(DType::Q8_0, &values, 32).unwrap();
    writer
        .add_tensor("q", DType::Q8_0, &[32, 2], q8.clone())
        .unwrap();
    let mut bytes = Vec::new();
    writer.write_to_writer(&mut bytes).unwrap();
    let file = GgufFile::from_bytes(bytes).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let ctx = file.load_tensors(&backend, BufferUsage::Weights).unwrap();
    let w = ctx.tensor("w").unwrap();
    assert_eq!(w.shape().dims(), &[16, 4]);
    assert_eq!(ctx.read::<f32>(&w).unwrap(), values);
    let q = ctx.tensor("q").unwrap();
    assert_eq!((q.dtype(), q.nbytes()), (DType::Q8_0, q8.len()));
    assert_eq!(q.buffer().unwrap().usage(), BufferUsage::Weights);
}
