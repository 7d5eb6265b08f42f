//! `da3 depth` and `da3 batch` with Depth Anything V2 models (synthetic da2-tiny files in
//! depth-anything.cpp's DA2 layout): the disparity of the relative model and the metres of
//! the metric one named as such, the DA2 preprocessing size, and what DA2 cannot do refused
//! by name before anything is computed.

mod common;

use common::{assert_clean_failure, da3_in, entries};
use da3::convert::{write_synthetic, WeightType};
use da3::{Config, DepthActivation};
use std::path::Path;

fn write_da2(path: &Path, activation: DepthActivation) {
    let mut config = Config::preset("da2-tiny").unwrap();
    config.head.activation = activation;
    write_synthetic(path, &config, WeightType::F32).unwrap();
}

fn photo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/peer/test-640x480.png")
}

/// `da3 depth --model MODEL --input <the test photo> --device cpu EXTRA...` in `dir`.
fn depth(dir: &Path, model: &str, extra: &[&str]) -> common::Run {
    let photo = photo();
    let mut args = vec![
        "depth",
        "--model",
        model,
        "--input",
        photo.to_str().unwrap(),
        "--device",
        "cpu",
    ];
    args.extend_from_slice(extra);
    da3_in(dir, &args)
}

#[test]
fn a_relative_model_writes_disparity_named_so_at_the_da2_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("da2.gguf");
    write_da2(&model, DepthActivation::Relu);
    let run = depth(
        dir.path(),
        model.to_str().unwrap(),
        &[
            "--process-res",
            "196",
            "--pfm",
            "d.pfm",
            "--png16",
            "d16.png",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    // DA2's lower bound: the short side 480 -> 196, the long one 261.3 -> 19 patches = 266.
    assert!(
        run.stdout.contains("640x480 -> 266x196 on CPU: disparity"),
        "{}",
        run.context()
    );
    assert!(
        run.stdout.contains("(relative_disparity)"),
        "{}",
        run.context()
    );
    let png16 = std::fs::read(dir.path().join("d16.png")).unwrap();
    let text = String::from_utf8_lossy(&png16);
    assert!(
        text.contains("relative_disparity"),
        "the PNG names its unit"
    );
    // Without --process-res: DA2's own 518 (the file's input size), not DA3's 504.
    let run = depth(dir.path(), model.to_str().unwrap(), &["--pfm", "d518.pfm"]);
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(run.stdout.contains("-> 686x518"), "{}", run.context());
}

#[test]
fn a_metric_model_writes_metres() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("da2-metric.gguf");
    write_da2(&model, DepthActivation::Sigmoid { max_depth: 20.0 });
    let run = depth(
        dir.path(),
        model.to_str().unwrap(),
        &["--process-res", "196", "--pfm", "d.pfm"],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(run.stdout.contains(": depth "), "{}", run.context());
    assert!(run.stdout.contains("(metres)"), "{}", run.context());
}

#[test]
fn what_da2_cannot_do_is_refused_by_name_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("da2.gguf");
    write_da2(&model, DepthActivation::Relu);
    let photo = photo();
    let (model, photo) = (model.to_str().unwrap(), photo.to_str().unwrap());
    let base = [
        "depth", "--model", model, "--input", photo, "--device", "cpu",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--ply", "c.ply"],
            &["--ply", "disparity", "scale and a shift"],
        ),
        (&["--conf", "c.pfm"], &["--conf", "no confidence"]),
        (
            &["--input", photo, "--out-dir", "scene"],
            &["2 images as one scene", "one image at a time"],
        ),
        (&["--pfm", "d.pfm", "--ray-pose"], &["ray"]),
    ];
    for (extra, parts) in cases {
        let run = da3_in(dir.path(), &with(extra));
        assert_clean_failure(&run, parts);
    }
    // The scene's --out-dir is created before the model is read (as for every model), and
    // stays empty.
    assert_eq!(entries(dir.path()), vec!["da2.gguf", "scene"]);
    assert!(entries(&dir.path().join("scene")).is_empty());
}

#[test]
fn batch_computes_each_image_alone() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("da2.gguf");
    write_da2(&model, DepthActivation::Relu);
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    for name in ["a.png", "b.png"] {
        std::fs::copy(photo(), inputs.join(name)).unwrap();
    }
    let run = da3_in(
        dir.path(),
        &[
            "batch",
            "in",
            "--model",
            model.to_str().unwrap(),
            "--device",
            "cpu",
            "--process-res",
            "196",
            "--out-dir",
            "out",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        entries(&dir.path().join("out")),
        ["a.pfm", "a.png", "b.pfm", "b.png", "summary.json"]
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/summary.json")).unwrap())
            .unwrap();
    assert_eq!(summary["ok"], 2, "{summary}");
    for result in summary["results"].as_array().unwrap() {
        // DA2's own size at --process-res 196, not DA3's longest-side rule (196x147 -> 196x154).
        assert_eq!(
            result["processed_size"],
            serde_json::json!([266, 196]),
            "{result}"
        );
    }
}

#[test]
fn convert_reads_the_official_pth_and_names_what_it_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let pth = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/da2-tiny/depth_anything_v2_tiny.pth");
    let run = da3_in(
        dir.path(),
        &["convert", pth.to_str().unwrap(), "-o", "tiny.gguf"],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(
        run.stdout.contains("pretrained.mask_token"),
        "{}",
        run.context()
    );
    let run = depth(
        dir.path(),
        "tiny.gguf",
        &["--process-res", "196", "--pfm", "d.pfm"],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(run.stdout.contains("disparity"), "{}", run.context());

    // As a metric model: the depth range given, metres out.
    let run = da3_in(
        dir.path(),
        &[
            "convert",
            pth.to_str().unwrap(),
            "-o",
            "metric.gguf",
            "--max-depth",
            "20",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let config = da3::gguf::GgufFile::open(dir.path().join("metric.gguf")).unwrap();
    assert_eq!(
        da3::Config::from_gguf(&config).unwrap().head.activation,
        DepthActivation::Sigmoid { max_depth: 20.0 }
    );

    // Valid torch checkpoints that are not DA2 state dicts (tests/fixtures/pth/README.md):
    // read, then refused by name, nothing written.
    for name in ["not_da2_state_dict.pth", "wrapped_training_checkpoint.pth"] {
        let other = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/pth")
            .join(name);
        let run = da3_in(
            dir.path(),
            &["convert", other.to_str().unwrap(), "-o", "other.gguf"],
        );
        assert_clean_failure(
            &run,
            &[
                name,
                "no `pretrained.cls_token`",
                "not a Depth Anything V2 state dict",
            ],
        );
        assert!(!dir.path().join("other.gguf").exists());
    }

    // Not a checkpoint: named, nothing written.
    std::fs::write(dir.path().join("bad.pth"), b"not a zip").unwrap();
    let run = da3_in(dir.path(), &["convert", "bad.pth", "-o", "bad.gguf"]);
    assert_clean_failure(&run, &["bad.pth", "not a PyTorch zip checkpoint"]);
    assert!(!dir.path().join("bad.gguf").exists());
}
