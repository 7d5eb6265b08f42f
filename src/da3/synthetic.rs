//! Deterministic model weights and images, defined by formulas that the reference script
//! (`tests/reference/da3_reference.py`) implements identically, so that parity tests need no
//! committed checkpoints.

/// FNV-1a, 64 bit.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Uniform in [-1, 1) for element `i` of the tensor named `key` (splitmix64 of the name's
/// hash mixed with the index).
pub fn uniform_pm1(key_hash: u64, i: u64) -> f64 {
    let x = (key_hash ^ i.wrapping_mul(GOLDEN)).wrapping_add(GOLDEN);
    let mut z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 * 2f64.powi(-53) * 2.0 - 1.0
}

/// (center, scale) of the formula for one official state-dict entry: LayerScale near 0.5,
/// norm weights near 1, small biases, tokens, and fan-in scaled kernels, so that every
/// parameter matters and attention is not uniform.
pub fn rule(key: &str, shape: &[usize]) -> (f64, f64) {
    if key.ends_with("ls1.gamma") || key.ends_with("ls2.gamma") {
        return (0.5, 0.4);
    }
    if shape.len() == 1 && key.ends_with(".weight") && key.contains("norm") {
        return (1.0, 0.25);
    }
    if key.ends_with(".bias") {
        return (0.0, 0.1);
    }
    let token = [
        "cls_token",
        "camera_token",
        "pos_embed",
        "mask_token",
        "register_tokens",
    ]
    .iter()
    .any(|s| key.ends_with(s));
    if shape.len() < 2 || token {
        return (0.0, 0.5);
    }
    let numel: usize = shape.iter().product();
    let fan_in = numel / shape[0];
    (0.0, (3.0 / fan_in as f64).sqrt())
}

/// The values of the official state-dict entry `key` with PyTorch shape `shape`, row-major.
pub fn weight_values(key: &str, shape: &[usize]) -> Vec<f32> {
    let (center, scale) = rule(key, shape);
    let h = fnv1a64(key.as_bytes());
    let n: usize = shape.iter().product();
    (0..n as u64)
        .map(|i| (center + scale * uniform_pm1(h, i)) as f32)
        .collect()
}

/// The synthetic test image: interleaved RGB, rows top to bottom.
pub fn image(width: usize, height: usize) -> super::preprocess::RgbImage8 {
    let mut data = vec![0u8; width * height * 3];
    for y in 0..height {
        for x in 0..width {
            let t = (0.5 * (x + y) as f64).sin();
            for c in 0..3 {
                let s = (0.043 * x as f64 + 0.7 * c as f64).sin();
                let k = (0.031 * y as f64 - 0.4 * c as f64).cos();
                let v = (128.0 + (100.0 * s) * k) + 20.0 * t;
                data[(y * width + x) * 3 + c] = v.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
    super::preprocess::RgbImage8 {
        width,
        height,
        data,
        ..Default::default()
    }
}
