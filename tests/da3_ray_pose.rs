//! Ray-based pose against the official `use_ray_pose`: the fixture
//! (`tests/reference/ray_pose_reference.py`) records the official solver's outputs with its
//! RANSAC samples, which are given to ours (the official draws them unseeded).

mod common;

use common::{cpu_options, fixture_dir, peer_model_file, synthetic_tiny_file};
use da3::ray_pose::{pose_from_rays, pose_from_rays_with_samples, SplitMix64, RANSAC_SAMPLE};
use da3::{synthetic, Model, Pose, RayMap, RefViewStrategy, Request, Session};
use serde_json::Value;

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture_dir("ray-pose").join("manifest.json"))
        .expect("the ray pose fixture");
    serde_json::from_str(&text).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    match v {
        Value::Array(items) => items.iter().flat_map(floats).collect(),
        other => vec![other.as_f64().unwrap()],
    }
}

fn samples(v: &Value) -> Vec<[usize; RANSAC_SAMPLE]> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            let row: Vec<usize> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap() as usize)
                .collect();
            row.try_into().unwrap()
        })
        .collect()
}

/// `ours` against the official numbers, each within 1e-3 (relative above 1: the intrinsics
/// are in pixels).
fn assert_pose(at: &str, pose: &Pose, extrinsics: &[f64], intrinsics: &[f64]) {
    let ours_e: Vec<f64> = pose
        .extrinsics
        .iter()
        .flatten()
        .map(|&v| v.into())
        .collect();
    let ours_k: Vec<f64> = pose
        .intrinsics
        .iter()
        .flatten()
        .map(|&v| v.into())
        .collect();
    for (what, ours, theirs) in [
        ("extrinsics", &ours_e, extrinsics),
        ("intrinsics", &ours_k, intrinsics),
    ] {
        assert_eq!(ours.len(), theirs.len());
        for (a, b) in ours.iter().zip(theirs) {
            assert!(
                (a - b).abs() <= 1e-3 * b.abs().max(1.0),
                "{at} {what}: ours {ours:?}\nofficial {theirs:?}"
            );
        }
    }
}

fn load_tiny() -> (Session, tempfile::TempDir) {
    let (path, dir) = synthetic_tiny_file();
    (
        Model::load(&path, &cpu_options())
            .unwrap()
            .session()
            .unwrap(),
        dir,
    )
}

fn scene_images(scene: &Value) -> Vec<da3::preprocess::RgbImage8> {
    scene["views"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            synthetic::image(
                v["width"].as_u64().unwrap() as usize,
                v["height"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}

/// Pinhole cameras' rays with noise and outliers through the solver alone.
#[test]
fn the_solver_matches_the_official_one_on_the_same_samples() {
    let m = manifest();
    for camera in m["cameras"].as_array().unwrap() {
        let at = camera["name"].as_str().unwrap();
        let shape = floats(&camera["shape"]);
        let (h, w) = (shape[0] as usize, shape[1] as usize);
        let image = floats(&camera["image"]);
        let rays_hwc = floats(&camera["rays"]);
        let n = w * h;
        // Official [h, w, 6] to ours, channel-major.
        let mut rays = vec![0.0f32; 6 * n];
        for i in 0..n {
            for c in 0..6 {
                rays[c * n + i] = rays_hwc[i * 6 + c] as f32;
            }
        }
        let map = RayMap {
            width: w,
            height: h,
            rays,
            confidence: floats(&camera["confidence"])
                .iter()
                .map(|&v| v as f32)
                .collect(),
        };
        let pose = pose_from_rays_with_samples(
            &map,
            image[0] as usize,
            image[1] as usize,
            &samples(&camera["samples"]),
            &mut SplitMix64(0),
        )
        .unwrap();
        assert_pose(
            at,
            &pose,
            &floats(&camera["extrinsics"]),
            &floats(&camera["intrinsics"]),
        );
    }
}

/// Our ray branch's outputs through our solver against the official forward with
/// `use_ray_pose=True`, for every scene of the multi-view fixture.
#[test]
fn scene_ray_poses_match_the_official_use_ray_pose() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let (mut session, _dir) = load_tiny();
    for scene in m["scenes"].as_array().unwrap() {
        let at = scene["name"].as_str().unwrap();
        let strategy: RefViewStrategy = scene["strategy"].as_str().unwrap().parse().unwrap();
        let images = scene_images(scene);
        let request = Request::new(&images)
            .process_res(process_res)
            .reference(strategy)
            .rays(true);
        let prediction = session.run(&request).unwrap();
        let samples = samples(&scene["samples"]);
        let (extrinsics, intrinsics) = (floats(&scene["extrinsics"]), floats(&scene["intrinsics"]));
        for (v, view) in prediction.views.iter().enumerate() {
            let pose = pose_from_rays_with_samples(
                view.rays.as_ref().unwrap(),
                view.width,
                view.height,
                &samples,
                &mut SplitMix64(0),
            )
            .unwrap();
            assert_pose(
                &format!("{at} view {v}"),
                &pose,
                &extrinsics[v * 12..(v + 1) * 12],
                &intrinsics[v * 9..(v + 1) * 9],
            );
        }
    }
}

/// With ray pose on, each view's camera is the solver's on its rays (which are dropped unless
/// asked for), and depth is unchanged; known poses are refused with it.
#[test]
fn ray_pose_replaces_the_decoder_cameras_and_nothing_else() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let scene = &m["scenes"][2];
    let images = scene_images(scene);
    let (mut session, _dir) = load_tiny();
    let strategy = RefViewStrategy::SaddleBalanced;
    let request = Request::new(&images)
        .process_res(process_res)
        .reference(strategy);
    let with_rays = session.run(&request.clone().rays(true)).unwrap();
    let ray_posed = session.run(&request.clone().ray_pose(true)).unwrap();
    assert_eq!(ray_posed.reference, with_rays.reference);
    for (a, b) in ray_posed.views.iter().zip(&with_rays.views) {
        assert!(a.rays.is_none());
        assert_eq!(a.depth, b.depth);
        let solved = pose_from_rays(b.rays.as_ref().unwrap(), b.width, b.height).unwrap();
        assert_eq!(a.pose, Some(solved));
        assert_ne!(a.pose, b.pose, "the decoder's camera was replaced");
    }
    let pose = da3::KnownPose::new(
        &[
            vec![1.0, 0.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0, 0.0],
            vec![0.0, 0.0, 1.0, 0.0],
        ],
        &[
            vec![100.0, 0.0, 50.0],
            vec![0.0, 100.0, 20.0],
            vec![0.0, 0.0, 1.0],
        ],
    )
    .unwrap();
    let poses = vec![pose; images.len()];
    let err = session
        .run(&request.clone().ray_pose(true).poses(&poses))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ray pose"), "{err}");
    // A file without the ray branch (depth-anything.cpp's converter) refuses ray pose.
    let mut peer = Model::load(peer_model_file(), &cpu_options())
        .unwrap()
        .session()
        .unwrap();
    let err = peer.run(&request.ray_pose(true)).unwrap_err().to_string();
    assert!(err.contains("ray branch"), "{err}");
}
