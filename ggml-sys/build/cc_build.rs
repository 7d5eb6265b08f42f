//! Default mode: ggml-base, the backend registry, the CPU backend and the RPC backend compiled
//! with the `cc` crate into one static library. Needs only a C/C++ compiler.

use crate::cpu_variants;
use crate::source::Source;
use crate::util::{export_metadata, out_dir, target_arch, target_features, target_os};
use std::path::{Path, PathBuf};

const BASE_SOURCES: &[&str] = &[
    "ggml.c",
    "ggml.cpp",
    "ggml-alloc.c",
    "ggml-backend.cpp",
    "ggml-backend-meta.cpp",
    "ggml-threading.cpp",
    "ggml-quants.c",
    "gguf.cpp",
    "ggml-opt.cpp",
];
const REGISTRY_SOURCES: &[&str] = &["ggml-backend-reg.cpp", "ggml-backend-dl.cpp"];
const CPU_SOURCES: &[&str] = &[
    "ggml-cpu/ggml-cpu.c",
    "ggml-cpu/ggml-cpu.cpp",
    "ggml-cpu/repack.cpp",
    "ggml-cpu/hbm.cpp",
    "ggml-cpu/quants.c",
    "ggml-cpu/traits.cpp",
    "ggml-cpu/amx/amx.cpp",
    "ggml-cpu/amx/mmq.cpp",
    "ggml-cpu/tiled/tiled.cpp",
    "ggml-cpu/tiled/tiled-kernel.cpp",
    "ggml-cpu/binary-ops.cpp",
    "ggml-cpu/unary-ops.cpp",
    "ggml-cpu/vec.cpp",
    "ggml-cpu/ops.cpp",
    "ggml-cpu/llamafile/sgemm.cpp",
];
const RPC_SOURCES: &[&str] = &["ggml-rpc/ggml-rpc.cpp", "ggml-rpc/transport.cpp"];

pub fn build(src: &Source) {
    let generated = write_version_header(src);
    let (arch_sources, arch_flags, arch_defines) = cpu_arch();

    let mut objects = Vec::new();
    let base_defines: &[&str] = &["GGML_SCHED_MAX_COPIES=4"];
    objects.extend(compile(src, &generated, BASE_SOURCES, base_defines, &[]));
    objects.extend(compile(
        src,
        &generated,
        REGISTRY_SOURCES,
        &["GGML_USE_CPU", "GGML_USE_RPC"],
        &[],
    ));

    let mut cpu_sources: Vec<&str> = CPU_SOURCES.to_vec();
    cpu_sources.extend(arch_sources);
    let mut cpu_defines = vec!["GGML_USE_CPU_REPACK", "GGML_USE_LLAMAFILE"];
    cpu_defines.extend(arch_defines);
    let variants = cpu_variants::plan(&arch_flags);
    if variants.len() > 1 {
        let cpu = |name: &str, flags: &[String]| {
            compile_in(
                &out_dir().join(format!("cpu-{name}")),
                src,
                &generated,
                &cpu_sources,
                &cpu_defines,
                flags,
            )
        };
        objects.extend(cpu_variants::build(&variants, cpu));
    } else {
        objects.extend(compile(
            src,
            &generated,
            &cpu_sources,
            &cpu_defines,
            &arch_flags,
        ));
    }
    if variants.len() > 1 {
        println!("cargo:rustc-cfg=ggml_sys_cpu_dispatch");
    }
    println!(
        "cargo:rustc-env=GGML_SYS_CPU_BUILT_VARIANTS={}",
        variants
            .iter()
            .map(|v| v.name)
            .collect::<Vec<_>>()
            .join(",")
    );
    objects.extend(compile(src, &generated, RPC_SOURCES, &[], &[]));

    // One archive, so the static link order between ggml's parts never matters.
    cc::Build::new()
        .cpp(true)
        .objects(objects)
        .cargo_warnings(false)
        .compile("ggml");
    for lib in ["dl", "pthread", "m"] {
        if target_os() != "windows" && !(target_os() == "macos" && lib == "dl") {
            println!("cargo:rustc-link-lib={lib}");
        }
    }
    export_metadata(Some(&src.include_dir()), &out_dir(), false, &["cpu", "rpc"]);
}

/// Compiles one group of files; C and C++ files need separate `cc::Build`s.
fn compile(
    src: &Source,
    generated: &PathBuf,
    files: &[&str],
    defines: &[&str],
    flags: &[String],
) -> Vec<PathBuf> {
    compile_in(&out_dir(), src, generated, files, defines, flags)
}

/// [`compile`] with the objects in `dir` (the CPU variants compile the same files).
fn compile_in(
    dir: &Path,
    src: &Source,
    generated: &PathBuf,
    files: &[&str],
    defines: &[&str],
    flags: &[String],
) -> Vec<PathBuf> {
    let (c_files, cpp_files): (Vec<&str>, Vec<&str>) =
        files.iter().partition(|f| f.ends_with(".c"));
    let mut objects = Vec::new();
    for (is_cpp, group) in [(false, c_files), (true, cpp_files)] {
        if group.is_empty() {
            continue;
        }
        let mut build = cc::Build::new();
        build
            .out_dir(dir)
            .cpp(is_cpp)
            .std(if is_cpp { "c++17" } else { "c11" })
            // ggml's kernels are unusably slow unoptimised, whatever the cargo profile.
            .opt_level(3)
            .debug(false)
            .warnings(false)
            .cargo_warnings(false)
            .include(src.include_dir())
            .include(src.root.join("src"))
            .include(src.src("ggml-cpu"))
            .include(generated)
            .define("NDEBUG", None)
            .define("_XOPEN_SOURCE", "600")
            .define("_GNU_SOURCE", None);
        for define in defines {
            match define.split_once('=') {
                Some((k, v)) => build.define(k, v),
                None => build.define(define, None),
            };
        }
        for flag in flags {
            build.flag(flag);
        }
        for file in group {
            let path = src.src(file);
            println!("cargo:rerun-if-changed={}", path.display());
            build.file(path);
        }
        objects.extend(build.compile_intermediates());
    }
    objects
}

/// `ggml.c` includes a generated `ggml-version.h` (CMake writes it from a template).
fn write_version_header(src: &Source) -> PathBuf {
    let dir = out_dir().join("generated");
    std::fs::create_dir_all(&dir).expect("create OUT_DIR/generated");
    let header = format!(
        "#pragma once\n#define GGML_VERSION \"{}\"\n#define GGML_COMMIT \"ggml-sys\"\n",
        src.version
    );
    std::fs::write(dir.join("ggml-version.h"), header).expect("write ggml-version.h");
    dir
}

/// Per-architecture sources, compiler flags and defines. Flags follow the Rust target's
/// features, so `-C target-cpu=native` gives native kernels and the default target a
/// portable baseline.
fn cpu_arch() -> (Vec<&'static str>, Vec<String>, Vec<&'static str>) {
    let features = target_features();
    let has = |f: &str| features.iter().any(|x| x == f);
    match target_arch().as_str() {
        "x86_64" | "x86" => {
            const X86: &[(&str, &str)] = &[
                ("sse3", "-msse3"),
                ("ssse3", "-mssse3"),
                ("sse4.1", "-msse4.1"),
                ("sse4.2", "-msse4.2"),
                ("avx", "-mavx"),
                ("avx2", "-mavx2"),
                ("fma", "-mfma"),
                ("f16c", "-mf16c"),
                ("bmi2", "-mbmi2"),
                ("avxvnni", "-mavxvnni"),
                ("avx512f", "-mavx512f"),
                ("avx512cd", "-mavx512cd"),
                ("avx512bw", "-mavx512bw"),
                ("avx512dq", "-mavx512dq"),
                ("avx512vl", "-mavx512vl"),
                ("avx512vbmi", "-mavx512vbmi"),
                ("avx512vnni", "-mavx512vnni"),
                ("avx512bf16", "-mavx512bf16"),
            ];
            let flags = X86
                .iter()
                .filter(|(f, _)| has(f))
                .map(|(_, flag)| (*flag).to_owned())
                .collect();
            (
                vec!["ggml-cpu/arch/x86/quants.c", "ggml-cpu/arch/x86/repack.cpp"],
                flags,
                vec![],
            )
        }
        "aarch64" => {
            let mut march = String::from("-march=armv8.2-a");
            for (feature, ext) in [
                ("dotprod", "+dotprod"),
                ("fp16", "+fp16"),
                ("i8mm", "+i8mm"),
            ] {
                if has(feature) {
                    march.push_str(ext);
                }
            }
            let flags = if target_os() == "macos" {
                vec![]
            } else {
                vec![march]
            };
            (
                vec!["ggml-cpu/arch/arm/quants.c", "ggml-cpu/arch/arm/repack.cpp"],
                flags,
                vec![],
            )
        }
        _ => (vec![], vec![], vec!["GGML_CPU_GENERIC"]),
    }
}
