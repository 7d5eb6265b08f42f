//! `da3 depth` on a scene of several views: per-view files in --out-dir, every view's camera
//! in poses.json, the reference view the official code picks, and the library's numbers.

mod common;

use common::da3_in;
use da3::convert::builtin_model_file;
use da3::{synthetic, Device, LoadOptions, Model, RefViewStrategy};

/// The views of the multi-view fixture's `3v_saddle_balanced` scene (the official code picks
/// view 2 as the reference).
const VIEWS: [(usize, usize); 3] = [(600, 225), (680, 255), (640, 240)];

#[test]
fn depth_on_several_inputs_writes_every_view_and_the_scene_poses() {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec!["depth".into()];
    let mut images = Vec::new();
    for (i, &(w, h)) in VIEWS.iter().enumerate() {
        let im = synthetic::image(w, h);
        let name = format!("in{i}.png");
        image::RgbImage::from_raw(w as u32, h as u32, im.data.clone())
            .unwrap()
            .save(dir.path().join(&name))
            .unwrap();
        images.push(im);
        args.extend(["--input".into(), name]);
    }
    std::fs::create_dir(dir.path().join("out")).unwrap();
    args.extend(
        [
            "--out-dir",
            "out",
            "--process-res",
            "112",
            "--device",
            "cpu",
            "--threads",
            "2",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let run = da3_in(dir.path(), &args);
    assert_eq!(run.code, Some(0), "{}", run.context());
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "poses.json",
            "view0.pfm",
            "view0.png",
            "view1.pfm",
            "view1.png",
            "view2.pfm",
            "view2.png"
        ]
    );
    let poses: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("out/poses.json")).unwrap())
            .unwrap();
    assert_eq!(poses["reference"], 2, "{poses}");
    assert_eq!(poses["ref_view_strategy"], "saddle_balanced");
    let views = poses["views"].as_array().unwrap();
    assert_eq!(views.len(), 3);
    assert_eq!(views[2]["reference"], true);
    assert_eq!(views[0]["name"], "in0.png");

    // The same numbers as the library on the same images.
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    };
    let model = Model::from_gguf(&builtin_model_file().unwrap(), &options).unwrap();
    let scene = model
        .session()
        .unwrap()
        .run(
            &da3::Request::new(&images)
                .process_res(112)
                .reference(RefViewStrategy::SaddleBalanced),
        )
        .unwrap();
    for (i, view) in scene.views.iter().enumerate() {
        let bytes = std::fs::read(dir.path().join(format!("out/view{i}.pfm"))).unwrap();
        let header = format!("Pf\n{} {}\n-1.0\n", view.width, view.height);
        assert!(bytes.starts_with(header.as_bytes()), "view {i}");
        let values: Vec<f32> = bytes[header.len()..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        // PFM rows run bottom to top.
        let top_down: Vec<f32> = values
            .chunks_exact(view.width)
            .rev()
            .flatten()
            .copied()
            .collect();
        assert_eq!(top_down, view.depth, "view {i}");
        let e = &views[i]["extrinsics_world_to_camera"];
        assert_eq!(
            e[0][3].as_f64().unwrap() as f32,
            view.pose.unwrap().extrinsics[0][3]
        );
    }

    // Several inputs without a folder, or with a single-image flag, are refused.
    let run = da3_in(
        dir.path(),
        &["depth", "--input", "in0.png", "--input", "in1.png"],
    );
    assert_eq!(run.code, Some(1), "{}", run.context());
    assert!(run.stderr.contains("--out-dir"), "{}", run.context());
}

/// A camera looking along +z from `centre`, turned by `yaw` degrees about y: (world-to-camera
/// rows, COLMAP quaternion w x y z).
fn camera(yaw: f64, centre: [f64; 3]) -> ([[f64; 4]; 3], [f64; 4]) {
    let a = yaw.to_radians();
    let r = [
        [a.cos(), 0.0, a.sin()],
        [0.0, 1.0, 0.0],
        [-a.sin(), 0.0, a.cos()],
    ];
    let mut e = [[0.0; 4]; 3];
    for i in 0..3 {
        e[i][..3].copy_from_slice(&r[i]);
        e[i][3] = -(0..3).map(|j| r[i][j] * centre[j]).sum::<f64>();
    }
    // A rotation about y by a: q = (cos a/2, 0, sin a/2, 0).
    (e, [(a / 2.0).cos(), 0.0, (a / 2.0).sin(), 0.0])
}

#[test]
fn depth_with_known_cameras_from_json_or_colmap_matches_the_library() {
    let dir = tempfile::tempdir().unwrap();
    let cams = [
        (3.0, [0.1, 0.0, 0.2], 500.0),
        (-5.0, [1.2, 0.1, 0.0], 470.0),
        (7.0, [0.5, 0.8, -0.4], 540.0),
    ];
    let mut images = Vec::new();
    let mut poses = Vec::new();
    let mut json_views = Vec::new();
    let mut cameras_txt = String::from("# CAMERA_ID MODEL WIDTH HEIGHT PARAMS[]\n");
    let mut images_txt = String::from("# IMAGE_ID QW QX QY QZ TX TY TZ CAMERA_ID NAME\n");
    let mut args: Vec<String> = vec!["depth".into()];
    for (i, (&(w, h), &(yaw, centre, f))) in VIEWS.iter().zip(&cams).enumerate() {
        let im = synthetic::image(w, h);
        let name = format!("in{i}.png");
        image::RgbImage::from_raw(w as u32, h as u32, im.data.clone())
            .unwrap()
            .save(dir.path().join(&name))
            .unwrap();
        images.push(im);
        args.extend(["--input".into(), name.clone()]);
        let (e, q) = camera(yaw, centre);
        let (cx, cy) = (w as f64 / 2.0 + 1.5, h as f64 / 2.0 - 0.5);
        let k = [[f, 0.0, cx], [0.0, f, cy], [0.0, 0.0, 1.0]];
        let rows = |m: &[[f64; 4]; 3]| m.iter().map(|r| r.to_vec()).collect::<Vec<_>>();
        poses.push(
            da3::KnownPose::new(&rows(&e), &k.iter().map(|r| r.to_vec()).collect::<Vec<_>>())
                .unwrap(),
        );
        // Listed in reverse in the JSON: matched by name.
        json_views.insert(
            0,
            serde_json::json!({"name": name, "extrinsics": e, "intrinsics": k}),
        );
        cameras_txt.push_str(&format!("{} PINHOLE {w} {h} {f} {f} {cx} {cy}\n", i + 1));
        images_txt.push_str(&format!(
            "{} {} {} {} {} {} {} {} {} {name}\n\n",
            i + 1,
            q[0],
            q[1],
            q[2],
            q[3],
            e[0][3],
            e[1][3],
            e[2][3],
            i + 1
        ));
    }
    std::fs::write(
        dir.path().join("poses-in.json"),
        serde_json::json!({ "views": json_views }).to_string(),
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("sparse")).unwrap();
    std::fs::write(dir.path().join("sparse/cameras.txt"), cameras_txt).unwrap();
    std::fs::write(dir.path().join("sparse/images.txt"), images_txt).unwrap();
    let common: Vec<String> = ["--process-res", "112", "--device", "cpu", "--threads", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect();

    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        camera_encoder: true,
        ..Default::default()
    };
    let model = Model::from_gguf(&builtin_model_file().unwrap(), &options).unwrap();
    let scene = model
        .session()
        .unwrap()
        .run(&da3::Request::new(&images).process_res(112).poses(&poses))
        .unwrap();
    let scale = scene.pose_scale.unwrap();

    for (out, flag, value) in [
        ("json", "--poses", "poses-in.json"),
        ("colmap", "--poses-colmap", "sparse"),
    ] {
        std::fs::create_dir(dir.path().join(out)).unwrap();
        let mut a = args.clone();
        a.extend(common.iter().cloned());
        a.extend([flag.into(), value.into(), "--out-dir".into(), out.into()]);
        let run = da3_in(dir.path(), &a);
        assert_eq!(run.code, Some(0), "{}", run.context());
        assert!(run.stdout.contains("known cameras"), "{}", run.context());
        let written: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(out).join("poses.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(written["reference"], 0);
        assert_eq!(written["known_poses"], true);
        let s = written["pose_scale"].as_f64().unwrap();
        assert!((s / scale - 1.0).abs() < 1e-9, "{out}: {s} vs {scale}");
        for (i, view) in scene.views.iter().enumerate() {
            let bytes = std::fs::read(dir.path().join(format!("{out}/view{i}.pfm"))).unwrap();
            let header = format!("Pf\n{} {}\n-1.0\n", view.width, view.height);
            let values: Vec<f32> = bytes[header.len()..]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let top_down: Vec<f32> = values
                .chunks_exact(view.width)
                .rev()
                .flatten()
                .copied()
                .collect();
            // The COLMAP rotation comes from a quaternion: equal to rounding.
            let worst = top_down
                .iter()
                .zip(&view.depth)
                .map(|(a, b)| ((a - b) / b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "{out} view {i}: max rel {worst}");
            // The given cameras come back out.
            let e = &written["views"][i]["extrinsics_world_to_camera"];
            let want = view.pose.unwrap().extrinsics;
            for r in 0..3 {
                for c in 0..4 {
                    let got = e[r][c].as_f64().unwrap() as f32;
                    assert!((got - want[r][c]).abs() < 1e-5, "{out} view {i} [{r}][{c}]");
                }
            }
        }
    }

    // The written poses.json reads back as --poses (intrinsics of the processed size).
    std::fs::create_dir(dir.path().join("again")).unwrap();
    let mut a = args.clone();
    a.extend(common.iter().cloned());
    a.extend(["--poses", "json/poses.json", "--out-dir", "again"].map(String::from));
    let run = da3_in(dir.path(), &a);
    assert_eq!(run.code, Some(0), "{}", run.context());

    // Cameras for too few views, and a broken file, are refused before computing.
    std::fs::write(
        dir.path().join("two.json"),
        serde_json::json!([json_views[0], json_views[1]]).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("bad.json"), "{\"views\": [{}]}").unwrap();
    for (file, needle) in [
        ("two.json", "no camera for"),
        ("bad.json", "no `extrinsics`"),
    ] {
        let mut a = args.clone();
        a.extend(common.iter().cloned());
        a.extend(["--poses", file, "--out-dir", "again"].map(String::from));
        let run = da3_in(dir.path(), &a);
        assert_eq!(run.code, Some(1), "{}", run.context());
        assert!(run.stderr.contains(needle), "{}", run.context());
    }
}

/// `--metric-model`: the nested pair (da3-tiny any-view + depth-anything.cpp's nested metric
/// file) for one image and for a scene: the library's scale and outputs, sky maps from the
/// metric branch, and the pair's mistakes refused before any computing.
#[test]
fn a_nested_pair_gives_metric_depth_for_an_image_and_a_scene() {
    let dir = tempfile::tempdir().unwrap();
    let anyview = dir.path().join("any.gguf");
    let config = da3::Config::preset("da3-tiny").unwrap();
    da3::convert::write_synthetic(&anyview, &config, da3::convert::WeightType::F32).unwrap();
    let metric = common::fixture_dir("da3-tiny-nested").join("peer-metric-tiny-f32.gguf");
    let metric = metric.to_str().unwrap();
    let base = [
        "depth",
        "--model",
        "any.gguf",
        "--metric-model",
        metric,
        "--process-res",
        "112",
        "--device",
        "cpu",
    ];
    let (w, h) = VIEWS[0];
    let im = synthetic::image(w, h);
    image::RgbImage::from_raw(w as u32, h as u32, im.data.clone())
        .unwrap()
        .save(dir.path().join("in0.png"))
        .unwrap();
    let one = da3_in(
        dir.path(),
        &[
            &base[..],
            &[
                "--input", "in0.png", "--pfm", "d.pfm", "--sky", "s.pfm", "--pose", "p.json",
            ],
        ]
        .concat(),
    );
    assert_eq!(one.code, Some(0), "{}", one.context());
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        process_res: Some(112),
        ..Default::default()
    };
    let nested = da3::NestedModel::load(&anyview, metric, &options).unwrap();
    let expected = nested
        .session()
        .unwrap()
        .run(&da3::Request::image(&im).process_res(112))
        .unwrap();
    let scale = expected.metric_scale.unwrap();
    assert!(
        one.stdout
            .contains(&format!("times {scale:.6} to the metric")),
        "{}",
        one.context()
    );
    let pose: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("p.json")).unwrap()).unwrap();
    let t = pose["extrinsics_world_to_camera"][2][3].as_f64().unwrap();
    let ours = f64::from(expected.views[0].pose.as_ref().unwrap().extrinsics[2][3]);
    assert!(
        (t - ours).abs() <= 1e-5 * ours.abs().max(1.0),
        "{t} vs {ours}"
    );
    for f in ["d.pfm", "s.pfm"] {
        assert!(dir.path().join(f).is_file(), "{f}");
    }

    // A scene: per-view sky maps by default (the metric branch has the sky head).
    let (w1, h1) = VIEWS[1];
    let im1 = synthetic::image(w1, h1);
    image::RgbImage::from_raw(w1 as u32, h1 as u32, im1.data.clone())
        .unwrap()
        .save(dir.path().join("in1.png"))
        .unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let scene = da3_in(
        dir.path(),
        &[
            &base[..],
            &[
                "--input",
                "in0.png",
                "--input",
                "in1.png",
                "--out-dir",
                "out",
            ],
        ]
        .concat(),
    );
    assert_eq!(scene.code, Some(0), "{}", scene.context());
    assert!(scene.stdout.contains("nested model: any-view depth times"));
    assert_eq!(
        common::entries(&dir.path().join("out")),
        [
            "poses.json",
            "view0.pfm",
            "view0.png",
            "view0.sky.pfm",
            "view1.pfm",
            "view1.png",
            "view1.sky.pfm"
        ]
    );

    // The branches swapped, and known poses with a nested pair.
    let swapped = da3_in(
        dir.path(),
        &[
            "depth",
            "--model",
            metric,
            "--metric-model",
            "any.gguf",
            "--device",
            "cpu",
            "--pfm",
            "x.pfm",
        ],
    );
    common::assert_clean_failure(&swapped, &["--metric-model any.gguf", "any-view branch"]);
    assert!(!dir.path().join("x.pfm").exists());
    let posed = da3_in(
        dir.path(),
        &[&base[..], &["--poses", "p.json", "--out-dir", "out"]].concat(),
    );
    assert_eq!(posed.code, Some(2), "{}", posed.context());
    assert!(
        posed.stderr.contains("--metric-model"),
        "{}",
        posed.context()
    );
}
