//! Where ggml's source comes from: `GGML_SOURCE_DIR`, or the pinned registry package.

use crate::util::{env_path, fail};
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Source {
    /// The ggml root: holds `include/`, `src/`, `CMakeLists.txt`.
    pub root: PathBuf,
    /// "0.26.0", read from the source's CMakeLists.
    pub version: String,
}

impl Source {
    pub fn include_dir(&self) -> PathBuf {
        self.root.join("include")
    }
    pub fn src(&self, rel: &str) -> PathBuf {
        self.root.join("src").join(rel)
    }
}

pub fn locate() -> Source {
    let root = match env_path("GGML_SOURCE_DIR") {
        Some(dir) => {
            check_is_ggml(&dir, "GGML_SOURCE_DIR");
            dir
        }
        None => pinned_package_dir(),
    };
    let version = read_version(&root);
    println!("cargo:rerun-if-changed={}", root.join("include").display());
    println!("cargo:rustc-env=GGML_SYS_SOURCE_VERSION={version}");
    // For tests that read the source's own build files (tests/cmake_args.rs).
    println!("cargo:rustc-env=GGML_SYS_SOURCE_ROOT={}", root.display());
    Source { root, version }
}

fn check_is_ggml(dir: &Path, origin: &str) {
    for required in [
        "include/ggml.h",
        "include/ggml-backend.h",
        "src/ggml.c",
        "src/ggml-cpu/ggml-cpu.c",
    ] {
        if !dir.join(required).is_file() {
            fail(&format!(
                "{origin}={} does not look like a ggml source tree: `{required}` is missing. \
                 Point it at the folder that holds ggml's `include/` and `src/` \
                 (in a llama.cpp checkout: `llama.cpp/ggml`).",
                dir.display()
            ));
        }
    }
}

/// `pin/pin.toml` names the package; `pin/Cargo.lock` pins its checksum.
struct Pin {
    package: String,
    version: String,
    subdir: String,
}

fn read_pin(pin_dir: &Path) -> Pin {
    let path = pin_dir.join("pin.toml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| fail(&format!("cannot read the ggml pin {}: {e}", path.display())));
    let field = |key: &str| -> String {
        text.lines()
            .filter_map(|line| line.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| fail(&format!("{} has no `{key}`", path.display())))
    };
    Pin {
        package: field("package"),
        version: field("version"),
        subdir: field("subdir"),
    }
}

fn pinned_package_dir() -> PathBuf {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    // Inside this package, so a published ggml-sys carries its pin. The manifest is not named
    // Cargo.toml there (cargo would leave a nested package out of ggml-sys's package), so it is
    // copied with its lock into OUT_DIR and asked about there.
    let pin_src = manifest_dir.join("pin");
    for file in ["pin.toml", "manifest.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", pin_src.join(file).display());
    }
    let pin_dir = crate::util::out_dir().join("ggml-pin");
    std::fs::create_dir_all(pin_dir.join("src")).expect("create the pin dir in OUT_DIR");
    for (from, to) in [
        ("pin.toml", "pin.toml"),
        ("manifest.toml", "Cargo.toml"),
        ("Cargo.lock", "Cargo.lock"),
    ] {
        std::fs::copy(pin_src.join(from), pin_dir.join(to)).unwrap_or_else(|e| {
            fail(&format!(
                "cannot copy the ggml pin {}: {e}",
                pin_src.join(from).display()
            ))
        });
    }
    std::fs::write(
        pin_dir.join("src/lib.rs"),
        "//! Empty: this crate only pins a package version.\n",
    )
    .expect("write the pin's lib.rs");
    let manifest = pin_dir.join("Cargo.toml");
    let pin = read_pin(&pin_dir);
    let describe = format!("{} ={} (sub-path {})", pin.package, pin.version, pin.subdir);

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // `--locked`: the checksum in pin/Cargo.lock is the content pin.
    let metadata = Command::new(&cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--manifest-path",
        ])
        .arg(&manifest)
        // The outer build's target dir and flags are not this command's business.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run cargo to fetch the ggml pin {describe}: {e}"
            ))
        });
    if !metadata.status.success() {
        fail(&format!(
            "cannot obtain ggml's pinned source, the crates.io package {describe}.\n\
             cargo said: {}\n\
             Fix: go online once (cargo caches the package), or set GGML_SOURCE_DIR to a local \
             ggml source tree, or GGML_LIB_DIR to a prebuilt ggml.",
            String::from_utf8_lossy(&metadata.stderr).trim()
        ));
    }
    let json = String::from_utf8_lossy(&metadata.stdout);
    let manifest_path =
        find_manifest_path(&json, &pin.package, &pin.version).unwrap_or_else(|| {
            fail(&format!(
                "cargo metadata for the ggml pin does not list {describe}"
            ))
        });
    let root = Path::new(&manifest_path)
        .parent()
        .expect("a manifest path has a parent")
        .join(&pin.subdir);
    check_is_ggml(&root, &format!("the pinned package {describe}"));
    root
}

/// Finds `"manifest_path"` of the package with this name and version in cargo's metadata
/// JSON, without a JSON dependency: packages are objects whose `name`, `version` and
/// `manifest_path` fields appear in that order.
fn find_manifest_path(json: &str, name: &str, version: &str) -> Option<String> {
    let needle = format!("\"name\":\"{name}\",\"version\":\"{version}\"");
    let start = json.find(&needle)?;
    let rest = &json[start..];
    let key = "\"manifest_path\":\"";
    let value_start = rest.find(key)? + key.len();
    let value_end = rest[value_start..].find('"')? + value_start;
    Some(rest[value_start..value_end].replace("\\\\", "\\"))
}

fn read_version(root: &Path) -> String {
    let cmake = std::fs::read_to_string(root.join("CMakeLists.txt")).unwrap_or_default();
    let part = |name: &str| -> Option<String> {
        let key = format!("set(GGML_VERSION_{name} ");
        let line = cmake.lines().find(|l| l.trim_start().starts_with(&key))?;
        Some(
            line.trim_start()[key.len()..]
                .trim_end_matches(')')
                .trim()
                .to_owned(),
        )
    };
    match (part("MAJOR"), part("MINOR"), part("PATCH")) {
        (Some(a), Some(b), Some(c)) => format!("{a}.{b}.{c}"),
        _ => "unknown".to_owned(),
    }
}
