//! Measures ggml's f32 matrix product on the CPU: `cargo run --release --example matmul_speed`.
use da3::ggml::{Backend, BufferUsage, Context, DType, Gallocr};
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let threads: usize = std::env::args().nth(1).map_or(2, |t| t.parse().unwrap());
    let cpu = Backend::cpu(threads)?;
    for (k, m, n) in [
        (384usize, 1536usize, 865usize),
        (1536, 384, 865),
        (384, 1152, 865),
        (576, 32, 55296),
    ] {
        let w = Context::metadata(2)?;
        let a = w.new_tensor(DType::F32, &[k as i64, m as i64])?;
        w.allocate_on(&cpu, BufferUsage::Weights)?;
        w.write(&a, &vec![0.01f32; k * m])?;
        let ctx = Context::metadata(4)?;
        let b = ctx.new_tensor(DType::F32, &[k as i64, n as i64])?;
        b.mark_input();
        let c = ctx.mul_mat(&a, &b)?;
        c.mark_output();
        let g = ctx.new_graph(4)?;
        g.expand(&c)?;
        let mut ga = Gallocr::for_backend(&cpu)?;
        let run = ga.alloc(&g)?;
        run.write(&b, &vec![0.5f32; k * n])?;
        run.compute(&cpu)?;
        let t = std::time::Instant::now();
        let reps = 10;
        for _ in 0..reps {
            run.compute(&cpu)?;
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!(
            "{k}x{m} * {k}x{n}: {:.2} ms, {:.1} GFLOP/s",
            s * 1e3,
            2.0 * (k * m * n) as f64 / s / 1e9
        );
    }
    Ok(())
}
