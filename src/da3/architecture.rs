//! The architecture as data: every tensor a configuration's model holds, with its PyTorch shape,
//! its role and the transforms the loader may apply to it, in one table ([`tensors`]).
//!
//! The table is the one place a tensor of the architecture is declared. The loader checks a
//! file against it and places its tensors on a device ([`super::weights::Loader`]); sessions
//! build their layers by looking names up in the loaded weights; the converter writes a file
//! of exactly these tensors, storing them as [`TensorSpec::quantised`] and [`Role::ConvKernel`]
//! say, and `da3 quantize` and `da3 info` read the same roles.

use super::config::{Config, Ffn, FileLayout, GaussianConfig, HeadKind, VitConfig};
use super::head::RAY_CHANNELS;
use super::weight_error::WeightError;
use super::Error;
use crate::gguf::GgufFile;
use std::sync::Arc;

/// How a tensor is used, which decides the types it may have on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The weight of a linear layer, the first operand of a matrix product: kept in the file's
    /// type (f32, f16, q8_0, ...), packed for the CPU kernels where the plan says so.
    Matmul,
    /// Everything else on the device (norms, biases, tokens): converted to f32.
    F32,
    /// A convolution kernel: f32, or f16 as [`super::weights::Loader::conv_kernels`] says.
    ConvKernel,
    /// Read as f32 on the host only, never placed on the device (the positional embedding,
    /// resampled per resolution). Its shape is checked by its number of values.
    Host,
}

/// Outputs of a linear layer computed with their mean subtracted: the first `rows` outputs,
/// in runs of `group` (attention heads), each run's mean over its outputs taken out of the
/// weight and the bias at load. A LayerNorm over such a run then equals an RMS norm of it,
/// which ggml's GPU backends fuse with the scale and shift after it into one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CentredOutputs {
    /// How many of the first outputs are centred.
    pub rows: usize,
    /// The length of each run whose mean is taken out.
    pub group: usize,
}

/// What may be folded into a linear layer at load (where the plan folds, see
/// [`super::weights::Loader::fold_affine`]), recorded on the layer's weight. With `W` [out, in]
/// and bias `b`, a LayerNorm `n * g + s` before and a LayerScale `l` after:
/// `l * (W (n * g + s) + b) = W' n + b'`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fold {
    /// The LayerNorm before the layer: the prefix of its `.weight` and `.bias`.
    pub norm_before: Option<String>,
    /// The LayerScale after the layer: a vector of the outputs.
    pub scale_after: Option<String>,
    /// Outputs the layer centres when it folds and the plan centres QK-normed heads
    /// ([`super::weights::Loader::centre_qk_heads`]).
    pub centrable: Option<CentredOutputs>,
}

impl Fold {
    /// The folded vectors, each with whether it spans the layer's inputs (else its outputs).
    pub fn vectors(&self) -> Vec<(String, bool)> {
        let mut v = Vec::new();
        if let Some(norm) = &self.norm_before {
            v.push((format!("{norm}.weight"), true));
            v.push((format!("{norm}.bias"), true));
        }
        if let Some(scale) = &self.scale_after {
            v.push((scale.clone(), false));
        }
        v
    }
}

/// One tensor of the architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorSpec {
    /// The architecture's name (a file of the nested model's metric branch prefixes it, see
    /// [`FileLayout`]).
    pub name: String,
    /// PyTorch shape, outermost first (files store ggml order, the reverse).
    pub shape: Vec<usize>,
    /// How it is used.
    pub role: Role,
    /// Stored in the file's weight type by the converter and by `da3 quantize`: the linear
    /// weights depth-anything.cpp's quantizer converts. Every other tensor but the
    /// convolution kernels stays f32.
    pub quantised: bool,
    /// Of a linear layer's weight: the norm and layer scale that may be folded into the layer
    /// (its weight and its `.bias`).
    pub fold: Option<Fold>,
    /// The order its rows are stored in where the plan lays rotated heads out for one
    /// vision-mode RoPE node ([`super::weights::Loader::vision_rope`]): row `i` stored is row
    /// `order[i]` of the file's, a row being one of `order.len()` equal runs of its data.
    pub vision_rope_rows: Option<Arc<[usize]>>,
}

impl TensorSpec {
    /// The tensor's number of values.
    pub fn values(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The optional parts of a model, which files may or may not hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts {
    /// The camera decoder (DualDPT models) and its width.
    pub camera_decoder: Option<usize>,
    /// The camera encoder (known poses in), beside a camera decoder.
    pub camera_encoder: bool,
    /// The DualDPT ray branch.
    pub ray_head: bool,
    /// The 3D Gaussian head ([`Config::gaussians`]).
    pub gaussian_head: bool,
}

/// Tensors that official DPT checkpoints (and depth-anything.cpp's DA2 files) carry and no
/// forward computes with: the coarsest fusion block's lateral unit, which has no lateral input.
/// The table leaves them out; a file that holds them loads with them unused, unwarned.
pub(crate) const UNCOMPUTED_IN_CHECKPOINTS: &[&str] =
    &["head.scratch.rn4.rc1.", "gs.scratch.rn4.rc1."];

/// A tensor every camera encoder has.
pub const CAMERA_ENCODER_PROBE: &str = "cam_enc.token_norm.weight";
/// A tensor every camera decoder has; its width is the decoder's.
const CAMERA_DECODER_PROBE: &str = "cam.bb0.weight";
/// A tensor every ray branch has.
const RAY_HEAD_PROBE: &str = "head.scratch.rn1_aux.rc2.c1.weight";
/// A tensor every 3D Gaussian head has.
pub const GAUSSIAN_HEAD_PROBE: &str = "gs.scratch.out2b.weight";

impl Parts {
    /// The parts a file converted for `config` holds: for DualDPT models the ray branch, and
    /// with a camera decoder (`cam_dim`) the camera encoder too (the official models with one
    /// have the other), and the 3D Gaussian head where the architecture has one.
    pub fn of_config(config: &Config) -> Parts {
        let dual = config.head.kind == HeadKind::DualDpt;
        let camera_decoder = config.cam_dim.filter(|_| dual);
        Parts {
            camera_decoder,
            camera_encoder: camera_decoder.is_some(),
            ray_head: dual,
            gaussian_head: dual && config.gaussians.is_some(),
        }
    }

    /// The parts `file` holds of a model of `config`, the camera encoder only where
    /// `camera_encoder` asks for it (and the model has a camera token for it). The camera
    /// decoder's width comes from its weights: files write `cam.dim_in` as 1536 for every
    /// variant.
    /// The 3D Gaussian head likewise, where `gaussian_head` asks for it.
    pub fn of_file(
        file: &GgufFile,
        config: &Config,
        camera_encoder: bool,
        gaussian_head: bool,
    ) -> Result<Parts, Error> {
        let layout = FileLayout::of(file);
        // PyTorch's order, outermost first.
        let shape = |name: &str| {
            file.tensor(&layout.file_name(name)).map(|t| {
                t.shape()
                    .iter()
                    .rev()
                    .map(|&d| d as usize)
                    .collect::<Vec<_>>()
            })
        };
        let dual = config.head.kind == HeadKind::DualDpt;
        let camera_decoder = match shape(CAMERA_DECODER_PROBE) {
            Some(s) if dual => Some(s[s.len() - 1]),
            _ => None,
        };
        if let Some(width) = camera_decoder {
            if width != config.vit.feature_dim() {
                return Err(WeightError::Other(format!(
                    "camera decoder width {width} does not match the feature width {}",
                    config.vit.feature_dim()
                ))
                .into());
            }
        }
        // The encoder feeds the camera token slot: only models with one (and a decoder) use it.
        let encoder_shape = shape(CAMERA_ENCODER_PROBE).filter(|_| {
            camera_encoder && camera_decoder.is_some() && config.vit.alt_start.is_some()
        });
        if let Some(got) = &encoder_shape {
            let e = config.vit.embed_dim;
            if got != &[e] {
                return Err(WeightError::TensorShape {
                    name: CAMERA_ENCODER_PROBE.into(),
                    expected: vec![e],
                    got: got.clone(),
                }
                .into());
            }
        }
        Ok(Parts {
            camera_decoder,
            camera_encoder: encoder_shape.is_some(),
            ray_head: dual && shape(RAY_HEAD_PROBE).is_some(),
            gaussian_head: gaussian_head
                && dual
                && config.gaussians.is_some()
                && shape(GAUSSIAN_HEAD_PROBE).is_some(),
        })
    }
}

/// The official `CameraEnc` defaults the presets keep (`trunk_depth`, `num_heads`,
/// `mlp_ratio`), every LayerNorm with PyTorch's default epsilon.
const CAMERA_ENCODER_DEPTH: usize = 4;
const CAMERA_ENCODER_HEADS: usize = 16;
const CAMERA_ENCODER_LN_EPS: f32 = 1e-5;

/// The transformer of the camera encoder beside a backbone of `vit`: four blocks of its
/// width, 16 heads, MLP ratio 4, LayerScale, no RoPE, no QK-norm.
pub(crate) fn camera_encoder_vit(vit: &VitConfig) -> VitConfig {
    VitConfig {
        depth: CAMERA_ENCODER_DEPTH,
        num_heads: CAMERA_ENCODER_HEADS,
        mlp_hidden: 4 * vit.embed_dim,
        ffn: Ffn::Mlp,
        alt_start: None,
        rope_start: None,
        qknorm_start: None,
        block_ln_eps: CAMERA_ENCODER_LN_EPS,
        final_ln_eps: CAMERA_ENCODER_LN_EPS,
        ..vit.clone()
    }
}

/// The ray branch's output convolutions: the last (finest) level only, as the official forward
/// returns it, (inputs, outputs) of each 3x3 convolution for `features` channels.
pub(crate) fn ray_output_widths(features: usize) -> [(usize, usize); 5] {
    let f = features;
    [(f, f / 2), (f / 2, f), (f, f / 2), (f / 2, f), (f, f / 2)]
}

/// Every tensor of a model of `config` with `parts`, in the order files store them.
pub fn tensors(config: &Config, parts: &Parts) -> Result<Vec<TensorSpec>, Error> {
    let mut t = Table::default();
    t.backbone(&config.vit);
    t.head(config);
    if let Some(width) = parts.camera_decoder {
        t.camera_decoder(width);
    }
    if parts.camera_encoder {
        t.camera_encoder(&config.vit)?;
    }
    if parts.ray_head {
        t.ray_head(config.head.features);
    }
    if let (true, Some(gs)) = (parts.gaussian_head, &config.gaussians) {
        t.gaussian_head(config.vit.feature_dim(), gs);
    }
    let v = &config.vit;
    let n_pos = v.pos_embed_grid * v.pos_embed_grid + 1;
    t.push(
        "vit.pos_embed".into(),
        vec![1, n_pos, v.embed_dim],
        Role::Host,
    );
    Ok(t.0)
}

/// A linear layer's options beyond its width.
#[derive(Default)]
struct LinearOptions {
    quantised: bool,
    fold: Option<Fold>,
    vision_rope_rows: Option<Arc<[usize]>>,
}

/// The table being written.
#[derive(Default)]
struct Table(Vec<TensorSpec>);

impl Table {
    fn push(&mut self, name: String, shape: Vec<usize>, role: Role) -> &mut TensorSpec {
        self.0.push(TensorSpec {
            name,
            shape,
            role,
            quantised: false,
            fold: None,
            vision_rope_rows: None,
        });
        self.0.last_mut().expect("just pushed")
    }

    /// `{prefix}.weight` [n_out, n_in] and `{prefix}.bias` [n_out].
    fn linear(&mut self, prefix: &str, n_in: usize, n_out: usize, options: LinearOptions) {
        let rows = options.vision_rope_rows;
        let weight = self.push(format!("{prefix}.weight"), vec![n_out, n_in], Role::Matmul);
        weight.quantised = options.quantised;
        weight.fold = options.fold;
        weight.vision_rope_rows = rows.clone();
        self.push(format!("{prefix}.bias"), vec![n_out], Role::F32)
            .vision_rope_rows = rows;
    }

    /// A LayerNorm's `{prefix}.weight` and `{prefix}.bias`, [dim] each.
    fn norm(&mut self, prefix: &str, dim: usize, vision_rope_rows: Option<Arc<[usize]>>) {
        for field in ["weight", "bias"] {
            self.push(format!("{prefix}.{field}"), vec![dim], Role::F32)
                .vision_rope_rows = vision_rope_rows.clone();
        }
    }

    /// A square convolution's kernel [n_out, n_in, k, k] and bias [n_out], if it has one.
    fn conv(&mut self, prefix: &str, n_in: usize, n_out: usize, kernel: usize, bias: bool) {
        let shape = vec![n_out, n_in, kernel, kernel];
        self.push(format!("{prefix}.weight"), shape, Role::ConvKernel);
        if bias {
            self.push(format!("{prefix}.bias"), vec![n_out], Role::F32);
        }
    }

    /// A transposed convolution (kernel == stride), PyTorch weights [n_in, n_out, k, k].
    fn conv_transpose(&mut self, prefix: &str, n_in: usize, n_out: usize, kernel: usize) {
        let shape = vec![n_in, n_out, kernel, kernel];
        self.push(format!("{prefix}.weight"), shape, Role::F32);
        self.push(format!("{prefix}.bias"), vec![n_out], Role::F32);
    }

    fn backbone(&mut self, cfg: &VitConfig) {
        let (e, p) = (cfg.embed_dim, cfg.patch_size);
        for i in 0..cfg.depth {
            self.block(cfg, &format!("vit.blk.{i}"), i);
        }
        self.push("vit.patch_embed.weight".into(), vec![e, 3, p, p], Role::F32);
        self.push("vit.patch_embed.bias".into(), vec![e], Role::F32);
        self.push("vit.cls_token".into(), vec![1, 1, e], Role::F32);
        if cfg.alt_start.is_some() {
            self.push("vit.camera_token".into(), vec![1, 2, e], Role::F32);
        }
        self.norm("vit.norm", e, None);
    }

    /// Block `i` of a stack shaped by `cfg`, its tensors under `p`. Each norm's scale and
    /// shift may fold into the layer after it and each layer scale into the layer before.
    fn block(&mut self, cfg: &VitConfig, p: &str, i: usize) {
        let (e, d) = (cfg.embed_dim, cfg.head_dim());
        let (norm1, norm2) = (format!("{p}.norm1"), format!("{p}.norm2"));
        let (ls1, ls2) = (format!("{p}.ls1"), format!("{p}.ls2"));
        let after = |norm: &str| Fold {
            norm_before: Some(norm.to_owned()),
            ..Fold::default()
        };
        let before = |scale: &str| Fold {
            scale_after: Some(scale.to_owned()),
            ..Fold::default()
        };
        let rotates = cfg.rope_start.is_some_and(|s| i >= s);
        let has_qk_norm = cfg.qknorm_start.is_some_and(|start| i >= start);
        // Rotated heads laid out for vision-mode RoPE need quarters (see `backbone`).
        let (qkv_rows, head_rows) = match rotates && d.is_multiple_of(4) {
            true => (
                Some(vision_rope_qkv_order(e, d)),
                Some(vision_rope_head_order(d)),
            ),
            false => (None, None),
        };
        if has_qk_norm {
            self.norm(&format!("{p}.attn_qnorm"), d, head_rows.clone());
            self.norm(&format!("{p}.attn_knorm"), d, head_rows);
        }
        let (ffn_in, ffn_out, hidden_out) = match cfg.ffn {
            Ffn::Mlp => ("mlp_fc1", "mlp_fc2", cfg.mlp_hidden),
            Ffn::SwiGlu => ("mlp_w12", "mlp_w3", 2 * cfg.mlp_hidden),
        };
        let quantised = |fold| LinearOptions {
            quantised: true,
            fold: Some(fold),
            vision_rope_rows: None,
        };
        self.linear(
            &format!("{p}.{ffn_in}"),
            e,
            hidden_out,
            quantised(after(&norm2)),
        );
        self.linear(
            &format!("{p}.{ffn_out}"),
            cfg.mlp_hidden,
            e,
            quantised(before(&ls2)),
        );
        self.norm(&norm1, e, None);
        // A folded block's QK-norm is an RMS norm of heads the QKV layer centres.
        let qkv_fold = Fold {
            centrable: has_qk_norm.then_some(CentredOutputs {
                rows: 2 * e,
                group: d,
            }),
            ..after(&norm1)
        };
        let qkv = LinearOptions {
            vision_rope_rows: qkv_rows,
            ..quantised(qkv_fold)
        };
        self.linear(&format!("{p}.attn_qkv"), e, 3 * e, qkv);
        self.linear(&format!("{p}.attn_proj"), e, e, quantised(before(&ls1)));
        self.push(ls1, vec![e], Role::F32);
        self.norm(&norm2, e, None);
        self.push(ls2, vec![e], Role::F32);
    }

    fn head(&mut self, config: &Config) {
        let cfg = &config.head;
        let dim_in = config.vit.feature_dim();
        if cfg.norm {
            self.norm("head.norm", dim_in, None);
        }
        self.dpt("head", dim_in, cfg.features, cfg.out_channels);
        if cfg.sky {
            let f = cfg.features;
            self.conv("head.scratch.sky_out2a", f / 2, 32, 3, true);
            self.conv("head.scratch.sky_out2b", 32, 1, 1, true);
        }
        self.dpt_output("head", cfg.features, cfg.output_dim);
    }

    /// A DPT's projections, resizes and fusion chain under `p`, from features of `dim_in`.
    fn dpt(&mut self, p: &str, dim_in: usize, f: usize, oc: [usize; 4]) {
        for (s, &channels) in oc.iter().enumerate() {
            self.conv(&format!("{p}.proj.{s}"), dim_in, channels, 1, true);
        }
        self.conv_transpose(&format!("{p}.resize.0"), oc[0], oc[0], 4);
        self.conv_transpose(&format!("{p}.resize.1"), oc[1], oc[1], 2);
        self.conv(&format!("{p}.resize.3"), oc[3], oc[3], 3, true);
        for (s, &channels) in oc.iter().enumerate() {
            self.conv(
                &format!("{p}.scratch.layer{}_rn", s + 1),
                channels,
                f,
                3,
                false,
            );
        }
        for k in 1..=4 {
            self.fusion(&format!("{p}.scratch.rn{k}"), k, f);
        }
    }

    /// A DPT's output convolutions under `p`: `f` -> `f / 2` -> 32 -> `output_dim`.
    fn dpt_output(&mut self, p: &str, f: usize, output_dim: usize) {
        self.conv(&format!("{p}.scratch.out1"), f, f / 2, 3, true);
        self.conv(&format!("{p}.scratch.out2a"), f / 2, 32, 3, true);
        self.conv(&format!("{p}.scratch.out2b"), 32, output_dim, 1, true);
    }

    /// The 3D Gaussian head (`GSDPT`): a DPT without a norm over the backbone's features, and
    /// three convolutions of the image (3 -> f/8 -> f/4 -> f/2) added to its upsampled map.
    fn gaussian_head(&mut self, dim_in: usize, g: &GaussianConfig) {
        let f = g.features;
        self.dpt("gs", dim_in, f, g.out_channels);
        for (i, (n_in, n_out)) in [(3, f / 8), (f / 8, f / 4), (f / 4, f / 2)]
            .into_iter()
            .enumerate()
        {
            self.conv(&format!("gs.merger.{i}"), n_in, n_out, 3, true);
        }
        self.dpt_output("gs", f, g.output_dim());
    }

    /// Fusion block `k` (the coarsest, 4, has no lateral unit) of width `f` under `p`.
    fn fusion(&mut self, p: &str, k: usize, f: usize) {
        let units: &[&str] = if k == 4 { &["rc2"] } else { &["rc1", "rc2"] };
        for unit in units {
            self.conv(&format!("{p}.{unit}.c1"), f, f, 3, true);
            self.conv(&format!("{p}.{unit}.c2"), f, f, 3, true);
        }
        self.conv(&format!("{p}.out"), f, f, 1, true);
    }

    /// The camera decoder of width `d`: pose encoding (t, quaternion, fov) from the camera token.
    fn camera_decoder(&mut self, d: usize) {
        for (name, n_out) in [
            ("bb0", d),
            ("bb2", d),
            ("fc_t", 3),
            ("fc_q", 4),
            ("fc_fov", 2),
        ] {
            let options = LinearOptions {
                quantised: true,
                ..LinearOptions::default()
            };
            self.linear(&format!("cam.{name}"), d, n_out, options);
        }
    }

    /// The camera encoder: the 9-value pose encoding through an MLP (9 -> E/2 -> E), a
    /// LayerNorm, transformer blocks and a final LayerNorm.
    fn camera_encoder(&mut self, vit: &VitConfig) -> Result<(), Error> {
        let cfg = camera_encoder_vit(vit);
        let e = cfg.embed_dim;
        if !e.is_multiple_of(cfg.num_heads) {
            return Err(WeightError::Other(format!(
                "camera encoder width {e} is not a multiple of its {} heads",
                cfg.num_heads
            ))
            .into());
        }
        for i in 0..cfg.depth {
            self.block(&cfg, &format!("cam_enc.blk.{i}"), i);
        }
        // Its 9-input first layer stays f32, as depth-anything.cpp's quantizer leaves it.
        self.linear("cam_enc.pose.fc1", 9, e / 2, LinearOptions::default());
        self.linear("cam_enc.pose.fc2", e / 2, e, LinearOptions::default());
        self.norm("cam_enc.token_norm", e, None);
        self.norm("cam_enc.trunk_norm", e, None);
        Ok(())
    }

    /// The DualDPT ray branch, named as depth-anything.cpp's `--with-aux` files name it: its
    /// own fusion chain, then the last level's output convolutions.
    fn ray_head(&mut self, f: usize) {
        for k in 1..=4 {
            self.fusion(&format!("head.scratch.rn{k}_aux"), k, f);
        }
        for (j, (n_in, n_out)) in ray_output_widths(f).into_iter().enumerate() {
            self.conv(&format!("head.scratch.out1_aux.{j}"), n_in, n_out, 3, true);
        }
        self.conv("head.scratch.out2a_aux", f / 2, 32, 3, true);
        self.norm("head.scratch.out2_aux_ln", 32, None);
        self.conv("head.scratch.out2b_aux", 32, RAY_CHANNELS + 1, 1, true);
    }
}

/// The stored order of a head's `d` values for vision-mode RoPE: quarters 0, 2, 1, 3. DA3
/// rotates the first half of each head by the token's row and the second by its column, each
/// half in rotate-half pairs `(i, i + D/4)`; with the second and third quarters swapped, the
/// pairs are `(i, i + D/2)`, one node of ggml's vision mode. Attention scores do not change
/// when Q and K permute alike.
fn vision_head_order(d: usize) -> impl Fn(usize) -> usize {
    move |i| [0, 2, 1, 3][i / (d / 4)] * (d / 4) + i % (d / 4)
}

/// The vision-mode order of a QK-norm's `d` values.
fn vision_rope_head_order(d: usize) -> Arc<[usize]> {
    (0..d).map(vision_head_order(d)).collect()
}

/// The vision-mode order of a QKV layer's `3 e` outputs (q|k|v, head, dim): Q's and K's
/// heads reordered, V's as they are.
fn vision_rope_qkv_order(e: usize, d: usize) -> Arc<[usize]> {
    let head = vision_head_order(d);
    (0..3 * e)
        .map(|r| match r < 2 * e {
            true => r / d * d + head(r % d),
            false => r,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique, and each part of the architecture is where its options say.
    #[test]
    fn every_preset_declares_each_tensor_once() {
        for preset in super::super::config::PRESETS {
            let config = Config::preset(preset).unwrap();
            let table = tensors(&config, &Parts::of_config(&config)).unwrap();
            let mut names: Vec<&str> = table.iter().map(|t| t.name.as_str()).collect();
            names.sort_unstable();
            let n = names.len();
            names.dedup();
            assert_eq!(names.len(), n, "{preset}: a name declared twice");
            let dual = config.head.kind == HeadKind::DualDpt;
            let has = |name: &str| table.iter().any(|t| t.name == name);
            assert_eq!(has(RAY_HEAD_PROBE), dual, "{preset}");
            assert_eq!(has(CAMERA_DECODER_PROBE), config.cam_dim.is_some() && dual);
            assert_eq!(has(CAMERA_ENCODER_PROBE), config.cam_dim.is_some() && dual);
            assert_eq!(has(GAUSSIAN_HEAD_PROBE), config.gaussians.is_some());
        }
    }

    /// The vision-mode order swaps each head's middle quarters, and only Q's and K's.
    #[test]
    fn vision_rope_orders_swap_the_middle_quarters() {
        assert_eq!(&*vision_rope_head_order(8), &[0, 1, 4, 5, 2, 3, 6, 7]);
        let qkv = vision_rope_qkv_order(8, 4);
        assert_eq!(&qkv[..8], &[0, 2, 1, 3, 4, 6, 5, 7]);
        assert_eq!(&qkv[16..], &(16..24).collect::<Vec<_>>()[..]);
    }
}
