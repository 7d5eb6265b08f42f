//! `da3 rpc-server` against hostile clients, over raw TCP: each message below crashed, hung or
//! exhausted the memory of ggml's own server loop (measured before the supervisor existed).
//! After each one the server must keep serving other clients.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HELLO: u8 = 14;
const SET_TENSOR: u8 = 6;
const GRAPH_COMPUTE: u8 = 10;
const DEVICE_COUNT: u8 = 15;
/// `sizeof(rpc_tensor)` in ggml 0.26.0 (packed).
const RPC_TENSOR: usize = 296;
/// GGML_OP_MUL_MAT_ID in ggml 0.26.0.
const OP_MUL_MAT_ID: u32 = 30;

struct Server {
    child: Child,
    port: u16,
    stderr: tempfile::NamedTempFile,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let stderr = tempfile::NamedTempFile::new().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
            .args(["rpc-server", "--port", "0", "--threads", "1"])
            .args(extra)
            .env("GGML_NO_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().unwrap())
            .spawn()
            .expect("da3 rpc-server starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server {
            child,
            port,
            stderr,
        }
    }
    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }
    /// Waits for `text` in the server's log.
    fn wait_log(&self, text: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.log().contains(text) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
    fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
    /// A well-behaved client: HELLO, then DEVICE_COUNT answers 1.
    fn assert_serves(&mut self) {
        assert!(self.alive(), "the server died:\n{}", self.log());
        let mut s = self.connect();
        hello(&mut s);
        send(&mut s, DEVICE_COUNT, &[]);
        assert_eq!(answer(&mut s), 1u32.to_le_bytes(), "{}", self.log());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn header(cmd: u8, size: u64) -> Vec<u8> {
    let mut h = vec![cmd];
    h.extend(size.to_le_bytes());
    h
}

fn send(s: &mut TcpStream, cmd: u8, payload: &[u8]) {
    let mut msg = header(cmd, payload.len() as u64);
    msg.extend(payload);
    s.write_all(&msg).unwrap();
}

fn answer(s: &mut TcpStream) -> Vec<u8> {
    let mut size = [0u8; 8];
    s.read_exact(&mut size).expect("an answer");
    let mut out = vec![0u8; u64::from_le_bytes(size) as usize];
    s.read_exact(&mut out).unwrap();
    out
}

fn hello(s: &mut TcpStream) {
    send(s, HELLO, &[0u8; 24]);
    let rsp = answer(s);
    assert_eq!(rsp.len(), 28, "hello answer");
    assert_eq!(rsp[0], 7, "protocol major version");
}

/// The server closes the connection (EOF or reset) within the read timeout.
fn assert_closed(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) if started.elapsed() < Duration::from_secs(19) => return,
            Ok(0) | Err(_) => panic!("no close within the timeout"),
            Ok(_) => {}
        }
    }
}

/// One packed rpc_tensor: f32, no buffer, `ne`, contiguous strides, `op`, no sources.
fn rpc_tensor(id: u64, ne: [u32; 4], op: u32) -> Vec<u8> {
    let mut t = Vec::with_capacity(RPC_TENSOR);
    t.extend(id.to_le_bytes());
    t.extend(0u32.to_le_bytes()); // type f32
    t.extend(0u64.to_le_bytes()); // buffer
    for d in ne {
        t.extend(d.to_le_bytes());
    }
    let mut nb = 4u32;
    for d in ne {
        t.extend(nb.to_le_bytes());
        nb = nb.wrapping_mul(d);
    }
    t.extend(op.to_le_bytes());
    t.extend([0u8; 64]); // op_params
    t.extend(0i32.to_le_bytes()); // flags
    t.extend([0u8; 80]); // src
    t.extend([0u8; 24]); // view_src, view_offs, data
    t.extend([0u8; 64]); // name
    t.extend(0i32.to_le_bytes()); // use_count
    assert_eq!(t.len(), RPC_TENSOR);
    t
}

/// A GRAPH_COMPUTE payload of one node on device 0.
fn graph_of(tensor: Vec<u8>, id: u64) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend(0u32.to_le_bytes());
    p.extend(1u32.to_le_bytes());
    p.extend(id.to_le_bytes());
    p.extend(1u32.to_le_bytes());
    p.extend(tensor);
    p
}

#[test]
fn huge_size_fields_are_refused_before_ggml_reads_them() {
    let mut server = Server::start(&[]);
    for (cmd, size) in [
        (SET_TENSOR, 1u64 << 63),
        (GRAPH_COMPUTE, u64::MAX),
        // 4 GiB with no data: ggml would zero-fill 4 GiB, then wait.
        (SET_TENSOR, 4 << 30),
    ] {
        let mut s = server.connect();
        hello(&mut s);
        s.write_all(&header(cmd, size)).unwrap();
        assert_closed(&mut s);
        assert!(
            server.wait_log(&format!("refused: command {cmd} declares {size} bytes")),
            "{}",
            server.log()
        );
        server.assert_serves();
    }
}

#[test]
fn a_limit_below_the_default_applies() {
    let mut server = Server::start(&["--max-message-mib", "1"]);
    let mut s = server.connect();
    hello(&mut s);
    s.write_all(&header(SET_TENSOR, (1 << 20) + 1)).unwrap();
    assert_closed(&mut s);
    server.assert_serves();
}

#[test]
fn unknown_commands_and_a_missing_hello_are_refused() {
    let mut server = Server::start(&[]);
    let mut s = server.connect();
    send(&mut s, DEVICE_COUNT, &[]);
    assert_closed(&mut s);
    let mut s = server.connect();
    hello(&mut s);
    send(&mut s, 200, &[]);
    assert_closed(&mut s);
    assert!(server.wait_log("unknown command 200"), "{}", server.log());
    server.assert_serves();
}

/// A tensor of dims 2^32-1 trips ggml's element-count assertion (abort); a MUL_MAT_ID node
/// with no sources makes the CPU backend dereference NULL (SIGSEGV). Either kills only the
/// worker of that connection.
#[test]
fn graphs_that_crash_ggml_kill_only_their_worker() {
    let mut server = Server::start(&[]);
    let cases = [
        ("huge dims", rpc_tensor(1, [u32::MAX; 4], 0)),
        (
            "mul_mat_id without sources",
            rpc_tensor(1, [4, 4, 1, 1], OP_MUL_MAT_ID),
        ),
    ];
    for (i, (what, tensor)) in cases.into_iter().enumerate() {
        let mut s = server.connect();
        hello(&mut s);
        send(&mut s, GRAPH_COMPUTE, &graph_of(tensor, 1));
        assert_closed(&mut s);
        let mut deaths = 0;
        let deadline = Instant::now() + Duration::from_secs(10);
        while deaths <= i && Instant::now() < deadline {
            deaths = server.log().matches("(worker signal").count();
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(deaths > i, "{what}: no worker died:\n{}", server.log());
        server.assert_serves();
    }
    let log = server.log();
    assert!(log.contains("SIGABRT"), "{log}");
    assert!(log.contains("SIGSEGV"), "{log}");
}

/// ggml serves one connection at a time: an idle client used to block every other. Here
/// others are served meanwhile, and the idle one is dropped after the timeout.
#[test]
fn an_idle_client_blocks_nobody_and_is_dropped() {
    let mut server = Server::start(&["--idle-timeout", "2"]);
    let mut idle = server.connect();
    hello(&mut idle);
    let mut silent = server.connect(); // not even a HELLO
    let started = Instant::now();
    server.assert_serves();
    server.assert_serves();
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_closed(&mut idle);
    assert_closed(&mut silent);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(1500) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert!(server.wait_log("client idle"), "{}", server.log());
    server.assert_serves();
}

#[test]
fn a_non_loopback_address_needs_allow_remote() {
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["rpc-server", "--host", "0.0.0.0", "--port", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--allow-remote"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args([
            "rpc-server",
            "--host",
            "0.0.0.0",
            "--port",
            "0",
            "--allow-remote",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("rpc-server: listening on 0.0.0.0:"),
        "{line}"
    );
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("WARNING"));
}

/// A client that leaves frees its slot at once. The relay used to report every ordinary end as
/// the server's, and the supervisor then waited 5 s for a worker that never exits (ggml's
/// server loops): three quick `da3 depth` runs filled the eight slots.
#[test]
fn a_client_that_leaves_frees_its_slot_at_once() {
    let mut server = Server::start(&["--max-connections", "1"]);
    for served in 1..=4 {
        server.assert_serves();
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.log().matches("client closed the connection").count() < served {
            assert!(Instant::now() < deadline, "{}", server.log());
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(!server.log().contains("turned away"), "{}", server.log());
    assert!(
        !server.log().contains("server side closed"),
        "{}",
        server.log()
    );
}

/// ggml's client aborts the process when the HELLO exchange fails; a server at its connection
/// limit closes new connections unanswered. `da3 depth` does the HELLO itself first and names
/// the problem.
#[test]
fn a_client_turned_away_gets_an_error_not_an_abort() {
    let server = Server::start(&["--max-connections", "1"]);
    let mut holder = server.connect();
    hello(&mut holder);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .current_dir(dir.path())
        .args([
            "depth",
            "--device",
            &format!("rpc:127.0.0.1:{}", server.port),
        ])
        .args(["--pfm", "depth.pfm"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("refused the handshake"), "{stderr}");
    assert!(stderr.contains("--max-connections"), "{stderr}");
    assert!(!dir.path().join("depth.pfm").exists());
    assert!(server.wait_log("turned away"), "{}", server.log());
    drop(holder);
}
