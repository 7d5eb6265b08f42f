//! This machine's f32 FMA throughput, the bound the CPU kernels are measured against:
//! `cargo run --release --example fma_peak [threads]`. Each thread runs chains of independent
//! fused multiply-adds over 8-wide arrays (and 16-wide ones with AVX-512) (the compiler turns them into AVX2 or
//! AVX-512 FMAs with the repository's `target-cpu=native`; check the figure against
//! cores x GHz x FMA units x lanes x 2), written two ways because no one loop vectorises under
//! every tuning, and keeps the faster. Prints the median of 9 runs, with min and max.
//! On Intel CPUs with AVX-512 (Skylake-X to Sapphire Rapids tunings) LLVM prefers 256-bit
//! vectors, so the 16-wide figure comes out as the 8-wide one, half the true peak; build with
//! `RUSTFLAGS="-C target-cpu=native -C target-feature=-prefer-256-bit"` to measure 512-bit FMAs
//! (a 2-vCPU Sapphire Rapids VM: 223-229 GFLOP/s by default, 414 with the flag).
use std::hint::black_box;
use std::time::Instant;

/// A throughput measurement: GFLOP/s of `threads` threads over `iters` rounds.
type Bench = fn(usize, usize) -> f64;

/// Independent accumulators: enough to cover the FMA latency (4 cycles) on two units.
const CHAINS: usize = 12;

/// `iters` rounds of CHAINS FMAs of `W` lanes, the chains an array updated in place; returns
/// the lanes' sum so nothing is elided. LLVM vectorises this per chain for AVX2 targets, but
/// its Zen 4 tuning vectorises across the chains with gathers and scatters (3 GFLOP/s).
fn chains_in_place<const W: usize>(iters: usize) -> f32 {
    let mut acc = [[1.0f32; W]; CHAINS];
    let (x, y) = (black_box([0.999_999f32; W]), black_box([1e-7f32; W]));
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = fma_lanes(*a, &x, &y);
        }
    }
    acc.iter().flatten().sum()
}

/// The same with each chain a variable of its own, updated as a whole array: vectorised by
/// the Zen 4 tuning (16 lanes), left scalar by the AVX2 ones (8 lanes).
fn chains_by_value<const W: usize>(iters: usize) -> f32 {
    let (x, y) = (black_box([0.999_999f32; W]), black_box([1e-7f32; W]));
    let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5, mut a6, mut a7, mut a8, mut a9, mut a10, mut a11] =
        [[1.0f32; W]; CHAINS];
    for _ in 0..iters {
        a0 = fma_lanes(a0, &x, &y);
        a1 = fma_lanes(a1, &x, &y);
        a2 = fma_lanes(a2, &x, &y);
        a3 = fma_lanes(a3, &x, &y);
        a4 = fma_lanes(a4, &x, &y);
        a5 = fma_lanes(a5, &x, &y);
        a6 = fma_lanes(a6, &x, &y);
        a7 = fma_lanes(a7, &x, &y);
        a8 = fma_lanes(a8, &x, &y);
        a9 = fma_lanes(a9, &x, &y);
        a10 = fma_lanes(a10, &x, &y);
        a11 = fma_lanes(a11, &x, &y);
    }
    [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
        .iter()
        .flatten()
        .sum()
}

#[inline(always)]
fn fma_lanes<const W: usize>(mut a: [f32; W], x: &[f32; W], y: &[f32; W]) -> [f32; W] {
    for ((a, &x), &y) in a.iter_mut().zip(x).zip(y) {
        *a = a.mul_add(x, y);
    }
    a
}

/// GFLOP/s of `threads` threads each running `kernel` over `iters` rounds of `W` lanes.
fn gflops<const W: usize>(kernel: fn(usize) -> f32, threads: usize, iters: usize) -> f64 {
    let t = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| black_box(kernel(black_box(iters))));
        }
    });
    (threads * iters * CHAINS * W * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The faster of the two formulations: whichever the compiler's tuning turned into vector
/// FMAs (the other one's figure is a code-generation artefact, not the machine).
fn best_of_both<const W: usize>(threads: usize, iters: usize) -> f64 {
    gflops::<W>(chains_in_place::<W>, threads, iters).max(gflops::<W>(
        chains_by_value::<W>,
        threads,
        iters,
    ))
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .map_or(2, |t| t.parse().expect("a thread count"));
    // 12 chains of 16 lanes need 24 vector registers: only AVX-512 has them.
    let widths: &[(usize, Bench)] = if cfg!(target_feature = "avx512f") {
        &[(8, best_of_both::<8>), (16, best_of_both::<16>)]
    } else {
        &[(8, best_of_both::<8>)]
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
