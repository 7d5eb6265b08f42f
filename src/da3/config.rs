//! Hyperparameters: one preset per official variant, read back from GGUF metadata.

use super::Error;
use crate::gguf::GgufFile;
use std::borrow::Cow;

/// How a file names its metadata keys and tensors. depth-anything.cpp writes the metric branch
/// of the nested model (DA3NESTED-GIANT-LARGE, `convert_nested_to_gguf.py`) as a file of its
/// own whose keys and tensors sit under `m_vit.` / `m_head.` instead of `vit.` / `head.`;
/// everything else about it is a metric-large file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileLayout {
    /// `vit.*` / `head.*`: every standalone model.
    Standard,
    /// `m_vit.*` / `m_head.*`: the nested model's metric branch.
    NestedMetric,
}

impl FileLayout {
    /// The layout of `file`: nested-metric when its backbone keys or tensors are under `m_vit.`.
    pub fn of(file: &GgufFile) -> FileLayout {
        let nested = file.get("depthanything3.m_vit.embed_dim").is_some()
            || file.tensors().iter().any(|t| t.name.starts_with("m_vit."));
        if nested {
            FileLayout::NestedMetric
        } else {
            FileLayout::Standard
        }
    }

    /// The file's name for the architecture's key or tensor `name` (`vit.blocks.0.norm1.weight`,
    /// `head.features`, ...).
    pub fn file_name(self, name: &str) -> Cow<'_, str> {
        if self == FileLayout::NestedMetric {
            for (ours, theirs) in [("vit.", "m_vit."), ("head.", "m_head.")] {
                if let Some(rest) = name.strip_prefix(ours) {
                    return Cow::Owned(format!("{theirs}{rest}"));
                }
            }
        }
        Cow::Borrowed(name)
    }
}

/// The feed-forward block of the backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ffn {
    /// fc1 -> exact GELU -> fc2.
    Mlp,
    /// w12 -> split -> silu(a) * b -> w3 (DINOv2 giant).
    SwiGlu,
}

/// The dense head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadKind {
    /// Depth + confidence (and a ray branch this crate skips); features are concat(local, x).
    DualDpt,
    /// Depth + sky (mono / metric models).
    Dpt,
}

/// What the head's last convolution goes through: what the network's output means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DepthActivation {
    /// `exp`: depth (DA3; up to scale for the any-view and mono models, focal-normalised
    /// metres for the metric one).
    Exp,
    /// ReLU: Depth Anything V2's relative output, an affine-invariant disparity (larger is
    /// nearer), not a depth.
    Relu,
    /// `sigmoid * max_depth`: Depth Anything V2's metric output, depth in metres up to
    /// `max_depth` (20 for the indoor Hypersim models, 80 for the outdoor VKITTI ones).
    Sigmoid {
        /// The depth a sigmoid of 1 stands for, in metres.
        max_depth: f32,
    },
}

/// The model family, which decides the preprocessing and what a request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Depth Anything 3: the official `InputProcessor` (the request's resize method, the
    /// longest side to the process resolution, 504 by default).
    Da3,
    /// Depth Anything V2: one image at a time, its `image2tensor` (the shortest side to at
    /// least `input_size`, 518 by default, one bicubic resize of the float image); no camera,
    /// confidence, sky or multi-view.
    Da2 {
        /// The shortest side the image is resized to (at least), as `infer_image`'s
        /// `input_size`.
        input_size: usize,
    },
}

/// DA2's default `input_size` (`infer_image(raw_image, input_size=518)`).
pub const DA2_INPUT_SIZE: usize = 518;

/// Backbone (DINOv2 with DA3's camera token, 2D RoPE, QK-norm and alternating attention).
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    /// Token width (384 for small, 768 base, 1024 large, 1536 giant).
    pub embed_dim: usize,
    /// Number of transformer blocks.
    pub depth: usize,
    /// Attention heads per block (`embed_dim` is a multiple of it).
    pub num_heads: usize,
    /// Hidden width of the feed-forward block.
    pub mlp_hidden: usize,
    /// Which feed-forward block the blocks use.
    pub ffn: Ffn,
    /// First block of alternating local/global attention (camera token inserted before it).
    pub alt_start: Option<usize>,
    /// First block applying 2D RoPE to q and k (`None`: no RoPE).
    pub rope_start: Option<usize>,
    /// First block with LayerNorm on q and k (`None`: none).
    pub qknorm_start: Option<usize>,
    /// RoPE base frequency.
    pub rope_freq: f32,
    /// Head input is concat(local_x, norm(x)) (DualDPT models).
    pub cat_token: bool,
    /// The four blocks (0-based, increasing) whose outputs feed the head.
    pub out_layers: [usize; 4],
    /// Side of a square patch, in pixels (14); image sides are multiples of it.
    pub patch_size: usize,
    /// The pretrained positional grid is `pos_embed_grid` x `pos_embed_grid` (+ cls).
    pub pos_embed_grid: usize,
    /// DINOv2's `interpolate_offset` for resampling the positional grid (0.1; 0: by size).
    pub interpolate_offset: f32,
    /// LayerNorm epsilon inside the blocks.
    pub block_ln_eps: f32,
    /// LayerNorm epsilon of the q/k norms.
    pub qk_ln_eps: f32,
    /// Epsilon of the backbone's final LayerNorm.
    pub final_ln_eps: f32,
}

impl VitConfig {
    /// Width of one attention head (`embed_dim / num_heads`).
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads
    }
    /// Width of each feature the head receives.
    pub fn feature_dim(&self) -> usize {
        if self.cat_token {
            2 * self.embed_dim
        } else {
            self.embed_dim
        }
    }
}

/// The dense prediction head (DPT or DualDPT).
#[derive(Debug, Clone, PartialEq)]
pub struct HeadConfig {
    /// Which head.
    pub kind: HeadKind,
    /// Channel width of the fusion layers (even).
    pub features: usize,
    /// Channels of the four projected feature maps (the first is upsampled 4x, the last halved).
    pub out_channels: [usize; 4],
    /// 2 (depth, confidence) for DualDPT, 1 for DPT.
    pub output_dim: usize,
    /// Adds 0.1 x the UV sin/cos embedding to the projected features and the upsampled map.
    pub pos_embed: bool,
    /// LayerNorm on the features before projection (DualDPT: always).
    pub norm: bool,
    /// Has a sky branch (mono and metric models).
    pub sky: bool,
    /// Epsilon of the head's LayerNorm.
    pub ln_eps: f32,
    /// What the depth channel goes through.
    pub activation: DepthActivation,
}

/// The 3D Gaussian head (DA3-GIANT's `gs_head`, a DPT of its own over the backbone's features
/// and the image) and what its raw output means (the official `GaussianAdapter`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianConfig {
    /// Channel width of its fusion layers.
    pub features: usize,
    /// Channels of its four projected feature maps.
    pub out_channels: [usize; 4],
    /// Degree of each colour channel's spherical harmonics (2: nine coefficients).
    pub sh_degree: usize,
    /// Whether the first two raw channels move each Gaussian off its pixel centre (in pixels).
    pub offset_xy: bool,
    /// Whether the last raw channel is added to the depth.
    pub offset_depth: bool,
    /// The range a sigmoid maps the three scale channels to (before depth and focal).
    pub scale_min: f32,
    pub scale_max: f32,
}

impl GaussianConfig {
    /// DA3-GIANT's (`configs/da3-giant.yaml`).
    pub const GIANT: GaussianConfig = GaussianConfig {
        features: 256,
        out_channels: [256, 512, 1024, 1024],
        sh_degree: 2,
        offset_xy: true,
        offset_depth: true,
        scale_min: 1e-5,
        scale_max: 30.0,
    };

    /// Spherical-harmonic coefficients per colour channel.
    pub fn sh_coefficients(&self) -> usize {
        (self.sh_degree + 1) * (self.sh_degree + 1)
    }

    /// The raw channels before the opacity: xy offset, 3 scales, a quaternion, 3 x the SH
    /// coefficients, depth offset (the official adapter's `d_in`).
    pub fn raw_channels(&self) -> usize {
        2 * self.offset_xy as usize
            + 3
            + 4
            + 3 * self.sh_coefficients()
            + self.offset_depth as usize
    }

    /// The head's output channels: the raw ones and the opacity logit.
    pub fn output_dim(&self) -> usize {
        self.raw_channels() + 1
    }
}

/// A whole model's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Preset name ("da3-small", "da3mono-large", ...), or the file's checkpoint name.
    pub name: String,
    /// Depth Anything 3 or V2.
    pub family: Family,
    /// The backbone.
    pub vit: VitConfig,
    /// The dense head.
    pub head: HeadConfig,
    /// Camera decoder width (DualDPT models), for pose.
    pub cam_dim: Option<usize>,
    /// The 3D Gaussian head of the architecture (DA3-GIANT's); whether a file holds it is
    /// [`super::architecture::Parts::gaussian_head`].
    pub gaussians: Option<GaussianConfig>,
    /// Per-channel normalisation mean, RGB, for pixel values in 0..1.
    pub mean: [f32; 3],
    /// Per-channel normalisation standard deviation, RGB, for pixel values in 0..1.
    pub std: [f32; 3],
}

const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// The preset names [`Config::preset`] knows.
pub const PRESETS: &[&str] = &[
    "da3-small",
    "da3-base",
    "da3-large",
    "da3-giant",
    "da3mono-large",
    "da3metric-large",
    "da3-tiny",
    "da3-tiny-gs",
    "da3metric-tiny",
    "da2-small",
    "da2-base",
    "da2-large",
    "da2-tiny",
];

/// A DualDPT preset's backbone without the DA3 additions (no camera token, RoPE, QK-norm or
/// alternating attention) and a plain DPT head of one output (no UV embedding or norm).
fn plain_dpt(mut c: Config) -> Config {
    c.vit.alt_start = None;
    c.vit.rope_start = None;
    c.vit.qknorm_start = None;
    c.vit.cat_token = false;
    c.head.kind = HeadKind::Dpt;
    c.head.output_dim = 1;
    c.head.pos_embed = false;
    c.head.norm = false;
    c.cam_dim = None;
    c.gaussians = None;
    c
}

/// The test-size DPT models (`da3metric-tiny`, `da2-tiny`): a 64-wide, 4-block backbone.
const TINY_DPT: PresetDims = PresetDims {
    embed: 64,
    depth: 4,
    heads: 1,
    alt_start: 0,
    out_layers: [0, 1, 2, 3],
    features: 16,
    out_channels: [8, 16, 32, 64],
};

/// The sizes that tell the DualDPT presets apart.
#[derive(Clone, Copy)]
struct PresetDims {
    embed: usize,
    depth: usize,
    heads: usize,
    /// First block with alternating attention, the camera token, RoPE and QK-norm.
    alt_start: usize,
    out_layers: [usize; 4],
    features: usize,
    out_channels: [usize; 4],
}

impl Config {
    /// The official variants (and `da3-tiny`, a small model of the same shape used for the
    /// built-in default and the committed test fixtures).
    pub fn preset(name: &str) -> Result<Config, Error> {
        let dual = |d: PresetDims| Config {
            name: name.to_owned(),
            family: Family::Da3,
            vit: VitConfig {
                embed_dim: d.embed,
                depth: d.depth,
                num_heads: d.heads,
                mlp_hidden: 4 * d.embed,
                ffn: Ffn::Mlp,
                alt_start: Some(d.alt_start),
                rope_start: Some(d.alt_start),
                qknorm_start: Some(d.alt_start),
                rope_freq: 100.0,
                cat_token: true,
                out_layers: d.out_layers,
                patch_size: 14,
                pos_embed_grid: 37,
                interpolate_offset: 0.1,
                block_ln_eps: 1e-6,
                qk_ln_eps: 1e-5,
                final_ln_eps: 1e-5,
            },
            head: HeadConfig {
                kind: HeadKind::DualDpt,
                features: d.features,
                out_channels: d.out_channels,
                output_dim: 2,
                pos_embed: true,
                norm: true,
                sky: false,
                ln_eps: 1e-5,
                activation: DepthActivation::Exp,
            },
            cam_dim: Some(2 * d.embed),
            gaussians: None,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        };
        let large = PresetDims {
            embed: 1024,
            depth: 24,
            heads: 16,
            alt_start: 8,
            out_layers: [11, 15, 19, 23],
            features: 256,
            out_channels: [256, 512, 1024, 1024],
        };
        let tiny = PresetDims {
            embed: 128,
            depth: 4,
            heads: 2,
            alt_start: 2,
            out_layers: [0, 1, 2, 3],
            features: 32,
            out_channels: [16, 32, 64, 128],
        };
        Ok(match name {
            "da3-tiny" => dual(tiny),
            // da3-tiny with the giant's 3D Gaussian head at da3-tiny's head widths (the
            // committed Gaussian fixtures' model, `tests/reference/da3_gs_reference.py`).
            "da3-tiny-gs" => {
                let mut c = dual(tiny);
                c.gaussians = Some(GaussianConfig {
                    features: tiny.features,
                    out_channels: tiny.out_channels,
                    ..GaussianConfig::GIANT
                });
                c
            }
            "da3-small" => dual(PresetDims {
                embed: 384,
                depth: 12,
                heads: 6,
                alt_start: 4,
                out_layers: [5, 7, 9, 11],
                features: 64,
                out_channels: [48, 96, 192, 384],
            }),
            "da3-base" => dual(PresetDims {
                embed: 768,
                depth: 12,
                heads: 12,
                alt_start: 4,
                out_layers: [5, 7, 9, 11],
                features: 128,
                out_channels: [96, 192, 384, 768],
            }),
            "da3-large" => dual(large),
            "da3-giant" => {
                let mut c = dual(PresetDims {
                    embed: 1536,
                    depth: 40,
                    heads: 24,
                    alt_start: 13,
                    out_layers: [19, 27, 33, 39],
                    ..large
                });
                c.vit.ffn = Ffn::SwiGlu;
                // DINOv2's fused SwiGLU: hidden = round_up(int(4 * embed * 2 / 3), 8).
                c.vit.mlp_hidden = (4 * 1536 * 2 / 3usize).div_ceil(8) * 8;
                c.gaussians = Some(GaussianConfig::GIANT);
                c
            }
            "da3mono-large" | "da3metric-large" => {
                // ViT-L without the DA3 additions, out layers 4/11/17/23, a DPT head with sky.
                let mut c = plain_dpt(dual(PresetDims {
                    out_layers: [4, 11, 17, 23],
                    ..large
                }));
                c.head.sky = true;
                c
            }
            // The metric architecture at test size (the metric branch of `da3nested-tiny`,
            // the shape of depth-anything.cpp's tiny nested fixture).
            "da3metric-tiny" => {
                let mut c = plain_dpt(dual(TINY_DPT));
                c.head.sky = true;
                c
            }
            // Depth Anything V2 (its `model_configs` and `intermediate_layer_idx`): DINOv2
            // with LayerNorm eps 1e-6 throughout, the DPT head without sky, relative (a
            // metric file says `head.activation` "sigmoid" and its `head.max_depth`).
            "da2-tiny" | "da2-small" | "da2-base" | "da2-large" => {
                let dims = match name {
                    "da2-tiny" => TINY_DPT,
                    "da2-small" => PresetDims {
                        embed: 384,
                        depth: 12,
                        heads: 6,
                        alt_start: 0,
                        out_layers: [2, 5, 8, 11],
                        features: 64,
                        out_channels: [48, 96, 192, 384],
                    },
                    "da2-base" => PresetDims {
                        embed: 768,
                        depth: 12,
                        heads: 12,
                        alt_start: 0,
                        out_layers: [2, 5, 8, 11],
                        features: 128,
                        out_channels: [96, 192, 384, 768],
                    },
                    _ => PresetDims {
                        out_layers: [4, 11, 17, 23],
                        ..large
                    },
                };
                let mut c = plain_dpt(dual(dims));
                c.family = Family::Da2 {
                    input_size: DA2_INPUT_SIZE,
                };
                c.vit.final_ln_eps = 1e-6;
                c.head.activation = DepthActivation::Relu;
                c
            }
            other => {
                return Err(Error::Config(format!(
                    "unknown preset `{other}`; known: {}",
                    PRESETS.join(", ")
                )));
            }
        })
    }

    /// Reads the hyperparameters of a GGUF file in depth-anything.cpp's layout (keys under
    /// `depthanything3.`). Missing keys fall back to the preset named by
    /// `checkpoint_name`; the tensor shapes are checked later, when weights load.
    pub fn from_gguf(file: &GgufFile) -> Result<Config, Error> {
        // depth-anything.cpp writes both families under `general.architecture`
        // "depthanything3" and tells DA2 apart by `depthanything3.arch`.
        let general = file.opt_str("general.architecture")?.unwrap_or("");
        let declared = file.opt_str("depthanything3.arch")?.unwrap_or("");
        let da2 = general == "depthanything2" || declared == "depthanything2";
        if !da2
            && general != "depthanything3"
            && !(general.is_empty() && declared == "depthanything3")
        {
            let found = match (general, declared) {
                ("", "") => "no architecture key".to_owned(),
                ("", arch) | (arch, _) => format!("architecture `{arch}`"),
            };
            return Err(Error::Config(format!(
                "not a Depth Anything model: {found} (expected `depthanything3`, or \
                 depth-anything.cpp's `depthanything2` for Depth Anything V2)"
            )));
        }
        let layout = FileLayout::of(file);
        let key = |k: &str| format!("depthanything3.{}", layout.file_name(k));
        let checkpoint = file
            .opt_str(&key("checkpoint_name"))?
            .unwrap_or("")
            .to_owned();
        let preset = match layout {
            // The sizes come from the keys, which depth-anything.cpp writes for every DA2 file.
            _ if da2 => Some("da2-base"),
            // Its checkpoint name is the nested model's ("...-GIANT-LARGE-metric").
            FileLayout::NestedMetric => Some("da3metric-large"),
            FileLayout::Standard => Self::preset_for_checkpoint(&checkpoint),
        };
        let mut config = Self::preset(preset.unwrap_or("da3-base"))?;
        config.name = if checkpoint.is_empty() {
            config.name
        } else {
            checkpoint
        };

        let usize_key = |k: &str| -> Result<Option<usize>, Error> {
            Ok(file.opt_u32(&key(k))?.map(|v| v as usize))
        };
        let start_key = |k: &str, current: Option<usize>| -> Result<Option<usize>, Error> {
            Ok(match file.opt_i32(&key(k))? {
                Some(v) if v < 0 => None,
                Some(v) => Some(v as usize),
                None => current,
            })
        };
        let v = &mut config.vit;
        v.embed_dim = usize_key("vit.embed_dim")?.unwrap_or(v.embed_dim);
        v.depth = usize_key("vit.depth")?.unwrap_or(v.depth);
        v.num_heads = usize_key("vit.num_heads")?.unwrap_or(v.num_heads);
        v.mlp_hidden = usize_key("vit.mlp_hidden")?.unwrap_or(v.mlp_hidden);
        v.patch_size = usize_key("patch_size")?.unwrap_or(v.patch_size);
        v.pos_embed_grid = usize_key("vit.pos_embed_grid")?.unwrap_or(v.pos_embed_grid);
        v.alt_start = start_key("vit.alt_start", v.alt_start)?;
        v.rope_start = start_key("vit.rope_start", v.rope_start)?;
        v.qknorm_start = start_key("vit.qknorm_start", v.qknorm_start)?;
        if let Some(f) = file.opt_f32(&key("vit.rope_freq"))? {
            v.rope_freq = f;
        }
        if let Some(c) = file.opt_bool(&key("vit.cat_token"))? {
            v.cat_token = c;
        }
        if let Some(f) = file.opt_f32(&key("vit.interpolate_offset"))? {
            v.interpolate_offset = f;
        }
        // DA2's DINOv2 uses one LayerNorm epsilon throughout (the final norm's too); DA3's
        // files write the blocks' and the presets know the rest.
        if let Some(eps) = file.opt_f32(&key("vit.ln_eps"))? {
            v.block_ln_eps = eps;
            if da2 {
                v.final_ln_eps = eps;
            }
        }
        if let Some(ffn) = file.opt_str(&key("vit.ffn_type"))? {
            v.ffn = match ffn {
                "mlp" => Ffn::Mlp,
                "swiglu" => Ffn::SwiGlu,
                other => return Err(Error::Config(format!("unknown vit.ffn_type `{other}`"))),
            };
        }
        if let Some(layers) = file.opt_i32_array(&key("vit.out_layers"))? {
            config.vit.out_layers = four(&layers, "vit.out_layers")?;
        }
        let h = &mut config.head;
        h.features = usize_key("head.features")?.unwrap_or(h.features);
        h.output_dim = usize_key("head.output_dim")?.unwrap_or(h.output_dim);
        if let Some(p) = file.opt_bool(&key("head.pos_embed"))? {
            h.pos_embed = p;
        }
        if let Some(norm) = file.opt_str(&key("head.norm_type"))? {
            h.norm = norm == "layer";
        }
        if let Some(oc) = file.opt_i32_array(&key("head.out_channels"))? {
            config.head.out_channels = four(&oc, "head.out_channels")?;
        }
        if let Some(activation) = file.opt_str(&key("head.activation"))? {
            let max_depth = file.opt_f32(&key("head.max_depth"))?;
            config.head.activation = depth_activation(activation, max_depth)?;
        }
        // Preprocessing applies the official ImageNet normalisation; a file asking for another
        // one would silently get wrong depth, so it is refused.
        if let Some(mean) = file.opt_f32_array(&key("img.mean"))? {
            config.mean = normalisation(mean, "img.mean", IMAGENET_MEAN)?;
        }
        if let Some(std) = file.opt_f32_array(&key("img.std"))? {
            config.std = normalisation(std, "img.std", IMAGENET_STD)?;
        }
        config.gaussians = gaussian_config(file, &key, config.gaussians)?;
        // `cam.dim_in` is written as 1536 for every variant; the weights decide (see loading).
        config.cam_dim = config.cam_dim.map(|_| config.vit.feature_dim());
        config.validate()?;
        if let Family::Da2 { input_size } = &mut config.family {
            if let Some(mode) = file.opt_str(&key("img.resize_mode"))? {
                if mode != "lower_bound" {
                    return Err(Error::Config(format!(
                        "img.resize_mode `{mode}`: Depth Anything V2 resizes by `lower_bound`"
                    )));
                }
            }
            if let Some(size) = usize_key("img.resize_target")? {
                crate::da3::preprocess::check_process_res(size)
                    .map_err(|e| Error::Config(format!("img.resize_target: {e}")))?;
                *input_size = size;
            }
        }
        Ok(config)
    }

    /// The preset a checkpoint name ("da3-base", "depth-anything/DA3-BASE", ...) refers to.
    pub fn preset_for_checkpoint(name: &str) -> Option<&'static str> {
        let lower = name.to_ascii_lowercase().replace(['_', ' '], "-");
        let lower = lower.rsplit('/').next().unwrap_or(&lower).to_owned();
        // The family decides the architecture (the sizes come from the file's keys), so
        // "mono" and "metric" go before the sizes: "da3metric-tiny" is a metric model.
        let table = [
            ("mono", "da3mono-large"),
            ("metric", "da3metric-large"),
            ("tiny-gs", "da3-tiny-gs"),
            ("giant", "da3-giant"),
            ("large", "da3-large"),
            ("base", "da3-base"),
            ("small", "da3-small"),
            ("tiny", "da3-tiny"),
        ];
        table
            .iter()
            .find(|(k, _)| lower.contains(k))
            .map(|(_, p)| *p)
    }

    /// Whether this is the metric model (DA3METRIC-LARGE, or the nested model's metric
    /// branch): a DPT head with sky, and a checkpoint or preset name of the metric family
    /// (the mono model has the same architecture and predicts relative depth). Its output
    /// times `focal / 300` is metres ([`crate::metric`]).
    pub fn is_metric(&self) -> bool {
        self.head.kind == HeadKind::Dpt
            && self.head.sky
            && Self::preset_for_checkpoint(&self.name) == Some("da3metric-large")
    }

    /// Whether this is a Depth Anything V2 model.
    pub fn is_da2(&self) -> bool {
        matches!(self.family, Family::Da2 { .. })
    }

    /// Whether the depth maps hold disparity (DA2's relative output: larger is nearer,
    /// affine-invariant) rather than depth.
    pub fn predicts_disparity(&self) -> bool {
        self.head.activation == DepthActivation::Relu
    }

    /// Internal consistency (independent of any weights).
    pub fn validate(&self) -> Result<(), Error> {
        let v = &self.vit;
        let bad = |why: String| Err(Error::Config(why));
        // Every block declares its tensors before the file is asked for them: a damaged
        // block count must not make billions of declarations (DA3-giant has 40 blocks).
        if v.depth == 0 || v.depth > MAX_DEPTH {
            return bad(format!("depth {} (1 to {MAX_DEPTH} blocks)", v.depth));
        }
        if v.embed_dim == 0 || v.num_heads == 0 || !v.embed_dim.is_multiple_of(v.num_heads) {
            return bad(format!(
                "embed_dim {} is not a multiple of num_heads {}",
                v.embed_dim, v.num_heads
            ));
        }
        if !v.head_dim().is_multiple_of(4) {
            return bad(format!(
                "head_dim {} must be a multiple of 4 for 2D RoPE",
                v.head_dim()
            ));
        }
        if v.out_layers.iter().any(|&l| l >= v.depth)
            || v.out_layers.windows(2).any(|w| w[0] >= w[1])
        {
            return bad(format!(
                "out_layers {:?} must increase and lie below depth {}",
                v.out_layers, v.depth
            ));
        }
        if v.patch_size == 0 || v.pos_embed_grid == 0 {
            return bad("patch_size and pos_embed_grid must be positive".into());
        }
        if !self.head.features.is_multiple_of(2) || self.head.features == 0 {
            return bad(format!("head features {} must be even", self.head.features));
        }
        if self.is_da2() {
            let v = &self.vit;
            let da3_parts = [
                (v.alt_start.is_some(), "vit.alt_start"),
                (v.rope_start.is_some(), "vit.rope_start"),
                (v.qknorm_start.is_some(), "vit.qknorm_start"),
                (v.cat_token, "vit.cat_token"),
                (self.head.kind != HeadKind::Dpt, "a DualDPT head"),
                (self.head.pos_embed, "head.pos_embed"),
                (self.head.norm, "head.norm_type"),
                (
                    self.head.activation == DepthActivation::Exp,
                    "head.activation exp",
                ),
            ];
            if let Some((_, what)) = da3_parts.iter().find(|(set, _)| *set) {
                return bad(format!(
                    "a Depth Anything V2 file (depthanything2) with Depth Anything 3's {what}"
                ));
            }
        }
        if let Some(g) = &self.gaussians {
            // Its upsampled map gets the UV embedding the depth head's output does.
            if g.features != self.head.features {
                return bad(format!(
                    "gs.features {} must equal head.features {} (the Gaussian head shares the \
                     depth head's output embedding)",
                    g.features, self.head.features
                ));
            }
        }
        if self.head.kind == HeadKind::DualDpt && self.head.output_dim != 2 {
            return bad(format!(
                "a DualDPT head has 2 outputs, not {}",
                self.head.output_dim
            ));
        }
        Ok(())
    }
}

/// The 3D Gaussian head's keys (`gs.*`, as depth-anything.cpp writes them), over `preset`'s
/// values; a file with none of them has the preset's head (or none).
fn gaussian_config(
    file: &GgufFile,
    key: &dyn Fn(&str) -> String,
    preset: Option<GaussianConfig>,
) -> Result<Option<GaussianConfig>, Error> {
    let Some(features) = file.opt_u32(&key("gs.features"))? else {
        return Ok(preset);
    };
    let mut g = preset.unwrap_or(GaussianConfig::GIANT);
    g.features = features as usize;
    if let Some(oc) = file.opt_i32_array(&key("gs.out_channels"))? {
        g.out_channels = four(&oc, "gs.out_channels")?;
    }
    if let Some(degree) = file.opt_u32(&key("gs.sh_degree"))? {
        g.sh_degree = degree as usize;
    }
    if let Some(v) = file.opt_f32(&key("gs.scale_min"))? {
        g.scale_min = v;
    }
    if let Some(v) = file.opt_f32(&key("gs.scale_max"))? {
        g.scale_max = v;
    }
    if let Some(v) = file.opt_bool(&key("gs.pred_offset_depth"))? {
        g.offset_depth = v;
    }
    if let Some(v) = file.opt_bool(&key("gs.pred_offset_xy"))? {
        g.offset_xy = v;
    }
    if file.opt_bool(&key("gs.pred_color"))? == Some(true) {
        return Err(Error::Config(
            "gs.pred_color: a Gaussian head that predicts colours instead of spherical \
             harmonics (no official model does) is not supported"
                .into(),
        ));
    }
    if g.features == 0 || !g.features.is_multiple_of(8) || g.sh_degree > 2 {
        return Err(Error::Config(format!(
            "gs.features {} (a positive multiple of 8) or gs.sh_degree {} (0 to 2)",
            g.features, g.sh_degree
        )));
    }
    if !(g.scale_min.is_finite() && g.scale_max.is_finite() && 0.0 <= g.scale_min)
        || g.scale_min > g.scale_max
    {
        return Err(Error::Config(format!(
            "gs.scale_min {} and gs.scale_max {}: a finite, non-negative range",
            g.scale_min, g.scale_max
        )));
    }
    if let Some(dim) = file.opt_u32(&key("gs.output_dim"))? {
        if dim as usize != g.output_dim() {
            return Err(Error::Config(format!(
                "gs.output_dim {dim} does not match the {} channels its other gs.* keys give",
                g.output_dim()
            )));
        }
    }
    Ok(Some(g))
}

/// `head.activation` (and `head.max_depth` for a sigmoid) as depth-anything.cpp writes them.
fn depth_activation(name: &str, max_depth: Option<f32>) -> Result<DepthActivation, Error> {
    match (name, max_depth) {
        ("exp", _) => Ok(DepthActivation::Exp),
        ("relu", _) => Ok(DepthActivation::Relu),
        ("sigmoid", Some(max_depth)) if max_depth.is_finite() && max_depth > 0.0 => {
            Ok(DepthActivation::Sigmoid { max_depth })
        }
        ("sigmoid", other) => Err(Error::Config(format!(
            "head.activation `sigmoid` needs a positive head.max_depth (metres), found {}",
            other.map_or("none".to_owned(), |v| v.to_string())
        ))),
        (other, _) => Err(Error::Config(format!(
            "unknown head.activation `{other}` (exp, relu or sigmoid)"
        ))),
    }
}

/// The most transformer blocks a file may declare.
const MAX_DEPTH: usize = 1024;

fn four(values: &[i32], key: &str) -> Result<[usize; 4], Error> {
    match values {
        [a, b, c, d] if values.iter().all(|&x| x >= 0) => {
            Ok([*a as usize, *b as usize, *c as usize, *d as usize])
        }
        _ => Err(Error::Config(format!(
            "{key} must hold 4 non-negative values, found {}",
            echo(values)
        ))),
    }
}

fn three(values: &[f32], key: &str) -> Result<[f32; 3], Error> {
    match values {
        [a, b, c] => Ok([*a, *b, *c]),
        _ => Err(Error::Config(format!(
            "{key} must hold 3 values, found {}",
            echo(values)
        ))),
    }
}

/// `img.mean` / `img.std`: three finite values (a positive std) equal to `expected`, the
/// ImageNet values the preprocessing applies (to within f32 rounding of a decimal value).
fn normalisation(values: &[f32], key: &str, expected: [f32; 3]) -> Result<[f32; 3], Error> {
    let got = three(values, key)?;
    if got.iter().any(|v| !v.is_finite()) || (key == "img.std" && got.iter().any(|&v| v <= 0.0)) {
        return Err(Error::Config(format!(
            "{key} {got:?} must be finite{}",
            if key == "img.std" {
                " and positive"
            } else {
                ""
            }
        )));
    }
    if got.iter().zip(expected).any(|(g, e)| (g - e).abs() > 1e-6) {
        return Err(Error::Config(format!(
            "{key} {got:?} differs from the ImageNet normalisation {expected:?} this \
             implementation applies (as the official preprocessing does); a model trained \
             with another normalisation is not supported"
        )));
    }
    Ok(got)
}

/// At most 8 values of a metadata array, and the count when there are more.
fn echo<T: std::fmt::Debug>(values: &[T]) -> String {
    const SHOWN: usize = 8;
    if values.len() <= SHOWN {
        return format!("{values:?}");
    }
    let head: Vec<String> = values[..SHOWN].iter().map(|v| format!("{v:?}")).collect();
    format!("{} values [{}, ...]", values.len(), head.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A metadata-only file of `preset` with `keys` set over its own.
    fn config_with(preset: &str, keys: &[(&str, crate::gguf::Value)]) -> Result<Config, Error> {
        let mut w = crate::gguf::GgufWriter::new();
        super::super::convert::write_metadata(&mut w, &Config::preset(preset).unwrap());
        for (k, v) in keys {
            w.set(format!("depthanything3.{k}"), v.clone());
        }
        let mut bytes = Vec::new();
        w.write_to_writer(&mut bytes).unwrap();
        Config::from_gguf(&crate::gguf::GgufFile::from_bytes(bytes).unwrap())
    }

    /// The Gaussian head's keys read back as written, and each inconsistent one is refused by
    /// name.
    #[test]
    fn gaussian_head_keys_round_trip_and_bad_ones_are_named() {
        let giant = config_with("da3-giant", &[]).unwrap();
        assert_eq!(giant.gaussians, Some(GaussianConfig::GIANT));
        assert_eq!(GaussianConfig::GIANT.output_dim(), 38);
        let tiny = config_with("da3-tiny-gs", &[]).unwrap();
        assert_eq!(tiny.gaussians.unwrap().features, 32);
        assert_eq!(config_with("da3-tiny", &[]).unwrap().gaussians, None);
        for (keys, named) in [
            (vec![("gs.output_dim", 37u32.into())], "gs.output_dim 37"),
            (vec![("gs.pred_color", true.into())], "gs.pred_color"),
            (vec![("gs.sh_degree", 3u32.into())], "gs.sh_degree 3"),
            (
                vec![
                    ("gs.scale_min", 2.0f32.into()),
                    ("gs.scale_max", 1.0f32.into()),
                ],
                "gs.scale_min 2",
            ),
            (
                vec![("gs.features", 64u32.into())],
                "must equal head.features 32",
            ),
        ] {
            let err = config_with("da3-tiny-gs", &keys).unwrap_err().to_string();
            assert!(err.contains(named), "{named}: {err}");
        }
    }

    /// The presets without a parity test, against the official configs' values.
    #[test]
    fn large_giant_and_mono_presets_match_the_official_configs() {
        let large = Config::preset("da3-large").unwrap();
        assert_eq!(
            (large.vit.embed_dim, large.vit.depth, large.vit.num_heads),
            (1024, 24, 16)
        );
        assert_eq!(
            (large.vit.alt_start, large.vit.out_layers),
            (Some(8), [11, 15, 19, 23])
        );
        assert_eq!((large.head.features, large.vit.feature_dim()), (256, 2048));

        let giant = Config::preset("da3-giant").unwrap();
        assert_eq!(
            (giant.vit.embed_dim, giant.vit.depth, giant.vit.num_heads),
            (1536, 40, 24)
        );
        assert_eq!((giant.vit.ffn, giant.vit.mlp_hidden), (Ffn::SwiGlu, 4096));
        assert_eq!(
            (giant.vit.alt_start, giant.vit.out_layers),
            (Some(13), [19, 27, 33, 39])
        );
        assert_eq!(giant.head.out_channels, [256, 512, 1024, 1024]);

        for name in ["da3mono-large", "da3metric-large"] {
            let mono = Config::preset(name).unwrap();
            assert_eq!(mono.is_metric(), name == "da3metric-large");
            assert_eq!(mono.vit.out_layers, [4, 11, 17, 23]);
            assert_eq!(
                (
                    mono.vit.alt_start,
                    mono.vit.rope_start,
                    mono.vit.qknorm_start
                ),
                (None, None, None)
            );
            assert!(!mono.vit.cat_token && mono.vit.feature_dim() == 1024);
            assert_eq!(
                (mono.head.kind, mono.head.output_dim, mono.head.sky),
                (HeadKind::Dpt, 1, true)
            );
            assert!(!mono.head.pos_embed && !mono.head.norm && mono.cam_dim.is_none());
        }
        for name in PRESETS {
            Config::preset(name).unwrap().validate().unwrap();
        }
        assert!(Config::preset("da3-huge").is_err());
    }

    /// Depth Anything V2's `model_configs` and `intermediate_layer_idx`.
    #[test]
    fn da2_presets_match_the_official_configs() {
        for (name, embed, heads, layers, features, channels) in [
            ("da2-small", 384, 6, [2, 5, 8, 11], 64, [48, 96, 192, 384]),
            ("da2-base", 768, 12, [2, 5, 8, 11], 128, [96, 192, 384, 768]),
            (
                "da2-large",
                1024,
                16,
                [4, 11, 17, 23],
                256,
                [256, 512, 1024, 1024],
            ),
        ] {
            let c = Config::preset(name).unwrap();
            assert!(
                c.is_da2() && c.predicts_disparity() && !c.is_metric(),
                "{name}"
            );
            assert_eq!((c.vit.embed_dim, c.vit.num_heads), (embed, heads), "{name}");
            assert_eq!(c.vit.out_layers, layers, "{name}");
            assert_eq!((c.head.features, c.head.out_channels), (features, channels));
            assert_eq!((c.vit.block_ln_eps, c.vit.final_ln_eps), (1e-6, 1e-6));
            assert!(!c.head.sky && !c.head.norm && !c.head.pos_embed && c.cam_dim.is_none());
            assert_eq!(c.family, Family::Da2 { input_size: 518 });
        }
    }

    #[test]
    fn a_sigmoid_head_needs_its_maximum_depth() {
        assert_eq!(
            depth_activation("sigmoid", Some(80.0)).unwrap(),
            DepthActivation::Sigmoid { max_depth: 80.0 }
        );
        for bad in [None, Some(0.0), Some(f32::NAN)] {
            let e = depth_activation("sigmoid", bad).unwrap_err().to_string();
            assert!(e.contains("head.max_depth"), "{e}");
        }
        assert!(depth_activation("softplus", None)
            .unwrap_err()
            .to_string()
            .contains("softplus"));
    }
}
