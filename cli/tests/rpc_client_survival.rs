//! ggml's RPC client aborts its process when the connection dies mid-run and waits forever
//! when the server stops answering. What this crate makes of that, measured: through
//! `Device::rpc_with_answer_timeout` a stopped server becomes an abort within the timeout
//! instead of a hang, and work that must survive runs in a child process, whose death the
//! parent observes.
#![cfg(target_os = "linux")]

use da3::ggml::{Backend, Context, DType, Device, Gallocr};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ENDPOINT: &str = "DA3_TEST_RPC_ENDPOINT";
const CHILD: &str = "child_computes_until_the_connection_fails";

/// Runs only as the child of `a_stopped_server_becomes_an_abort_in_the_child_not_a_hang`.
#[test]
#[ignore = "run only as a child process"]
fn child_computes_until_the_connection_fails() {
    let endpoint = std::env::var(ENDPOINT).expect("run as a child");
    let device = Device::rpc_with_answer_timeout(&endpoint, Duration::from_secs(2)).unwrap();
    let backend = Backend::new(device).unwrap();
    let ctx = Context::metadata(8).unwrap();
    let x = ctx.new_tensor(DType::F32, &[4]).unwrap();
    x.mark_input();
    let y = ctx.scale(&x, 3.0).unwrap();
    y.mark_output();
    let graph = ctx.new_graph(8).unwrap();
    graph.expand(&y).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    for round in 0.. {
        run.write(&x, &[1.0f32, 2.0, 3.0, round as f32]).unwrap();
        run.compute(&backend).unwrap();
        let out = run.read::<f32>(&y).unwrap();
        assert_eq!(out[3], 3.0 * round as f32);
        eprintln!("child: round {round}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn signal(sig: &str, pid: u32) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

#[test]
fn a_stopped_server_becomes_an_abort_in_the_child_not_a_hang() {
    let mut server = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["rpc-server", "--port", "0", "--threads", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let endpoint = line.trim().rsplit(' ').next().unwrap().to_owned();

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            CHILD,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ENDPOINT, &endpoint)
        .env("GGML_NO_BACKTRACE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    while !seen.iter().any(|l: &String| l.contains("child: round 2")) {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("the child never computed:\n{}", seen.join("\n")));
        seen.push(line);
    }
    // The server stops answering: every relay in it freezes.
    signal("-STOP", server.id());
    let stopped = Instant::now();
    let deadline = stopped + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let waited = stopped.elapsed();
    signal("-CONT", server.id());
    let _ = server.kill();
    let _ = server.wait();
    let status = status.unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the child still waits for the stopped server after 20 s");
    });
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(2)) {
        seen.push(line);
    }
    let log = seen.join("\n");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(6), "{status:?}\n{log}");
    assert!(
        log.contains("Remote RPC server crashed or returned malformed response"),
        "{log}"
    );
    assert!(waited >= Duration::from_millis(1500), "{waited:?}");
    // This process, the parent, is unaffected.
}
