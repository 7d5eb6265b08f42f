//! `GGML_LIB_DIR` mode: link a shared ggml built elsewhere from the same source (for example
//! with CUDA on a GPU machine). The backend registry lives in `libggml`, so a binary linked
//! this way uses whatever backends that build has, without linking any of their symbols.

use crate::util::{env_path, export_metadata, fail, target_os};
use std::path::{Path, PathBuf};

/// Returns the header folder when `GGML_INCLUDE_DIR` names one (only `bindgen` needs it).
pub fn link(lib_dir: &Path) -> Option<PathBuf> {
    if !lib_dir.is_dir() {
        fail(&format!(
            "GGML_LIB_DIR={} is not a directory",
            lib_dir.display()
        ));
    }
    let file_name = |lib: &str| match target_os().as_str() {
        "windows" => format!("{lib}.dll"),
        "macos" => format!("lib{lib}.dylib"),
        _ => format!("lib{lib}.so"),
    };
    // ggml-cpu and ggml-rpc are linked directly: the safe layer calls their APIs (CPU thread
    // count, host-pointer buffers, the RPC client and server).
    let required = ["ggml", "ggml-base", "ggml-cpu", "ggml-rpc"];
    let missing: Vec<String> = required
        .iter()
        .map(|lib| file_name(lib))
        .filter(|f| !lib_dir.join(f).exists())
        .collect();
    if !missing.is_empty() {
        fail(&format!(
            "GGML_LIB_DIR={} is missing {}. Build ggml with -DBUILD_SHARED_LIBS=ON -DGGML_RPC=ON \
             and point GGML_LIB_DIR at the folder holding all of its libraries (put them in one \
             folder, e.g. with `cmake --install`).",
            lib_dir.display(),
            missing.join(", ")
        ));
    }
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    for lib in required {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
    let mut backends = vec!["cpu", "rpc"];
    for (lib, name) in [
        ("ggml-cuda", "cuda"),
        ("ggml-metal", "metal"),
        ("ggml-vulkan", "vulkan"),
    ] {
        if lib_dir.join(file_name(lib)).exists() {
            backends.push(name);
        }
    }
    let include = env_path("GGML_INCLUDE_DIR");
    export_metadata(include.as_deref(), lib_dir, true, &backends);
    include
}
