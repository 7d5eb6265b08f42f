//! Link settings that must reach the `da3` binary, tests, examples and benches: a build
//! script's link arguments do not propagate from `ggml-sys` to its dependents, so when
//! `ggml-sys` links a shared ggml (`GGML_LIB_DIR`), the run-time search path is set here.

fn main() {
    println!("cargo:rerun-if-env-changed=GGML_LIB_DIR");
    let shared = std::env::var("DEP_GGML_SHARED").is_ok_and(|v| v == "1");
    if let (true, Ok(lib_dir)) = (shared, std::env::var("DEP_GGML_LIB_DIR")) {
        if std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os != "windows") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{lib_dir}");
        }
    }
}
