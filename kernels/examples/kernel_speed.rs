//! Our CPU kernels alone, without ggml, on DA3's shapes: the entry points of this crate
//! called directly, each compute split among `threads` threads as ggml's CPU backend splits a
//! custom node (contiguous ranges of units per thread: rows, planes, or bands of rows).
//!
//! - `products`: DA3-small's and DA3-base's block linears (865 tokens) with f32, f16, bf16
//!   and q8_0 (int8 products) panels;
//! - `convolutions`: the 3x3 convolutions of the DPT heads, by the route the model takes in
//!   f32 (Winograd where it pays, else the direct kernel; the direct one too where Winograd
//!   is taken) and with bf16 products;
//! - `norms`: a block's LayerNorm [384 x 865] and the per-head norms of its QKV output
//!   ([64 x 6 x 865], strided rows);
//! - `attention`: one view's queries (865 tokens, 12 heads of 64) against the keys of 1 to 8
//!   views, in f32, bf16 and int8.
//!
//! ```text
//! cargo run --release -p da3-kernels --example kernel_speed -- [threads] \
//!     [products|convolutions|norms|attention] [--cold] [--kernels=avx512bf16|avx2vnni|avx2|portable] \
//!     [--winograd=on|off] [--amx=on|off] [--bf16-products=on|off] [--int8-activation-bits=7|8]
//! ```
//!
//! The flags (the keys of `da3 --plan` that concern the kernels) make the [`Request`] the kernels'
//! [`Config`] is built from; without them, this CPU's defaults.
//! Medians of 20 computes (5 for attention) after one untimed; with `--cold`, a 1 GiB buffer
//! is written before each compute, so that weights and inputs come from memory.
//!
//! Threads are started once per measurement and wait on a spinning barrier between
//! computes, as ggml's thread pool does (the kernels keep per-thread scratch vectors, which a
//! fresh thread per compute would fault in again). A band kernel (Winograd, the direct
//! convolution by rows) writes through [`PlaneRows`], whose bands of one buffer can only be
//! made disjoint with `unsafe`; here each thread writes its band of every plane into a buffer
//! of its own (the same rows and pages as its share of one result; the bands are gathered
//! into one result after the timing).

use da3_kernels::{
    amx_convolution_fits, attention_tokens, attention_tokens_bf16, attention_tokens_int8,
    conv_direct_rows, conv_direct_rows_bf16, conv_same_planes, conv_same_planes_bf16,
    conv_winograd_rows, layer_norm_rows, linear_bias_rows, pack_panels, pack_panels_bf16,
    pack_panels_q8, winograd_pays, BandFn, Config, Cpu, KernelFn, Packing, PlaneRows, Request, Src,
    PANEL, Q8_BLOCK, Q8_RECORD, WINOGRAD_TILE,
};
use std::error::Error;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

/// Kernel values (KW x KH x IC x OC) up to which the model runs the direct convolution by
/// rows rather than by output channels (`DIRECT_ROWS_MAX_WEIGHTS` of da3's adapter).
const DIRECT_ROWS_MAX_WEIGHTS: usize = 64 * 1024;

/// How a kernel's result is shared among threads, as da3's adapter shares it: rows of
/// `ne[0]` values, planes of `ne[0] * ne[1]`, or bands of this many rows of every plane.
#[derive(Clone, Copy)]
enum Split {
    Rows(KernelFn),
    Planes(KernelFn),
    Bands(BandFn, usize),
}

/// One thread's share of a compute.
type Job<'a> = Box<dyn FnMut() + Send + 'a>;

/// A barrier that spins (then yields), so that a compute starts on every thread within
/// microseconds, as on ggml's pool.
struct SpinBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(threads: usize) -> SpinBarrier {
        SpinBarrier {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            spins += 1;
            if spins < 20_000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Contiguous ranges of `units` for `threads` threads, as ggml's custom ops split them.
fn shares(units: usize, threads: usize) -> Vec<Range<usize>> {
    let per = units.div_ceil(threads.max(1));
    (0..threads)
        .map(|i| {
            let start = (i * per).min(units);
            start..(start + per).min(units)
        })
        .collect()
}

struct Bench {
    config: Config,
    /// `config` with Winograd off: the direct convolution where Winograd would pay.
    no_winograd: Config,
    threads: usize,
    /// The buffer written before each compute with `--cold`.
    evict: Option<Vec<u64>>,
}

impl Bench {
    /// The median wall time of `computes` rounds of `jobs` (job `i` on thread `i`, the first
    /// on this one), after one untimed round.
    fn median_ms(&mut self, mut jobs: Vec<Job<'_>>, computes: usize) -> f64 {
        let barrier = SpinBarrier::new(jobs.len());
        let rounds = computes + 1;
        let mut first = jobs.remove(0);
        let evict = &mut self.evict;
        std::thread::scope(|s| {
            for mut job in jobs {
                let barrier = &barrier;
                s.spawn(move || {
                    for _ in 0..rounds {
                        barrier.wait();
                        job();
                        barrier.wait();
                    }
                });
            }
            let mut times = Vec::new();
            for round in 0..rounds {
                if let Some(evict) = evict.as_mut() {
                    for (i, word) in evict.iter_mut().enumerate().step_by(8) {
                        *word = word.wrapping_add(i as u64);
                    }
                    std::hint::black_box(&evict);
                }
                let t = Instant::now();
                barrier.wait();
                first();
                barrier.wait();
                if round > 0 {
                    times.push(t.elapsed().as_secs_f64() * 1e3);
                }
            }
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        })
    }

    /// Times `split` computing a result of shape `ne` from `srcs` on the bench's threads:
    /// the median in ms, and the result.
    fn time(
        &mut self,
        split: Split,
        srcs: &[Src<'_>],
        ne: [usize; 4],
        param: f32,
        computes: usize,
    ) -> (f64, Vec<f32>) {
        let config = self.config;
        self.time_with(config, split, srcs, ne, param, computes)
    }

    /// [`Bench::time`] with another configuration.
    fn time_with(
        &mut self,
        config: Config,
        split: Split,
        srcs: &[Src<'_>],
        ne: [usize; 4],
        param: f32,
        computes: usize,
    ) -> (f64, Vec<f32>) {
        let config = &config;
        let len: usize = ne.iter().product();
        match split {
            Split::Rows(kernel) | Split::Planes(kernel) => {
                let (units, unit_len) = match split {
                    Split::Rows(_) => (ne[1] * ne[2] * ne[3], ne[0]),
                    _ => (ne[2] * ne[3], ne[0] * ne[1]),
                };
                let mut out = Aligned::zeros(len);
                let mut rest: &mut [f32] = &mut out;
                let jobs: Vec<Job<'_>> = shares(units, self.threads)
                    .into_iter()
                    .map(|units| {
                        let (mine, tail) =
                            std::mem::take(&mut rest).split_at_mut(units.len() * unit_len);
                        rest = tail;
                        Box::new(move || kernel(config, srcs, &mut *mine, ne, units.clone(), param))
                            as Job<'_>
                    })
                    .collect();
                let ms = self.median_ms(jobs, computes);
                (ms, out.to_vec())
            }
            Split::Bands(kernel, band_rows) => {
                let [w, h, planes, _] = ne;
                let bands: Vec<Range<usize>> = shares(h.div_ceil(band_rows), self.threads)
                    .into_iter()
                    .map(|u| (u.start * band_rows).min(h)..(u.end * band_rows).min(h))
                    .collect();
                let mut outs: Vec<Aligned> = bands.iter().map(|_| Aligned::zeros(len)).collect();
                let jobs: Vec<Job<'_>> = bands
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(rows, buf)| {
                        let rows = rows.clone();
                        Box::new(move || {
                            let mut band = PlaneRows::whole(&mut buf[..], [w, h, planes])
                                .narrowed(rows.clone());
                            kernel(config, srcs, &mut band, ne, param)
                        }) as Job<'_>
                    })
                    .collect();
                let ms = self.median_ms(jobs, computes);
                // Each thread's rows of every plane, gathered.
                let mut out = vec![0.0f32; len];
                for (rows, buf) in bands.iter().zip(&outs) {
                    for plane in 0..planes {
                        let at = (plane * h + rows.start) * w..(plane * h + rows.end) * w;
                        out[at.clone()].copy_from_slice(&buf[at]);
                    }
                }
                (ms, out)
            }
        }
    }
}

/// Values from a 64-byte boundary, as ggml's buffers place every tensor (a vector of a
/// plain `Vec<f32>` from the system allocator may start 16 bytes past a cache line, and
/// every other 64-byte load of it would then span two lines).
struct Aligned {
    data: Vec<f32>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(values: impl IntoIterator<Item = f32>) -> Aligned {
        let values: Vec<f32> = values.into_iter().collect();
        let len = values.len();
        let mut data: Vec<f32> = Vec::with_capacity(len + 16);
        let start = data.as_ptr().align_offset(64).min(15);
        data.resize(start, 0.0);
        data.extend(values);
        Aligned { data, start, len }
    }

    fn zeros(len: usize) -> Aligned {
        Aligned::new(std::iter::repeat_n(0.0, len))
    }
}

impl std::ops::Deref for Aligned {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for Aligned {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data[self.start..self.start + self.len]
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Aligned {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    Aligned::new((0..n).map(|_| {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        (state as f32 / u32::MAX as f32) * 2.0 - 1.0
    }))
}

/// A contiguous f32 operand of shape `ne` over `data`.
fn src(data: &[f32], ne: [usize; 4]) -> Src<'_> {
    Src {
        data,
        ne,
        nb: [1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]],
        packing: Packing::F32,
    }
}

/// The largest absolute difference between two results of the same shape (infinite where
/// either has a NaN, which `f32::max` would skip).
fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .map(|d| if d.is_nan() { f32::INFINITY } else { d })
        .fold(0.0, f32::max)
}

/// `values` (rows of a multiple of 32) as ggml's q8_0 blocks: per 32 values the scale
/// `max |x| / 127` as f16, then `round(x / scale)` as signed bytes.
fn quantize_q8_0(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() / Q8_BLOCK * (2 + Q8_BLOCK));
    for block in values.chunks_exact(Q8_BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = amax / 127.0;
        let inverse = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        out.extend(half::f16::from_f32(scale).to_le_bytes());
        out.extend(block.iter().map(|v| (v * inverse).round() as i8 as u8));
    }
    out
}

/// The kernels' request: the `--key=value` flags among `args` (the keys of `da3 --plan` that
/// concern the kernels: kernels, winograd, amx, bf16-products, int8-activation-bits).
fn request(args: &[String]) -> Result<Request, String> {
    let mut request = Request::default();
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
    let cold = all.iter().any(|a| a == "--cold");
    let request = request(&all)?;
    let args: Vec<&String> = all.iter().filter(|a| !a.starts_with("--")).collect();
    let threads: usize = args.first().map_or(Ok(2), |t| t.parse())?;
    if threads == 0 {
        return Err("threads must be 1 or more".into());
    }
    let section = args.get(1).map(|s| s.as_str());
    if let Some(s) = section {
        if !["products", "convolutions", "norms", "attention"].contains(&s) {
            return Err(
                format!("unknown section {s}: products, convolutions, norms or attention").into(),
            );
        }
    }
    let cpu = Cpu::detect();
    let config = Config::new(&cpu, &request);
    println!(
        "da3-kernels {} (this CPU's best {}; {}): AMX tiles {}, vector bf16 {}, Winograd {}, int8 activations {} bits; {threads} threads{}",
        config.set(),
        cpu.best(),
        cpu.vendor().unwrap_or("unknown vendor"),
        config.amx_tiles(),
        config.vector_bf16(),
        config.winograd(),
        config.int8_activation_bits(),
        if cold { ", cold caches" } else { "" }
    );
    let no_winograd = Config::new(
        &cpu,
        &Request {
            winograd: Some(false),
            ..request
        },
    );
    let mut bench = Bench {
        config,
        no_winograd,
        threads,
        evict: cold.then(|| vec![0u64; 1 << 27]),
    };
    let wanted = |name: &str| section.is_none_or(|s| s == name);
    if wanted("products") {
        products(&mut bench);
    }
    if wanted("convolutions") {
        convolutions(&mut bench);
    }
    if wanted("norms") {
        layer_norms(&mut bench);
    }
    if wanted("attention") {
        attention(&mut bench);
    }
    Ok(())
}

/// The block linears, `x W^T + b` for x [k, 865]: the weight packed as f32, f16, bf16 and
/// q8_0 panels (int8 products).
fn products(bench: &mut Bench) {
    const COMPUTES: usize = 20;
    for (k, n, t) in [
        (384usize, 1536usize, 865usize),
        (1536, 384, 865),
        (384, 1152, 865),
        (768, 3072, 865),
        (3072, 768, 865),
    ] {
        let weight = values(k * n, 1);
        let (x, bias) = (values(k * t, 2), values(n, 3));
        let f32_panels = Aligned::new(pack_panels(&weight, k, n));
        // Two f16 values per word, in memory order.
        let f16_panels = Aligned::new(f32_panels.chunks(2).map(|pair| {
            let [lo, hi] = [pair[0], pair[1]].map(|w| half::f16::from_f32(w).to_bits());
            f32::from_bits(u32::from(lo) | (u32::from(hi) << 16))
        }));
        let bf16_panels = Aligned::new(
            pack_panels_bf16(&weight, k, n)
                .into_iter()
                .map(|w| f32::from_bits(w as u32)),
        );
        let q8_words = pack_panels_q8(&quantize_q8_0(&weight), k, n);
        let q8_panels = Aligned::new(q8_words.iter().map(|&w| f32::from_bits(w)));
        let mut f16_src = src(&f16_panels, [PANEL, k, n / PANEL, 1]);
        f16_src.packing = Packing::F16;
        let mut bf16_src = src(&bf16_panels, [PANEL, k / 2, n / PANEL, 1]);
        bf16_src.packing = Packing::Bf16Pairs;
        let mut q8_src = src(&q8_panels, [Q8_RECORD * 4, k / Q8_BLOCK, n / PANEL, 1]);
        q8_src.packing = Packing::Q8Records;
        q8_src.nb = [1, Q8_RECORD, Q8_RECORD * k / Q8_BLOCK, q8_panels.len()];
        let bf16_name = if bench.config.amx_tiles() {
            "bf16 AMX"
        } else {
            "bf16 panels"
        };
        let int8_name = if bench.config.int8_activation_bits() == 7 {
            "int8 (7-bit x)"
        } else {
            "int8 panels"
        };
        let mut results = Vec::new();
        for (name, panels) in [
            ("f32 panels", src(&f32_panels, [PANEL, k, n / PANEL, 1])),
            ("f16 panels", f16_src),
            (bf16_name, bf16_src),
            (int8_name, q8_src),
        ] {
            let srcs = [panels, src(&x, [k, t, 1, 1]), src(&bias, [n, 1, 1, 1])];
            let (ms, y) = bench.time(
                Split::Rows(linear_bias_rows),
                &srcs,
                [n, t, 1, 1],
                0.0,
                COMPUTES,
            );
            results.push(y);
            println!(
                "[{n} x {k}] x [{k} x {t}] {name:<14} {ms:7.2} ms {:6.1} GFLOP/s",
                2.0 * (k * n * t) as f64 / ms / 1e6
            );
        }
        println!(
            "  max difference against f32: f16 {:.2e}, bf16 {:.2e}, q8_0 {:.2e}",
            max_difference(&results[0], &results[1]),
            max_difference(&results[0], &results[2]),
            max_difference(&results[0], &results[3])
        );
    }
}

/// The heads' 3x3 convolutions ("same" padding, plus a bias): the f32 route the model takes
/// (and the direct kernel beside Winograd), then bf16 products.
fn convolutions(bench: &mut Bench) {
    const COMPUTES: usize = 20;
    // The small maps of DA3-base's head (stages 4 and 3 at 504x336: layer_rn, fusion), then
    // DA3-small's head, then DA3-base's (the largest of each level).
    for (w, h, ic, oc) in [
        (18usize, 12usize, 768usize, 128usize),
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
        let config = bench.config;
        let (kernel, input, bias) = (values(9 * ic * oc, 4), values(w * h * ic, 5), values(oc, 6));
        let srcs = [
            src(&kernel, [3, 3, ic, oc]),
            src(&input, [w, h, ic, 1]),
            src(&bias, [oc, 1, 1, 1]),
        ];
        let ne = [w, h, oc, 1];
        // The routes of da3's `Context::cpu_conv_2d_same`.
        let winograd = config.winograd() && winograd_pays(&config, w, h);
        let by_rows = 9 * ic * oc <= DIRECT_ROWS_MAX_WEIGHTS;
        let tiles = config.amx_tiles() && amx_convolution_fits([3, 3, ic, oc]);
        let direct = if by_rows {
            ("direct rows", Split::Bands(conv_direct_rows, 1))
        } else {
            ("direct planes", Split::Planes(conv_same_planes))
        };
        // Each route with the configuration it runs with: `conv_same_planes` takes Winograd
        // itself where it pays, so the direct kernel by planes runs with Winograd off.
        let mut routes = Vec::new();
        if winograd {
            routes.push((
                "Winograd",
                Split::Bands(conv_winograd_rows, WINOGRAD_TILE),
                config,
            ));
        }
        routes.push((direct.0, direct.1, bench.no_winograd));
        routes.push(if tiles {
            ("bf16 AMX", Split::Planes(conv_same_planes_bf16), config)
        } else if by_rows {
            ("bf16 rows", Split::Bands(conv_direct_rows_bf16, 1), config)
        } else {
            ("bf16 planes", Split::Planes(conv_same_planes_bf16), config)
        });
        // Where the model, asked for bf16 products, keeps f32: bf16 products that do not
        // pay (no AMX tile fits, no vector bf16 products that pay), or Winograd's f32.
        let bf16_taken = tiles || (config.vector_bf16() && !winograd);
        let flop = 2.0 * (w * h * ic * oc * 9) as f64;
        let mut results = Vec::new();
        for (i, &(name, split, config)) in routes.iter().enumerate() {
            let (ms, y) = bench.time_with(config, split, &srcs, ne, 0.0, COMPUTES);
            results.push(y);
            let note = match i {
                0 => " (the model's f32)",
                _ if i + 1 == routes.len() && !bf16_taken => " (the model keeps f32 here)",
                _ if i + 1 == routes.len() => " (the model's bf16)",
                _ => "",
            };
            println!(
                "{w}x{h} {ic}->{oc} 3x3 {name:<13} {ms:7.2} ms {:6.1} GFLOP/s{note}",
                flop / ms / 1e6
            );
        }
        let last = results.len() - 1;
        let bf16_diff = max_difference(&results[last - 1], &results[last]);
        if winograd {
            println!(
                "  max difference: Winograd against direct {:.2e}, bf16 against direct {bf16_diff:.2e}",
                max_difference(&results[0], &results[1])
            );
        } else {
            println!("  max difference: bf16 against f32 {bf16_diff:.2e}");
        }
    }
}

/// A block's LayerNorm, [384, 865], and the per-head norms of its QKV output: [64, 6, 865]
/// read as strided rows of [1152, 865].
fn layer_norms(bench: &mut Bench) {
    const COMPUTES: usize = 20;
    let (t, dim, heads, d) = (865usize, 384usize, 6usize, 64usize);
    let x = values(dim * t, 7);
    let qkv = values(3 * dim * t, 8);
    let (w, b) = (values(dim, 9), values(dim, 10));
    let (hw, hb) = (values(d, 11), values(d, 12));
    let block = [
        src(&x, [dim, t, 1, 1]),
        src(&w, [dim, 1, 1, 1]),
        src(&b, [dim, 1, 1, 1]),
    ];
    let mut head_rows = src(&qkv, [d, heads, t, 1]);
    head_rows.nb = [1, d, 3 * dim, 3 * dim * t];
    let per_head = [head_rows, src(&hw, [d, 1, 1, 1]), src(&hb, [d, 1, 1, 1])];
    for (name, srcs, ne) in [
        ("layer norm [384 x 865]", &block, [dim, t, 1, 1]),
        (
            "head norms [64 x 6 x 865], strided",
            &per_head,
            [d, heads, t, 1],
        ),
    ] {
        let (ms, _) = bench.time(Split::Rows(layer_norm_rows), srcs, ne, 1e-6, COMPUTES);
        let bytes = 2.0 * 4.0 * ne.iter().product::<usize>() as f64;
        println!(
            "{name:<36} {ms:7.3} ms {:6.1} GB/s (read + written)",
            bytes / ms / 1e6
        );
    }
}

/// One view (865 tokens, 12 heads of 64) attending over the keys of `views` views: f32,
/// bf16 and int8 products.
fn attention(bench: &mut Bench) {
    const COMPUTES: usize = 5;
    const D: usize = 64;
    const HEADS: usize = 12;
    const TQ: usize = 865;
    for views in [1usize, 2, 4, 8] {
        let tk = TQ * views;
        let q = values(D * TQ * HEADS, 13);
        let (k, v) = (values(D * tk * HEADS, 14), values(D * tk * HEADS, 15));
        let srcs = [
            src(&q, [D, TQ, HEADS, 1]),
            src(&k, [D, tk, HEADS, 1]),
            src(&v, [D, tk, HEADS, 1]),
        ];
        let ne = [D, HEADS, TQ, 1];
        let bf16_name = if bench.config.amx_tiles() {
            "bf16 AMX"
        } else {
            "bf16"
        };
        let mut results = Vec::new();
        for (name, kernel) in [
            ("f32", attention_tokens as KernelFn),
            (bf16_name, attention_tokens_bf16),
            ("int8", attention_tokens_int8),
        ] {
            let (ms, y) = bench.time(Split::Planes(kernel), &srcs, ne, 0.0, COMPUTES);
            results.push(y);
            let flop = 4.0 * (TQ * tk * D * HEADS) as f64;
            println!(
                "attention [64 x 865 x 12] over {tk:5} keys ({views} views): {name:<8} {ms:8.2} ms {:6.1} GFLOP/s",
                flop / ms / 1e6
            );
        }
        println!(
            "  max difference against f32: bf16 {:.2e}, int8 {:.2e}",
            max_difference(&results[0], &results[1]),
            max_difference(&results[0], &results[2])
        );
    }
}
