//! Parity with the official Depth Anything 3 code on synthetic weights: the fixtures were made
//! by `tests/reference/da3_reference.py` from the same weight formula as
//! `da3::da3::synthetic`, so no checkpoint is committed.

mod common;

use common::{agreement, correlation, Fixture};
use da3::convert::{write_synthetic, WeightType};
use da3::ggml::{DType, KernelSet};
use da3::gguf::{GgufFile, GgufWriter, Value};
use da3::Request;
use da3::{synthetic, Config, Device, LoadOptions, Model, PlanOverrides, Session};

fn load_synthetic(preset: &str, probes: bool) -> (Session, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{preset}.gguf"));
    write_synthetic(&path, &Config::preset(preset).unwrap(), WeightType::F32).unwrap();
    let model = Model::load(
        &path,
        &LoadOptions {
            device: Device::Cpu,
            threads: 2,
            probes,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(
        model.unused_tensors().is_empty(),
        "unused: {:?}",
        model.unused_tensors()
    );
    (model.session().unwrap(), dir)
}

/// A DualDPT model against its fixture at every aspect ratio: processed size, the stages the
/// fixture recorded (first image only), depth and confidence (max rel <= 1e-3, correlation
/// >= 0.99999) and the pose (intrinsics and extrinsics within 1e-3 of their scale).
fn dual_dpt_matches_official(preset: &str, stages: &[(&str, &str)]) {
    let fixture = Fixture::load(preset);
    let (mut model, _dir) = load_synthetic(preset, true);
    for case in &fixture.images {
        let image = synthetic::image(case.width, case.height);
        let raw = Request::image(&image)
            .process_res(fixture.process_res)
            .raw_outputs(true);
        let prediction = model.run(&raw).unwrap().into_single().unwrap();
        let at = format!("{preset} {}", case.name);
        assert_eq!(
            (prediction.width, prediction.height),
            (case.processed_width, case.processed_height),
            "{at}"
        );
        for (ours, theirs) in stages.iter().filter(|(_, theirs)| case.has(theirs)) {
            let a = agreement(prediction.probe(ours).unwrap(), &case.reference(theirs));
            eprintln!("{at} {ours}: {a:?}");
            assert!(
                a.max_scaled < 1e-4 && a.corr > 0.99999,
                "{at} {ours}: {a:?}"
            );
        }
        let depth = agreement(&prediction.depth, &case.reference("depth"));
        let conf = agreement(
            prediction.confidence.as_ref().unwrap(),
            &case.reference("depth_conf"),
        );
        eprintln!("{at} depth {depth:?}\n{at} conf {conf:?}");
        for (what, a) in [("depth", depth), ("confidence", conf)] {
            assert!(a.max_rel <= 1e-3 && a.corr >= 0.99999, "{at} {what}: {a:?}");
        }
        let pose = prediction.pose.unwrap();
        let intr: Vec<f32> = pose.intrinsics.iter().flatten().copied().collect();
        let extr: Vec<f32> = pose.extrinsics.iter().flatten().copied().collect();
        let ai = agreement(&intr, &case.reference("intrinsics"));
        let ae = agreement(&extr, &case.reference("extrinsics"));
        eprintln!("{at} intrinsics {ai:?} extrinsics {ae:?}");
        assert!(
            ai.max_scaled <= 1e-3 && ae.max_scaled <= 1e-3,
            "{at}: {ai:?} {ae:?}"
        );
    }
}

#[test]
fn tiny_matches_official_at_every_stage_and_aspect_ratio() {
    let stages = [
        ("tokens_in", "tokens_in"),
        ("feat0", "feat0"),
        ("feat1", "feat1"),
        ("feat2", "feat2"),
        ("feat3", "feat3"),
        ("cam_token", "cam_token3"),
    ];
    dual_dpt_matches_official("da3-tiny", &stages);
}

/// The real presets at the default 504 resolution, compared on a 32 x 32 grid of samples per
/// output (the committed fixtures are compact).
fn preset_matches_official(preset: &str) {
    dual_dpt_matches_official(preset, &[("tokens_in", "tokens_in"), ("feat3", "feat3")]);
}

#[test]
fn small_matches_official_at_504() {
    preset_matches_official("da3-small");
}

#[test]
fn base_matches_official_at_504() {
    preset_matches_official("da3-base");
}

/// The depth of da3-small's synthetic weights stored as `weight_type`, for the 640x427
/// synthetic image, on the CPU with 2 threads.
fn synthetic_small_depth(dir: &std::path::Path, weight_type: WeightType) -> Vec<f32> {
    synthetic_small_model(dir, weight_type, PlanOverrides::default()).1
}

/// The model of [`synthetic_small_depth`] loaded with `plan`, and its depth.
fn synthetic_small_model(
    dir: &std::path::Path,
    weight_type: WeightType,
    plan: PlanOverrides,
) -> (Model, Vec<f32>) {
    let path = dir.join(format!("{weight_type:?}.gguf"));
    write_synthetic(&path, &Config::preset("da3-small").unwrap(), weight_type).unwrap();
    let options = LoadOptions {
        device: Device::Cpu,
        threads: 2,
        plan,
        ..Default::default()
    };
    let model = Model::load(&path, &options).unwrap();
    let image = synthetic::image(640, 427);
    let depth = model.session().unwrap().predict(&image).unwrap().depth;
    (model, depth)
}

/// f16, q8_0 and q4_k files (written with the safe layer's GGUF writer and ggml's quantisers)
/// stay close to the f32 model.
#[test]
fn quantized_weights_stay_close_to_f32() {
    let dir = tempfile::tempdir().unwrap();
    let reference = synthetic_small_depth(dir.path(), WeightType::F32);
    for (weight_type, min_corr) in [
        (WeightType::F16, 0.999),
        (WeightType::Q8_0, 0.999),
        (WeightType::Q4K, 0.99),
    ] {
        let corr = correlation(&synthetic_small_depth(dir.path(), weight_type), &reference);
        eprintln!("{weight_type:?}: depth correlation with f32 {corr:.6}");
        assert!(corr >= min_corr, "{weight_type:?}: correlation {corr}");
    }
}

/// The plan of the AVX2 kernels (AVX2 without VNNI), where this CPU runs them: tests of that
/// set ask for it in the load options, whatever better set the CPU has. None on a CPU without
/// them (not x86-64, or below AVX2; every CI machine of this project has them).
fn avx2_plan() -> Option<PlanOverrides> {
    let cpu = da3::ggml::Cpu::detect();
    if !cpu.runs(KernelSet::Avx2) {
        eprintln!("no AVX2 kernels on this CPU: ggml's products run here");
        return None;
    }
    Some(PlanOverrides {
        kernels: da3::ggml::KernelRequest {
            set: Some(KernelSet::Avx2),
            ..Default::default()
        },
        ..Default::default()
    })
}

/// The AVX2 set (AVX2 without VNNI) quantises the int8 products' activations to 7 bits: a
/// q8_0 file's depth still correlates with the f32 file's at 0.999 or better (the bar of a
/// fast mode; 0.99967 measured), with the AVX2 kernels ([`avx2_plan`]).
#[test]
fn q8_0_file_with_7_bit_activations_stays_close_to_f32() {
    let Some(plan) = avx2_plan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, reference) = synthetic_small_model(dir.path(), WeightType::F32, plan);
    let (model, q8) = synthetic_small_model(dir.path(), WeightType::Q8_0, plan);
    let kernels = model.plan().cpu_kernels().expect("the AVX2 kernels run");
    assert_eq!(kernels.config.set(), KernelSet::Avx2);
    assert_eq!(kernels.config.int8_activation_bits(), 7);
    assert!(
        model.uses_int8_products(),
        "q8_0 weights would not take int8 products"
    );
    let corr = correlation(&q8, &reference);
    eprintln!("q8_0 with 7-bit activations: depth correlation with f32 {corr:.6}");
    assert!(corr >= 0.999, "correlation {corr}");
}

/// Where bf16 products do not pay (AVX2 CPUs, Intel without AMX), an f16 file's linear
/// layers are packed as f16 panels and multiplied in f32: the depth of the f16 file then
/// equals, to f32 rounding, that of an f32 file holding the same f16-rounded values (ggml's
/// f16 product, which rounds the activations to f16 as well, is 6e-4 of the depth off), with
/// the AVX2 kernels ([`avx2_plan`]).
#[test]
fn f16_file_on_f32_products_matches_its_values_in_f32() {
    let Some(plan) = avx2_plan() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let f16_path = dir.path().join("f16.gguf");
    let config = Config::preset("da3-small").unwrap();
    write_synthetic(&f16_path, &config, WeightType::F16).unwrap();
    // The same file with every f16 tensor widened to f32.
    let widened_path = dir.path().join("widened.gguf");
    let file = GgufFile::open(&f16_path).unwrap();
    let mut writer = GgufWriter::new();
    for (key, value) in file.metadata() {
        writer.set(key, value.clone());
    }
    writer.set("general.file_type", Value::from(0u32));
    for t in file.tensors() {
        let data = file.tensor_data(t).unwrap();
        let (dtype, data) = if t.dtype == DType::F16 {
            let widened = data
                .chunks_exact(2)
                .flat_map(|h| {
                    half::f16::from_le_bytes([h[0], h[1]])
                        .to_f32()
                        .to_le_bytes()
                })
                .collect();
            (DType::F32, widened)
        } else {
            (t.dtype, data.to_vec())
        };
        writer
            .add_tensor(t.name.clone(), dtype, t.shape(), data)
            .unwrap();
    }
    writer.write_to(&widened_path).unwrap();
    let image = synthetic::image(320, 214);
    let depth_of = |path: &std::path::Path| {
        let options = LoadOptions {
            device: Device::Cpu,
            threads: 2,
            plan,
            ..Default::default()
        };
        let model = Model::load(path, &options).unwrap();
        assert!(
            !model.uses_bf16_products(),
            "the f16 file would be packed as bf16"
        );
        model.session().unwrap().predict(&image).unwrap().depth
    };
    let (f16, widened) = (depth_of(&f16_path), depth_of(&widened_path));
    let largest = widened.iter().fold(0.0f32, |m, d| m.max(d.abs()));
    let diff = f16
        .iter()
        .zip(&widened)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("f16 file against its values in f32: largest difference {diff:e} of {largest}");
    assert!(diff <= 1e-5 * largest, "{diff} of {largest}");
}

/// f16 convolutions (ggml's direct convolution with f16 kernels, which GPUs run on tensor
/// cores for half-precision files) keep depth within correlation 0.9999 of f32 ones, computed
/// on the CPU; `auto` is f32 there.
#[test]
fn half_convolutions_stay_close_to_f32() {
    use da3::convert::WeightType;
    use da3::ConvPrecision;
    let config = Config::preset("da3-small").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.gguf");
    write_synthetic(&path, &config, WeightType::F32).unwrap();
    let image = synthetic::image(640, 427);
    let depth_with = |conv_precision| {
        let options = LoadOptions {
            device: Device::Cpu,
            threads: 2,
            conv_precision,
            ..Default::default()
        };
        let model = Model::load(&path, &options).unwrap();
        assert_eq!(
            model.uses_half_convolutions(),
            conv_precision == ConvPrecision::F16
        );
        model.session().unwrap().predict(&image).unwrap().depth
    };
    let exact = depth_with(ConvPrecision::F32);
    assert_eq!(
        depth_with(ConvPrecision::Auto),
        exact,
        "auto is f32 on the CPU"
    );
    let corr = correlation(&depth_with(ConvPrecision::F16), &exact);
    eprintln!("f16 convolutions: depth correlation with f32 {corr:.7}");
    assert!(corr >= 0.9999, "correlation {corr}");
}

/// The mono (DPT + sky head) variant: depth and sky before the official sky post-processing
/// (which samples pixels at random), at 504 on the landscape image.
#[test]
fn mono_large_matches_official_before_sky_postprocessing() {
    let fixture = Fixture::load("da3mono-large");
    let (mut model, _dir) = load_synthetic("da3mono-large", true);
    let case = &fixture.images[0];
    let image = synthetic::image(case.width, case.height);
    let raw = Request::image(&image)
        .process_res(fixture.process_res)
        .raw_outputs(true);
    let prediction = model.run(&raw).unwrap().into_single().unwrap();
    assert!(prediction.confidence.is_none() && prediction.pose.is_none());
    for (ours, theirs) in [("tokens_in", "tokens_in"), ("feat3", "feat3")] {
        let a = agreement(prediction.probe(ours).unwrap(), &case.reference(theirs));
        assert!(
            a.max_scaled < 1e-4 && a.corr > 0.99999,
            "mono {ours}: {a:?}"
        );
    }
    let depth = agreement(&prediction.depth, &case.reference("depth"));
    let sky = agreement(prediction.sky.as_ref().unwrap(), &case.reference("sky"));
    eprintln!("mono depth {depth:?}\nmono sky {sky:?}");
    assert!(
        depth.max_rel <= 1e-3 && depth.corr >= 0.99999,
        "mono depth: {depth:?}"
    );
    // Sky is relu'd: compare on the scale of the map (zeros make per-value ratios meaningless).
    assert!(
        sky.max_scaled <= 1e-3 && sky.corr >= 0.99999,
        "mono sky: {sky:?}"
    );

    // The post-processing rule against the official one, which estimates the 0.99 quantile
    // from 100 000 random samples: sky pixels agree to the sampling error.
    let mut filled = prediction.depth.clone();
    da3::outputs::fill_sky(&mut filled, prediction.sky.as_ref().unwrap());
    let reference = case.reference("depth_sky_postprocessed");
    let sky_reference = case.reference("sky");
    let (rows, cols, values) = reference.samples.as_ref().unwrap();
    let sky_values = &sky_reference.samples.as_ref().unwrap().2;
    let width = *reference.shape.last().unwrap();
    let mut sky_pixels = 0;
    for (ri, &r) in rows.iter().enumerate() {
        for (ci, &c) in cols.iter().enumerate() {
            let k = ri * cols.len() + ci;
            if sky_values[k] >= 0.3 {
                sky_pixels += 1;
                let ours = filled[r * width + c];
                assert!(
                    (ours - values[k]).abs() <= 1e-2 * values[k].abs(),
                    "sky pixel ({r}, {c}): {ours} vs {}",
                    values[k]
                );
            }
        }
    }
    assert!(
        sky_pixels > 0,
        "the fixture has no sky pixel on the sample grid"
    );
}

/// The path a CPU without a vector kernel set of ours takes (every node on ggml's ops, no
/// packed weights, norms and layer scales folded into the linear layers as on GPUs) gives the
/// depth of the CPU-kernel path, da3-tiny at two aspect ratios.
#[test]
fn ggml_ops_path_matches_cpu_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    write_synthetic(&path, &Config::preset("da3-tiny").unwrap(), WeightType::F32).unwrap();
    let depth = |ggml_ops_only: bool, width: usize, height: usize| {
        let options = LoadOptions {
            device: Device::Cpu,
            threads: 2,
            ggml_ops_only,
            ..Default::default()
        };
        let model = Model::load(&path, &options).unwrap();
        // ggml's ops take each block's norms and layer scales folded into its linear
        // layers (4 of them a block); the CPU kernels fuse them into their products instead.
        let blocks = model.config().vit.depth;
        let expected = if ggml_ops_only { 4 * blocks } else { 0 };
        assert_eq!(model.folded_layers(), expected);
        // Both rotate each head in one vision-mode RoPE node, its quarters reordered at load
        // (the CPU kernels' linear weights packed from the reordered rows).
        assert!(model.uses_vision_rope());
        // ...and compute the QK-norms (blocks 2 and 3) as RMS norms of heads that the QKV
        // layer centres.
        assert_eq!(model.uses_centred_qk_heads(), ggml_ops_only);
        let image = synthetic::image(width, height);
        let raw = Request::image(&image).process_res(280).raw_outputs(true);
        let mut session = model.session().unwrap();
        session.run(&raw).unwrap().into_single().unwrap().depth
    };
    for (width, height) in [(640, 427), (300, 400)] {
        let (kernels, ggml) = (depth(false, width, height), depth(true, width, height));
        assert_eq!(kernels.len(), ggml.len());
        let scale = ggml.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let diff = kernels
            .iter()
            .zip(&ggml)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!(
            "{width}x{height}, kernels {}: max abs diff {diff:e} of {scale:e}",
            da3::ggml::KernelConfig::detect().set()
        );
        assert!(diff <= 1e-3 * scale, "{width}x{height}: {diff} of {scale}");
        assert!(correlation(&kernels, &ggml) > 0.99999);
    }
}
