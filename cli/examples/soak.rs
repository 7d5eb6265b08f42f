//! A soak run of `da3 serve` (not a test): the built-in model on loopback, a fixed mix of
//! requests at 1, 4 and 16 concurrent clients, each request on its own connection
//! (`Connection: close`, plain sockets so that the bad ones can be as bad as wanted):
//!
//! - 80 % normal: one image, `process_res` as given, the JSON summary; expected 200;
//! - 5 % malformed: garbage multipart, no boundary, an unknown field, a bad `process_res`,
//!   an image that is not one, a request line that is not HTTP; expected 400 or 422;
//! - 5 % oversized: a declared length over `--max-upload-bytes`, or a chunked body that
//!   passes it; expected 413;
//! - 6 % slow: the normal request written in 10 pieces 20 ms apart; expected 200;
//! - 4 % stalled (slowloris): a request head and half a multipart head, then silence until
//!   the server gives up; expected 408 after `--body-timeout`.
//!
//! Printed: per level the throughput, p50/p99 latency of the normal and slow requests, the
//! answers by status (and connection errors), and the server's RSS (`/proc/PID/status`
//! VmRSS) sampled every second. Exits 1 on a 5xx other than 503/504 or on an unexpected status.
//!
//! ```sh
//! cargo build --release -p da3-cli --example soak
//! target/release/examples/soak target/release/da3 tests/fixtures/peer/test-640x480.png 112 10000
//! ```
//!
//! Arguments: the `da3` binary, an image, the process resolution, the number of requests (split
//! evenly over the three levels, after 1000 warm-up requests of the mix at 16 clients). Extra
//! arguments go to `da3 serve` after the soak's defaults (`--workers 1 --queue 16
//! --max-upload-bytes 1048576 --body-timeout 1 --header-timeout 2`).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BOUNDARY: &str = "da3-soak-boundary-5f3a";
const MAX_UPLOAD_BYTES: usize = 1 << 20;
/// Requests of the mix sent before anything is measured.
const WARM_UP: usize = 1000;

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Kind {
    Normal,
    Malformed,
    Oversized,
    Slow,
    Stalled,
}

impl Kind {
    /// The mix, by request number: 80 normal, 5 malformed, 5 oversized, 6 slow, 4 stalled in
    /// every 100.
    fn of(i: usize) -> Kind {
        match i % 100 {
            0..=79 => Kind::Normal,
            80..=84 => Kind::Malformed,
            85..=89 => Kind::Oversized,
            90..=95 => Kind::Slow,
            _ => Kind::Stalled,
        }
    }

    fn expected(self, status: u16) -> bool {
        match self {
            // 503/504 are the documented answers of a full queue or a late result.
            Kind::Normal | Kind::Slow => matches!(status, 200 | 503 | 504),
            Kind::Malformed => matches!(status, 400 | 422),
            Kind::Oversized => status == 413,
            Kind::Stalled => status == 408,
        }
    }
}

/// What came back: a status, or why none did.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Outcome {
    Status(u16),
    Failed(String),
}

struct Client {
    addr: String,
    normal: Vec<u8>,
    image: Vec<u8>,
    res: String,
}

fn multipart_body(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        write!(
            body,
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\""
        )
        .unwrap();
        if let Some(file) = file {
            write!(body, "; filename=\"{file}\"\r\nContent-Type: image/png").unwrap();
        }
        body.extend_from_slice(b"\r\n\r\n");
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{BOUNDARY}--\r\n").unwrap();
    body
}

fn post(addr: &str, content_type: &str, body: &[u8]) -> Vec<u8> {
    let mut request = format!(
        "POST /v1/depth HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    request
}

impl Client {
    fn multipart_type() -> String {
        format!("multipart/form-data; boundary={BOUNDARY}")
    }

    /// The request's bytes, sent in pieces with `pause` between them.
    fn exchange(&self, pieces: &[&[u8]], pause: Duration) -> Outcome {
        let mut stream = match TcpStream::connect(&self.addr) {
            Ok(s) => s,
            Err(e) => return Outcome::Failed(format!("connect: {}", e.kind())),
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(120)));
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            // The server may answer (413, 408) and close before the whole request is written:
            // the answer is still read below.
            if stream.write_all(piece).is_err() {
                break;
            }
        }
        let mut answer = Vec::new();
        if let Err(e) = stream.read_to_end(&mut answer) {
            if answer.is_empty() {
                return Outcome::Failed(format!("read: {}", e.kind()));
            }
        }
        let head = String::from_utf8_lossy(&answer[..answer.len().min(32)]).into_owned();
        match head
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok())
        {
            Some(status) => Outcome::Status(status),
            None if answer.is_empty() => Outcome::Failed("closed without an answer".into()),
            None => Outcome::Failed(format!("not HTTP: {head:?}")),
        }
    }

    fn send(&self, kind: Kind, variant: usize) -> Outcome {
        let no_pause = Duration::ZERO;
        match kind {
            Kind::Normal => self.exchange(&[&self.normal], no_pause),
            Kind::Slow => {
                let piece = self.normal.len().div_ceil(10);
                let pieces: Vec<&[u8]> = self.normal.chunks(piece).collect();
                self.exchange(&pieces, Duration::from_millis(20))
            }
            Kind::Malformed => {
                let ct = Client::multipart_type();
                let request = match variant % 6 {
                    0 => post(&self.addr, &ct, b"--not-the-boundary\r\n\x00\xff garbage"),
                    1 => post(&self.addr, "multipart/form-data", &self.normal[..64]),
                    2 => post(
                        &self.addr,
                        &ct,
                        &multipart_body(&[("colour", None, b"blue"), ("image", None, b"x")]),
                    ),
                    3 => post(
                        &self.addr,
                        &ct,
                        &multipart_body(&[
                            ("process_res", None, b"many"),
                            ("image", Some("a.png"), &self.image),
                        ]),
                    ),
                    4 => post(
                        &self.addr,
                        &ct,
                        &multipart_body(&[("image", Some("a.png"), b"not a picture")]),
                    ),
                    _ => b"GET\x01/ HTTP/9.9 \r\n\r\n".to_vec(),
                };
                self.exchange(&[&request], no_pause)
            }
            Kind::Oversized => {
                let ct = Client::multipart_type();
                if variant.is_multiple_of(2) {
                    // Refused from the declared length, before any of it is read.
                    let head = format!(
                        "POST /v1/depth HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
                         Content-Type: {ct}\r\nContent-Length: {}\r\n\r\n",
                        self.addr,
                        64 * MAX_UPLOAD_BYTES
                    );
                    self.exchange(&[head.as_bytes()], no_pause)
                } else {
                    // No declared length: refused once the limit is passed.
                    let mut request = format!(
                        "POST /v1/depth HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
                         Content-Type: {ct}\r\nTransfer-Encoding: chunked\r\n\r\n",
                        self.addr
                    )
                    .into_bytes();
                    let body = multipart_body(&[(
                        "image",
                        Some("big.png"),
                        &vec![0x55; MAX_UPLOAD_BYTES + (64 << 10)],
                    )]);
                    for chunk in body.chunks(64 << 10) {
                        write!(request, "{:x}\r\n", chunk.len()).unwrap();
                        request.extend_from_slice(chunk);
                        request.extend_from_slice(b"\r\n");
                    }
                    request.extend_from_slice(b"0\r\n\r\n");
                    self.exchange(&[&request], no_pause)
                }
            }
            Kind::Stalled => {
                // The request head and the start of the first field, then nothing: the server
                // answers 408 after its body timeout.
                let head = format!(
                    "POST /v1/depth HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
                     Content-Type: {}\r\nContent-Length: {}\r\n\r\n--{BOUNDARY}\r\nContent-Dis",
                    self.addr,
                    Client::multipart_type(),
                    self.normal.len()
                );
                self.exchange(&[head.as_bytes()], no_pause)
            }
        }
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn percentile_ms(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    1000.0 * sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: soak DA3 IMAGE PROCESS_RES REQUESTS [serve args...]");
        std::process::exit(2);
    }
    let (da3, image, res) = (&args[1], &args[2], &args[3]);
    let total: usize = args[4].parse().expect("a number of requests");
    let mut server = Command::new(da3)
        .args(["-q", "serve", "--addr", "127.0.0.1:0"])
        .args(["--workers", "1", "--queue", "16"])
        .args(["--max-upload-bytes", &MAX_UPLOAD_BYTES.to_string()])
        .args(["--body-timeout", "1", "--header-timeout", "2"])
        .args(&args[5..])
        .stdout(Stdio::piped())
        .spawn()
        .expect("da3 serve starts");
    let pid = server.id();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on http://")
        .expect("the address")
        .to_owned();
    let image = std::fs::read(image).unwrap();
    let normal_body = multipart_body(&[
        ("process_res", None, res.as_bytes()),
        ("image", Some("a.png"), &image),
    ]);
    let client = Client {
        normal: post(&addr, &Client::multipart_type(), &normal_body),
        addr,
        image,
        res: res.clone(),
    };

    let start = Instant::now();
    let samples: Mutex<Vec<(f64, u64)>> = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let mut unexpected = 0;
    std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let rss = status_kib(pid, "VmRSS:");
                samples
                    .lock()
                    .unwrap()
                    .push((start.elapsed().as_secs_f64(), rss));
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        // Warm-up: the mix at the highest concurrency, so that the server's memory has seen
        // every path at its most concurrent before it is watched.
        let warm_up = run_level(&client, 16, WARM_UP);
        let warm_up_failures = warm_up
            .iter()
            .filter(|(k, o, _)| !k.expected(status_of(o)))
            .count();
        let rss_warm = status_kib(pid, "VmRSS:");
        let warm_up_end = start.elapsed().as_secs_f64();
        println!(
            "process_res {}, {total} requests after {WARM_UP} warm-up ones at 16 clients \
             ({warm_up_failures} unexpected); server RSS after warm-up {:.1} MiB\n",
            client.res,
            mib(rss_warm)
        );
        println!(
            "| clients | requests | wall s | req/s | normal p50 ms | normal p99 ms | \
             slow p50 ms | stalled p50 ms | answers | RSS end MiB |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|");
        let levels = [1usize, 4, 16];
        for (l, clients) in levels.into_iter().enumerate() {
            let count = total / levels.len() + usize::from(l < total % levels.len());
            let level_start = Instant::now();
            let results = run_level(&client, clients, count);
            let wall = level_start.elapsed().as_secs_f64();
            let latencies = |want: Kind| {
                let mut l: Vec<f64> = results
                    .iter()
                    .filter(|(k, o, _)| *k == want && k.expected(status_of(o)))
                    .map(|(_, _, t)| *t)
                    .collect();
                l.sort_by(f64::total_cmp);
                l
            };
            let normal = latencies(Kind::Normal);
            let mut answers: BTreeMap<Outcome, usize> = BTreeMap::new();
            let mut wrong: BTreeMap<(Kind, Outcome), usize> = BTreeMap::new();
            for (kind, outcome, _) in &results {
                *answers.entry(outcome.clone()).or_default() += 1;
                if !kind.expected(status_of(outcome)) {
                    *wrong.entry((*kind, outcome.clone())).or_default() += 1;
                }
            }
            let answers = answers
                .iter()
                .map(|(o, n)| match o {
                    Outcome::Status(s) => format!("{s}: {n}"),
                    Outcome::Failed(why) => format!("{why}: {n}"),
                })
                .collect::<Vec<_>>()
                .join(", ");
            println!(
                "| {clients} | {} | {wall:.1} | {:.1} | {:.0} | {:.0} | {:.0} | {:.0} | {answers} \
                 | {:.1} |",
                results.len(),
                results.len() as f64 / wall,
                percentile_ms(&normal, 0.5),
                percentile_ms(&normal, 0.99),
                percentile_ms(&latencies(Kind::Slow), 0.5),
                percentile_ms(&latencies(Kind::Stalled), 0.5),
                mib(status_kib(pid, "VmRSS:"))
            );
            for ((kind, outcome), n) in wrong {
                eprintln!("UNEXPECTED at {clients} clients: {kind:?} -> {outcome:?} x {n}");
                unexpected += n;
            }
        }
        done.store(true, Ordering::Relaxed);
        let samples = samples.lock().unwrap();
        let after_warm_up: Vec<u64> = samples
            .iter()
            .filter(|(t, _)| *t >= warm_up_end)
            .map(|s| s.1)
            .collect();
        let (lo, hi) = (
            after_warm_up.iter().min().copied().unwrap_or(0),
            after_warm_up.iter().max().copied().unwrap_or(0),
        );
        println!(
            "\nserver RSS sampled every second after warm-up ({} samples): min {:.1} MiB, max \
             {:.1} MiB, last {:.1} MiB; peak (VmHWM, warm-up included) {:.1} MiB",
            after_warm_up.len(),
            mib(lo),
            mib(hi),
            mib(samples.last().map_or(0, |s| s.1)),
            mib(status_kib(pid, "VmHWM:"))
        );
        let step = (samples.len() / 12).max(1);
        let series: Vec<String> = samples
            .iter()
            .step_by(step)
            .map(|(t, rss)| format!("{t:.0}s {:.1}", mib(*rss)))
            .collect();
        println!("RSS over time (MiB): {}", series.join(", "));
    });
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let status = server.wait().unwrap();
    println!("server exit after SIGTERM: {status}");
    if unexpected > 0 || !status.success() {
        std::process::exit(1);
    }
}

/// `count` requests of the mix (request `i` is [`Kind::of`]`(i)`) from `clients` threads:
/// (kind, outcome, seconds) each.
fn run_level(client: &Client, clients: usize, count: usize) -> Vec<(Kind, Outcome, f64)> {
    let next = AtomicUsize::new(0);
    let results = Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|s| {
        for _ in 0..clients {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let kind = Kind::of(i);
                let t = Instant::now();
                let outcome = client.send(kind, i);
                let seconds = t.elapsed().as_secs_f64();
                results.lock().unwrap().push((kind, outcome, seconds));
            });
        }
    });
    results.into_inner().unwrap()
}

fn status_of(outcome: &Outcome) -> u16 {
    match outcome {
        Outcome::Status(s) => *s,
        Outcome::Failed(_) => 0,
    }
}
