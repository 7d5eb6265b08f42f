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
        .predict_views_at(&images, 112, RefViewStrategy::SaddleBalanced)
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
