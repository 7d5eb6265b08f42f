//! `da3::convert::quantize` on files users already have: the tiny synthetic model and the file
//! depth-anything.cpp's converter wrote. Each output loads, keeps every tensor but the matrix
//! weights byte for byte, and predicts depth that correlates with the f32 model's (the bounds
//! of `da3_parity::quantized_weights_stay_close_to_f32`) and with the official outputs.

mod common;

use common::correlation;
use da3::convert::{
    conv_kernel_names, quantised_weight_names, quantize, write_synthetic, WeightType,
};
use da3::ggml::DType;
use da3::gguf::{GgufFile, GgufWriter, Value};
use da3::{synthetic, Config, Device, LoadOptions, Model};
use std::path::{Path, PathBuf};

fn options() -> LoadOptions {
    LoadOptions {
        device: Device::Cpu,
        threads: 2,
        ..Default::default()
    }
}

/// The lowest depth correlation with f32 each type must reach: f16 and q8_0 0.999, q4_k 0.99
/// as in the parity test; bf16 (8 mantissa bits, like q8_0's 8-bit values) as q8_0; q6_k and
/// q5_k, finer than q4_k, as q4_k.
fn min_correlation(t: WeightType) -> f64 {
    match t {
        WeightType::F16 | WeightType::BF16 | WeightType::Q8_0 => 0.999,
        _ => 0.99,
    }
}

fn tiny_f32(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-f32.gguf");
    write_synthetic(&path, &Config::preset("da3-tiny").unwrap(), WeightType::F32).unwrap();
    path
}

fn depth(path: &Path) -> Vec<f32> {
    let model = Model::load(path, &options()).unwrap();
    assert!(
        model.unused_tensors().is_empty(),
        "{:?}",
        model.unused_tensors()
    );
    // Quantised files compute with the int8 kernels wherever the vector kernels run (every
    // x86-64 CPU with AVX2), unless asked not to.
    let quantised = GgufFile::open(path)
        .unwrap()
        .tensors()
        .iter()
        .any(|t| t.dtype.is_quantized());
    let int8_expected = quantised && model.plan().cpu_kernels().is_some();
    assert_eq!(
        model.uses_int8_products(),
        int8_expected,
        "{}",
        path.display()
    );
    let image = synthetic::image(640, 427);
    model.session().unwrap().predict(&image).unwrap().depth
}

/// The input and output files agree on everything but the matrix weights, which have the type
/// the rule gives for their rows, and for f16 and bf16 the convolution kernels, which take
/// that type; returns (matrices converted to the type, q8_0 fallbacks).
fn check_layout(input: &Path, output: &Path, t: WeightType) -> (usize, usize) {
    let (a, b) = (
        GgufFile::open(input).unwrap(),
        GgufFile::open(output).unwrap(),
    );
    let meta = |f: &GgufFile| -> Vec<(String, Value)> {
        f.metadata()
            .filter(|(k, _)| *k != "general.file_type")
            .map(|(k, v)| (k.to_owned(), v.clone()))
            .collect()
    };
    assert_eq!(meta(&a), meta(&b), "metadata copied in order");
    assert_eq!(a.tensors().len(), b.tensors().len());
    let config = Config::from_gguf(&a).unwrap();
    let conv_kernels = conv_kernel_names(&config).unwrap();
    assert!(!conv_kernels.is_empty());
    let matrices = quantised_weight_names(&config).unwrap();
    let (mut converted, mut fallback) = (0, 0);
    for (x, y) in a.tensors().iter().zip(b.tensors()) {
        assert_eq!((&x.name, x.shape()), (&y.name, y.shape()));
        if matrices.contains(&x.name) {
            let ne0 = x.ne[0];
            let want = if ne0 % 256 == 0 || !t.dtype().is_quantized() {
                t.dtype()
            } else if t.dtype().block_size() == 256 && ne0 % 32 == 0 {
                DType::Q8_0
            } else if ne0 % 32 == 0 {
                t.dtype()
            } else {
                x.dtype
            };
            assert_eq!(y.dtype, want, "{} (rows of {ne0})", x.name);
            if want == t.dtype() {
                converted += 1;
            } else if want == DType::Q8_0 {
                fallback += 1;
            }
        } else if conv_kernels.contains(&x.name) && t.conv_kernel_dtype() != DType::F32 {
            assert_eq!(y.dtype, t.conv_kernel_dtype(), "{}", x.name);
        } else {
            assert_eq!(y.dtype, x.dtype, "{}", x.name);
            assert_eq!(
                a.tensor_data(x).unwrap(),
                b.tensor_data(y).unwrap(),
                "{} copied byte for byte",
                x.name
            );
        }
    }
    (converted, fallback)
}

#[test]
fn every_type_round_trips_on_the_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let reference = depth(&input);
    for &t in WeightType::QUANTIZED {
        let output = dir.path().join(format!("tiny-{t}.gguf"));
        let summary = quantize(&input, &output, t).unwrap();
        let (converted, fallback) = check_layout(&input, &output, t);
        assert_eq!(
            (summary.converted, summary.q8_0_fallback),
            (converted, fallback),
            "{t}"
        );
        assert!(summary.left_as_stored.is_empty());
        // da3-tiny (embed 128, MLP 512): only mlp_fc2 has rows of 512; k-quants store the rest
        // as q8_0.
        if t.dtype().block_size() == 256 {
            assert!(converted > 0 && fallback > 0, "{t}: {summary:?}");
        } else {
            assert_eq!(fallback, 0);
        }
        assert_eq!(
            summary.file_bytes_after,
            std::fs::metadata(&output).unwrap().len()
        );
        assert_eq!(
            summary.file_bytes_before,
            std::fs::metadata(&input).unwrap().len()
        );
        assert!(summary.file_bytes_after < summary.file_bytes_before);
        let after: usize = summary.after.iter().map(|c| c.tensors).sum();
        assert_eq!(after, summary.tensors);

        let corr = correlation(&depth(&output), &reference);
        eprintln!("{t}: depth correlation with f32 {corr:.6}");
        assert!(corr >= min_correlation(t), "{t}: correlation {corr}");
    }
}

/// q8_0 blocks decoded here by hand (an f16 scale, then 32 signed bytes) give back the f32
/// weights to within half a step of their block's scale (plus the scale's f16 rounding): the
/// bytes are ggml's q8_0 layout.
#[test]
fn q8_0_blocks_decode_to_the_f32_weights() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let output = dir.path().join("q8.gguf");
    quantize(&input, &output, WeightType::Q8_0).unwrap();
    let (a, b) = (
        GgufFile::open(&input).unwrap(),
        GgufFile::open(&output).unwrap(),
    );
    let name = "vit.blk.1.attn_qkv.weight";
    let src: Vec<f32> = a
        .tensor_data(a.tensor(name).unwrap())
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let q = b.tensor(name).unwrap();
    assert_eq!(q.dtype, DType::Q8_0);
    let blocks = b.tensor_data(q).unwrap();
    assert_eq!(blocks.len(), src.len() / 32 * 34);
    for (block, values) in blocks.chunks_exact(34).zip(src.chunks_exact(32)) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        let amax = values.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(
            (d - amax / 127.0).abs() <= 1e-3 * amax.max(1e-6),
            "scale {d} for max {amax}"
        );
        for (&byte, &v) in block[2..].iter().zip(values) {
            // ggml rounds with the f32 scale and stores it as f16 (relative error <= 2^-11).
            let q = byte as i8 as f32;
            let decoded = d * q;
            assert!(
                (decoded - v).abs() <= 0.5 * d + q.abs() * d / 1024.0 + 1e-7,
                "{decoded} vs {v}: byte {} scale {d} max {amax} block {values:?}",
                byte as i8
            );
        }
    }
}

/// The file depth-anything.cpp's converter wrote, quantised, still predicts the depth the
/// official code computed for its weights.
#[test]
fn peer_file_quantised_predicts_the_official_depth() {
    let peer = common::fixture_dir("peer");
    let input = peer.join("peer-tiny-seed0-f32.gguf");
    let official: Vec<f32> = std::fs::read(peer.join("peer-tiny-seed0.depth.f32"))
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let image = da3::image::open(peer.join("test-640x480.png")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for t in [WeightType::F16, WeightType::Q8_0, WeightType::Q4K] {
        let output = dir.path().join(format!("peer-{t}.gguf"));
        let summary = quantize(&input, &output, t).unwrap();
        // 16 block linears and 5 camera-decoder linears.
        assert_eq!(summary.converted + summary.q8_0_fallback, 21, "{summary:?}");
        check_layout(&input, &output, t);
        let model = Model::load(&output, &options()).unwrap();
        assert!(model.unused_tensors().is_empty());
        let depth = model.predict(&image).unwrap().depth;
        assert_eq!(depth.len(), official.len());
        let corr = correlation(&depth, &official);
        eprintln!("peer {t}: depth correlation with the official f32 depth {corr:.6}");
        assert!(corr >= min_correlation(t), "{t}: correlation {corr}");
    }
}

/// Rewrites `source` with `edit` applied to each (name, dtype, bytes) and extra metadata.
fn rewrite(
    source: &Path,
    dest: &Path,
    metadata: &[(&str, Value)],
    edit: impl Fn(&str, DType, &mut Vec<u8>) -> DType,
) {
    let file = GgufFile::open(source).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.set(k, v.clone());
    }
    for (k, v) in metadata {
        w.set(*k, v.clone());
    }
    for t in file.tensors() {
        let mut data = file.tensor_data(t).unwrap().to_vec();
        let dtype = edit(&t.name, t.dtype, &mut data);
        w.add_tensor(t.name.clone(), dtype, t.shape(), data)
            .unwrap();
    }
    w.write_to(dest).unwrap();
}

fn assert_refused(input: &Path, output: &Path, t: WeightType, parts: &[&str]) {
    let before = std::fs::read(output).ok();
    let err = quantize(input, output, t).expect_err("quantize should refuse");
    let message = err.to_string();
    for part in parts {
        assert!(message.contains(part), "`{message}` lacks `{part}`");
    }
    assert_eq!(std::fs::read(output).ok(), before, "the output was touched");
    let dir = output.parent().unwrap();
    let stray: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn bad_inputs_are_refused_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let out = dir.path().join("out.gguf");

    assert_refused(
        &input,
        &out,
        WeightType::F32,
        &["f32 is not a type to quantize to"],
    );
    assert_refused(&input, &input, WeightType::Q8_0, &["is the input file"]);

    let not_gguf = dir.path().join("image.png");
    std::fs::copy(
        common::fixture_dir("peer").join("test-640x480.png"),
        &not_gguf,
    )
    .unwrap();
    assert_refused(&not_gguf, &out, WeightType::Q8_0, &["not a GGUF file"]);
    assert_refused(
        &dir.path().join("missing.gguf"),
        &out,
        WeightType::Q8_0,
        &["missing.gguf"],
    );

    let llama = dir.path().join("llama.gguf");
    rewrite(
        &input,
        &llama,
        &[("general.architecture", "llama".into())],
        |_, t, _| t,
    );
    assert_refused(
        &llama,
        &out,
        WeightType::Q4K,
        &["not a Depth Anything model", "`llama`"],
    );

    let q8 = dir.path().join("q8.gguf");
    quantize(&input, &q8, WeightType::Q8_0).unwrap();
    assert_refused(
        &q8,
        &out,
        WeightType::Q4K,
        &["tensor `vit.blk.", "already quantised (q8_0)"],
    );

    let nan = dir.path().join("nan.gguf");
    rewrite(&input, &nan, &[], |name, t, data| {
        if name == "vit.blk.2.mlp_fc2.weight" {
            data[40..44].copy_from_slice(&f32::NAN.to_le_bytes());
        }
        t
    });
    assert_refused(
        &nan,
        &out,
        WeightType::Q4K,
        &["vit.blk.2.mlp_fc2.weight", "NaN"],
    );

    // An existing output is left as it was.
    std::fs::write(&out, b"keep me").unwrap();
    assert_refused(&q8, &out, WeightType::Q6K, &["already quantised"]);
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
}

/// An f16 file (as depth-anything.cpp publishes) quantises from its f16 values, and
/// `general.file_type`, no longer true of the output, is left out.
#[test]
fn f16_input_quantises_and_drops_the_file_type() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let f16 = dir.path().join("f16.gguf");
    let matrices = quantised_weight_names(&Config::preset("da3-tiny").unwrap()).unwrap();
    rewrite(
        &input,
        &f16,
        &[("general.file_type", 1u32.into())],
        |name, t, data| {
            if matrices.contains(name) {
                let halves: Vec<u8> = data
                    .chunks_exact(4)
                    .flat_map(|c| {
                        half::f16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
                    })
                    .collect();
                *data = halves;
                DType::F16
            } else {
                t
            }
        },
    );
    let out = dir.path().join("q4.gguf");
    let summary = quantize(&f16, &out, WeightType::Q4K).unwrap();
    assert!(summary.before.iter().any(|c| c.dtype == DType::F16));
    assert!(summary.after.iter().all(|c| c.dtype != DType::F16));
    check_layout(&f16, &out, WeightType::Q4K);
    let file = GgufFile::open(&out).unwrap();
    assert!(file.get("general.file_type").is_none());
    let corr = correlation(&depth(&out), &depth(&input));
    assert!(corr >= 0.99, "{corr}");
}

/// The safe wrapper of `ggml_quantize_chunk` refuses, as errors, what ggml would assert on:
/// rows its blocks do not divide, types needing an importance matrix or not quantisable, and
/// values its rounding cannot take.
#[test]
fn ggml_quantize_refuses_what_ggml_asserts_on() {
    use da3::ggml::{quantize as ggml_quantize, Error};
    let ok = vec![0.25f32; 512];
    assert_eq!(ggml_quantize(DType::Q4_K, &ok, 256).unwrap().len(), 2 * 144);
    assert_eq!(ggml_quantize(DType::BF16, &ok, 512).unwrap().len(), 1024);
    assert!(matches!(
        ggml_quantize(DType::Q4_K, &ok, 128),
        Err(Error::InvalidShape { .. })
    ));
    assert!(matches!(
        ggml_quantize(DType::Q8_0, &ok[..100], 48),
        Err(Error::InvalidShape { .. })
    ));
    for t in [
        DType::IQ2_XXS,
        DType::IQ1_S,
        DType::Q8_K,
        DType::F32,
        DType::I32,
    ] {
        assert!(
            matches!(
                ggml_quantize(t, &ok, 256),
                Err(Error::InvalidArgument { .. })
            ),
            "{t}"
        );
    }
    let mut bad = ok.clone();
    bad[300] = f32::INFINITY;
    for t in [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0] {
        let err = ggml_quantize(t, &bad, 256).unwrap_err().to_string();
        assert!(
            err.contains("value 300") && err.contains("not finite"),
            "{err}"
        );
    }
    // f16 stores an infinity as one.
    let halves = ggml_quantize(DType::F16, &bad, 256).unwrap();
    assert_eq!(
        half::f16::from_le_bytes([halves[600], halves[601]]),
        half::f16::INFINITY
    );
}

/// A q4_k weight whose first block scale is infinite (a corrupt file) is an error naming the
/// tensor where the int8 products decode it at load (an infinite value cannot be stored as
/// q8_0). ggml's own q4_k product neither scans nor refuses it: with the plan's int8 products
/// off (`--plan int8-products=off`) or the portable kernels the file loads (and computes a
/// finite, meaningless depth).
#[test]
fn a_quantised_weight_decoding_to_infinity_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let input = tiny_f32(dir.path());
    let q4k = dir.path().join("tiny-q4_k.gguf");
    quantize(&input, &q4k, WeightType::Q4K).unwrap();
    let file = GgufFile::open(&q4k).unwrap();
    let info = file
        .tensors()
        .iter()
        .find(|t| t.dtype == DType::Q4_K)
        .expect("a q4_k tensor")
        .clone();
    let at = (file.data_offset() + info.offset) as usize;
    drop(file);
    let mut bytes = std::fs::read(&q4k).unwrap();
    // block_q4_K opens with its f16 scale d: +infinity.
    bytes[at..at + 2].copy_from_slice(&0x7C00u16.to_le_bytes());
    let corrupt = dir.path().join("corrupt-q4_k.gguf");
    std::fs::write(&corrupt, &bytes).unwrap();
    let loaded = Model::load(&corrupt, &options());
    if da3::ggml::Cpu::detect().best().beats_ggml() {
        let Err(e) = loaded else {
            panic!("the int8 path loaded a weight that decodes to infinity");
        };
        let message = format!("{e:#}");
        assert!(
            message.contains(&info.name) && message.contains("not finite"),
            "{message}"
        );
    } else {
        assert!(loaded.is_ok(), "ggml's product takes the weight as it is");
    }
    let ggml_products = LoadOptions {
        plan: da3::PlanOverrides {
            int8_products: Some(false),
            ..Default::default()
        },
        ..options()
    };
    let model = Model::load(&corrupt, &ggml_products).expect("ggml's product takes the weight");
    assert!(!model.uses_int8_products());
}
