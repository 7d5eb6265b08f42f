//! Scenes of several views against the official Depth Anything 3 code on synthetic weights:
//! the fixtures were made by `tests/reference/da3_multiview_reference.py` (the official forward
//! with B = 1 and S views) from the same weight formula as `da3::da3::synthetic`.

mod common;

use common::{
    agreement, assert_close, cpu_options, fixture_dir, full_reference_in, peer_model_file,
    synthetic_tiny_file, Reference,
};
use da3::multiview::select_reference_view;
use da3::{poses, synthetic, KnownPose, LoadOptions, Model, RefViewStrategy, Request, Session};
use serde_json::Value;
use std::path::PathBuf;

/// The fixture the scene tests compare against: the committed da3-tiny one, or the folder
/// `DA3_MULTIVIEW_FIXTURE` names (the reference script's output for a larger preset, as
/// `tests/reference/multiview_parity.sh` makes and runs it).
fn fixture_path() -> PathBuf {
    std::env::var_os("DA3_MULTIVIEW_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixture_dir("da3-tiny-multiview"))
}

/// The fixture's model (synthetic weights of its preset) with its camera encoder (the
/// known-pose tests use it).
fn load_tiny() -> (Session, tempfile::TempDir) {
    let preset = manifest()["preset"].as_str().unwrap().to_owned();
    let (path, dir) = if preset == "da3-tiny" {
        synthetic_tiny_file()
    } else {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{preset}.gguf"));
        let config = da3::Config::preset(&preset).unwrap();
        da3::convert::write_synthetic(&path, &config, da3::convert::WeightType::F32).unwrap();
        (path, dir)
    };
    let options = LoadOptions {
        camera_encoder: true,
        ..cpu_options()
    };
    let model = Model::load(&path, &options).unwrap();
    (model.session().unwrap(), dir)
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture_path().join("manifest.json"))
        .expect("the multi-view fixture");
    serde_json::from_str(&text).unwrap()
}

/// A fixture array stored in full.
fn reference(entry: &Value) -> Reference {
    full_reference_in(&fixture_path(), entry)
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
            let ours = select_reference_view(&tokens, dim, strategy);
            if ours != official {
                // A tie, which the official f32 rounding breaks (ties go to the first view
                // here): the two scores must agree.
                let scores = da3::multiview::reference_scores(&tokens, dim, strategy).unwrap();
                let gap = (scores[ours] - scores[official]).abs();
                assert!(
                    gap < 1e-5,
                    "{} views, {name}: ours {ours}, official {official}, scores {scores:?}",
                    case["views"]
                );
                assert!(ours < official, "a tie goes to the first view");
            }
        }
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
        let mut prediction = model
            .run(
                &Request::new(&images)
                    .process_res(process_res)
                    .reference(strategy),
            )
            .unwrap();
        let official = scene["reference"].as_u64().unwrap() as usize;
        if prediction.reference != official {
            // Only a tie in the official scores may differ (their f32 rounding breaks it);
            // the outputs are then compared with the official pick given as the reference.
            let tokens = reference(&scene["arrays"]["selection_token0"])
                .full
                .unwrap();
            let dim = tokens.len() / images.len();
            let scores = da3::multiview::reference_scores(&tokens, dim, strategy).unwrap();
            let gap = (scores[prediction.reference] - scores[official]).abs();
            eprintln!(
                "{at}: reference {} against the official {official}, scores {gap:e} apart",
                prediction.reference
            );
            assert!(gap < 1e-5, "{at}: reference view, scores {scores:?}");
            prediction = model
                .run(
                    &Request::new(&images)
                        .process_res(process_res)
                        .reference(RefViewStrategy::View(official)),
                )
                .unwrap();
        }
        assert_eq!(prediction.reference, official, "{at}: reference view");
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

/// A posed scene's cameras from the manifest, and its synthetic images.
fn posed_inputs(scene: &Value) -> (Vec<da3::preprocess::RgbImage8>, Vec<KnownPose>) {
    let rows = |v: &Value| -> Vec<Vec<f64>> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap())
                    .collect()
            })
            .collect()
    };
    scene["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let image = synthetic::image(
                v["width"].as_u64().unwrap() as usize,
                v["height"].as_u64().unwrap() as usize,
            );
            let pose = KnownPose::new(&rows(&v["extrinsics"]), &rows(&v["intrinsics"])).unwrap();
            (image, pose)
        })
        .unzip()
}

fn posed_scene(name: &str) -> Value {
    manifest()["posed_scenes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("posed scene {name}"))
        .clone()
}

fn flat_poses(prediction: &da3::Output) -> (Vec<f32>, Vec<f32>) {
    let mut intr = Vec::new();
    let mut extr = Vec::new();
    for view in &prediction.views {
        let pose = view.pose.unwrap();
        intr.extend(pose.intrinsics.iter().flatten());
        extr.extend(pose.extrinsics.iter().flatten());
    }
    (intr, extr)
}

/// Known cameras of two views: the official InputProcessor's intrinsics, the official
/// normalisation, and the network forward through the camera encoder (before the alignment,
/// which the official code refuses for two views).
#[test]
fn two_views_with_known_poses_match_the_official_forward() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let scene = posed_scene("2v_posed");
    let arrays = &scene["arrays"];
    let (images, poses) = posed_inputs(&scene);
    let mut intrinsics = Vec::new();
    for (im, pose) in images.iter().zip(&poses) {
        let plan = da3::preprocess::plan_resize(im.width, im.height, process_res).unwrap();
        intrinsics.push(poses::processed_intrinsics(
            &pose.intrinsics,
            im.width,
            im.height,
            &plan,
        ));
    }
    let flat_k: Vec<f32> = intrinsics
        .iter()
        .flatten()
        .flatten()
        .map(|&v| v as f32)
        .collect();
    assert_close(
        "2v_posed",
        "processed intrinsics",
        agreement(&flat_k, &reference(&arrays["processed_intrinsics"])),
        false,
    );
    let given: Vec<_> = poses.iter().map(|p| p.extrinsics).collect();
    let normalized = poses::normalize_extrinsics(&given);
    let flat_e: Vec<f32> = normalized
        .iter()
        .flatten()
        .flatten()
        .map(|&v| v as f32)
        .collect();
    assert_close(
        "2v_posed",
        "normalised extrinsics",
        agreement(&flat_e, &reference(&arrays["normalized_extrinsics"])),
        false,
    );
    // The forward through the camera encoder, before the alignment to the given cameras.
    let (mut model, _dir) = load_tiny();
    let request = Request::new(&images)
        .process_res(process_res)
        .poses(&poses)
        .raw_outputs(true);
    let prediction = model.run(&request).unwrap();
    assert_eq!(prediction.reference, 0);
    let depth: Vec<f32> = prediction
        .views
        .iter()
        .flat_map(|p| p.depth.clone())
        .collect();
    let conf: Vec<f32> = prediction
        .views
        .iter()
        .flat_map(|p| p.confidence.clone().unwrap())
        .collect();
    let (intr, extr) = flat_poses(&prediction);
    assert_close(
        "2v_posed",
        "depth",
        agreement(&depth, &reference(&arrays["net_depth"])),
        true,
    );
    assert_close(
        "2v_posed",
        "confidence",
        agreement(&conf, &reference(&arrays["net_depth_conf"])),
        true,
    );
    assert_close(
        "2v_posed",
        "intrinsics",
        agreement(&intr, &reference(&arrays["net_intrinsics"])),
        false,
    );
    assert_close(
        "2v_posed",
        "extrinsics",
        agreement(&extr, &reference(&arrays["net_extrinsics"])),
        false,
    );
    // The cameras changed the prediction: without them the same views predict other depth.
    let free = Request::new(&images)
        .process_res(process_res)
        .reference(RefViewStrategy::First)
        .raw_outputs(true);
    let free = model.run(&free).unwrap();
    let free_depth: Vec<f32> = free.views.iter().flat_map(|p| p.depth.clone()).collect();
    let a = agreement(&free_depth, &reference(&arrays["net_depth"]));
    assert!(a.max_rel > 1e-2, "known poses changed nothing: {a:?}");
}

/// Known cameras of three views through the whole official path: the forward, the Umeyama
/// scale and the aligned outputs (depth in the units of the given cameras, the given
/// extrinsics, the processed intrinsics).
#[test]
fn three_views_with_known_poses_match_the_official_inference() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let scene = posed_scene("3v_posed");
    let arrays = &scene["arrays"];
    let (images, poses) = posed_inputs(&scene);
    let (mut model, _dir) = load_tiny();
    let prediction = model
        .run(&Request::new(&images).process_res(process_res).poses(&poses))
        .unwrap();
    assert_eq!(prediction.reference, 0);
    let scale = prediction.pose_scale.unwrap();
    let official = scene["scale"].as_f64().unwrap();
    eprintln!("3v_posed scale: ours {scale}, official {official}");
    assert!(
        (scale / official - 1.0).abs() <= 1e-3,
        "{scale} vs {official}"
    );
    let depth: Vec<f32> = prediction
        .views
        .iter()
        .flat_map(|p| p.depth.clone())
        .collect();
    let conf: Vec<f32> = prediction
        .views
        .iter()
        .flat_map(|p| p.confidence.clone().unwrap())
        .collect();
    let (intr, extr) = flat_poses(&prediction);
    assert_close(
        "3v_posed",
        "depth",
        agreement(&depth, &reference(&arrays["depth"])),
        true,
    );
    assert_close(
        "3v_posed",
        "confidence",
        agreement(&conf, &reference(&arrays["net_depth_conf"])),
        true,
    );
    assert_close(
        "3v_posed",
        "intrinsics",
        agreement(&intr, &reference(&arrays["intrinsics"])),
        false,
    );
    assert_close(
        "3v_posed",
        "extrinsics",
        agreement(&extr, &reference(&arrays["extrinsics"])),
        false,
    );
}

/// Poses for the wrong number of views, and a file without a camera encoder (written by
/// depth-anything.cpp's converter), are refused with reasons.
#[test]
fn known_poses_are_refused_where_they_cannot_apply() {
    let scene = posed_scene("3v_posed");
    let (images, poses) = posed_inputs(&scene);
    let (mut model, _dir) = load_tiny();
    let err = model
        .run(&Request::new(&images).process_res(112).poses(&poses[..2]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 camera pose(s) for 3 view(s)"), "{err}");
    let options = LoadOptions {
        camera_encoder: true,
        ..cpu_options()
    };
    let mut peer = Model::load(peer_model_file(), &options)
        .unwrap()
        .session()
        .unwrap();
    let err = peer
        .run(&Request::new(&images).process_res(112).poses(&poses))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no camera encoder"), "{err}");
}

/// The camera encoder is loaded only when asked for: without it the weights are smaller by
/// exactly its tensors, nothing is reported unused, and known poses are refused naming the
/// option; unposed outputs are the same either way.
#[test]
fn the_camera_encoder_is_loaded_only_when_asked_for() {
    let scene = posed_scene("3v_posed");
    let (images, poses) = posed_inputs(&scene);
    let (path, _dir) = synthetic_tiny_file();
    let load = |camera_encoder| {
        let options = LoadOptions {
            camera_encoder,
            ..cpu_options()
        };
        Model::load(&path, &options).unwrap()
    };
    let (with, without) = (load(true), load(false));
    let file = da3::gguf::GgufFile::open(&path).unwrap();
    let encoder_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| t.name.starts_with("cam_enc."))
        .map(|t| t.n_elements() * 4)
        .sum();
    assert!(encoder_bytes > 0);
    let saved = (with.device_weight_bytes() - without.device_weight_bytes()) as u64;
    // ggml pads each tensor to the buffer's alignment.
    assert!(
        saved >= encoder_bytes && saved < encoder_bytes + 64 * 1024,
        "{saved} vs {encoder_bytes}"
    );
    assert!(
        without.unused_tensors().is_empty(),
        "{:?}",
        without.unused_tensors()
    );
    let err = without
        .session()
        .unwrap()
        .run(&Request::new(&images).process_res(112).poses(&poses))
        .unwrap_err()
        .to_string();
    assert!(err.contains("camera_encoder: true"), "{err}");
    let depth = |model: &Model| {
        model
            .session()
            .unwrap()
            .run(
                &Request::new(&images)
                    .process_res(112)
                    .reference(RefViewStrategy::First),
            )
            .unwrap()
            .views
            .iter()
            .map(|v| v.depth.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(depth(&with), depth(&without));
}

/// The DualDPT ray branch of every scene (with the reference view each strategy picks):
/// ray and ray confidence per view against the official auxiliary head outputs.
#[test]
fn ray_branch_matches_the_official_auxiliary_outputs() {
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
        // The official pick as the reference (the scene test checks the selection, ties
        // included): the rays depend on it.
        let official = scene["reference"].as_u64().unwrap() as usize;
        let prediction = model
            .run(
                &Request::new(&images)
                    .process_res(process_res)
                    .reference(RefViewStrategy::View(official))
                    .rays(true),
            )
            .unwrap();
        let arrays = &scene["arrays"];
        let shape: Vec<usize> = arrays["ray"]["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let (h, w) = (shape[1], shape[2]);
        // Official [S, h, w, 6] (channels last) from ours (channel-major per view).
        let mut ray = Vec::new();
        let mut conf = Vec::new();
        for view in &prediction.views {
            let r = view.rays.as_ref().expect("ray outputs asked for");
            assert_eq!((r.width, r.height), (w, h), "{at}");
            for y in 0..h {
                for x in 0..w {
                    for c in 0..6 {
                        ray.push(r.rays[(c * h + y) * w + x]);
                    }
                }
            }
            conf.extend(&r.confidence);
        }
        assert_close(
            &at,
            "ray",
            agreement(&ray, &reference(&arrays["ray"])),
            false,
        );
        assert_close(
            &at,
            "ray confidence",
            agreement(&conf, &reference(&arrays["ray_conf"])),
            true,
        );
    }
    // Not asked for: no ray outputs; a file without the branch refuses them.
    let images = [synthetic::image(640, 240), synthetic::image(600, 225)];
    let plain = model
        .run(
            &Request::new(&images)
                .process_res(process_res)
                .reference(RefViewStrategy::First),
        )
        .unwrap();
    assert!(plain.views[0].rays.is_none());
    let mut peer = Model::load(peer_model_file(), &cpu_options())
        .unwrap()
        .session()
        .unwrap();
    let err = peer
        .run(&Request::new(&images).process_res(process_res).rays(true))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no ray branch"), "{err}");
}

/// The ray branch is stored as depth-anything.cpp's `--with-aux` files store it (listed from
/// such a file of da3-tiny in `peer/with-aux-tiny-tensors.json`): every tensor of theirs
/// with its name, shape and type, no ray-branch tensor they lack, and their `head.*aux*`
/// keys. (A file of theirs with the synthetic weights loaded here with nothing unused and
/// gave the official ray outputs; at 7 MB it is not committed.)
#[test]
fn the_ray_branch_has_the_layout_of_depth_anything_cpp_with_aux_files() {
    let listing: Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir("peer").join("with-aux-tiny-tensors.json")).unwrap(),
    )
    .unwrap();
    let (path, _dir) = synthetic_tiny_file();
    let ours = da3::gguf::GgufFile::open(&path).unwrap();
    let mut theirs_aux = Vec::new();
    for t in listing["tensors"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let ne: Vec<u64> = t["ne"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        let mine = ours
            .tensor(name)
            .unwrap_or_else(|| panic!("{name}: in their file, not in ours"));
        assert_eq!(mine.shape(), &ne[..], "{name}");
        assert_eq!(t["type"], "F32", "{name}");
        assert_eq!(mine.dtype, da3::ggml::DType::F32, "{name}");
        if name.contains("_aux") {
            theirs_aux.push(name.to_owned());
        }
    }
    let mut ours_aux: Vec<String> = ours
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_aux"))
        .map(|t| t.name.clone())
        .collect();
    ours_aux.sort();
    theirs_aux.sort();
    assert_eq!(ours_aux, theirs_aux);
    for (key, value) in listing["aux_keys"].as_object().unwrap() {
        let mine = match value {
            Value::Bool(b) => ours.opt_bool(key).unwrap() == Some(*b),
            Value::Number(n) => ours.opt_u32(key).unwrap().map(u64::from) == n.as_u64(),
            other => panic!("{key}: {other}"),
        };
        assert!(mine, "{key}: theirs {value}");
    }
}

/// `RefViewStrategy::View(i)` pins the reference view (for any number of views, two
/// included); an index outside the scene is an error naming it, not a panic.
#[test]
fn a_given_reference_view_is_used_and_one_outside_the_scene_refused() {
    let (mut model, _dir) = load_tiny();
    let images = [synthetic::image(640, 240), synthetic::image(600, 225)];
    let scene = model
        .run(
            &Request::new(&images)
                .process_res(112)
                .reference(RefViewStrategy::View(1)),
        )
        .unwrap();
    assert_eq!(scene.reference, 1);
    let default = model
        .run(
            &Request::new(&images)
                .process_res(112)
                .reference(RefViewStrategy::First),
        )
        .unwrap();
    assert_ne!(
        scene.views[0].pose, default.views[0].pose,
        "the world frame moved"
    );
    let err = model
        .run(
            &Request::new(&images)
                .process_res(112)
                .reference(RefViewStrategy::View(2)),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("reference view 2 of a scene of 2"),
        "{err}"
    );
    assert_eq!(
        "3".parse::<RefViewStrategy>().unwrap(),
        RefViewStrategy::View(3)
    );
    assert!("-1".parse::<RefViewStrategy>().is_err());
}
