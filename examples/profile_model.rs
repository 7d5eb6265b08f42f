//! Where a model's time goes, by op: `cargo run --release --example profile_model -- MODEL.gguf
//! [threads] [device] [views]` (computes the 640x427 synthetic image, or a scene of that many
//! views of it, one node at a time, on the CPU or on a device named as `da3 devices` lists it,
//! e.g. CUDA0; each node waits for the device, and there is computed 20 times in a row so that
//! its launch and wait count once).

use da3::{synthetic, Device, LoadOptions, Model};
use std::collections::BTreeMap;

/// A node's class (custom nodes carry the name of the op they compute; packed linear layers
/// are the custom nodes whose weight is a panel packing, in f32 or bf16, or for int8) and its multiply-adds x 2, for the
/// products: matrix products, attention, convolutions.
fn classify(t: &da3::ggml::NodeTime) -> (String, f64) {
    let [out, a, b] = t.shapes.map(|s| s.map(|d| d as f64));
    let panel = da3::ggml::LINEAR_PANEL as f64;
    let packed = a[0] == panel && a[2] * a[0] == out[0];
    let packed_int8 = a[0] as usize == da3::ggml::LINEAR_Q8_RECORD && a[2] * panel == out[0];
    match (t.op, t.name.as_str()) {
        ("MUL_MAT", _) => (
            "linear (ggml)".into(),
            2.0 * a[0] * out[0] * out[1] * out[2] * out[3],
        ),
        ("CUSTOM", "attention") => {
            // out [Dv, H, Tq], q [D, Tq, H], k [D, Tk, H].
            let (d, tq, heads, tk) = (a[0], a[1], a[2], b[1]);
            ("attention".into(), 2.0 * (d + out[0]) * tq * tk * heads)
        }
        // ggml's fused attention: out [Dv, H, Tq, B], q [D, Tq, H, B], k [D, Tk, H, B].
        ("FLASH_ATTN_EXT", _) => {
            let (d, tq, heads, tk) = (a[0], a[1], a[2], b[1]);
            (
                "attention (ggml)".into(),
                2.0 * (d + out[0]) * tq * tk * heads * a[3],
            )
        }
        // ggml's direct convolution: out [OW, OH, OC, N], kernel [KW, KH, IC, OC].
        ("CONV_2D", _) => (
            "conv_2d (ggml direct)".into(),
            2.0 * out[0] * out[1] * out[2] * out[3] * a[0] * a[1] * a[2],
        ),
        // out [W, H, OC], kernel [KW, KH, IC, OC]; Winograd's counted as the direct
        // convolution it replaces.
        ("CUSTOM", name @ ("conv_2d" | "conv_2d_winograd")) => (
            name.into(),
            2.0 * out[0] * out[1] * out[2] * a[0] * a[1] * a[2],
        ),
        ("CUSTOM", _) if packed => ("linear_panels".into(), 2.0 * b[0] * out[0] * out[1]),
        ("CUSTOM", _) if packed_int8 => ("linear_panels int8".into(), 2.0 * b[0] * out[0] * out[1]),
        ("CUSTOM", name) => (name.to_owned(), 0.0),
        (op, _) => (op.to_owned(), 0.0),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .ok_or("usage: profile_model MODEL.gguf [threads] [device] [views]")?;
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
    let views: usize = match args.get(4) {
        Some(v) => v.parse()?,
        None => 1,
    };
    let mut model = Model::load(path, &options)?.session()?;
    let device = model.device().clone();
    // The graph of a 640x427 photo (or a scene of `views` of them) at the default process
    // resolution.
    let photo = synthetic::image(640, 427);
    let size = da3::Request::image(&photo).processed_plans(504)?[0];
    // On a device, each node 20 times per call: the launch and the wait count once.
    let repeats = if device.is_cpu() { 1 } else { 20 };
    let times = model.profile_scene(size.width, size.height, views, repeats)?;
    let total: f64 = times.iter().map(|t| t.seconds).sum();
    let mut by_op: BTreeMap<String, (f64, usize, f64)> = BTreeMap::new();
    for t in &times {
        let (label, flops) = classify(t);
        let e = by_op.entry(label).or_default();
        e.0 += t.seconds;
        e.1 += 1;
        e.2 += flops;
    }
    let mut ops: Vec<_> = by_op.into_iter().collect();
    ops.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    let flops: f64 = ops.iter().map(|(_, (_, _, f))| f).sum();
    println!(
        "total {:.1} ms over {} nodes; {:.1} GFLOP counted, {:.1} GFLOP/s over the whole graph",
        total * 1e3,
        times.len(),
        flops / 1e9,
        flops / total / 1e9
    );
    for (op, (s, n, f)) in ops.iter().take(25) {
        let rate = if *f > 0.0 {
            format!("  {:>6.2} GFLOP {:>6.1} GFLOP/s", f / 1e9, f / s / 1e9)
        } else {
            String::new()
        };
        println!(
            "{op:<16} {:>8.1} ms {:>5.1}% ({n} nodes){rate}",
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
