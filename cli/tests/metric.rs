//! `da3 depth` with the metric model: depth in metres at the focal length --focal, --fov or
//! the default gives, the unit named in the printed line, the 16-bit PNG and poses.json, and
//! the point cloud placed with the same focal.

mod common;

use common::{assert_clean_failure, da3_in};
use da3::convert::{write_synthetic, WeightType};
use da3::{synthetic, Config};

/// A synthetic model of the metric (or mono) architecture that computes quickly.
fn write_tiny(preset: &str, name: &str, path: &std::path::Path) {
    let mut c = Config::preset(preset).unwrap();
    c.name = name.into();
    c.vit.embed_dim = 64;
    c.vit.depth = 4;
    c.vit.num_heads = 1;
    c.vit.mlp_hidden = 256;
    c.vit.out_layers = [0, 1, 2, 3];
    c.head.features = 16;
    c.head.out_channels = [8, 16, 32, 64];
    write_synthetic(path, &c, WeightType::F32).unwrap();
}

/// The `tEXt` chunk `key` of a PNG file.
fn png_text(bytes: &[u8], key: &str) -> Option<String> {
    let mut at = 8;
    while at + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let kind = &bytes[at + 4..at + 8];
        let data = &bytes[at + 8..at + 8 + len];
        if kind == b"tEXt" {
            let (k, v) = data.split_at(data.iter().position(|&b| b == 0)?);
            if k == key.as_bytes() {
                return Some(String::from_utf8_lossy(&v[1..]).into_owned());
            }
        }
        at += 12 + len;
    }
    None
}

#[test]
fn the_metric_model_writes_metres_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny(
        "da3metric-large",
        "da3metric-tiny",
        &dir.path().join("m.gguf"),
    );
    // 160 x 120 is processed at 112 x 84 (x 0.7): --focal 200 is 140 px there.
    let im = synthetic::image(160, 120);
    image::RgbImage::from_raw(160, 120, im.data.clone())
        .unwrap()
        .save(dir.path().join("in.png"))
        .unwrap();
    let base = [
        "depth",
        "--model",
        "m.gguf",
        "--input",
        "in.png",
        "--process-res",
        "112",
        "--device",
        "cpu",
        "--threads",
        "2",
    ];
    let run = da3_in(
        dir.path(),
        &[
            &base[..],
            &[
                "--focal", "200", "--pfm", "d.pfm", "--png16", "d.png", "--ply", "d.ply", "--pose",
                "p.json",
            ],
        ]
        .concat(),
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(run.stdout.contains("(metres)"), "{}", run.context());
    assert!(
        run.stdout.contains("focal 140.00 px") && run.stdout.contains("given focal length"),
        "{}",
        run.context()
    );
    let png = std::fs::read(dir.path().join("d.png")).unwrap();
    assert_eq!(png_text(&png, "unit").as_deref(), Some("metres"));
    let pose: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("p.json")).unwrap()).unwrap();
    assert_eq!(pose["depth_unit"], "metres");
    let fx = pose["intrinsics"][0][0].as_f64().unwrap();
    assert!((fx - 140.0).abs() < 1e-3, "{pose}");

    // The library's numbers: the same depth, the output x 140 / 300.
    let options = da3::LoadOptions {
        device: da3::Device::Cpu,
        threads: 2,
        process_res: Some(112),
        ..Default::default()
    };
    let model = da3::Model::load(dir.path().join("m.gguf"), &options).unwrap();
    let expected = model
        .session()
        .unwrap()
        .run(&da3::Request::image(&im).focal(da3::Focal::Pixels(200.0)))
        .unwrap();
    let (lo, hi) = expected.views[0].depth_range();
    assert!(
        run.stdout
            .contains(&format!("depth {lo:.4} .. {hi:.4} (metres)")),
        "{lo} {hi}\n{}",
        run.context()
    );

    // A scene with --fov: poses.json names the unit and the focal's source; no --fov needed
    // for the point cloud, whose camera is the metres' own.
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let scene = da3_in(
        dir.path(),
        &[
            &base[..],
            &[
                "--input",
                "in.png",
                "--fov",
                "90",
                "--out-dir",
                "out",
                "--view-maps",
                "png16",
            ],
        ]
        .concat(),
    );
    assert_eq!(scene.code, Some(0), "{}", scene.context());
    let poses: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("out/poses.json")).unwrap()).unwrap();
    assert_eq!(poses["depth_unit"], "metres");
    assert_eq!(poses["views"][0]["focal_source"], "given field of view");
    let fx = poses["views"][1]["intrinsics"][0][0].as_f64().unwrap();
    assert!((fx - 56.0).abs() < 1e-3, "{poses}");
    let png = std::fs::read(dir.path().join("out/view0.depth16.png")).unwrap();
    assert_eq!(png_text(&png, "unit").as_deref(), Some("metres"));

    // Nothing given: the default field of view, with a warning that says how to give it.
    let default = da3_in(dir.path(), &[&base[..], &["--pfm", "e.pfm"]].concat());
    assert_eq!(default.code, Some(0), "{}", default.context());
    assert!(
        default.stderr.contains("--focal PX"),
        "{}",
        default.context()
    );
    assert!(
        default.stdout.contains("assumed 60 degree"),
        "{}",
        default.context()
    );
}

#[test]
fn focal_is_refused_for_a_relative_model_and_the_unit_named() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny(
        "da3mono-large",
        "da3mono-tiny",
        &dir.path().join("mono.gguf"),
    );
    let base = [
        "depth",
        "--model",
        "mono.gguf",
        "--process-res",
        "112",
        "--device",
        "cpu",
        "--png16",
        "d.png",
    ];
    let refused = da3_in(dir.path(), &[&base[..], &["--focal", "200"]].concat());
    assert_clean_failure(&refused, &["--focal", "not the metric model"]);
    let bad = da3_in(dir.path(), &[&base[..], &["--focal", "0"]].concat());
    assert_clean_failure(&bad, &["--focal 0"]);
    let relative = da3_in(dir.path(), &base);
    assert_eq!(relative.code, Some(0), "{}", relative.context());
    assert!(
        relative.stdout.contains("(relative)"),
        "{}",
        relative.context()
    );
    let png = std::fs::read(dir.path().join("d.png")).unwrap();
    assert_eq!(png_text(&png, "unit").as_deref(), Some("relative"));
}
