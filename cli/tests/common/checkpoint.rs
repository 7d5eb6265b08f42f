//! Checkpoint folders in the official layout (`config.json` and `model.safetensors` with
//! `model.`-prefixed keys) holding the synthetic weights: what `da3 convert` reads.

use da3::convert::{expected_tensors, official_name};
use da3::{synthetic, Config};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

/// One state-dict entry.
pub struct Entry {
    pub key: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
}

/// The state dict of the official model for `preset` with the synthetic weights, plus one
/// small entry for each of `extra_keys`.
pub fn official_entries(preset: &str, extra_keys: &[&str]) -> Vec<Entry> {
    let config = Config::preset(preset).unwrap();
    let mut entries: Vec<Entry> = expected_tensors(&config)
        .unwrap()
        .into_iter()
        .map(|(gguf, shape)| {
            let official = official_name(&gguf);
            Entry {
                values: synthetic::weight_values(&official, &shape),
                key: format!("model.{official}"),
                shape,
            }
        })
        .collect();
    for key in extra_keys {
        let shape = vec![4, 3];
        entries.push(Entry {
            key: key.to_string(),
            values: synthetic::weight_values(key, &shape),
            shape,
        });
    }
    entries
}

fn encode(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => panic!("no encoder for {other:?}"),
    }
}

/// Writes a checkpoint folder `dir`: `config.json` with `config_json` (none if `None`) and
/// `model.safetensors` holding `entries` as `dtype`.
pub fn write_checkpoint(dir: &Path, config_json: Option<&str>, entries: &[Entry], dtype: Dtype) {
    std::fs::create_dir_all(dir).unwrap();
    if let Some(json) = config_json {
        std::fs::write(dir.join("config.json"), json).unwrap();
    }
    let encoded: Vec<(&Entry, Vec<u8>)> = entries
        .iter()
        .map(|e| (e, encode(&e.values, dtype)))
        .collect();
    let views = encoded.iter().map(|(e, bytes)| {
        (
            e.key.clone(),
            TensorView::new(dtype, e.shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}
