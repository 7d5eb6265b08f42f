//! Finding the CUDA toolkit for the `cuda` feature, and failing early (before a half-hour
//! compile) with the missing piece named. Layouts understood: NVIDIA's installer
//! (`/usr/local/cuda`), distro packages (`/usr/bin/nvcc`, `/usr/include`, multiarch libs) and
//! the PyPI wheels of CUDA 13 (`pip install "cuda-toolkit[nvcc,cudart,cublas,cccl]"`, one
//! root at `site-packages/nvidia/cu13` with only versioned `libcudart.so.13` etc.).

use crate::util::{env_path, fail, out_dir};
use std::path::{Path, PathBuf};
use std::process::Command;

const GET_IT: &str = "Install a CUDA toolkit (12.x or 13.x): NVIDIA's installer or the distro's \
     CUDA packages, or from PyPI `pip install \"cuda-toolkit[nvcc,cudart,cublas,cccl]==13.0.2\"` \
     into a venv and set CUDA_PATH=<venv>/lib/python3.*/site-packages/nvidia/cu13";

pub struct Toolkit {
    pub nvcc: PathBuf,
    pub root: PathBuf,
    pub version: (u32, u32),
    /// Directories the final link searches (real library dirs, then `link_dir`).
    pub lib_dirs: Vec<PathBuf>,
    /// OUT_DIR/cuda-link: unversioned names for versioned-only libraries, the driver stub.
    pub link_dir: PathBuf,
    /// For CMake's FindCUDAToolkit: `CUDA_cudart_LIBRARY` etc. where it would not find them.
    pub cmake_libraries: Vec<(&'static str, String)>,
    /// True when no `libcuda` exists at build time and the link uses a generated stub.
    pub driver_stub: bool,
    /// nvcc's profile links from `<root>/lib64`; the PyPI wheels have only `<root>/lib`.
    pub nvcc_flags: Option<String>,
}

pub fn locate() -> Toolkit {
    for var in [
        "CUDACXX",
        "CUDA_PATH",
        "CUDA_HOME",
        "CUDA_TOOLKIT_ROOT_DIR",
        "PATH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let root_env = ["CUDA_PATH", "CUDA_HOME", "CUDA_TOOLKIT_ROOT_DIR"]
        .into_iter()
        .find_map(|var| env_path(var).map(|dir| (var, dir)));
    let nvcc = find_nvcc(root_env.as_ref().map(|(_, d)| d.as_path()));
    let version = nvcc_version(&nvcc);
    let root = match &root_env {
        Some((var, dir)) => {
            if !dir.is_dir() {
                fail(&format!("{var}={} is not a directory", dir.display()));
            }
            dir.clone()
        }
        // bin/nvcc -> the toolkit root (resolving /usr/bin/nvcc-style links first).
        None => std::fs::canonicalize(&nvcc)
            .unwrap_or_else(|_| nvcc.clone())
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("/usr")),
    };

    let multiarch = format!(
        "/usr/lib/{}-linux-gnu",
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default()
    );
    let mut include_dirs = vec![root.join("include")];
    let mut lib_dirs = vec![root.join("lib64"), root.join("lib"), root.join("lib/x64")];
    if let Ok(targets) = std::fs::read_dir(root.join("targets")) {
        for t in targets.flatten() {
            include_dirs.push(t.path().join("include"));
            lib_dirs.push(t.path().join("lib"));
        }
    }
    include_dirs.push(PathBuf::from("/usr/include"));
    lib_dirs.push(PathBuf::from(&multiarch));
    lib_dirs.retain(|d| d.is_dir());

    let where_ = format!(
        "nvcc {} (CUDA {}.{}), toolkit root {}",
        nvcc.display(),
        version.0,
        version.1,
        root.display()
    );
    let header = |name: &str, what: &str| -> PathBuf {
        include_dirs
            .iter()
            .find(|d| d.join(name).is_file())
            .cloned()
            .unwrap_or_else(|| {
                fail(&format!(
                    "the `cuda` feature needs {what} (`{name}`), not found in {} ({where_}). {GET_IT}",
                    join(&include_dirs)
                ))
            })
    };
    header("cuda_runtime.h", "the CUDA runtime headers");
    header("cublas_v2.h", "the cuBLAS headers");
    let inc = header("cuda_runtime.h", "the CUDA runtime headers");
    if !inc.join("cub/cub.cuh").is_file() && !inc.join("cccl/cub/cub.cuh").is_file() {
        fail(&format!(
            "the `cuda` feature needs the CCCL headers (cub, thrust, libcu++: `cub/cub.cuh`), \
             not found in {} ({where_}). {GET_IT}",
            inc.display()
        ));
    }

    let link_dir = out_dir().join("cuda-link");
    std::fs::create_dir_all(&link_dir).expect("create cuda-link dir");
    let windows = crate::util::target_os() == "windows";
    let mut cmake_libraries = Vec::new();
    for (name, var, what) in [
        ("cudart", "CUDA_cudart_LIBRARY", "the CUDA runtime library"),
        ("cublas", "CUDA_cublas_LIBRARY", "cuBLAS"),
        ("cublasLt", "CUDA_cublasLt_LIBRARY", "cuBLASLt"),
    ] {
        let found = find_library(&lib_dirs, name, windows).unwrap_or_else(|| {
            fail(&format!(
                "the `cuda` feature needs {what} (lib{name}.so), not found in {} ({where_}). {GET_IT}",
                join(&lib_dirs)
            ))
        });
        if !windows && found.file_name() != Some(format!("lib{name}.so").as_ref()) {
            // Only `lib{name}.so.13`: give the linker and CMake the unversioned name.
            let link = link_dir.join(format!("lib{name}.so"));
            let _ = std::fs::remove_file(&link);
            symlink(&found, &link);
            cmake_libraries.push((var, link.display().to_string()));
            if name == "cudart" {
                cmake_libraries.push(("CUDA_CUDART", link.display().to_string()));
            }
        }
    }

    let mut driver_dirs: Vec<PathBuf> = lib_dirs.iter().map(|d| d.join("stubs")).collect();
    driver_dirs.extend(lib_dirs.iter().cloned());
    let driver_stub = !windows && find_library(&driver_dirs, "cuda", false).is_none();
    if driver_stub {
        // The driver's libcuda exists only where an NVIDIA driver is installed, and the
        // PyPI toolkit has no link stub. Link against a stub with the same soname (what the
        // toolkit's `lib64/stubs/libcuda.so` is); the real library is used at run time.
        write_driver_stub(&link_dir, &[]);
        cmake_libraries.push((
            "CUDA_cuda_driver_LIBRARY",
            link_dir.join("libcuda.so").display().to_string(),
        ));
    }
    for dir in &driver_dirs {
        if dir.ends_with("stubs") && dir.is_dir() {
            lib_dirs.push(dir.clone());
        }
    }
    let nvcc_flags = (!root.join("lib64").exists() && root.join("lib").is_dir())
        .then(|| format!("-L{}", root.join("lib").display()));
    Toolkit {
        nvcc,
        root,
        version,
        lib_dirs,
        link_dir,
        cmake_libraries,
        driver_stub,
        nvcc_flags,
    }
}

impl Toolkit {
    /// `CUDA_ARCHITECTURES`, else `native` when a GPU is visible, else ggml's portable list.
    pub fn architectures(&self) -> String {
        if let Some(archs) = std::env::var("CUDA_ARCHITECTURES")
            .ok()
            .filter(|a| !a.trim().is_empty())
        {
            return archs;
        }
        let gpu_visible = Command::new("nvidia-smi")
            .arg("-L")
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stdout).contains("GPU")
            });
        if gpu_visible {
            return "native".to_owned();
        }
        let archs =
            crate::cmake_args::ggml_portable_cuda_architectures(self.version.0, self.version.1);
        println!(
            "cargo:warning=no GPU visible and CUDA_ARCHITECTURES unset: building ggml's portable \
             set {archs} (slow; e.g. CUDA_ARCHITECTURES=90 for H100/H200 only)"
        );
        archs
    }

    /// After the CMake build: the stub gets the driver symbols libggml-cuda.a needs.
    pub fn finish_driver_stub(&self, ggml_cuda_archive: &Path) {
        if !self.driver_stub {
            return;
        }
        let out = Command::new("nm")
            .args(["-u", "--format=just-symbols"])
            .arg(ggml_cuda_archive)
            .output();
        let out = match out {
            Ok(o) if o.status.success() => o,
            _ => fail(
                "the CUDA driver stub needs `nm` (binutils) to list the driver symbols ggml uses",
            ),
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let mut symbols: Vec<&str> = text
            .lines()
            .map(str::trim)
            // Driver API: cuDeviceGet, cuMemCreate, ... (runtime and cuBLAS are cuda*/cublas*).
            .filter(|s| s.len() > 2 && s.starts_with("cu") && s.as_bytes()[2].is_ascii_uppercase())
            .collect();
        symbols.sort_unstable();
        symbols.dedup();
        write_driver_stub(&self.link_dir, &symbols);
        println!(
            "cargo:warning=no libcuda (NVIDIA driver) at build time: linked against a stub of {} \
             driver functions; the binary loads the driver's libcuda.so.1 at run time",
            symbols.len()
        );
    }
}

fn write_driver_stub(link_dir: &Path, symbols: &[&str]) {
    let src = link_dir.join("cuda_stub.c");
    let mut text =
        String::from("/* Link stub for libcuda.so.1, generated by ggml-sys's build script. */\n");
    for s in symbols {
        text.push_str(&format!("int {s}(void) {{ return 999; }}\n"));
    }
    std::fs::write(&src, text).expect("write the driver stub source");
    let compiler = cc::Build::new().cargo_metadata(false).get_compiler();
    let status = compiler
        .to_command()
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(link_dir.join("libcuda.so"))
        .arg(&src)
        .status();
    if !status.is_ok_and(|s| s.success()) {
        fail("could not compile the libcuda link stub with the C compiler");
    }
}

fn find_nvcc(root: Option<&Path>) -> PathBuf {
    if let Some(cxx) = env_path("CUDACXX") {
        if !cxx.is_file() {
            fail(&format!(
                "CUDACXX={} is not a file (it should name nvcc)",
                cxx.display()
            ));
        }
        return cxx;
    }
    let exe = if crate::util::target_os() == "windows" {
        "nvcc.exe"
    } else {
        "nvcc"
    };
    let mut candidates: Vec<PathBuf> = root.map(|r| r.join("bin").join(exe)).into_iter().collect();
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join(exe)));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin").join(exe));
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            fail(&format!(
                "the `cuda` feature needs nvcc, found neither through CUDACXX, {}, PATH nor \
             /usr/local/cuda/bin. {GET_IT}",
                match root {
                    Some(r) => format!("CUDA_PATH ({}/bin has none)", r.display()),
                    None => "CUDA_PATH (unset)".to_owned(),
                }
            ))
        })
}

fn nvcc_version(nvcc: &Path) -> (u32, u32) {
    let out = Command::new(nvcc).arg("--version").output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => fail(&format!(
            "`{} --version` failed: {}",
            nvcc.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => fail(&format!("cannot run nvcc {}: {e}", nvcc.display())),
    };
    // "Cuda compilation tools, release 13.0, V13.0.88"
    let release = text
        .split("release ")
        .nth(1)
        .and_then(|r| r.split(',').next())
        .and_then(|r| r.split_once('.'))
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)));
    let version = release.unwrap_or_else(|| {
        fail(&format!(
            "cannot read the CUDA version from `{} --version`:\n{text}",
            nvcc.display()
        ))
    });
    if version.0 < 12 {
        fail(&format!(
            "nvcc {} is CUDA {}.{}; ggml 0.26.0 needs CUDA 12 or newer. {GET_IT}",
            nvcc.display(),
            version.0,
            version.1
        ));
    }
    version
}

/// `lib{name}.so`, else the shortest `lib{name}.so.*` (e.g. `libcudart.so.13`).
fn find_library(dirs: &[PathBuf], name: &str, windows: bool) -> Option<PathBuf> {
    if windows {
        return dirs
            .iter()
            .map(|d| d.join(format!("{name}.lib")))
            .find(|p| p.is_file());
    }
    for dir in dirs {
        let plain = dir.join(format!("lib{name}.so"));
        if plain.exists() {
            return Some(plain);
        }
        let prefix = format!("lib{name}.so.");
        let mut versioned: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect();
        versioned.sort_by_key(|p| p.as_os_str().len());
        if let Some(p) = versioned.into_iter().next() {
            return Some(p);
        }
    }
    None
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
        fail(&format!(
            "cannot link {} to {}: {e}",
            link.display(),
            target.display()
        ))
    });
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) {
    std::fs::copy(target, link).unwrap_or_else(|e| {
        fail(&format!(
            "cannot copy {} to {}: {e}",
            target.display(),
            link.display()
        ))
    });
}

fn join(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
