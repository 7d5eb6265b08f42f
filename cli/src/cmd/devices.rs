//! `da3 devices`: what ggml can compute on here.

use da3::ggml::{ggml_version, Device};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Also list the device of an RPC server at HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    rpc: Option<String>,
    /// Print the list as JSON: `ggml` and `devices` (name, kind, backend, free and total
    /// bytes, description).
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(endpoint) = &args.rpc {
        Device::rpc(endpoint)?;
    }
    if args.json {
        let devices: Vec<serde_json::Value> = Device::all()
            .into_iter()
            .map(|device| {
                let (free, total) = device.memory();
                serde_json::json!({
                    "name": device.name(),
                    "kind": format!("{:?}", device.kind()),
                    "backend": device.backend_name(),
                    "free_bytes": free,
                    "total_bytes": total,
                    "description": device.description(),
                })
            })
            .collect();
        let list = serde_json::json!({"ggml": ggml_version(), "devices": devices});
        outln!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!("ggml {}", ggml_version());
    for device in Device::all() {
        let (free, total) = device.memory();
        outln!(
            "{:<24} {:<14} {:>8.1} / {:>8.1} GiB free  {}",
            device.name(),
            format!("{:?}", device.kind()),
            free as f64 / (1u64 << 30) as f64,
            total as f64 / (1u64 << 30) as f64,
            device.description()
        );
    }
    Ok(ExitCode::SUCCESS)
}
