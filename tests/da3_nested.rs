//! The nested model (any-view + metric branch) against the official `NestedDepthAnything3Net`
//! on synthetic weights: the fixture was made by `tests/reference/da3_nested_reference.py`,
//! pairing da3-tiny with a tiny metric model, and holds the metric branch also as a file
//! written by depth-anything.cpp's own nested converter (its `m_vit.` / `m_head.` layout).

mod common;

use common::{
    agreement, assert_close, cpu_options, fixture_dir, full_reference, scene_images,
    synthetic_tiny_file,
};
use da3::convert::{write_synthetic, WeightType};
use da3::{Config, Model, NestedModel, RefViewStrategy, Request};
use serde_json::Value;
use std::path::PathBuf;

const FIXTURE: &str = "da3-tiny-nested";

fn manifest() -> Value {
    let text = std::fs::read_to_string(fixture_dir(FIXTURE).join("manifest.json"))
        .expect("the nested fixture");
    serde_json::from_str(&text).unwrap()
}

/// The metric branch of the fixture: the official da3metric-large config at the size the
/// manifest records.
fn metric_tiny_config(m: &Value) -> Config {
    let vit = &m["metric_vit"];
    let cfg = &m["metric_config"];
    let mut c = Config::preset("da3metric-large").unwrap();
    c.name = "da3metric-tiny".into();
    c.vit.embed_dim = vit["embed_dim"].as_u64().unwrap() as usize;
    c.vit.depth = vit["depth"].as_u64().unwrap() as usize;
    c.vit.num_heads = vit["num_heads"].as_u64().unwrap() as usize;
    c.vit.mlp_hidden = c.vit.embed_dim * vit["mlp_ratio"].as_u64().unwrap() as usize;
    let four = |v: &Value| -> [usize; 4] {
        let v: Vec<usize> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as usize)
            .collect();
        [v[0], v[1], v[2], v[3]]
    };
    c.vit.out_layers = four(&cfg["net"]["out_layers"]);
    c.head.features = cfg["head"]["features"].as_u64().unwrap() as usize;
    c.head.out_channels = four(&cfg["head"]["out_channels"]);
    c
}

/// The fixture's pair, the metric branch from our own synthetic writer.
fn nested_model() -> (NestedModel, tempfile::TempDir, tempfile::TempDir) {
    let (anyview, dir) = synthetic_tiny_file();
    let metric_dir = tempfile::tempdir().unwrap();
    let metric = metric_dir.path().join("da3metric-tiny.gguf");
    write_synthetic(&metric, &metric_tiny_config(&manifest()), WeightType::F32).unwrap();
    let model = NestedModel::load(&anyview, &metric, &cpu_options()).unwrap();
    (model, dir, metric_dir)
}

fn peer_metric_file() -> PathBuf {
    let m = manifest();
    fixture_dir(FIXTURE).join(m["peer_metric_file"]["file"].as_str().unwrap())
}

/// Every scene (1, 2 and 3 views): the scale factor, the metric depth (sky filled), the
/// confidence (1 on sky) and the scaled cameras of the official nested forward.
#[test]
fn nested_scenes_match_the_official_nested_forward() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let (model, _a, _m) = nested_model();
    let mut session = model.session().unwrap();
    for scene in m["scenes"].as_array().unwrap() {
        let at = scene["name"].as_str().unwrap();
        let strategy: RefViewStrategy = scene["strategy"].as_str().unwrap().parse().unwrap();
        let views = scene_images(scene);
        let request = Request::new(&views)
            .process_res(process_res)
            .reference(strategy);
        let prediction = session.run(&request).unwrap();
        let official = scene["scale_factor"].as_f64().unwrap();
        let scale = prediction
            .metric_scale
            .expect("a nested prediction has a scale");
        eprintln!("{at}: scale {scale} official {official}");
        assert!(
            ((scale - official) / official).abs() < 1e-4,
            "{at}: scale {scale}, official {official}"
        );
        let arrays = &scene["arrays"];
        let gather = |f: &dyn Fn(&da3::Prediction) -> Vec<f32>| -> Vec<f32> {
            prediction.views.iter().flat_map(f).collect()
        };
        let reference = |key: &str| full_reference(FIXTURE, &arrays[key]);
        let depth = gather(&|p| p.depth.clone());
        assert_close(at, "depth", agreement(&depth, &reference("depth")), true);
        let conf = gather(&|p| p.confidence.clone().unwrap());
        assert_close(
            at,
            "confidence",
            agreement(&conf, &reference("depth_conf")),
            true,
        );
        let sky = gather(&|p| p.sky.clone().unwrap());
        assert_close(at, "sky", agreement(&sky, &reference("metric_sky")), false);
        // Sky pixels: depth the far value, confidence exactly 1, as the official fill.
        let sky_pixels = sky.iter().filter(|&&s| s >= 0.3).count();
        assert!(
            sky_pixels > 0 && sky_pixels < sky.len(),
            "{at}: a mixed scene"
        );
        for (c, s) in conf.iter().zip(&sky) {
            if *s >= 0.3 {
                assert_eq!(*c, 1.0, "{at}: sky confidence");
            }
        }
        let pose = |f: &dyn Fn(&da3::Pose) -> Vec<f32>| gather(&|p| f(p.pose.as_ref().unwrap()));
        let intr = pose(&|p| p.intrinsics.iter().flatten().copied().collect());
        let extr = pose(&|p| p.extrinsics.iter().flatten().copied().collect());
        assert_close(
            at,
            "intrinsics",
            agreement(&intr, &reference("intrinsics")),
            false,
        );
        assert_close(
            at,
            "extrinsics",
            agreement(&extr, &reference("extrinsics")),
            false,
        );
    }
}

/// depth-anything.cpp writes the nested model's metric branch under `m_vit.` / `m_head.`:
/// that file loads as the metric model it is and computes what the standard-layout file of
/// the same weights computes, bit for bit, which is the official metric head's output.
#[test]
fn depth_anything_cpp_nested_metric_file_is_the_metric_branch() {
    let m = manifest();
    let process_res = m["process_res"].as_u64().unwrap() as usize;
    let peer = Model::load(peer_metric_file(), &cpu_options()).unwrap();
    let expected = metric_tiny_config(&m);
    let c = peer.config();
    assert_eq!(c.head.kind, da3::da3::HeadKind::Dpt);
    assert!(c.head.sky && c.cam_dim.is_none());
    assert_eq!(c.vit, expected.vit, "hyperparameters from the m_vit.* keys");
    assert_eq!(
        (c.head.features, c.head.out_channels),
        (expected.head.features, expected.head.out_channels),
        "hyperparameters from the m_head.* keys"
    );
    assert!(
        peer.unused_tensors().is_empty(),
        "every tensor used: {:?}",
        peer.unused_tensors()
    );
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("metric.gguf");
    write_synthetic(&ours, &expected, WeightType::F32).unwrap();
    let ours = Model::load(&ours, &cpu_options()).unwrap();
    let scene = &m["scenes"][1];
    let views = scene_images(scene);
    let raw = Request::new(&views)
        .process_res(process_res)
        .reference(RefViewStrategy::First)
        .raw_outputs(true);
    let a = peer.session().unwrap().run(&raw).unwrap();
    let b = ours.session().unwrap().run(&raw).unwrap();
    for (x, y) in a.views.iter().zip(&b.views) {
        assert_eq!(x.depth, y.depth);
        assert_eq!(x.sky, y.sky);
    }
    let arrays = &scene["arrays"];
    let depth: Vec<f32> = a.views.iter().flat_map(|v| v.depth.clone()).collect();
    let sky: Vec<f32> = a
        .views
        .iter()
        .flat_map(|v| v.sky.clone().unwrap())
        .collect();
    assert_close(
        "2v",
        "metric depth",
        agreement(
            &depth,
            &full_reference(FIXTURE, &arrays["metric_depth_raw"]),
        ),
        true,
    );
    assert_close(
        "2v",
        "metric sky",
        agreement(&sky, &full_reference(FIXTURE, &arrays["metric_sky"])),
        false,
    );
}

/// The pair as depth-anything.cpp ships it (any-view file + its `-metric` file) is a nested
/// model; branches swapped, or a branch of the wrong kind, are refused naming the branch.
#[test]
fn a_nested_pair_checks_its_branches() {
    let (anyview, _dir) = synthetic_tiny_file();
    let nested = NestedModel::load(&anyview, peer_metric_file(), &cpu_options()).unwrap();
    let image =
        da3::image::DynamicImage::ImageRgb8(da3::image::RgbImage::from_fn(96, 64, |x, y| {
            da3::image::Rgb([(x * 2) as u8, (y * 3) as u8, 90])
        }));
    let prediction = nested.predict(&image).unwrap();
    assert!(prediction.sky.is_some() && prediction.pose.is_some());

    let any = nested.anyview().clone();
    let metric = nested.metric().clone();
    let err = NestedModel::new(metric.clone(), any.clone()).unwrap_err();
    assert!(err.to_string().contains("any-view branch"), "{err}");
    let err = NestedModel::new(any.clone(), any).unwrap_err();
    assert!(err.to_string().contains("metric branch"), "{err}");
}
