//! Checks for the `vulkan` feature before the long compile: Vulkan headers new enough for
//! ggml-vulkan.cpp, Vulkan-Hpp, SPIRV-Headers, the loader and glslc. `VULKAN_SDK` (LunarG's
//! variable: a prefix with `include/`, `lib/`, `bin/`) is looked at first, then the system.

use crate::util::{env_path, fail, out_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

/// ggml 0.26.0's ggml-vulkan.cpp uses `vk::LayerSettingEXT` (VK_EXT_layer_settings) without a
/// version guard; it is in the Vulkan headers from 1.3.272 on. Debian 12's 1.3.239 fails.
pub const MIN_HEADER_VERSION: u32 = 272;

const GET_IT: &str = "Install the Vulkan SDK 1.3.272 or newer (LunarG's SDK, then set VULKAN_SDK \
     to its x86_64 folder; or the distro's libvulkan-dev, spirv-headers and glslc packages: \
     Debian 13, Ubuntu 24.04 and newer have them; on Debian 12 extract Debian 13's \
     libvulkan-dev and spirv-headers with `dpkg -x` into a prefix and set VULKAN_SDK=<prefix>/usr)";

pub struct Vulkan {
    /// CMake cache definitions for FindVulkan and SPIRV-Headers.
    pub cmake_defines: Vec<(&'static str, String)>,
    /// Directory holding an unversioned `libvulkan.so` for the final link.
    pub link_dir: PathBuf,
}

pub fn check() -> Vulkan {
    println!("cargo:rerun-if-env-changed=VULKAN_SDK");
    println!("cargo:rerun-if-env-changed=GLSLC");
    let sdk = env_path("VULKAN_SDK");
    if let Some(sdk) = &sdk {
        if !sdk.is_dir() {
            fail(&format!("VULKAN_SDK={} is not a directory", sdk.display()));
        }
    }
    let mut include_dirs: Vec<PathBuf> = sdk.iter().map(|s| s.join("include")).collect();
    include_dirs.extend(["/usr/local/include", "/usr/include"].map(PathBuf::from));
    let header_dir = include_dirs
        .iter()
        .find(|d| d.join("vulkan/vulkan_core.h").is_file())
        .cloned()
        .unwrap_or_else(|| {
            fail(&format!(
                "the `vulkan` feature needs the Vulkan headers (`vulkan/vulkan_core.h`), not \
                 found in {}. {GET_IT}",
                join(&include_dirs)
            ))
        });
    let core = header_dir.join("vulkan/vulkan_core.h");
    let (api, header_version) = header_version(&core);
    if header_version < MIN_HEADER_VERSION {
        fail(&format!(
            "the Vulkan headers in {} are version {api}.{header_version}; ggml 0.26.0's Vulkan \
             backend needs 1.3.{MIN_HEADER_VERSION} or newer (it uses vk::LayerSettingEXT). {GET_IT}",
            header_dir.display()
        ));
    }
    if !header_dir.join("vulkan/vulkan.hpp").is_file() {
        fail(&format!(
            "the Vulkan C++ headers (`vulkan/vulkan.hpp`, Vulkan-Hpp) are missing from {}. {GET_IT}",
            header_dir.display()
        ));
    }
    let spirv_prefix = include_dirs
        .iter()
        .find(|d| d.join("spirv/unified1/spirv.hpp").is_file())
        .and_then(|d| d.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| {
            fail(&format!(
                "the `vulkan` feature needs SPIRV-Headers (`spirv/unified1/spirv.hpp`), not found \
                 in {}. {GET_IT}",
                join(&include_dirs)
            ))
        });

    let glslc = find_glslc(sdk.as_deref());
    let library = find_loader(sdk.as_deref());
    let link_dir = out_dir().join("vulkan-link");
    std::fs::create_dir_all(&link_dir).expect("create vulkan-link dir");
    let link = link_dir.join("libvulkan.so");
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&library, &link).unwrap_or_else(|e| {
        fail(&format!("cannot link {}: {e}", link.display()));
    });
    #[cfg(not(unix))]
    std::fs::copy(&library, &link)
        .unwrap_or_else(|e| fail(&format!("cannot copy {}: {e}", library.display())));

    Vulkan {
        cmake_defines: vec![
            ("Vulkan_INCLUDE_DIR", header_dir.display().to_string()),
            ("Vulkan_LIBRARY", link.display().to_string()),
            ("Vulkan_GLSLC_EXECUTABLE", glslc.display().to_string()),
            // SPIRV-Headers is found by its CMake package config under this prefix.
            ("CMAKE_PREFIX_PATH", spirv_prefix.display().to_string()),
        ],
        link_dir,
    }
}

/// `(api "1.4", VK_HEADER_VERSION)` from vulkan_core.h.
fn header_version(core: &Path) -> (String, u32) {
    let text = std::fs::read_to_string(core)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", core.display())));
    let version = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define VK_HEADER_VERSION "))
        .and_then(|v| v.trim().parse::<u32>().ok())
        .unwrap_or_else(|| fail(&format!("{} has no VK_HEADER_VERSION", core.display())));
    // #define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, 1, 4, VK_HEADER_VERSION)
    let api = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define VK_HEADER_VERSION_COMPLETE "))
        .and_then(|v| {
            let args = v.split_once('(')?.1;
            let parts: Vec<&str> = args.split(',').map(str::trim).collect();
            Some(format!("{}.{}", parts.get(1)?, parts.get(2)?))
        })
        .unwrap_or_else(|| "1.?".to_owned());
    (api, version)
}

fn find_glslc(sdk: Option<&Path>) -> PathBuf {
    let mut candidates: Vec<PathBuf> = env_path("GLSLC").into_iter().collect();
    candidates.extend(sdk.map(|s| s.join("bin/glslc")));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("glslc")));
    }
    let glslc = candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            fail(
                "the `vulkan` feature needs glslc (shaderc) to compile ggml's shaders: not found \
                 through GLSLC, VULKAN_SDK/bin or PATH. Install the distro's `glslc` package or \
                 the Vulkan SDK",
            )
        });
    match Command::new(&glslc).arg("--version").output() {
        Ok(o) if o.status.success() => glslc,
        _ => fail(&format!("`{} --version` does not run", glslc.display())),
    }
}

fn find_loader(sdk: Option<&Path>) -> PathBuf {
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(sdk) = sdk {
        dirs.push(sdk.join("lib"));
        dirs.push(sdk.join(format!("lib/{arch}-linux-gnu")));
    }
    dirs.push(PathBuf::from(format!("/usr/lib/{arch}-linux-gnu")));
    dirs.extend(["/usr/lib64", "/usr/lib", "/usr/local/lib"].map(PathBuf::from));
    for dir in &dirs {
        for name in ["libvulkan.so", "libvulkan.so.1", "libvulkan.dylib"] {
            let p = dir.join(name);
            // exists() follows links: a dangling dev symlink does not count.
            if p.exists() {
                return p;
            }
        }
    }
    fail(&format!(
        "the `vulkan` feature needs the Vulkan loader (libvulkan.so.1), not found in {}. \
         Install the distro's libvulkan1 (or libvulkan-dev) package",
        join(&dirs)
    ))
}

fn join(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
