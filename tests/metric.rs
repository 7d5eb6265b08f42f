//! Metric depth in metres from the metric model: `focal / 300` times the output (the official
//! rule) at the focal length the request, the image's EXIF or the default gives; the mono
//! model, of the same architecture, unchanged.

use da3::convert::{write_synthetic, WeightType};
use da3::{synthetic, Config, DepthUnit, Focal, FocalSource, LoadOptions, Model, Request};

/// A synthetic model of the metric (or mono) architecture at a size that computes quickly.
fn tiny(name: &str, dir: &std::path::Path) -> Model {
    let preset = if name.contains("metric") {
        "da3metric-large"
    } else {
        "da3mono-large"
    };
    let mut c = Config::preset(preset).unwrap();
    c.name = name.into();
    c.vit.embed_dim = 64;
    c.vit.depth = 4;
    c.vit.num_heads = 1;
    c.vit.mlp_hidden = 256;
    c.vit.out_layers = [0, 1, 2, 3];
    c.head.features = 16;
    c.head.out_channels = [8, 16, 32, 64];
    let path = dir.join(format!("{name}.gguf"));
    write_synthetic(&path, &c, WeightType::F32).unwrap();
    let options = LoadOptions {
        device: da3::Device::Cpu,
        threads: 2,
        process_res: Some(112),
        ..Default::default()
    };
    Model::load(&path, &options).unwrap()
}

#[test]
fn metric_depth_is_the_output_times_the_focal_over_300() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny("da3metric-tiny", dir.path());
    assert!(model.config().is_metric());
    let mut session = model.session().unwrap();
    // 160 x 120 is processed at 112 x 84: every length x 0.7.
    let image = synthetic::image(160, 120);
    let raw = session
        .run(&Request::image(&image).raw_outputs(true))
        .unwrap()
        .into_single()
        .unwrap();
    assert_eq!(
        raw.depth_unit,
        DepthUnit::Relative,
        "raw outputs are not scaled"
    );
    // The official post-processing before the scale: sky filled.
    let mut filled = raw.depth.clone();
    da3::outputs::fill_sky(&mut filled, raw.sky.as_ref().unwrap());

    let cases = [
        (Some(Focal::Pixels(200.0)), FocalSource::Pixels, 140.0),
        (Some(Focal::Fov(90.0)), FocalSource::Fov, 56.0),
        (
            Some(Focal::Intrinsics(vec![[
                [220.0, 0.0, 80.0],
                [0.0, 180.0, 60.0],
                [0.0, 0.0, 1.0],
            ]])),
            FocalSource::Intrinsics,
            140.0,
        ),
        // Nothing given: 60 degrees across the processed width.
        (None, FocalSource::Default, 56.0 / 30f32.to_radians().tan()),
    ];
    for (focal, source, pixels) in cases {
        let request = Request::image(&image);
        let request = match focal.clone() {
            Some(f) => request.focal(f),
            None => request,
        };
        let view = session.run(&request).unwrap().into_single().unwrap();
        let used = view.metric_focal.unwrap();
        assert_eq!(used.source, source, "{focal:?}");
        assert!(
            (used.pixels - pixels).abs() < 1e-3,
            "{focal:?}: {}",
            used.pixels
        );
        assert_eq!(view.depth_unit, DepthUnit::Metres);
        let factor = used.pixels / 300.0;
        let expected: Vec<f32> = filled.iter().map(|d| d * factor).collect();
        assert_eq!(view.depth, expected, "{focal:?}");
        // The exports' camera is the one the metres took.
        let camera = view.camera().unwrap();
        assert_eq!(camera.intrinsics[0][0], used.pixels);
    }

    // The EXIF 35 mm focal length: 36 mm is the long side, 160 px of the input, 112 processed.
    let photo = da3::Image {
        focal_length_35mm: Some(36),
        ..image.clone()
    };
    let view = session.predict(&photo).unwrap();
    let used = view.metric_focal.unwrap();
    assert_eq!(used.source, FocalSource::Exif35mm(36));
    assert!((used.pixels - 112.0).abs() < 1e-3, "{}", used.pixels);
    // A given focal goes before the EXIF one.
    let given = session
        .run(&Request::image(&photo).focal(Focal::Pixels(200.0)))
        .unwrap();
    assert_eq!(
        given.views[0].metric_focal.unwrap().source,
        FocalSource::Pixels
    );

    // A scene: each view its own focal, the maps resized to the input keep theirs in step.
    let images = [image.clone(), photo];
    let scene = session.run(&Request::new(&images)).unwrap();
    assert_eq!(
        scene.views[0].metric_focal.unwrap().source,
        FocalSource::Default
    );
    assert_eq!(
        scene.views[1].metric_focal.unwrap().source,
        FocalSource::Exif35mm(36)
    );
    let resized = scene.views[1].resize_to_input().unwrap();
    assert!((resized.metric_focal.unwrap().pixels - 160.0).abs() < 1e-3);

    // A focal no camera has is refused before computing.
    for bad in [
        Focal::Pixels(-1.0),
        Focal::Fov(0.0),
        Focal::Intrinsics(vec![]),
    ] {
        assert!(session.run(&Request::image(&image).focal(bad)).is_err());
    }
}

#[test]
fn the_mono_model_ignores_the_focal_and_stays_relative() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny("da3mono-tiny", dir.path());
    assert!(!model.config().is_metric());
    let mut session = model.session().unwrap();
    let image = da3::Image {
        focal_length_35mm: Some(26),
        ..synthetic::image(160, 120)
    };
    let plain = session.predict(&image).unwrap();
    let focal = session
        .run(&Request::image(&image).focal(Focal::Pixels(200.0)))
        .unwrap()
        .into_single()
        .unwrap();
    assert_eq!(plain.depth, focal.depth);
    assert_eq!(focal.depth_unit, DepthUnit::Relative);
    assert_eq!(focal.metric_focal, None);
    assert_eq!(focal.camera(), None);
}

/// A JPEG whose EXIF APP1 segment holds FocalLengthIn35mmFilm (0xA405) in the Exif sub-IFD,
/// next to an orientation: the decoded image carries the focal length, upright or not.
#[test]
fn the_exif_35mm_focal_length_is_read_from_a_jpeg() {
    use da3::image::{ImageFormat, Rgb, RgbImage};
    let image = RgbImage::from_fn(40, 30, |x, y| Rgb([(x * 6) as u8, (y * 8) as u8, 77]));
    let mut jpeg = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut jpeg), ImageFormat::Jpeg)
        .unwrap();
    assert_eq!(da3::decode_image(&jpeg).unwrap().focal_length_35mm, None);
    for orientation in [1u8, 6] {
        let tiff: &[u8] = &[
            b'I',
            b'I',
            42,
            0,
            8,
            0,
            0,
            0, // little-endian TIFF header, IFD0 at 8
            2,
            0, // two entries
            0x12,
            0x01,
            3,
            0,
            1,
            0,
            0,
            0,
            orientation,
            0,
            0,
            0, // Orientation (SHORT)
            0x69,
            0x87,
            4,
            0,
            1,
            0,
            0,
            0,
            38,
            0,
            0,
            0, // Exif IFD pointer (LONG) = 38
            0,
            0,
            0,
            0, // no next IFD
            1,
            0, // the Exif IFD at 38: one entry
            0x05,
            0xA4,
            3,
            0,
            1,
            0,
            0,
            0,
            26,
            0,
            0,
            0, // FocalLengthIn35mmFilm = 26 mm
            0,
            0,
            0,
            0,
        ];
        let mut app1 = b"Exif\0\0".to_vec();
        app1.extend_from_slice(tiff);
        let mut tagged = jpeg[..2].to_vec();
        tagged.extend_from_slice(&[0xFF, 0xE1]);
        tagged.extend_from_slice(&((app1.len() + 2) as u16).to_be_bytes());
        tagged.extend_from_slice(&app1);
        tagged.extend_from_slice(&jpeg[2..]);
        let decoded = da3::decode_image(&tagged).unwrap();
        assert_eq!(
            decoded.focal_length_35mm,
            Some(26),
            "orientation {orientation}"
        );
        let upright = if orientation == 6 { (30, 40) } else { (40, 30) };
        assert_eq!((decoded.width, decoded.height), upright);
        let path = tempfile::tempdir().unwrap();
        let file = path.path().join("a.jpg");
        std::fs::write(&file, &tagged).unwrap();
        assert_eq!(da3::load_image(&file).unwrap().focal_length_35mm, Some(26));
    }
}
