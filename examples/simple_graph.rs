//! The shape of ggml's `simple-backend` example, in safe Rust: a matrix product on the best
//! device ggml has here (a GPU if it was built with one, else the CPU).
//!
//! Run with `cargo run --release --example simple_graph`.

use da3::ggml::{Backend, BufferUsage, Context, DType, Device, TensorView};
use da3::residency::{Executor, Policy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1. Backends: the best device, and the CPU the planner may fall back to.
    let device = Device::best();
    let backend = if device.kind() == da3::ggml::DeviceKind::Cpu {
        Backend::cpu(0)?
    } else {
        Backend::new(device)?
    };
    println!("computing on {}", backend.name());

    // 2. Model: a weight matrix in its own context, allocated once on the device.
    let weights = Context::metadata(1)?;
    let a = weights.new_tensor(DType::F32, &[2, 4])?.named("a"); // 4 rows of 2
    weights.allocate_on(&backend, BufferUsage::Weights)?;
    weights.write(&a, &[2.0f32, 8.0, 5.0, 1.0, 4.0, 2.0, 8.0, 6.0])?;

    // 3. Graph: an input and the product, in a metadata-only context; no data yet.
    let ctx = Context::metadata(8)?;
    let b = ctx.new_tensor(DType::F32, &[2, 3])?.named("b"); // 3 rows of 2
    b.mark_input();
    let result = ctx.mul_mat(&a, &b)?.named("result"); // [4, 3]: result[j][i] = a_i . b_j
    result.mark_output();
    let graph = ctx.new_graph(16)?;
    graph.expand(&result)?;

    // 4. Compute through the residency planner: allocate, set inputs, run, read.
    let mut executor = Executor::new(backend, Backend::cpu(0)?, Policy::Route)?;
    let run = executor.run(&graph)?;
    run.write(&b, &[10.0f32, 5.0, 9.0, 9.0, 5.0, 4.0])?;
    run.compute()?;
    let values = run.read::<f32>(&result)?;

    // Expected: [60 55 50 110 | 90 54 54 126 | 42 29 28 64]
    let [n_i, n_j, ..] = result.ne();
    for j in 0..n_j as usize {
        let row: Vec<String> = values[j * n_i as usize..(j + 1) * n_i as usize]
            .iter()
            .map(|v| format!("{v:.0}"))
            .collect();
        println!("[{}]", row.join(" "));
    }
    Ok(())
}
