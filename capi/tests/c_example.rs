//! The C example, as a C program meets the library: `libda3.a` and `libda3.so` are built for
//! this test's profile, `examples/example.c` is compiled against each with the system C
//! compiler (`$CC`, else `cc`) and run on the repository's tiny model; what it prints and
//! writes is checked.
//!
//! `cargo test` builds a `cdylib`/`staticlib`-only package for its tests without producing
//! those libraries, so the test asks cargo for them itself (`cargo build -p da3-capi --lib`,
//! same profile and target folder: only this crate links, the rest is built).
//!
//! `DA3_CAPI_RUNNER` wraps each run, e.g. `valgrind --error-exitcode=1 --leak-check=full`
//! (with a library built for a baseline CPU: valgrind cannot decode AVX-512; see `.ci/run`).
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// What the C compiler needs after `libda3.a`: the C++ runtime of ggml and the system
/// libraries Rust's standard library uses.
const SYSTEM_LIBRARIES: [&str; 4] = ["-lstdc++", "-lm", "-lpthread", "-ldl"];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `<target>/<profile>`, where this test's executable lives in `deps/`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    assert_eq!(deps.file_name().unwrap(), "deps", "{}", exe.display());
    deps.parent().unwrap().to_path_buf()
}

/// Builds `libda3.a` and `libda3.so` into `profile_dir` with this test's profile.
fn build_libraries(profile_dir: &Path) {
    let profile = profile_dir.file_name().unwrap().to_str().unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args(["build", "--lib", "-p", "da3-capi", "--manifest-path"])
        .arg(crate_dir().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(profile_dir.parent().unwrap());
    match profile {
        "debug" => {}
        "release" => {
            build.arg("--release");
        }
        custom => {
            build.args(["--profile", custom]);
        }
    }
    let status = build.status().unwrap();
    assert!(status.success(), "{build:?}: {status}");
}

fn c_compiler() -> Command {
    Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "{command:?}: {}\n--- stdout\n{}\n--- stderr\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The example compiled against `library` (a path to `libda3.a`, or `-lda3` with a search
/// folder), strict warnings on.
fn compile_example(executable: &Path, library: &[&std::ffi::OsStr]) {
    let mut compile = c_compiler();
    compile
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Wpedantic",
            "-Werror",
            "-I",
        ])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("examples/example.c"))
        .args(library)
        .args(SYSTEM_LIBRARIES)
        .arg("-o")
        .arg(executable);
    run(&mut compile);
}

/// Runs the example (through `DA3_CAPI_RUNNER` if set) into `out_dir`; its stdout.
fn run_example(executable: &Path, out_dir: &Path, library_dir: Option<&Path>) -> String {
    let fixtures = crate_dir().join("../tests/fixtures/peer");
    let runner = std::env::var("DA3_CAPI_RUNNER").unwrap_or_default();
    let mut words = runner.split_whitespace();
    let mut command = match words.next() {
        Some(program) => {
            let mut command = Command::new(program);
            command.args(words).arg(executable);
            command
        }
        None => Command::new(executable),
    };
    command
        .arg(fixtures.join("peer-tiny-seed0-f32.gguf"))
        .arg(fixtures.join("test-640x480.png"))
        .arg(out_dir);
    if let Some(dir) = library_dir {
        command.env("LD_LIBRARY_PATH", dir);
    }
    let output = run(&mut command);
    eprintln!("{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// The numbers of the line after `heading` and the two below it: a 3x4 matrix.
fn matrix_after(stdout: &str, heading: &str) -> Vec<f32> {
    let mut lines = stdout.lines().skip_while(|line| *line != heading).skip(1);
    let values: Vec<f32> = (0..3)
        .flat_map(|_| lines.next().unwrap_or_default().split_whitespace())
        .map(|value| value.parse().unwrap())
        .collect();
    assert_eq!(values.len(), 12, "{heading}:\n{stdout}");
    values
}

fn check_run(stdout: &str, out_dir: &Path) {
    let expect = |text: &str| assert!(stdout.contains(text), "no {text:?} in:\n{stdout}");
    expect(&format!("da3 {}\n", env!("CARGO_PKG_VERSION")));
    expect("model on CPU\n");
    // 640x480 at process resolution 112: 112x84.
    expect("view 0: depth 112x84, range ");
    expect("view 0: confidence ");
    expect("scene: 2 views, reference view 0\n");
    expect("view 1: depth 112x84, range ");
    // Each camera's rotation block is a rotation: the 3x4 layout came through intact.
    for view in 0..2 {
        let pose = matrix_after(
            stdout,
            &format!("view {view}: extrinsics (world to camera)"),
        );
        for (a, b) in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2)] {
            let dot: f32 = (0..3).map(|k| pose[a * 4 + k] * pose[b * 4 + k]).sum();
            let want = if a == b { 1.0 } else { 0.0 };
            assert!(
                (dot - want).abs() < 1e-3,
                "rows {a}, {b}: {pose:?}\n{stdout}"
            );
        }
    }
    expect("view 1: fx ");
    // The errors: a status (IO 2, INVALID_ARGUMENT 1) and a message naming the cause.
    expect("loading a missing image: status 2: cannot open image no-such-image.png");
    expect("known cameras without the camera encoder: status 1: ");
    assert!(stdout.contains("camera encoder"), "{stdout}");
    expect("view 7 of 2: status 1: view 7 of an output of 2 view(s)");
    expect("\ndone\n");

    let ply = std::fs::read(out_dir.join("scene.ply")).unwrap();
    let head = String::from_utf8_lossy(&ply[..ply.len().min(400)]).into_owned();
    assert!(
        head.starts_with("ply\nformat binary_little_endian"),
        "{head}"
    );
    let vertices: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("element vertex "))
        .expect("a vertex count")
        .parse()
        .unwrap();
    assert!(vertices > 0, "{head}");
    let poses = std::fs::read_to_string(out_dir.join("poses.json")).unwrap();
    assert!(poses.contains("\"mirror.png\""), "{poses}");
    assert!(poses.contains("extrinsics_world_to_camera"), "{poses}");
    assert!(std::fs::read(out_dir.join("depth.png"))
        .unwrap()
        .starts_with(b"\x89PNG"));
}

#[test]
fn the_c_example_runs_against_the_static_and_the_shared_library() {
    let profile_dir = profile_dir();
    build_libraries(&profile_dir);
    let work = tempfile::tempdir().unwrap();

    let static_example = work.path().join("example-static");
    compile_example(&static_example, &[profile_dir.join("libda3.a").as_os_str()]);
    let out_dir = work.path().join("static");
    std::fs::create_dir(&out_dir).unwrap();
    check_run(&run_example(&static_example, &out_dir, None), &out_dir);

    let shared_example = work.path().join("example-shared");
    let search = format!("-L{}", profile_dir.display());
    compile_example(&shared_example, &[search.as_ref(), "-lda3".as_ref()]);
    let out_dir = work.path().join("shared");
    std::fs::create_dir(&out_dir).unwrap();
    check_run(
        &run_example(&shared_example, &out_dir, Some(&profile_dir)),
        &out_dir,
    );
}

/// The header compiles as C++ too (`extern "C"` and nothing C-only).
#[test]
fn the_header_compiles_as_cpp() {
    let compiler = std::env::var_os("CXX").unwrap_or_else(|| "c++".into());
    let mut compile = Command::new(compiler);
    compile
        .args([
            "-std=c++11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-x",
            "c++",
        ])
        .arg(crate_dir().join("include/da3.h"));
    run(&mut compile);
}
