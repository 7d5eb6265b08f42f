//! `da3 repro`: reproduces the Apple M4 / Metal crash scenario and shows the planner fixing it.
//!
//! The crashing C++ engine kept `vit.pos_embed`, `vit.camera_token` and `vit.norm.weight/bias`
//! in plain host memory (no buffer) while every op ran on the GPU through ggml's single-backend
//! allocator. This command loads the same layout on a device with separate memory (Metal or
//! CUDA when ggml has them, else a `da3 rpc-server` child process on loopback), then:
//! 1. runs the unchecked gallocr path in a child process and reports how it ended;
//! 2. runs the planned path and compares its depth with a CPU run;
//! 3. exits 0 only when the planned path is correct and, on a separate-memory device, the
//!    unchecked path failed.

use super::common::{load_input, ConvPrecisionArg, DeviceArgs, ModelArgs};
use crate::process;
use anyhow::{bail, Context as _};
use da3::ggml::{rpc, Device, DeviceKind};
use da3::residency;
use da3::{LoadOptions, Policy};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// The tensors the crashing engine left without a buffer.
pub const CRASH_LAYOUT: &[&str] = &[
    "vit.pos_embed",
    "vit.camera_token",
    "vit.norm.weight",
    "vit.norm.bias",
];

/// Relative error under which the planned path counts as matching the same device with every
/// weight resident (the same kernels, so only the memory layout differs).
const TOLERANCE: f64 = 1e-5;
/// Different kernels (a GPU against the CPU) must still agree this closely.
const MIN_CORRELATION_WITH_CPU: f64 = 0.9999;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Image (PNG, JPEG, WebP, TIFF, BMP or GIF). Default: the built-in synthetic 640x427 image.
    #[arg(long)]
    input: Option<PathBuf>,
    /// Device for the scenario: a GPU name, `rpc:HOST:PORT`, or `auto` (a GPU if ggml has one,
    /// else an RPC server started here on loopback).
    #[arg(long, default_value = "auto")]
    device: String,
    /// The planner's policy for the planned path: route, mirror or strict.
    #[arg(long, default_value = "route")]
    policy: Policy,
    /// CPU threads (0: one per physical core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    #[arg(long, default_value_t = da3::DEFAULT_PROCESS_RES)]
    process_res: usize,
    /// Internal: run the unchecked path in this process (the parent runs it as a child).
    #[arg(long, hide = true)]
    child_unchecked: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.child_unchecked {
        return run_unchecked_child(&args);
    }
    if args.policy == Policy::Unchecked {
        bail!("--policy unchecked is what the child process runs; choose route, mirror or strict");
    }
    let mut server = None;
    let device_spec = match args.device.as_str() {
        "auto" => match Device::best() {
            d if d.kind() != DeviceKind::Cpu => d.name(),
            _ => {
                let s = RpcServer::start(args.threads)?;
                let spec = format!("rpc:{}", s.endpoint);
                server = Some(s);
                spec
            }
        },
        other => other.to_owned(),
    };
    let device_args = DeviceArgs {
        device: device_spec.parse()?,
        threads: args.threads,
        conv_precision: ConvPrecisionArg::Auto,
        plan: Vec::new(),
    };
    let image = load_input(args.input.as_ref(), &Default::default())?;
    outln!(
        "da3 repro: model {}, device {device_spec}",
        args.model.describe()
    );
    outln!(
        "layout of the crashing engine: {} in host memory with no buffer, the rest on the device",
        CRASH_LAYOUT.join(", ")
    );

    // Reference: every weight on the CPU.
    let cpu_only = DeviceArgs {
        device: da3::Device::Cpu,
        threads: args.threads,
        conv_precision: ConvPrecisionArg::Auto,
        plan: Vec::new(),
    };
    let reference = args.model.load(&cpu_only.options()?)?;
    let request = da3::Request::image(&image).process_res(args.process_res);
    let expected = reference.session()?.run(&request)?.into_single()?.depth;
    drop(reference);

    // 1. The unchecked path, in a child process.
    outln!("\n[1] unchecked gallocr path (child process)");
    let outcome = run_child(&args, &device_spec)?;
    outln!("    {}", outcome.describe());
    if let Some(server) = server.as_mut() {
        server.ensure_running(args.threads)?;
    }

    // 2. The planned path.
    outln!("\n[2] planned path, policy {:?}", args.policy);
    let options = LoadOptions {
        policy: args.policy,
        host_only: CRASH_LAYOUT.iter().map(|s| s.to_string()).collect(),
        log_decisions: false,
        ..device_args.options()?
    };
    let model = args.model.load(&options)?;
    let separate_memory = model.device().kind() != DeviceKind::Cpu;
    let mut model = model.session()?;
    let processed = request.processed_plans(args.process_res)?[0];
    match model.residency_report(processed.width, processed.height) {
        Err(da3::Error::Residency(residency::Error::Refused(report))) => {
            outln!("{report}");
            outln!("strict: refused, as asked (the report above is the error)");
            return Ok(ExitCode::FAILURE);
        }
        other => other?,
    };
    let raw = request.clone().raw_outputs(true);
    let prediction = model.run(&raw)?.into_single()?;
    out!("{}", model.last_report().expect("set by run"));
    drop(model);
    let cmp = compare(&prediction.depth, &expected);
    outln!(
        "    depth vs CPU: max abs {:.3e}, max rel {:.3e}, correlation {:.9}",
        cmp.max_abs,
        cmp.max_rel,
        cmp.corr
    );
    // On a GPU the kernels differ from the CPU's; the exact check is against the same device
    // with every weight resident.
    let resident_cmp = if separate_memory {
        let resident = args.model.load(&device_args.options()?)?;
        let resident_depth = resident.session()?.run(&raw)?.into_single()?.depth;
        let c = compare(&prediction.depth, &resident_depth);
        outln!(
            "    depth vs {device_spec} with every weight resident: max abs {:.3e}, max rel {:.3e}",
            c.max_abs,
            c.max_rel
        );
        c
    } else {
        cmp
    };

    // 3. Verdict.
    let planned_ok = resident_cmp.max_rel <= TOLERANCE && cmp.corr >= MIN_CORRELATION_WITH_CPU;
    let unchecked_failed = !outcome.success;
    outln!(
        "\nresult: planned path {}; unchecked path {}",
        if planned_ok { "correct" } else { "WRONG" },
        if unchecked_failed {
            "failed as the bug predicts"
        } else {
            "completed"
        }
    );
    let ok = planned_ok && (unchecked_failed || !separate_memory);
    if separate_memory && !unchecked_failed {
        outln!("note: the device has separate memory, yet the unchecked path did not fail: the scenario did not reproduce");
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[derive(Clone, Copy)]
struct Comparison {
    max_abs: f64,
    max_rel: f64,
    corr: f64,
}

fn compare(ours: &[f32], expected: &[f32]) -> Comparison {
    let n = ours.len().min(expected.len()) as f64;
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (&a, &b) in ours.iter().zip(expected) {
        let d = (a as f64 - b as f64).abs();
        max_abs = max_abs.max(d);
        max_rel = max_rel.max(d / (b as f64).abs().max(1e-12));
    }
    let ma = ours.iter().map(|&v| v as f64).sum::<f64>() / n;
    let mb = expected.iter().map(|&v| v as f64).sum::<f64>() / n;
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (&a, &b) in ours.iter().zip(expected) {
        let (x, y) = (a as f64 - ma, b as f64 - mb);
        cov += x * y;
        va += x * x;
        vb += y * y;
    }
    let corr = if va > 0.0 && vb > 0.0 {
        cov / (va * vb).sqrt()
    } else {
        f64::NAN
    };
    if ours.len() != expected.len() {
        return Comparison {
            max_abs: f64::INFINITY,
            max_rel: f64::INFINITY,
            corr: f64::NAN,
        };
    }
    Comparison {
        max_abs,
        max_rel,
        corr,
    }
}

/// How the unchecked child ended.
struct ChildOutcome {
    success: bool,
    status: String,
    last_line: String,
}

impl ChildOutcome {
    fn describe(&self) -> String {
        if self.last_line.is_empty() {
            self.status.clone()
        } else {
            format!("{}; last line: {}", self.status, self.last_line)
        }
    }
}

fn run_child(args: &Args, device_spec: &str) -> anyhow::Result<ChildOutcome> {
    let exe = std::env::current_exe().context("locating the da3 executable")?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "repro",
        "--child-unchecked",
        "--device",
        device_spec,
        "--threads",
        &args.threads.to_string(),
        "--process-res",
        &args.process_res.to_string(),
    ]);
    if let Some(model) = &args.model.model {
        cmd.arg("--model").arg(model);
    }
    if let Some(input) = &args.input {
        cmd.arg("--input").arg(input);
    }
    // Dies with this process: a killed `da3 repro` leaves no child computing.
    process::kill_with_parent(&mut cmd);
    // ggml's abort handler would attach gdb for a backtrace; the outcome is what matters here.
    let out = cmd
        .env("GGML_NO_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .context("starting the unchecked child")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last_line = stderr
        .lines()
        .chain(stdout.lines())
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    // ggml prefixes assertions with the full source path; from `ggml/src/` on is enough.
    let last_line = last_line
        .find("ggml/src/")
        .map_or(last_line, |i| &last_line[i..])
        .to_owned();
    Ok(ChildOutcome {
        success: out.status.success(),
        status: describe_status(&out.status),
        last_line,
    })
}

#[cfg(unix)]
fn describe_status(status: &std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (_, Some(sig)) => format!("killed by signal {sig} ({})", signal_name(sig)),
        (Some(0), _) => "exited normally (status 0)".to_owned(),
        (Some(code), _) => format!(
            "exited with status {code}{}",
            if code == 134 { " (abort)" } else { "" }
        ),
        _ => "ended".to_owned(),
    }
}

#[cfg(not(unix))]
fn describe_status(status: &std::process::ExitStatus) -> String {
    format!("{status}")
}

#[cfg(unix)]
fn signal_name(sig: i32) -> &'static str {
    match sig {
        6 => "SIGABRT",
        11 => "SIGSEGV",
        7 => "SIGBUS",
        9 => "SIGKILL",
        4 => "SIGILL",
        _ => "signal",
    }
}

/// The child: the crash layout, unchecked, on the device. Expected to die on a GPU or RPC.
fn run_unchecked_child(args: &Args) -> anyhow::Result<ExitCode> {
    let device_args = DeviceArgs {
        device: args.device.parse()?,
        threads: args.threads,
        conv_precision: ConvPrecisionArg::Auto,
        plan: Vec::new(),
    };
    let options = LoadOptions {
        policy: Policy::Unchecked,
        host_only: CRASH_LAYOUT.iter().map(|s| s.to_string()).collect(),
        ..device_args.options()?
    };
    let model = args.model.load(&options)?;
    let image = load_input(args.input.as_ref(), &Default::default())?;
    let request = da3::Request::image(&image).process_res(args.process_res);
    let prediction = model.session()?.run(&request)?.into_single()?;
    let finite = prediction.depth.iter().all(|v| v.is_finite());
    outln!(
        "unchecked compute returned ({} values, all finite: {finite})",
        prediction.depth.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// A `da3 rpc-server` child on a free loopback port: a device with separate memory on any
/// machine. Killed on drop.
struct RpcServer {
    child: Child,
    endpoint: String,
}

impl RpcServer {
    fn start(threads: usize) -> anyhow::Result<RpcServer> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let endpoint = format!("127.0.0.1:{port}");
        let exe = std::env::current_exe().context("locating the da3 executable")?;
        let child = server_command(&exe, &port.to_string(), threads)
            .spawn()
            .context("starting `da3 rpc-server`")?;
        let server = RpcServer { child, endpoint };
        rpc::wait_until_listening(&server.endpoint, Duration::from_secs(20))
            .context("waiting for the RPC server")?;
        outln!(
            "started `da3 rpc-server` on {} (pid {})",
            server.endpoint,
            server.child.id()
        );
        Ok(server)
    }

    /// The unchecked run's connection fails on the server (its worker for that connection
    /// refuses or crashes on the NULL data); the `rpc-server` supervisor gives every connection
    /// its own worker and goes on serving. Should it have ended all the same, start another on
    /// the same port.
    fn ensure_running(&mut self, threads: usize) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => return Ok(()),
            Ok(Some(status)) => outln!(
                "    the RPC server died too ({}); restarting it",
                describe_status(&status)
            ),
            Err(e) => outln!("    the RPC server's status is unknown ({e}); restarting it"),
        }
        let port = self.endpoint.rsplit(':').next().unwrap_or("0").to_owned();
        let exe = std::env::current_exe()?;
        self.child = server_command(&exe, &port, threads).spawn()?;
        let deadline = Instant::now() + Duration::from_secs(20);
        rpc::wait_until_listening(&self.endpoint, deadline - Instant::now())?;
        Ok(())
    }
}

/// `da3 rpc-server` on loopback `port`, killed by the kernel when this process dies (SIGKILL
/// included: `Drop` alone would not run), so a killed `da3 repro` leaves no server behind.
fn server_command(exe: &std::path::Path, port: &str, threads: usize) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args([
        "rpc-server",
        "--port",
        port,
        "--threads",
        &threads.to_string(),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    process::kill_with_parent(&mut cmd);
    cmd
}

impl Drop for RpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
