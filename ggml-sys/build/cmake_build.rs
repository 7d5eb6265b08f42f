//! GPU mode: the pinned source built with CMake (Metal needs its embedded shader library,
//! CUDA needs nvcc; neither can be driven by `cc` alone). Static libraries, linked here.

use crate::cmake_args::{cmake_defines, CmakeInputs};
use crate::source::Source;
use crate::util::{export_metadata, fail, out_dir, target_os};
use std::process::Command;

pub fn build(src: &Source, gpu_features: &[&str]) {
    require_tool(
        "cmake",
        &["--version"],
        "the metal/cuda/vulkan features build ggml with CMake (3.18 or newer: the distro's \
         `cmake` package, or `pip install cmake`)",
    );
    if gpu_features.contains(&"METAL") && target_os() != "macos" {
        fail("the `metal` feature builds only for macOS targets");
    }
    let cuda = gpu_features.contains(&"CUDA").then(crate::cuda::locate);
    let vulkan = gpu_features.contains(&"VULKAN").then(crate::vulkan::check);

    // ggml's own CMakeLists expects to be configured from a parent project (it has no
    // `ggml.pc.in` in this package), so configure a two-line wrapper around it.
    let wrapper = out_dir().join("cmake-wrapper");
    std::fs::create_dir_all(&wrapper).expect("create cmake wrapper dir");
    let root = src.root.display().to_string().replace('\\', "/");
    std::fs::write(
        wrapper.join("CMakeLists.txt"),
        format!(
            "cmake_minimum_required(VERSION 3.18)\nproject(ggml_sys C CXX)\nadd_subdirectory(\"{root}\" ggml)\n"
        ),
    )
    .expect("write cmake wrapper");

    let target_os = target_os();
    let archs = cuda.as_ref().map(|t| t.architectures());
    let nvcc = cuda.as_ref().map(|t| t.nvcc.display().to_string());
    let cuda_root = cuda.as_ref().map(|t| t.root.display().to_string());
    let cuda_libraries = cuda
        .as_ref()
        .map(|t| t.cmake_libraries.clone())
        .unwrap_or_default();
    let target_arch = crate::util::target_arch();
    let target_features = crate::util::target_features();
    let defines = cmake_defines(&CmakeInputs {
        features: gpu_features,
        target_os: &target_os,
        target_arch: &target_arch,
        target_features: &target_features,
        cuda_architectures: archs.as_deref(),
        cuda_compiler: nvcc.as_deref(),
        cuda_root: cuda_root.as_deref(),
        cuda_libraries: &cuda_libraries,
        cuda_flags: cuda.as_ref().and_then(|t| t.nvcc_flags.as_deref()),
        vulkan: vulkan
            .as_ref()
            .map(|v| v.cmake_defines.as_slice())
            .unwrap_or_default(),
    });
    let mut config = cmake::Config::new(&wrapper);
    config.profile("Release");
    for (key, value) in &defines {
        config.define(key, value);
    }
    // The cmake crate hands make cargo's jobserver through MAKEFLAGS, but the descriptors do
    // not survive `cmake --build`, and make falls back to -j1 ("jobserver unavailable").
    // Without CARGO_MAKEFLAGS the crate passes `--parallel $NUM_JOBS` (cargo's -j) instead.
    std::env::remove_var("CARGO_MAKEFLAGS");
    let started = std::time::Instant::now();
    let dst = config.build();
    println!(
        "cargo:warning=ggml ({}) built with CMake in {:.0} s",
        gpu_features.join(", ").to_lowercase(),
        started.elapsed().as_secs_f64()
    );

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
    if let Some(toolkit) = &cuda {
        toolkit.finish_driver_stub(&lib_dir.join("libggml-cuda.a"));
    }
    link_system_libraries(gpu_features, cuda.as_ref(), vulkan.as_ref());
    export_metadata(Some(&src.include_dir()), &lib_dir, false, &backends);
}

fn link_system_libraries(
    gpu_features: &[&str],
    cuda: Option<&crate::cuda::Toolkit>,
    vulkan: Option<&crate::vulkan::Vulkan>,
) {
    if let Some(toolkit) = cuda {
        // The unversioned names and the driver stub first, then the toolkit's own dirs.
        println!(
            "cargo:rustc-link-search=native={}",
            toolkit.link_dir.display()
        );
        for dir in &toolkit.lib_dirs {
            println!("cargo:rustc-link-search=native={}", dir.display());
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
    if let Some(vulkan) = vulkan {
        println!(
            "cargo:rustc-link-search=native={}",
            vulkan.link_dir.display()
        );
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

fn require_tool(program: &str, args: &[&str], why: &str) {
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => {}
        _ => fail(&format!("`{program}` was not found or does not run: {why}")),
    }
}
