//! The fuzz targets' bodies, shared with the ordinary test suite (`tests/fuzz_regressions.rs`
//! includes this file), so that every input a fuzzer found is replayed by `cargo test`.
//! Each function must return (never panic, abort or crash) on any input.

use da3::ggml::{
    Backend, Context, CpuKernels, DType, Gallocr, Interpolation, KernelConfig, Pool, RopeMode,
    Tensor, TensorView,
};
use da3::gguf::GgufFile;
use da3::{preprocess, Config, Device, LoadOptions, Model};

/// A GGUF file from bytes, every tensor's data, then the DA3 config, the loader and, when the
/// model loads, its graph at the smallest resolution.
pub fn gguf_model(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for info in file.tensors() {
        let _ = file.tensor_data(info);
    }
    let _ = file.metadata().count();
    let Ok(config) = Config::from_gguf(&file) else {
        return;
    };
    let _ = config.validate();
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 1,
        ..LoadOptions::default()
    };
    if let Ok(mut session) = Model::from_gguf(&file, &options).and_then(|m| m.session()) {
        let _ = session.graph(14, 14);
    }
}

/// Image decoding (PNG or JPEG, sniffed) and the official preprocessing at a resolution taken
/// from the first byte.
pub fn image_preprocess(data: &[u8]) {
    let Some((&res, bytes)) = data.split_first() else {
        return;
    };
    let Ok(img) = preprocess::decode_image(bytes) else {
        return;
    };
    // Keep each run short: the decoder allows large images, the preprocessing is linear.
    if img.width.saturating_mul(img.height) > 1 << 22 {
        return;
    }
    let _ = preprocess::preprocess(&img, res as usize * 4);
}

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn small(&mut self, n: u8) -> i64 {
        (self.u8() % n) as i64
    }
    fn dim(&mut self) -> i64 {
        1 + self.small(6)
    }
    fn f32(&mut self) -> f32 {
        (self.u8() as i8) as f32 / 16.0
    }
}

const DTYPES: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::I32];

/// Builds a graph of fuzzed shapes and ops through the safe layer, then allocates and computes
/// it on the CPU (with the crate's CPU kernels' nodes, `Context::cpu_*`, where the first
/// byte asks for them, or ggml's ops), inputs filled from the bytes.
pub fn graph_ops(data: &[u8]) {
    let mut r = Bytes(data);
    let Ok(ctx) = Context::metadata(512) else {
        return;
    };
    let kernels = (r.u8() & 1 == 1).then(|| CpuKernels::f32(KernelConfig::detect()));
    let mut pool: Vec<Tensor> = Vec::new();
    for _ in 0..1 + r.small(4) {
        let dtype = DTYPES[r.small(4) as usize];
        let ne: Vec<i64> = (0..1 + r.small(4)).map(|_| r.dim()).collect();
        if let Ok(t) = ctx.new_tensor(dtype, &ne) {
            t.mark_input();
            pool.push(t);
        }
    }
    if pool.is_empty() {
        return;
    }
    let n_leafs = pool.len();
    for _ in 0..r.small(16) {
        let pick = |r: &mut Bytes, pool: &[Tensor]| pool[r.u8() as usize % pool.len()].clone();
        let (a, b) = (pick(&mut r, &pool), pick(&mut r, &pool));
        let c = pick(&mut r, &pool);
        let ne4 = |r: &mut Bytes| [r.dim(), r.dim(), r.dim(), r.dim()];
        let result = match r.u8() % 36 {
            0 => ctx.mul_mat(&a, &b),
            1 => ctx.add(&a, &b),
            2 => ctx.sub(&a, &b),
            3 => ctx.mul(&a, &b),
            4 => ctx.div(&a, &b),
            5 => ctx.scale(&a, r.f32()),
            6 => ctx.scale_bias(&a, r.f32(), r.f32()),
            7 => ctx.gelu(&a),
            8 => match &kernels {
                Some(k) => ctx.cpu_gelu_erf(k, &a),
                None => ctx.gelu_erf(&a),
            },
            9 => ctx.silu(&a),
            10 => ctx.relu(&a),
            11 => ctx.exp(&a),
            12 => ctx.tanh(&a),
            13 => ctx.sigmoid(&a),
            14 => ctx.norm(&a, 1e-5),
            15 => ctx.rms_norm(&a, 1e-5),
            16 => ctx.soft_max(&a),
            17 => ctx.soft_max_ext(&a, Some(&b), r.f32(), 0.0),
            18 => ctx.cast(&a, DTYPES[r.small(4) as usize]),
            19 => {
                let ne: Vec<i64> = (0..1 + r.small(4)).map(|_| r.dim()).collect();
                ctx.reshape(&a, &ne)
            }
            20 => {
                let ne: Vec<i64> = (0..1 + r.small(4)).map(|_| r.dim()).collect();
                let nb: Vec<usize> = ne[1..].iter().map(|_| 4 * r.small(16) as usize).collect();
                ctx.view(&a, &ne, &nb, 4 * r.small(8) as usize)
            }
            21 => {
                let mut axes = [0, 1, 2, 3];
                for i in 0..4 {
                    axes.swap(i, r.small(4) as usize);
                }
                ctx.permute(&a, axes)
            }
            22 => ctx.transpose(&a),
            23 => match &kernels {
                Some(k) => ctx.cpu_transpose(k, &a),
                None => ctx.cont(&a),
            },
            24 => match &kernels {
                Some(k) => ctx.cpu_concat_rows(k, &a, &b),
                None => ctx.concat(&a, &b, r.small(4) as usize),
            },
            25 => ctx.get_rows(&a, &b),
            26 => ctx.pad(&a, [0, 1, 2, 3].map(|_| r.small(3) as i32)),
            27 => match &kernels {
                Some(k) => ctx.cpu_conv_2d_same(k, &a, &b, Some(&c), r.u8() & 1 == 1),
                None => ctx.conv_2d(
                    &a,
                    &b,
                    (1 + r.small(2) as i32, 1 + r.small(2) as i32),
                    (r.small(2) as i32, r.small(2) as i32),
                    (1, 1),
                ),
            },
            28 => ctx.pool_2d(
                &a,
                if r.u8() & 1 == 0 {
                    Pool::Max
                } else {
                    Pool::Avg
                },
                (r.dim() as i32, r.dim() as i32),
                (r.dim() as i32, r.dim() as i32),
                (0.0, 0.0),
            ),
            29 => {
                let mode = match r.small(3) {
                    0 => Interpolation::Nearest,
                    1 => Interpolation::Bilinear {
                        align_corners: r.u8() & 1 == 1,
                    },
                    _ => Interpolation::Bicubic {
                        align_corners: r.u8() & 1 == 1,
                    },
                };
                match &kernels {
                    Some(k) => ctx.cpu_bilinear_align_corners(k, &a, r.dim(), r.dim(), None),
                    None => ctx.interpolate(&a, ne4(&mut r), mode),
                }
            }
            30 => ctx.rope(
                &a,
                &b,
                2 * (1 + r.small(3) as usize),
                if r.u8() & 1 == 0 {
                    RopeMode::Normal
                } else {
                    RopeMode::Neox
                },
                10000.0,
            ),
            31 => match &kernels {
                Some(k) => ctx.cpu_layer_norm(k, &a, &b, &c, 1e-5),
                None => ctx.layer_norm(&a, &b, &c, 1e-5),
            },
            32 => ctx.flash_attn_ext(&a, &b, &c, None, 0.5),
            33 => match &kernels {
                Some(k) => ctx.cpu_attention(k, &a, &b, &c),
                None => ctx.attention(&a, &b, &c, 0.5),
            },
            34 => match &kernels {
                Some(k) => ctx
                    .cpu_conv_transpose_2d_bias(k, &a, &b, &c, 2 * (1 + r.small(2) as i32))
                    .map(|node| node.unwrap_or(a.clone())),
                None => ctx.conv_transpose_2d(&a, &b, 1 + r.small(3) as i32),
            },
            _ => ctx.im2col(&a, &b, (1, 1), (0, 0), (1, 1), DTYPES[r.small(3) as usize]),
        };
        if let Ok(t) = result {
            pool.push(t);
        }
    }
    if pool.len() == n_leafs {
        return;
    }
    let Ok(graph) = ctx.new_graph(Context::GRAPH_SIZE) else {
        return;
    };
    for t in &pool[n_leafs..] {
        t.mark_output();
        if graph.expand(t).is_err() {
            return;
        }
    }
    let Ok(backend) = Backend::cpu(1) else { return };
    let Ok(mut gallocr) = Gallocr::for_backend(&backend) else {
        return;
    };
    let Ok(run) = gallocr.alloc(&graph) else {
        return;
    };
    for leaf in &pool[..n_leafs] {
        let n = leaf.nelements() as usize;
        // Indices stay 0 (ggml asserts row indices are in range at compute time; only data
        // decides that).
        let _ = match leaf.dtype() {
            DType::F32 => run.write(leaf, &(0..n).map(|_| r.f32()).collect::<Vec<_>>()),
            DType::F16 => run.write(
                leaf,
                &(0..n)
                    .map(|_| half::f16::from_f32(r.f32()))
                    .collect::<Vec<_>>(),
            ),
            DType::BF16 => run.write(
                leaf,
                &(0..n)
                    .map(|_| half::bf16::from_f32(r.f32()))
                    .collect::<Vec<_>>(),
            ),
            _ => run.write(leaf, &vec![0i32; n]),
        };
    }
    let _ = run.compute(&backend);
}
