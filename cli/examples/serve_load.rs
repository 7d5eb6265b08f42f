//! A bounded load loop against `da3 serve` on loopback: 1, 4 and 16 concurrent clients,
//! throughput, p50/p99 latency, the server's resident memory after 10 requests, after all of
//! them, and its peak (Linux `/proc/PID/status`: VmRSS, VmHWM).
//!
//! ```sh
//! cargo run --release --example write_synthetic -- da3-small /tmp/small.gguf f32
//! cargo build --release -p da3-cli --example serve_load
//! target/release/examples/serve_load target/release/da3 /tmp/small.gguf \
//!     tests/fixtures/peer/test-640x480.png 140 248
//! ```
//!
//! Arguments: the `da3` binary, a model (`builtin`: the built-in da3-tiny), an image, the
//! process resolution, and requests per concurrency level: 10 warm-up requests first, then
//! 1, 4, 16 and again 1 client (10 + 4 x 248 = 1002 in all), with the server's RSS after each.
//! Extra arguments after them go to `da3 serve` (default `--workers 1 --queue 64`).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BOUNDARY: &str = "da3-load-boundary-c2f1";

fn status_kib(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 6 {
        eprintln!(
            "usage: serve_load DA3 MODEL IMAGE PROCESS_RES REQUESTS_PER_LEVEL [serve args...]"
        );
        std::process::exit(2);
    }
    let (da3, model, image, res) = (&args[1], &args[2], &args[3], &args[4]);
    let per_level: usize = args[5].parse().expect("requests per level");
    assert!(
        (1..=10_000).contains(&per_level),
        "1 to 10000 requests per level"
    );
    let extra: Vec<&str> = if args.len() > 6 {
        args[6..].iter().map(String::as_str).collect()
    } else {
        vec!["--workers", "1", "--queue", "64"]
    };
    // `builtin`: the built-in da3-tiny (no --model).
    let model_args: Vec<&str> = if model == "builtin" {
        vec![]
    } else {
        vec!["--model", model]
    };
    let mut server = Command::new(da3)
        .args(["-q", "serve", "--addr", "127.0.0.1:0"])
        .args(&model_args)
        .args(&extra)
        .stdout(Stdio::piped())
        .spawn()
        .expect("da3 serve starts");
    let pid = server.id();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = format!(
        "{}/v1/depth",
        line.trim()
            .strip_prefix("listening on ")
            .expect("the address")
    );

    let photo = std::fs::read(image).unwrap();
    let mut body = Vec::new();
    write!(
        body,
        "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"process_res\"\r\n\r\n{res}\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"outputs\"\r\n\r\ndepth_f32\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\
         Content-Type: image/png\r\n\r\n"
    )
    .unwrap();
    body.extend_from_slice(&photo);
    write!(body, "\r\n--{BOUNDARY}--\r\n").unwrap();
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .build()
        .new_agent();
    let failures = AtomicUsize::new(0);
    let request = || {
        let start = Instant::now();
        let mut r = agent
            .post(&url)
            .header("Content-Type", &content_type)
            .send(&body[..])
            .expect("the request is answered");
        let ok = r.status().as_u16() == 200;
        let _ = r.body_mut().with_config().limit(64 << 20).read_to_vec();
        if !ok {
            failures.fetch_add(1, Ordering::Relaxed);
        }
        start.elapsed().as_secs_f64()
    };

    for _ in 0..10 {
        request();
    }
    let rss_10 = status_kib(pid, "VmRSS:");
    println!(
        "| clients | requests | throughput (req/s) | p50 ms | p99 ms | server RSS after (MiB) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut total = 10;
    // Then 1 client again: the same state as the first 10, after everything else.
    for clients in [1usize, 4, 16, 1] {
        let next = AtomicUsize::new(0);
        let latencies = Mutex::new(Vec::with_capacity(per_level));
        let start = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..clients {
                s.spawn(|| {
                    while next.fetch_add(1, Ordering::Relaxed) < per_level {
                        let t = request();
                        latencies.lock().unwrap().push(t);
                    }
                });
            }
        });
        let wall = start.elapsed().as_secs_f64();
        let mut l = latencies.into_inner().unwrap();
        l.sort_by(f64::total_cmp);
        total += l.len();
        println!(
            "| {clients} | {} | {:.2} | {:.0} | {:.0} | {:.1} |",
            l.len(),
            l.len() as f64 / wall,
            1000.0 * percentile(&l, 0.5),
            1000.0 * percentile(&l, 0.99),
            status_kib(pid, "VmRSS:") as f64 / 1024.0
        );
    }
    let rss_end = status_kib(pid, "VmRSS:");
    let peak = status_kib(pid, "VmHWM:");
    println!(
        "\nserver RSS after 10 requests {:.1} MiB, after {total} {:.1} MiB, peak {:.1} MiB; \
         non-200 answers: {}",
        rss_10 as f64 / 1024.0,
        rss_end as f64 / 1024.0,
        peak as f64 / 1024.0,
        failures.load(Ordering::Relaxed)
    );
    // SIGTERM (through kill(1)): the server finishes and exits.
    let _ = Command::new("kill").arg(pid.to_string()).status();
    let _ = server.wait();
}
