//! The `da3` binary end to end: the repro scenario on an RPC device, the files `da3 depth`
//! writes (checked against the library computing the same model in this process), clean
//! failures on bad input, `info` and `devices`.

use da3::convert::{builtin_model_file, write_synthetic, WeightType};
use da3::ggml::DType;
use da3::gguf::{GgufFile, GgufWriter};
use da3::{synthetic, Config, Device, LoadOptions, Model};
use std::path::{Path, PathBuf};

mod common;

use common::{assert_clean_failure, da3_in, entries, Run};

fn da3(args: &[&str]) -> Run {
    da3_in(&std::env::temp_dir(), args)
}

fn assert_success(run: &Run) {
    assert_eq!(run.code, Some(0), "{}", run.context());
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}

// --- model files -------------------------------------------------------------------------------

/// The built-in model (da3-tiny, synthetic weights) as a file.
fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("tiny.gguf");
    write_synthetic(&path, &Config::preset("da3-tiny").unwrap(), WeightType::F32).unwrap();
    path
}

/// What [`rewrite_model`] does to each tensor.
enum TensorEdit {
    Keep,
    Drop,
    /// New PyTorch shape (outermost first), filled with zeros.
    Reshape(Vec<u64>),
}

/// A copy of `source` with `general.architecture` set to `architecture` and each tensor edited
/// as `edit` says.
fn rewrite_model(
    source: &Path,
    dest: &Path,
    architecture: &str,
    edit: impl Fn(&str) -> TensorEdit,
) {
    let file = GgufFile::open(source).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.set(key, value.clone());
    }
    w.set("general.architecture", architecture);
    for t in file.tensors() {
        match edit(&t.name) {
            TensorEdit::Keep => w
                .add_tensor(
                    t.name.clone(),
                    t.dtype,
                    t.shape(),
                    file.tensor_data(t).unwrap(),
                )
                .unwrap(),
            TensorEdit::Drop => {}
            TensorEdit::Reshape(torch_shape) => {
                assert_eq!(t.dtype, DType::F32);
                let ne: Vec<u64> = torch_shape.iter().rev().copied().collect();
                let bytes = vec![0u8; 4 * ne.iter().product::<u64>() as usize];
                w.add_tensor(t.name.clone(), t.dtype, &ne, bytes).unwrap();
            }
        }
    }
    w.write_to(dest).unwrap();
}

/// A folder with a model file made by `make` and an empty `out` folder for outputs.
struct BadModelCase {
    dir: tempfile::TempDir,
    model: PathBuf,
}

impl BadModelCase {
    fn new(make: impl FnOnce(&Path, &Path)) -> BadModelCase {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model.gguf");
        make(dir.path(), &model);
        std::fs::create_dir(dir.path().join("out")).unwrap();
        BadModelCase { dir, model }
    }

    /// `da3 depth` on the model with every output requested: must fail cleanly, mentioning
    /// the model file and `parts`, and leave `out/` empty.
    fn assert_depth_fails(&self, parts: &[&str]) {
        let run = da3_in(
            self.dir.path(),
            &[
                "depth",
                "--model",
                path_str(&self.model),
                "--pfm",
                "out/d.pfm",
                "--png",
                "out/d.png",
                "--pose",
                "out/p.json",
                "--process-res",
                "112",
                "--device",
                "cpu",
            ],
        );
        let mut parts = parts.to_vec();
        parts.push("model.gguf");
        assert_clean_failure(&run, &parts);
        assert_eq!(
            entries(&self.dir.path().join("out")),
            Vec::<String>::new(),
            "{}",
            run.context()
        );
    }
}

// --- da3 repro ---------------------------------------------------------------------------------

/// The largest relative difference allowed between the planned path's depth (ggml's ops, on
/// the RPC server) and the CPU's (this crate's kernels): different kernels, and the CPU's 3x3
/// convolutions by Winograd's F(4x4, 3x3), which round at 3e-6 of each convolution's largest
/// output (2e-5 in depth at 504 px, 6e-6 with `DA3_WINOGRAD=off`).
const CPU_VS_GGML_MAX_REL: f64 = 5e-5;

/// The value after `max rel ` in the planned path's comparison line.
fn max_rel(stdout: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.contains("depth vs CPU"))
        .unwrap_or_else(|| panic!("no comparison line in\n{stdout}"));
    let value = line
        .split("max rel ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .expect("a max rel value");
    value
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("`{value}` in `{line}`: {e}"))
}

/// The repro's report names the tensors the crashing engine left without a buffer.
fn assert_names_crash_tensors(run: &Run) {
    for name in ["vit.norm.weight", "vit.camera_token"] {
        assert!(
            run.stdout.contains(&format!("`{name}` read by")),
            "report should name {name}\n{}",
            run.context()
        );
    }
}

#[test]
fn repro_unchecked_child_fails_and_routed_plan_matches_cpu() {
    let run = da3(&["repro", "--process-res", "112"]);
    assert_success(&run);
    let child = run
        .stdout
        .lines()
        .skip_while(|l| !l.contains("[1] unchecked"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        child.contains("killed by signal") || child.contains("exited with status"),
        "the unchecked child should fail\n{}",
        run.context()
    );
    assert!(!child.contains("status 0"), "{}", run.context());
    assert!(run.stdout.contains("policy Route"), "{}", run.context());
    assert_names_crash_tensors(&run);
    let rel = max_rel(&run.stdout);
    assert!(
        rel <= CPU_VS_GGML_MAX_REL,
        "max rel {rel}\n{}",
        run.context()
    );
    assert!(
        run.stdout
            .contains("planned path correct; unchecked path failed"),
        "{}",
        run.context()
    );
}

#[test]
fn repro_with_defaults_runs_the_crash_scenario() {
    let run = da3(&["repro"]);
    assert_success(&run);
    assert!(run.stdout.contains("policy Route"), "{}", run.context());
    assert!(
        max_rel(&run.stdout) <= CPU_VS_GGML_MAX_REL,
        "{}",
        run.context()
    );
}

#[test]
fn repro_mirror_uploads_and_matches_cpu() {
    let run = da3(&["repro", "--policy", "mirror", "--process-res", "112"]);
    assert_success(&run);
    assert!(run.stdout.contains("policy Mirror"), "{}", run.context());
    let decision = run
        .stdout
        .lines()
        .find(|l| l.starts_with("residency:"))
        .unwrap_or_default();
    assert!(decision.contains("-> mirror"), "{}", run.context());
    assert_names_crash_tensors(&run);
    let rel = max_rel(&run.stdout);
    assert!(
        rel <= CPU_VS_GGML_MAX_REL,
        "max rel {rel}\n{}",
        run.context()
    );
}

#[test]
fn repro_strict_refuses_with_the_report_and_exit_1() {
    let run = da3(&["repro", "--policy", "strict", "--process-res", "112"]);
    assert_eq!(run.code, Some(1), "{}", run.context());
    assert!(run.stdout.contains("refused (strict)"), "{}", run.context());
    assert_names_crash_tensors(&run);
    assert!(
        !run.stdout.contains("depth vs CPU"),
        "strict must not compute\n{}",
        run.context()
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.context());
}

// --- da3 depth: outputs ------------------------------------------------------------------------

/// Depth of the built-in model on the built-in image, computed in this process on the CPU.
fn in_process_depth(process_res: usize) -> (Vec<f32>, usize, usize) {
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    };
    let model = Model::from_gguf(&builtin_model_file().unwrap(), &options).unwrap();
    let prediction = model
        .session()
        .unwrap()
        .run(&da3::Request::image(&synthetic::image(640, 427)).process_res(process_res))
        .unwrap()
        .into_single()
        .unwrap();
    (prediction.depth, prediction.width, prediction.height)
}

/// A PFM file: (header text, values in file order).
fn read_pfm(path: &Path) -> (String, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    // The header is three text lines.
    let end = bytes
        .iter()
        .enumerate()
        .filter(|(_, &b)| b == b'\n')
        .nth(2)
        .map(|(i, _)| i + 1)
        .expect("three header lines");
    let header = String::from_utf8(bytes[..end].to_vec()).unwrap();
    let payload = &bytes[end..];
    assert_eq!(payload.len() % 4, 0);
    (
        header,
        payload
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
    )
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (x - y).abs() / y.abs().max(1e-12))
        .fold(0.0, f32::max)
}

#[test]
fn depth_writes_pfm_bottom_to_top_png_and_pose() {
    let dir = tempfile::tempdir().unwrap();
    let run = da3_in(
        dir.path(),
        &[
            "depth", "--pfm", "A.pfm", "--png", "B.png", "--pose", "C.json", "--device", "cpu",
        ],
    );
    assert_success(&run);
    assert_eq!(
        entries(dir.path()),
        ["A.pfm", "B.png", "C.json"],
        "no temporary files left"
    );

    // PFM: exact header, finite positive float32 payload, rows bottom to top.
    let (w, h) = (504, 336);
    let (header, values) = read_pfm(&dir.path().join("A.pfm"));
    assert_eq!(header, "Pf\n504 336\n-1.0\n");
    assert_eq!(values.len(), w * h);
    assert!(
        values.iter().all(|v| v.is_finite() && *v > 0.0),
        "depth must be finite and positive"
    );
    let (expected, ew, eh) = in_process_depth(504);
    assert_eq!((ew, eh), (w, h));
    let first_file_row = &values[..w];
    let last_image_row = &expected[(h - 1) * w..];
    let first_image_row = &expected[..w];
    assert!(
        max_rel_diff(first_file_row, last_image_row) <= 1e-5,
        "the file's first row is the image's last row"
    );
    assert!(
        max_rel_diff(first_file_row, first_image_row) > 1e-3,
        "top and bottom rows differ, so the order is tested"
    );
    let flipped: Vec<f32> = values.chunks_exact(w).rev().flatten().copied().collect();
    assert!(max_rel_diff(&flipped, &expected) <= 1e-5);

    // PNG: 504x336 RGB.
    let png = image::open(dir.path().join("B.png")).unwrap();
    assert_eq!((png.width(), png.height()), (504, 336));
    assert_eq!(png.color(), image::ColorType::Rgb8);

    // Pose: pinhole intrinsics centred on the processed image, a rotation in the extrinsics.
    let pose: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("C.json")).unwrap()).unwrap();
    let k = |r: usize, c: usize| pose["intrinsics"][r][c].as_f64().unwrap();
    assert!(k(0, 0) > 0.0 && k(1, 1) > 0.0, "{pose}");
    assert_eq!((k(0, 2), k(1, 2)), (252.0, 168.0));
    assert_eq!(
        (pose["width"].as_u64(), pose["height"].as_u64()),
        (Some(504), Some(336))
    );
    let r = |i: usize, j: usize| pose["extrinsics_world_to_camera"][i][j].as_f64().unwrap();
    for i in 0..3 {
        for j in 0..3 {
            let dot: f64 = (0..3).map(|c| r(i, c) * r(j, c)).sum();
            let want = if i == j { 1.0 } else { 0.0 };
            assert!((dot - want).abs() < 1e-4, "rows {i},{j} of R: {dot}");
        }
    }
}

/// `--ray-pose`: the camera comes from the ray branch (the library's solver on the same
/// image, at the same processed size), the depth is the same bytes, and with known poses it
/// is refused.
#[test]
fn ray_pose_changes_the_camera_and_not_the_depth() {
    let dir = tempfile::tempdir().unwrap();
    let base = ["depth", "--device", "cpu", "--process-res", "112"];
    let plain = da3_in(
        dir.path(),
        &[&base[..], &["--pfm", "a.pfm", "--pose", "a.json"]].concat(),
    );
    assert_success(&plain);
    let rays = da3_in(
        dir.path(),
        &[
            &base[..],
            &["--ray-pose", "--pfm", "b.pfm", "--pose", "b.json"],
        ]
        .concat(),
    );
    assert_success(&rays);
    let read = |f: &str| std::fs::read(dir.path().join(f)).unwrap();
    assert_eq!(read("a.pfm"), read("b.pfm"));
    let json = |f: &str| -> serde_json::Value { serde_json::from_slice(&read(f)).unwrap() };
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    };
    let model = Model::from_gguf(&builtin_model_file().unwrap(), &options).unwrap();
    let mut session = model.session().unwrap();
    let image = synthetic::image(640, 427);
    let request = da3::Request::image(&image).process_res(112).ray_pose(true);
    let view = session.run(&request).unwrap().into_single().unwrap();
    let pose = view.pose.unwrap();
    let b = json("b.json");
    for r in 0..3 {
        for c in 0..3 {
            let k = b["intrinsics"][r][c].as_f64().unwrap();
            assert!((k - f64::from(pose.intrinsics[r][c])).abs() <= 1e-4 * k.abs().max(1.0));
        }
        for c in 0..4 {
            let e = b["extrinsics_world_to_camera"][r][c].as_f64().unwrap();
            assert!((e - f64::from(pose.extrinsics[r][c])).abs() <= 1e-5, "{b}");
        }
    }
    assert_ne!(json("a.json")["intrinsics"], b["intrinsics"]);
    let both = da3_in(
        dir.path(),
        &[
            &base[..],
            &["--ray-pose", "--poses", "a.json", "--out-dir", "."],
        ]
        .concat(),
    );
    assert_eq!(both.code, Some(2), "{}", both.context());
    assert!(both.stderr.contains("--ray-pose"), "{}", both.context());
}

#[test]
fn depth_gray_png_is_gray_and_brightest_where_nearest() {
    let dir = tempfile::tempdir().unwrap();
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--png",
            "g.png",
            "--pfm",
            "g.pfm",
            "--colormap",
            "gray",
            "--process-res",
            "112",
            "--device",
            "cpu",
        ],
    );
    assert_success(&run);
    let png = image::open(dir.path().join("g.png")).unwrap().to_rgb8();
    let (w, h) = (png.width() as usize, png.height() as usize);
    assert!(
        png.pixels().all(|p| p[0] == p[1] && p[1] == p[2]),
        "gray colormap"
    );
    let (_, values) = read_pfm(&dir.path().join("g.pfm"));
    assert_eq!(values.len(), w * h);
    let depth: Vec<f32> = values.chunks_exact(w).rev().flatten().copied().collect();
    let argmin = (0..depth.len())
        .min_by(|&a, &b| depth[a].total_cmp(&depth[b]))
        .unwrap();
    let argmax = (0..depth.len())
        .max_by(|&a, &b| depth[a].total_cmp(&depth[b]))
        .unwrap();
    let level = |i: usize| png.get_pixel((i % w) as u32, (i / w) as u32)[0];
    assert_eq!(level(argmin), 255, "nearest pixel is white");
    assert_eq!(level(argmax), 0, "farthest pixel is black");
    assert_eq!(png.pixels().map(|p| p[0]).max(), Some(255));
}

// --- da3 depth: bad input ----------------------------------------------------------------------

#[test]
fn random_bytes_are_not_a_gguf_file() {
    let case = BadModelCase::new(|_, model| {
        let bytes: Vec<u8> = (0..4096u64)
            .map(|i| (synthetic::uniform_pm1(7, i) * 127.0 + 128.0) as u8)
            .collect();
        std::fs::write(model, bytes).unwrap();
    });
    case.assert_depth_fails(&["not a GGUF file"]);
}

#[test]
fn empty_file_is_reported_as_truncated() {
    let case = BadModelCase::new(|_, model| std::fs::write(model, b"").unwrap());
    case.assert_depth_fails(&["truncated"]);
}

#[test]
fn gguf_truncated_in_tensor_data_names_a_tensor() {
    let case = BadModelCase::new(|dir, model| {
        let full = std::fs::read(tiny_model(dir)).unwrap();
        let data_offset = GgufFile::from_bytes(full.clone()).unwrap().data_offset() as usize;
        let cut = full.len() - 10_000;
        assert!(cut > data_offset, "the cut lies in the tensor data");
        std::fs::write(model, &full[..cut]).unwrap();
    });
    case.assert_depth_fails(&["tensor", "past the end of the file"]);
}

#[test]
fn llama_architecture_is_refused() {
    let case = BadModelCase::new(|dir, model| {
        rewrite_model(&tiny_model(dir), model, "llama", |_| TensorEdit::Keep)
    });
    case.assert_depth_fails(&["not a Depth Anything model", "`llama`"]);
}

#[test]
/// A Depth Anything 3 file relabelled as depth-anything.cpp's DA2 (`depthanything2`): refused,
/// naming the DA3 part a DA2 model has not.
fn a_da3_file_labelled_depthanything2_is_refused_naming_what_disagrees() {
    let case = BadModelCase::new(|dir, model| {
        rewrite_model(&tiny_model(dir), model, "depthanything2", |_| {
            TensorEdit::Keep
        })
    });
    case.assert_depth_fails(&["Depth Anything V2 file (depthanything2)", "vit.alt_start"]);
}

#[test]
fn missing_tensor_is_named() {
    let case = BadModelCase::new(|dir, model| {
        rewrite_model(&tiny_model(dir), model, "depthanything3", |name| {
            if name == "vit.blk.1.ls1" {
                TensorEdit::Drop
            } else {
                TensorEdit::Keep
            }
        })
    });
    case.assert_depth_fails(&["`vit.blk.1.ls1`", "missing"]);
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes() {
    let case = BadModelCase::new(|dir, model| {
        rewrite_model(&tiny_model(dir), model, "depthanything3", |name| {
            if name == "vit.blk.0.attn_qkv.weight" {
                TensorEdit::Reshape(vec![384, 64])
            } else {
                TensorEdit::Keep
            }
        })
    });
    case.assert_depth_fails(&["`vit.blk.0.attn_qkv.weight`", "[384, 64]", "[384, 128]"]);
}

/// `da3 depth` on the built-in model with `extra` arguments must fail cleanly, mention
/// `parts`, and leave nothing in the (otherwise empty) working folder.
fn assert_depth_args_fail(extra: &[&str], parts: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let mut args = vec!["depth", "--pfm", "d.pfm", "--png", "d.png"];
    if !extra.contains(&"--process-res") {
        args.extend(["--process-res", "112"]);
    }
    args.extend_from_slice(extra);
    let run = da3_in(dir.path(), &args);
    assert_clean_failure(&run, parts);
    assert_eq!(
        entries(dir.path()),
        Vec::<String>::new(),
        "{}",
        run.context()
    );
}

#[test]
fn text_file_named_png_is_not_an_image() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("photo.png");
    std::fs::write(&input, "this is not a picture\n").unwrap();
    let out = dir.path().join("d.pfm");
    let run = da3(&[
        "depth",
        "--input",
        path_str(&input),
        "--pfm",
        path_str(&out),
    ]);
    assert_clean_failure(&run, &["photo.png", "decode"]);
    assert_eq!(entries(dir.path()), ["photo.png"]);
}

#[test]
fn missing_image_is_named() {
    assert_depth_args_fail(
        &["--input", "no-such-photo.jpg"],
        &["no-such-photo.jpg", "No such file"],
    );
}

#[test]
fn unreachable_rpc_device_names_the_endpoint() {
    assert_depth_args_fail(
        &["--device", "rpc:127.0.0.1:1"],
        &["127.0.0.1:1", "unreachable"],
    );
}

#[test]
fn unknown_device_lists_the_available_ones() {
    assert_depth_args_fail(
        &["--device", "NOPE0"],
        &["--device NOPE0", "available: ", "CPU"],
    );
}

#[test]
fn pfm_into_a_missing_folder_fails_before_computing() {
    let dir = tempfile::tempdir().unwrap();
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--pfm",
            "no-such-folder/d.pfm",
            "--process-res",
            "112",
        ],
    );
    assert_clean_failure(&run, &["--pfm", "no-such-folder"]);
    assert!(
        !run.stdout.contains("depth"),
        "nothing computed\n{}",
        run.context()
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
}

#[test]
fn sky_output_needs_a_sky_head() {
    assert_depth_args_fail(&["--sky", "sky.pfm"], &["--sky", "da3-tiny", "no sky head"]);
}

#[test]
fn process_res_below_the_patch_size_is_refused() {
    assert_depth_args_fail(&["--process-res", "7"], &["process_res 7", "patch size 14"]);
}

// --- da3 info, da3 devices ---------------------------------------------------------------------

/// `da3 info` prints the execution plan (a kernel for each op class) and ggml's CPU variant;
/// `--plan kernels=portable` (and, for compatibility, `DA3_CPU_KERNELS=portable`) plans the
/// portable set, whose nodes ggml computes, and the model still loads; a bad `--plan` value
/// is refused naming the setting.
#[test]
fn info_prints_the_execution_plan_and_honours_overrides() {
    let run = da3(&["info", "--device", "cpu"]);
    assert_success(&run);
    let line = |prefix: &str| {
        run.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line\n{}", run.context()))
            .to_owned()
    };
    assert!(line("ggml cpu").contains("AVX2"), "{}", run.context());
    assert!(line("plan").contains("on CPU"), "{}", run.context());
    for class in ["linear", "attention", "convolution", "norms", "transforms"] {
        line(class);
    }
    let portable = "ggml's ops (CPU kernel set portable)";
    let flag = da3(&["info", "--device", "cpu", "--plan", "kernels=portable"]);
    assert_success(&flag);
    assert!(flag.stdout.contains(portable), "{}", flag.context());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["info", "--device", "cpu"])
        .env("DA3_CPU_KERNELS", "portable")
        .output()
        .expect("da3 starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains(portable), "{stdout}");
    let bad = da3(&["info", "--device", "cpu", "--plan", "winograd=maybe"]);
    assert_ne!(bad.code, Some(0), "{}", bad.context());
    assert!(
        bad.stderr.contains("winograd") && bad.stderr.contains("on or off"),
        "{}",
        bad.context()
    );
}

#[test]
fn info_shows_architecture_groups_on_cpu_and_gallocr_plan() {
    let run = da3(&["info", "--device", "cpu"]);
    assert_success(&run);
    assert!(
        run.stdout
            .contains("architecture depthanything3 (da3-tiny)"),
        "{}",
        run.context()
    );
    for group in ["vit", "head", "cam"] {
        let line = run
            .stdout
            .lines()
            .find(|l| {
                l.strip_prefix("  ")
                    .is_some_and(|l| l.starts_with(&format!("{group} ")))
            })
            .unwrap_or_else(|| panic!("no `{group}` line\n{}", run.context()));
        assert!(
            line.contains("tensors") && line.trim_end().ends_with("on CPU"),
            "{line}"
        );
    }
    let residency = run
        .stdout
        .lines()
        .find(|l| l.starts_with("residency:"))
        .expect("a residency line");
    assert!(residency.ends_with("-> gallocr"), "{residency}");
}

#[test]
fn devices_lists_the_cpu() {
    let run = da3(&["devices"]);
    assert_success(&run);
    assert!(
        run.stdout.lines().any(|l| l.starts_with("CPU ")),
        "{}",
        run.context()
    );
}

/// `da3 bench` on the built-in model: the thread count it reports (text and JSON) is the one
/// it ran with, resolved from `--threads 0` (one per physical core) too, and two runs of one
/// image agree.
#[test]
fn bench_reports_its_threads_and_stable_depth() {
    let dir = tempfile::tempdir().unwrap();
    let physical = da3::ggml::default_threads();
    for (asked, used) in [("0", physical), ("1", 1)] {
        let json = dir.path().join(format!("bench-{asked}.json"));
        let run = da3(&[
            "bench",
            "--device",
            "cpu",
            "--process-res",
            "140",
            "--runs",
            "1",
            "--threads",
            asked,
            "--json",
            path_str(&json),
        ]);
        assert_success(&run);
        assert!(
            run.stdout.contains(&format!("CPU, {used} threads,")),
            "{}",
            run.context()
        );
        let report: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        assert_eq!(report["threads"], used, "{report}");
        assert_eq!(report["depth_drift_first_to_last"], 0.0, "{report}");
        assert!(report["median_ms"].as_f64().unwrap() > 0.0, "{report}");
    }
}

/// `da3 bench --profile`: the graph's time by class of op, in text and JSON, the classes'
/// nodes adding up to the graph's and the convolutions counted as products.
#[test]
fn bench_profile_prints_the_time_by_class_of_op() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let run = da3(&[
        "bench",
        "--device",
        "cpu",
        "--process-res",
        "140",
        "--runs",
        "1",
        "--profile",
        "--json",
        path_str(&json),
    ]);
    assert_success(&run);
    let total = run
        .stdout
        .lines()
        .find(|l| l.starts_with("total ") && l.contains(" nodes;"))
        .unwrap_or_else(|| panic!("no total line\n{}", run.context()));
    let nodes: usize = total
        .split(" over ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let classes = report["profile"].as_array().unwrap();
    let sum: u64 = classes.iter().map(|c| c["nodes"].as_u64().unwrap()).sum();
    assert_eq!(sum as usize, nodes, "{report}");
    let conv = classes
        .iter()
        .find(|c| c["class"] == "conv_2d")
        .expect("a conv_2d class");
    assert!(conv["gflop"].as_f64().unwrap() > 0.0 && conv["ms"].as_f64().unwrap() > 0.0);
}

/// A mono-style model (DPT head with a sky head; tiny backbone so that the test is quick):
/// `da3 depth` and the library's `predict` give the same post-processed depth bit for bit
/// (the sky rule lives in the library, not in the CLI).
#[test]
fn cli_and_library_give_identical_depth_for_a_sky_model() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mono-tiny.gguf");
    let tiny = Config::preset("da3-tiny").unwrap();
    let mut config = Config::preset("da3mono-large").unwrap();
    config.vit = tiny.vit.clone();
    config.head.features = tiny.head.features;
    config.head.out_channels = tiny.head.out_channels;
    write_synthetic(&path, &config, WeightType::F32).unwrap();
    let model = Model::load(
        &path,
        &LoadOptions {
            device: Device::Cpu,
            threads: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(model.config().head.sky);
    let image = synthetic::image(640, 427);
    let library = model
        .session()
        .unwrap()
        .run(&da3::Request::image(&image).process_res(112))
        .unwrap()
        .into_single()
        .unwrap();
    assert!(library.sky.is_some());
    let pfm = dir.path().join("d.pfm");
    let run = da3(&[
        "depth",
        "--model",
        path.to_str().unwrap(),
        "--process-res",
        "112",
        "--device",
        "cpu",
        "--threads",
        "2",
        "--pfm",
        pfm.to_str().unwrap(),
    ]);
    assert_success(&run);
    let (_, bottom_up) = read_pfm(&pfm);
    let (w, h) = (library.width, library.height);
    let top_down: Vec<f32> = (0..h)
        .rev()
        .flat_map(|r| bottom_up[r * w..(r + 1) * w].to_vec())
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&top_down), bits(&library.depth));
}

/// A reader that has closed the pipe (`da3 info | head -1` once head is done) ends `da3`
/// quietly with SIGPIPE's shell status, not a panic about printing.
#[test]
fn closed_stdout_ends_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["info", "--device", "cpu"])
        .stdout(writer)
        .output()
        .expect("da3 starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(141), "{stderr}");
}

/// Machine-readable summaries (`--json` on info, devices and depth), the full `--version` and
/// the shell completions.
#[test]
fn json_summaries_version_and_completions() {
    let parse = |run: &Run| -> serde_json::Value {
        assert_success(run);
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("{e}\n{}", run.context()))
    };
    let info = parse(&da3(&["info", "--json", "--device", "cpu"]));
    assert_eq!(info["name"], "da3-tiny", "{info}");
    assert_eq!(info["plan"]["device"], "CPU", "{info}");
    assert!(
        info["architecture"]["tensors"].as_u64().unwrap() > 100,
        "{info}"
    );

    let devices = parse(&da3(&["devices", "--json"]));
    assert!(devices["devices"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d["name"] == "CPU" && d["kind"] == "Cpu"));

    let dir = tempfile::tempdir().unwrap();
    let pfm = dir.path().join("d.pfm");
    let depth = parse(&da3(&[
        "depth",
        "--device",
        "cpu",
        "--process-res",
        "112",
        "--pfm",
        pfm.to_str().unwrap(),
        "--json",
    ]));
    assert_eq!(depth["device"], "CPU");
    assert_eq!(
        depth["views"][0]["processed_size"],
        serde_json::json!([112, 70])
    );
    assert_eq!(depth["written"], serde_json::json!([pfm]));
    assert!(pfm.is_file());

    let version = da3(&["--version"]);
    assert_success(&version);
    assert!(
        version.stdout.contains("ggml 0.") && version.stdout.contains("backends: CPU"),
        "{}",
        version.context()
    );
    for shell in ["bash", "zsh", "fish"] {
        let script = da3(&["completions", shell]);
        assert_success(&script);
        assert!(
            script.stdout.contains("depth"),
            "{shell}: {}",
            script.context()
        );
    }
}

/// A portrait photo stored sideways (EXIF orientation 6) is computed upright; with
/// `--ignore-exif-orientation` as stored (as the official loader reads it).
#[test]
fn exif_orientation_is_applied_unless_ignored() {
    use image::{ImageFormat, Rgb, RgbImage};
    let dir = tempfile::tempdir().unwrap();
    let stored = RgbImage::from_fn(64, 48, |x, y| Rgb([(x * 4) as u8, (y * 5) as u8, 90]));
    let mut jpeg = Vec::new();
    stored
        .write_to(&mut std::io::Cursor::new(&mut jpeg), ImageFormat::Jpeg)
        .unwrap();
    let tiff: &[u8] = &[
        b'I', b'I', 42, 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0,
    ];
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(tiff);
    let mut photo = jpeg[..2].to_vec();
    photo.extend_from_slice(&[0xFF, 0xE1]);
    photo.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    photo.extend_from_slice(&app1);
    photo.extend_from_slice(&jpeg[2..]);
    let path = dir.path().join("portrait.jpg");
    std::fs::write(&path, &photo).unwrap();
    let size = |extra: &[&str]| {
        let pfm = dir.path().join("d.pfm");
        let mut args = vec![
            "depth",
            "--device",
            "cpu",
            "--process-res",
            "112",
            "--input",
            path.to_str().unwrap(),
            "--pfm",
            pfm.to_str().unwrap(),
            "--json",
        ];
        args.extend_from_slice(extra);
        let run = da3(&args);
        assert_success(&run);
        let summary: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
        summary["views"][0]["input_size"].clone()
    };
    assert_eq!(size(&[]), serde_json::json!([48, 64]));
    assert_eq!(
        size(&["--ignore-exif-orientation"]),
        serde_json::json!([64, 48])
    );
}

/// A tiny input is upsampled far beyond its pixels: the run goes on and says so, naming the
/// file and the factor; an input near the process resolution gets no such warning.
#[test]
fn a_tiny_input_warns_that_it_was_upsampled() {
    let tmp = tempfile::tempdir().unwrap();
    image::RgbImage::from_fn(24, 16, |x, y| {
        image::Rgb([(x * 10) as u8, (y * 15) as u8, 90])
    })
    .save(tmp.path().join("tiny.png"))
    .unwrap();
    image::RgbImage::from_fn(140, 94, |x, y| image::Rgb([x as u8, y as u8, 90]))
        .save(tmp.path().join("fair.png"))
        .unwrap();
    let run = da3_in(
        tmp.path(),
        &[
            "depth",
            "--input",
            "tiny.png",
            "--process-res",
            "140",
            "--png",
            "tiny-depth.png",
        ],
    );
    assert_success(&run);
    assert!(
        run.stderr
            .contains("tiny.png is 24x16: upsampled 6x to 140x"),
        "{}",
        run.context()
    );
    let run = da3_in(
        tmp.path(),
        &[
            "depth",
            "--input",
            "fair.png",
            "--process-res",
            "140",
            "--png",
            "fair-depth.png",
        ],
    );
    assert_success(&run);
    assert!(!run.stderr.contains("upsampled"), "{}", run.context());
}
