//! Official checkpoints (and synthetic weights) to GGUF files in depth-anything.cpp's layout.

use super::architecture::{tensors, Parts, Role, TensorSpec};
use super::config::{Config, DepthActivation, Family};
use super::Error;
use crate::ggml::DType;
use crate::gguf::GgufWriter;
use std::collections::HashSet;
use std::path::Path;

mod names;
mod pth;
mod quantize;
pub use names::{gguf_name, gguf_name_in, official_name, official_name_in};
pub use pth::{read_state_dict, PthTensor, StateDict};
pub use quantize::{quantize, QuantizeSummary, TypeCount};

/// The architecture's tensors of a file converted for `config` ([`Parts::of_config`]).
fn converted_tensors(config: &Config) -> Result<Vec<TensorSpec>, Error> {
    tensors(config, &Parts::of_config(config))
}

/// Every tensor a file for `config` must hold: (GGUF name, PyTorch shape), in file order.
pub fn expected_tensors(config: &Config) -> Result<Vec<(String, Vec<usize>)>, Error> {
    Ok(converted_tensors(config)?
        .into_iter()
        .map(|t| (t.name, t.shape))
        .collect())
}

/// The convolution kernels among [`expected_tensors`]: stored in the half type of f16 and
/// bf16 files ([`WeightType::conv_kernel_dtype`]).
pub fn conv_kernel_names(config: &Config) -> Result<HashSet<String>, Error> {
    names_where(config, |t| t.role == Role::ConvKernel)
}

/// The matrix weights among [`expected_tensors`] that converted and quantised files store in
/// their weight type ([`TensorSpec::quantised`]): the block linears of the backbone and of the
/// camera encoder, and the camera decoder's.
pub fn quantised_weight_names(config: &Config) -> Result<HashSet<String>, Error> {
    names_where(config, |t| t.quantised)
}

fn names_where(
    config: &Config,
    keep: impl Fn(&TensorSpec) -> bool,
) -> Result<HashSet<String>, Error> {
    Ok(converted_tensors(config)?
        .into_iter()
        .filter(keep)
        .map(|t| t.name)
        .collect())
}

/// Metadata in depth-anything.cpp's key layout.
pub fn write_metadata(w: &mut GgufWriter<'_>, config: &Config) {
    let v = &config.vit;
    let k = |s: &str| format!("depthanything3.{s}");
    let start = |s: Option<usize>| s.map_or(-1, |x| x as i32);
    // depth-anything.cpp's layout: both families under "depthanything3", DA2 told apart by
    // `depthanything3.arch`.
    w.set("general.architecture", "depthanything3");
    w.set(
        k("arch"),
        if config.is_da2() {
            "depthanything2"
        } else {
            "depthanything3"
        },
    );
    w.set(k("checkpoint_name"), config.name.as_str());
    w.set(k("patch_size"), v.patch_size as u32);
    w.set(k("vit.embed_dim"), v.embed_dim as u32);
    w.set(k("vit.depth"), v.depth as u32);
    w.set(k("vit.num_heads"), v.num_heads as u32);
    w.set(k("vit.head_dim"), v.head_dim() as u32);
    w.set(k("vit.mlp_hidden"), v.mlp_hidden as u32);
    w.set(
        k("vit.ffn_type"),
        if v.ffn == super::Ffn::SwiGlu {
            "swiglu"
        } else {
            "mlp"
        },
    );
    w.set(k("vit.num_register_tokens"), 0u32);
    w.set(k("vit.alt_start"), start(v.alt_start));
    w.set(k("vit.rope_start"), start(v.rope_start));
    w.set(k("vit.qknorm_start"), start(v.qknorm_start));
    w.set(k("vit.rope_freq"), v.rope_freq);
    w.set(k("vit.cat_token"), v.cat_token);
    w.set(k("vit.qkv_bias"), true);
    w.set(k("vit.ln_eps"), v.block_ln_eps);
    w.set(k("vit.interpolate_offset"), v.interpolate_offset);
    w.set(k("vit.interpolate_antialias"), false);
    w.set(k("vit.pos_embed_grid"), v.pos_embed_grid as u32);
    w.set(
        k("vit.out_layers"),
        v.out_layers.iter().map(|&x| x as i32).collect::<Vec<i32>>(),
    );
    w.set(k("img.mean"), config.mean.to_vec());
    w.set(k("img.std"), config.std.to_vec());
    match config.family {
        Family::Da3 => {
            w.set(k("img.resize_mode"), "upper_bound_resize");
            w.set(k("img.resize_target"), 504u32);
        }
        Family::Da2 { input_size } => {
            w.set(k("img.resize_mode"), "lower_bound");
            w.set(k("img.resize_target"), input_size as u32);
        }
    }
    let h = &config.head;
    w.set(k("head.features"), h.features as u32);
    w.set(
        k("head.out_channels"),
        h.out_channels
            .iter()
            .map(|&x| x as i32)
            .collect::<Vec<i32>>(),
    );
    w.set(k("head.output_dim"), h.output_dim as u32);
    w.set(k("head.pos_embed"), h.pos_embed);
    w.set(k("head.norm_type"), if h.norm { "layer" } else { "idt" });
    match h.activation {
        DepthActivation::Exp => {
            w.set(k("head.activation"), "exp");
        }
        DepthActivation::Relu => {
            w.set(k("head.activation"), "relu");
        }
        DepthActivation::Sigmoid { max_depth } => {
            w.set(k("head.activation"), "sigmoid");
            w.set(k("head.max_depth"), max_depth);
        }
    }
    if let Some(d) = config.cam_dim {
        w.set(k("cam.dim_in"), d as u32);
    }
    if let Some(g) = config.gaussians {
        w.set(k("gs.output_dim"), g.output_dim() as u32);
        w.set(k("gs.features"), g.features as u32);
        w.set(
            k("gs.out_channels"),
            g.out_channels
                .iter()
                .map(|&x| x as i32)
                .collect::<Vec<i32>>(),
        );
        w.set(k("gs.sh_degree"), g.sh_degree as u32);
        w.set(k("gs.scale_min"), g.scale_min);
        w.set(k("gs.scale_max"), g.scale_max);
        w.set(k("gs.pred_offset_depth"), g.offset_depth);
        w.set(k("gs.pred_offset_xy"), g.offset_xy);
        w.set(k("gs.pred_color"), false);
    }
}

/// The keys depth-anything.cpp's `--with-aux` files carry with the ray branch: present, 6 ray
/// channels (plus confidence), 4 pyramid levels (of which the file holds the finest).
pub fn write_aux_metadata(w: &mut GgufWriter<'_>) {
    let k = |s: &str| format!("depthanything3.{s}");
    w.set(k("head.has_aux"), true);
    w.set(k("head.aux_ray_dim"), super::head::RAY_CHANNELS as u32);
    w.set(k("head.aux_levels"), 4u32);
}

/// Tensor storage types a converted, synthetic or quantised file may use. Except for `F32`,
/// the type applies to the matrix-product weights ([`quantised_weight_names`]) only, as in
/// depth-anything.cpp's files, and f16 and bf16 to the convolution kernels too
/// ([`WeightType::conv_kernel_dtype`]); k-quants fall back to q8_0 where a row is not a multiple of
/// 256, and a block type leaves a matrix whose rows are not a multiple of 32 as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q6K,
    Q5K,
    Q4K,
}

impl std::str::FromStr for WeightType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        WeightType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let names: Vec<&str> = WeightType::ALL.iter().map(|t| t.name()).collect();
                format!("unknown weight type `{s}` ({})", names.join(", "))
            })
    }
}

impl std::fmt::Display for WeightType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl WeightType {
    /// Every type, in the order of [`WeightType::name`]'s list.
    pub const ALL: &'static [WeightType] = &[
        WeightType::F32,
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q6K,
        WeightType::Q5K,
        WeightType::Q4K,
    ];

    /// The types [`quantize`] converts to (all but f32).
    pub const QUANTIZED: &'static [WeightType] = &[
        WeightType::F16,
        WeightType::BF16,
        WeightType::Q8_0,
        WeightType::Q6K,
        WeightType::Q5K,
        WeightType::Q4K,
    ];

    /// The name on the command line: `f32`, `f16`, `bf16`, `q8_0`, `q6_k`, `q5_k`, `q4_k`.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::BF16 => "bf16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q6K => "q6_k",
            WeightType::Q5K => "q5_k",
            WeightType::Q4K => "q4_k",
        }
    }

    /// The ggml type of the matrix weights.
    pub fn dtype(self) -> DType {
        match self {
            WeightType::F32 => DType::F32,
            WeightType::F16 => DType::F16,
            WeightType::BF16 => DType::BF16,
            WeightType::Q8_0 => DType::Q8_0,
            WeightType::Q6K => DType::Q6_K,
            WeightType::Q5K => DType::Q5_K,
            WeightType::Q4K => DType::Q4_K,
        }
    }

    /// The storage type of convolution kernels: the half type of an f16 or bf16 file (which
    /// GPUs then compute on tensor cores, see [`crate::da3::LoadOptions::conv_precision`]),
    /// else f32.
    pub fn conv_kernel_dtype(self) -> DType {
        match self {
            WeightType::F16 => DType::F16,
            WeightType::BF16 => DType::BF16,
            _ => DType::F32,
        }
    }

    /// The storage type of a matrix weight whose rows hold `ne0` values, or `None` where
    /// the type cannot store such rows (and the weight stays as it is).
    pub fn for_row(self, ne0: u64) -> Option<DType> {
        let fits = |t: DType| ne0.is_multiple_of(t.block_size() as u64);
        let target = self.dtype();
        if fits(target) {
            Some(target)
        } else if target.block_size() == 256 && fits(DType::Q8_0) {
            Some(DType::Q8_0)
        } else {
            None
        }
    }
}

/// A GGUF file for `config` whose weights come from `values(official_key, shape)`.
pub fn write_gguf(
    path: &Path,
    config: &Config,
    weight_type: WeightType,
    values: impl FnMut(&str, &[usize]) -> Result<Vec<f32>, Error>,
) -> Result<(), Error> {
    build_gguf(config, weight_type, values)?.write_to(path)?;
    Ok(())
}

/// The GGUF contents for `config`, in memory.
pub fn build_gguf(
    config: &Config,
    weight_type: WeightType,
    mut values: impl FnMut(&str, &[usize]) -> Result<Vec<f32>, Error>,
) -> Result<GgufWriter<'static>, Error> {
    let mut w = GgufWriter::new();
    write_metadata(&mut w, config);
    let tensors = converted_tensors(config)?;
    if tensors.iter().any(|t| t.name.contains("_aux.")) {
        write_aux_metadata(&mut w);
    }
    for t in tensors {
        let data = values(&official_name_in(config.family, &t.name), &t.shape)?;
        let ne: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        let dtype = if t.quantised {
            weight_type.for_row(ne[0]).unwrap_or(DType::F32)
        } else if t.role == Role::ConvKernel {
            weight_type.conv_kernel_dtype()
        } else {
            DType::F32
        };
        let bytes = match dtype {
            DType::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
            other => crate::ggml::quantize(other, &data, ne[0] as usize)?,
        };
        w.add_tensor(t.name, dtype, &ne, bytes)?;
    }
    Ok(w)
}

/// A file with the synthetic weights of [`super::synthetic`] (built-in model, tests, benches).
pub fn write_synthetic(path: &Path, config: &Config, weight_type: WeightType) -> Result<(), Error> {
    write_gguf(path, config, weight_type, |key, shape| {
        Ok(super::synthetic::weight_values(key, shape))
    })
}

/// The built-in default model: `da3-tiny` with synthetic weights, built in memory (no file,
/// no download).
pub fn builtin_model_file() -> Result<crate::gguf::GgufFile, Error> {
    let config = Config::preset("da3-tiny")?;
    let mut bytes = Vec::new();
    build_gguf(&config, WeightType::F32, |key, shape| {
        Ok(super::synthetic::weight_values(key, shape))
    })?
    .write_to_writer(&mut bytes)?;
    Ok(crate::gguf::GgufFile::from_bytes(bytes)?)
}

/// The nested models' two branches: (`model_name`, any-view preset, metric preset).
/// `da3nested-tiny` is the test-size pair, as `da3-tiny` is for single models.
const NESTED: &[(&str, &str, &str)] = &[
    ("da3nested-giant-large", "da3-giant", "da3metric-large"),
    ("da3nested-tiny", "da3-tiny", "da3metric-tiny"),
];

/// Where the metric branch of a nested checkpoint converted to `out` goes: beside it, named
/// `<stem>-metric.gguf` (depth-anything.cpp names its own `...-nested-metric.gguf`).
pub fn nested_metric_path(out: &Path) -> std::path::PathBuf {
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    out.with_file_name(format!("{stem}-metric.gguf"))
}

/// The `model_name` of a checkpoint directory's `config.json`.
fn checkpoint_model_name(dir: &Path) -> Result<String, Error> {
    let config_path = dir.join("config.json");
    let err = |reason: String| Error::Checkpoint {
        path: config_path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&config_path).map_err(|e| err(e.to_string()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| err(format!("not JSON: {e}")))?;
    json.get("model_name")
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .ok_or_else(|| err("no \"model_name\" string".into()))
}

/// The files [`convert_checkpoint`] of `dir` to `out` writes: `out`, and for a nested model
/// its metric branch ([`nested_metric_path`]).
pub fn checkpoint_outputs(dir: &Path, out: &Path) -> Result<Vec<std::path::PathBuf>, Error> {
    let model_name = checkpoint_model_name(dir)?;
    let mut files = vec![out.to_path_buf()];
    if NESTED.iter().any(|(name, ..)| *name == model_name) {
        files.push(nested_metric_path(out));
    }
    Ok(files)
}

/// Converts an official checkpoint directory (`config.json` naming a preset as
/// `{"model_name": "da3-small"}`, `model.safetensors` with `model.`-prefixed keys).
///
/// The nested model (`da3nested-giant-large`, keys under `model.da3.` and
/// `model.da3_metric.`) becomes two files: the any-view branch at `out`, the metric branch at
/// [`nested_metric_path`], which `da3 depth --model OUT --metric-model OUT-metric` pairs.
/// The 1.1 checkpoints (DA3-LARGE-1.1, DA3-GIANT-1.1, DA3NESTED-GIANT-LARGE-1.1) are the same
/// architectures retrained, under the same `model_name`s; a folder named after its model (as
/// Hugging Face downloads are) gives the file its checkpoint name, so `da3 info` tells a 1.1
/// file from a 1.0 one. Returns the checkpoint keys left out.
pub fn convert_checkpoint(
    dir: &Path,
    out: &Path,
    weight_type: WeightType,
) -> Result<Vec<String>, Error> {
    let err = |path: &Path, reason: String| Error::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let config_path = dir.join("config.json");
    let model_name = checkpoint_model_name(dir)?;
    let model_name = model_name.as_str();
    let nested = NESTED.iter().find(|(name, ..)| *name == model_name);
    let branches: Vec<(&str, &str, std::path::PathBuf)> = match nested {
        Some((_, anyview, metric)) => vec![
            ("model.da3.", anyview, out.to_path_buf()),
            ("model.da3_metric.", metric, nested_metric_path(out)),
        ],
        None => vec![("model.", model_name, out.to_path_buf())],
    };
    // The folder's name where it names this model ("DA3-LARGE-1.1"), else the model_name.
    let folder = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()));
    let checkpoint_name = folder
        .filter(|f| {
            let of = |n: &str| Config::preset_for_checkpoint(n);
            of(f).is_some() && of(f) == of(model_name)
        })
        .unwrap_or_else(|| model_name.to_owned());

    let st_path = dir.join("model.safetensors");
    let file = std::fs::File::open(&st_path).map_err(|e| err(&st_path, e.to_string()))?;
    // The checkpoint is read into memory (checkpoints of the presets fit).
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut std::io::BufReader::new(file), &mut bytes)
        .map_err(|e| err(&st_path, e.to_string()))?;
    let tensors = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| err(&st_path, format!("not a safetensors file: {e}")))?;
    let mut skipped: Vec<String> = tensors
        .names()
        .into_iter()
        .filter(|k| !branches.iter().any(|(prefix, ..)| k.starts_with(prefix)))
        .map(str::to_owned)
        .collect();
    let mut written: Vec<&Path> = Vec::new();
    for (prefix, preset, path) in &branches {
        let mut config = Config::preset(preset).map_err(|e| err(&config_path, e.to_string()))?;
        config.name = match (nested.is_some(), *prefix == "model.da3_metric.") {
            (true, true) => format!("{checkpoint_name}-metric"),
            _ => checkpoint_name.clone(),
        };
        match write_branch(&tensors, prefix, &config, path, weight_type, &st_path) {
            Ok(left_out) => skipped.extend(left_out),
            Err(e) => {
                // A conversion that fails writes nothing, not one branch of two.
                for done in written {
                    let _ = std::fs::remove_file(done);
                }
                return Err(e);
            }
        }
        written.push(path);
    }
    skipped.sort();
    Ok(skipped)
}

/// A checkpoint's tensor `key` that the architecture needs and the checkpoint lacks.
fn missing(key: &str) -> String {
    format!("tensor `{key}` is missing")
}

/// The checkpoint's tensor `key` has the `expected` shape of `model`'s architecture.
fn check_shape(key: &str, found: &[usize], expected: &[usize], model: &str) -> Result<(), String> {
    if found == expected {
        Ok(())
    } else {
        Err(format!(
            "tensor `{key}` has shape {found:?}, {model} expects {expected:?}"
        ))
    }
}

/// Writes the model of `config` from the keys of `tensors` under `prefix` to `out`; returns
/// the keys under `prefix` it left out.
fn write_branch(
    tensors: &safetensors::SafeTensors<'_>,
    prefix: &str,
    config: &Config,
    out: &Path,
    weight_type: WeightType,
    st_path: &Path,
) -> Result<Vec<String>, Error> {
    let err = |reason: String| Error::Checkpoint {
        path: st_path.to_path_buf(),
        reason,
    };
    // A tensor the architecture declares under its official name needs no rename entry:
    // adding a tensor to the architecture table is enough for the converter to carry it.
    let declared: std::collections::HashSet<String> = expected_tensors(config)?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let to_gguf = |official: &str| {
        gguf_name(official).or_else(|| declared.contains(official).then(|| official.to_owned()))
    };
    let mut by_gguf = std::collections::HashMap::new();
    let mut skipped = Vec::new();
    for (key, view) in tensors.tensors() {
        let Some(bare) = key.strip_prefix(prefix) else {
            continue;
        };
        match to_gguf(bare) {
            Some(name) => {
                by_gguf.insert(name, (key.clone(), view));
            }
            None => skipped.push(key.clone()),
        }
    }
    let mut written = std::collections::HashSet::new();
    write_gguf(out, config, weight_type, |official, shape| {
        let name = to_gguf(official)
            .ok_or_else(|| err(format!("`{official}` has no GGUF name (a converter bug)")))?;
        written.insert(name.clone());
        let key = format!("{prefix}{official}");
        let (_, view) = by_gguf.get(&name).ok_or_else(|| err(missing(&key)))?;
        check_shape(&key, view.shape(), shape, &config.name).map_err(err)?;
        let data = view.data();
        Ok(match view.dtype() {
            safetensors::Dtype::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            safetensors::Dtype::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            safetensors::Dtype::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(err(format!(
                    "tensor `{prefix}{official}` has type {other:?}; expected f32, f16 or bf16"
                )))
            }
        })
    })?;
    // Mapped names the architecture does not declare (say a field of a newer release).
    skipped.extend(
        by_gguf
            .iter()
            .filter(|(name, _)| !written.contains(*name))
            .map(|(_, (key, _))| key.clone()),
    );
    Ok(skipped)
}

/// The preset of a Depth Anything V2 backbone of width `embed` (its state dict names no size).
fn da2_preset(embed: usize) -> Option<&'static str> {
    match embed {
        64 => Some("da2-tiny"),
        384 => Some("da2-small"),
        768 => Some("da2-base"),
        1024 => Some("da2-large"),
        _ => None,
    }
}

/// The metric models' depth range by their published file names
/// (`depth_anything_v2_metric_hypersim_vits.pth`: indoor, 20 m; `..._vkitti_...`: outdoor,
/// 80 m); `None` for a relative model's name, an error for another metric one.
pub fn da2_max_depth_from_name(name: &str) -> Result<Option<f32>, Error> {
    let lower = name.to_ascii_lowercase();
    if lower.contains("hypersim") {
        Ok(Some(20.0))
    } else if lower.contains("vkitti") {
        Ok(Some(80.0))
    } else if lower.contains("metric") {
        Err(Error::Config(format!(
            "{name} looks like a metric model but names neither hypersim (20 m) nor vkitti \
             (80 m): give its maximum depth"
        )))
    } else {
        Ok(None)
    }
}

/// Converts an official Depth Anything V2 checkpoint (`depth_anything_v2_vits.pth`, ...,
/// PyTorch's zip format, read without Python) to a GGUF file in depth-anything.cpp's DA2
/// layout. The size comes from the backbone's width; a metric model's `max_depth` (metres)
/// from the argument, else from the file name ([`da2_max_depth_from_name`]), else the model is
/// relative. Returns the keys left out (`pretrained.mask_token`, refinenet4's unused unit).
pub fn convert_da2_checkpoint(
    checkpoint: &Path,
    out: &Path,
    weight_type: WeightType,
    max_depth: Option<f32>,
) -> Result<Vec<String>, Error> {
    let err = |reason: String| Error::Checkpoint {
        path: checkpoint.to_path_buf(),
        reason,
    };
    let state = read_state_dict(checkpoint).map_err(err)?;
    let embed = state
        .iter()
        .find(|(k, _)| k == "pretrained.cls_token")
        .and_then(|(_, t)| t.shape.last().copied())
        .ok_or_else(|| {
            err("no `pretrained.cls_token`: not a Depth Anything V2 state dict".into())
        })?;
    let preset = da2_preset(embed).ok_or_else(|| {
        err(format!(
            "a backbone {embed} wide: Depth Anything V2 is 384 (vits), 768 (vitb) or 1024 (vitl)"
        ))
    })?;
    let name = checkpoint
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| preset.to_owned());
    let max_depth = match max_depth {
        Some(m) => Some(m),
        None => da2_max_depth_from_name(&name)?,
    };
    let mut config = Config::preset(preset)?;
    config.name = name;
    if let Some(max_depth) = max_depth {
        if !(max_depth.is_finite() && max_depth > 0.0) {
            return Err(err(format!(
                "maximum depth {max_depth}: a positive number of metres"
            )));
        }
        config.head.activation = DepthActivation::Sigmoid { max_depth };
    }
    let family = config.family;
    let mut by_gguf: std::collections::HashMap<String, (String, PthTensor)> = state
        .into_iter()
        .map(|(key, t)| {
            let gguf = gguf_name_in(family, &key).unwrap_or_else(|| key.clone());
            (gguf, (key, t))
        })
        .collect();
    write_gguf(out, &config, weight_type, |official, shape| {
        let gguf = gguf_name_in(family, official).unwrap_or_else(|| official.to_owned());
        let (_, t) = by_gguf
            .remove(&gguf)
            .ok_or_else(|| err(missing(official)))?;
        check_shape(official, &t.shape, shape, &config.name).map_err(err)?;
        Ok(t.values)
    })?;
    let mut skipped: Vec<String> = by_gguf.into_values().map(|(key, _)| key).collect();
    skipped.sort();
    Ok(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published DA2 file names say which metric model they are.
    #[test]
    fn a_da2_file_name_gives_its_metric_range() {
        let of = |n: &str| da2_max_depth_from_name(n).map_err(|e| e.to_string());
        assert_eq!(of("depth_anything_v2_vits"), Ok(None));
        assert_eq!(of("depth_anything_v2_metric_hypersim_vitb"), Ok(Some(20.0)));
        assert_eq!(of("Depth_Anything_V2_Metric_VKITTI_vitl"), Ok(Some(80.0)));
        let unknown = of("depth_anything_v2_metric_custom_vits").unwrap_err();
        assert!(
            unknown.contains("hypersim") && unknown.contains("vkitti"),
            "{unknown}"
        );
        assert_eq!(da2_preset(384), Some("da2-small"));
        assert_eq!(da2_preset(1536), None, "no giant DA2 is published");
    }

    #[test]
    fn a_misshapen_tensor_names_both_shapes() {
        assert!(check_shape("k", &[2, 3], &[2, 3], "m").is_ok());
        let e = check_shape("model.x", &[3, 2], &[2, 3], "da3-tiny").unwrap_err();
        assert_eq!(
            e,
            "tensor `model.x` has shape [3, 2], da3-tiny expects [2, 3]"
        );
    }
}
