//! Each CPU kernel (a `cpu_*` op) against ggml's own op on the same data.

use da3::ggml::{
    Backend, Context, DType, Error, Gallocr, Interpolation, Result, Tensor, TensorView,
};
use da3::ggml::{CpuKernels, KernelConfig, KernelRequest};

/// Deterministic values in [-2, 2).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 4.0 - 2.0
        })
        .collect()
}

/// The largest absolute difference between two results of the same length.
fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// This CPU's default kernels, f32 products.
fn f32_kernels() -> CpuKernels {
    CpuKernels::f32(KernelConfig::detect())
}

/// This CPU's default kernels with bf16 products asked for.
fn bf16_kernels() -> CpuKernels {
    CpuKernels {
        bf16_products: true,
        ..f32_kernels()
    }
}

/// Builds `reference` and `ours` over inputs of shapes `shapes` (filled with `values`),
/// computes each on the CPU (2 threads) and returns the largest difference.
fn max_difference(
    shapes: &[&[i64]],
    reference: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
    ours: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
) -> f32 {
    let backend = Backend::cpu(2).unwrap();
    let (a, _) = compute(&backend, shapes, reference);
    let (b, _) = compute(&backend, shapes, ours);
    max_abs_difference(&a, &b)
}

/// `op` on inputs of `shapes` (deterministic values), computed on `backend`: the result and
/// the name of its node.
fn compute(
    backend: &Backend,
    shapes: &[&[i64]],
    op: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
) -> (Vec<f32>, String) {
    let ctx = Context::metadata(64).unwrap();
    let inputs: Vec<Tensor> = shapes
        .iter()
        .map(|ne| ctx.new_tensor(DType::F32, ne).unwrap())
        .collect();
    inputs.iter().for_each(|t| _ = t.mark_input());
    let out = op(&ctx, &inputs).unwrap();
    out.mark_output();
    let graph = ctx.new_graph(64).unwrap();
    graph.expand(&out).unwrap();
    let mut gallocr = Gallocr::for_backend(backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    for (i, t) in inputs.iter().enumerate() {
        run.write(t, &values(t.nelements() as usize, i as u32))
            .unwrap();
    }
    run.compute(backend).unwrap();
    (run.read::<f32>(&out).unwrap(), out.name())
}

/// The three epilogues of a packed product against ggml's ops on the plain weight.
#[derive(Clone, Copy, Debug)]
enum Epilogue {
    Bias,
    Gelu,
    ScaledResidual,
}

/// A weight as a tensor's type and bytes.
struct Weight<'a> {
    dtype: DType,
    ne: [i64; 3],
    bytes: &'a [u8],
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `x W^T + b` for `t` rows, then `epilogue`: ggml's ops on the plain weight (`plain`, of
/// ggml shape [k, n]) and the packed kernel (with `kernels`) on `packed`, the operands from
/// `seed`; returns (ggml's result, the kernel's).
fn packed_against_ggml(
    kernels: &CpuKernels,
    plain: Weight<'_>,
    packed: Weight<'_>,
    (k, n, t): (i64, i64, i64),
    epilogue: Epilogue,
    seed: u32,
) -> (Vec<f32>, Vec<f32>) {
    let backend = Backend::cpu(2).unwrap();
    let ctx = Context::metadata(16).unwrap();
    let plain_t = ctx.new_tensor(plain.dtype, &plain.ne).unwrap();
    let panels = ctx.new_tensor(packed.dtype, &packed.ne).unwrap();
    let bias = ctx.new_tensor(DType::F32, &[n]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[k, t]).unwrap();
    let scale = ctx.new_tensor(DType::F32, &[n]).unwrap();
    let residual = ctx.new_tensor(DType::F32, &[n, t]).unwrap();
    for input in [&plain_t, &panels, &bias, &x, &scale, &residual] {
        input.mark_input();
    }
    let product = ctx.add(&ctx.mul_mat(&plain_t, &x).unwrap(), &bias).unwrap();
    let (reference, packed_out) = match epilogue {
        Epilogue::Bias => (
            product,
            ctx.linear_panels(kernels, &panels, &x, &bias, false),
        ),
        // ggml's own GELU: the CPU kernel's is tested on its own.
        Epilogue::Gelu => (
            ctx.gelu_erf(&product).unwrap(),
            ctx.linear_panels(kernels, &panels, &x, &bias, true),
        ),
        Epilogue::ScaledResidual => (
            ctx.add(&residual, &ctx.mul(&product, &scale).unwrap())
                .unwrap(),
            ctx.linear_panels_residual(kernels, &panels, &x, &bias, &scale, &residual),
        ),
    };
    let packed_out = packed_out.unwrap();
    let graph = ctx.new_graph(16).unwrap();
    for out in [&reference, &packed_out] {
        out.mark_output();
        graph.expand(out).unwrap();
    }
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    run.write_bytes(&plain_t, plain.bytes).unwrap();
    run.write_bytes(&panels, packed.bytes).unwrap();
    for (i, input) in [&bias, &x, &scale, &residual].into_iter().enumerate() {
        if graph.contains(input) {
            run.write(input, &values(input.nelements() as usize, seed + i as u32))
                .unwrap();
        }
    }
    run.compute(&backend).unwrap();
    (
        run.read::<f32>(&reference).unwrap(),
        run.read::<f32>(&packed_out).unwrap(),
    )
}

/// `x W^T + b`, then GELU or a layer-scaled residual, with a packed weight against
/// ggml's product of the plain one.
#[test]
fn packed_linear_matches_ggml_product() {
    let p = da3::ggml::LINEAR_PANEL as i64;
    let kernels = f32_kernels();
    // Row counts below, at and past the register tile; odd depths; one to three panels.
    for (k, n, t, epilogue) in [
        (7, p, 1, Epilogue::Bias),
        (33, 3 * p, 29, Epilogue::Gelu),
        (130, p, 13, Epilogue::Bias),
        (19, 2 * p, 17, Epilogue::ScaledResidual),
    ] {
        let w = values((k * n) as usize, 1);
        let (packed, shape) = da3::ggml::pack_linear_panels(&w, k as usize, n as usize).unwrap();
        let (a, b) = packed_against_ggml(
            &kernels,
            Weight {
                dtype: DType::F32,
                ne: [k, n, 1],
                bytes: &f32_bytes(&w),
            },
            Weight {
                dtype: DType::F32,
                ne: shape,
                bytes: &f32_bytes(&packed),
            },
            (k, n, t),
            epilogue,
            2,
        );
        let diff = max_abs_difference(&a, &b);
        assert!(diff < 1e-4, "k {k}, n {n}, t {t}, {epilogue:?}: {diff}");
    }
}

/// int8 products of a q8_0 weight against ggml's own q8_0 product (which quantises the
/// input the same way, to 8 bits: asked for, as the AVX2 set defaults to 7): rows below, at
/// and past the register tile and a row block, one to three panels, each epilogue.
#[test]
fn packed_q8_linear_matches_ggml_q8_0_product() {
    let p = da3::ggml::LINEAR_PANEL as i64;
    let request = KernelRequest {
        int8_activation_bits: Some(8),
        ..Default::default()
    };
    let config = KernelConfig::new(&da3::ggml::Cpu::detect(), &request);
    assert_eq!(config.int8_activation_bits(), 8);
    let kernels = CpuKernels {
        int8_products: true,
        ..CpuKernels::f32(config)
    };
    for (k, n, t, epilogue) in [
        (32, p, 1, Epilogue::Bias),
        (96, 3 * p, 7, Epilogue::Gelu),
        (160, p, 29, Epilogue::ScaledResidual),
        (64, 2 * p, 203, Epilogue::Bias),
    ] {
        let w = values((k * n) as usize, 11);
        let q8 = da3::ggml::quantize(DType::Q8_0, &w, k as usize).unwrap();
        let (packed, shape) =
            da3::ggml::pack_linear_panels_q8(&q8, k as usize, n as usize).unwrap();
        let (a, b) = packed_against_ggml(
            &kernels,
            Weight {
                dtype: DType::Q8_0,
                ne: [k, n, 1],
                bytes: &q8,
            },
            Weight {
                dtype: DType::I8,
                ne: shape,
                bytes: &packed,
            },
            (k, n, t),
            epilogue,
            12,
        );
        let largest = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = max_abs_difference(&a, &b);
        assert!(
            largest > 1.0 && diff < 1e-5 * largest,
            "k {k}, n {n}, t {t}, {epilogue:?}: {diff} of {largest}"
        );
    }
}

/// What does not pack for int8 products is refused, naming why; a packed weight is
/// refused with an input of another depth or a record that is not the kernel's.
#[test]
fn q8_packing_refuses_what_does_not_fit() {
    let p = da3::ggml::LINEAR_PANEL;
    let q8 = da3::ggml::quantize(DType::Q8_0, &values(64 * p, 1), 64).unwrap();
    for (bytes, k, n, expected) in [
        (&q8[..], 48, p, "32 outputs of 48 inputs"),
        (&q8[..], 64, p + 1, "33 outputs of 64 inputs"),
        (
            &q8[..q8.len() - 1],
            64,
            p,
            "2175 bytes for a 32 x 64 q8_0 weight",
        ),
        (&q8[..], 0, p, "32 outputs of 0 inputs"),
    ] {
        let err = da3::ggml::pack_linear_panels_q8(bytes, k, n)
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{k} x {n}: {err}");
    }
    let (_, shape) = da3::ggml::pack_linear_panels_q8(&q8, 64, p).unwrap();
    assert_eq!(shape, [da3::ggml::LINEAR_Q8_RECORD as i64, 2, 1]);
    let kernels = CpuKernels {
        int8_products: true,
        ..f32_kernels()
    };
    let ctx = Context::metadata(8).unwrap();
    let panels = ctx.new_tensor(DType::I8, &shape).unwrap();
    let bias = ctx.new_tensor(DType::F32, &[p as i64]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[64, 3]).unwrap();
    assert!(ctx
        .linear_panels(&kernels, &panels, &x, &bias, false)
        .is_ok());
    let shallow = ctx.new_tensor(DType::F32, &[32, 3]).unwrap();
    let err = ctx
        .linear_panels(&kernels, &panels, &shallow, &bias, false)
        .unwrap_err();
    assert!(err.to_string().contains("packed depth"), "{err}");
    let short_record = ctx.new_tensor(DType::I8, &[1024, 2, 1]).unwrap();
    let err = ctx
        .linear_panels(&kernels, &short_record, &x, &bias, false)
        .unwrap_err();
    assert!(err.to_string().contains("panels"), "{err}");
}

/// bf16 products: exact against the same sums over operands rounded to bf16 (f64 on the
/// host).
#[test]
fn packed_bf16_linear_matches_bf16_rounded_sums() {
    let backend = Backend::cpu(2).unwrap();
    let kernels = bf16_kernels();
    let round = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
    for (k, n, t) in [
        (8usize, da3::ggml::LINEAR_PANEL, 5usize),
        (66, 2 * da3::ggml::LINEAR_PANEL, 29),
    ] {
        let (w, x, b) = (values(k * n, 5), values(k * t, 6), values(n, 7));
        let (packed, shape) = da3::ggml::pack_linear_panels_bf16(&w, k, n).unwrap();
        let ctx = Context::metadata(8).unwrap();
        let panels = ctx.new_tensor(DType::I32, &shape).unwrap();
        let bias = ctx.new_tensor(DType::F32, &[n as i64]).unwrap();
        let input = ctx.new_tensor(DType::F32, &[k as i64, t as i64]).unwrap();
        for tensor in [&panels, &bias, &input] {
            tensor.mark_input();
        }
        let y = ctx
            .linear_panels(&kernels, &panels, &input, &bias, false)
            .unwrap();
        y.mark_output();
        let graph = ctx.new_graph(8).unwrap();
        graph.expand(&y).unwrap();
        let mut gallocr = Gallocr::for_backend(&backend).unwrap();
        let run = gallocr.alloc(&graph).unwrap();
        run.write(&panels, &packed).unwrap();
        run.write(&bias, &b).unwrap();
        run.write(&input, &x).unwrap();
        run.compute(&backend).unwrap();
        let got = run.read::<f32>(&y).unwrap();
        for (i, &g) in got.iter().enumerate() {
            let (row, col) = (i / n, i % n);
            let want = b[col] as f64
                + (0..k)
                    .map(|j| round(x[row * k + j]) * round(w[col * k + j]))
                    .sum::<f64>();
            assert!(
                (g as f64 - want).abs() < 1e-4,
                "k {k} ({row}, {col}): {g} vs {want}"
            );
        }
    }
}

#[test]
fn packed_linear_refuses_what_does_not_fit() {
    let p = da3::ggml::LINEAR_PANEL;
    let kernels = f32_kernels();
    assert!(
        da3::ggml::pack_linear_panels(&[0.0; 10], 2, 5).is_err(),
        "5 outputs"
    );
    assert!(
        da3::ggml::pack_linear_panels(&vec![0.0; p], 2, p).is_err(),
        "too few values"
    );
    let (_, shape) = da3::ggml::pack_linear_panels(&vec![0.0; 4 * p], 4, p).unwrap();
    let ctx = Context::metadata(8).unwrap();
    let panels = ctx.new_tensor(DType::F32, &shape).unwrap();
    let bias = ctx.new_tensor(DType::F32, &[p as i64]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
    assert!(ctx
        .linear_panels(&kernels, &panels, &x, &bias, false)
        .is_ok());
    let wrong_depth = ctx.new_tensor(DType::F32, &[5, 3]).unwrap();
    let err = ctx
        .linear_panels(&kernels, &panels, &wrong_depth, &bias, false)
        .unwrap_err();
    assert!(err.to_string().contains("shapes do not fit"), "{err}");
    let plain = ctx.new_tensor(DType::F32, &[4, p as i64]).unwrap();
    let err = ctx
        .linear_panels(&kernels, &plain, &x, &bias, false)
        .unwrap_err();
    assert!(err.to_string().contains("panels"), "{err}");
    // The residual must have the result's shape, the scale one value per output.
    let short_residual = ctx.new_tensor(DType::F32, &[p as i64, 2]).unwrap();
    let err = ctx
        .linear_panels_residual(&kernels, &panels, &x, &bias, &bias, &short_residual)
        .unwrap_err();
    assert!(err.to_string().contains("residual"), "{err}");
    // A bf16 packing of depth 4 holds 2 words per row: x must still have 4 inputs, and
    // odd depths are refused when packing.
    assert!(da3::ggml::pack_linear_panels_bf16(&vec![0.0; 3 * p], 3, p).is_err());
    let (_, bf16_shape) = da3::ggml::pack_linear_panels_bf16(&vec![0.0; 4 * p], 4, p).unwrap();
    assert_eq!(bf16_shape[1], 2);
    let bf16_panels = ctx.new_tensor(DType::I32, &bf16_shape).unwrap();
    assert!(ctx
        .linear_panels(&kernels, &bf16_panels, &x, &bias, false)
        .is_ok());
    for depth in [3, 5] {
        let x = ctx.new_tensor(DType::F32, &[depth, 3]).unwrap();
        let err = ctx
            .linear_panels(&kernels, &bf16_panels, &x, &bias, false)
            .unwrap_err();
        assert!(err.to_string().contains("packed depth"), "{depth}: {err}");
    }
    // An f16 packing: as f32 panels (outputs in whole panels, one row per input).
    assert!(da3::ggml::pack_linear_panels_f16(&vec![0.0; 4 * (p + 1)], 4, p + 1).is_err());
    assert!(da3::ggml::pack_linear_panels_f16(&vec![0.0; 4 * p - 1], 4, p).is_err());
    let (halves, f16_shape) = da3::ggml::pack_linear_panels_f16(&vec![0.0; 4 * p], 4, p).unwrap();
    assert_eq!((halves.len(), f16_shape), (4 * p, [p as i64, 4, 1]));
    let f16_panels = ctx.new_tensor(DType::F16, &f16_shape).unwrap();
    assert!(ctx
        .linear_panels(&kernels, &f16_panels, &x, &bias, false)
        .is_ok());
    let deeper = ctx.new_tensor(DType::F32, &[8, 3]).unwrap();
    let err = ctx
        .linear_panels(&kernels, &f16_panels, &deeper, &bias, false)
        .unwrap_err();
    assert!(err.to_string().contains("packed depth"), "{err}");
}

#[test]
fn layer_norm_matches_ggml() {
    let kernels = f32_kernels();
    let diff = max_difference(
        &[&[100, 7, 3], &[100], &[100]],
        |g, t| g.layer_norm(&t[0], &t[1], &t[2], 1e-5),
        |g, t| {
            assert!(Context::cpu_layer_norm_applies(&t[0], &t[1], &t[2]));
            g.cpu_layer_norm(&kernels, &t[0], &t[1], &t[2], 1e-5)
        },
    );
    assert!(diff < 1e-5, "contiguous rows: {diff}");
    // Per-head rows of a fused projection: 3 heads of 16 values in rows of 64.
    let heads = |g: &Context, t: &[Tensor]| g.view(&t[0], &[16, 3, 5], &[64, t[0].nb()[1]], 64);
    let diff = max_difference(
        &[&[64, 5], &[16], &[16]],
        |g, t| g.layer_norm(&heads(g, t)?, &t[1], &t[2], 1e-6),
        |g, t| {
            let heads = heads(g, t)?;
            assert!(Context::cpu_layer_norm_applies(&heads, &t[1], &t[2]));
            g.cpu_layer_norm(&kernels, &heads, &t[1], &t[2], 1e-6)
        },
    );
    assert!(diff < 1e-5, "strided rows: {diff}");
}

#[test]
fn row_concat_and_transpose_match_ggml() {
    let kernels = f32_kernels();
    let diff = max_difference(
        &[&[5, 7], &[3, 7]],
        |g, t| g.concat(&t[0], &t[1], 0),
        |g, t| {
            assert!(Context::cpu_concat_rows_applies(&t[0], &t[1]));
            g.cpu_concat_rows(&kernels, &t[0], &t[1])
        },
    );
    assert_eq!(diff, 0.0, "concat");
    for ne in [[37i64, 6], [16, 16], [2, 41]] {
        let diff = max_difference(
            &[&ne],
            |g, t| g.cont(&g.transpose(&t[0])?),
            |g, t| {
                let transposed = g.transpose(&t[0])?;
                assert!(Context::cpu_transpose_applies(&transposed), "{ne:?}");
                g.cpu_transpose(&kernels, &transposed)
            },
        );
        assert_eq!(diff, 0.0, "transpose of {ne:?}");
    }
}

#[test]
fn gelu_erf_matches_ggml() {
    let kernels = f32_kernels();
    let diff = max_difference(
        &[&[100, 37]],
        |g, t| g.gelu_erf(&t[0]),
        |g, t| {
            assert!(Context::cpu_gelu_erf_applies(&t[0]));
            g.cpu_gelu_erf(&kernels, &t[0])
        },
    );
    assert!(diff < 2e-6, "{diff}");
}

/// ggml's stride-1 "same" convolution of `t[1]` by `t[0]`, plus the bias `t[2]` where given.
fn ggml_same_conv(g: &Context, t: &[Tensor]) -> Result<Tensor> {
    let kn = t[0].ne();
    let padding = ((kn[0] / 2) as i32, (kn[1] / 2) as i32);
    match t.get(2) {
        Some(b) => g.conv_2d_bias(&t[0], &t[1], b, (1, 1), padding, (1, 1)),
        None => g.conv_2d(&t[0], &t[1], (1, 1), padding, (1, 1)),
    }
}

/// The CPU kernel's stride-1 "same" convolution of the same operands as [`ggml_same_conv`].
fn cpu_same_conv(kernels: &CpuKernels) -> impl Fn(&Context, &[Tensor]) -> Result<Tensor> + '_ {
    move |g: &Context, t: &[Tensor]| {
        let kn = t[0].ne();
        let padding = ((kn[0] / 2) as i32, (kn[1] / 2) as i32);
        assert!(Context::cpu_conv_2d_applies(
            &t[0],
            &t[1],
            (1, 1),
            padding,
            (1, 1)
        ));
        g.cpu_conv_2d_same(kernels, &t[0], &t[1], t.get(2), false)
    }
}

#[test]
fn same_convolutions_match_im2col() {
    let kernels = f32_kernels();
    // Widths below, at and past a block of 48 pixels; channel counts that leave partial
    // groups of 4; 1x1, 3x3 and 5x3 kernels.
    for (w, h, ic, oc, kw, kh) in [
        (5, 4, 3, 1, 3, 3),
        (48, 3, 2, 7, 3, 3),
        (70, 9, 5, 6, 1, 1),
        (33, 6, 4, 9, 5, 3),
    ] {
        let shapes: [&[i64]; 3] = [&[kw, kh, ic, oc], &[w, h, ic, 1], &[oc]];
        let diff = max_difference(&shapes, ggml_same_conv, cpu_same_conv(&kernels));
        assert!(diff < 1e-4, "{w}x{h}x{ic} -> {oc}, {kw}x{kh}: {diff}");
    }
}

/// Maps large enough for Winograd run it shared among threads by bands of tile rows: on
/// any thread count (more threads than tile rows, bands that end inside a tile row at
/// the map's foot, a batch of two images) the result equals ggml's im2col convolution
/// and is the same, value for value, as on one thread. (On an AVX-512 CPU the 128-wide
/// map runs the AVX-512 instance, the 144-wide one the AVX2 instance, whose rows of
/// tiles pad less.) With Winograd turned off, the direct kernel computes the same maps.
#[test]
fn winograd_convolutions_match_im2col_on_any_thread_count() {
    let kernels = f32_kernels();
    assert!(kernels.config.winograd(), "Winograd is on by default");
    let direct = CpuKernels::f32(KernelConfig::new(
        &da3::ggml::Cpu::detect(),
        &KernelRequest {
            winograd: Some(false),
            ..Default::default()
        },
    ));
    assert!(!direct.config.winograd());
    for (w, h, ic, oc, batch) in [(128, 41, 3, 10, 1), (144, 37, 16, 24, 2)] {
        assert!(da3_kernels::winograd_pays(
            &kernels.config,
            w as usize,
            h as usize
        ));
        let shapes: [&[i64]; 3] = [&[3, 3, ic, oc], &[w, h, ic, batch], &[oc]];
        let conv = cpu_same_conv(&kernels);
        let one = Backend::cpu(1).unwrap();
        let (reference, _) = compute(&one, &shapes, ggml_same_conv);
        let (single, name) = compute(&one, &shapes, &conv);
        assert_eq!(name, "conv_2d_winograd", "{w}x{h}");
        let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let what = format!("{w}x{h}x{ic}x{batch} -> {oc}");
        let diff = max_abs_difference(&reference, &single) / largest;
        assert!(diff < 1e-5, "{what}: {diff}");
        for threads in [2, 3, 16] {
            let backend = Backend::cpu(threads).unwrap();
            let (shared, _) = compute(&backend, &shapes, &conv);
            assert!(shared == single, "{what}, {threads} threads");
        }
        // The direct kernel where Winograd is turned off.
        let (direct_out, name) = compute(&one, &shapes, cpu_same_conv(&direct));
        assert_eq!(name, "conv_2d", "{what}, Winograd off");
        let diff = max_abs_difference(&reference, &direct_out) / largest;
        assert!(diff < 1e-5, "{what}, Winograd off: {diff}");
    }
    // Below Winograd's size, the direct kernel.
    let shapes: [&[i64]; 3] = [&[3, 3, 4, 4], &[20, 12, 4, 1], &[4]];
    let (_, name) = compute(&Backend::cpu(2).unwrap(), &shapes, cpu_same_conv(&kernels));
    assert_eq!(name, "conv_2d");
}

/// The direct kernel shared among threads by rows (small kernels) equals ggml's im2col
/// convolution on any thread count, value for value the same as on one thread: 3x3 and
/// 1x1 kernels, the 1x1 reading planes in place (630 pixels) and through the band (1024
/// pixels, planes 4 KB apart), a batch of two, more threads than rows.
#[test]
fn direct_convolutions_by_rows_match_im2col_on_any_thread_count() {
    let (kernels, bf16) = (f32_kernels(), bf16_kernels());
    for (w, h, ic, oc, k, batch) in [
        (20, 12, 4, 6, 3, 1),
        (70, 9, 5, 11, 1, 2),
        (64, 16, 3, 5, 1, 1),
        (33, 5, 9, 2, 1, 1),
    ] {
        let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, batch], &[oc]];
        let conv = cpu_same_conv(&kernels);
        let one = Backend::cpu(1).unwrap();
        let (reference, _) = compute(&one, &shapes, ggml_same_conv);
        let (single, _) = compute(&one, &shapes, &conv);
        let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let what = format!("{w}x{h}x{ic}x{batch} -> {oc}, {k}x{k}");
        let diff = max_abs_difference(&reference, &single) / largest;
        assert!(diff < 1e-5, "{what}: {diff}");
        // With bf16 products too (vector ones, where they pay; f32 elsewhere).
        let conv_bf16 = cpu_same_conv(&bf16);
        let (single_bf16, _) = compute(&one, &shapes, &conv_bf16);
        for threads in [2, 3, 16] {
            let backend = Backend::cpu(threads).unwrap();
            let (shared, _) = compute(&backend, &shapes, &conv);
            assert!(shared == single, "{what}, {threads} threads");
            let (shared, _) = compute(&backend, &shapes, &conv_bf16);
            assert!(shared == single_bf16, "{what}, bf16, {threads} threads");
        }
    }
}

/// A convolution of the input through ReLU, applied as the kernel reads it, equals a
/// ReLU node then the same kernel, value for value: direct 3x3 and 1x1 kernels, Winograd
/// (in both instances' widths on AVX-512, a batch), with and without a bias, with bf16
/// products where they apply; and it is one node, not two.
#[test]
fn convolutions_of_relu_equal_a_relu_node_then_the_convolution() {
    let backend = Backend::cpu(2).unwrap();
    let config = KernelConfig::detect();
    for (w, h, ic, oc, k, batch) in [
        (20, 12, 4, 6, 3, 1),
        (70, 9, 5, 2, 1, 1),
        (128, 41, 3, 10, 3, 1),
        (144, 37, 16, 24, 3, 2),
    ] {
        let all: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, batch], &[oc]];
        for (bf16, with_bias) in [(false, true), (false, false), (true, true)] {
            let kernels = CpuKernels {
                bf16_products: bf16,
                ..CpuKernels::f32(config)
            };
            let shapes = &all[..if with_bias { 3 } else { 2 }];
            let fused = |g: &Context, t: &[Tensor]| {
                let y = g.cpu_conv_2d_same(&kernels, &t[0], &t[1], t.get(2), true)?;
                // One node: the convolution reads the input tensor itself.
                assert!(y.name().starts_with("conv_2d"), "{}", y.name());
                assert!(
                    y.sources().iter().any(|s| s.raw() == t[1].raw()),
                    "the convolution reads a node made from the input"
                );
                Ok(y)
            };
            let unfused = |g: &Context, t: &[Tensor]| {
                let x = g.relu(&t[1])?;
                g.cpu_conv_2d_same(&kernels, &t[0], &x, t.get(2), false)
            };
            let (a, _) = compute(&backend, shapes, fused);
            let (b, _) = compute(&backend, shapes, unfused);
            let what =
                format!("{w}x{h}x{ic}x{batch} -> {oc}, {k}x{k}, bf16 {bf16}, bias {with_bias}");
            assert!(a == b, "{what}");
            // And against ggml's own ops (a ReLU node, then im2col), within f32 rounding.
            let pad = (k / 2) as i32;
            let ggml_unfused = |g: &Context, t: &[Tensor]| {
                g.conv_2d_of_relu(&t[0], &t[1], t.get(2), (1, 1), (pad, pad), (1, 1))
            };
            let (reference, _) = compute(&backend, shapes, ggml_unfused);
            let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let bound = if bf16 && config.vector_bf16() {
                2e-2
            } else {
                1e-5
            };
            let diff = max_abs_difference(&reference, &a) / largest;
            assert!(diff < bound, "{what}: {diff}");
        }
    }
}

/// The transposed convolution of disjoint patches (kernel = stride, 2 and 4) with its
/// bias as one CPU node equals ggml's route (copies, a product, permutes, a bias add):
/// widths past a span (50), partial groups of virtual channels (5 x 2 x 2 = 20), a batch,
/// on 1, 2, 3 and 16 threads; the CPU op declines a stride of 3 (None), which keeps ggml's
/// route.
#[test]
fn disjoint_transposed_convolutions_match_ggml() {
    let kernels = f32_kernels();
    for (w, h, ic, oc, s, batch) in [
        (36, 24, 48, 48, 4, 1),
        (7, 5, 3, 5, 2, 2),
        (50, 3, 2, 3, 4, 1),
        (9, 4, 4, 2, 3, 1),
    ] {
        let shapes: [&[i64]; 3] = [&[s, s, oc, ic], &[w, h, ic, batch], &[oc]];
        let stride = s as i32;
        let ggml_deconv =
            |g: &Context, t: &[Tensor]| g.conv_transpose_2d_bias(&t[0], &t[1], &t[2], stride);
        let ours = |g: &Context, t: &[Tensor]| match g
            .cpu_conv_transpose_2d_bias(&kernels, &t[0], &t[1], &t[2], stride)?
        {
            Some(y) => Ok(y),
            None => ggml_deconv(g, t),
        };
        let one = Backend::cpu(1).unwrap();
        let (reference, _) = compute(&one, &shapes, ggml_deconv);
        let what = format!("{w}x{h}x{ic}x{batch} -> {oc}, stride {s}");
        for threads in [1, 2, 3, 16] {
            let backend = Backend::cpu(threads).unwrap();
            let (ours, name) = compute(&backend, &shapes, ours);
            assert_eq!(name == "conv_transpose", s != 3, "{what}: {name}");
            let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let diff = max_abs_difference(&reference, &ours) / largest;
            assert!(diff < 1e-5, "{what}, {threads} threads: {diff}");
        }
    }
}

/// A batch along `ne[3]` is one node whose kernel takes the items in turn: images of a
/// batch (with and without a bias), and the backbone's per-view attention of a scene
/// (`[D, H, T, S]` permuted to `[D, T, H, S]`: strided rows, items `nb[3]` apart).
#[test]
fn batched_convolutions_and_attention_match_ggml() {
    let kernels = f32_kernels();
    for (w, h, ic, oc, k) in [(50, 7, 3, 5, 3), (9, 4, 2, 3, 1)] {
        let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, 3], &[oc]];
        let diff = max_difference(&shapes, ggml_same_conv, cpu_same_conv(&kernels));
        assert!(diff < 1e-4, "{w}x{h}x{ic}x3 -> {oc}, bias: {diff}");
        let diff = max_difference(&shapes[..2], ggml_same_conv, cpu_same_conv(&kernels));
        assert!(diff < 1e-4, "{w}x{h}x{ic}x3 -> {oc}: {diff}");
    }
    let (d, heads, t, views) = (64, 2, 37, 3);
    let shape = [d, heads, t, views];
    let shapes: [&[i64]; 3] = [&shape; 3];
    let per_head = |g: &Context, x: &[Tensor]| -> Result<Vec<Tensor>> {
        x.iter().map(|a| g.permute(a, [0, 2, 1, 3])).collect()
    };
    let diff = max_difference(
        &shapes,
        |g, x| {
            let h = per_head(g, x)?;
            g.attention(&h[0], &h[1], &h[2], 0.125)
        },
        |g, x| {
            let h = per_head(g, x)?;
            assert!(Context::cpu_attention_applies(&h[0], &h[1], &h[2], 0.125));
            g.cpu_attention(&kernels, &h[0], &h[1], &h[2])
        },
    );
    assert!(diff < 1e-5, "{diff}");
}

#[test]
fn attention_matches_explicit_products() {
    let kernels = f32_kernels();
    // Key counts below, at and past a span of 48 and the f32 kernel's block of 240 keys
    // (one key past a block; three blocks, the last partial, which rescales the running
    // softmax); query counts that leave partial tiles (of 24 and 96) and partial groups;
    // value rows of one vector; shares whose last tile ends in single vectors of queries
    // past a full span (97 and 145 queries over 2 threads: 49 = 48 + 1, 73 = 48 + 25).
    for (d, tq, tk, heads) in [
        (64, 5, 7, 2),
        (64, 30, 48, 3),
        (32, 61, 100, 1),
        (16, 97, 241, 1),
        (64, 100, 500, 2),
        (64, 145, 300, 2),
    ] {
        let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[d, tk, heads]];
        let scale = 1.0 / (d as f32).sqrt();
        let diff = max_difference(
            &shapes,
            |g, t| g.attention(&t[0], &t[1], &t[2], scale),
            |g, t| {
                assert!(Context::cpu_attention_applies(&t[0], &t[1], &t[2], scale));
                g.cpu_attention(&kernels, &t[0], &t[1], &t[2])
            },
        );
        assert!(diff < 1e-5, "D {d}, {tq} x {tk}, {heads} heads: {diff}");
    }
}

/// The largest difference between `op` with the CPU kernels `a` and with `b`.
fn kernels_difference(
    shapes: &[&[i64]],
    op: impl Fn(&Context, &CpuKernels, &[Tensor]) -> Result<Tensor>,
    a: &CpuKernels,
    b: &CpuKernels,
) -> f32 {
    max_difference(shapes, |g, t| op(g, a, t), |g, t| op(g, b, t))
}

/// Within `bound` of f32 where the op multiplies in bf16 on this CPU (`applies`);
/// identical where it does not.
fn assert_bf16_close(diff: f32, bound: f32, applies: bool, what: &str) {
    if applies {
        assert!(diff > 0.0 && diff < bound, "{what}: {diff}");
    } else {
        assert_eq!(diff, 0.0, "{what}");
    }
}

/// Values in [-2, 2): bf16 keeps 8 bits, so each product errs by about 2^-8 of its size.
#[test]
fn bf16_attention_stays_close_to_f32() {
    let (d, tq, tk, heads) = (64, 30, 61, 2);
    let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[d, tk, heads]];
    let diff = kernels_difference(
        &shapes,
        |g, k, t| g.cpu_attention(k, &t[0], &t[1], &t[2]),
        &f32_kernels(),
        &bf16_kernels(),
    );
    // On AMX tiles, or with vector products where those pay.
    let config = KernelConfig::detect();
    let applies = config.vector_bf16() || config.amx_tiles();
    assert_eq!(applies, bf16_kernels().bf16_attention());
    assert_bf16_close(diff, 3e-2, applies, "attention");
}

/// Kernels told to use int8 products compute attention in int8: close to f32 but not
/// equal; heads of 48 values (not whole blocks of 32), in the queries or in the values,
/// stay in f32; and beside bf16 products int8 wins, except on AMX tiles.
#[test]
fn int8_attention_is_chosen_where_it_applies_and_stays_close_to_f32() {
    let int8_difference_of = |d: i64, dv: i64, bf16: bool| {
        let (tq, tk, heads) = (30, 61, 2);
        let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[dv, tk, heads]];
        let without = CpuKernels {
            bf16_products: bf16,
            ..f32_kernels()
        };
        let with = CpuKernels {
            int8_products: true,
            ..without
        };
        kernels_difference(
            &shapes,
            |g, k, t| g.cpu_attention(k, &t[0], &t[1], &t[2]),
            &without,
            &with,
        )
    };
    let int8_difference = |d: i64, bf16: bool| int8_difference_of(d, d, bf16);
    let diff = int8_difference(64, false);
    assert!(diff > 0.0 && diff < 3e-2, "int8 attention: {diff}");
    assert_eq!(int8_difference(48, false), 0.0, "heads of 48");
    assert_eq!(int8_difference_of(64, 48, false), 0.0, "values of 48");
    let beside_bf16 = int8_difference(64, true);
    assert_eq!(
        beside_bf16 == 0.0,
        KernelConfig::detect().amx_tiles(),
        "beside bf16: {beside_bf16}"
    );
}

/// Odd tap counts leave a half-empty last pair; sums of up to 27 products.
#[test]
fn bf16_convolution_stays_close_to_f32() {
    for (w, h, ic, oc, k) in [(50i64, 7i64, 3i64, 5i64, 3i64), (20, 4, 4, 9, 1)] {
        let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, 1], &[oc]];
        let diff = kernels_difference(
            &shapes,
            |g, kernels, t| cpu_same_conv(kernels)(g, t),
            &f32_kernels(),
            &bf16_kernels(),
        );
        let what = format!("{w}x{h}x{ic} -> {oc}, {k}x{k}");
        // Vector products where they pay; these channels fit no AMX tiles.
        assert_bf16_close(diff, 0.1, KernelConfig::detect().vector_bf16(), &what);
    }
}

#[test]
fn bilinear_resize_matches_ggml() {
    let kernels = f32_kernels();
    let mode = Interpolation::Bilinear {
        align_corners: true,
    };
    for (from, to) in [([7, 5], [13, 9]), ([36, 24], [72, 48]), ([9, 1], [4, 3])] {
        let diff = max_difference(
            &[&[from[0], from[1], 3, 1]],
            |g, t| g.interpolate(&t[0], [to[0], to[1], 3, 1], mode),
            |g, t| g.cpu_bilinear_align_corners(&kernels, &t[0], to[0], to[1], None),
        );
        assert!(diff < 1e-6, "{from:?} -> {to:?}: {diff}");
    }
}

/// The fused resize-and-offset kernel against ggml's resampling and two broadcast adds:
/// a resize, a map of the target's own size (the offset alone), and a batch of two items
/// sharing one offset.
#[test]
fn separable_offset_matches_ggml_adds() {
    let kernels = f32_kernels();
    let (c, mode) = (
        4,
        Interpolation::Bilinear {
            align_corners: true,
        },
    );
    for (from, to, n) in [
        ([7, 5], [13, 9], 1),
        ([13, 9], [13, 9], 1),
        ([6, 4], [11, 7], 2),
    ] {
        let shapes: [&[i64]; 3] = [
            &[from[0], from[1], c, n],
            &[to[0], 1, c, 1],
            &[1, to[1], c, 1],
        ];
        let diff = max_difference(
            &shapes,
            |g, t| g.interpolate_add_separable(&t[0], [to[0], to[1], c, n], mode, &t[1], &t[2]),
            |g, t| {
                let offset = Some((&t[1], &t[2]));
                g.cpu_bilinear_align_corners(&kernels, &t[0], to[0], to[1], offset)
            },
        );
        assert!(diff < 1e-6, "{from:?} -> {to:?} x {n}: {diff}");
    }
    let shapes: [&[i64]; 3] = [&[5, 3, c, 1], &[5, 1, c, 1], &[1, 3, c, 1]];
    let diff = max_difference(
        &shapes,
        |g, t| g.add_separable(&t[0], &t[1], &t[2]),
        |g, t| g.cpu_bilinear_align_corners(&kernels, &t[0], 5, 3, Some((&t[1], &t[2]))),
    );
    assert_eq!(diff, 0.0, "an add on both paths");
}

#[test]
fn separable_offset_checks_its_factors() {
    let kernels = f32_kernels();
    let ctx = Context::metadata(8).unwrap();
    let map = ctx.new_tensor(DType::F32, &[5, 3, 4, 1]).unwrap();
    let x = ctx.new_tensor(DType::F32, &[5, 1, 4, 1]).unwrap();
    let wrong_y = ctx.new_tensor(DType::F32, &[1, 4, 4, 1]).unwrap();
    let err = ctx
        .add_separable(&map, &x, &wrong_y)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("interpolate_add_separable") && err.contains("[1, 3, 4, 1]"),
        "{err}"
    );
    let err = ctx
        .cpu_bilinear_align_corners(&kernels, &map, 5, 3, Some((&x, &wrong_y)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("interpolate") && err.contains("f32 [1, 4, 4]"),
        "{err}"
    );
    // The kernel path is one custom node; ggml's, two adds.
    let y = ctx.new_tensor(DType::F32, &[1, 3, 4, 1]).unwrap();
    assert_eq!(
        ctx.cpu_bilinear_align_corners(&kernels, &map, 5, 3, Some((&x, &y)))
            .unwrap()
            .name(),
        "interpolate_add"
    );
    assert_ne!(
        ctx.add_separable(&map, &x, &y).unwrap().name(),
        "interpolate_add"
    );
}

/// A `cpu_*` op given operands its kernel does not take (those its `_applies` check
/// refuses) returns an error naming the op, rather than building a node that would panic
/// (and abort the process) when ggml runs it; the transposed convolution declines with
/// None.
#[test]
fn cpu_ops_refuse_operands_their_kernels_do_not_take() {
    let kernels = f32_kernels();
    let ctx = Context::metadata(64).unwrap();
    let f32_t = |ne: &[i64]| ctx.new_tensor(DType::F32, ne).unwrap();
    let f16_t = |ne: &[i64]| ctx.new_tensor(DType::F16, ne).unwrap();
    let refused = |result: Result<Tensor>, op: &str, what: &str| match result {
        Err(Error::ShapeMismatch {
            op: got, reason, ..
        }) => {
            assert_eq!(got, op, "{what}");
            assert!(reason.contains("CPU kernel takes"), "{what}: {reason}");
        }
        Err(other) => panic!("{what}: another error: {other}"),
        Ok(t) => panic!("{what}: accepted, node {}", t.name()),
    };

    // Attention: f16 heads, keys of another depth, values of rows not whole vectors; and a
    // scale other than 1 / sqrt(D), which `cpu_attention` (always that scale) cannot take.
    let (q, k, v) = (f32_t(&[64, 5, 2]), f32_t(&[64, 7, 2]), f32_t(&[64, 7, 2]));
    assert!(Context::cpu_attention_applies(&q, &k, &v, 0.125));
    assert!(ctx.cpu_attention(&kernels, &q, &k, &v).is_ok());
    assert!(!Context::cpu_attention_applies(&q, &k, &v, 0.5));
    let (q16, k16, v16) = (f16_t(&[64, 5, 2]), f16_t(&[64, 7, 2]), f16_t(&[64, 7, 2]));
    assert!(!Context::cpu_attention_applies(&q16, &k16, &v16, 0.125));
    refused(
        ctx.cpu_attention(&kernels, &q16, &k16, &v16),
        "attention",
        "f16 heads",
    );
    refused(
        ctx.cpu_attention(&kernels, &q, &f32_t(&[32, 7, 2]), &v),
        "attention",
        "keys of 32",
    );
    refused(
        ctx.cpu_attention(&kernels, &q, &k, &f32_t(&[20, 7, 2])),
        "attention",
        "values of 20",
    );
    // int8 products asked for do not change what is refused.
    let int8 = CpuKernels {
        int8_products: true,
        ..kernels
    };
    refused(
        ctx.cpu_attention(&int8, &q16, &k16, &v16),
        "attention",
        "f16 heads, int8",
    );

    // Convolutions: even kernels (no "same" padding), input channels that differ from the
    // kernel's, f16 kernels, a bias of another length.
    let input = f32_t(&[20, 12, 4, 1]);
    let conv = f32_t(&[3, 3, 4, 6]);
    assert!(ctx
        .cpu_conv_2d_same(&kernels, &conv, &input, None, false)
        .is_ok());
    let even = f32_t(&[2, 2, 4, 6]);
    assert!(!Context::cpu_conv_2d_applies(
        &even,
        &input,
        (1, 1),
        (1, 1),
        (1, 1)
    ));
    refused(
        ctx.cpu_conv_2d_same(&kernels, &even, &input, None, false),
        "conv_2d",
        "2x2 kernel",
    );
    assert!(!Context::cpu_conv_2d_applies(
        &conv,
        &input,
        (2, 2),
        (1, 1),
        (1, 1)
    ));
    assert!(!Context::cpu_conv_2d_applies(
        &conv,
        &input,
        (1, 1),
        (0, 0),
        (1, 1)
    ));
    refused(
        ctx.cpu_conv_2d_same(&kernels, &f32_t(&[3, 3, 5, 6]), &input, None, true),
        "conv_2d",
        "5 input channels against 4",
    );
    refused(
        ctx.cpu_conv_2d_same(&kernels, &f16_t(&[3, 3, 4, 6]), &input, None, false),
        "conv_2d",
        "f16 kernel",
    );
    refused(
        ctx.cpu_conv_2d_same(&kernels, &conv, &input, Some(&f32_t(&[5])), false),
        "conv_2d",
        "a bias of 5 for 6 channels",
    );

    // LayerNorm: a weight of another length, f16 rows.
    let rows = f32_t(&[16, 3]);
    let (w16, b16) = (f32_t(&[16]), f32_t(&[16]));
    refused(
        ctx.cpu_layer_norm(&kernels, &rows, &f32_t(&[8]), &b16, 1e-5),
        "layer_norm",
        "a weight of 8",
    );
    refused(
        ctx.cpu_layer_norm(&kernels, &f16_t(&[16, 3]), &w16, &b16, 1e-5),
        "layer_norm",
        "f16 rows",
    );

    // GELU of a strided view; a copy of a matrix that is not transposed; rows of other
    // counts joined; resampling to an empty size or with offsets of the wrong shape.
    let m = f32_t(&[6, 4]);
    let transposed = ctx.transpose(&m).unwrap();
    refused(
        ctx.cpu_gelu_erf(&kernels, &transposed),
        "gelu_erf",
        "transposed",
    );
    refused(
        ctx.cpu_gelu_erf(&kernels, &f16_t(&[6, 4])),
        "gelu_erf",
        "f16",
    );
    refused(ctx.cpu_transpose(&kernels, &m), "cont", "not transposed");
    refused(
        ctx.cpu_concat_rows(&kernels, &m, &f32_t(&[6, 5])),
        "concat",
        "4 rows and 5",
    );
    refused(
        ctx.cpu_concat_rows(&kernels, &f32_t(&[6, 4, 2]), &f32_t(&[6, 4, 2])),
        "concat",
        "not matrices",
    );
    let map = f32_t(&[5, 3, 4, 1]);
    refused(
        ctx.cpu_bilinear_align_corners(&kernels, &map, 0, 3, None),
        "interpolate",
        "width 0",
    );
    refused(
        ctx.cpu_bilinear_align_corners(&kernels, &transposed, 5, 3, None),
        "interpolate",
        "strided input",
    );

    // The transposed convolution declines what its kernels do not take.
    let patches = f32_t(&[2, 2, 3, 4]);
    let deconv_input = f32_t(&[7, 5, 4, 1]);
    let bias = f32_t(&[3]);
    let declined = |kernel: &Tensor, input: &Tensor, bias: &Tensor, stride: i32| {
        ctx.cpu_conv_transpose_2d_bias(&kernels, kernel, input, bias, stride)
            .unwrap()
            .is_none()
    };
    assert!(!declined(&patches, &deconv_input, &bias, 2));
    assert!(
        declined(&patches, &deconv_input, &bias, 4),
        "kernel 2, stride 4"
    );
    assert!(declined(&patches, &deconv_input, &bias, 3), "stride 3");
    assert!(
        declined(&patches, &f32_t(&[7, 5, 5, 1]), &bias, 2),
        "5 input channels against 4"
    );
    assert!(
        declined(&patches, &deconv_input, &f32_t(&[4]), 2),
        "bias of 4"
    );
}
