//! `da3 rpc-server`: offers this machine's CPU to ggml RPC clients.

use da3::ggml::{rpc, Device};
use std::net::IpAddr;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on. The RPC protocol has no authentication: anything but loopback
    /// lets every host that can reach the port run code paths on this machine.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// TCP port.
    #[arg(long, default_value_t = 50052)]
    port: u16,
    /// CPU threads for the served backend (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.host.is_loopback() {
        eprintln!(
            "WARNING: serving ggml RPC on {}, which is not loopback. The protocol has no \
             authentication or encryption: any host that reaches port {} can use this server. \
             Only do this on a trusted network.",
            args.host, args.port
        );
    }
    let threads = if args.threads == 0 {
        da3::ggml::default_threads()
    } else {
        args.threads
    };
    let endpoint = format!("{}:{}", args.host, args.port);
    eprintln!("rpc-server: serving {} on {endpoint}", Device::cpu().name());
    rpc::serve(&endpoint, Device::cpu(), threads)?;
    Ok(ExitCode::SUCCESS)
}
