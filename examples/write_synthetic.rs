//! Writes a model file with the synthetic weights of a preset (for benchmarks and trials):
//! `cargo run --release --example write_synthetic -- da3-small out.gguf [f32|f16|q8_0|q4_k]`.

use da3::da3::convert::{write_synthetic, WeightType};
use da3::da3::Config;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(preset), Some(out)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: write_synthetic PRESET OUT.gguf [f32|f16|q8_0|q4_k]");
        std::process::exit(2);
    };
    let weight_type: WeightType = args.get(3).map_or(Ok(WeightType::F32), |t| t.parse())?;
    write_synthetic(
        std::path::Path::new(out),
        &Config::preset(preset)?,
        weight_type,
    )?;
    println!("wrote {out}");
    Ok(())
}
