//! Command-line interface: one file per subcommand, each `Args` (clap) -> `run`.
//!
//! Exit codes: 0 success, 1 failure (the error and its causes on stderr), 2 bad usage.

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// `print!` / `println!` that never panic: see [`stdout_failed`].
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($arg)*) {
            $crate::cmd::stdout_failed(e);
        }
    }};
}
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::cmd::stdout_failed(e);
        }
    }};
}

mod batch;
mod bench;
mod common;
mod convert;
mod depth;
mod devices;
mod info;
mod inputs;
mod outputs;
mod plan;
mod quantize;
mod remote;
mod repro;
mod rpc_server;
mod serve;
mod stream;
mod video;
mod view;

#[derive(Parser)]
#[command(
    name = "da3",
    version,
    about = "Depth Anything 3 on ggml: depth, confidence and camera pose from photos",
    long_about = "Depth Anything 3 on ggml: depth, confidence and camera pose from photos.\n\n\
        Get depth from a photo:\n  \
        da3 depth --model depth-anything-small-f32.gguf --input photo.jpg --png depth.png\n\n\
        Models: the GGUF files published for depth-anything.cpp, or `da3 convert` on an \
        official checkpoint folder.",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output (-v: debug, -vv: trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Depth (and confidence, sky, pose, point clouds) for one image or one scene.
    Depth(Box<depth::Args>),
    /// Many images (files, folders, globs, video frames) with one model load per device;
    /// outputs named after the inputs in --out-dir, and summary.json.
    Batch(Box<batch::Args>),
    /// What a model file holds and where its weights live.
    Info(info::Args),
    /// Convert an official checkpoint directory to GGUF.
    Convert(convert::Args),
    /// Quantize the matrix weights of a GGUF model file (f16, bf16, q8_0, q6_k, q5_k, q4_k).
    Quantize(quantize::Args),
    /// Reproduce the Metal NULL-buffer crash and show the residency planner fixing it.
    Repro(repro::Args),
    /// Time a model: load, first image, steady state, memory.
    Bench(bench::Args),
    /// List the devices ggml can compute on.
    Devices(devices::Args),
    /// Serve this machine's CPU as a ggml RPC device (no authentication: loopback by default).
    RpcServer(rpc_server::Args),
    /// Serve depth over HTTP (loopback by default; see /openapi.json).
    Serve(serve::Args),
    /// A video, a folder or a glob of frames as one reconstruction: windows chained by
    /// Sim(3), loop closure, a fused mesh; camera_poses.txt, intrinsic.txt, poses.json.
    Stream(Box<stream::Args>),
    /// Write a self-contained HTML page (WebGL) that shows a PLY or glb point cloud.
    View(view::Args),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell), e.g.
    /// `da3 completions bash > ~/.local/share/bash-completion/completions/da3`.
    Completions(CompletionsArgs),
    /// Internal: computes on one `rpc:` device for `da3 depth` and `da3 batch`, which start
    /// it (jobs on stdin, results on stdout).
    #[command(hide = true)]
    RemoteWorker(Box<remote::WorkerArgs>),
}

#[derive(clap::Args)]
struct CompletionsArgs {
    /// The shell the script is for.
    shell: clap_complete::Shell,
}

/// `--version` in full: the package, the ggml it runs on and the backends built in (asking
/// for the backends initialises them, so only `--version` pays for it).
fn long_version() -> &'static str {
    let mut backends: Vec<String> = da3::ggml::Device::all()
        .iter()
        .map(|d| d.backend_name())
        .filter(|name| !name.is_empty())
        .collect();
    backends.sort();
    backends.dedup();
    let text = format!(
        "{} (ggml {}; backends: {}; CPU: {})",
        env!("CARGO_PKG_VERSION"),
        da3::ggml::ggml_version(),
        backends.join(", "),
        da3::ggml::cpu_features()
    );
    Box::leak(text.into_boxed_str())
}

pub fn main() -> ExitCode {
    crate::process::die_with_parent();
    // ggml's abort handler otherwise forks gdb to print a backtrace of the dying process;
    // a command-line tool reports the error instead. Set before any thread exists (the only
    // time changing the environment is sound); GGML_NO_BACKTRACE already set is kept.
    if std::env::var_os("GGML_NO_BACKTRACE").is_none() {
        std::env::set_var("GGML_NO_BACKTRACE", "1");
    }
    let mut command = Cli::command();
    if std::env::args_os().any(|a| a == "--version") {
        command = command.long_version(long_version());
    }
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    init_logger(cli.verbose, cli.quiet);
    // `serve` handles SIGINT/SIGTERM itself (finishing the requests in flight).
    // `stream` finishes the frames read so far on the first Ctrl-C (and dies on the second).
    let stop = Arc::new(AtomicBool::new(false));
    match cli.command {
        Command::Serve(_) => {}
        Command::Stream(_) => remove_temporary_files_on_signals(Some(stop.clone())),
        _ => remove_temporary_files_on_signals(None),
    }
    let result = match cli.command {
        Command::Depth(args) => depth::run(*args),
        Command::Batch(args) => batch::run(*args),
        Command::Info(args) => info::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Quantize(args) => quantize::run(args),
        Command::Repro(args) => repro::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Devices(args) => devices::run(args),
        Command::RpcServer(args) => rpc_server::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Stream(args) => stream::run(*args, stop),
        Command::View(args) => view::run(args),
        Command::RemoteWorker(args) => remote::run_worker(*args),
        Command::Completions(args) => {
            // Into memory first: the generator panics on a write error (`| head`).
            let mut script = Vec::new();
            clap_complete::generate(args.shell, &mut Cli::command(), "da3", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
            Ok(ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            let mut shown = error.to_string();
            eprintln!("Error: {shown}");
            for cause in error.chain().skip(1) {
                // Many errors repeat their source in their own message: print it once.
                let cause = cause.to_string();
                if !shown.contains(&cause) {
                    eprintln!("  caused by: {cause}");
                }
                shown = cause;
            }
            ExitCode::FAILURE
        }
    }
}

/// Where `out!`/`outln!` go when stdout cannot be written. A reader that closed the pipe
/// early (`da3 info | head -1`) ends the program quietly with the status of a process killed
/// by SIGPIPE (141), as a C tool would end; SIGPIPE itself stays ignored, so that a lost RPC
/// peer is an error rather than a signal. Any other failure (`> /dev/full`) is an error.
/// Either way the temporary files of outputs being written are removed first.
pub(crate) fn stdout_failed(error: std::io::Error) -> ! {
    da3::atomic_file::remove_temporary_files();
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(141);
    }
    eprintln!("Error: cannot write to stdout: {error}");
    std::process::exit(1)
}

/// The library logs through `log`; by default the CLI shows warnings and its own notes
/// (info), `-q` only errors, `-v` also the planner's one-line decisions and other debug
/// lines, `-vv` everything. `RUST_LOG` overrides.
fn init_logger(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn,da3=info,da3_cli=info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_target(false)
        .format_timestamp(None)
        .init();
}

/// On SIGINT or SIGTERM, removes the temporary files of outputs being written, then dies of
/// the signal as it would have (so an interrupted run leaves no `.NAME.*.tmp` behind). With
/// `first_stops`, the first SIGINT only sets that flag (the command finishes early and writes
/// whole files); the next signal dies as above.
fn remove_temporary_files_on_signals(first_stops: Option<Arc<AtomicBool>>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(signals) => signals,
        Err(e) => {
            log::warn!("cannot watch for SIGINT/SIGTERM ({e}); an interrupted write may leave a temporary file");
            return;
        }
    };
    std::thread::spawn(move || {
        let mut pending = signals.forever();
        if let Some(stop) = first_stops {
            match pending.next() {
                Some(SIGINT) => stop.store(true, Ordering::SeqCst),
                Some(signal) => die_of(signal),
                None => return,
            }
        }
        if let Some(signal) = pending.next() {
            die_of(signal);
        }
    });
}

/// Removes the temporary files of outputs being written and dies of `signal`.
fn die_of(signal: i32) -> ! {
    da3::atomic_file::remove_temporary_files();
    let _ = signal_hook::low_level::emulate_default_handler(signal);
    std::process::exit(128 + signal)
}
