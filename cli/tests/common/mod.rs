//! Helpers of the CLI's tests: the library's fixture helpers, and running the `da3` binary.
#![allow(dead_code, unused_imports)]

#[path = "../../../tests/common/mod.rs"]
mod fixtures;
pub use fixtures::*;

mod checkpoint;
pub use checkpoint::*;

mod rpc_server;
pub use rpc_server::RpcServer;

/// `da3 serve`'s harness (`cli/tests/serve.rs`).
pub mod serve;

use std::path::Path;

/// How one run of the `da3` binary ended.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Everything a failed assertion should show.
    pub fn context(&self) -> String {
        format!(
            "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `da3 ARGS` in `cwd` (the binary this test target was built with).
pub fn da3_in<S: AsRef<std::ffi::OsStr>>(cwd: &Path, args: &[S]) -> Run {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(args)
        .current_dir(cwd)
        // A crashing child must not attach a debugger for a backtrace.
        .env("GGML_NO_BACKTRACE", "1")
        .output()
        .expect("da3 starts");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Exit 1 with an error (not a panic, abort or signal) whose text mentions every one of
/// `parts`. Warnings (e.g. that the built-in model stands in) may come before the `Error:` line.
pub fn assert_clean_failure(run: &Run, parts: &[&str]) {
    assert_eq!(run.code, Some(1), "{}", run.context());
    assert!(
        run.stderr.lines().any(|l| l.starts_with("Error:")),
        "stderr should have an `Error:` line\n{}",
        run.context()
    );
    for bad in ["panicked", "RUST_BACKTRACE", "core dumped"] {
        assert!(!run.stderr.contains(bad), "{}", run.context());
    }
    for part in parts {
        assert!(
            run.stderr.contains(part),
            "stderr should mention `{part}`\n{}",
            run.context()
        );
    }
}

/// The names in `dir` (hidden temporary files included), sorted.
pub fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
