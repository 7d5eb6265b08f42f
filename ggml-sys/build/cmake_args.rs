//! The CMake cache definitions of a GPU build, as a pure function of what the build script
//! found, so that they can be tested on any host (`tests/cmake_args.rs` includes this file).
//! Option names are ggml 0.26.0's (`ggml/CMakeLists.txt`, `ggml/src/ggml-*/CMakeLists.txt`).

/// What the build script decided before configuring.
pub struct CmakeInputs<'a> {
    /// Requested backends by CMake suffix: "METAL", "CUDA", "VULKAN".
    pub features: &'a [&'a str],
    /// `CARGO_CFG_TARGET_OS`.
    pub target_os: &'a str,
    /// `CARGO_CFG_TARGET_ARCH`.
    pub target_arch: &'a str,
    /// `CARGO_CFG_TARGET_FEATURE`, split: ggml's CPU code follows the Rust target, as in the
    /// `cc` build (`-C target-cpu=native` from .cargo/config.toml, or a portable baseline).
    pub target_features: &'a [String],
    /// `CMAKE_CUDA_ARCHITECTURES` (CUDA only), already resolved from `CUDA_ARCHITECTURES`.
    pub cuda_architectures: Option<&'a str>,
    /// Path to nvcc (CUDA only).
    pub cuda_compiler: Option<&'a str>,
    /// The toolkit root (CUDA only): `CUDAToolkit_ROOT`.
    pub cuda_root: Option<&'a str>,
    /// Libraries FindCUDAToolkit would otherwise search for by unversioned name
    /// (`CUDA_cudart_LIBRARY`, ...), e.g. when the toolkit ships only `libcudart.so.13`.
    pub cuda_libraries: &'a [(&'a str, String)],
    /// Extra nvcc flags (CUDA only), e.g. `-L<root>/lib` where nvcc.profile expects `lib64`.
    pub cuda_flags: Option<&'a str>,
    /// What the Vulkan checks found (VULKAN only): `Vulkan_INCLUDE_DIR`, `Vulkan_LIBRARY`, ...
    pub vulkan: &'a [(&'static str, String)],
}

/// ggml's x86 CPU options and the Rust target features they correspond to.
pub const X86_OPTIONS: [(&str, &str); 11] = [
    ("GGML_SSE42", "sse4.2"),
    ("GGML_AVX", "avx"),
    ("GGML_AVX2", "avx2"),
    ("GGML_BMI2", "bmi2"),
    ("GGML_FMA", "fma"),
    ("GGML_F16C", "f16c"),
    ("GGML_AVX_VNNI", "avxvnni"),
    ("GGML_AVX512", "avx512f"),
    ("GGML_AVX512_VBMI", "avx512vbmi"),
    ("GGML_AVX512_VNNI", "avx512vnni"),
    ("GGML_AVX512_BF16", "avx512bf16"),
];

/// `-D` definitions, in order.
pub fn cmake_defines(inputs: &CmakeInputs) -> Vec<(String, String)> {
    let mut d: Vec<(String, String)> = Vec::new();
    let mut set = |k: &str, v: &str| d.push((k.to_owned(), v.to_owned()));
    let has = |f: &str| inputs.features.contains(&f);

    set("BUILD_SHARED_LIBS", "OFF");
    set("GGML_BUILD_TESTS", "OFF");
    set("GGML_BUILD_EXAMPLES", "OFF");
    set("GGML_OPENMP", "OFF");
    set("GGML_RPC", "ON");
    set("GGML_RPC_RDMA", "OFF");
    if matches!(inputs.target_arch, "x86_64" | "x86") {
        // Not -march=native: a binary built for x86-64-v3 must not pick up the build host's
        // AVX-512. Each ggml x86 option follows the Rust target feature of the same meaning.
        set("GGML_NATIVE", "OFF");
        let on = |f: &str| inputs.target_features.iter().any(|t| t == f);
        for (option, feature) in X86_OPTIONS {
            set(option, if on(feature) { "ON" } else { "OFF" });
        }
    } else {
        set("GGML_NATIVE", "ON");
    }
    // ggml turns Metal and BLAS on by default on Apple hosts: say every backend explicitly,
    // so a `cuda` or `vulkan` build on macOS does not grow a Metal backend nobody asked for.
    for backend in ["METAL", "CUDA", "VULKAN"] {
        set(
            &format!("GGML_{backend}"),
            if has(backend) { "ON" } else { "OFF" },
        );
    }

    if has("METAL") {
        // The shaders embedded in the library (no `default.metallib` next to the binary),
        // ggml's default whenever GGML_METAL is on; release shaders (fast math) and logging.
        set("GGML_METAL_EMBED_LIBRARY", "ON");
        set("GGML_METAL_SHADER_DEBUG", "OFF");
        set("GGML_METAL_NDEBUG", "OFF");
        set("GGML_METAL_TARGET_OS", "macos");
        // ggml's Apple default: the BLAS backend on Accelerate, which the Metal build links.
        set("GGML_BLAS", "ON");
        set("GGML_BLAS_VENDOR", "Apple");
        set("GGML_ACCELERATE", "ON");
    } else {
        set("GGML_BLAS", "OFF");
        if inputs.target_os == "macos" {
            set("GGML_ACCELERATE", "OFF");
        }
    }

    if has("CUDA") {
        if let Some(nvcc) = inputs.cuda_compiler {
            set("CMAKE_CUDA_COMPILER", nvcc);
        }
        if let Some(root) = inputs.cuda_root {
            set("CUDAToolkit_ROOT", root);
        }
        if let Some(flags) = inputs.cuda_flags {
            set("CMAKE_CUDA_FLAGS", flags);
        }
        for (var, path) in inputs.cuda_libraries {
            set(var, path);
        }
        if let Some(archs) = inputs.cuda_architectures {
            set("CMAKE_CUDA_ARCHITECTURES", archs);
        }
        // CUDA graphs replay a repeated graph's ~1200 kernel launches at once (DA3-large on
        // an H200: 22.4 ms per image against 23.6 ms, results identical); ggml leaves them
        // off outside llama.cpp.
        set("GGML_CUDA_GRAPHS", "ON");
        set("GGML_CUDA_NCCL", "OFF");
    }
    if has("VULKAN") {
        for (var, value) in inputs.vulkan {
            set(var, value);
        }
    }
    d
}

/// ggml's own architecture list for a build without `native` (ggml-cuda/CMakeLists.txt,
/// `GGML_NATIVE` off): PTX for the older families, real code for the common GPUs.
pub fn ggml_portable_cuda_architectures(cuda_major: u32, cuda_minor: u32) -> String {
    let v = (cuda_major, cuda_minor);
    let mut archs: Vec<&str> = Vec::new();
    if v < (13, 0) {
        archs.extend(["50-virtual", "61-virtual", "70-virtual"]);
    }
    archs.extend(["75-virtual", "80-virtual", "86-real"]);
    if v >= (11, 8) {
        archs.extend(["89-real", "90-virtual"]);
    }
    if v >= (12, 8) {
        archs.push("120a-real");
    }
    if v >= (12, 9) {
        archs.push("121a-real");
    }
    archs.join(";")
}
