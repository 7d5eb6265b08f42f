//! Command-line interface: one file per subcommand, each `Args` (clap) -> `run`.
//!
//! Exit codes: 0 success, 1 failure (the error and its causes on stderr), 2 bad usage.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod devices;
mod rpc_server;

#[derive(Parser)]
#[command(name = "da3", version, about = "Depth Anything 3 on ggml, with a residency-aware planner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the devices ggml can compute on.
    Devices(devices::Args),
    /// Serve this machine's CPU as a ggml RPC device (no authentication: loopback by default).
    RpcServer(rpc_server::Args),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(args) => devices::run(args),
        Command::RpcServer(args) => rpc_server::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("Error: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}
