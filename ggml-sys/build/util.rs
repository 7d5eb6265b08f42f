//! Small helpers shared by the build modes.

use std::path::PathBuf;

/// Stops the build with a message cargo shows verbatim (no panic backtrace noise).
pub fn fail(message: &str) -> ! {
    eprintln!("\nerror: ggml-sys: {message}\n");
    std::process::exit(1);
}

pub fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
}

/// GPU backends requested through cargo features, by their CMake option suffix.
pub fn enabled_gpu_features() -> Vec<&'static str> {
    [
        ("CARGO_FEATURE_METAL", "METAL"),
        ("CARGO_FEATURE_CUDA", "CUDA"),
        ("CARGO_FEATURE_VULKAN", "VULKAN"),
    ]
    .into_iter()
    .filter(|(var, _)| std::env::var_os(var).is_some())
    .map(|(_, name)| name)
    .collect()
}

/// The Rust target's enabled CPU features (`-C target-cpu=native` widens them).
pub fn target_features() -> Vec<String> {
    std::env::var("CARGO_CFG_TARGET_FEATURE")
        .unwrap_or_default()
        .split(',')
        .filter(|f| !f.is_empty())
        .map(str::to_owned)
        .collect()
}

pub fn target_arch() -> String {
    std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default()
}

pub fn target_os() -> String {
    std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default()
}

/// Link metadata for dependents (`DEP_GGML_*` in their build scripts).
pub fn export_metadata(
    include: Option<&std::path::Path>,
    lib_dir: &std::path::Path,
    shared: bool,
    backends: &[&str],
) {
    if let Some(include) = include {
        println!("cargo:include={}", include.display());
    }
    println!("cargo:lib_dir={}", lib_dir.display());
    println!("cargo:shared={}", u8::from(shared));
    println!("cargo:backends={}", backends.join(","));
}
