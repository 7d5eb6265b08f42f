//! Writes the seed corpora: `write_seeds DIR` fills DIR/{gguf_model,image_preprocess,graph_ops}
//! from the built-in model, small GGUF files, the image fixtures and a JPEG of the synthetic
//! test image.

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
}
