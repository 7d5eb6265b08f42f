//! This machine's f32 FMA throughput, the bound the CPU kernels are measured against:
//! `cargo run --release --example fma_peak [threads]`. Each thread runs chains of independent
//! fused multiply-adds over 8-wide arrays (and 16-wide ones with AVX-512) (the compiler turns them into AVX2 or
//! AVX-512 FMAs with the repository's `target-cpu=native`; check the figure against
//! cores x GHz x FMA units x lanes x 2). Prints the median of 9 runs, with min and max.
use std::hint::black_box;
use std::time::Instant;

/// A throughput measurement: GFLOP/s of `threads` threads over `iters` rounds.
type Bench = fn(usize, usize) -> f64;

/// Independent accumulators: enough to cover the FMA latency (4 cycles) on two units.
const CHAINS: usize = 12;

/// `iters` rounds of CHAINS FMAs of `W` lanes; returns the lanes' sum so nothing is elided.
fn chains<const W: usize>(iters: usize) -> f32 {
    let mut acc = [[1.0f32; W]; CHAINS];
    let (x, y) = (black_box([0.999_999f32; W]), black_box([1e-7f32; W]));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for ((a, &x), &y) in a.iter_mut().zip(&x).zip(&y) {
                *a = a.mul_add(x, y);
            }
        }
    }
    acc.iter().flatten().sum()
}

fn gflops<const W: usize>(threads: usize, iters: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| black_box(chains::<W>(black_box(iters))));
        }
    });
    (threads * iters * CHAINS * W * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map_or(2, |t| t.parse().expect("a thread count"));
    // 12 chains of 16 lanes need 24 vector registers: only AVX-512 has them.
    let widths: &[(usize, Bench)] = if cfg!(target_feature = "avx512f") {
        &[(8, gflops::<8>), (16, gflops::<16>)]
    } else {
        &[(8, gflops::<8>)]
    };
    for &(lanes, run) in widths {
        let iters = 40_000_000 / lanes;
        let mut runs: Vec<f64> = (0..9).map(|_| run(threads, iters)).collect();
        runs.sort_by(f64::total_cmp);
        println!(
            "{threads} threads, {lanes}-lane FMA chains: median {:.1} GFLOP/s (min {:.1}, max {:.1})",
            runs[4], runs[0], runs[8]
        );
    }
}
