//! `da3 serve`'s tests' harness: the binary started on a free loopback port, driven over HTTP
//! (ureq), stopped with SIGTERM; multipart bodies; the checks of answers.

use base64::Engine as _;
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `da3 serve`; killed on drop unless [`Server::stop`] ran.
pub struct Server {
    pub child: Option<Child>,
    /// Kept open: the server may print more.
    _stdout: BufReader<std::process::ChildStdout>,
    pub addr: String,
    pub agent: ureq::Agent,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_command(Command::new(env!("CARGO_BIN_EXE_da3")), extra)
    }

    /// The server with its open-files limit (soft and hard) lowered to `limit` (`ulimit -n`).
    pub fn start_with_open_files(limit: u32, extra: &[&str]) -> Server {
        let mut command = Command::new("sh");
        command.args([
            "-c",
            &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
            env!("CARGO_BIN_EXE_da3"),
        ]);
        Server::start_command(command, extra)
    }

    /// `command` (`da3` or what runs it) given `serve` and its arguments.
    pub fn start_command(mut command: Command, extra: &[&str]) -> Server {
        let mut child = command
            .args(["-q", "serve", "--addr", "127.0.0.1:0"])
            .args(extra)
            .env("GGML_NO_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("da3 starts");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        Server {
            child: Some(child),
            _stdout: stdout,
            addr,
            agent,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// GET: (status, content type, body).
    pub fn get(&self, path: &str) -> (u16, String, String) {
        let mut r = self.agent.get(self.url(path)).call().unwrap();
        let ct = header(&r, "content-type");
        (
            r.status().as_u16(),
            ct,
            r.body_mut().read_to_string().unwrap(),
        )
    }

    /// POST /v1/depth with a multipart body: (status, JSON).
    pub fn post(&self, content_type: &str, body: &[u8]) -> (u16, Value) {
        self.post_to("/v1/depth", content_type, body)
    }

    /// POST `path` with a multipart body: (status, JSON).
    pub fn post_to(&self, path: &str, content_type: &str, body: &[u8]) -> (u16, Value) {
        let mut r = self
            .agent
            .post(self.url(path))
            .header("Content-Type", content_type)
            .send(body)
            .unwrap();
        let status = r.status().as_u16();
        let text = r
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .unwrap();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("status {status}: not JSON ({e}): {text}"));
        (status, json)
    }

    pub fn depth(&self, parts: &[(&str, Option<&str>, &[u8])]) -> (u16, Value) {
        let (ct, body) = multipart(parts);
        self.post(&ct, &body)
    }

    /// POST /v1/scene: (status, JSON).
    pub fn scene(&self, parts: &[(&str, Option<&str>, &[u8])]) -> (u16, Value) {
        let (ct, body) = multipart(parts);
        self.post_to("/v1/scene", &ct, &body)
    }

    /// POST /v1/depth: (status, the Retry-After header if any, JSON).
    pub fn depth_with_retry(
        &self,
        parts: &[(&str, Option<&str>, &[u8])],
    ) -> (u16, Option<String>, Value) {
        let (ct, body) = multipart(parts);
        let mut r = self
            .agent
            .post(self.url("/v1/depth"))
            .header("Content-Type", &ct)
            .send(&body[..])
            .unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let text = r
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_string()
            .unwrap();
        let json = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("status {status}: not JSON ({e}): {text}"));
        (status, retry, json)
    }

    /// Polls /metrics until `line` is one of its lines (at most 60 s).
    pub fn wait_for_metric(&self, line: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, _, body) = self.get("/metrics");
            if body.lines().any(|l| l == line) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no {line:?} in /metrics:\n{body}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes `request` on a new connection, closes the writing half, reads the answer.
    pub fn raw(&self, request: &[u8]) -> String {
        let mut raw = std::net::TcpStream::connect(&self.addr).unwrap();
        raw.write_all(request).unwrap();
        raw.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        let _ = raw.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    }

    /// SIGTERM, then the exit status (which must be success).
    pub fn stop(mut self) {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "after SIGTERM: {status:?}");
                return;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn header(r: &ureq::http::Response<ureq::Body>, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

pub const BOUNDARY: &str = "da3-test-boundary-7MA4YWxkTrZu0gW";

/// A multipart/form-data body of `(field, file name, bytes)`.
pub fn multipart(parts: &[(&str, Option<&str>, &[u8])]) -> (String, Vec<u8>) {
    let mut body = Vec::new();
    for (name, file, bytes) in parts {
        write!(
            body,
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"{name}\""
        )
        .unwrap();
        if let Some(file) = file {
            write!(
                body,
                "; filename=\"{file}\"\r\nContent-Type: application/octet-stream"
            )
            .unwrap();
        }
        body.extend_from_slice(b"\r\n\r\n");
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{BOUNDARY}--\r\n").unwrap();
    (format!("multipart/form-data; boundary={BOUNDARY}"), body)
}

pub fn f32s(b64: &Value) -> Vec<f32> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().expect("a base64 string"))
        .unwrap();
    assert_eq!(bytes.len() % 4, 0);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Asserts an error answer: the status, `{"error", "code"}` with code == status, and the
/// message containing `needle`.
pub fn assert_error(answer: (u16, Value), status: u16, needle: &str) {
    let (got, json) = answer;
    assert_eq!(got, status, "{json}");
    assert_eq!(json["code"], status, "{json}");
    let message = json["error"].as_str().expect("an error message");
    assert!(
        message.contains(needle),
        "{message:?} should mention {needle:?}"
    );
}

/// A PFM's values, rows top to bottom (the file's run bottom to top).
pub fn pfm_top_down(path: &std::path::Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
    let mut lines = text.splitn(4, '\n');
    assert_eq!(lines.next(), Some("Pf"), "{}", path.display());
    let size = lines.next().unwrap();
    let scale = lines.next().unwrap();
    let width: usize = size.split(' ').next().unwrap().parse().unwrap();
    let header = format!("Pf\n{size}\n{scale}\n").len();
    let values: Vec<f32> = bytes[header..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    values
        .chunks_exact(width)
        .rev()
        .flatten()
        .copied()
        .collect()
}

/// Asserts that every key of `expected` is in `got` with the same value: numbers within 1e-5
/// (relative, for magnitudes over 1), the rest equal. `got` may have more keys.
pub fn assert_json_close(expected: &Value, got: &Value, at: &str) {
    match (expected, got) {
        (Value::Object(want), Value::Object(have)) => {
            for (key, value) in want {
                let other = have
                    .get(key)
                    .unwrap_or_else(|| panic!("{at}: no key {key:?} in {got}"));
                assert_json_close(value, other, &format!("{at}.{key}"));
            }
        }
        (Value::Array(want), Value::Array(have)) => {
            assert_eq!(want.len(), have.len(), "{at}: lengths");
            for (i, (a, b)) in want.iter().zip(have).enumerate() {
                assert_json_close(a, b, &format!("{at}[{i}]"));
            }
        }
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() <= 1e-5 * a.abs().max(1.0), "{at}: {a} vs {b}");
        }
        _ => assert_eq!(expected, got, "{at}"),
    }
}
