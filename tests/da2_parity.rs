//! Parity with the official Depth Anything V2 code (`DepthAnythingV2`, relative and metric)
//! on synthetic weights: the fixtures were made by `tests/reference/da2_reference.py` from the
//! weight formula of `da3::synthetic` keyed by DA2's own state-dict names, at `input_size`
//! 196 (the processed images are 294x196 and 196x294).

mod common;

use common::{agreement, Fixture};
use da3::convert::{write_synthetic, WeightType};
use da3::gguf::GgufFile;
use da3::preprocess::preprocess_da2;
use da3::{
    synthetic, Config, DepthActivation, DepthUnit, Device, LoadOptions, Model, Request, Session,
};
use std::path::Path;

/// A model file loaded on the CPU with probes.
fn open(path: &Path) -> Model {
    let model = Model::load(
        path,
        &LoadOptions {
            device: Device::Cpu,
            threads: 2,
            probes: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(model.config().is_da2());
    model
}

/// A synthetic model of `preset` (with `activation` for the head), and the folder its file
/// lives in.
fn load(preset: &str, activation: DepthActivation) -> (Session, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}.gguf"));
    let mut config = Config::preset(preset).unwrap();
    config.head.activation = activation;
    write_synthetic(&path, &config, WeightType::F32).unwrap();
    let model = open(&path);
    assert!(
        model.unused_tensors().is_empty(),
        "unused: {:?}",
        model.unused_tensors()
    );
    (model.session().unwrap(), dir)
}

fn matches_official(fixture: &str, preset: &str, activation: DepthActivation) {
    let (mut session, _dir) = load(preset, activation);
    session_matches_official(&mut session, fixture, preset, activation);
}

/// Every image of `fixture`: processed size, the backbone's stages, the depth channel before
/// its activation, and the output after it.
fn session_matches_official(
    session: &mut Session,
    fixture: &str,
    label: &str,
    activation: DepthActivation,
) {
    let fixture = Fixture::load(fixture);
    for case in &fixture.images {
        let at = format!("{label} {}", case.name);
        let image = synthetic::image(case.width, case.height);
        if case.has("input") {
            // The preprocessing alone: one float bicubic resize, normalised in f64.
            let processed = preprocess_da2(&image, fixture.process_res).unwrap();
            let a = agreement(&processed.chw, &case.reference("input"));
            eprintln!("{at} input {a:?}");
            assert!(a.max_scaled < 1e-5, "{at} input: {a:?}");
        }
        let request = Request::image(&image).process_res(fixture.process_res);
        let prediction = session.run(&request).unwrap().into_single().unwrap();
        assert_eq!(
            (prediction.width, prediction.height),
            (case.processed_width, case.processed_height),
            "{at}"
        );
        assert!(prediction.confidence.is_none() && prediction.pose.is_none());
        assert!(prediction.sky.is_none());
        for stage in ["tokens_in", "feat0", "feat3"] {
            if case.has(stage) {
                let a = agreement(prediction.probe(stage).unwrap(), &case.reference(stage));
                eprintln!("{at} {stage}: {a:?}");
                assert!(
                    a.max_scaled < 1e-4 && a.corr > 0.99999,
                    "{at} {stage}: {a:?}"
                );
            }
        }
        let logits = agreement(
            prediction.probe("depth_logits").unwrap(),
            &case.reference("depth_preact"),
        );
        let depth = agreement(&prediction.depth, &case.reference("depth"));
        eprintln!("{at} depth_preact {logits:?}\n{at} depth {depth:?}");
        assert!(
            logits.max_scaled <= 1e-3 && logits.corr >= 0.99999,
            "{at} before the activation: {logits:?}"
        );
        match activation {
            // Metres, all positive: every value within 1e-3 of the official one.
            DepthActivation::Sigmoid { .. } => {
                assert!(depth.max_rel <= 1e-3, "{at} depth: {depth:?}");
                assert_eq!(prediction.depth_unit, DepthUnit::Metres);
            }
            // The ReLU zeroes most pixels of an untrained model: errors on the map's scale.
            _ => {
                assert!(depth.max_scaled <= 1e-3, "{at} disparity: {depth:?}");
                assert_eq!(prediction.depth_unit, DepthUnit::Disparity);
            }
        }
    }
}

#[test]
fn small_relative_matches_official() {
    matches_official("da2-vits", "da2-small", DepthActivation::Relu);
}

#[test]
fn base_relative_matches_official() {
    matches_official("da2-vitb", "da2-base", DepthActivation::Relu);
}

#[test]
fn small_metric_matches_official_in_metres() {
    matches_official(
        "da2-vits-metric",
        "da2-small",
        DepthActivation::Sigmoid { max_depth: 20.0 },
    );
}

fn fixture_path(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// refinenet4's first residual unit: in the checkpoint and in depth-anything.cpp's files, but
/// the coarsest fusion block has no lateral input for it.
const UNUSED_UNIT: [&str; 4] = [
    "head.scratch.rn4.rc1.c1.bias",
    "head.scratch.rn4.rc1.c1.weight",
    "head.scratch.rn4.rc1.c2.bias",
    "head.scratch.rn4.rc1.c2.weight",
];

/// A file written by depth-anything.cpp's own DA2 converter (`convert_da2_to_gguf.py`, from
/// the seeded tiny checkpoint, `tests/reference/peer_da2_tiny.py`) computes what the official
/// code computes.
#[test]
fn depth_anything_cpp_da2_file_matches_official() {
    let model = open(&fixture_path("peer/peer-da2-tiny-seed0-f32.gguf"));
    let mut unused = model.unused_tensors().to_vec();
    unused.sort();
    assert_eq!(unused, UNUSED_UNIT);
    assert_eq!(model.process_res(), 518, "the file's input size");
    let mut session = model.session().unwrap();
    session_matches_official(
        &mut session,
        "da2-tiny",
        "peer da2-tiny",
        DepthActivation::Relu,
    );
}

/// `da3 convert`'s reading of the official `.pth` format (the seeded tiny checkpoint as
/// `torch.save` wrote it): the tensors depth-anything.cpp's converter wrote from the same
/// file, bit for bit, and the official depth.
#[test]
fn official_pth_converts_to_the_tensors_depth_anything_cpp_writes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny.gguf");
    let skipped = da3::convert::convert_da2_checkpoint(
        &fixture_path("da2-tiny/depth_anything_v2_tiny.pth"),
        &out,
        WeightType::F32,
        None,
    )
    .unwrap();
    assert_eq!(
        skipped,
        [
            "depth_head.scratch.refinenet4.resConfUnit1.conv1.bias",
            "depth_head.scratch.refinenet4.resConfUnit1.conv1.weight",
            "depth_head.scratch.refinenet4.resConfUnit1.conv2.bias",
            "depth_head.scratch.refinenet4.resConfUnit1.conv2.weight",
            "pretrained.mask_token",
        ]
    );
    let ours = GgufFile::open(&out).unwrap();
    let peer = GgufFile::open(fixture_path("peer/peer-da2-tiny-seed0-f32.gguf")).unwrap();
    let values = |f: &GgufFile, name: &str| -> Vec<f32> {
        f.tensor_data(f.tensor(name).unwrap())
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let mut compared = 0;
    for t in ours.tensors() {
        assert_eq!(values(&ours, &t.name), values(&peer, &t.name), "{}", t.name);
        compared += 1;
    }
    assert_eq!(compared + UNUSED_UNIT.len(), peer.tensors().len());
    let model = open(&out);
    assert!(model.unused_tensors().is_empty());
    let mut session = model.session().unwrap();
    session_matches_official(
        &mut session,
        "da2-tiny",
        "converted da2-tiny",
        DepthActivation::Relu,
    );
}
