//! GPU mode: the pinned source built with CMake (Metal needs its embedded shader library,
//! CUDA needs nvcc; neither can be driven by `cc` alone). Static libraries, linked here.

use crate::source::Source;
use crate::util::{export_metadata, fail, out_dir, target_os};
use std::path::{Path, PathBuf};
use std::process::Command;

pub fn build(src: &Source, gpu_features: &[&str]) {
    require_tool(
        "cmake",
        &["--version"],
        "the metal/cuda/vulkan features build ggml with CMake",
    );
    if gpu_features.contains(&"CUDA") {
        let nvcc = cuda_root()
            .map(|root| root.join("bin/nvcc"))
            .filter(|p| p.is_file());
        let nvcc = nvcc.unwrap_or_else(|| PathBuf::from("nvcc"));
        require_tool(
            nvcc.to_str().unwrap_or("nvcc"),
            &["--version"],
            "the `cuda` feature needs the CUDA toolkit (nvcc); set CUDA_PATH or put nvcc on PATH",
        );
    }
    if gpu_features.contains(&"METAL") && target_os() != "macos" {
        fail("the `metal` feature builds only for macOS targets");
    }

    // ggml's own CMakeLists expects to be configured from a parent project (it has no
    // `ggml.pc.in` in this package), so configure a two-line wrapper around it.
    let wrapper = out_dir().join("cmake-wrapper");
    std::fs::create_dir_all(&wrapper).expect("create cmake wrapper dir");
    let root = src.root.display().to_string().replace('\\', "/");
    std::fs::write(
        wrapper.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.14)\nproject(ggml_sys C CXX)\nadd_subdirectory(\"{root}\" ggml)\n"
        ),
    )
    .expect("write cmake wrapper");

    let mut config = cmake::Config::new(&wrapper);
    config
        .profile("Release")
        .define("BUILD_SHARED_LIBS", "OFF")
        .define("GGML_BUILD_TESTS", "OFF")
        .define("GGML_BUILD_EXAMPLES", "OFF")
        .define("GGML_OPENMP", "OFF")
        .define("GGML_RPC", "ON")
        .define("GGML_RPC_RDMA", "OFF")
        .define("GGML_NATIVE", "ON");
    for feature in gpu_features {
        config.define(format!("GGML_{feature}"), "ON");
    }
    if gpu_features.contains(&"CUDA") {
        let archs = std::env::var("CUDA_ARCHITECTURES").unwrap_or_else(|_| "native".to_owned());
        // CUDA graphs replay a repeated graph's ~1200 kernel launches at once (DA3-large on an
        // H200: 22.4 ms per image against 23.6 ms, results identical); ggml leaves them off
        // outside llama.cpp.
        config
            .define("CMAKE_CUDA_ARCHITECTURES", archs)
            .define("GGML_CUDA_NCCL", "OFF")
            .define("GGML_CUDA_GRAPHS", "ON");
    }
    if gpu_features.contains(&"METAL") {
        config.define("GGML_METAL_EMBED_LIBRARY", "ON");
    }
    let dst = config.build();

    let lib_dir = dst.join("lib");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!(
        "cargo:rustc-link-search=native={}",
        dst.join("lib64").display()
    );
    // Dependents first, ggml-base last: static archives resolve left to right.
    let mut libs = vec!["ggml", "ggml-cpu", "ggml-rpc"];
    let mut backends = vec!["cpu", "rpc"];
    for feature in gpu_features {
        match *feature {
            "CUDA" => {
                libs.push("ggml-cuda");
                backends.push("cuda");
            }
            "METAL" => {
                libs.push("ggml-metal");
                libs.push("ggml-blas");
                backends.push("metal");
            }
            "VULKAN" => {
                libs.push("ggml-vulkan");
                backends.push("vulkan");
            }
            _ => {}
        }
    }
    libs.push("ggml-base");
    for lib in libs {
        if lib_dir.join(format!("lib{lib}.a")).exists()
            || lib_dir.join(format!("{lib}.lib")).exists()
        {
            println!("cargo:rustc-link-lib=static={lib}");
        }
    }
    link_system_libraries(gpu_features);
    export_metadata(Some(&src.include_dir()), &lib_dir, false, &backends);
}

fn link_system_libraries(gpu_features: &[&str]) {
    if gpu_features.contains(&"CUDA") {
        if let Some(root) = cuda_root() {
            for sub in ["lib64", "lib", "lib/x64", "lib64/stubs"] {
                println!(
                    "cargo:rustc-link-search=native={}",
                    root.join(sub).display()
                );
            }
        }
        for lib in ["cudart", "cublas", "cublasLt", "cuda"] {
            println!("cargo:rustc-link-lib={lib}");
        }
    }
    if gpu_features.contains(&"METAL") {
        for framework in ["Foundation", "Metal", "MetalKit", "Accelerate"] {
            println!("cargo:rustc-link-lib=framework={framework}");
        }
    }
    if gpu_features.contains(&"VULKAN") {
        println!("cargo:rustc-link-lib=vulkan");
    }
    match target_os().as_str() {
        "macos" => println!("cargo:rustc-link-lib=c++"),
        "windows" => {}
        _ => {
            for lib in ["stdc++", "dl", "pthread", "m"] {
                println!("cargo:rustc-link-lib={lib}");
            }
        }
    }
}

fn cuda_root() -> Option<PathBuf> {
    for var in ["CUDA_PATH", "CUDA_HOME", "CUDA_TOOLKIT_ROOT_DIR"] {
        println!("cargo:rerun-if-env-changed={var}");
        if let Some(dir) = crate::util::env_path(var) {
            return Some(dir);
        }
    }
    let default = Path::new("/usr/local/cuda");
    default.is_dir().then(|| default.to_path_buf())
}

fn require_tool(program: &str, args: &[&str], why: &str) {
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => {}
        _ => fail(&format!("`{program}` was not found or does not run: {why}")),
    }
}
