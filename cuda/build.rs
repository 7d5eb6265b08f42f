//! Compiles the CUDA sources with nvcc and links the CUDA runtime. cuDNN is not linked: the
//! cuDNN frontend's shim loads it when an [`Attention`](src/lib.rs) is made, so the binary
//! starts (and every other path runs) on a machine without cuDNN.
//!
//! Inputs, each checked before compiling with the missing piece named:
//! - nvcc: `CUDACXX`, else `CUDA_PATH` (or `CUDA_HOME`)`/bin`, else `PATH`, else
//!   `/usr/local/cuda/bin`; the runtime library beside it (`lib64`, `lib`, `targets/*/lib`).
//! - cuDNN 9 headers: `CUDNN_INCLUDE_DIR`, else `CUDNN_PATH/include` (PyPI `nvidia-cudnn-cu13`:
//!   `site-packages/nvidia/cudnn`), else the toolkit's and the system's include folders.
//! - the cuDNN frontend's headers: `CUDNN_FRONTEND_INCLUDE_DIR` (PyPI `nvidia-cudnn-frontend`:
//!   the wheel's `include` folder; GitHub NVIDIA/cudnn-frontend: `include`).
//! - `CUDA_ARCHITECTURES` as CMake writes it (`90`, `80;90`); default `80;90` (cuDNN's fused
//!   attention needs sm_80 or newer).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    panic!("da3-cuda: {message}");
}

fn env_path(var: &str) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={var}");
    env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn find_nvcc() -> PathBuf {
    if let Some(nvcc) = env_path("CUDACXX") {
        return nvcc;
    }
    for var in ["CUDA_PATH", "CUDA_HOME"] {
        if let Some(root) = env_path(var) {
            return root.join("bin/nvcc");
        }
    }
    if let Some(paths) = env::var_os("PATH") {
        if let Some(found) = env::split_paths(&paths)
            .map(|p| p.join("nvcc"))
            .find(|p| p.is_file())
        {
            return found;
        }
    }
    PathBuf::from("/usr/local/cuda/bin/nvcc")
}

/// The toolkit root: `CUDA_PATH`/`CUDA_HOME`, else nvcc's grandparent.
fn toolkit_root(nvcc: &Path) -> PathBuf {
    ["CUDA_PATH", "CUDA_HOME"]
        .into_iter()
        .find_map(env_path)
        .unwrap_or_else(|| {
            std::fs::canonicalize(nvcc)
                .unwrap_or_else(|_| nvcc.to_path_buf())
                .parent()
                .and_then(Path::parent)
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("/usr"))
        })
}

fn header_dir(
    var: &str,
    root_var: Option<&str>,
    header: &str,
    fallback: &[PathBuf],
    get: &str,
) -> PathBuf {
    let mut candidates: Vec<PathBuf> = env_path(var).into_iter().collect();
    if let Some(root_var) = root_var {
        candidates.extend(env_path(root_var).map(|r| r.join("include")));
    }
    candidates.extend(fallback.iter().cloned());
    candidates
        .into_iter()
        .find(|dir| dir.join(header).is_file())
        .unwrap_or_else(|| fail(&format!("{header} not found; set {var}. {get}")))
}

/// `libcudart.so` to link: the toolkit's, or an unversioned link in OUT_DIR to the versioned
/// library the PyPI wheels ship alone.
fn runtime_link_dir(root: &Path, out: &Path) -> PathBuf {
    let mut dirs = vec![root.join("lib64"), root.join("lib")];
    if let Ok(targets) = std::fs::read_dir(root.join("targets")) {
        dirs.extend(targets.flatten().map(|t| t.path().join("lib")));
    }
    for dir in &dirs {
        if dir.join("libcudart.so").exists() {
            return dir.clone();
        }
        let versioned = std::fs::read_dir(dir).ok().and_then(|entries| {
            entries.flatten().map(|e| e.path()).find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libcudart.so."))
            })
        });
        if let Some(versioned) = versioned {
            let link_dir = out.join("cuda-link");
            std::fs::create_dir_all(&link_dir).expect("OUT_DIR is writable");
            let link = link_dir.join("libcudart.so");
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&versioned, &link).expect("OUT_DIR is writable");
            return link_dir;
        }
    }
    fail(&format!(
        "no libcudart.so under the CUDA toolkit at {} (looked in {dirs:?})",
        root.display()
    ))
}

fn main() {
    println!("cargo:rerun-if-changed=src/attention.cu");
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let nvcc = find_nvcc();
    let version = Command::new(&nvcc).arg("--version").output();
    if !version.is_ok_and(|o| o.status.success()) {
        fail(&format!(
            "cannot run nvcc ({}); install a CUDA toolkit 12 or 13 (docs/gpu.md) or set CUDACXX",
            nvcc.display()
        ));
    }
    let root = toolkit_root(&nvcc);
    let cuda_include = root.join("include");
    let cudnn = header_dir(
        "CUDNN_INCLUDE_DIR",
        Some("CUDNN_PATH"),
        "cudnn.h",
        &[cuda_include.clone(), PathBuf::from("/usr/include")],
        "cuDNN 9 from PyPI: `pip install nvidia-cudnn-cu13`, then \
         CUDNN_PATH=<site-packages>/nvidia/cudnn",
    );
    let frontend = header_dir(
        "CUDNN_FRONTEND_INCLUDE_DIR",
        None,
        "cudnn_frontend.h",
        &[],
        "The cuDNN frontend's headers: the `include` folder of PyPI's `nvidia-cudnn-frontend` \
         wheel or of github.com/NVIDIA/cudnn-frontend",
    );
    let archs = env_path("CUDA_ARCHITECTURES")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "80;90".to_owned());

    // cc-rs takes nvcc from NVCC (a `compiler` override would get host-compiler flags).
    env::set_var("NVCC", &nvcc);
    let mut build = cc::Build::new();
    build
        .cuda(true)
        .cudart("none")
        .file("src/attention.cu")
        .include(&cuda_include)
        .include(&cudnn)
        .include(&frontend)
        .define("NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", None)
        .flag("-std=c++17")
        .flag("-O3")
        // cc-rs turns the profile's debug info (the workspace's release profile keeps line
        // tables) into nvcc's `-G`, which compiles device code unoptimised: our kernels ran at
        // a tenth of the card's bandwidth. Line tables for the profilers, never `-G`.
        .debug(false)
        .flag("-lineinfo")
        // The frontend's headers drop a [[nodiscard]] result (warning 2810) many times over.
        .flag("-diag-suppress=2810")
        .warnings(false);
    for arch in archs.split(';').map(str::trim).filter(|a| !a.is_empty()) {
        let number: String = arch.chars().take_while(char::is_ascii_digit).collect();
        if number.is_empty() {
            fail(&format!(
                "CUDA_ARCHITECTURES entry `{arch}`: expected numbers such as 80 or 90"
            ));
        }
        build.flag(format!("-gencode=arch=compute_{number},code=sm_{number}"));
    }
    build.compile("da3cuda");

    println!(
        "cargo:rustc-link-search=native={}",
        runtime_link_dir(&root, &out).display()
    );
    println!("cargo:rustc-link-lib=dylib=cudart");
    println!("cargo:rustc-link-lib=dylib=dl");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
