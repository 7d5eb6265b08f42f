//! `da3 repro` starts a `da3 rpc-server` child; killing `da3 repro` (SIGKILL, which runs no
//! handler, or SIGTERM) must not leave that server running.
#![cfg(target_os = "linux")]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Whether `pid` is a live process (a zombie waiting to be reaped counts as gone).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z') && !state.starts_with('X')
        }
        Err(_) => false,
    }
}

fn server_pid_of_killed_repro(signal: &str) -> u32 {
    let mut repro = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["repro", "--threads", "1"])
        .env("GGML_NO_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut pid = None;
    for line in BufReader::new(repro.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.split("(pid ").nth(1) {
            pid = rest.trim_end_matches(')').parse::<u32>().ok();
            break;
        }
    }
    let pid = pid.expect("repro names its rpc-server's pid");
    assert!(alive(pid));
    let status = Command::new("kill")
        .args([signal, &repro.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    repro.wait().unwrap();
    pid
}

#[test]
fn killing_repro_kills_its_rpc_server() {
    for signal in ["-KILL", "-TERM"] {
        let pid = server_pid_of_killed_repro(signal);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            !alive(pid),
            "rpc-server {pid} outlived `da3 repro` killed by {signal}"
        );
    }
}

/// A `da3` child whose parent is already gone when it starts (the pid it was given is not its
/// parent's) exits at once with an error, instead of running on with no one to kill it.
#[test]
fn a_child_whose_parent_is_gone_exits_at_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["devices"])
        .env("DA3_PARENT_PID", "1")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("parent process"), "{stderr}");
    // Without the variable the same command runs.
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["devices"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}
