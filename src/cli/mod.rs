//! Command-line interface: one file per subcommand, each `Args` (clap) -> `run`.
//!
//! Exit codes: 0 success, 1 failure (the error and its causes on stderr), 2 bad usage.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench;
mod common;
mod convert;
mod depth;
mod devices;
mod info;
mod repro;
mod rpc_server;

#[derive(Parser)]
#[command(
    name = "da3",
    version,
    about = "Depth Anything 3 on ggml, with a residency-aware planner"
)]
struct Cli {
    /// Without a subcommand: `repro` on the built-in model.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Depth (and confidence, sky, pose) for one image.
    Depth(depth::Args),
    /// What a model file holds and where its weights live.
    Info(info::Args),
    /// Convert an official checkpoint directory to GGUF.
    Convert(convert::Args),
    /// Reproduce the Metal NULL-buffer crash and show the residency planner fixing it.
    Repro(repro::Args),
    /// Time a model: load, first image, steady state, memory.
    Bench(bench::Args),
    /// List the devices ggml can compute on.
    Devices(devices::Args),
    /// Serve this machine's CPU as a ggml RPC device (no authentication: loopback by default).
    RpcServer(rpc_server::Args),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // No subcommand: the README's run command, `repro` with its defaults.
    let command = cli.command.unwrap_or_else(|| {
        Cli::parse_from(["da3", "repro"])
            .command
            .expect("repro parses")
    });
    let result = match command {
        Command::Depth(args) => depth::run(args),
        Command::Info(args) => info::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Repro(args) => repro::run(args),
        Command::Bench(args) => bench::run(args),
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
