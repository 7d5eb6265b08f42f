//! Scenes of several views against the official Depth Anything 3 code on synthetic weights:
//! the fixtures were made by `tests/reference/da3_multiview_reference.py` (the official forward
//! with B = 1 and S views) from the same weight formula as `da3::da3::synthetic`.

mod common;

use common::{agreement, fixture_dir, Agreement, Reference};
use da3::convert::{write_synthetic, WeightType};
use da3::multiview::select_reference_view;
use da3::{synthetic, Config, Device, LoadOptions, Model, RefViewStrategy, Session};
use serde_json::Value;

fn load_tiny() -> (Session, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("da3-tiny.gguf");
    write_synthetic(&path, &Config::preset("da3-tiny").unwrap(), WeightType::F32).unwrap();
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    };
    let model = Model::load(&path, &options).unwrap();
    (model.session().unwrap(), dir)
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture_dir("da3-tiny-multiview").join("manifest.json"))
        .expect("the multi-view fixture");
    serde_json::from_str(&text).unwrap()
}

/// A fixture array stored in full.
fn reference(entry: &Value) -> Reference {
    let file = fixture_dir("da3-tiny-multiview").join(entry["file"].as_str().unwrap());
    let bytes = std::fs::read(&file).unwrap();
    let values = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Reference {
        shape: entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect(),
        full: Some(values),
        samples: None,
        mean: entry["stats"]["mean"].as_f64().unwrap(),
        std: entry["stats"]["std"].as_f64().unwrap(),
    }
}

/// One view through the scene path is the single-image graph, bit for bit.
#[test]
fn a_one_view_scene_is_the_single_image_prediction_exactly() {
    let (mut model, _dir) = load_tiny();
    for (w, h) in [(640, 427), (427, 640)] {
        let image = synthetic::image(w, h);
        let single = model.predict_at(&image, 112).unwrap();
        let scene = model
            .predict_views_at(
                std::slice::from_ref(&image),
                112,
                RefViewStrategy::SaddleBalanced,
            )
            .unwrap();
        assert_eq!(scene.reference, 0);
        let view = &scene.views[0];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&view.depth), bits(&single.depth), "{w}x{h} depth");
        assert_eq!(
            bits(view.confidence.as_ref().unwrap()),
            bits(single.confidence.as_ref().unwrap()),
            "{w}x{h} confidence"
        );
        assert_eq!(view.pose, single.pose, "{w}x{h} pose");
    }
}

/// The official `select_reference_view` on seeded tokens, every strategy.
#[test]
fn reference_view_selection_matches_the_official_picks() {
    let m = manifest();
    let cases = m["selector_cases"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let dim = case["dim"].as_u64().unwrap() as usize;
        let tokens: Vec<f32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        for name in RefViewStrategy::NAMES {
            let strategy: RefViewStrategy = name.parse().unwrap();
            let official = case["picks"][name].as_u64().unwrap() as usize;
            assert_eq!(
                select_reference_view(&tokens, dim, strategy),
                official,
                "{} views, {name}",
                case["views"]
            );
        }
    }
}

fn assert_close(at: &str, what: &str, a: Agreement, positive: bool) {
    eprintln!("{at} {what}: {a:?}");
    if positive {
        assert!(a.max_rel <= 1e-3 && a.corr >= 0.99999, "{at} {what}: {a:?}");
    } else {
        assert!(a.max_scaled <= 1e-3, "{at} {what}: {a:?}");
    }
}

/// Every scene: the same reference view, depth and confidence of every view (max rel <= 1e-3,
/// correlation >= 0.99999), extrinsics and intrinsics within 1e-3 of their scale.
#[test]
fn scenes_match_the_official_multi_view_forward() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let (mut model, _dir) = load_tiny();
    for scene in m["scenes"].as_array().unwrap() {
        let at = scene["name"].as_str().unwrap().to_owned();
        let images: Vec<_> = scene["views"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                synthetic::image(
                    v["width"].as_u64().unwrap() as usize,
                    v["height"].as_u64().unwrap() as usize,
                )
            })
            .collect();
        let strategy: RefViewStrategy = scene["strategy"].as_str().unwrap().parse().unwrap();
        let prediction = model
            .predict_views_at(&images, process_res, strategy)
            .unwrap();
        assert_eq!(
            prediction.reference,
            scene["reference"].as_u64().unwrap() as usize,
            "{at}: reference view"
        );
        let arrays = &scene["arrays"];
        let (w, h) = (
            scene["processed_width"].as_u64().unwrap() as usize,
            scene["processed_height"].as_u64().unwrap() as usize,
        );
        let gather = |f: &dyn Fn(&da3::Prediction) -> Vec<f32>| -> Vec<f32> {
            prediction.views.iter().flat_map(f).collect()
        };
        for view in &prediction.views {
            assert_eq!((view.width, view.height), (w, h), "{at}");
        }
        let depth = gather(&|p| p.depth.clone());
        let conf = gather(&|p| p.confidence.clone().unwrap());
        let intr = gather(&|p| {
            p.pose
                .unwrap()
                .intrinsics
                .iter()
                .flatten()
                .copied()
                .collect()
        });
        let extr = gather(&|p| {
            p.pose
                .unwrap()
                .extrinsics
                .iter()
                .flatten()
                .copied()
                .collect()
        });
        assert_close(
            &at,
            "depth",
            agreement(&depth, &reference(&arrays["depth"])),
            true,
        );
        assert_close(
            &at,
            "confidence",
            agreement(&conf, &reference(&arrays["depth_conf"])),
            true,
        );
        assert_close(
            &at,
            "intrinsics",
            agreement(&intr, &reference(&arrays["intrinsics"])),
            false,
        );
        assert_close(
            &at,
            "extrinsics",
            agreement(&extr, &reference(&arrays["extrinsics"])),
            false,
        );
        // Per view too, so that one view cannot hide behind the others.
        let plane = w * h;
        let full = reference(&arrays["depth"]).full.unwrap();
        for (v, view) in prediction.views.iter().enumerate() {
            let r = Reference {
                shape: vec![h, w],
                full: Some(full[v * plane..(v + 1) * plane].to_vec()),
                samples: None,
                mean: 0.0,
                std: 0.0,
            };
            assert_close(
                &at,
                &format!("view {v} depth"),
                agreement(&view.depth, &r),
                true,
            );
        }
    }
}
