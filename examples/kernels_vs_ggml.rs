//! Our CPU kernels as ggml nodes against ggml's own ops, on DA3-small's shapes, both run by
//! ggml's CPU backend on `threads` threads: the matrix products of a block, ggml's `mul_mat`
//! against the packed-panel kernel (`Context::linear_panels`) in f32, for q8_0 weights (int8
//! products) and with bf16 panels; the head's 3x3 convolutions, ggml's im2col `conv_2d_bias`
//! against `Context::cpu_conv_2d_same` in f32 (Winograd's F(4x4, 3x3) on maps of 256 tiles or
//! more, the direct kernel below that or with `--winograd=off`) and with bf16 products; a
//! block's LayerNorms, ggml's norm, mul and add against `Context::cpu_layer_norm`; and
//! attention of one view's queries against the keys of 1 to 8 views (DA3-base's heads, the
//! global blocks of a scene), ggml's `flash_attn_ext` against `Context::cpu_attention` in
//! f32, bf16 and int8:
//!
//! ```text
//! cargo run --release --example kernels_vs_ggml -- [threads] \
//!     [products|convolutions|norms|attention] [--cold] [--kernels=avx512bf16|avx2vnni|avx2|portable] \
//!     [--winograd=on|off] [--amx=on|off] [--bf16-products=on|off] [--int8-activation-bits=7|8]
//! ```
//!
//! The flags (the keys of `da3 --plan` that concern the kernels) make the [`KernelRequest`] of
//! the kernels' [`KernelConfig`]; without them, this CPU's defaults.
//! Medians of 20 computes (5 for attention); with `--cold`, a 1 GiB buffer is written before
//! each compute, so that weights and inputs come from memory, as a model's weights do when
//! each is read once per image. Our kernels alone, without ggml:
//! `cargo run --release -p da3-kernels --example kernel_speed`.
use da3::ggml::{
    pack_linear_panels, pack_linear_panels_bf16, pack_linear_panels_q8, quantize, Allocation,
    Backend, BufferUsage, Context, Cpu, CpuKernels, DType, Gallocr, KernelConfig, KernelRequest,
    TensorView,
};
use std::error::Error;
use std::time::Instant;

/// The largest absolute difference between two results of the same shape (infinite where
/// either has a NaN, which `f32::max` would skip).
fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0.0, f32::max)
}

/// The median time of 20 computes of `run`. Each graph marks its inputs as outputs too: the
/// inputs are written once and computed on many times, and ggml's allocator would otherwise
/// hand an input's memory to a later node once its last reader has run (ggml's im2col
/// convolution wrote its product over its input that way).
fn median_ms(run: &Allocation<'_>, backend: &Backend) -> Result<f64, Box<dyn Error>> {
    median_ms_of(run, backend, 20)
}

fn median_ms_of(
    run: &Allocation<'_>,
    backend: &Backend,
    computes: usize,
) -> Result<f64, Box<dyn Error>> {
    run.compute(backend)?;
    let mut times = Vec::new();
    let mut evict = cold_caches().then(|| vec![0u64; 1 << 27]);
    for _ in 0..computes {
        if let Some(evict) = &mut evict {
            for (i, word) in evict.iter_mut().enumerate().step_by(8) {
                *word = word.wrapping_add(i as u64);
            }
            std::hint::black_box(&evict);
        }
        let t = Instant::now();
        run.compute(backend)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `--cold` among the arguments: every timed compute starts with cold caches.
fn cold_caches() -> bool {
    std::env::args().any(|a| a == "--cold")
}

/// The kernels' request: the `--key=value` flags among `args` (the keys of `da3 --plan` that
/// concern the kernels: kernels, winograd, amx, bf16-products, int8-activation-bits).
fn request(args: &[String]) -> Result<KernelRequest, String> {
    let mut request = KernelRequest::default();
    for flag in args.iter().filter_map(|a| a.strip_prefix("--")) {
        if flag == "cold" {
            continue;
        }
        let (key, value) = flag
            .split_once('=')
            .ok_or_else(|| format!("--{flag}: expected --key=value or --cold"))?;
        request.set(key, value)?;
    }
    Ok(request)
}

fn main() -> Result<(), Box<dyn Error>> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let config = KernelConfig::new(&Cpu::detect(), &request(&all)?);
    let args: Vec<&String> = all.iter().filter(|a| !a.starts_with("--")).collect();
    let threads: usize = args.first().map_or(Ok(2), |t| t.parse())?;
    let section = args.get(1).map(|s| s.as_str());
    if let Some(s) = section {
        if !["products", "convolutions", "norms", "attention"].contains(&s) {
            return Err(
                format!("unknown section {s}: products, convolutions, norms or attention").into(),
            );
        }
    }
    println!(
        "kernels {}: AMX tiles {}, vector bf16 {}, Winograd {}, int8 activations {} bits; ggml's CPU backend on {threads} threads{}",
        config.set(),
        config.amx_tiles(),
        config.vector_bf16(),
        config.winograd(),
        config.int8_activation_bits(),
        if cold_caches() { ", cold caches" } else { "" }
    );
    let cpu = Backend::cpu(threads)?;
    let wanted = |name: &str| section.is_none_or(|s| s == name);
    if wanted("products") {
        products(&cpu, &config)?;
    }
    if wanted("convolutions") {
        convolutions(&cpu, &config)?;
    }
    if wanted("norms") {
        layer_norms(&cpu, &config)?;
    }
    if wanted("attention") {
        attention(&cpu, &config)?;
    }
    Ok(())
}

/// One view of DA3-base (865 tokens, 12 heads of 64) attending over the keys of `views`
/// views: the fused kernel against ggml's `flash_attn_ext`.
fn attention(cpu: &Backend, config: &KernelConfig) -> Result<(), Box<dyn Error>> {
    const D: i64 = 64;
    const HEADS: i64 = 12;
    const TQ: i64 = 865;
    for views in [1i64, 2, 4, 8] {
        let tk = TQ * views;
        let mut results = Vec::new();
        // The fused kernel in f32, ggml's, then the fused kernel in bf16 (on AMX tiles, or
        // vector products where they pay; f32 where neither) and in int8.
        for (fused, bf16, int8) in [
            (true, false, false),
            (false, false, false),
            (true, true, false),
            (true, false, true),
        ] {
            let kernels = CpuKernels {
                config: *config,
                bf16_products: bf16,
                int8_products: int8,
            };
            let ctx = Context::metadata(8)?;
            let q = ctx.new_tensor(DType::F32, &[D, TQ, HEADS])?;
            let k = ctx.new_tensor(DType::F32, &[D, tk, HEADS])?;
            let v = ctx.new_tensor(DType::F32, &[D, tk, HEADS])?;
            for t in [&q, &k, &v] {
                t.mark_input().mark_output();
            }
            let scale = 1.0 / (D as f32).sqrt();
            let y = if fused {
                ctx.cpu_attention(&kernels, &q, &k, &v)?
            } else {
                ctx.flash_attn_ext(&q, &k, &v, None, scale)?
            };
            y.mark_output();
            let g = ctx.new_graph(8)?;
            g.expand(&y)?;
            let mut ga = Gallocr::for_backend(cpu)?;
            let run = ga.alloc(&g)?;
            for (salt, t) in [&q, &k, &v].into_iter().enumerate() {
                let n = t.nelements() as usize;
                let values: Vec<f32> = (0..n)
                    .map(|i| ((i * 7 + salt * 3) % 61) as f32 * 0.05 - 1.5)
                    .collect();
                run.write(t, &values)?;
            }
            let ms = median_ms_of(&run, cpu, 5)?;
            results.push(run.read::<f32>(&y)?);
            let flop = 4.0 * (TQ * tk * D * HEADS) as f64;
            println!(
                "attention [64 x 865 x 12] over {tk:5} keys ({views} views): {:<15} {ms:8.2} ms {:6.1} GFLOP/s",
                match (fused, bf16, int8) {
                    (false, _, _) => "flash_attn_ext",
                    (true, true, _) if kernels.bf16_attention() => "fused bf16",
                    (true, true, _) => "fused (bf16: f32)",
                    (true, false, true) if kernels.int8_attention() => "fused int8",
                    (true, false, true) => "fused (int8: f32)",
                    (true, false, false) => "fused kernel",
                },
                flop / ms / 1e6
            );
        }
        println!(
            "  max difference {:.2e}, bf16 against f32 {:.2e}, int8 against f32 {:.2e}",
            max_difference(&results[0], &results[1]),
            max_difference(&results[0], &results[2]),
            max_difference(&results[0], &results[3])
        );
    }
    Ok(())
}

/// A block's LayerNorm, [384, 865], and the per-head norms of its QKV output (strided rows),
/// as ggml's norm, mul and add against the fused kernel.
fn layer_norms(cpu: &Backend, config: &KernelConfig) -> Result<(), Box<dyn Error>> {
    let kernels = CpuKernels::f32(*config);
    for fused in [false, true] {
        let ctx = Context::metadata(16)?;
        let x = ctx.new_tensor(DType::F32, &[384, 865])?;
        let qkv = ctx.new_tensor(DType::F32, &[1152, 865])?;
        let w = ctx.new_tensor(DType::F32, &[384])?;
        let b = ctx.new_tensor(DType::F32, &[384])?;
        let hw = ctx.new_tensor(DType::F32, &[64])?;
        let hb = ctx.new_tensor(DType::F32, &[64])?;
        for t in [&x, &qkv, &w, &b, &hw, &hb] {
            t.mark_input().mark_output();
        }
        let heads = ctx.view(&qkv, &[64, 6, 865], &[256, qkv.nb()[1]], 0)?;
        let (y, yh) = if fused {
            (
                ctx.cpu_layer_norm(&kernels, &x, &w, &b, 1e-6)?,
                ctx.cpu_layer_norm(&kernels, &heads, &hw, &hb, 1e-6)?,
            )
        } else {
            (
                ctx.layer_norm(&x, &w, &b, 1e-6)?,
                ctx.layer_norm(&heads, &hw, &hb, 1e-6)?,
            )
        };
        let g = ctx.new_graph(16)?;
        for out in [&y, &yh] {
            out.mark_output();
            g.expand(out)?;
        }
        let mut ga = Gallocr::for_backend(cpu)?;
        let run = ga.alloc(&g)?;
        for t in [&x, &qkv, &w, &b, &hw, &hb] {
            let n = t.nelements() as usize;
            run.write(
                t,
                &(0..n).map(|i| (i % 13) as f32 * 0.1).collect::<Vec<_>>(),
            )?;
        }
        let ms = median_ms(&run, cpu)?;
        let label = if fused {
            "fused kernel"
        } else {
            "ggml norm, mul, add"
        };
        println!("layer norms [384 x 865] and [64 x 6 x 865]: {label:<20} {ms:6.3} ms");
    }
    Ok(())
}

/// The block linears of DA3-small (and DA3-base's MLP), five ways: ggml's f32 `mul_mat` and
/// the packed f32 kernel, ggml's q8_0 `mul_mat` and the int8 kernel on the same q8_0 weight,
/// and the kernel on bf16 panels.
fn products(cpu: &Backend, config: &KernelConfig) -> Result<(), Box<dyn Error>> {
    let kernels = CpuKernels::f32(*config);
    for (k, n, t) in [
        (384usize, 1536usize, 865usize),
        (1536, 384, 865),
        (384, 1152, 865),
        (768, 3072, 865),
        (3072, 768, 865),
    ] {
        let weight: Vec<f32> = (0..k * n)
            .map(|i| ((i % 97) as f32 - 48.0) * 1e-3)
            .collect();
        let (packed, panel_shape) = pack_linear_panels(&weight, k, n)?;
        let q8 = quantize(DType::Q8_0, &weight, k)?;
        let (packed_q8, q8_shape) = pack_linear_panels_q8(&q8, k, n)?;
        let (packed_bf16, bf16_shape) = pack_linear_panels_bf16(&weight, k, n)?;
        let w = Context::metadata(6)?;
        let a = w.new_tensor(DType::F32, &[k as i64, n as i64])?;
        let p = w.new_tensor(DType::F32, &panel_shape)?;
        let a_q8 = w.new_tensor(DType::Q8_0, &[k as i64, n as i64])?;
        let p_q8 = w.new_tensor(DType::I8, &q8_shape)?;
        let p_bf16 = w.new_tensor(DType::I32, &bf16_shape)?;
        let bias = w.new_tensor(DType::F32, &[n as i64])?;
        w.allocate_on(cpu, BufferUsage::Weights)?;
        w.write(&a, &weight)?;
        w.write(&p, &packed)?;
        w.write_bytes(&a_q8, &q8)?;
        w.write_bytes(&p_q8, &packed_q8)?;
        w.write(&p_bf16, &packed_bf16)?;
        w.write(&bias, &vec![0.25f32; n])?;
        let mut results = Vec::new();
        // bf16 panels run on AMX tiles where the CPU has them, else on vectors (whether or
        // not vector bf16 products pay on this CPU).
        let bf16_name = if config.amx_tiles() {
            "bf16 AMX"
        } else {
            "bf16 panels"
        };
        for (name, weight, panels) in [
            ("ggml mul_mat", &a, false),
            ("linear_panels", &p, true),
            ("ggml q8_0", &a_q8, false),
            ("int8 panels", &p_q8, true),
            (bf16_name, &p_bf16, true),
        ] {
            let ctx = Context::metadata(8)?;
            let x = ctx.new_tensor(DType::F32, &[k as i64, t as i64])?;
            x.mark_input().mark_output();
            let y = if panels {
                ctx.linear_panels(&kernels, weight, &x, &bias, false)?
            } else {
                ctx.add(&ctx.mul_mat(weight, &x)?, &bias)?
            };
            y.mark_output();
            let g = ctx.new_graph(8)?;
            g.expand(&y)?;
            let mut ga = Gallocr::for_backend(cpu)?;
            let run = ga.alloc(&g)?;
            let input: Vec<f32> = (0..k * t)
                .map(|i| ((i % 89) as f32 - 44.0) * 1e-2)
                .collect();
            run.write(&x, &input)?;
            let ms = median_ms(&run, cpu)?;
            results.push(run.read::<f32>(&y)?);
            println!(
                "[{n} x {k}] x [{k} x {t}] {name:<13} {ms:7.2} ms {:6.1} GFLOP/s",
                2.0 * (k * n * t) as f64 / ms / 1e6
            );
        }
        println!(
            "  max difference: f32 {:.2e}, q8_0 {:.2e}, q8_0 against f32 {:.2e}, bf16 against f32 {:.2e}",
            max_difference(&results[0], &results[1]),
            max_difference(&results[2], &results[3]),
            max_difference(&results[0], &results[3]),
            max_difference(&results[0], &results[4])
        );
    }
    Ok(())
}

/// The heads' 3x3 convolutions ("same" padding, plus a bias): ggml's im2col route against
/// our kernel in f32 and with bf16 products.
fn convolutions(cpu: &Backend, config: &KernelConfig) -> Result<(), Box<dyn Error>> {
    // The small maps of DA3-base's head (stages 4 and 3 at 504x336: layer_rn, fusion), then
    // DA3-small's head, then DA3-base's (the largest of each level).
    for (w, h, ic, oc) in [
        (18i64, 12i64, 768i64, 128i64),
        (18, 12, 128, 128),
        (36, 24, 384, 128),
        (36, 24, 128, 128),
        (72, 48, 128, 128),
        (144, 96, 64, 64),
        (288, 192, 64, 32),
        (504, 336, 32, 32),
        (144, 96, 128, 128),
        (288, 192, 128, 64),
        (504, 336, 64, 32),
    ] {
        // ggml's im2col and product, our kernel in f32, then with bf16 products (on AMX
        // tiles where the channels fit them, or vector ones where those pay; f32 again where
        // neither).
        let mut results = Vec::new();
        for route in [
            Conv::Ggml,
            Conv::Kernel { bf16: false },
            Conv::Kernel { bf16: true },
        ] {
            results.push(convolution(cpu, config, [w, h, ic, oc], route)?);
        }
        println!(
            "  max difference against ggml: f32 {:.2e}, bf16 {:.2e}",
            max_difference(&results[0], &results[1]),
            max_difference(&results[0], &results[2])
        );
    }
    Ok(())
}

/// Who computes a convolution of [`convolutions`].
#[derive(Clone, Copy)]
enum Conv {
    /// ggml's `conv_2d_bias` (im2col, then `mul_mat`, then the bias).
    Ggml,
    /// `Context::cpu_conv_2d_same`, with bf16 products asked for or not.
    Kernel { bf16: bool },
}

/// One 3x3 convolution of [`convolutions`]: prints its time and returns its result.
fn convolution(
    cpu: &Backend,
    config: &KernelConfig,
    [w, h, ic, oc]: [i64; 4],
    route: Conv,
) -> Result<Vec<f32>, Box<dyn Error>> {
    let ctx = Context::metadata(16)?;
    let kernel = ctx.new_tensor(DType::F32, &[3, 3, ic, oc])?;
    let input = ctx.new_tensor(DType::F32, &[w, h, ic, 1])?;
    let bias = ctx.new_tensor(DType::F32, &[oc])?;
    for t in [&kernel, &input, &bias] {
        t.mark_input().mark_output();
    }
    let (y, label) = match route {
        Conv::Ggml => (
            ctx.conv_2d_bias(&kernel, &input, &bias, (1, 1), (1, 1), (1, 1))?,
            "ggml im2col".to_string(),
        ),
        Conv::Kernel { bf16 } => {
            let kernels = CpuKernels {
                config: *config,
                bf16_products: bf16,
                int8_products: false,
            };
            let y = ctx.cpu_conv_2d_same(&kernels, &kernel, &input, Some(&bias), false)?;
            // The node's name tells Winograd ("conv_2d_winograd", always f32) from the direct
            // kernel, which multiplies in bf16 where `CpuKernels::bf16_convolutions` says.
            let tiles = config.amx_tiles()
                && da3_kernels::amx_convolution_fits([3, 3, ic as usize, oc as usize]);
            let label = if y.name() == "conv_2d_winograd" {
                "Winograd f32"
            } else if !kernels.bf16_convolutions(tiles) {
                "direct f32"
            } else if tiles {
                "bf16 AMX"
            } else {
                "direct bf16"
            };
            (y, label.to_string())
        }
    };
    y.mark_output();
    let g = ctx.new_graph(16)?;
    g.expand(&y)?;
    let mut ga = Gallocr::for_backend(cpu)?;
    let run = ga.alloc(&g)?;
    for t in [&kernel, &input, &bias] {
        let n = t.nelements() as usize;
        run.write(
            t,
            &(0..n)
                .map(|i| ((i % 31) as f32 - 15.0) * 1e-2)
                .collect::<Vec<_>>(),
        )?;
    }
    let ms = median_ms(&run, cpu)?;
    let flop = 2.0 * (w * h * ic * oc * 9) as f64;
    println!(
        "{w}x{h} {ic}->{oc} 3x3 {label:<21} {ms:7.2} ms {:6.1} GFLOP/s",
        flop / ms / 1e6
    );
    Ok(run.read::<f32>(&y)?)
}
