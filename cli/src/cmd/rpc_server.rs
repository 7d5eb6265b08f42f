//! `da3 rpc-server`: offers this machine's CPU to ggml RPC clients.
//!
//! ggml's server loop (C++, unchangeable from here) trusts its input and serves one connection
//! at a time: one hostile message or one idle client takes the whole server down or blocks it.
//! So this command is a supervisor: it listens itself and, for each client that opens with a
//! valid HELLO, starts a worker process (`da3 rpc-server --worker`, ggml's server on a private
//! loopback port, killed with the supervisor) and relays the connection to it through
//! [`da3::ggml::rpc::relay`], which checks every message's framing and size and drops
//! idle clients. A message that still crashes ggml kills that worker, so that connection only.

use crate::process;
use anyhow::Context as _;
use da3::ggml::rpc::relay::{self, Limits, RelayEnd};
use da3::ggml::{rpc, Device};
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on. The RPC protocol has no authentication: any address but loopback
    /// needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// TCP port (0: any free port; the one taken is printed).
    #[arg(long, default_value_t = 50052)]
    port: u16,
    /// CPU threads for the served backend (0: one per physical core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Serve on a non-loopback address. Anyone who can reach the port can use this machine.
    #[arg(long)]
    allow_remote: bool,
    /// Disconnect a client that sends nothing for this many seconds while no answer is due.
    #[arg(long, default_value_t = 300)]
    idle_timeout: u64,
    /// Largest message a client may send, in MiB (a message over it closes the connection).
    #[arg(long, default_value_t = 1024)]
    max_message_mib: u64,
    /// Clients served at once (each has a worker process); more are turned away.
    #[arg(long, default_value_t = 8)]
    max_connections: usize,
    /// Internal: serve one connection with ggml's server on 127.0.0.1:PORT.
    #[arg(long, hide = true)]
    worker: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let threads = if args.threads == 0 {
        da3::ggml::default_threads()
    } else {
        args.threads
    };
    if args.worker {
        let endpoint = format!("127.0.0.1:{}", args.port);
        rpc::serve(&endpoint, Device::cpu(), threads)?;
        return Ok(ExitCode::SUCCESS);
    }
    if !args.host.is_loopback() {
        if !args.allow_remote {
            eprintln!(
                "Error: {} is not a loopback address. ggml RPC has no authentication or \
                 encryption; pass --allow-remote to serve on it anyway.",
                args.host
            );
            return Ok(ExitCode::from(2));
        }
        eprintln!(
            "WARNING: serving ggml RPC on {}, which is not loopback. The protocol has no \
             authentication or encryption: any host that reaches port {} can use this server. \
             Only do this on a trusted network.",
            args.host, args.port
        );
    }
    let listener = TcpListener::bind(SocketAddr::new(args.host, args.port))
        .with_context(|| format!("listening on {}:{}", args.host, args.port))?;
    let addr = listener.local_addr()?;
    // Tests and scripts read the port from this line (`--port 0`).
    outln!("rpc-server: listening on {addr}");
    let _ = std::io::stdout().flush();
    eprintln!(
        "rpc-server: serving {} on {addr}, one worker process per connection",
        Device::cpu().name()
    );
    let limits = Limits {
        max_message: args.max_message_mib.saturating_mul(1 << 20),
        idle_timeout: Duration::from_secs(args.idle_timeout.max(1)),
        answer_timeout: None,
    };
    let exe = std::env::current_exe().context("locating the da3 executable")?;
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let conn = match conn {
            Ok(c) => c,
            Err(e) => {
                eprintln!("rpc-server: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let peer = conn.peer_addr().map_or("?".to_owned(), |a| a.to_string());
        if active.load(Ordering::SeqCst) >= args.max_connections {
            eprintln!(
                "rpc-server: {peer}: turned away ({} connections already)",
                args.max_connections
            );
            drop(conn);
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let (active, exe) = (active.clone(), exe.clone());
        std::thread::spawn(move || {
            let end = serve_connection(conn, &exe, threads, limits);
            eprintln!("rpc-server: {peer}: {end}");
            active.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(ExitCode::SUCCESS)
}

/// A worker process serving one connection; killed (and reaped) on drop.
struct Worker {
    child: Child,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    fn start(exe: &std::path::Path, threads: usize) -> std::io::Result<(Worker, TcpStream)> {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port();
        let mut cmd = Command::new(exe);
        cmd.args(["rpc-server", "--worker", "--port", &port.to_string()])
            .args(["--threads", &threads.to_string()])
            .env("GGML_NO_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        // Spawned from the thread that waits for it: the worker dies with this thread or the
        // supervisor, whichever ends first.
        process::kill_with_parent(&mut cmd);
        let mut worker = Worker {
            child: cmd.spawn()?,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                Ok(s) => return Ok((worker, s)),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {}
            }
            if let Some(status) = worker.child.try_wait()? {
                return Err(std::io::Error::other(format!(
                    "the worker exited before listening ({status})"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn serve_connection(
    conn: TcpStream,
    exe: &std::path::Path,
    threads: usize,
    limits: Limits,
) -> String {
    let mut worker = None;
    let end = relay::relay(
        conn,
        || {
            let (w, upstream) = Worker::start(exe, threads)?;
            worker = Some(w);
            Ok(upstream)
        },
        limits,
    );
    let Some(mut worker) = worker else {
        return end.to_string();
    };
    if matches!(end, RelayEnd::ServerClosed) {
        // The worker closed the connection: it refused a message or crashed. Give it time to
        // end (a crashing process may be writing a core dump) so that the log says which.
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = worker.child.try_wait() {
                return format!("{end} (worker {status})");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    drop(worker);
    end.to_string()
}
