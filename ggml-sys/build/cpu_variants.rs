//! ggml's CPU backend in several instruction-set variants in one static library, the best
//! one the running CPU supports picked at load time.
//!
//! ggml's own answer (`GGML_CPU_ALL_VARIANTS`) builds each variant as a shared library that
//! the registry `dlopen`s and scores (`ggml_backend_score`); a static `cc` build has no place
//! to install those libraries. Here instead each variant's objects are partially linked into
//! one relocatable object (`cc -r`, section groups dissolved), every symbol it defines is renamed with the variant's
//! prefix (`objcopy --redefine-syms`, so the variants' copies, including C++ inline functions,
//! never merge), and a generated C file defines each C function of the CPU backend as a GNU
//! indirect function whose resolver reads CPUID once and returns the best variant's copy.
//! Calls then cost what a call into a shared library costs.
//!
//! Only for x86-64 Linux with glibc (indirect functions need an ELF dynamic loader that
//! supports them) and only when the Rust target lacks AVX2: a build with
//! `-C target-cpu=native` (or x86-64-v3) keeps the single variant it asks for.
//! `GGML_SYS_CPU_VARIANTS=off` forces the single variant.

use crate::util::{fail, out_dir, target_arch, target_features, target_os};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One compilation of ggml's CPU backend.
pub struct Variant {
    /// Also the symbol prefix.
    pub name: &'static str,
    pub flags: Vec<String>,
    /// The CPU level (see `LEVEL_C`) from which this variant runs.
    level: u32,
}

const HASWELL: &[&str] = &[
    "-msse3", "-mssse3", "-msse4.1", "-msse4.2", "-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi2",
];
const ZEN4: &[&str] = &[
    "-mavx512f",
    "-mavx512cd",
    "-mavx512bw",
    "-mavx512dq",
    "-mavx512vl",
    "-mavx512vbmi",
    "-mavx512vnni",
    "-mavx512bf16",
];

/// The variants to build, the target's own flags first; a single one means no dispatch.
pub fn plan(target_flags: &[String]) -> Vec<Variant> {
    let single = vec![Variant {
        name: "target",
        flags: target_flags.to_vec(),
        level: 0,
    }];
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    let off = std::env::var("GGML_SYS_CPU_VARIANTS").is_ok_and(|v| v == "off" || v == "0");
    let has_avx2 = target_features().iter().any(|f| f == "avx2");
    if off || has_avx2 || target_arch() != "x86_64" || target_os() != "linux" || env != "gnu" {
        return single;
    }
    let haswell: Vec<String> = HASWELL.iter().map(|f| (*f).to_owned()).collect();
    let mut zen4 = haswell.clone();
    zen4.extend(ZEN4.iter().map(|f| (*f).to_owned()));
    vec![
        Variant {
            name: "x86_64",
            flags: target_flags.to_vec(),
            level: 0,
        },
        Variant {
            name: "haswell",
            flags: haswell,
            level: 1,
        },
        Variant {
            name: "zen4",
            flags: zen4,
            level: 2,
        },
    ]
}

/// The CPU level, 0 (baseline), 1 (AVX2, FMA, F16C, BMI2 with the OS saving YMM state) or 2
/// (also AVX-512 F/CD/BW/DQ/VL/VBMI/VNNI/BF16 with ZMM state), read with CPUID once. Runs
/// inside indirect-function resolvers, before relocations and constructors: no libc calls.
const LEVEL_C: &str = r#"
#include <cpuid.h>
static int ggml_sys_cpu_level_cache = -1;
static int ggml_sys_cpu_level(void) {
    if (ggml_sys_cpu_level_cache >= 0) return ggml_sys_cpu_level_cache;
    unsigned a, b, c, d, level = 0;
    if (__get_cpuid(1, &a, &b, &c, &d) && (c >> 27 & 1) && (c >> 28 & 1)) {
        unsigned xlo, xhi;
        __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
        int fma = c >> 12 & 1, f16c = c >> 29 & 1;
        unsigned b7, c7, a71 = 0, u;
        if ((xlo & 6) == 6 && __get_cpuid_count(7, 0, &a, &b7, &c7, &d)) {
            if ((b7 >> 5 & 1) && (b7 >> 8 & 1) && fma && f16c) level = 1;
            __get_cpuid_count(7, 1, &a71, &u, &u, &u);
            int avx512 = (b7 >> 16 & 1) && (b7 >> 17 & 1) && (b7 >> 28 & 1) && (b7 >> 30 & 1)
                && (b7 >> 31 & 1) && (c7 >> 1 & 1) && (c7 >> 11 & 1) && (a71 >> 5 & 1);
            if (level == 1 && avx512 && (xlo & 0xe6) == 0xe6) level = 2;
        }
    }
    ggml_sys_cpu_level_cache = (int)level;
    return (int)level;
}
"#;

/// Compiles every variant with `compile(name, flags)`, renames each one's symbols and adds
/// the dispatching functions; returns the objects to archive.
pub fn build(
    variants: &[Variant],
    compile: impl Fn(&str, &[String]) -> Vec<PathBuf>,
) -> Vec<PathBuf> {
    let compiler = cc::Build::new().get_compiler();
    let objcopy = std::env::var("OBJCOPY").unwrap_or_else(|_| "objcopy".into());
    let nm = std::env::var("NM").unwrap_or_else(|_| "nm".into());
    let mut objects = Vec::new();
    let mut exported: Option<Vec<String>> = None;
    for variant in variants {
        let parts = compile(variant.name, &variant.flags);
        let merged = out_dir().join(format!("ggml-cpu-{}.o", variant.name));
        let mut link = compiler.to_command();
        // `--force-group-allocation` dissolves the section groups (COMDAT): a group keeps its
        // signature symbol's original name through the renaming below, so the final link would
        // keep one variant's copy of each C++ inline function and resolve the other variants'
        // calls to it to address 0.
        link.args(["-r", "-nostdlib", "-Wl,--force-group-allocation", "-o"])
            .arg(&merged)
            .args(&parts);
        run(&mut link, "partially link the CPU backend");
        let defined = defined_symbols(&nm, &merged);
        let mut map = String::new();
        for (symbol, _) in &defined {
            writeln!(map, "{symbol} {}__{symbol}", variant.name).expect("write to a String");
        }
        let map_path = out_dir().join(format!("ggml-cpu-{}.syms", variant.name));
        std::fs::write(&map_path, map).expect("write the symbol map");
        let mut rename = Command::new(&objcopy);
        rename
            .arg(format!("--redefine-syms={}", map_path.display()))
            .arg(&merged);
        run(&mut rename, "rename the CPU variant's symbols");
        // The C functions (not C++ ones, which only the backend itself calls) are its API.
        let functions: Vec<String> = defined
            .into_iter()
            .filter(|(s, kind)| kind == "T" && !s.starts_with('_'))
            .map(|(s, _)| s)
            .collect();
        exported = Some(match exported {
            None => functions,
            Some(previous) => previous
                .into_iter()
                .filter(|s| functions.contains(s))
                .collect(),
        });
        objects.push(merged);
    }
    let mut shim = String::from(LEVEL_C);
    for symbol in exported.unwrap_or_default() {
        for v in variants {
            writeln!(shim, "extern void {}__{symbol}(void);", v.name).expect("write to a String");
        }
        writeln!(shim, "static void *ggml_sys_resolve_{symbol}(void) {{").expect("write");
        writeln!(shim, "    int level = ggml_sys_cpu_level();").expect("write");
        for v in variants.iter().rev() {
            writeln!(
                shim,
                "    if (level >= {}) return (void *)&{}__{symbol};",
                v.level, v.name
            )
            .expect("write");
        }
        writeln!(shim, "    return 0;\n}}").expect("write");
        writeln!(
            shim,
            "void {symbol}(void) __attribute__((ifunc(\"ggml_sys_resolve_{symbol}\")));"
        )
        .expect("write");
    }
    // The name of the variant in use, for reports.
    writeln!(shim, "const char *ggml_sys_cpu_variant(void) {{").expect("write");
    writeln!(shim, "    int level = ggml_sys_cpu_level();").expect("write");
    for v in variants.iter().rev() {
        writeln!(shim, "    if (level >= {}) return \"{}\";", v.level, v.name).expect("write");
    }
    writeln!(shim, "    return \"\";\n}}").expect("write");
    let shim_path = out_dir().join("ggml-cpu-dispatch.c");
    std::fs::write(&shim_path, shim).expect("write the dispatch source");
    objects.extend(
        cc::Build::new()
            .file(&shim_path)
            .opt_level(2)
            .warnings(false)
            .cargo_warnings(false)
            .out_dir(out_dir().join("cpu-dispatch"))
            .compile_intermediates(),
    );
    objects
}

/// Every global symbol `object` defines, with nm's type letter (GNU unique ones too: without
/// their groups they would be defined once per variant).
fn defined_symbols(nm: &str, object: &Path) -> Vec<(String, String)> {
    let output = Command::new(nm)
        .args(["-g", "--defined-only", "-P"])
        .arg(object)
        .output()
        .unwrap_or_else(|e| fail(&format!("cannot run {nm} for the CPU variants: {e}")));
    if !output.status.success() {
        fail(&format!(
            "{nm} failed on {}: {}",
            object.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
        })
        .collect()
}

fn run(command: &mut Command, what: &str) {
    match command.status() {
        Ok(status) if status.success() => {}
        Ok(status) => fail(&format!("could not {what}: {command:?} exited with {status}")),
        Err(e) => fail(&format!(
            "could not {what}: {command:?}: {e} (set GGML_SYS_CPU_VARIANTS=off to build one variant)"
        )),
    }
}
