//! `da3 convert` on checkpoint folders in the official layout (`config.json` and
//! `model.safetensors` with `model.`-prefixed keys), holding the synthetic weights: the
//! converted file must compute exactly what the synthetic GGUF file computes, and broken
//! checkpoints must fail with an error naming what is wrong.

mod common;

use common::{correlation, da3_in, official_entries, write_checkpoint, Entry, Run};

use da3::convert::{convert_checkpoint, write_synthetic, WeightType};
use da3::ggml::DType;
use da3::gguf::GgufFile;
use da3::{synthetic, Config, Device, LoadOptions, Model};
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const PRESET: &str = "da3-tiny";

/// Tensors the official checkpoint has and no graph uses (the 3DGS head, the ray branch's
/// coarser levels), and one camera-encoder name the architecture does not declare.
const EXTRA_KEYS: &[&str] = &[
    "model.head.scratch.output_conv1_aux.0.0.weight",
    "model.gs_head.something",
    "model.cam_enc.something",
];

/// The state dict of the official model for `PRESET` with the synthetic weights, plus the
/// entries of [`EXTRA_KEYS`].
fn official_state_dict() -> Vec<Entry> {
    official_entries(PRESET, EXTRA_KEYS)
}

const TINY_CONFIG: &str = r#"{"model_name": "da3-tiny"}"#;

/// A temporary folder with `ckpt/` (made by the caller) and an empty `out/`.
struct Workspace {
    dir: tempfile::TempDir,
}

impl Workspace {
    fn new() -> Workspace {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("out")).unwrap();
        Workspace { dir }
    }
    fn checkpoint(&self) -> PathBuf {
        self.dir.path().join("ckpt")
    }
    fn out(&self, name: &str) -> PathBuf {
        self.dir.path().join("out").join(name)
    }
    /// Everything in `out/`, hidden temporary files included.
    fn out_entries(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path().join("out"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
    /// `da3 convert ckpt -o out/NAME [extra]`.
    fn convert(&self, name: &str, extra: &[&str]) -> Run {
        let mut args: Vec<std::ffi::OsString> = vec![
            "convert".into(),
            self.checkpoint().into(),
            "-o".into(),
            self.out(name).into(),
        ];
        args.extend(extra.iter().map(|a| a.into()));
        da3_in(self.dir.path(), &args)
    }
    /// The conversion must fail cleanly, mention `parts`, and write nothing.
    fn assert_convert_fails(&self, parts: &[&str]) {
        let run = self.convert("model.gguf", &[]);
        assert_eq!(run.code, Some(1), "{}", run.context());
        assert!(run.stderr.starts_with("Error:"), "{}", run.context());
        assert!(!run.stderr.contains("panicked"), "{}", run.context());
        for part in parts {
            assert!(
                run.stderr.contains(part),
                "stderr should mention `{part}`\n{}",
                run.context()
            );
        }
        assert_eq!(
            self.out_entries(),
            Vec::<String>::new(),
            "nothing written\n{}",
            run.context()
        );
    }
}

/// Depth of the model file on the synthetic image, on the CPU.
fn depth(model: &Path, process_res: usize) -> Vec<f32> {
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    };
    let model = Model::load(model, &options).unwrap();
    assert!(
        model.unused_tensors().is_empty(),
        "unused: {:?}",
        model.unused_tensors()
    );
    model
        .session()
        .unwrap()
        .run(&da3::Request::image(&synthetic::image(640, 427)).process_res(process_res))
        .and_then(da3::Output::into_single)
        .unwrap()
        .depth
}

/// The synthetic GGUF file for `PRESET`, written by the library.
fn synthetic_file(dir: &Path) -> PathBuf {
    let path = dir.join("synthetic.gguf");
    write_synthetic(&path, &Config::preset(PRESET).unwrap(), WeightType::F32).unwrap();
    path
}

/// A tensor of a GGUF file as f32 values.
fn tensor_f32(file: &GgufFile, name: &str) -> Vec<f32> {
    let info = file
        .tensor(name)
        .unwrap_or_else(|| panic!("no tensor {name}"));
    assert_eq!(info.dtype, DType::F32, "{name}");
    file.tensor_data(info)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn converted_checkpoint_computes_exactly_the_synthetic_model() {
    let ws = Workspace::new();
    write_checkpoint(
        &ws.checkpoint(),
        Some(TINY_CONFIG),
        &official_state_dict(),
        Dtype::F32,
    );
    let run = ws.convert("model.gguf", &[]);
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(
        run.stdout
            .contains(&format!("left out {} tensors", EXTRA_KEYS.len())),
        "{}",
        run.context()
    );
    assert_eq!(ws.out_entries(), ["model.gguf"], "no temporary file left");

    let reference = synthetic_file(ws.dir.path());
    let (converted, expected) = (
        GgufFile::open(ws.out("model.gguf")).unwrap(),
        GgufFile::open(&reference).unwrap(),
    );
    assert_eq!(converted.tensors().len(), expected.tensors().len());
    let ours = depth(&ws.out("model.gguf"), 112);
    let theirs = depth(&reference, 112);
    assert_eq!(ours.len(), theirs.len());
    let identical = ours
        .iter()
        .zip(&theirs)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(
        identical,
        "depth of the converted file differs from the synthetic file's"
    );
}

#[test]
fn dropped_tensors_are_reported_by_name() {
    let ws = Workspace::new();
    write_checkpoint(
        &ws.checkpoint(),
        Some(TINY_CONFIG),
        &official_state_dict(),
        Dtype::F32,
    );
    let skipped =
        convert_checkpoint(&ws.checkpoint(), &ws.out("model.gguf"), WeightType::F32).unwrap();
    let mut expected: Vec<String> = EXTRA_KEYS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(skipped, expected);
    let file = GgufFile::open(ws.out("model.gguf")).unwrap();
    assert!(file.tensors().iter().all(|t| !t.name.contains("aux_unused")
        && !t.name.contains("gs_")
        && t.name != "cam_enc.something"));
    // The camera encoder (known poses in) and the ray branch's last level are kept.
    for name in [
        "head.scratch.rn1_aux.rc1.c1.weight",
        "head.scratch.out1_aux.4.bias",
        "head.scratch.out2_aux_ln.weight",
        "head.scratch.out2b_aux.weight",
        "cam_enc.pose.fc1.weight",
        "cam_enc.token_norm.bias",
        "cam_enc.blk.3.attn_qkv.weight",
        "cam_enc.blk.0.ls2",
        "cam_enc.trunk_norm.weight",
    ] {
        assert!(
            file.tensors().iter().any(|t| t.name == name),
            "{name} missing from the converted file"
        );
    }
}

#[test]
fn f16_conversion_stores_f16_matrices_and_keeps_depth() {
    let ws = Workspace::new();
    write_checkpoint(
        &ws.checkpoint(),
        Some(TINY_CONFIG),
        &official_state_dict(),
        Dtype::F32,
    );
    for (name, extra) in [("f32.gguf", &[][..]), ("f16.gguf", &["--type", "f16"][..])] {
        let run = ws.convert(name, extra);
        assert_eq!(run.code, Some(0), "{}", run.context());
    }
    let f16 = GgufFile::open(ws.out("f16.gguf")).unwrap();
    let halves = f16
        .tensors()
        .iter()
        .filter(|t| t.dtype == DType::F16)
        .count();
    assert!(halves > 0, "--type f16 stores some matrices as f16");
    assert!(f16.file_size() < GgufFile::open(ws.out("f32.gguf")).unwrap().file_size());
    let corr = correlation(
        &depth(&ws.out("f16.gguf"), 112),
        &depth(&ws.out("f32.gguf"), 112),
    );
    assert!(corr >= 0.999, "correlation {corr}");
}

#[test]
fn bf16_checkpoint_converts_rounded_values_and_loads() {
    let ws = Workspace::new();
    let entries = official_state_dict();
    write_checkpoint(&ws.checkpoint(), Some(TINY_CONFIG), &entries, Dtype::BF16);
    let run = ws.convert("model.gguf", &[]);
    assert_eq!(run.code, Some(0), "{}", run.context());

    let file = GgufFile::open(ws.out("model.gguf")).unwrap();
    let norm = entries
        .iter()
        .find(|e| e.key == "model.backbone.pretrained.norm.weight")
        .unwrap();
    let rounded: Vec<f32> = norm
        .values
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    assert_ne!(
        rounded, norm.values,
        "bf16 rounding changes the synthetic values"
    );
    assert_eq!(tensor_f32(&file, "vit.norm.weight"), rounded);

    let d = depth(&ws.out("model.gguf"), 112);
    assert!(d.iter().all(|v| v.is_finite() && *v > 0.0));
}

#[test]
fn missing_config_json_is_named() {
    let ws = Workspace::new();
    write_checkpoint(&ws.checkpoint(), None, &official_state_dict(), Dtype::F32);
    ws.assert_convert_fails(&["config.json"]);
}

#[test]
fn unknown_model_name_is_named_with_the_known_presets() {
    let ws = Workspace::new();
    write_checkpoint(
        &ws.checkpoint(),
        Some(r#"{"model_name": "da3-huge"}"#),
        &official_state_dict(),
        Dtype::F32,
    );
    ws.assert_convert_fails(&["config.json", "`da3-huge`", "da3-small"]);
}

#[test]
fn missing_tensor_is_named() {
    let ws = Workspace::new();
    let missing = "model.backbone.pretrained.blocks.2.ls2.gamma";
    let entries: Vec<Entry> = official_state_dict()
        .into_iter()
        .filter(|e| e.key != missing)
        .collect();
    write_checkpoint(&ws.checkpoint(), Some(TINY_CONFIG), &entries, Dtype::F32);
    ws.assert_convert_fails(&["model.safetensors", &format!("`{missing}`"), "missing"]);
}

#[test]
fn misshapen_tensor_is_named_with_both_shapes() {
    let ws = Workspace::new();
    let key = "model.head.projects.1.weight";
    let mut entries = official_state_dict();
    let entry = entries.iter_mut().find(|e| e.key == key).unwrap();
    let expected = entry.shape.clone();
    entry.shape[0] += 1;
    entry.values = synthetic::weight_values(key, &entry.shape);
    let found = entry.shape.clone();
    write_checkpoint(&ws.checkpoint(), Some(TINY_CONFIG), &entries, Dtype::F32);
    ws.assert_convert_fails(&[
        &format!("`{key}`"),
        &format!("{found:?}"),
        &format!("{expected:?}"),
    ]);
}

/// The state dict of `da3nested-tiny`: both branches, values keyed by the full key, and one
/// key of the 3DGS head.
fn nested_entries() -> Vec<Entry> {
    let branch = |preset: &str, prefix: &str| -> Vec<Entry> {
        let config = Config::preset(preset).unwrap();
        da3::convert::expected_tensors(&config)
            .unwrap()
            .into_iter()
            .map(|(gguf, shape)| {
                let key = format!("{prefix}{}", da3::convert::official_name(&gguf));
                Entry {
                    values: synthetic::weight_values(&key, &shape),
                    key,
                    shape,
                }
            })
            .collect()
    };
    let mut entries = branch("da3-tiny", "model.da3.");
    entries.extend(branch("da3metric-tiny", "model.da3_metric."));
    entries.push(Entry {
        key: "model.da3.gs_head.something".into(),
        shape: vec![2],
        values: vec![1.0, 2.0],
    });
    entries
}

/// The nested model's checkpoint in the layout of the 1.1 release
/// (`depth-anything/DA3NESTED-GIANT-LARGE-1.1`: `config.json` with `model_name` and the full
/// `config` the hub mixin writes, the two branches under `model.da3.` and `model.da3_metric.`),
/// at test size (`da3nested-tiny`): two files, each holding exactly its branch's tensors
/// (values keyed by the full checkpoint key, so branches swapped would show), named after
/// the folder, and paired by `da3 depth --metric-model` into depth in metres.
#[test]
fn nested_checkpoint_in_the_1_1_layout_converts_to_its_two_branches() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("DA3NESTED-TINY-1.1");
    let entries = nested_entries();
    let config_json = r#"{"model_name": "da3nested-tiny", "config": {"__object__":
        {"path": "depth_anything_3.model.da3", "name": "NestedDepthAnything3Net"},
        "anyview": {"net": {"name": "vitg"}}, "metric": {"net": {"name": "vitl"}}}}"#;
    write_checkpoint(&ckpt, Some(config_json), &entries, Dtype::F32);
    let run = da3_in(
        dir.path(),
        &["convert", "DA3NESTED-TINY-1.1", "-o", "nested.gguf"],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    for (file, preset, prefix, name) in [
        (
            "nested.gguf",
            "da3-tiny",
            "model.da3.",
            "DA3NESTED-TINY-1.1",
        ),
        (
            "nested-metric.gguf",
            "da3metric-tiny",
            "model.da3_metric.",
            "DA3NESTED-TINY-1.1-metric",
        ),
    ] {
        let gguf = GgufFile::open(dir.path().join(file)).unwrap();
        let config = Config::from_gguf(&gguf).unwrap();
        assert_eq!(config.name, name);
        let expected = da3::convert::expected_tensors(&Config::preset(preset).unwrap()).unwrap();
        assert_eq!(gguf.tensors().len(), expected.len(), "{file}");
        for (tensor, shape) in expected {
            let key = format!("{prefix}{}", da3::convert::official_name(&tensor));
            assert_eq!(
                tensor_f32(&gguf, &tensor),
                synthetic::weight_values(&key, &shape),
                "{file}: {tensor}"
            );
        }
    }
    assert!(
        run.stdout.contains("left out 1 tensors"),
        "the 3DGS head: {}",
        run.context()
    );
    let photo =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/peer/test-640x480.png");
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--model",
            "nested.gguf",
            "--metric-model",
            "nested-metric.gguf",
            "--input",
            photo.to_str().unwrap(),
            "--device",
            "cpu",
            "--process-res",
            "112",
            "--pfm",
            "d.pfm",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(run.stdout.contains("(metres)"), "{}", run.context());
}

/// A nested checkpoint whose metric branch lacks a tensor: an error naming it, and neither
/// file (the any-view branch was written first and is taken back).
#[test]
fn a_nested_checkpoint_missing_a_metric_tensor_writes_neither_file() {
    let ws = Workspace::new();
    let missing = "model.da3_metric.head.scratch.output_conv1.weight";
    let entries: Vec<Entry> = nested_entries()
        .into_iter()
        .filter(|e| e.key != missing)
        .collect();
    write_checkpoint(
        &ws.checkpoint(),
        Some(r#"{"model_name": "da3nested-tiny"}"#),
        &entries,
        Dtype::F32,
    );
    ws.assert_convert_fails(&[missing]);
}

/// A checkpoint with the giant's 3D Gaussian head (`gs_head.*`, at test size) converts with
/// it, `da3 depth --gs-ply` writes the Gaussians of a scene as a 3DGS PLY file and
/// `--gs-video` a video of them; the flags on a model without the head fail before
/// computing, naming the model.
#[test]
fn gaussian_head_converts_and_writes_a_gaussian_ply() {
    let ws = Workspace::new();
    write_checkpoint(
        &ws.checkpoint(),
        Some(r#"{"model_name": "da3-tiny-gs"}"#),
        &official_entries("da3-tiny-gs", &["model.gs_adapter.sh_mask"]),
        Dtype::F32,
    );
    let run = ws.convert("gs.gguf", &[]);
    assert_eq!(run.code, Some(0), "{}", run.context());
    let file = GgufFile::open(ws.out("gs.gguf")).unwrap();
    for name in [
        "gs.merger.2.weight",
        "gs.proj.0.bias",
        "gs.scratch.out2b.weight",
    ] {
        assert!(file.tensor(name).is_some(), "{name} missing");
    }
    let model = ws.out("gs.gguf");
    // `da3 depth --model gs.gguf --process-res RES ARGS...` on the built-in image.
    let depth_at = |res: &str, args: &[&std::ffi::OsStr]| {
        let mut all: Vec<&std::ffi::OsStr> = vec![
            "depth".as_ref(),
            "--model".as_ref(),
            model.as_os_str(),
            "--process-res".as_ref(),
            res.as_ref(),
        ];
        all.extend_from_slice(args);
        da3_in(ws.dir.path(), &all)
    };
    let ply = ws.out("scene.gs.ply");
    let scene = ws.out("scene");
    let run = depth_at(
        "112",
        &[
            "--out-dir".as_ref(),
            scene.as_os_str(),
            "--gs-ply".as_ref(),
            ply.as_os_str(),
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let bytes = std::fs::read(&ply).unwrap();
    let header = String::from_utf8_lossy(&bytes[..bytes.len().min(600)]).into_owned();
    assert!(
        header.starts_with("ply\nformat binary_little_endian 1.0\n"),
        "{header}"
    );
    for property in ["f_dc_0", "opacity", "scale_2", "rot_3"] {
        assert!(
            header.contains(&format!("property float {property}\n")),
            "{header}"
        );
    }
    let count: usize = header
        .lines()
        .find_map(|l| l.strip_prefix("element vertex "))
        .unwrap()
        .parse()
        .unwrap();
    // The built-in 640x427 image at 112: 112x70 Gaussians before pruning.
    assert!(count > 0 && count < 112 * 70, "{count}");
    let end = header.find("end_header\n").unwrap() + "end_header\n".len();
    assert_eq!(bytes.len(), end + count * 17 * 4);

    // A video along the default path: one view gets the official wander (120 frames and the
    // camera itself first and last), colour beside depth.
    let video = ws.out("gs.mp4");
    let pfm = ws.out("one.pfm");
    let run = depth_at(
        "56",
        &[
            "--pfm".as_ref(),
            pfm.as_os_str(),
            "--gs-video".as_ref(),
            video.as_os_str(),
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let probe = std::process::Command::new("ffprobe")
        .args(["-v", "error", "-count_frames", "-show_entries"])
        .args(["stream=width,height,nb_read_frames", "-of", "csv=p=0"])
        .arg(&video)
        .output()
        .expect("ffprobe (installed with ffmpeg, .ci/run)");
    // The built-in 640x427 image at 56 is 56 x 42: two of them side by side.
    assert_eq!(String::from_utf8_lossy(&probe.stdout).trim(), "112,42,122");

    // Without ffmpeg on PATH: named before anything is computed, nothing written.
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_da3"))
        .current_dir(ws.dir.path())
        .env("PATH", empty.path())
        .args(["depth", "--model"])
        .arg(ws.out("gs.gguf"))
        .args(["--process-res", "56", "--gs-video"])
        .arg(ws.out("no-ffmpeg.mp4"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--gs-video") && stderr.contains("`ffmpeg` program"),
        "{stderr}"
    );
    assert!(!ws.out("no-ffmpeg.mp4").exists());

    // The synthetic da3-tiny has no Gaussian head.
    let tiny = synthetic_file(ws.dir.path());
    let run = da3_in(
        ws.dir.path(),
        &[
            "depth".as_ref(),
            "--model".as_ref(),
            tiny.as_os_str(),
            "--gs-ply".as_ref(),
            ws.out("none.ply").as_os_str(),
        ],
    );
    assert_eq!(run.code, Some(1), "{}", run.context());
    assert!(run.stderr.contains("--gs-ply") && run.stderr.contains("no 3D Gaussian head"));
    assert!(!ws.out("none.ply").exists());
}
