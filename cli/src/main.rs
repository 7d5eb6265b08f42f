//! The `da3` command: depth estimation with Depth Anything 3 on ggml, and the tools around it.

#![deny(unsafe_code)]

mod cmd;
mod process;

fn main() -> std::process::ExitCode {
    cmd::main()
}
