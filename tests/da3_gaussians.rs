//! 3D Gaussians against the official `infer_gs` on seeded weights: the fixtures were made by
//! `tests/reference/da3_gs_reference.py` from the weight formula of `da3::synthetic`:
//! `da3-tiny-gs` (da3-tiny with the giant's Gaussian head and adapter at its widths, the
//! official forward of one, two and three views, and the official PLY export) and
//! `da3-giant-4-gs` (DA3-GIANT at full width with its official config, 4 blocks, two views).

mod common;

use common::{
    agreement, cpu_options, fixture_dir, full_reference_in, scene_images, Agreement, Reference,
};
use da3::{synthetic, KnownPose, LoadOptions, Model, RefViewStrategy, Request};
use serde_json::Value;

const TINY: &str = "da3-tiny-gs";
const GIANT: &str = "da3-giant-4-gs";

fn fixture(name: &str) -> std::path::PathBuf {
    fixture_dir(name)
}

fn manifest(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture(name).join("manifest.json")).expect("the fixture");
    serde_json::from_str(&text).unwrap()
}

/// The configuration of a fixture's model: `da3-tiny-gs`, or DA3-GIANT cut to 4 blocks as
/// the reference script cuts it (out layers 0-3, camera token, RoPE and QK-norm from block 2).
fn config_of(name: &str) -> da3::Config {
    match name {
        GIANT => {
            let mut c = da3::Config::preset("da3-giant").unwrap();
            c.vit.depth = 4;
            c.vit.out_layers = [0, 1, 2, 3];
            c.vit.alt_start = Some(2);
            c.vit.rope_start = Some(2);
            c.vit.qknorm_start = Some(2);
            c
        }
        _ => da3::Config::preset(TINY).unwrap(),
    }
}

/// A fixture's model with its Gaussian head loaded.
fn load_model(name: &str, dir: &tempfile::TempDir) -> Model {
    let path = dir.path().join(format!("{name}.gguf"));
    let config = config_of(name);
    da3::convert::write_synthetic(&path, &config, da3::convert::WeightType::F32).unwrap();
    let options = LoadOptions {
        gaussians: true,
        ..cpu_options()
    };
    Model::load(&path, &options).unwrap()
}

/// Within 1e-3 of the largest magnitude (the bound for the Gaussian parameters).
fn assert_within(at: &str, what: &str, a: Agreement) {
    eprintln!("{at} {what}: {a:?}");
    assert!(a.max_scaled <= 1e-3, "{at} {what}: {a:?}");
}

/// Every scene of both fixtures: means, scales, rotations, spherical harmonics and opacities
/// of every Gaussian within 1e-3 of the largest official value of each.
#[test]
fn gaussians_match_the_official_adapter() {
    for name in [TINY, GIANT] {
        check_fixture(name);
    }
}

fn check_fixture(name: &str) {
    let m = manifest(name);
    let preset = if name == GIANT { "da3-giant-4" } else { TINY };
    assert_eq!(m["preset"], preset, "the fixture's model");
    let dir = tempfile::tempdir().unwrap();
    let mut session = load_model(name, &dir).session().unwrap();
    let reference = |entry: &Value| -> Reference { full_reference_in(&fixture(name), entry) };
    for scene in m["scenes"].as_array().unwrap() {
        let at = &format!("{name} {}", scene["name"].as_str().unwrap());
        let images = scene_images(scene);
        let strategy: RefViewStrategy = scene["strategy"].as_str().unwrap().parse().unwrap();
        let output = session
            .run(
                &Request::new(&images)
                    .process_res(scene["process_res"].as_u64().unwrap() as usize)
                    .reference(strategy)
                    .gaussians(true),
            )
            .unwrap();
        let g = output.gaussians.as_ref().expect("Gaussians were asked for");
        let arrays = &scene["arrays"];
        let (w, h) = (
            scene["processed_width"].as_u64().unwrap() as usize,
            scene["processed_height"].as_u64().unwrap() as usize,
        );
        assert_eq!((g.views, g.width, g.height), (images.len(), w, h), "{at}");
        assert_eq!(
            g.len(),
            images.len() * w * h,
            "{at}: one Gaussian per pixel"
        );
        let flat3 = |v: &[[f32; 3]]| v.iter().flatten().copied().collect::<Vec<f32>>();
        assert_within(
            at,
            "means",
            agreement(&flat3(&g.means), &reference(&arrays["means"])),
        );
        // (Not per value: a scale is proportional to depth + the depth offset, which an
        // untrained head brings near zero at some pixels.)
        assert_within(
            at,
            "scales",
            agreement(&flat3(&g.scales), &reference(&arrays["scales"])),
        );
        // A quaternion and its negation are one rotation: the official code makes the last
        // component non-negative, so near zero either sign may come out.
        let official_rotations = reference(&arrays["rotations"]).full.unwrap();
        let rotations: Vec<f32> = g
            .rotations
            .iter()
            .zip(official_rotations.chunks(4))
            .flat_map(|(q, o)| {
                let dot: f32 = q.iter().zip(o).map(|(a, b)| a * b).sum();
                q.map(|v| if dot < 0.0 { -v } else { v })
            })
            .collect();
        assert_within(
            at,
            "rotations",
            agreement(&rotations, &reference(&arrays["rotations"])),
        );
        assert_eq!(g.sh_coefficients, 9, "{at}: SH degree 2");
        assert_within(
            at,
            "harmonics",
            agreement(&g.harmonics, &reference(&arrays["harmonics"])),
        );
        assert_within(
            at,
            "opacities",
            agreement(&g.opacities, &reference(&arrays["opacities"])),
        );
        // The depth the Gaussians stand on is the scene's.
        let depth: Vec<f32> = output.views.iter().flat_map(|v| v.depth.clone()).collect();
        let d = agreement(&depth, &reference(&arrays["depth"]));
        assert!(d.max_rel <= 1e-3, "{at} depth: {d:?}");
    }
}

/// Without the head loaded, or from a model without one, Gaussians are refused by name.
#[test]
fn gaussians_need_a_loaded_gaussian_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("da3-tiny-gs.gguf");
    let config = da3::Config::preset("da3-tiny-gs").unwrap();
    da3::convert::write_synthetic(&path, &config, da3::convert::WeightType::F32).unwrap();
    let image = synthetic::image(64, 48);
    let images = [image];
    let request = Request::new(&images).process_res(56).gaussians(true);

    let without = Model::load(&path, &cpu_options()).unwrap();
    let err = without
        .session()
        .unwrap()
        .run(&request)
        .unwrap_err()
        .to_string();
    assert!(err.contains("LoadOptions { gaussians: true"), "{err}");

    let (tiny, _tiny_dir) = common::synthetic_tiny_file();
    let options = LoadOptions {
        gaussians: true,
        ..cpu_options()
    };
    let no_head = Model::load(&tiny, &options).unwrap();
    let err = no_head
        .session()
        .unwrap()
        .run(&request)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no 3D Gaussian head"), "{err}");
    // Known cameras: refused before computing (the official code leaves the Gaussians in the
    // network's frame while it moves the cameras to the given ones).
    let with_head = Model::load(&path, &options).unwrap();
    let identity: da3::poses::Mat4 =
        std::array::from_fn(|i| std::array::from_fn(|j| (i == j) as u8 as f64));
    let known = [KnownPose {
        extrinsics: identity,
        intrinsics: [[50.0, 0.0, 32.0], [0.0, 50.0, 24.0], [0.0, 0.0, 1.0]],
    }];
    let err = with_head
        .session()
        .unwrap()
        .run(&request.clone().poses(&known))
        .unwrap_err()
        .to_string();
    assert!(err.contains("3D Gaussians with known poses"), "{err}");
    // Depth alone does not load or compute the head.
    let depth = without
        .session()
        .unwrap()
        .run(&Request::new(&images).process_res(56));
    assert!(depth.unwrap().gaussians.is_none());
}

/// A 3DGS PLY file's property names and rows (binary little-endian, float properties only).
fn read_gaussian_ply(path: &std::path::Path) -> (Vec<String>, Vec<Vec<f32>>) {
    let bytes = std::fs::read(path).unwrap();
    let end = bytes
        .windows(11)
        .position(|w| w == b"end_header\n")
        .expect("a PLY header")
        + 11;
    let header = std::str::from_utf8(&bytes[..end]).unwrap();
    assert!(
        header.starts_with("ply\nformat binary_little_endian 1.0\n"),
        "{header}"
    );
    let mut count = 0;
    let mut names = Vec::new();
    for line in header.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["element", "vertex", n] => count = n.parse().unwrap(),
            ["property", "float", name] => names.push(name.to_string()),
            ["property", ..] => panic!("not a float property: {line}"),
            _ => {}
        }
    }
    let values: Vec<f32> = bytes[end..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values.len(), count * names.len(), "{}", path.display());
    let rows = values.chunks(names.len()).map(<[f32]>::to_vec).collect();
    (names, rows)
}

/// `--gs-ply`'s file against the one the official `export_to_gs_ply` wrote for the same
/// scene: the same properties in the same order, the same Gaussians kept (border and depth
/// percentile pruning), every property within 1e-3 of its largest official magnitude.
#[test]
fn gaussian_ply_matches_the_official_export() {
    let m = manifest(TINY);
    let scene = m["scenes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s.get("ply").is_some())
        .expect("a scene with the official PLY");
    let dir = tempfile::tempdir().unwrap();
    let mut session = load_model(TINY, &dir).session().unwrap();
    let images = scene_images(scene);
    let output = session
        .run(
            &Request::new(&images)
                .process_res(scene["process_res"].as_u64().unwrap() as usize)
                .gaussians(true),
        )
        .unwrap();
    let ours_path = dir.path().join("gs.ply");
    let written = output
        .save_gaussian_ply(&ours_path, &da3::export::GaussianPlyOptions::default())
        .unwrap();
    let (names, ours) = read_gaussian_ply(&ours_path);
    let (official_names, official) =
        read_gaussian_ply(&fixture(TINY).join(scene["ply"].as_str().unwrap()));
    assert_eq!(names, official_names);
    assert_eq!(written, ours.len());
    assert_eq!(ours.len(), official.len(), "Gaussians kept");
    assert!(
        ours.len() < output.gaussians.as_ref().unwrap().len(),
        "some were pruned"
    );
    for (k, name) in names.iter().enumerate() {
        let column = |rows: &[Vec<f32>]| rows.iter().map(|r| r[k]).collect::<Vec<f32>>();
        let (a, b) = (column(&ours), column(&official));
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        // A quaternion's sign may differ where its last component is near 0 (see above):
        // the rotation columns are compared up to the sign of the whole quaternion.
        if name.starts_with("rot_") {
            continue;
        }
        assert!(worst <= 1e-3 * scale, "{name}: {worst} of {scale}");
    }
    for (a, b) in ours.iter().zip(&official) {
        let (qa, qb) = (&a[13..17], &b[13..17]);
        let dot: f32 = qa.iter().zip(qb).map(|(x, y)| x * y).sum();
        let sign = if dot < 0.0 { -1.0 } else { 1.0 };
        for (x, y) in qa.iter().zip(qb) {
            assert!((sign * x - y).abs() <= 1e-3, "rotation {qa:?} vs {qb:?}");
        }
    }
}
