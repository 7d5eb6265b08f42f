//! What the residency pass costs per node, on a graph of about 1000 nodes. A measurement,
//! not a benchmark gate: run it with
//! `cargo test --release --test residency_pass_cost -- --nocapture`.

use da3::ggml::{Backend, BufferType, Context, DType, Graph, Tensor, TensorRef};
use da3::residency::{self, Target};
use std::time::{Duration, Instant};

const LAYERS: usize = 250;
const WIDTH: i64 = 64;
const RUNS: usize = 100;

/// A device with separate memory that runs every op: every host operand is a finding.
struct SeparateMemory;

impl Target for SeparateMemory {
    fn name(&self) -> String {
        "FAKE0".into()
    }
    fn reads_buffer_type(&self, _: BufferType) -> bool {
        false
    }
    fn reads_host_pointers(&self) -> bool {
        false
    }
    fn supports_op(&self, _: &TensorRef<'_>) -> bool {
        true
    }
}

/// `LAYERS` x [mul by a host weight, add a host bias, norm, scale]: 4 nodes a layer, each
/// weight and bias in a host context (no buffer), as the crash's norm parameters.
fn layered_graph() -> (Graph, Vec<Tensor>) {
    let weights_ctx = Context::host(2 << 20).unwrap();
    let ctx = Context::metadata_with_graph(4 * LAYERS + 8, 2048).unwrap();
    let x = ctx.new_tensor(DType::F32, &[WIDTH, 8]).unwrap().named("x");
    x.mark_input();
    let mut weights = Vec::new();
    let mut h = x;
    for layer in 0..LAYERS {
        let w = weights_ctx
            .new_tensor(DType::F32, &[WIDTH])
            .unwrap()
            .named(&format!("blk.{layer}.w"));
        let b = weights_ctx
            .new_tensor(DType::F32, &[WIDTH])
            .unwrap()
            .named(&format!("blk.{layer}.b"));
        weights_ctx
            .write(&w, &vec![1.0f32; WIDTH as usize])
            .unwrap();
        weights_ctx
            .write(&b, &vec![0.0f32; WIDTH as usize])
            .unwrap();
        h = ctx
            .mul(&h, &w)
            .unwrap()
            .named(&format!("blk.{layer}.scaled"));
        h = ctx
            .add(&h, &b)
            .unwrap()
            .named(&format!("blk.{layer}.shifted"));
        h = ctx
            .norm(&h, 1e-6)
            .unwrap()
            .named(&format!("blk.{layer}.normed"));
        h = ctx
            .scale(&h, 0.5)
            .unwrap()
            .named(&format!("blk.{layer}.out"));
        weights.extend([w, b]);
    }
    let graph = ctx.new_graph(2048).unwrap();
    graph.expand(&h).unwrap();
    (graph, weights)
}

/// Median wall time of `RUNS` passes, and the last pass's result.
fn median_pass(graph: &Graph, target: &dyn Target) -> (Duration, residency::PassResult) {
    let mut times = Vec::with_capacity(RUNS);
    let mut pass = residency::check(graph, target);
    for _ in 0..RUNS {
        let start = Instant::now();
        pass = residency::check(graph, target);
        times.push(start.elapsed());
    }
    times.sort();
    (times[RUNS / 2], pass)
}

#[test]
fn pass_cost_per_node_on_a_thousand_node_graph() {
    let (graph, _weights) = layered_graph();
    assert_eq!(graph.n_nodes(), 4 * LAYERS);
    let cpu = Backend::cpu(1).unwrap();
    for (label, target, findings) in [
        ("CPU backend, clean", &cpu as &dyn Target, 0),
        (
            "separate-memory device, every weight a finding",
            &SeparateMemory,
            2 * LAYERS,
        ),
    ] {
        let (median, pass) = median_pass(&graph, target);
        assert_eq!(pass.findings.len(), findings, "{label}");
        let per_node = median.as_secs_f64() * 1e9 / pass.nodes as f64;
        eprintln!(
            "residency pass, {label}: {} nodes, {} operands: median {:.1} us ({per_node:.0} ns/node) over {RUNS} runs",
            pass.nodes,
            pass.sources_checked,
            median.as_secs_f64() * 1e6
        );
    }
}
