//! The `da3` command: depth estimation with Depth Anything 3 on ggml, and the tools around it.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
