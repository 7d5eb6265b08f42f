//! Where a model's time goes, by op: `cargo run --release --example profile_model -- MODEL.gguf
//! [threads] [device]` (computes the 640x427 synthetic image one node at a time, on the CPU or
//! on a device named as `da3 devices` lists it, e.g. CUDA0; each node waits for the device).

use da3::ggml::Gallocr;
use da3::{preprocess, synthetic, Device, LoadOptions, Model};
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: profile_model MODEL.gguf [threads] [device]")?;
    let threads = args.get(2).map_or(Ok(2), |t| t.parse())?;
    let spec: Device = match args.get(3) {
        Some(name) => name.parse()?,
        None => Device::Cpu,
    };
    let options = LoadOptions {
        device: spec,
        threads,
        ..Default::default()
    };
    let mut model = Model::load(path, &options)?.session()?;
    let device = model.device().clone();
    let image = preprocess::preprocess(&synthetic::image(640, 427), 504)?;
    let graph = model.graph(image.width, image.height)?;
    let input = graph.get("image").ok_or("no input")?;
    let mut gallocr = Gallocr::for_backend(&device)?;
    let run = gallocr.alloc(graph)?;
    // The input tensor is written through its graph reference's name lookup.
    let _ = input;
    // One full compute first, so the profile sees warm buffers (no first-touch page faults).
    run.compute(&device)?;
    let times = run.profile(&device)?;
    let total: f64 = times.iter().map(|t| t.seconds).sum();
    let mut by_op: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for t in &times {
        // Custom nodes carry the name of the op they compute.
        let label = if t.op == "CUSTOM" { &t.name } else { t.op };
        let e = by_op.entry(label).or_default();
        e.0 += t.seconds;
        e.1 += 1;
    }
    let mut ops: Vec<_> = by_op.into_iter().collect();
    ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    println!("total {:.1} ms over {} nodes", total * 1e3, times.len());
    for (op, (s, n)) in ops.iter().take(25) {
        println!(
            "{op:<16} {:>8.1} ms {:>5.1}% ({n} nodes)",
            s * 1e3,
            100.0 * s / total
        );
    }
    let mut slow = times.clone();
    slow.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    let top: usize = std::env::var("PROFILE_TOP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    for t in slow.iter().take(top) {
        let [out, a, b] = t.shapes;
        println!(
            "  {:<28} {:<12} {:>7.2} ms  {out:?} <- {a:?} {b:?}",
            t.name,
            t.op,
            t.seconds * 1e3
        );
    }
    Ok(())
}
