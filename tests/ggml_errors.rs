//! Every precondition ggml would abort the process on comes back from the safe layer as an
//! [`Error`] of the right variant whose message names the op and the shapes involved; the test
//! process surviving each case is half of what these tests prove.

use da3::ggml::{
    rpc, Backend, Context, CpuKernels, DType, Device, DeviceKind, Error, Gallocr, Interpolation,
    KernelConfig, Pool, Result, RopeMode, Sched, Tensor, TensorView,
};
use std::net::TcpListener;

/// The error of a call that must fail (works for results whose value is not `Debug`).
fn expect_err<T>(result: Result<T>, what: &str) -> Error {
    match result {
        Ok(_) => panic!("{what}: expected an error, got Ok"),
        Err(e) => e,
    }
}

/// Asserts the error is of `$variant` and that its message mentions each of `$parts`.
macro_rules! assert_err {
    ($result:expr, $variant:pat, [$($part:expr),* $(,)?]) => {{
        let err = expect_err($result, stringify!($result));
        assert!(matches!(err, $variant), "{}: wrong variant {err:?}", stringify!($result));
        let message = err.to_string();
        let parts: &[&str] = &[$($part),*];
        for part in parts {
            assert!(message.contains(part), "message `{message}` should mention `{part}`");
        }
        err
    }};
}

fn ctx() -> Context {
    Context::metadata(64).unwrap()
}

fn f32(ctx: &Context, ne: &[i64], name: &str) -> Tensor {
    ctx.new_tensor(DType::F32, ne).unwrap().named(name)
}

// --- matrix products and element-wise ops --------------------------------------------------------

#[test]
fn mul_mat_with_different_reduced_dims_is_refused() {
    let c = ctx();
    let (a, b) = (f32(&c, &[4, 3], "a"), f32(&c, &[5, 2], "b"));
    assert_err!(
        c.mul_mat(&a, &b),
        Error::ShapeMismatch { op: "mul_mat", .. },
        ["mul_mat", "`a` f32 [4, 3]", "`b` f32 [5, 2]"]
    );
}

#[test]
fn mul_mat_with_non_dividing_batch_is_refused() {
    let c = ctx();
    let (a, b) = (f32(&c, &[4, 3, 2], "a"), f32(&c, &[4, 5, 3], "b"));
    assert_err!(
        c.mul_mat(&a, &b),
        Error::ShapeMismatch { op: "mul_mat", .. },
        ["mul_mat", "[4, 3, 2]", "[4, 5, 3]"]
    );
    let (a, b) = (f32(&c, &[4, 3, 1, 2], "a4"), f32(&c, &[4, 5, 1, 3], "b4"));
    assert_err!(
        c.mul_mat(&a, &b),
        Error::ShapeMismatch { op: "mul_mat", .. },
        ["[4, 3, 1, 2]", "[4, 5, 1, 3]"]
    );
}

#[test]
fn mul_mat_with_a_transposed_a_is_refused() {
    let c = ctx();
    let a = c.transpose(&f32(&c, &[3, 4], "w")).unwrap().named("wT");
    let b = f32(&c, &[4, 2], "b");
    assert_err!(
        c.mul_mat(&a, &b),
        Error::NotContiguous { op: "mul_mat", .. },
        ["mul_mat", "`wT` f32 [4, 3]"]
    );
}

/// ggml's CPU kernel asserts (at compute time) that rows of both operands are contiguous.
#[test]
fn mul_mat_with_a_transposed_b_is_refused() {
    let c = ctx();
    let a = f32(&c, &[4, 3], "a");
    let b = c.transpose(&f32(&c, &[2, 4], "x")).unwrap().named("xT");
    assert_err!(
        c.mul_mat(&a, &b),
        Error::NotContiguous { op: "mul_mat", .. },
        ["mul_mat", "`xT` f32 [4, 2]"]
    );
    // A permutation that moves ne[0] without being a transposition (nb[0] < nb[1]).
    let p = c
        .permute(&f32(&c, &[4, 3, 2], "p"), [2, 0, 1, 3])
        .unwrap()
        .named("perm");
    assert!(!p.is_transposed());
    let q = f32(&c, &[3, 5, 4], "q");
    assert_err!(
        c.mul_mat(&p, &q),
        Error::NotContiguous { op: "mul_mat", .. },
        ["`perm` f32 [3, 2, 4]"]
    );
}

#[test]
fn add_with_a_non_repeatable_operand_is_refused() {
    let c = ctx();
    let (a, b) = (f32(&c, &[4, 3], "a"), f32(&c, &[3, 3], "b"));
    assert_err!(
        c.add(&a, &b),
        Error::ShapeMismatch { op: "add", .. },
        ["add", "`a` f32 [4, 3]", "`b` f32 [3, 3]"]
    );
    for (name, result) in [
        ("sub", c.sub(&a, &b)),
        ("mul", c.mul(&a, &b)),
        ("div", c.div(&a, &b)),
    ] {
        let err = expect_err(result, name);
        assert!(err.to_string().starts_with(name), "{err}");
    }
}

/// ggml's CPU binary kernels assert (at compute time) that `a`'s rows are contiguous; a strided
/// `b` is fine (see the ops tests).
#[test]
fn binary_op_on_a_transposed_a_is_refused() {
    let c = ctx();
    let a = c.transpose(&f32(&c, &[3, 4], "x")).unwrap().named("xT");
    let b = f32(&c, &[4, 3], "b");
    assert_err!(
        c.add(&a, &b),
        Error::NotContiguous { op: "add", .. },
        ["add", "`xT` f32 [4, 3]"]
    );
    assert_err!(
        c.mul(&a, &b),
        Error::NotContiguous { op: "mul", .. },
        ["mul"]
    );
}

/// ggml's CPU binary kernels abort on type pairs they have no loop for (the result takes a's
/// type; `b` may be a's type or f32).
#[test]
fn binary_op_on_unsupported_type_pairs_is_refused() {
    let c = ctx();
    let a = f32(&c, &[4, 3], "act");
    let bias16 = c.new_tensor(DType::F16, &[4]).unwrap().named("bias16");
    assert_err!(
        c.add(&a, &bias16),
        Error::DType { op: "add", .. },
        ["add", "`bias16` f16 [4]", "expected f32"]
    );
    let idx = c.new_tensor(DType::I32, &[4, 3]).unwrap().named("idx");
    assert_err!(
        c.mul(&idx, &a),
        Error::DType { op: "mul", .. },
        ["`idx` i32 [4, 3]", "f32, f16 or bf16"]
    );
    let q = c.new_tensor(DType::Q8_0, &[32, 3]).unwrap().named("q");
    assert_err!(
        c.sub(&q, &f32(&c, &[32, 3], "d")),
        Error::DType { op: "sub", .. },
        ["`q` q8_0 [32, 3]"]
    );
    // Supported pairs still build: f16 + f16, f16 + f32 (an f16 result), quantized + f32.
    let h = c.new_tensor(DType::F16, &[4, 3]).unwrap();
    assert_eq!(c.add(&h, &bias16).unwrap().dtype(), DType::F16);
    assert_eq!(c.mul(&h, &a).unwrap().dtype(), DType::F16);
    assert_eq!(
        c.add(&q, &f32(&c, &[32, 3], "e")).unwrap().dtype(),
        DType::Q8_0
    );
}

// --- shapes and views ------------------------------------------------------------------------------

#[test]
fn reshape_of_a_non_contiguous_view_is_refused() {
    let c = ctx();
    let p = c
        .permute(&f32(&c, &[4, 3, 2], "x"), [0, 2, 1, 3])
        .unwrap()
        .named("xp");
    assert_err!(
        c.reshape(&p, &[24]),
        Error::NotContiguous { op: "reshape", .. },
        ["reshape", "`xp` f32 [4, 2, 3]", "cont"]
    );
}

#[test]
fn reshape_to_a_different_element_count_is_refused() {
    let c = ctx();
    let x = f32(&c, &[4, 3], "x");
    assert_err!(
        c.reshape(&x, &[5, 5]),
        Error::InvalidShape { op: "reshape", .. },
        ["reshape", "[5, 5]", "12"]
    );
    assert_err!(
        c.reshape(&x, &[12, 0]),
        Error::InvalidShape { op: "reshape", .. },
        ["[12, 0]"]
    );
    assert_err!(
        c.reshape(&x, &[1, 1, 1, 1, 12]),
        Error::InvalidShape { op: "reshape", .. },
        ["reshape"]
    );
}

#[test]
fn view_past_the_end_is_refused() {
    let c = ctx();
    let x = f32(&c, &[4, 4], "x"); // 64 bytes
                                   // Offset too large: 4 values from byte 60.
    assert_err!(
        c.view(&x, &[4], &[], 60),
        Error::ViewOutOfBounds { op: "view", .. },
        ["view", "offset 60", "`x` f32 [4, 4]", "64 bytes"]
    );
    // Strided extent too large: rows 32 bytes apart reach byte 16 + 3 * 32 = 112.
    assert_err!(
        c.view(&x, &[4, 4], &[32], 0),
        Error::ViewOutOfBounds { op: "view", .. },
        ["112 bytes", "[4, 4]"]
    );
    // Offsets near usize::MAX must not wrap around.
    assert_err!(
        c.view(&x, &[1], &[], usize::MAX - 2),
        Error::ViewOutOfBounds { .. },
        ["view"]
    );
    // A stride for each dim after the first.
    assert_err!(
        c.view(&x, &[2, 2], &[], 0),
        Error::InvalidShape { op: "view", .. },
        ["view", "[2, 2]"]
    );
}

#[test]
fn view_of_a_view_is_bounded_by_its_source() {
    let c = ctx();
    let x = f32(&c, &[8, 4], "x"); // 128 bytes
    let tail = c.view(&x, &[8, 2], &[32], 64).unwrap().named("tail"); // the last 64 bytes
    assert_err!(
        c.view(&tail, &[8, 2], &[32], 32),
        Error::ViewOutOfBounds { op: "view", .. },
        ["`tail` f32 [8, 2]"]
    );
    assert!(c.view(&tail, &[8], &[], 32).is_ok());
}

#[test]
fn new_tensor_with_an_invalid_shape_is_refused() {
    let c = ctx();
    for (ne, reason) in [
        (&[4, 0][..], "dimension 0 is not positive"),
        (&[4, -2], "dimension -2 is not positive"),
        (&[], "0 dims"),
        (&[1, 2, 3, 4, 5], "5 dims"),
        (&[i64::MAX / 2, 4], "overflows"),
        (&[1 << 40, 1 << 40], "overflows"),
    ] {
        let err = assert_err!(
            c.new_tensor(DType::F32, ne),
            Error::InvalidShape {
                op: "new_tensor",
                ..
            },
            ["new_tensor", reason]
        );
        assert!(err.to_string().contains(&format!("{ne:?}")), "{err}");
    }
    // Few bytes per value: 2^65 values of IQ1_S fit in 2^62.6 bytes, but their count does not fit
    // in an i64 (nor a u64).
    assert_err!(
        c.new_tensor(DType::IQ1_S, &[256 << 20, 1 << 37]),
        Error::InvalidShape {
            op: "new_tensor",
            ..
        },
        ["overflows"]
    );
    // Nothing was created by the failed calls.
    assert!(c.tensors().is_empty());
}

#[test]
fn quantized_rows_must_hold_whole_blocks() {
    let c = ctx();
    assert_err!(
        c.new_tensor(DType::Q8_0, &[33, 2]),
        Error::InvalidShape {
            op: "new_tensor",
            ..
        },
        ["q8_0", "32", "33"]
    );
    assert_err!(
        c.new_tensor(DType::Q4_K, &[100]),
        Error::InvalidShape {
            op: "new_tensor",
            ..
        },
        ["q4_K", "256", "100"]
    );
    assert!(c.new_tensor(DType::Q8_0, &[64, 2]).is_ok());
    assert!(c.new_tensor(DType::Q4_K, &[512]).is_ok());
}

#[test]
fn permute_with_repeated_or_out_of_range_axes_is_refused() {
    let c = ctx();
    let x = f32(&c, &[2, 3, 4, 5], "x");
    assert_err!(
        c.permute(&x, [0, 0, 1, 2]),
        Error::InvalidArgument { op: "permute", .. },
        ["permute", "[0, 0, 1, 2]"]
    );
    assert_err!(
        c.permute(&x, [0, 1, 2, 4]),
        Error::InvalidArgument { op: "permute", .. },
        ["[0, 1, 2, 4]"]
    );
}

#[test]
fn concat_of_different_types_is_refused() {
    let c = ctx();
    let a = f32(&c, &[4, 3], "a");
    let b = c.new_tensor(DType::F16, &[4, 3]).unwrap().named("b");
    assert_err!(
        c.concat(&a, &b, 1),
        Error::DType { op: "concat", .. },
        ["concat", "`b` f16 [4, 3]", "expected f32"]
    );
}

#[test]
fn concat_with_mismatched_other_dims_is_refused() {
    let c = ctx();
    let (a, b) = (f32(&c, &[4, 3], "a"), f32(&c, &[4, 2], "b"));
    assert_err!(
        c.concat(&a, &b, 0),
        Error::ShapeMismatch { op: "concat", .. },
        ["concat", "`a` f32 [4, 3]", "`b` f32 [4, 2]"]
    );
    assert!(c.concat(&a, &b, 1).is_ok());
    assert_err!(
        c.concat(&a, &b, 4),
        Error::InvalidArgument { op: "concat", .. },
        ["dim 4"]
    );
}

#[test]
fn get_rows_with_f32_indices_is_refused() {
    let c = ctx();
    let (a, idx) = (f32(&c, &[8, 10], "table"), f32(&c, &[3], "idx"));
    assert_err!(
        c.get_rows(&a, &idx),
        Error::DType { op: "get_rows", .. },
        ["get_rows", "`idx` f32 [3]", "expected i32"]
    );
    let idx = c.new_tensor(DType::I32, &[3, 2]).unwrap().named("idx2");
    assert_err!(
        c.get_rows(&a, &idx),
        Error::ShapeMismatch { op: "get_rows", .. },
        ["`table` f32 [8, 10]", "`idx2` i32 [3, 2]"]
    );
}

// --- images ----------------------------------------------------------------------------------------

#[test]
fn conv_2d_with_mismatched_channels_is_refused() {
    let c = ctx();
    let (k, x) = (
        f32(&c, &[3, 3, 4, 8], "kernel"),
        f32(&c, &[16, 16, 3, 1], "image"),
    );
    assert_err!(
        c.conv_2d(&k, &x, (1, 1), (1, 1), (1, 1)),
        Error::ShapeMismatch { op: "conv_2d", .. },
        [
            "conv_2d",
            "`kernel` f32 [3, 3, 4, 8]",
            "`image` f32 [16, 16, 3]"
        ]
    );
}

#[test]
fn conv_2d_on_an_input_smaller_than_the_kernel_is_refused() {
    let c = ctx();
    let (k, x) = (
        f32(&c, &[5, 5, 2, 4], "kernel"),
        f32(&c, &[3, 3, 2, 1], "image"),
    );
    assert_err!(
        c.conv_2d(&k, &x, (1, 1), (0, 0), (1, 1)),
        Error::ShapeMismatch { op: "conv_2d", .. },
        ["smaller than the kernel", "[5, 5, 2, 4]", "[3, 3, 2]"]
    );
    // Dilation makes a kernel reach further.
    let k3 = f32(&c, &[3, 3, 2, 4], "k3");
    assert_err!(
        c.conv_2d(&k3, &x, (1, 1), (0, 0), (2, 2)),
        Error::ShapeMismatch { op: "conv_2d", .. },
        ["[3, 3, 2, 4]"]
    );
    assert_err!(
        c.conv_2d(&k3, &x, (0, 1), (0, 0), (1, 1)),
        Error::InvalidArgument { op: "conv_2d", .. },
        ["stride (0, 1)"]
    );
}

#[test]
fn conv_2d_direct_refuses_what_its_kernels_would_abort_on() {
    let c = ctx();
    let (k, x) = (
        f32(&c, &[3, 3, 4, 8], "kernel"),
        f32(&c, &[16, 16, 3, 1], "image"),
    );
    assert_err!(
        c.conv_2d_direct(&k, &x, (1, 1), (1, 1), (1, 1)),
        Error::ShapeMismatch { op: "conv_2d", .. },
        ["`kernel` f32 [3, 3, 4, 8]", "`image` f32 [16, 16, 3]"]
    );
    // The CPU kernel asserts a contiguous kernel; CUDA asserts both operands contiguous.
    let k4 = f32(&c, &[3, 3, 4, 8], "k4");
    let permuted = c.permute(&k4, [1, 0, 2, 3]).unwrap();
    let x4 = f32(&c, &[16, 16, 4, 1], "x4");
    assert_err!(
        c.conv_2d_direct(&permuted, &x4, (1, 1), (1, 1), (1, 1)),
        Error::NotContiguous {
            op: "conv_2d_direct",
            ..
        },
        ["k4"]
    );
    // Only f32 and f16 kernels, only f32 inputs.
    let q = c
        .new_tensor(DType::I32, &[3, 3, 4, 8])
        .unwrap()
        .named("ints");
    assert_err!(
        c.conv_2d_direct(&q, &x4, (1, 1), (1, 1), (1, 1)),
        Error::DType {
            op: "conv_2d_direct",
            ..
        },
        ["ints"]
    );
    assert_err!(
        c.conv_2d_direct(&k4, &x4, (1, 0), (1, 1), (1, 1)),
        Error::InvalidArgument { op: "conv_2d", .. },
        ["stride (1, 0)"]
    );
}

#[test]
fn conv_transpose_2d_with_mismatched_channels_is_refused() {
    let c = ctx();
    let (k, x) = (
        f32(&c, &[2, 2, 8, 4], "kernel"),
        f32(&c, &[5, 5, 3, 1], "image"),
    );
    assert_err!(
        c.conv_transpose_2d(&k, &x, 2),
        Error::ShapeMismatch {
            op: "conv_transpose_2d",
            ..
        },
        ["conv_transpose_2d", "[2, 2, 8, 4]", "[5, 5, 3]"]
    );
}

/// The fused forms (a convolution of a ReLU'd input, a transposed convolution with its
/// bias) refuse a bias that is not one value per output channel and mismatched channels,
/// ggml's ops with an error naming the operands, the CPU kernels' nodes by refusing them too
/// (an error, or no node for the transposed convolution, which then falls to ggml's).
#[test]
fn fused_convolutions_refuse_a_wrong_bias_and_mismatched_channels() {
    let kernels = CpuKernels::f32(KernelConfig::detect());
    {
        let c = ctx();
        let (k, x) = (
            f32(&c, &[3, 3, 4, 8], "kernel"),
            f32(&c, &[20, 12, 4, 1], "image"),
        );
        let short = f32(&c, &[7], "short");
        assert_err!(
            c.conv_2d_of_relu(&k, &x, Some(&short), (1, 1), (1, 1), (1, 1)),
            Error::ShapeMismatch { op: "conv_2d", .. },
            ["output channels (ne[3])", "`short` f32 [7]"]
        );
        let three = f32(&c, &[20, 12, 3, 1], "three");
        assert_err!(
            c.conv_2d_of_relu(&k, &three, None, (1, 1), (1, 1), (1, 1)),
            Error::ShapeMismatch { op: "conv_2d", .. },
            ["`three` f32 [20, 12, 3]"]
        );
        let (kt, xt) = (f32(&c, &[2, 2, 8, 4], "up"), f32(&c, &[5, 5, 4, 1], "low"));
        assert_err!(
            c.conv_transpose_2d_bias(&kt, &xt, &short, 2),
            Error::ShapeMismatch {
                op: "conv_transpose_2d",
                ..
            },
            ["output channels (ne[2])", "`short` f32 [7]"]
        );
        let x3 = f32(&c, &[5, 5, 3, 1], "three_low");
        let bias = f32(&c, &[8], "bias");
        assert_err!(
            c.conv_transpose_2d_bias(&kt, &x3, &bias, 2),
            Error::ShapeMismatch {
                op: "conv_transpose_2d",
                ..
            },
            ["[2, 2, 8, 4]", "[5, 5, 3]"]
        );
        assert_err!(
            c.cpu_conv_2d_same(&kernels, &k, &x, Some(&short), true),
            Error::ShapeMismatch { op: "conv_2d", .. },
            ["`short` f32 [7]"]
        );
        assert_err!(
            c.cpu_conv_2d_same(&kernels, &k, &three, None, true),
            Error::ShapeMismatch { op: "conv_2d", .. },
            ["`three` f32 [20, 12, 3]"]
        );
        for (input, bias) in [(&xt, &short), (&x3, &bias)] {
            let node = c.cpu_conv_transpose_2d_bias(&kernels, &kt, input, bias, 2);
            assert!(matches!(node, Ok(None)), "{node:?}");
        }
    }
}

/// ggml sizes pool output as `(in + 2p - k) / s + 1` in float and truncates the sum, so an
/// input one short of the kernel with stride 2 gives 0.5 -> 0 and ggml asserts.
#[test]
fn pool_2d_on_an_input_smaller_than_the_kernel_is_refused() {
    let c = ctx();
    let x = f32(&c, &[2, 2, 3], "x");
    for stride in [(1, 1), (2, 2), (3, 1)] {
        assert_err!(
            c.pool_2d(&x, Pool::Max, (3, 3), stride, (0.0, 0.0)),
            Error::ShapeMismatch { op: "pool_2d", .. },
            ["pool_2d", "`x` f32 [2, 2, 3]"]
        );
    }
    assert!(c.pool_2d(&x, Pool::Avg, (3, 3), (2, 2), (1.0, 1.0)).is_ok());
    assert_err!(
        c.pool_2d(&x, Pool::Avg, (0, 3), (1, 1), (0.0, 0.0)),
        Error::InvalidArgument { op: "pool_2d", .. },
        ["kernel (0, 3)"]
    );
}

/// ggml's CPU pooling walks its input plane by plane, `nb[2]` apart, until the input's byte
/// size: a permuted input gave more planes than the output holds, written past its end (a heap
/// overflow the graph_ops fuzz target found under ASan). Padding is stored as int by ggml.
#[test]
fn pool_2d_of_a_non_contiguous_input_or_wild_padding_is_refused() {
    let c = ctx();
    let x = f32(&c, &[4, 6, 5], "x");
    let permuted = c.permute(&x, [2, 0, 1, 3]).unwrap();
    assert_err!(
        c.pool_2d(&permuted, Pool::Max, (2, 2), (1, 1), (0.0, 0.0)),
        Error::ShapeMismatch { op: "pool_2d", .. },
        ["pool_2d", "contiguous", "cont"]
    );
    // A one-element view with a plane stride of 0 counts as contiguous to ggml; the kernel's
    // plane loop never ended on it (the fuzz input).
    let zero_stride = c.view(&x, &[1, 1, 1], &[4, 0], 0).unwrap();
    assert!(zero_stride.is_contiguous());
    assert_err!(
        c.pool_2d(&zero_stride, Pool::Max, (1, 1), (1, 1), (0.0, 0.0)),
        Error::ShapeMismatch { op: "pool_2d", .. },
        ["pool_2d", "nb[2]"]
    );
    let made_contiguous = c.cont(&permuted).unwrap();
    assert!(c
        .pool_2d(&made_contiguous, Pool::Max, (2, 2), (1, 1), (0.0, 0.0))
        .is_ok());
    for padding in [(-1.0, 0.0), (0.0, f32::NAN), (3.0e9, 0.0), (0.0, 3.0)] {
        assert_err!(
            c.pool_2d(&x, Pool::Avg, (2, 2), (1, 1), padding),
            Error::InvalidArgument { op: "pool_2d", .. },
            ["padding"]
        );
    }
}

#[test]
fn interpolate_of_a_non_f32_tensor_is_refused() {
    let c = ctx();
    let x = c.new_tensor(DType::F16, &[8, 8, 3]).unwrap().named("img");
    let mode = Interpolation::Bilinear {
        align_corners: false,
    };
    assert_err!(
        c.interpolate(&x, [16, 16, 3, 1], mode),
        Error::DType {
            op: "interpolate",
            ..
        },
        ["interpolate", "`img` f16 [8, 8, 3]", "expected f32"]
    );
    let y = f32(&c, &[8, 8, 3], "y");
    assert_err!(
        c.interpolate(&y, [16, 0, 3, 1], mode),
        Error::InvalidShape {
            op: "interpolate",
            ..
        },
        ["[16, 0, 3, 1]"]
    );
}

// --- softmax, attention, rope ------------------------------------------------------------------------

#[test]
fn soft_max_ext_with_a_mask_that_does_not_cover_is_refused() {
    let c = ctx();
    let a = f32(&c, &[7, 4, 2], "scores");
    for (ne, name) in [
        (&[7, 3][..], "short"),
        (&[6, 4], "narrow"),
        (&[7, 4, 3], "heads"),
    ] {
        let m = f32(&c, ne, name);
        assert_err!(
            c.soft_max_ext(&a, Some(&m), 1.0, 0.0),
            Error::ShapeMismatch {
                op: "soft_max_ext",
                ..
            },
            [
                "soft_max_ext",
                "`scores` f32 [7, 4, 2]",
                &format!("`{name}` f32 {}", m.shape())
            ]
        );
    }
    let i = c.new_tensor(DType::I32, &[7, 4]).unwrap().named("imask");
    assert_err!(
        c.soft_max_ext(&a, Some(&i), 1.0, 0.0),
        Error::DType {
            op: "soft_max_ext",
            ..
        },
        ["`imask` i32 [7, 4]"]
    );
    assert_err!(
        c.soft_max_ext(&a, None, 1.0, 8.0),
        Error::InvalidArgument {
            op: "soft_max_ext",
            ..
        },
        ["max_bias"]
    );
}

#[test]
fn flash_attn_ext_with_a_head_size_mismatch_is_refused() {
    let c = ctx();
    let q = f32(&c, &[64, 10, 4, 1], "q");
    let k = f32(&c, &[32, 12, 4, 1], "k");
    let v = f32(&c, &[64, 12, 4, 1], "v");
    assert_err!(
        c.flash_attn_ext(&q, &k, &v, None, 0.125),
        Error::ShapeMismatch {
            op: "flash_attn_ext",
            ..
        },
        [
            "flash_attn_ext",
            "`q` f32 [64, 10, 4]",
            "`k` f32 [32, 12, 4]"
        ]
    );
    // Heads of k must divide q's, and v must match k's length.
    let k3 = f32(&c, &[64, 12, 3, 1], "k3");
    assert_err!(
        c.flash_attn_ext(&q, &k3, &v, None, 0.125),
        Error::ShapeMismatch {
            op: "flash_attn_ext",
            ..
        },
        ["[64, 12, 3]"]
    );
    let k = f32(&c, &[64, 12, 4, 1], "k64");
    let v11 = f32(&c, &[64, 11, 4, 1], "v11");
    assert_err!(
        c.flash_attn_ext(&q, &k, &v11, None, 0.125),
        Error::ShapeMismatch {
            op: "flash_attn_ext",
            ..
        },
        ["`v11` f32 [64, 11, 4]"]
    );
    // The mask must be f16.
    let m = f32(&c, &[12, 10], "m32");
    assert_err!(
        c.flash_attn_ext(&q, &k, &v, Some(&m), 0.125),
        Error::DType {
            op: "flash_attn_ext",
            ..
        },
        ["`m32` f32 [12, 10]", "f16"]
    );
}

#[test]
fn rope_with_bad_positions_or_dims_is_refused() {
    let c = ctx();
    let a = f32(&c, &[8, 2, 5], "x");
    let pos_f32 = f32(&c, &[5], "pos");
    assert_err!(
        c.rope(&a, &pos_f32, 8, RopeMode::Neox, 100.0),
        Error::DType { op: "rope", .. },
        ["`pos` f32 [5]"]
    );
    let pos4 = c.new_tensor(DType::I32, &[4]).unwrap().named("pos4");
    assert_err!(
        c.rope(&a, &pos4, 8, RopeMode::Neox, 100.0),
        Error::ShapeMismatch { op: "rope", .. },
        ["`x` f32 [8, 2, 5]", "`pos4` i32 [4]"]
    );
    let pos = c.new_tensor(DType::I32, &[5]).unwrap();
    for n_dims in [0, 7, 10] {
        assert_err!(
            c.rope(&a, &pos, n_dims, RopeMode::Normal, 100.0),
            Error::InvalidArgument { op: "rope", .. },
            [&format!("n_dims {n_dims}")]
        );
    }
}

/// ggml asserts exactly 4 positions per token in vision mode, and the kernels that the two
/// sections cover half a row.
#[test]
fn rope_vision_with_bad_positions_or_sections_is_refused() {
    let c = ctx();
    let a = f32(&c, &[8, 2, 5], "x");
    let pos5 = c.new_tensor(DType::I32, &[5]).unwrap().named("pos5");
    assert_err!(
        c.rope_vision(&a, &pos5, [2, 2], 100.0),
        Error::ShapeMismatch {
            op: "rope_vision",
            ..
        },
        ["4 x a.ne[2]", "`pos5` i32 [5]"]
    );
    let pos = c.new_tensor(DType::I32, &[20]).unwrap();
    for sections in [[2, 1], [4, 4], [0, 0]] {
        assert_err!(
            c.rope_vision(&a, &pos, sections, 100.0),
            Error::InvalidArgument {
                op: "rope_vision",
                ..
            },
            [&format!("sections {sections:?}")]
        );
    }
    let halves = c.new_tensor(DType::BF16, &[8, 2, 5]).unwrap();
    assert_err!(
        c.rope_vision(&halves, &pos, [2, 2], 100.0),
        Error::DType {
            op: "rope_vision",
            ..
        },
        ["bf16"]
    );
}

// --- contexts ----------------------------------------------------------------------------------------

/// `Context::metadata(n)` holds `n` tensors plus one graph of `Context::GRAPH_SIZE` nodes; the
/// graph's share of the pool is not reserved, so tensors may use it, and a graph can fail once
/// they have.
#[test]
fn metadata_context_pool_exhaustion_is_reported() {
    // Room for exactly two tensors and a one-node graph.
    let c = Context::metadata_with_graph(2, 1).unwrap();
    let a = f32(&c, &[4], "a");
    let b = f32(&c, &[4], "b");
    let err = assert_err!(
        c.new_tensor(DType::F32, &[4]),
        Error::ContextFull { .. },
        ["context memory pool exhausted", "larger pool"]
    );
    let Error::ContextFull {
        needed,
        available,
        capacity,
    } = err
    else {
        unreachable!()
    };
    assert!(
        needed > available && capacity == c.memory().1,
        "{needed} {available} {capacity}"
    );
    // Ops need room for their result too.
    assert_err!(c.add(&a, &b), Error::ContextFull { .. }, []);
    assert_err!(c.reshape(&a, &[2, 2]), Error::ContextFull { .. }, []);
    assert_eq!(c.tensors().len(), 2);

    // The default constructor: two tensors, then the graph it has room for, then nothing more.
    let c = Context::metadata(2).unwrap();
    f32(&c, &[4], "a");
    f32(&c, &[4], "b");
    c.new_graph(Context::GRAPH_SIZE).unwrap();
    assert_err!(
        c.new_tensor(DType::F32, &[4]),
        Error::ContextFull { .. },
        []
    );

    // Without a graph, the graph's share holds further tensors until it too runs out.
    let c = Context::metadata(2).unwrap();
    let mut created = 0;
    let err = loop {
        match c.new_tensor(DType::F32, &[4]) {
            Ok(_) => created += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, Error::ContextFull { .. }), "{err:?}");
    assert!(created > 2, "{created}");
    assert_err!(
        c.new_graph(Context::GRAPH_SIZE),
        Error::ContextFull { .. },
        []
    );
}

#[test]
fn host_context_too_small_for_the_data_is_reported() {
    let c = Context::host(4096).unwrap();
    let err = assert_err!(
        c.new_tensor(DType::F32, &[1024, 4]),
        Error::ContextFull { .. },
        ["bytes needed"]
    );
    let Error::ContextFull { needed, .. } = err else {
        unreachable!()
    };
    assert!(needed >= 1024 * 4 * 4);
    // Small tensors still fit afterwards.
    let t = f32(&c, &[16], "small");
    c.write(&t, &[1.0f32; 16]).unwrap();
    assert_eq!(c.read::<f32>(&t).unwrap(), vec![1.0; 16]);
}

// --- graphs ------------------------------------------------------------------------------------------

/// A chain `x -> scale -> scale -> ...` of `n` ops.
fn chain(c: &Context, x: &Tensor, n: usize) -> Vec<Tensor> {
    let mut out: Vec<Tensor> = Vec::new();
    for i in 0..n {
        let prev = out.last().unwrap_or(x);
        out.push(c.scale(prev, 2.0).unwrap().named(&format!("s{i}")));
    }
    out
}

/// A refused expand leaves the graph as it was: smaller expands still fit, and the graph
/// computes.
#[test]
fn graph_full_is_reported_and_the_graph_stays_usable() {
    let c = ctx();
    let x = f32(&c, &[4], "x");
    x.mark_input();
    let steps = chain(&c, &x, 10);
    let graph = c.new_graph(4).unwrap();
    let err = assert_err!(
        graph.expand(&steps[9]),
        Error::GraphFull { .. },
        ["graph full", "s9", "10 nodes", "holds 4"]
    );
    let Error::GraphFull {
        nodes,
        leafs,
        capacity,
        ..
    } = err
    else {
        unreachable!()
    };
    assert_eq!((nodes, leafs, capacity), (10, 1, 4));
    assert_eq!(
        (graph.n_nodes(), graph.n_leafs()),
        (0, 0),
        "the failed expand added nothing"
    );

    graph.expand(&steps[2]).unwrap();
    assert_eq!((graph.n_nodes(), graph.n_leafs()), (3, 1));
    graph.expand(&steps[3]).unwrap(); // exactly full
    assert_eq!(graph.n_nodes(), 4);
    assert_err!(
        graph.expand(&steps[4]),
        Error::GraphFull { nodes: 5, .. },
        ["s4"]
    );
    assert_eq!(graph.n_nodes(), 4);

    steps[3].mark_output();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    run.write(&x, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    run.compute(&backend).unwrap();
    assert_eq!(
        run.read::<f32>(&steps[3]).unwrap(),
        vec![16.0, 32.0, 48.0, 64.0]
    );
}

#[test]
fn graph_of_capacity_zero_is_refused() {
    assert_err!(
        ctx().new_graph(0),
        Error::InvalidArgument {
            op: "new_graph",
            ..
        },
        ["capacity 0"]
    );
}

#[test]
fn expanding_a_graph_from_a_leaf_is_refused() {
    let c = ctx();
    let x = f32(&c, &[4], "weights");
    let graph = c.new_graph(8).unwrap();
    assert_err!(
        graph.expand(&x),
        Error::InvalidArgument {
            op: "graph expand",
            ..
        },
        ["`weights`", "no op"]
    );
    assert_eq!(graph.n_leafs(), 0);
}

/// A graph `y = x * 3` allocated on the CPU, with `stray` left out of it.
struct Allocated {
    ctx: Context,
    x: Tensor,
    y: Tensor,
    stray: Tensor,
}

fn small_graph() -> Allocated {
    let ctx = ctx();
    let x = f32(&ctx, &[2, 3], "x");
    x.mark_input();
    let y = ctx.scale(&x, 3.0).unwrap().named("y");
    y.mark_output();
    let stray = f32(&ctx, &[2, 3], "stray");
    Allocated { ctx, x, y, stray }
}

#[test]
fn writing_host_data_of_the_wrong_length_or_type_is_refused() {
    let t = small_graph();
    let graph = t.ctx.new_graph(8).unwrap();
    graph.expand(&t.y).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    assert_err!(
        run.write(&t.x, &[1.0f32; 5]),
        Error::DataMismatch { .. },
        ["`x` f32 [2, 3]", "5 values", "6"]
    );
    assert_err!(
        run.write(&t.x, &[1i32; 6]),
        Error::DataMismatch { .. },
        ["`x` f32 [2, 3]", "i32"]
    );
    assert_err!(
        run.write(&t.x, &[half::f16::ONE; 6]),
        Error::DataMismatch { .. },
        ["f16"]
    );
    assert_err!(
        run.read::<i32>(&t.y),
        Error::DataMismatch { .. },
        ["`y` f32 [2, 3]", "i32"]
    );
    // The right data still goes through.
    run.write(&t.x, &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    run.compute(&backend).unwrap();
    assert_eq!(
        run.read::<f32>(&t.y).unwrap(),
        vec![3.0, 6.0, 9.0, 12.0, 15.0, 18.0]
    );
}

#[test]
fn reading_a_tensor_outside_the_graph_is_refused() {
    let t = small_graph();
    let graph = t.ctx.new_graph(8).unwrap();
    graph.expand(&t.y).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    assert_err!(
        run.read::<f32>(&t.stray),
        Error::NotAllocated { .. },
        ["`stray` f32 [2, 3]", "no data"]
    );
    assert_err!(
        run.write(&t.stray, &[0.0f32; 6]),
        Error::NotAllocated { .. },
        ["`stray`"]
    );
    // Nor can the context read what an allocator (not the context) placed, or what has no memory.
    assert_err!(t.ctx.read::<f32>(&t.y), Error::NotAllocated { .. }, ["`y`"]);
    assert_err!(
        t.ctx.read::<f32>(&t.stray),
        Error::NotAllocated { .. },
        ["`stray`"]
    );
}

#[test]
fn reading_a_non_contiguous_view_is_refused() {
    let c = ctx();
    let x = f32(&c, &[2, 3], "x");
    x.mark_input();
    let xt = c.transpose(&x).unwrap().named("xt");
    let graph = c.new_graph(8).unwrap();
    let out = c.cont(&xt).unwrap();
    graph.expand(&out).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    assert_err!(
        run.read::<f32>(&xt),
        Error::NotContiguous { .. },
        ["`xt` f32 [3, 2]"]
    );
}

// --- backends, schedulers, RPC --------------------------------------------------------------------------

#[test]
fn cpu_backend_and_device_list_include_the_cpu() {
    let devices = Device::all();
    assert!(
        devices.iter().any(|d| d.kind() == DeviceKind::Cpu),
        "{devices:?}"
    );
    let backend = Backend::cpu(1).unwrap();
    assert!(backend.is_cpu());
    assert_eq!(backend.device(), Device::cpu());
    assert!(
        backend.name().eq_ignore_ascii_case("cpu"),
        "{}",
        backend.name()
    );
    assert!(backend.default_buffer_type().is_host());
    assert_eq!(Device::by_name("cpu").unwrap(), Device::cpu());
    assert_err!(
        Device::by_name("no-such-device"),
        Error::DeviceNotFound { .. },
        ["no-such-device", &Device::cpu().name()]
    );
}

#[test]
fn sched_needs_one_to_sixteen_backends() {
    assert_err!(
        Sched::new(&[], 64, false),
        Error::InvalidArgument { op: "sched", .. },
        ["0 backends"]
    );
    let cpu = Backend::cpu(1).unwrap();
    let many = vec![cpu; da3::ggml::MAX_BACKENDS + 1];
    assert_err!(
        Sched::new(&many, 64, false),
        Error::InvalidArgument { op: "sched", .. },
        ["17 backends"]
    );
}

#[test]
fn sched_rejects_graphs_larger_than_its_size() {
    let t = small_graph();
    let graph = t.ctx.new_graph(8).unwrap();
    graph.expand(&t.y).unwrap(); // 1 node + 1 leaf
    let mut sched = Sched::new(&[Backend::cpu(1).unwrap()], 1, false).unwrap();
    assert_err!(
        sched.alloc(&graph, &[]),
        Error::GraphFull { .. },
        ["scheduler graph"]
    );
    let mut sched = Sched::new(&[Backend::cpu(1).unwrap()], 8, false).unwrap();
    assert_err!(
        sched.alloc(&graph, &[(&t.y, 1)]),
        Error::InvalidArgument {
            op: "sched pin",
            ..
        },
        ["index 1"]
    );
    assert_err!(
        sched.alloc(&graph, &[(&t.stray, 0)]),
        Error::NotAllocated { .. },
        ["`stray`"]
    );
}

/// A port on which nothing listens: bound by us, then closed.
fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr.to_string()
}

#[test]
fn rpc_to_a_port_nobody_listens_on_is_unreachable() {
    for endpoint in ["127.0.0.1:1".to_owned(), closed_port()] {
        let err = assert_err!(
            Device::rpc(&endpoint),
            Error::RpcUnreachable { .. },
            [&endpoint, "unreachable"]
        );
        let Error::RpcUnreachable { source, .. } = &err else {
            unreachable!()
        };
        assert_eq!(
            source.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{err}"
        );
    }
}

#[test]
fn rpc_to_an_unresolvable_host_is_unreachable() {
    let endpoint = "no-such-host.invalid:50052";
    assert_err!(
        Device::rpc(endpoint),
        Error::RpcUnreachable { .. },
        [endpoint]
    );
    assert_err!(
        Device::rpc("missing-port"),
        Error::RpcUnreachable { .. },
        ["missing-port"]
    );
}

/// A real non-CPU backend: an RPC server for this process's CPU, served from a thread.
#[test]
fn sched_with_the_cpu_not_last_is_refused() {
    let endpoint = closed_port();
    let served = endpoint.clone();
    std::thread::spawn(move || {
        // Serves until the test process exits.
        let _ = rpc::serve(&served, Device::cpu(), 1);
    });
    rpc::wait_until_listening(&endpoint, std::time::Duration::from_secs(20)).unwrap();
    let remote = Backend::new(Device::rpc(&endpoint).unwrap()).unwrap();
    assert!(!remote.is_cpu());
    let cpu = Backend::cpu(1).unwrap();
    assert_err!(
        Sched::new(&[cpu.clone(), remote.clone()], 64, false),
        Error::InvalidArgument { op: "sched", .. },
        ["last backend must be the CPU"]
    );
    assert_err!(
        Sched::new(std::slice::from_ref(&remote), 64, false),
        Error::InvalidArgument { op: "sched", .. },
        ["CPU"]
    );
    assert!(Sched::new(&[remote, cpu], 64, false).is_ok());
}

/// ggml's CPU kernels for these ops abort on anything but f32 data.
#[test]
fn f32_only_ops_refuse_other_types() {
    let c = Context::metadata(16).unwrap();
    let h = c.new_tensor(DType::F16, &[8, 4]).unwrap().named("h");
    let cases: [(&str, Result<Tensor>); 4] = [
        ("norm", c.norm(&h, 1e-5)),
        ("rms_norm", c.rms_norm(&h, 1e-5)),
        ("soft_max_ext", c.soft_max_ext(&h, None, 1.0, 0.0)),
        ("pad", c.pad(&h, [1, 0, 0, 0])),
    ];
    for (op, result) in cases {
        match result {
            Err(Error::DType { op: got, .. }) => assert_eq!(got, op),
            other => panic!("{op}: expected a type error, got {other:?}"),
        }
    }
    let kernel = c.new_tensor(DType::F32, &[2, 2, 3, 4]).unwrap();
    let input = c
        .new_tensor(DType::F16, &[5, 5, 4, 1])
        .unwrap()
        .named("half_input");
    let err = c.conv_transpose_2d(&kernel, &input, 2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                op: "conv_transpose_2d",
                ..
            }
        ),
        "{err}"
    );
}

// --- compute-time aborts of ggml's CPU kernels, refused when the op is built ---------------------

/// ggml_scale asserts `ggml_is_padded_1d` (a permuted view aborts at graph build); the CPU
/// kernel aborts on f16 or i32 data and asserts a contiguous `a` (a row-strided view aborted
/// this test's process before the check existed).
#[test]
fn scale_refuses_permuted_views_and_types_the_cpu_cannot_scale() {
    let c = ctx();
    let x = f32(&c, &[4, 3, 2], "x");
    let p = c.permute(&x, [1, 0, 2, 3]).unwrap().named("xp");
    for result in [c.scale(&p, 2.0), c.scale_bias(&p, 2.0, 1.0)] {
        assert_err!(result, Error::NotContiguous { .. }, ["`xp`"]);
    }
    // Dims 1 and 2 swapped: rows stay contiguous, planes do not follow each other.
    let q = c.permute(&x, [0, 2, 1, 3]).unwrap().named("xq");
    assert_err!(
        c.scale(&q, 2.0),
        Error::NotContiguous { op: "scale", .. },
        ["`xq`"]
    );
    for dtype in [DType::F16, DType::I32] {
        let t = c.new_tensor(dtype, &[4, 3]).unwrap().named("t");
        assert_err!(c.scale(&t, 2.0), Error::DType { op: "scale", .. }, ["`t`"]);
        assert_err!(
            c.scale_bias(&t, 2.0, 1.0),
            Error::DType {
                op: "scale_bias",
                ..
            },
            ["`t`"]
        );
    }
    let b = c.new_tensor(DType::BF16, &[4, 3]).unwrap();
    let bt = c.transpose(&b).unwrap().named("bT");
    assert_err!(c.scale(&bt, 2.0), Error::NotContiguous { .. }, ["`bT`"]);
    let rows = c.view(&x, &[2, 3], &[16], 0).unwrap().named("rows");
    assert_err!(c.scale(&rows, 2.0), Error::NotContiguous { .. }, ["`rows`"]);
}

/// What scale accepts computes: a bf16 tensor, and an f32 view made contiguous.
#[test]
fn scale_computes_bf16_and_a_contiguous_copy_of_a_view() {
    let c = ctx();
    let x = f32(&c, &[4, 3], "x");
    x.mark_input();
    let rows = c.view(&x, &[2, 3], &[16], 0).unwrap(); // the first two values of each row
    let y = c.scale(&c.cont(&rows).unwrap(), 2.0).unwrap().named("y");
    y.mark_output();
    let h = c.new_tensor(DType::BF16, &[4]).unwrap().named("h");
    h.mark_input();
    let z = c.scale_bias(&h, 2.0, 1.0).unwrap().named("z");
    z.mark_output();
    let graph = c.new_graph(16).unwrap();
    graph.expand(&y).unwrap();
    graph.expand(&z).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    run.write(&x, &(0..12).map(|v| v as f32).collect::<Vec<_>>())
        .unwrap();
    let hv: Vec<half::bf16> = [1.0f32, 2.0, 3.0, 4.0].map(half::bf16::from_f32).to_vec();
    run.write(&h, &hv).unwrap();
    run.compute(&backend).unwrap();
    assert_eq!(
        run.read::<f32>(&y).unwrap(),
        vec![0.0, 2.0, 8.0, 10.0, 16.0, 18.0]
    );
    let z: Vec<f32> = run
        .read::<half::bf16>(&z)
        .unwrap()
        .iter()
        .map(|v| v.to_f32())
        .collect();
    assert_eq!(z, vec![3.0, 5.0, 7.0, 9.0]);
}

/// The CPU's unary kernels abort on types other than f32, f16 and bf16.
#[test]
fn unary_ops_refuse_integer_data() {
    let c = ctx();
    let i = c.new_tensor(DType::I32, &[4, 2]).unwrap().named("idx");
    let cases: [(&str, Result<Tensor>); 7] = [
        ("gelu", c.gelu(&i)),
        ("gelu_erf", c.gelu_erf(&i)),
        ("silu", c.silu(&i)),
        ("relu", c.relu(&i)),
        ("exp", c.exp(&i)),
        ("tanh", c.tanh(&i)),
        ("sigmoid", c.sigmoid(&i)),
    ];
    for (op, result) in cases {
        match result {
            Err(Error::DType { op: got, .. }) => assert_eq!(got, op),
            other => panic!("{op}: expected a type error, got {other:?}"),
        }
    }
}

/// The CPU's rope kernel aborts on types other than f32 and f16.
#[test]
fn rope_refuses_bf16_data() {
    let c = ctx();
    let a = c.new_tensor(DType::BF16, &[8, 2, 3]).unwrap().named("q");
    let pos = c.new_tensor(DType::I32, &[3]).unwrap();
    assert_err!(
        c.rope(&a, &pos, 8, RopeMode::Neox, 100.0),
        Error::DType { op: "rope", .. },
        ["`q` bf16"]
    );
}

/// i32 has no dot product (the CPU kernel would call NULL); `b` must be f32 or the type the
/// dot product of `a` takes.
#[test]
fn mul_mat_refuses_types_without_a_dot_product() {
    let c = ctx();
    let ai = c.new_tensor(DType::I32, &[4, 3]).unwrap().named("ai");
    assert_err!(
        c.mul_mat(&ai, &f32(&c, &[4, 2], "b")),
        Error::DType { op: "mul_mat", .. },
        ["`ai` i32"]
    );
    let ah = c.new_tensor(DType::F16, &[4, 3]).unwrap();
    for dtype in [DType::BF16, DType::I32] {
        let b = c.new_tensor(dtype, &[4, 2]).unwrap().named("bx");
        assert_err!(
            c.mul_mat(&ah, &b),
            Error::DType { op: "mul_mat", .. },
            ["`bx`"]
        );
    }
    let bh = c.new_tensor(DType::F16, &[4, 2]).unwrap();
    assert!(c.mul_mat(&ah, &bh).is_ok());
}

/// im2col's CPU kernels write f32 columns from f32 input and f16 columns from f16 or f32.
#[test]
fn im2col_refuses_column_and_input_types_the_cpu_cannot_convert() {
    let c = ctx();
    let kernel = f32(&c, &[3, 3, 2, 4], "k");
    let input = f32(&c, &[8, 8, 2, 1], "x");
    assert_err!(
        c.im2col(&kernel, &input, (1, 1), (0, 0), (1, 1), DType::BF16),
        Error::InvalidArgument { op: "im2col", .. },
        ["bf16"]
    );
    let half_input = c.new_tensor(DType::F16, &[8, 8, 2, 1]).unwrap().named("xh");
    assert_err!(
        c.im2col(&kernel, &half_input, (1, 1), (0, 0), (1, 1), DType::F32),
        Error::DType { op: "im2col", .. },
        ["`xh` f16"]
    );
    assert!(c
        .im2col(&kernel, &half_input, (1, 1), (0, 0), (1, 1), DType::F16)
        .is_ok());
    let bf_input = c
        .new_tensor(DType::BF16, &[8, 8, 2, 1])
        .unwrap()
        .named("xb");
    assert_err!(
        c.conv_2d(&kernel, &bf_input, (1, 1), (0, 0), (1, 1)),
        Error::DType { op: "im2col", .. },
        ["`xb` bf16"]
    );
}

/// The CPU's pool kernel reads every type but f32 as f16.
#[test]
fn pool_2d_refuses_types_it_would_misread() {
    let c = ctx();
    for dtype in [DType::BF16, DType::I32] {
        let a = c.new_tensor(dtype, &[4, 4, 2]).unwrap().named("img");
        assert_err!(
            c.pool_2d(&a, Pool::Max, (2, 2), (2, 2), (0.0, 0.0)),
            Error::DType { op: "pool_2d", .. },
            ["`img`"]
        );
    }
}

/// The CPU kernel converts q's rows from f32 (an f16 q would be read past its end) and needs
/// a dot product for k's type and a conversion for v's.
#[test]
fn flash_attn_ext_refuses_a_non_f32_q_and_integer_k_or_v() {
    let c = ctx();
    let qh = c.new_tensor(DType::F16, &[8, 3, 2]).unwrap().named("qh");
    let k = f32(&c, &[8, 5, 2], "k");
    let v = f32(&c, &[8, 5, 2], "v");
    assert_err!(
        c.flash_attn_ext(&qh, &k, &v, None, 0.5),
        Error::DType {
            op: "flash_attn_ext",
            ..
        },
        ["`qh` f16"]
    );
    let q = f32(&c, &[8, 3, 2], "q");
    let ki = c.new_tensor(DType::I32, &[8, 5, 2]).unwrap().named("ki");
    assert_err!(
        c.flash_attn_ext(&q, &ki, &v, None, 0.5),
        Error::DType {
            op: "flash_attn_ext",
            ..
        },
        ["`ki` i32"]
    );
    assert_err!(
        c.flash_attn_ext(&q, &k, &ki, None, 0.5),
        Error::DType {
            op: "flash_attn_ext",
            ..
        },
        ["`ki` i32"]
    );
}

/// Found by the graph_ops fuzz target: `ggml_is_contiguous` skips dims of size 1, so a view
/// whose size-1 dim has an odd stride is contiguous yet not padded-1d, and ggml_scale aborted.
#[test]
fn scale_refuses_a_contiguous_view_that_is_not_padded_1d() {
    let c = ctx();
    let x = f32(&c, &[4, 3], "x");
    let v = c.view(&x, &[4, 1, 3], &[8, 16], 0).unwrap().named("odd");
    assert!(v.is_contiguous());
    assert_err!(
        c.scale(&v, 2.0),
        Error::NotContiguous { op: "scale", .. },
        ["`odd`"]
    );
}

/// Found by the graph_ops fuzz target: a row of one value passes ggml's row-contiguity check
/// with any stride, but the CPU's unary kernels assert `nb[0]` is the element size.
#[test]
fn unary_ops_refuse_rows_of_one_strided_value() {
    let c = ctx();
    let t = c.transpose(&f32(&c, &[4, 1], "col")).unwrap().named("row1");
    assert_eq!(t.ne()[0], 1);
    assert_err!(
        c.tanh(&t),
        Error::NotContiguous { op: "tanh", .. },
        ["`row1`"]
    );
    assert_err!(
        c.gelu(&t),
        Error::NotContiguous { op: "gelu", .. },
        ["`row1`"]
    );
}

/// Found by the graph_ops fuzz target: the CPU kernel asserts the input's rows are contiguous.
#[test]
fn conv_transpose_2d_refuses_an_input_with_strided_rows() {
    let c = ctx();
    let kernel = f32(&c, &[3, 3, 2, 4], "k");
    let x = f32(&c, &[4, 5, 4], "x");
    let xt = c.transpose(&x).unwrap().named("xT");
    assert_err!(
        c.conv_transpose_2d(&kernel, &xt, 2),
        Error::NotContiguous {
            op: "conv_transpose_2d",
            ..
        },
        ["`xT`"]
    );
}

/// A graph whose intermediate results need more than the memory available is refused before
/// anything is allocated (on Linux a huge allocation succeeds and the process is killed when
/// it touches the memory), naming both sizes; the allocator then serves graphs that fit.
#[test]
fn a_graph_over_the_memory_available_is_refused_before_allocating() {
    let c = ctx();
    let n = 1 << 20; // 4 MiB per f32 tensor
    let x = f32(&c, &[n], "x");
    x.mark_input();
    let y = c.exp(&c.add(&x, &x).unwrap()).unwrap();
    y.mark_output();
    let graph = c.new_graph(8).unwrap();
    graph.expand(&y).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let need = gallocr.measure(&graph).unwrap();
    assert!(need >= 8 << 20, "{need}");
    gallocr.set_memory_limit(Some(need - 1));
    assert_err!(
        gallocr.alloc(&graph),
        Error::ComputeMemory { .. },
        ["needs", "MiB", "available"]
    );
    gallocr.set_memory_limit(Some(need));
    let run = gallocr.alloc(&graph).unwrap();
    let input = vec![0.5f32; n as usize];
    run.write(&x, &input).unwrap();
    run.compute(&backend).unwrap();
    assert!(run
        .read::<f32>(&y)
        .unwrap()
        .iter()
        .all(|&v| (v - 1.0f32.exp()).abs() < 1e-6));
    // Without a limit: the host's available memory, far above 12 MiB.
    gallocr.set_memory_limit(None);
    assert!(gallocr.alloc(&graph).is_ok());
}
