//! The library's front door as another Rust program meets it: a model file written by
//! depth-anything.cpp's own converter, the five-line path, thread sharing, and the types'
//! thread-safety contract.

mod common;

use common::correlation;
use da3::{Colormap, Device, LoadOptions, Model, Prediction, Session};
use std::path::{Path, PathBuf};

fn peer(name: &str) -> PathBuf {
    common::fixture_dir("peer").join(name)
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn cpu_options() -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..LoadOptions::default()
    }
}

fn peer_model() -> Model {
    Model::load(peer("peer-tiny-seed0-f32.gguf"), &cpu_options()).unwrap()
}

fn peer_image() -> da3::image::DynamicImage {
    da3::image::open(peer("test-640x480.png")).unwrap()
}

/// depth-anything.cpp's converter wrote the file (with its quirks: a wrong `cam.dim_in`, no
/// `general.file_type`); the official code computed the reference depth, confidence and pose
/// for the same weights and image.
#[test]
fn peer_written_file_predicts_the_official_outputs() {
    let model = peer_model();
    assert!(
        model.unused_tensors().is_empty(),
        "{:?}",
        model.unused_tensors()
    );
    let prediction = model.predict(&peer_image()).unwrap();
    assert_eq!((prediction.width, prediction.height), (504, 378));
    for (ours, file) in [
        (&prediction.depth, "peer-tiny-seed0.depth.f32"),
        (
            prediction.confidence.as_ref().unwrap(),
            "peer-tiny-seed0.conf.f32",
        ),
    ] {
        let theirs = read_f32(&peer(file));
        assert_eq!(ours.len(), theirs.len());
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let max_rel = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs() / scale)
            .fold(0f32, f32::max);
        let corr = correlation(ours, &theirs);
        assert!(
            max_rel <= 1e-3 && corr >= 0.99999,
            "{file}: max rel {max_rel}, corr {corr}"
        );
    }
    let official: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(peer("peer-tiny-seed0.pose.json")).unwrap())
            .unwrap();
    let pose = prediction.pose.unwrap();
    for (r, row) in pose.extrinsics.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            let theirs = official["extrinsics_world_to_camera_3x4"][r][c]
                .as_f64()
                .unwrap();
            assert!(
                (v as f64 - theirs).abs() <= 1e-3,
                "extrinsics[{r}][{c}] {v} vs {theirs}"
            );
        }
    }
    for (r, row) in pose.intrinsics.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            let theirs = official["intrinsics_3x3"][r][c].as_f64().unwrap();
            assert!(
                (v as f64 - theirs).abs() <= 1e-3 * theirs.abs().max(1.0),
                "K[{r}][{c}]"
            );
        }
    }
}

/// The README's five lines, on the peer file: a PNG of the depth, decodable, of the processed
/// size.
#[test]
fn five_line_program_writes_a_png() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("depth.png");
    let model = Model::load(peer("peer-tiny-seed0-f32.gguf"), &cpu_options()).unwrap();
    let image = da3::image::open(peer("test-640x480.png")).unwrap();
    let prediction = model.predict(&image).unwrap();
    prediction.save_png(&out, Colormap::Turbo).unwrap();
    let png = da3::image::open(&out).unwrap();
    assert_eq!((png.width(), png.height()), (504, 378));
}

fn assert_send_sync<T: Send + Sync>() {}

#[test]
fn shareable_types_are_send_and_sync() {
    assert_send_sync::<Model>();
    assert_send_sync::<Prediction>();
    assert_send_sync::<Device>();
    assert_send_sync::<LoadOptions>();
    assert_send_sync::<da3::Config>();
    assert_send_sync::<da3::Pose>();
    assert_send_sync::<da3::Error>();
    assert_send_sync::<da3::ggml::Device>();
    assert_send_sync::<da3::ggml::SharedContext>();
    assert_send_sync::<da3::ggml::Error>();
}

// A session, like the ggml objects it holds, is single-threaded by type.
static_assertions::assert_not_impl_any!(Session: Send, Sync);
static_assertions::assert_not_impl_any!(da3::ggml::Context: Send, Sync);
static_assertions::assert_not_impl_any!(da3::ggml::Tensor: Send, Sync);
static_assertions::assert_not_impl_any!(da3::ggml::Backend: Send, Sync);

/// Four threads share one model (one set of weights), each with its own session, at two
/// resolutions; every result equals the sequential one bit for bit.
#[test]
fn four_threads_share_one_model_with_sequential_results() {
    let model = peer_model();
    let images: Vec<da3::image::DynamicImage> = vec![
        peer_image(),
        peer_image().crop_imm(0, 0, 400, 300),
        peer_image().fliph(),
    ];
    let sequential: Vec<Vec<u32>> = {
        let mut session = model.session().unwrap();
        images
            .iter()
            .map(|im| bits(&session.predict(im).unwrap()))
            .collect()
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let model = model.clone();
                let images = &images;
                scope.spawn(move || {
                    let mut session = model.session().unwrap();
                    // Each thread visits the images in its own order.
                    (0..6)
                        .map(|k| {
                            let i = (t + k) % images.len();
                            (i, bits(&session.predict(&images[i]).unwrap()))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (i, result) in handle.join().unwrap() {
                assert!(
                    result == sequential[i],
                    "image {i} differs from the sequential run"
                );
            }
        }
    });
}

fn bits(p: &Prediction) -> Vec<u32> {
    p.depth
        .iter()
        .chain(p.confidence.iter().flatten())
        .map(|v| v.to_bits())
        .collect()
}

/// A model moves into a thread and outlives the thread that loaded it.
#[test]
fn model_moves_into_a_thread() {
    let model = peer_model();
    let image = peer_image();
    let here = model.predict(&image).unwrap();
    let there = std::thread::spawn(move || model.predict(&image).unwrap())
        .join()
        .unwrap();
    assert_eq!(bits(&here), bits(&there));
}

#[test]
fn device_parses_the_cli_spellings() {
    for (text, device) in [
        ("auto", Device::Auto),
        ("cpu", Device::Cpu),
        ("CPU", Device::Cpu),
        ("CUDA0", Device::Named("CUDA0".into())),
        ("MTL0", Device::Named("MTL0".into())),
        ("rpc:127.0.0.1:50052", Device::Rpc("127.0.0.1:50052".into())),
        ("rpc:[::1]:50052", Device::Rpc("[::1]:50052".into())),
    ] {
        assert_eq!(text.parse::<Device>().unwrap(), device, "{text}");
        assert_eq!(
            device.to_string().parse::<Device>().unwrap(),
            device,
            "{text} round trip"
        );
    }
    for bad in [
        "rpc:localhost",
        "rpc::50052",
        "rpc:host:0",
        "rpc:host:99999",
        "",
        "cu da",
    ] {
        let err = bad.parse::<Device>().unwrap_err().to_string();
        assert!(!err.is_empty(), "{bad}");
    }
    assert!("rpc:localhost"
        .parse::<Device>()
        .unwrap_err()
        .to_string()
        .contains("the port is missing"));
    // A name that parses but names no device: a clear error when resolved.
    let err = Device::Named("CUDA7".into())
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("CUDA7") && err.contains("CPU"), "{err}");
}

/// The peer fixture rewritten by `edit`, which may drop a tensor (None) or change its shape
/// and bytes; returns the new file's path.
fn peer_rewritten(
    dir: &Path,
    edit: impl Fn(&str, Vec<u64>, Vec<u8>) -> Option<(Vec<u64>, Vec<u8>)>,
) -> PathBuf {
    use da3::gguf::{GgufFile, GgufWriter};
    let file = GgufFile::open(peer("peer-tiny-seed0-f32.gguf")).unwrap();
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata() {
        writer.set(key, value.clone());
    }
    for t in file.tensors() {
        let data = file.tensor_data(t).unwrap().to_vec();
        if let Some((shape, data)) = edit(&t.name, t.shape().to_vec(), data) {
            writer
                .add_tensor(t.name.clone(), t.dtype, &shape, data)
                .unwrap();
        }
    }
    let path = dir.join("edited.gguf");
    writer.write_to(&path).unwrap();
    path
}

/// A file that lacks a tensor, has one of the wrong shape or one holding NaN fails to load
/// with an error a program can match on (`Error::Weights` and the tensor's name as data),
/// whose message names the tensor.
#[test]
fn weight_errors_are_data_naming_the_tensor() {
    use da3::{Error, WeightError};
    let dir = tempfile::tempdir().unwrap();
    let norm = "vit.norm.weight";
    let missing = peer_rewritten(dir.path(), |name, shape, data| {
        (name != norm).then_some((shape, data))
    });
    match Model::load(&missing, &cpu_options()) {
        Err(Error::Weights(WeightError::MissingTensor { name })) => assert_eq!(name, norm),
        other => panic!("{other:?}"),
    }
    let misshapen = peer_rewritten(dir.path(), |name, shape, data| {
        if name != norm {
            return Some((shape, data));
        }
        Some((vec![shape[0] / 2], data[..data.len() / 2].to_vec()))
    });
    match Model::load(&misshapen, &cpu_options()) {
        Err(e @ Error::Weights(WeightError::TensorShape { .. })) => {
            let Error::Weights(WeightError::TensorShape {
                name,
                expected,
                got,
            }) = &e
            else {
                unreachable!()
            };
            assert_eq!((name.as_str(), expected.len(), got.len()), (norm, 1, 1));
            assert_eq!(expected[0], 2 * got[0]);
            assert!(e.to_string().contains(&format!("`{norm}`")), "{e}");
        }
        other => panic!("{other:?}"),
    }
    let corrupt = peer_rewritten(dir.path(), |name, shape, mut data| {
        if name == norm {
            data[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        }
        Some((shape, data))
    });
    match Model::load(&corrupt, &cpu_options()) {
        Err(Error::Weights(WeightError::NonFinite { name, element })) => {
            assert_eq!((name.as_str(), element), (norm, 1));
        }
        other => panic!("{other:?}"),
    }
}

/// A model counts its open sessions, which each take `LoadOptions::threads` of their own (the
/// count is what the warning about oversubscribed cores reads).
#[test]
fn a_model_counts_its_open_sessions() {
    let model = Model::load(peer("peer-tiny-seed0-f32.gguf"), &cpu_options()).unwrap();
    assert_eq!(model.open_sessions(), 0);
    let first = model.session().unwrap();
    let second = model.clone().session().unwrap();
    assert_eq!(model.open_sessions(), 2);
    drop(first);
    assert_eq!(model.open_sessions(), 1);
    // A one-call prediction opens and closes a session of its own.
    model.predict(&peer_image()).unwrap();
    assert_eq!(model.open_sessions(), 1);
    drop(second);
    assert_eq!(model.open_sessions(), 0);
}

/// `Session::profile_scene` times every node of a scene's graph, one at a time, after a whole
/// compute (what `examples/profile_model` prints by op class on any device).
#[test]
fn a_scene_is_profiled_node_by_node() {
    let mut session = peer_model().session().unwrap();
    let (width, height, views) = (56, 42, 3);
    let nodes = session.scene_graph(width, height, views).unwrap().n_nodes();
    let times = session.profile_scene(width, height, views, 1).unwrap();
    assert_eq!(times.len(), nodes);
    assert!(times.iter().all(|t| t.seconds >= 0.0 && !t.op.is_empty()));
    // A scene of several views has a graph of its own (its local and global blocks).
    let one_view = session.scene_graph(width, height, 1).unwrap().n_nodes();
    assert!(
        nodes > one_view,
        "{nodes} nodes for 3 views, {one_view} for 1"
    );
    assert!(session.scene_graph(width, height, 0).is_err());
}
