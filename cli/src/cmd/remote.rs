//! `rpc:` devices computed in a child process, so that a remote fault is an error.
//!
//! ggml's RPC client aborts the process that runs it (`GGML_ABORT`, SIGABRT) when the
//! connection to the server is lost or the server answers garbage, and waits forever on a
//! server that stops answering; C++ inside ggml, neither can be caught in-process (see
//! `da3::ggml::rpc`). So `da3 depth` and `da3 batch` never run that client in the process that
//! holds the run: each `rpc:` device gets a worker, `da3 remote-worker` (a hidden subcommand,
//! killed with its parent), which loads the model on the device and computes the jobs it reads
//! on stdin, answering each on stdout. The parent writes every output file, so a worker that
//! dies leaves nothing half-written, and it waits for each answer at most `--device-timeout`
//! (once for the model load, then once per job), after which it kills the worker.
//!
//! The protocol, one frame per message (integers little-endian):
//!
//! - frame: `DA3W`, kind (u8), payload length (u64), payload;
//! - parent to worker: `JOB`; closing stdin ends the worker;
//! - worker to parent: `READY` after loading (the device's name), then per job `OUTPUT` or
//!   `FAILED` (an error the job met: the device still works); `FAILED` instead of `READY`:
//!   the model did not load (the worker then exits).
//!
//! Payload fields: `u64`; `str` and `bytes` (u64 length, then the bytes); `f32s`/`f64s` (u64
//! count, then the values' bits, so numbers cross unchanged); `opt` (u8 0 or 1, then the
//! value). `JOB`: process_res u64, reference str (`first`, ..., or a view index), ray_pose u8,
//! views u64, per view name str, width u64, height u64, RGB bytes; poses opt of, per view, 16
//! f64s (world-to-camera 4x4) and 9 f64s (intrinsics). `OUTPUT`: views u64, per view width u64,
//! height u64, depth f32s, confidence opt f32s, sky opt f32s, pose opt 9 f32s (intrinsics) and 12
//! f32s (extrinsics), processed image width u64, height u64, RGB bytes, input width u64, input
//! height u64, name str; then reference u64, strategy str, pose_scale and metric_scale each
//! opt f64s (of one value). `READY`: device name str. `FAILED`: u64 count, then the error's
//! messages str, outermost first. The CLI asks for no probes and no ray maps: not carried.

use super::common::{ConvPrecisionArg, DeviceArgs, Loaded, ModelArgs};
use crate::process;
use anyhow::{bail, Context as _};
use da3::{
    DepthUnit, Focal, FocalSource, Image, KnownPose, LoadOptions, MetricFocal, Output, Policy,
    Prediction, RefViewStrategy, Request,
};
use std::ffi::OsString;
use std::io::{BufRead as _, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// `--device-timeout`'s default, in seconds: far above a model load or an image on any
/// device this runs on, so that only a stalled device reaches it.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

const MAGIC: &[u8; 4] = b"DA3W";
const JOB: u8 = 1;
const READY: u8 = 2;
const OUTPUT: u8 = 3;
const FAILED: u8 = 4;
/// The largest frame either side accepts (a 32768-pixel-square image is 3 GiB of RGB).
const MAX_FRAME: u64 = 1 << 34;

/// Internal: `da3 remote-worker`, the process that runs ggml's RPC client for one device.
#[derive(clap::Args, Debug, Clone)]
pub struct WorkerArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long)]
    metric_model: Option<PathBuf>,
    #[command(flatten)]
    device: DeviceArgs,
    #[arg(long)]
    policy: String,
    #[arg(long)]
    process_res: Option<usize>,
    #[arg(long)]
    camera_encoder: bool,
    #[arg(long)]
    quiet_decisions: bool,
    /// The metric model's focal length in pixels of the input (`--focal`), for every job.
    #[arg(long)]
    focal: Option<f64>,
    /// The metric model's horizontal field of view (`--fov`), for every job.
    #[arg(long)]
    fov: Option<f64>,
}

impl WorkerArgs {
    /// What a worker loads: `options` as the parent would load it in-process (the device an
    /// `rpc:` one), the model `model` (and the nested pair's `metric_model`).
    pub fn new(
        model: &ModelArgs,
        metric_model: Option<PathBuf>,
        device: DeviceArgs,
        options: &LoadOptions,
    ) -> WorkerArgs {
        WorkerArgs {
            model: model.clone(),
            metric_model,
            device,
            policy: policy_name(options.policy).to_owned(),
            process_res: options.process_res,
            camera_encoder: options.camera_encoder,
            quiet_decisions: !options.log_decisions,
            focal: None,
            fov: None,
        }
    }

    /// The focal length every job's request gives a metric model ([`Request::focal`]).
    pub fn with_focal(mut self, focal: Option<&Focal>) -> WorkerArgs {
        (self.focal, self.fov) = match focal {
            Some(Focal::Pixels(f)) => (Some(*f), None),
            Some(Focal::Fov(deg)) => (None, Some(*deg)),
            // Per-view intrinsics come with a job's known poses, not with the worker.
            Some(Focal::Intrinsics(_)) | None => (None, None),
        };
        self
    }

    /// The device's name as the user wrote it (`rpc:HOST:PORT`).
    pub fn device(&self) -> String {
        self.device.device.to_string()
    }

    fn command_line(&self) -> Vec<OsString> {
        let mut line: Vec<OsString> = vec!["remote-worker".into()];
        let mut flag = |name: &str, value: OsString| {
            line.push(name.into());
            line.push(value);
        };
        if let Some(model) = &self.model.model {
            flag("--model", model.into());
        }
        if let Some(metric) = &self.metric_model {
            flag("--metric-model", metric.into());
        }
        flag("--device", self.device.device.to_string().into());
        flag("--threads", self.device.threads.to_string().into());
        let precision = match self.device.conv_precision {
            ConvPrecisionArg::Auto => "auto",
            ConvPrecisionArg::F32 => "f32",
            ConvPrecisionArg::F16 => "f16",
        };
        flag("--conv-precision", precision.into());
        for plan in &self.device.plan {
            flag("--plan", plan.into());
        }
        flag("--policy", self.policy.clone().into());
        if let Some(res) = self.process_res {
            flag("--process-res", res.to_string().into());
        }
        if self.camera_encoder {
            line.push("--camera-encoder".into());
        }
        if self.quiet_decisions {
            line.push("--quiet-decisions".into());
        }
        // The parent's verbosity (-q, -v, -vv), which set its log level.
        match log::max_level() {
            log::LevelFilter::Off | log::LevelFilter::Error => line.push("-q".into()),
            log::LevelFilter::Debug => line.push("-v".into()),
            log::LevelFilter::Trace => line.push("-vv".into()),
            _ => {}
        }
        line
    }
}

fn policy_name(policy: Policy) -> &'static str {
    match policy {
        Policy::Auto => "auto",
        Policy::Route => "route",
        Policy::Mirror => "mirror",
        Policy::Strict => "strict",
        Policy::Unchecked => "unchecked",
    }
}

/// One computation, as the parent sends it and the worker (or an in-process predictor) runs
/// it: what a [`Request`] holds, in fields the protocol can carry.
pub struct Job<'a> {
    pub images: &'a [Image],
    pub names: Vec<String>,
    /// `None`: the model's own.
    pub process_res: Option<usize>,
    pub reference: RefViewStrategy,
    pub ray_pose: bool,
    pub poses: Option<&'a [KnownPose]>,
    /// Also the scene's 3D Gaussians (in-process only: the worker protocol does not carry
    /// them).
    pub gaussians: bool,
}

impl Job<'_> {
    /// The request, with the focal length a metric model's metres take (`--focal`/`--fov`).
    pub fn request_with(&self, focal: Option<&Focal>) -> Request<'_> {
        match focal {
            Some(focal) => self.request().focal(focal.clone()),
            None => self.request(),
        }
    }

    pub fn request(&self) -> Request<'_> {
        let mut request = Request::new(self.images)
            .names(self.names.clone())
            .reference(self.reference)
            .ray_pose(self.ray_pose)
            .gaussians(self.gaussians);
        if let Some(res) = self.process_res {
            request = request.process_res(res);
        }
        match self.poses {
            Some(poses) => request.poses(poses),
            None => request,
        }
    }
}

// --- the worker ------------------------------------------------------------------------------

/// `da3 remote-worker`: loads the model, answers `READY`, then computes every `JOB` until
/// stdin closes. Its stdout carries frames only (logs go to stderr).
pub fn run_worker(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let mut answers = std::io::stdout().lock();
    let mut jobs = BufReader::new(std::io::stdin().lock());
    let loaded = (|| {
        let policy: Policy = args.policy.parse().map_err(anyhow::Error::msg)?;
        let options = LoadOptions {
            policy,
            process_res: args.process_res,
            camera_encoder: args.camera_encoder,
            log_decisions: !args.quiet_decisions,
            ..args.device.options()?
        };
        let model = Loaded::load(&args.model, args.metric_model.as_deref(), &options)?;
        model.predictor()
    })();
    let mut predictor = match loaded {
        Ok(predictor) => predictor,
        Err(error) => {
            write_frame(&mut answers, FAILED, &error_payload(&error))?;
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut ready = Encoder::default();
    ready.str(&predictor.device_name());
    write_frame(&mut answers, READY, &ready.0)?;
    while let Some((kind, payload)) = read_frame(&mut jobs)? {
        if kind != JOB {
            bail!("remote-worker: frame kind {kind} where a job was expected");
        }
        let (images, poses, job) = decode_job(&payload)?;
        let job = Job {
            images: &images,
            poses: poses.as_deref(),
            ..job
        };
        let focal = match (args.focal, args.fov) {
            (Some(px), _) => Some(Focal::Pixels(px)),
            (None, Some(deg)) => Some(Focal::Fov(deg)),
            (None, None) => None,
        };
        match predictor.run(&job.request_with(focal.as_ref())) {
            Ok(output) => write_frame(&mut answers, OUTPUT, &encode_output(&output))?,
            Err(error) => write_frame(
                &mut answers,
                FAILED,
                &error_payload(&anyhow::Error::new(error)),
            )?,
        }
    }
    Ok(ExitCode::SUCCESS)
}

// --- the parent's side -----------------------------------------------------------------------

/// Why a remote device was given up: it died, answered what the protocol does not allow, or
/// stalled past the timeout. Its worker is gone.
#[derive(Debug, Clone)]
pub struct DeviceFailure {
    pub reason: String,
}

impl std::fmt::Display for DeviceFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the remote device failed ({})", self.reason)
    }
}

/// What the worker said, as the thread that reads its stdout hands it over.
type Frame = Result<(u8, Vec<u8>), String>;

/// A worker process computing on one `rpc:` device; killed (and reaped) when dropped.
pub struct RemoteDevice {
    /// `rpc:HOST:PORT`.
    pub device: String,
    child: Child,
    jobs: Option<ChildStdin>,
    answers: mpsc::Receiver<Frame>,
    /// What ggml said of the connection on the worker's stderr, which is otherwise forwarded.
    ggml_said: Arc<Mutex<GgmlSaid>>,
    stderr_forwarder: Option<std::thread::JoinHandle<()>>,
    timeout: Duration,
    started: Instant,
    device_name: String,
}

impl Drop for RemoteDevice {
    fn drop(&mut self) {
        self.jobs.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RemoteDevice {
    /// Starts the worker, which starts loading at once. Spawn from a thread that outlives the
    /// worker (the worker dies with it, see [`process::kill_with_parent`]).
    pub fn start(args: &WorkerArgs, timeout: Duration) -> anyhow::Result<RemoteDevice> {
        let exe = std::env::current_exe().context("locating the da3 executable")?;
        let mut command = Command::new(exe);
        command
            .args(args.command_line())
            .env("GGML_NO_BACKTRACE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        process::kill_with_parent(&mut command);
        // Its own process group: a Ctrl-C at the terminal reaches the parent only, which ends
        // the run (and with it the worker) instead of seeing its device fail first.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .spawn()
            .with_context(|| format!("--device {}: starting its worker process", args.device()))?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let (stdout, stderr) = stdout.zip(stderr).expect("both piped");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            let mut stdout = BufReader::new(stdout);
            loop {
                let frame = match read_frame(&mut stdout) {
                    Ok(Some(frame)) => Ok(frame),
                    Ok(None) => return,
                    Err(e) => Err(e.to_string()),
                };
                let end = frame.is_err();
                if tx.send(frame).is_err() || end {
                    return;
                }
            }
        });
        let ggml_said = Arc::new(Mutex::new(GgmlSaid::default()));
        let said = ggml_said.clone();
        let stderr_forwarder = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // What ggml says of the connection becomes the reason of the device failure.
                if !said.lock().unwrap_or_else(|e| e.into_inner()).hear(&line) {
                    eprintln!("{line}");
                }
            }
        });
        Ok(RemoteDevice {
            device: args.device(),
            jobs: child.stdin.take(),
            child,
            answers,
            ggml_said,
            stderr_forwarder: Some(stderr_forwarder),
            timeout,
            started: Instant::now(),
            device_name: String::new(),
        })
    }

    /// Waits for the model to load (at most the timeout from the start): an error the load
    /// met (as a local load would report it), or the device's failure.
    pub fn wait_ready(&mut self) -> Result<anyhow::Result<()>, DeviceFailure> {
        let deadline = self.started + self.timeout;
        let (kind, payload) = self.answer(deadline, "the model load")?;
        match kind {
            READY => {
                let mut fields = Decoder(&payload);
                let name = fields.str().and_then(|n| fields.end().map(|()| n));
                match name {
                    Ok(name) => self.device_name = name,
                    Err(e) => return Err(self.malformed(e)),
                }
                Ok(Ok(()))
            }
            FAILED => match decode_error(&payload) {
                Ok(error) => Ok(Err(error)),
                Err(e) => Err(self.malformed(e)),
            },
            other => Err(self.malformed(anyhow::anyhow!("frame kind {other} before READY"))),
        }
    }

    /// The device's name as ggml reports it (after [`RemoteDevice::wait_ready`]).
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Computes `job` on the device: its output or the error it met, or the device's failure
    /// (the worker is then gone: drop this).
    pub fn run(&mut self, job: &Job) -> Result<anyhow::Result<Output>, DeviceFailure> {
        if job.gaussians {
            return Ok(Err(anyhow::anyhow!(
                "--gs-ply on an `rpc:` device: the worker protocol does not carry 3D Gaussians; \
                 run on a local device"
            )));
        }
        let payload = encode_job(job);
        let sent = match self.jobs.as_mut() {
            Some(jobs) => write_frame(jobs, JOB, &payload),
            None => Err(std::io::Error::other("the worker's stdin is closed")),
        };
        if let Err(e) = sent {
            // The worker is gone or going: its exit says why.
            return Err(self.ended(&format!("sending it the job: {e}")));
        }
        let deadline = Instant::now() + self.timeout;
        let (kind, payload) = self.answer(deadline, "the image")?;
        match kind {
            OUTPUT => decode_output(&payload)
                .map(Ok)
                .map_err(|e| self.malformed(e)),
            FAILED => decode_error(&payload)
                .map(Err)
                .map_err(|e| self.malformed(e)),
            other => Err(self.malformed(anyhow::anyhow!("frame kind {other} for a job"))),
        }
    }

    /// The worker's next frame before `deadline`; past it, the worker is killed.
    fn answer(&mut self, deadline: Instant, what: &str) -> Result<(u8, Vec<u8>), DeviceFailure> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.answers.recv_timeout(left) {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(e)) => Err(self.malformed(anyhow::anyhow!(e))),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                self.stop();
                Err(DeviceFailure {
                    reason: format!(
                        "stalled: no answer for {what} within {} s (--device-timeout); its \
                         worker was killed",
                        self.timeout.as_secs()
                    ),
                })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(self.ended("")),
        }
    }

    fn stop(&mut self) {
        self.jobs.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(forwarder) = self.stderr_forwarder.take() {
            let _ = forwarder.join();
        }
    }

    /// The server's endpoint if nothing accepts connections there any more.
    fn server_gone(&self) -> Option<&str> {
        let endpoint = self.device.strip_prefix("rpc:")?;
        let probe = da3::ggml::rpc::probe(endpoint, Duration::from_secs(2));
        matches!(probe, Err(da3::ggml::Error::RpcUnreachable { .. })).then_some(endpoint)
    }

    /// The worker answered something the protocol does not allow.
    fn malformed(&mut self, error: anyhow::Error) -> DeviceFailure {
        self.stop();
        DeviceFailure {
            reason: format!("its worker's answer is malformed: {error:#}"),
        }
    }

    /// The worker closed its stdout: it ended, or is ending. Why, from its exit and ggml's
    /// abort message.
    fn ended(&mut self, while_doing: &str) -> DeviceFailure {
        self.jobs.take();
        // A worker that closed its stdout is exiting; one that does not is stopped.
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        self.stop();
        let said = std::mem::take(&mut *self.ggml_said.lock().unwrap_or_else(|e| e.into_inner()));
        let mut reason = match (said.transport, said.abort, status) {
            (Some(transport), _, _) => format!("connection lost; ggml: {transport}"),
            // ggml says the same of a closed connection and of garbage: ask the server.
            (None, Some(abort), _) if abort.contains("Remote RPC server") => {
                match self.server_gone() {
                    Some(endpoint) => format!(
                        "connection lost: nothing accepts connections at {endpoint} any more; \
                         ggml: {abort}"
                    ),
                    None => format!("connection lost or a malformed answer; ggml: {abort}"),
                }
            }
            (None, Some(abort), _) => format!("its worker aborted; ggml: {abort}"),
            (None, None, Some(status)) => format!("its worker ended: {status}"),
            (None, None, None) => "its worker closed its output and did not exit".to_owned(),
        };
        if !while_doing.is_empty() {
            reason = format!("{reason}; {while_doing}");
        }
        DeviceFailure { reason }
    }
}

/// The lines of a worker's stderr that say why ggml's RPC client gave up.
#[derive(Default)]
struct GgmlSaid {
    /// The first `send failed (...)` / `recv failed (...)` of ggml's TCP transport: the
    /// connection broke (the peer closed it, or reset it).
    transport: Option<String>,
    /// The message of ggml's abort (`file.cpp:LINE: message`).
    abort: Option<String>,
}

impl GgmlSaid {
    /// Keeps `line` if it is one of those; whether it was.
    fn hear(&mut self, line: &str) -> bool {
        if line.starts_with("send failed (") || line.starts_with("recv failed (") {
            self.transport.get_or_insert_with(|| line.to_owned());
            return true;
        }
        match ggml_abort_message(line) {
            Some(message) => {
                self.abort = Some(message);
                true
            }
            None => false,
        }
    }
}

/// `file.cpp:LINE: message` from ggml's abort handler: the message.
fn ggml_abort_message(line: &str) -> Option<String> {
    let mut parts = line.splitn(3, ':');
    let (file, number, message) = (parts.next()?, parts.next()?, parts.next()?);
    let from_ggml = file.contains("ggml") && (file.ends_with(".cpp") || file.ends_with(".c"));
    let numbered = !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit());
    (from_ggml && numbered).then(|| message.trim().to_owned())
}

// --- frames ----------------------------------------------------------------------------------

fn write_frame(out: &mut impl Write, kind: u8, payload: &[u8]) -> std::io::Result<()> {
    out.write_all(MAGIC)?;
    out.write_all(&[kind])?;
    out.write_all(&(payload.len() as u64).to_le_bytes())?;
    out.write_all(payload)?;
    out.flush()
}

/// The next frame, or `None` at the end of the stream (between frames).
fn read_frame(input: &mut impl Read) -> std::io::Result<Option<(u8, Vec<u8>)>> {
    let mut head = [0u8; 13];
    let mut got = 0;
    while got < head.len() {
        match input.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    if &head[..4] != MAGIC {
        return Err(std::io::Error::other(format!(
            "not a frame (starts {:?})",
            String::from_utf8_lossy(&head)
        )));
    }
    let len = u64::from_le_bytes(head[5..].try_into().expect("8 bytes"));
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!(
            "a frame of {len} bytes (at most {MAX_FRAME})"
        )));
    }
    // Read as it comes: the length is not trusted for an allocation.
    let mut payload = Vec::new();
    input.take(len).read_to_end(&mut payload)?;
    if payload.len() as u64 != len {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some((head[4], payload)))
}

#[derive(Default)]
struct Encoder(Vec<u8>);

impl Encoder {
    fn u64(&mut self, v: usize) {
        self.0.extend((v as u64).to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len());
        self.0.extend_from_slice(b);
    }
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn f32s(&mut self, values: &[f32]) {
        self.u64(values.len());
        self.0.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    fn f64s(&mut self, values: &[f64]) {
        self.u64(values.len());
        self.0.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    }
    fn flag(&mut self, on: bool) {
        self.0.push(on as u8);
    }
}

struct Decoder<'a>(&'a [u8]);

impl Decoder<'_> {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        if n > self.0.len() {
            bail!("{n} bytes asked where {} are left", self.0.len());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u64(&mut self) -> anyhow::Result<usize> {
        let v = u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes"));
        usize::try_from(v).context("a count beyond this machine's addresses")
    }
    fn bytes(&mut self) -> anyhow::Result<Vec<u8>> {
        let n = self.u64()?;
        Ok(self.take(n)?.to_vec())
    }
    fn str(&mut self) -> anyhow::Result<String> {
        String::from_utf8(self.bytes()?).context("a string that is not UTF-8")
    }
    fn f32s(&mut self) -> anyhow::Result<Vec<f32>> {
        let n = self.u64()?;
        let bytes = self.take(n.checked_mul(4).context("a count too large")?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
    fn f64s(&mut self) -> anyhow::Result<Vec<f64>> {
        let n = self.u64()?;
        let bytes = self.take(n.checked_mul(8).context("a count too large")?)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
    fn f32_array<const N: usize>(&mut self) -> anyhow::Result<[f32; N]> {
        let values = self.f32s()?;
        values
            .try_into()
            .map_err(|v: Vec<f32>| anyhow::anyhow!("{} values where {N} are expected", v.len()))
    }
    fn flag(&mut self) -> anyhow::Result<bool> {
        match self.take(1)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            other => bail!("{other} where a flag (0 or 1) is expected"),
        }
    }
    fn end(&self) -> anyhow::Result<()> {
        if !self.0.is_empty() {
            bail!("{} bytes after the last field", self.0.len());
        }
        Ok(())
    }
}

fn encode_job(job: &Job) -> Vec<u8> {
    let mut e = Encoder::default();
    // 0 for the model's own: a process resolution is at least 14.
    e.u64(job.process_res.unwrap_or(0));
    e.str(&match job.reference {
        RefViewStrategy::View(view) => view.to_string(),
        named => named.name().to_owned(),
    });
    e.flag(job.ray_pose);
    e.u64(job.images.len());
    for (i, image) in job.images.iter().enumerate() {
        e.str(job.names.get(i).map_or("", String::as_str));
        e.u64(image.width);
        e.u64(image.height);
        e.bytes(&image.data);
        // The EXIF focal length a metric model falls back on (0: none).
        e.u64(image.focal_length_35mm.map_or(0, usize::from));
    }
    e.flag(job.poses.is_some());
    for pose in job.poses.unwrap_or_default() {
        e.f64s(pose.extrinsics.as_flattened());
        e.f64s(pose.intrinsics.as_flattened());
    }
    e.0
}

/// A job's images, known poses, and the rest (whose `images` and `poses` are to be pointed
/// at the first two).
type DecodedJob = (Vec<Image>, Option<Vec<KnownPose>>, Job<'static>);

fn decode_job(payload: &[u8]) -> anyhow::Result<DecodedJob> {
    let mut d = Decoder(payload);
    let process_res = Some(d.u64()?).filter(|&r| r != 0);
    let reference: RefViewStrategy = d.str()?.parse()?;
    let ray_pose = d.flag()?;
    let views = d.u64()?;
    let (mut names, mut images) = (Vec::new(), Vec::new());
    for _ in 0..views {
        names.push(d.str()?);
        let (width, height) = (d.u64()?, d.u64()?);
        let image = Image::new(width, height, d.bytes()?)?;
        let focal_length_35mm = match d.u64()? {
            0 => None,
            mm => Some(u16::try_from(mm).context("a 35 mm focal length out of range")?),
        };
        images.push(Image {
            focal_length_35mm,
            ..image
        });
    }
    let poses = match d.flag()? {
        false => None,
        true => Some(
            (0..views)
                .map(|_| {
                    let e: [f64; 16] = d
                        .f64s()?
                        .try_into()
                        .map_err(|_| anyhow::anyhow!("known extrinsics of other than 16 values"))?;
                    let i: [f64; 9] = d
                        .f64s()?
                        .try_into()
                        .map_err(|_| anyhow::anyhow!("known intrinsics of other than 9 values"))?;
                    Ok(KnownPose {
                        extrinsics: std::array::from_fn(|r| std::array::from_fn(|c| e[r * 4 + c])),
                        intrinsics: std::array::from_fn(|r| std::array::from_fn(|c| i[r * 3 + c])),
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?,
        ),
    };
    d.end()?;
    let job = Job {
        images: &[],
        names,
        process_res,
        reference,
        ray_pose,
        poses: None,
        gaussians: false,
    };
    Ok((images, poses, job))
}

fn encode_output(output: &Output) -> Vec<u8> {
    let mut e = Encoder::default();
    e.u64(output.views.len());
    for view in &output.views {
        e.u64(view.width);
        e.u64(view.height);
        e.f32s(&view.depth);
        for map in [&view.confidence, &view.sky] {
            e.flag(map.is_some());
            if let Some(values) = map {
                e.f32s(values);
            }
        }
        e.flag(view.pose.is_some());
        if let Some(pose) = &view.pose {
            e.f32s(pose.intrinsics.as_flattened());
            e.f32s(pose.extrinsics.as_flattened());
        }
        e.u64(view.image.width);
        e.u64(view.image.height);
        e.bytes(&view.image.data);
        e.u64(view.input_size.0);
        e.u64(view.input_size.1);
        e.str(&view.name);
        e.str(view.depth_unit.name());
        e.flag(view.metric_focal.is_some());
        if let Some(focal) = view.metric_focal {
            e.f32s(&[focal.pixels]);
            let (code, mm) = match focal.source {
                FocalSource::Intrinsics => (0, 0),
                FocalSource::Pixels => (1, 0),
                FocalSource::Fov => (2, 0),
                FocalSource::Exif35mm(mm) => (3, mm),
                FocalSource::Default => (4, 0),
            };
            e.u64(code);
            e.u64(usize::from(mm));
        }
    }
    e.u64(output.reference);
    e.str(&match output.strategy {
        RefViewStrategy::View(view) => view.to_string(),
        named => named.name().to_owned(),
    });
    for scale in [output.pose_scale, output.metric_scale] {
        e.flag(scale.is_some());
        if let Some(scale) = scale {
            e.f64s(&[scale]);
        }
    }
    e.0
}

fn decode_output(payload: &[u8]) -> anyhow::Result<Output> {
    let mut d = Decoder(payload);
    let views = d.u64()?;
    let mut predictions = Vec::new();
    for _ in 0..views {
        let (width, height) = (d.u64()?, d.u64()?);
        let depth = d.f32s()?;
        let confidence = d.flag()?.then(|| d.f32s()).transpose()?;
        let sky = d.flag()?.then(|| d.f32s()).transpose()?;
        let pose = match d.flag()? {
            false => None,
            true => {
                let i: [f32; 9] = d.f32_array()?;
                let e: [f32; 12] = d.f32_array()?;
                Some(da3::Pose {
                    intrinsics: std::array::from_fn(|r| std::array::from_fn(|c| i[r * 3 + c])),
                    extrinsics: std::array::from_fn(|r| std::array::from_fn(|c| e[r * 4 + c])),
                })
            }
        };
        let (image_width, image_height) = (d.u64()?, d.u64()?);
        let image = Image::new(image_width, image_height, d.bytes()?)?;
        let input_size = (d.u64()?, d.u64()?);
        let name = d.str()?;
        let depth_unit = match d.str()?.as_str() {
            "relative" => DepthUnit::Relative,
            "metres" => DepthUnit::Metres,
            "known_cameras" => DepthUnit::KnownCameras,
            "relative_disparity" => DepthUnit::Disparity,
            other => bail!("a depth unit `{other}`"),
        };
        let metric_focal = match d.flag()? {
            false => None,
            true => {
                let [pixels] = d.f32_array()?;
                let source = match (d.u64()?, d.u64()?) {
                    (0, _) => FocalSource::Intrinsics,
                    (1, _) => FocalSource::Pixels,
                    (2, _) => FocalSource::Fov,
                    (3, mm) => FocalSource::Exif35mm(u16::try_from(mm).context("a focal length")?),
                    (4, _) => FocalSource::Default,
                    (code, _) => bail!("a focal source {code}"),
                };
                Some(MetricFocal { pixels, source })
            }
        };
        let pixels = width.checked_mul(height).context("a size too large")?;
        let maps = [Some(&depth), confidence.as_ref(), sky.as_ref()];
        if maps.into_iter().flatten().any(|m| m.len() != pixels) {
            bail!("a map that is not {width}x{height}");
        }
        predictions.push(Prediction {
            width,
            height,
            depth,
            confidence,
            sky,
            pose,
            image,
            input_size,
            name,
            depth_unit,
            metric_focal,
            ..Prediction::default()
        });
    }
    let reference = d.u64()?;
    let strategy: RefViewStrategy = d.str()?.parse()?;
    let mut scale = || -> anyhow::Result<Option<f64>> {
        Ok(match d.flag()? {
            false => None,
            true => Some(
                d.f64s()?
                    .first()
                    .copied()
                    .context("a scale without a value")?,
            ),
        })
    };
    let (pose_scale, metric_scale) = (scale()?, scale()?);
    d.end()?;
    if predictions.is_empty() || reference >= predictions.len() {
        bail!("reference view {reference} of {} views", predictions.len());
    }
    Ok(Output {
        views: predictions,
        reference,
        strategy,
        pose_scale,
        metric_scale,
        // The worker's timings stay in the worker.
        timings: Default::default(),
        // Jobs with Gaussians are not sent (`encode_job`).
        gaussians: None,
    })
}

fn error_payload(error: &anyhow::Error) -> Vec<u8> {
    let messages: Vec<String> = error.chain().map(|e| e.to_string()).collect();
    let mut e = Encoder::default();
    e.u64(messages.len());
    for message in &messages {
        e.str(message);
    }
    e.0
}

/// The worker's error with its causes, as `cmd::main` prints a local one.
fn decode_error(payload: &[u8]) -> anyhow::Result<anyhow::Error> {
    let mut d = Decoder(payload);
    let count = d.u64()?;
    let messages = (0..count)
        .map(|_| d.str())
        .collect::<anyhow::Result<Vec<_>>>()?;
    d.end()?;
    let mut messages = messages.into_iter().rev();
    let mut error = anyhow::Error::msg(messages.next().context("an error without a message")?);
    for outer in messages {
        error = error.context(outer);
    }
    Ok(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_crosses_unchanged() {
        let view = |n: usize| Prediction {
            width: 3,
            height: 2,
            depth: vec![1.0, f32::MIN_POSITIVE, -0.0, 3.5e-7, 2.0, n as f32],
            confidence: (n == 0).then(|| vec![0.1; 6]),
            sky: (n == 1).then(|| vec![0.9; 6]),
            pose: (n == 0).then_some(da3::Pose {
                intrinsics: [[1.1, 0.0, 1.5], [0.0, 1.2, 1.0], [0.0, 0.0, 1.0]],
                extrinsics: [
                    [1.0, 0.0, 0.0, 0.1],
                    [0.0, 1.0, 0.0, 0.2],
                    [0.0, 0.0, 1.0, 0.3],
                ],
            }),
            image: Image::new(3, 2, (0..18).collect()).unwrap(),
            input_size: (30, 20),
            name: format!("view{n}.png"),
            depth_unit: [DepthUnit::KnownCameras, DepthUnit::Metres][n],
            metric_focal: (n == 1).then_some(MetricFocal {
                pixels: 123.5,
                source: FocalSource::Exif35mm(26),
            }),
            ..Prediction::default()
        };
        let output = Output {
            views: vec![view(0), view(1)],
            reference: 1,
            strategy: RefViewStrategy::View(1),
            pose_scale: Some(0.25),
            metric_scale: None,
            timings: Default::default(),
            gaussians: None,
        };
        let back = decode_output(&encode_output(&output)).unwrap();
        assert_eq!(back.views, output.views);
        assert_eq!(back.reference, 1);
        assert_eq!(back.strategy, RefViewStrategy::View(1));
        assert_eq!((back.pose_scale, back.metric_scale), (Some(0.25), None));
        let mut truncated = encode_output(&output);
        truncated.pop();
        assert!(decode_output(&truncated).is_err());
    }

    #[test]
    fn a_job_crosses_unchanged() {
        let images = [Image {
            focal_length_35mm: Some(28),
            ..Image::new(2, 1, vec![1, 2, 3, 4, 5, 6]).unwrap()
        }];
        let poses = [KnownPose {
            extrinsics: [
                [1.0, 0.0, 0.0, 0.5],
                [0.0, 1.0, 0.0, 0.0],
                [0.0, 0.0, 1.0, 0.0],
                [0.0, 0.0, 0.0, 1.0],
            ],
            intrinsics: [[2.0, 0.0, 1.0], [0.0, 2.0, 0.5], [0.0, 0.0, 1.0]],
        }];
        let job = Job {
            images: &images,
            names: vec!["a.png".into()],
            process_res: Some(112),
            reference: RefViewStrategy::Middle,
            ray_pose: false,
            poses: Some(&poses),
            gaussians: false,
        };
        let (back_images, back_poses, back) = decode_job(&encode_job(&job)).unwrap();
        assert_eq!(back_images, images);
        assert_eq!(back_poses.unwrap(), poses);
        assert_eq!(back.names, job.names);
        assert_eq!(back.process_res, Some(112));
        assert_eq!(back.reference, RefViewStrategy::Middle);
    }

    #[test]
    fn errors_keep_their_causes_and_ggml_aborts_are_recognised() {
        let error = anyhow::anyhow!("inner").context("middle").context("outer");
        let back = decode_error(&error_payload(&error)).unwrap();
        let chain: Vec<String> = back.chain().map(|e| e.to_string()).collect();
        assert_eq!(chain, ["outer", "middle", "inner"]);
        assert_eq!(
            ggml_abort_message(
                "/x/ggml/src/ggml-rpc/ggml-rpc.cpp:587: Remote RPC server crashed or returned \
                 malformed response"
            )
            .as_deref(),
            Some("Remote RPC server crashed or returned malformed response")
        );
        assert_eq!(ggml_abort_message("[WARN] something: 12: else"), None);
    }
}
