//! Writes the seed corpora: `write_seeds DIR` fills
//! DIR/{gguf_model,image_preprocess,graph_ops,serve_form} from the built-in model, small GGUF
//! files, the image fixtures, a JPEG of the synthetic test image and a few `da3 serve` forms.

use da3::da3::{convert, synthetic, Config};
use da3::ggml::DType;
use da3::gguf::GgufWriter;
use std::path::Path;

fn main() {
    let dir = std::env::args().nth(1).expect("usage: write_seeds DIR");
    let dir = Path::new(&dir);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let d = dir.join(target);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(name), bytes).unwrap();
    };

    // GGUF: the built-in da3-tiny file, and a small file with metadata and two tensors.
    let config = Config::preset("da3-tiny").unwrap();
    let mut bytes = Vec::new();
    convert::build_gguf(&config, convert::WeightType::F32, |key, shape| {
        Ok(synthetic::weight_values(key, shape))
    })
    .unwrap()
    .write_to_writer(&mut bytes)
    .unwrap();
    write("gguf_model", "da3-tiny.gguf", &bytes);
    let mut w = GgufWriter::new();
    convert::write_metadata(&mut w, &config);
    w.add_tensor("vit.norm.weight", DType::F32, &[4], vec![0; 16])
        .unwrap();
    w.add_tensor("vit.cls_token", DType::F32, &[4, 1], vec![0; 16])
        .unwrap();
    let mut small = Vec::new();
    w.write_to_writer(&mut small).unwrap();
    write("gguf_model", "metadata-only.gguf", &small);

    // Images: the fixtures and encodings of the synthetic image.
    for name in ["tiny.png", "corrupt.png"] {
        let bytes = std::fs::read(root.join("tests/fixtures/preprocess").join(name)).unwrap();
        let mut seed = vec![126u8];
        seed.extend(bytes);
        write("image_preprocess", name, &seed);
    }
    let img = synthetic::image(37, 23);
    let rgb = image::RgbImage::from_raw(37, 23, img.data.clone()).unwrap();
    for (name, format) in [
        ("synthetic.png", image::ImageFormat::Png),
        ("synthetic.jpg", image::ImageFormat::Jpeg),
    ] {
        let mut out = std::io::Cursor::new(vec![7u8]);
        out.set_position(1);
        rgb.write_to(&mut out, format).unwrap();
        write("image_preprocess", name, &out.into_inner());
    }

    // Graphs: a few programs (one op each kind, small shapes).
    for op in 0..36u8 {
        let seed = [
            op & 1,
            3,
            0,
            2,
            3,
            3,
            1,
            2,
            3,
            3,
            0,
            1,
            2,
            2,
            3,
            2,
            3,
            8,
            0,
            1,
            2,
            op,
            1,
            2,
            3,
        ];
        write("graph_ops", &format!("op{op:02}"), &seed);
    }

    // Forms: a selector byte (0x1f: every optional output, four views), then multipart bodies
    // with the serve_form target's boundary.
    let part = |name: &str, file: Option<&str>, bytes: &[u8]| {
        let mut p =
            format!("--da3-fuzz-boundary\r\nContent-Disposition: form-data; name=\"{name}\"");
        if let Some(file) = file {
            p += &format!("; filename=\"{file}\"\r\nContent-Type: image/png");
        }
        let mut p = p.into_bytes();
        p.extend_from_slice(b"\r\n\r\n");
        p.extend_from_slice(bytes);
        p.extend_from_slice(b"\r\n");
        p
    };
    let tiny = std::fs::read(root.join("tests/fixtures/preprocess/tiny.png")).unwrap();
    let forms: [(&str, Vec<Vec<u8>>); 4] = [
        (
            "full",
            vec![
                part("process_res", None, b"504"),
                part("outputs", None, b"depth_png, pose,points,ply,glb,depth_f32"),
                part("image", Some("a.png"), &tiny),
            ],
        ),
        (
            "two-images",
            vec![
                part("image", Some("a.png"), &tiny),
                part("image", None, b"not an image"),
                part("outputs", None, b"sky_f32,confidence_f32"),
            ],
        ),
        ("bad-res", vec![part("process_res", None, b" 7 ")]),
        ("unknown-field", vec![part("colour", None, b"blue")]),
    ];
    for (name, parts) in forms {
        let mut seed = vec![0x1f];
        for p in parts {
            seed.extend(p);
        }
        seed.extend_from_slice(b"--da3-fuzz-boundary--\r\n");
        write("serve_form", name, &seed);
    }
    let mut own_type = b"\x80multipart/form-data; boundary=X\n".to_vec();
    own_type.extend_from_slice(
        b"--X\r\nContent-Disposition: form-data; name=\"image\"\r\n\r\nx\r\n--X--\r\n",
    );
    write("serve_form", "own-content-type", &own_type);
}
