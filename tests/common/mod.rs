//! Reference fixtures written by `tests/reference/da3_reference.py` (the official DA3 code),
//! and the comparison metrics the parity tests use.
#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};

/// `tests/fixtures/NAME` of the repository (found from the library's or the CLI's crate).
pub fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("tests/fixtures"))
        .find(|dir| dir.is_dir())
        .expect("tests/fixtures in the repository")
        .join(name)
}

/// An array of a fixture's manifest stored in full (`{"file", "shape", "stats"}`), the
/// entry of a multi-view, ray-pose or nested fixture `fixture`.
pub fn full_reference(fixture: &str, entry: &Value) -> Reference {
    full_reference_in(&fixture_dir(fixture), entry)
}

/// [`full_reference`] of a fixture in folder `dir`.
pub fn full_reference_in(dir: &Path, entry: &Value) -> Reference {
    let file = dir.join(entry["file"].as_str().unwrap());
    let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let values = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Reference {
        shape: entry["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect(),
        full: Some(values),
        samples: None,
        mean: entry["stats"]["mean"].as_f64().unwrap(),
        std: entry["stats"]["std"].as_f64().unwrap(),
    }
}

/// The options the integration tests load models with: the CPU, 2 threads.
pub fn cpu_options() -> da3::LoadOptions {
    da3::LoadOptions {
        device: da3::Device::Cpu,
        threads: 2,
        ..Default::default()
    }
}

/// A da3-tiny file with the synthetic weights the reference scripts use, in a temporary folder
/// that lives as long as the returned guard.
pub fn synthetic_tiny_file() -> (PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("da3-tiny.gguf");
    let config = da3::Config::preset("da3-tiny").unwrap();
    da3::convert::write_synthetic(&path, &config, da3::convert::WeightType::F32).unwrap();
    (path, dir)
}

/// The tiny model written by depth-anything.cpp's own converter (no camera encoder, no ray
/// branch).
pub fn peer_model_file() -> PathBuf {
    fixture_dir("peer").join("peer-tiny-seed0-f32.gguf")
}

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// One reference array: complete, or sampled on a grid of (row, column) positions of its 2D
/// view [prod(shape[..-1]), shape[-1]].
pub struct Reference {
    pub shape: Vec<usize>,
    pub full: Option<Vec<f32>>,
    pub samples: Option<(Vec<usize>, Vec<usize>, Vec<f32>)>,
    pub mean: f64,
    pub std: f64,
}

pub struct ImageCase {
    pub name: String,
    pub width: usize,
    pub height: usize,
    pub processed_width: usize,
    pub processed_height: usize,
    arrays: serde_json::Map<String, Value>,
    dir: PathBuf,
}

pub struct Fixture {
    pub process_res: usize,
    pub images: Vec<ImageCase>,
}

impl Fixture {
    pub fn load(name: &str) -> Fixture {
        let dir = fixture_dir(name);
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap();
        let images = manifest["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|im| ImageCase {
                name: im["name"].as_str().unwrap().to_owned(),
                width: im["width"].as_u64().unwrap() as usize,
                height: im["height"].as_u64().unwrap() as usize,
                processed_width: im["processed_width"].as_u64().unwrap() as usize,
                processed_height: im["processed_height"].as_u64().unwrap() as usize,
                arrays: im["arrays"].as_object().unwrap().clone(),
                dir: dir.clone(),
            })
            .collect();
        Fixture {
            process_res: manifest["process_res"].as_u64().unwrap() as usize,
            images,
        }
    }
}

impl ImageCase {
    pub fn reference(&self, name: &str) -> Reference {
        let a = self
            .arrays
            .get(name)
            .unwrap_or_else(|| panic!("fixture {} has no array {name}", self.name));
        let shape = a["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap() as usize)
            .collect();
        let full = a
            .get("file")
            .map(|f| read_f32(&self.dir.join(f.as_str().unwrap())));
        let samples = a.get("samples").map(|s| {
            let idx = |k: &str| {
                s[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap() as usize)
                    .collect::<Vec<_>>()
            };
            (
                idx("rows"),
                idx("cols"),
                read_f32(&self.dir.join(s["file"].as_str().unwrap())),
            )
        });
        Reference {
            shape,
            full,
            samples,
            mean: a["stats"]["mean"].as_f64().unwrap(),
            std: a["stats"]["std"].as_f64().unwrap(),
        }
    }
    pub fn has(&self, name: &str) -> bool {
        self.arrays.contains_key(name)
    }
}

/// Agreement of `ours` (same memory order as the reference) with a reference.
#[derive(Debug, Clone, Copy)]
pub struct Agreement {
    /// max |ours - ref| / |ref| over compared values (for positive outputs such as depth).
    pub max_rel: f64,
    /// max |ours - ref| / max |ref| (for signed intermediates).
    pub max_scaled: f64,
    pub corr: f64,
    pub compared: usize,
}

pub fn agreement(ours: &[f32], reference: &Reference) -> Agreement {
    let cols = *reference.shape.last().unwrap();
    let total: usize = reference.shape.iter().product();
    assert_eq!(
        ours.len(),
        total,
        "element count differs from the reference shape {:?}",
        reference.shape
    );
    let pairs: Vec<(f64, f64)> = match (&reference.full, &reference.samples) {
        (Some(full), _) => ours
            .iter()
            .zip(full)
            .map(|(&a, &b)| (a as f64, b as f64))
            .collect(),
        (None, Some((rows, cs, values))) => {
            let mut out = Vec::new();
            for (ri, &r) in rows.iter().enumerate() {
                for (ci, &c) in cs.iter().enumerate() {
                    out.push((ours[r * cols + c] as f64, values[ri * cs.len() + ci] as f64));
                }
            }
            out
        }
        _ => panic!("reference without data"),
    };
    let max_ref = pairs
        .iter()
        .map(|p| p.1.abs())
        .fold(0.0, f64::max)
        .max(1e-30);
    let max_rel = pairs
        .iter()
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-30))
        .fold(0.0, f64::max);
    let max_scaled = pairs.iter().map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) / max_ref;
    let n = pairs.len() as f64;
    let (ma, mb) = (
        pairs.iter().map(|p| p.0).sum::<f64>() / n,
        pairs.iter().map(|p| p.1).sum::<f64>() / n,
    );
    let cov: f64 = pairs.iter().map(|(a, b)| (a - ma) * (b - mb)).sum();
    let va: f64 = pairs.iter().map(|(a, _)| (a - ma).powi(2)).sum();
    let vb: f64 = pairs.iter().map(|(_, b)| (b - mb).powi(2)).sum();
    let corr = if va == 0.0 || vb == 0.0 {
        if va == vb {
            1.0
        } else {
            0.0
        }
    } else {
        cov / (va * vb).sqrt()
    };
    Agreement {
        max_rel,
        max_scaled,
        corr,
        compared: pairs.len(),
    }
}

/// Pearson correlation of two equally long value lists.
pub fn correlation(a: &[f32], b: &[f32]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (
        a.iter().map(|&v| v as f64).sum::<f64>() / n,
        b.iter().map(|&v| v as f64).sum::<f64>() / n,
    );
    let (mut cov, mut va, mut vb) = (0.0, 0.0, 0.0);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64 - ma, y as f64 - mb);
        cov += x * y;
        va += x * x;
        vb += y * y;
    }
    cov / (va * vb).sqrt()
}

/// Parity bounds of the scene, nested and ray fixtures: positive maps (depth, confidence)
/// within 1e-3 relative with correlation >= 0.99999; signed values (cameras, rays) within
/// 1e-3 of their largest magnitude.
pub fn assert_close(at: &str, what: &str, a: Agreement, positive: bool) {
    eprintln!("{at} {what}: {a:?}");
    if positive {
        assert!(a.max_rel <= 1e-3 && a.corr >= 0.99999, "{at} {what}: {a:?}");
    } else {
        assert!(a.max_scaled <= 1e-3, "{at} {what}: {a:?}");
    }
}

/// The synthetic views a fixture scene names (`views`: `{width, height}` each).
pub fn scene_images(scene: &serde_json::Value) -> Vec<da3::Image> {
    scene["views"]
        .as_array()
        .expect("a scene's views")
        .iter()
        .map(|v| {
            da3::synthetic::image(
                v["width"].as_u64().unwrap() as usize,
                v["height"].as_u64().unwrap() as usize,
            )
        })
        .collect()
}
