//! Builds or links ggml for the raw bindings in `src/`.
//!
//! Mode, in order of precedence:
//! - `GGML_LIB_DIR=/path`: link an existing shared ggml (e.g. one built with CUDA elsewhere);
//! - feature `metal`, `cuda` or `vulkan`: build the pinned source with CMake;
//! - otherwise: build ggml-base, the registry, the CPU and the RPC backends with `cc`
//!   (no CMake, no libclang).
//!
//! The source is the pinned registry package (`pin/`) unless `GGML_SOURCE_DIR`
//! names a local ggml checkout.

// The `cc` path's helpers are unused in a CMake (GPU feature) build and vice versa.
#![cfg_attr(
    any(feature = "metal", feature = "cuda", feature = "vulkan"),
    allow(dead_code)
)]

#[path = "build/bindings.rs"]
mod bindings;
#[path = "build/cc_build.rs"]
mod cc_build;
#[cfg(any(feature = "metal", feature = "cuda", feature = "vulkan"))]
#[path = "build/cmake_args.rs"]
mod cmake_args;
#[cfg(any(feature = "metal", feature = "cuda", feature = "vulkan"))]
#[path = "build/cmake_build.rs"]
mod cmake_build;
#[path = "build/cpu_variants.rs"]
mod cpu_variants;
#[cfg(any(feature = "metal", feature = "cuda", feature = "vulkan"))]
#[path = "build/cuda.rs"]
mod cuda;
#[path = "build/prebuilt.rs"]
mod prebuilt;
#[path = "build/source.rs"]
mod source;
#[path = "build/util.rs"]
mod util;
#[cfg(any(feature = "metal", feature = "cuda", feature = "vulkan"))]
#[path = "build/vulkan.rs"]
mod vulkan;

fn main() {
    for var in [
        "GGML_LIB_DIR",
        "GGML_INCLUDE_DIR",
        "GGML_SOURCE_DIR",
        "CUDA_ARCHITECTURES",
        "GGML_SYS_CPU_VARIANTS",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build");
    // Set by the cc build when it compiles ggml's CPU backend in several variants; declared
    // in every mode (a prebuilt or CMake ggml never sets it).
    println!("cargo::rustc-check-cfg=cfg(ggml_sys_cpu_dispatch)");

    let gpu_features = util::enabled_gpu_features();
    let headers = if let Some(lib_dir) = util::env_path("GGML_LIB_DIR") {
        if !gpu_features.is_empty() {
            util::fail(&format!(
                "GGML_LIB_DIR links a prebuilt ggml, so the features {gpu_features:?} have \
                 nothing to build; drop the features (the prebuilt library decides the backends)"
            ));
        }
        prebuilt::link(&lib_dir)
    } else {
        let src = source::locate();
        #[cfg(any(feature = "metal", feature = "cuda", feature = "vulkan"))]
        cmake_build::build(&src, &gpu_features);
        #[cfg(not(any(feature = "metal", feature = "cuda", feature = "vulkan")))]
        cc_build::build(&src);
        Some(src.include_dir())
    };
    bindings::emit(headers.as_deref());
}
