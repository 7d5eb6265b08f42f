//! `da3 rpc-server --port 0` on loopback as a test fixture: started, its endpoint read from
//! the line it prints, signalled, and killed and reaped on drop.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct RpcServer {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
}

impl RpcServer {
    /// A server on one CPU thread.
    pub fn start() -> RpcServer {
        let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
            .args(["rpc-server", "--port", "0", "--threads", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let endpoint = line.trim().rsplit(' ').next().unwrap().to_owned();
        assert!(endpoint.starts_with("127.0.0.1:"), "{line}");
        RpcServer { child, endpoint }
    }

    /// The `--device` that names it.
    pub fn device(&self) -> String {
        format!("rpc:{}", self.endpoint)
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.child.id() as i32), signal).unwrap();
    }
}

impl Drop for RpcServer {
    /// Continued first (a stopped process dies of SIGKILL anyway, but reaping waits for it).
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
