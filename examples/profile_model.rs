//! Where a model's time goes, by op: `cargo run --release --example profile_model -- MODEL.gguf
//! [threads] [device] [views]` (computes the 640x427 synthetic image, or a scene of that many
//! views of it, one node at a time, on the CPU or on a device named as `da3 devices` lists it,
//! e.g. CUDA0; each node waits for the device, and there is computed 20 times in a row so that
//! its launch and wait count once).

use da3::ggml::profile::{op_class_table, op_classes};
use da3::{synthetic, Device, LoadOptions, Model};

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
    print!("{}", op_class_table(&op_classes(&times), 25));
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
