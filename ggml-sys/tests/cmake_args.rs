//! The CMake definitions the build script passes for the GPU features, checked on any host
//! (Metal is never built here: this is how its arguments are tested without macOS).

#[path = "../build/cmake_args.rs"]
#[allow(dead_code)]
mod cmake_args;

use cmake_args::{cmake_defines, ggml_portable_cuda_architectures, CmakeInputs};

fn defines(features: &[&str], target_os: &str, archs: Option<&str>) -> Vec<(String, String)> {
    cmake_defines(&CmakeInputs {
        features,
        target_os,
        target_arch: "x86_64",
        target_features: &[],
        cuda_architectures: archs,
        cuda_compiler: archs.map(|_| "/cuda/bin/nvcc"),
        cuda_root: archs.map(|_| "/cuda"),
        cuda_libraries: &[],
        cuda_flags: None,
        vulkan: &[],
    })
}

fn get<'a>(d: &'a [(String, String)], key: &str) -> Option<&'a str> {
    d.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn metal_arguments_match_ggmls_metal_options() {
    let d = defines(&["METAL"], "macos", None);
    for (key, value) in [
        ("GGML_METAL", "ON"),
        ("GGML_METAL_EMBED_LIBRARY", "ON"),
        ("GGML_METAL_SHADER_DEBUG", "OFF"),
        ("GGML_METAL_TARGET_OS", "macos"),
        ("GGML_BLAS", "ON"),
        ("GGML_BLAS_VENDOR", "Apple"),
        ("GGML_ACCELERATE", "ON"),
        ("GGML_CUDA", "OFF"),
        ("GGML_VULKAN", "OFF"),
        ("GGML_RPC", "ON"),
        ("BUILD_SHARED_LIBS", "OFF"),
    ] {
        assert_eq!(get(&d, key), Some(value), "{key} in {d:?}");
    }
    assert!(d.iter().all(|(k, _)| !k.contains("CUDA_")), "{d:?}");
    let keys: Vec<&str> = d.iter().map(|(k, _)| k.as_str()).collect();
    let mut unique = keys.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        keys.len(),
        "a definition given twice: {keys:?}"
    );
}

#[test]
fn non_metal_builds_on_macos_turn_ggmls_apple_defaults_off() {
    // ggml defaults GGML_METAL and GGML_BLAS to ON on Apple hosts.
    let d = defines(&["VULKAN"], "macos", None);
    assert_eq!(get(&d, "GGML_METAL"), Some("OFF"));
    assert_eq!(get(&d, "GGML_BLAS"), Some("OFF"));
    assert_eq!(get(&d, "GGML_ACCELERATE"), Some("OFF"));
    assert_eq!(get(&d, "GGML_VULKAN"), Some("ON"));
}

#[test]
fn cuda_arguments() {
    let d = defines(&["CUDA"], "linux", Some("90"));
    assert_eq!(get(&d, "GGML_CUDA"), Some("ON"));
    assert_eq!(get(&d, "CMAKE_CUDA_ARCHITECTURES"), Some("90"));
    assert_eq!(get(&d, "CMAKE_CUDA_COMPILER"), Some("/cuda/bin/nvcc"));
    assert_eq!(get(&d, "CUDAToolkit_ROOT"), Some("/cuda"));
    assert_eq!(get(&d, "GGML_CUDA_GRAPHS"), Some("ON"));
    assert_eq!(get(&d, "GGML_METAL"), Some("OFF"));
    assert_eq!(get(&d, "GGML_METAL_EMBED_LIBRARY"), None);
}

#[test]
fn x86_cpu_options_follow_the_rust_target_not_the_build_host() {
    let features: Vec<String> = ["sse4.2", "avx", "avx2", "fma", "f16c", "bmi2"]
        .map(String::from)
        .to_vec();
    let d = cmake_defines(&CmakeInputs {
        features: &["CUDA"],
        target_os: "linux",
        target_arch: "x86_64",
        target_features: &features,
        cuda_architectures: Some("90"),
        cuda_compiler: None,
        cuda_root: None,
        cuda_libraries: &[],
        cuda_flags: None,
        vulkan: &[],
    });
    assert_eq!(get(&d, "GGML_NATIVE"), Some("OFF"));
    assert_eq!(get(&d, "GGML_AVX2"), Some("ON"));
    assert_eq!(get(&d, "GGML_FMA"), Some("ON"));
    assert_eq!(get(&d, "GGML_AVX512"), Some("OFF"));
    assert_eq!(get(&d, "GGML_AVX512_BF16"), Some("OFF"));
}

#[test]
fn portable_cuda_architectures_follow_ggml() {
    assert_eq!(
        ggml_portable_cuda_architectures(13, 0),
        "75-virtual;80-virtual;86-real;89-real;90-virtual;120a-real;121a-real"
    );
    assert_eq!(
        ggml_portable_cuda_architectures(12, 4),
        "50-virtual;61-virtual;70-virtual;75-virtual;80-virtual;86-real;89-real;90-virtual"
    );
}

/// Every `GGML_*` name passed is an option or cache variable of the ggml source built against,
/// so a renamed option upstream fails here rather than being ignored by CMake.
#[test]
fn every_ggml_option_passed_exists_in_the_source() {
    let Some(root) = option_env!("GGML_SYS_SOURCE_ROOT") else {
        eprintln!("skipped: built against a prebuilt ggml (GGML_LIB_DIR), no source to read");
        return;
    };
    let root = std::path::Path::new(root);
    // Every CMakeLists.txt of the source (options are declared next to their backends).
    let mut text = String::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == "CMakeLists.txt") {
                text += &std::fs::read_to_string(&path).unwrap();
            }
        }
    }
    // `option(NAME ...` or `set   (NAME ... CACHE ...`, any spacing.
    let declared = |name: &str| {
        text.lines().any(|l| {
            let l = l.trim_start();
            let rest = l
                .strip_prefix("option")
                .or_else(|| l.strip_prefix("set").filter(|_| l.contains("CACHE")));
            rest.and_then(|r| r.trim_start().strip_prefix('('))
                .is_some_and(|r| r.trim_start().starts_with(&format!("{name} ")))
        })
    };
    for features in [&["METAL"][..], &["CUDA"], &["VULKAN"]] {
        for (key, _) in defines(features, "macos", Some("90")) {
            if key.starts_with("GGML_") {
                assert!(
                    declared(&key),
                    "{key} ({features:?}) is not an option of ggml in {}",
                    root.display()
                );
            }
        }
    }
}
