//! The `da3` command: depth estimation with Depth Anything 3 on ggml, and the tools around it.

mod cmd;

fn main() -> std::process::ExitCode {
    cmd::main()
}
