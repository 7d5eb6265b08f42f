//! A remote device that dies, stalls or answers garbage mid-run is an error of that device,
//! never the end of the process that holds the run: `da3 depth` exits 1 naming the device
//! and writes nothing; `da3 batch` takes the device out, computes its image elsewhere and
//! finishes with every output, naming the failure in summary.json. Every test starts its own
//! `da3 rpc-server`s on loopback and uses the built-in model at a small process resolution.
#![cfg(target_os = "linux")]

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

mod common;

use common::{da3_in, entries, RpcServer as Server};

const IMAGES: usize = 12;

fn png(path: &Path, seed: u8) {
    let img = image::RgbImage::from_fn(96, 64, |x, y| {
        image::Rgb([
            (x * 7) as u8 ^ seed,
            (y * 5) as u8,
            seed.wrapping_mul(31) ^ (x + y) as u8,
        ])
    });
    img.save(path).unwrap();
}

/// A folder with `in/0.png` ... `in/11.png`.
fn inputs() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    for i in 0..IMAGES {
        png(&dir.path().join(format!("in/{i}.png")), 10 + i as u8);
    }
    dir
}

fn batch_args<'a>(devices: &'a str, out: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "batch",
        "in",
        "--out-dir",
        out,
        "--outputs",
        "pfm,png,ply",
        "--process-res",
        "280",
        "--device",
        devices,
        "--threads",
        "1",
    ];
    args.extend(extra);
    args
}

/// Every output of a batch into `out`, by name (summary.json left out: it has timings).
fn outputs_of(dir: &Path, out: &str) -> Vec<(String, Vec<u8>)> {
    entries(&dir.join(out))
        .into_iter()
        .filter(|n| n != "summary.json")
        .map(|n| {
            let bytes = std::fs::read(dir.join(out).join(&n)).unwrap();
            (n, bytes)
        })
        .collect()
}

/// The outputs of the batch on one healthy server: the remote results every run must equal.
fn reference_outputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let server = Server::start();
    let run = da3_in(dir, &batch_args(&server.device(), "reference", &[]));
    assert_eq!(run.code, Some(0), "{}", run.context());
    let outputs = outputs_of(dir, "reference");
    assert_eq!(outputs.len(), 3 * IMAGES);
    outputs
}

/// `da3 ARGS` in `dir`, running (stderr collected line by line).
struct Running {
    child: Child,
    stderr: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Running {
    fn start(dir: &Path, args: &[&str]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
            .args(args)
            .current_dir(dir)
            .env("GGML_NO_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, stderr) = mpsc::channel();
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Running {
            child,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 60 s) until `done` holds; panics if the run ends first.
    fn wait_until(&mut self, what: &str, mut done: impl FnMut(&[String]) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !done(&self.seen) {
            while let Ok(line) = self.stderr.try_recv() {
                self.seen.push(line);
            }
            assert!(Instant::now() < deadline, "no {what} within 60 s");
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("ended ({status}) before {what}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// How the run ended (at most 60 s from now) and its stderr.
    fn finish(mut self) -> (ExitStatus, String) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                panic!("still running after 60 s:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        while let Ok(line) = self.stderr.recv_timeout(Duration::from_secs(2)) {
            self.seen.push(line);
        }
        (status, self.log())
    }

    fn log(&self) -> String {
        self.seen.join("\n")
    }
}

fn some_output_in(out: &Path) -> bool {
    std::fs::read_dir(out).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().ends_with(".pfm"))
    })
}

/// The batch into `out` ended well: exit 0, every image ok, outputs byte-equal to
/// `reference`, no temporary file, and exactly one device failure, of `device`, whose reason
/// mentions `reason`.
fn assert_survived(
    dir: &Path,
    out: &str,
    (status, log): (ExitStatus, String),
    reference: &[(String, Vec<u8>)],
    device: &str,
    reason: &str,
) {
    assert_eq!(status.code(), Some(0), "{status}\n{log}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(out).join("summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["ok"], IMAGES, "{summary:#}");
    assert_eq!(summary["failed"], 0, "{summary:#}");
    let failures = summary["device_failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{summary:#}");
    assert_eq!(failures[0]["device"], device, "{summary:#}");
    let failed_input = PathBuf::from(failures[0]["input"].as_str().unwrap());
    assert!(failed_input.starts_with("in"), "{summary:#}");
    let why = failures[0]["reason"].as_str().unwrap();
    assert!(why.contains(reason), "{why}");
    assert!(
        log.contains(&format!("--device {device}: the remote device failed")),
        "{log}"
    );
    // The image the device failed on was computed by another one.
    let redone = summary["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| failed_input == Path::new(r["input"].as_str().unwrap()))
        .unwrap();
    assert_eq!(redone["status"], "ok");
    assert_ne!(redone["device"], device, "{summary:#}");
    let names = entries(&dir.join(out));
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with('.') && !n.ends_with(".tmp")),
        "{names:?}"
    );
    assert!(
        outputs_of(dir, out) == reference,
        "the outputs differ from a single healthy device's"
    );
}

#[test]
fn a_server_killed_mid_batch_is_taken_out_and_the_batch_completes() {
    let dir = inputs();
    let reference = reference_outputs(dir.path());
    let (a, b) = (Server::start(), Server::start());
    let devices = format!("{},{}", a.device(), b.device());
    let mut run = Running::start(dir.path(), &batch_args(&devices, "out", &[]));
    let out = dir.path().join("out");
    run.wait_until("a first output", |_| some_output_in(&out));
    // The device that wrote it is sending its next image: let both compute (an image takes
    // a few hundred milliseconds on one server thread).
    std::thread::sleep(Duration::from_millis(60));
    a.signal(Signal::SIGKILL);
    let ended = run.finish();
    assert_survived(
        dir.path(),
        "out",
        ended,
        &reference,
        &a.device(),
        "connection lost",
    );
}

#[test]
fn a_stalled_server_is_timed_out_and_the_batch_completes() {
    let dir = inputs();
    let reference = reference_outputs(dir.path());
    let (a, b) = (Server::start(), Server::start());
    let devices = format!("{},{}", a.device(), b.device());
    let args = batch_args(&devices, "out", &["--device-timeout", "4"]);
    let mut run = Running::start(dir.path(), &args);
    let out = dir.path().join("out");
    run.wait_until("a first output", |_| some_output_in(&out));
    // Every connection of a stopped server freezes: no answer, no error.
    a.signal(Signal::SIGSTOP);
    let stopped = Instant::now();
    let ended = run.finish();
    assert!(
        stopped.elapsed() >= Duration::from_secs(3),
        "{:?}",
        stopped.elapsed()
    );
    assert_survived(dir.path(), "out", ended, &reference, &a.device(), "stalled");
}

/// A loopback relay to `upstream` that, once `garble` is set, answers every client with junk
/// and closes: a server that returns malformed responses mid-run.
fn garbling_relay(upstream: String, garble: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut client_in, mut server_out) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut client_in, &mut server_out);
                let _ = server_out.shutdown(std::net::Shutdown::Both);
            });
            let garble = garble.clone();
            std::thread::spawn(move || {
                let (mut client, mut server) = (client, server);
                let mut buffer = [0u8; 1 << 16];
                loop {
                    let n = match server.read(&mut buffer) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    if garble.load(Ordering::SeqCst) {
                        let _ = client.write_all(&[0xA5; 64]);
                        break;
                    }
                    if client.write_all(&buffer[..n]).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(std::net::Shutdown::Both);
                let _ = server.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    endpoint
}

#[test]
fn a_server_answering_garbage_mid_batch_is_taken_out_and_the_batch_completes() {
    let dir = inputs();
    let reference = reference_outputs(dir.path());
    let (a, b) = (Server::start(), Server::start());
    let garble = Arc::new(AtomicBool::new(false));
    let relay = format!("rpc:{}", garbling_relay(a.endpoint.clone(), garble.clone()));
    let devices = format!("{relay},{}", b.device());
    let mut run = Running::start(dir.path(), &batch_args(&devices, "out", &[]));
    let out = dir.path().join("out");
    run.wait_until("a first output", |_| some_output_in(&out));
    garble.store(true, Ordering::SeqCst);
    let ended = run.finish();
    // ggml reads the junk as a malformed answer, or as a size it then fails to receive.
    let reason = "ggml: ";
    assert_survived(dir.path(), "out", ended, &reference, &relay, reason);
}

/// A "server" that answers every connection with junk from the start: not a device, so the
/// run fails before computing, with an error (ggml's client would abort on it).
#[test]
fn a_server_answering_garbage_from_the_start_is_an_error_naming_it() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for mut client in listener.incoming().flatten() {
            let _ = client.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot ggml at all");
        }
    });
    let dir = inputs();
    let device = format!("rpc:{endpoint}");
    let batch = da3_in(
        dir.path(),
        &batch_args(&format!("cpu,{device}"), "out", &[]),
    );
    common::assert_clean_failure(&batch, &[&endpoint, "HELLO"]);
    let depth = da3_in(
        dir.path(),
        &["depth", "--device", &device, "--pfm", "d.pfm"],
    );
    common::assert_clean_failure(&depth, &[&endpoint, "HELLO"]);
    assert!(!dir.path().join("d.pfm").exists());
}

fn depth_args(device: &str, timeout: &str) -> Vec<String> {
    [
        "depth",
        "--device",
        device,
        "--process-res",
        "1008",
        "--threads",
        "1",
        "--device-timeout",
        timeout,
        "--pfm",
        "out/d.pfm",
        "--png",
        "out/d.png",
        "--ply",
        "out/d.ply",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn depth_on_a_server_killed_while_it_computes_exits_1_naming_it_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let server = Server::start();
    let args = depth_args(&server.device(), "600");
    // -v: the planner's line is a debug line.
    let args: Vec<&str> = std::iter::once("-v")
        .chain(args.iter().map(String::as_str))
        .collect();
    let mut run = Running::start(dir.path(), &args);
    // The planner's line comes when the graph is planned, just before it computes (a
    // 1008-pixel image takes seconds on one server thread).
    run.wait_until("the planner's line", |seen| {
        seen.iter().any(|l| l.contains("residency:"))
    });
    server.signal(Signal::SIGKILL);
    let (status, log) = run.finish();
    assert_eq!(status.code(), Some(1), "{status}\n{log}");
    let error = format!(
        "Error: --device {}: the remote device failed",
        server.device()
    );
    assert!(log.contains(&error), "{log}");
    assert!(log.contains("nothing written"), "{log}");
    for bad in ["panicked", "core dumped", "Aborted"] {
        assert!(!log.contains(bad), "{log}");
    }
    assert_eq!(entries(&dir.path().join("out")), Vec::<String>::new());
}

#[test]
fn depth_on_a_stalled_server_exits_1_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let server = Server::start();
    server.signal(Signal::SIGSTOP);
    let started = Instant::now();
    let args = depth_args(&server.device(), "2");
    let run = da3_in(dir.path(), &args);
    let waited = started.elapsed();
    common::assert_clean_failure(
        &run,
        &[
            &format!("--device {}: the remote device failed", server.device()),
            "stalled",
            "--device-timeout",
        ],
    );
    assert!(
        (Duration::from_secs(2)..Duration::from_secs(20)).contains(&waited),
        "{waited:?}"
    );
    assert_eq!(entries(&dir.path().join("out")), Vec::<String>::new());
}

/// Ctrl-C (SIGINT to the batch alone, as a terminal sends it to its foreground process group,
/// which the workers are not in) ends the run: no temporary file, and no worker left behind.
#[test]
fn an_interrupted_remote_batch_leaves_no_temporary_file_and_no_worker() {
    let dir = inputs();
    let server = Server::start();
    let devices = format!("{},cpu", server.device());
    let mut run = Running::start(dir.path(), &batch_args(&devices, "out", &[]));
    let out = dir.path().join("out");
    run.wait_until("a first output", |_| some_output_in(&out));
    let batch = run.child.id();
    // The workers are started by the batch's main thread.
    let children =
        std::fs::read_to_string(format!("/proc/{batch}/task/{batch}/children")).unwrap_or_default();
    let workers: Vec<String> = children.split_whitespace().map(str::to_owned).collect();
    assert_eq!(workers.len(), 1, "one worker for the one rpc: device");
    kill(Pid::from_raw(batch as i32), Signal::SIGINT).unwrap();
    let (status, log) = run.finish();
    assert!(!status.success(), "{log}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while workers
        .iter()
        .any(|w| Path::new(&format!("/proc/{w}")).exists())
    {
        assert!(
            Instant::now() < deadline,
            "worker {workers:?} outlived the batch"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let names = entries(&out);
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with('.') && !n.ends_with(".tmp")),
        "{names:?}"
    );
    assert!(!names.contains(&"summary.json".to_owned()), "{names:?}");
}
