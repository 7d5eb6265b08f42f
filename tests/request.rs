//! The request API as a program meets it: one checked image loader whose errors name the file,
//! the official `process_res_method`s, what a request refuses, and what an output carries for
//! its exports.

mod common;

use da3::preprocess::{plan_resize_by, ResizeMethod};
use da3::{Device, LoadOptions, Model, Output, Prediction, Predictor, Request};
use serde_json::Value;
use std::path::PathBuf;

fn peer(name: &str) -> PathBuf {
    common::fixture_dir("peer").join(name)
}

fn peer_model() -> Model {
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..LoadOptions::default()
    };
    Model::load(peer("peer-tiny-seed0-f32.gguf"), &options).unwrap()
}

/// What a `main` returning `Result<(), da3::Error>` prints names the file and the cause.
#[test]
fn image_errors_name_the_file_and_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jpg");
    let err = da3::Error::from(da3::load_image(&missing).unwrap_err());
    let shown = format!("{err:?}");
    assert!(shown.contains("missing.jpg"), "{shown}");
    assert!(shown.contains("No such file"), "{shown}");

    // A JPEG cut short: refused, naming the file (the `image` crate alone may fill it in).
    let photo = dir.path().join("photo.jpg");
    let image = da3::image::RgbImage::from_fn(64, 48, |x, y| {
        da3::image::Rgb([(x * 4) as u8, (y * 5) as u8, 128])
    });
    image.save(&photo).unwrap();
    let bytes = std::fs::read(&photo).unwrap();
    let truncated = dir.path().join("truncated.jpg");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let err = da3::Error::from(da3::load_image(&truncated).unwrap_err());
    let shown = format!("{err:?}");
    assert!(shown.contains("truncated.jpg"), "{shown}");
    assert_eq!(da3::load_image(&photo).unwrap().width, 64);
}

/// WebP, TIFF, BMP and GIF load as PNG does; a JPEG's EXIF orientation is applied (a phone's
/// portrait photo stored sideways comes out upright).
#[test]
fn more_formats_and_the_exif_orientation() {
    use da3::image::{ImageFormat, Rgb, RgbImage};
    let dir = tempfile::tempdir().unwrap();
    let image = RgbImage::from_fn(40, 30, |x, y| Rgb([(x * 6) as u8, (y * 8) as u8, 77]));
    let png = dir.path().join("a.png");
    image.save_with_format(&png, ImageFormat::Png).unwrap();
    let reference = da3::load_image(&png).unwrap();
    for (name, format) in [
        ("a.webp", ImageFormat::WebP),
        ("a.tiff", ImageFormat::Tiff),
        ("a.bmp", ImageFormat::Bmp),
        ("a.gif", ImageFormat::Gif),
    ] {
        let path = dir.path().join(name);
        image.save_with_format(&path, format).unwrap();
        let loaded = da3::load_image(&path).unwrap();
        assert_eq!((loaded.width, loaded.height), (40, 30), "{name}");
        if format != ImageFormat::Gif {
            // GIF quantises to a palette; the others are lossless here.
            assert_eq!(loaded, reference, "{name}");
        }
    }

    // A JPEG with an EXIF APP1 segment saying "rotate 90 degrees clockwise to view" (6).
    let mut jpeg = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut jpeg), ImageFormat::Jpeg)
        .unwrap();
    let tiff: &[u8] = &[
        b'I', b'I', 42, 0, 8, 0, 0, 0, // little-endian TIFF header, IFD at 8
        1, 0, // one entry
        0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0, // Orientation (SHORT, 1) = 6
        0, 0, 0, 0, // no next IFD
    ];
    let mut app1 = b"Exif\0\0".to_vec();
    app1.extend_from_slice(tiff);
    let mut rotated = jpeg[..2].to_vec();
    rotated.extend_from_slice(&[0xFF, 0xE1]);
    rotated.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
    rotated.extend_from_slice(&app1);
    rotated.extend_from_slice(&jpeg[2..]);
    let upright = da3::decode_image(&rotated).unwrap();
    assert_eq!((upright.width, upright.height), (30, 40));
    let sideways = da3::decode_image(&jpeg).unwrap();
    // Rotated clockwise: the upright image's top-right pixel is the stored top-left one.
    let px = |im: &da3::Image, x: usize, y: usize| {
        let i = (y * im.width + x) * 3;
        [im.data[i], im.data[i + 1], im.data[i + 2]]
    };
    assert_eq!(px(&upright, 29, 0), px(&sideways, 0, 0));
}

/// Every official `process_res_method` reaches the official processed size (computed by the
/// official `InputProcessor` code, `tests/reference/official_resize_sizes.py`); where the
/// official code would make a side of no patch (or one this library refuses as too large),
/// planning fails with an error instead.
#[test]
fn resize_methods_reach_the_official_sizes() {
    let path = common::fixture_dir("preprocess").join("official_resize_sizes.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 96);
    let (mut matched, mut refused) = (0, 0);
    for case in cases {
        let n = |v: &Value| v.as_u64().unwrap() as usize;
        let (w, h, res) = (
            n(&case["width"]),
            n(&case["height"]),
            n(&case["process_res"]),
        );
        let method: ResizeMethod = case["method"].as_str().unwrap().parse().unwrap();
        let official = (n(&case["processed"][0]), n(&case["processed"][1]));
        let at = format!("{w}x{h} at {res} by {method}");
        let degenerate = official.0 < 14 || official.1 < 14 || official.0.max(official.1) > 8192;
        match plan_resize_by(w, h, res, method) {
            Ok(plan) => {
                assert!(!degenerate, "{at}: planned {plan:?}, official {official:?}");
                assert_eq!((plan.width, plan.height), official, "{at}");
                let bounded = (n(&case["bounded"][0]), n(&case["bounded"][1]));
                assert_eq!(plan.bounded_size(w, h), bounded, "{at}: bound resize");
                matched += 1;
            }
            Err(e) => {
                assert!(degenerate, "{at}: {e}, official {official:?}");
                refused += 1;
            }
        }
    }
    assert!(
        matched > 80 && refused > 0,
        "{matched} matched, {refused} refused"
    );
    assert_eq!(
        "lower_bound_crop".parse::<ResizeMethod>().unwrap(),
        ResizeMethod::LowerBoundCrop
    );
    let err = "nearest".parse::<ResizeMethod>().unwrap_err();
    assert!(err.contains("upper_bound_resize"), "{err}");
}

/// A request that cannot be computed says why before anything is computed.
#[test]
fn bad_requests_are_refused_with_the_reason() {
    let mut session = peer_model().session().unwrap();
    let image = da3::synthetic::image(640, 427);
    let tall = da3::synthetic::image(427, 640);
    let mut reason = |request: &Request<'_>| session.run(request).unwrap_err().to_string();
    let none: [da3::Image; 0] = [];
    assert!(reason(&Request::new(&none)).contains("at least one image"));
    let two = [image.clone(), image.clone()];
    assert!(reason(&Request::new(&two).names(["a.png"])).contains("1 name(s) for 2"));
    assert!(
        reason(&Request::new(&two).reference(da3::RefViewStrategy::View(2)))
            .contains("reference view 2")
    );
    let mixed = [image.clone(), tall];
    let err = reason(&Request::new(&mixed));
    assert!(err.contains("one processed size"), "{err}");
    let err = reason(&Request::image(&image).process_res(4000));
    assert!(err.contains("4000"), "{err}");
    // The peer file has no ray branch and no camera encoder.
    assert!(reason(&Request::image(&image).rays(true)).contains("no ray branch"));
    let pose = da3::KnownPose::new(
        &[
            vec![1.0, 0.0, 0.0, 0.0],
            vec![0.0, 1.0, 0.0, 0.0],
            vec![0.0, 0.0, 1.0, 0.0],
        ],
        &[
            vec![500.0, 0.0, 320.0],
            vec![0.0, 500.0, 213.0],
            vec![0.0, 0.0, 1.0],
        ],
    )
    .unwrap();
    let err = reason(&Request::image(&image).poses(std::slice::from_ref(&pose)));
    assert!(err.contains("no camera encoder"), "{err}");
    let err = reason(&Request::new(&two).poses(std::slice::from_ref(&pose)));
    assert!(err.contains("1 camera pose(s) for 2"), "{err}");
}

/// A prediction carries what its exports need: the processed image (the crop of a crop
/// method), the input's size and name; `resize_to_input` brings the maps and the camera to
/// the input's size.
#[test]
fn an_output_carries_what_its_exports_need() {
    let mut session = peer_model().session().unwrap();
    let image = da3::load_image(peer("test-640x480.png")).unwrap();
    let request = Request::image(&image)
        .process_res(280)
        .resize(ResizeMethod::UpperBoundCrop)
        .names(["test-640x480.png"]);
    let output: Output = session.run(&request).unwrap();
    let view = &output.views[0];
    // 640x480 to 280x210, cropped to 280x210 -> 280x210 floored: 280x210 (15 patches high).
    let plan = plan_resize_by(640, 480, 280, ResizeMethod::UpperBoundCrop).unwrap();
    assert_eq!((view.width, view.height), (plan.width, plan.height));
    assert_eq!(
        (view.image.width, view.image.height),
        (view.width, view.height)
    );
    let processed =
        da3::preprocess::preprocess_by(&image, 280, ResizeMethod::UpperBoundCrop).unwrap();
    assert_eq!(view.image, processed.rgb8);
    assert_eq!(view.input_size, (640, 480));
    assert_eq!(view.name, "test-640x480.png");

    let resized = view.resize_to_input().unwrap();
    assert_eq!((resized.width, resized.height), (640, 480));
    let expected =
        da3::outputs::resize_bilinear(&view.depth, view.width, view.height, 640, 480).unwrap();
    assert_eq!(resized.depth, expected);
    let (k, k_in) = (
        view.pose.unwrap().intrinsics,
        resized.pose.unwrap().intrinsics,
    );
    let sx = 640.0 / view.width as f32;
    assert!((k_in[0][0] - k[0][0] * sx).abs() <= 1e-3 * k_in[0][0].abs());
    assert_eq!((resized.image.width, resized.image.height), (640, 480));

    // The exports write from the output alone.
    let dir = tempfile::tempdir().unwrap();
    let options = da3::export::ExportOptions::default();
    output
        .save_ply(dir.path().join("scene.ply"), &options)
        .unwrap();
    view.save_glb(dir.path().join("view.glb"), &options)
        .unwrap();
    output
        .save_colmap(dir.path().join("sparse"), &options)
        .unwrap();
    let images = std::fs::read_to_string(dir.path().join("sparse/images.txt")).unwrap();
    assert!(images.contains("test-640x480.png"), "{images}");
    view.save_png16(dir.path().join("depth16.png")).unwrap();
    output.save_npz(dir.path().join("scene.npz")).unwrap();
}

/// Code written against [`Predictor`] runs a session or a stand-in alike.
#[test]
fn a_predictor_can_be_a_stand_in() {
    struct Flat;
    impl Predictor for Flat {
        fn run(&mut self, request: &Request<'_>) -> Result<Output, da3::Error> {
            let views = request
                .images()
                .iter()
                .map(|im| Prediction {
                    width: im.width,
                    height: im.height,
                    depth: vec![1.0; im.width * im.height],
                    input_size: (im.width, im.height),
                    ..Prediction::default()
                })
                .collect();
            Ok(Output {
                views,
                reference: 0,
                strategy: da3::RefViewStrategy::First,
                pose_scale: None,
                metric_scale: None,
                timings: Default::default(),
                gaussians: None,
            })
        }
        fn device_name(&self) -> String {
            "stand-in".into()
        }
    }
    fn mean_depth(p: &mut dyn Predictor, image: &da3::Image) -> f32 {
        let d = p.predict_image(image).unwrap().depth;
        d.iter().sum::<f32>() / d.len() as f32
    }
    let image = da3::synthetic::image(64, 48);
    assert_eq!(mean_depth(&mut Flat, &image), 1.0);
    let mut session = peer_model().session().unwrap();
    assert!(mean_depth(&mut session, &image) > 0.0);
    assert_eq!(session.device_name(), "CPU");
}
