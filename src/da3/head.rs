//! The DPT and DualDPT heads (depth, confidence, sky) and the camera decoder. Maps are
//! `[W, H, C, 1]` (ggml order).

use super::architecture::{ray_output_widths, GAUSSIAN_HEAD_PROBE};
use super::config::{DepthActivation, GaussianConfig, HeadConfig, HeadKind};
use super::layers::{Conv, ConvTranspose, Linear, Norm};
use super::ops::Ops;
use super::preprocess;
use super::weights::BoundWeights;
use super::Error;
use crate::ggml::{Context, DType, Interpolation, Tensor, TensorView};

/// Host-computed inputs that depend only on the resolution: the 0.1 x UV embeddings added
/// after projection (one per stage, at the patch grid) and at the output resolution.
pub struct HeadConstants {
    pub stage_uv: Vec<Tensor>,
    pub output_uv: Option<UvEmbedding>,
}

/// The 0.1 x UV embedding of a full-resolution map, kept as its two factors
/// ([`preprocess::uv_embedding_factors`]): a `[W, 1, C, 1]` and a `[1, H, C, 1]` tensor added
/// by broadcast, the same values as the `[W, H, C, 1]` map (43 MB for da3-base's output at
/// 504x336, which the graph's constants would otherwise hold for as long as the graph lives).
pub struct UvEmbedding {
    along_x: Tensor,
    along_y: Tensor,
}

impl UvEmbedding {
    /// Declares the factors of a `width x height x channels` map in `ctx` (allocated by the
    /// caller, then [`write`](Self::write)).
    pub fn declare(
        ctx: &Context,
        width: usize,
        height: usize,
        channels: usize,
    ) -> Result<UvEmbedding, Error> {
        let c = channels as i64;
        Ok(UvEmbedding {
            along_x: ctx.new_tensor(DType::F32, &[width as i64, 1, c, 1])?,
            along_y: ctx.new_tensor(DType::F32, &[1, height as i64, c, 1])?,
        })
    }

    /// Writes the factors for an image of aspect ratio `aspect` (`W / H` of the processed
    /// image, as the official code passes it).
    pub fn write(&self, ctx: &Context, aspect: f64) -> Result<(), Error> {
        let [w, _, channels, _] = self.along_x.ne().map(|d| d as usize);
        let h = self.along_y.ne()[1] as usize;
        let factors = preprocess::uv_embedding_factors(w, h, channels, aspect)?;
        let scaled = |v: Vec<f32>| v.into_iter().map(|v| v * 0.1).collect::<Vec<f32>>();
        ctx.write(&self.along_x, &scaled(factors.along_x))?;
        ctx.write(&self.along_y, &scaled(factors.along_y))?;
        Ok(())
    }

    /// `map` (`[W, H, C, views]`) plus the embedding.
    pub fn add_to(&self, g: &Ops, map: &Tensor) -> Result<Tensor, Error> {
        Ok(g.add_separable(map, &self.along_x, &self.along_y)?)
    }

    /// `map` resized to the embedding's size (bilinear, aligned corners) plus the embedding:
    /// one pass on the CPU.
    pub fn resize_and_add(&self, g: &Ops, map: &Tensor) -> Result<Tensor, Error> {
        let [_, _, c, n] = map.ne();
        let (w, h) = (self.along_x.ne()[0], self.along_y.ne()[1]);
        Ok(g.interpolate_add_separable(
            map,
            [w, h, c, n],
            Interpolation::Bilinear {
                align_corners: true,
            },
            &self.along_x,
            &self.along_y,
        )?)
    }
}

/// Residual conv unit: `conv2(relu(conv1(relu(x)))) + x`.
struct Rcu {
    c1: Conv,
    c2: Conv,
}

impl Rcu {
    fn bind(w: &BoundWeights<'_>, prefix: &str) -> Result<Self, Error> {
        Ok(Rcu {
            c1: Conv::bind(w, &format!("{prefix}.c1"))?,
            c2: Conv::bind(w, &format!("{prefix}.c2"))?,
        })
    }
    fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        let y = self.c1.forward_of_relu(g, x)?;
        let y = self.c2.forward_of_relu(g, &y)?;
        Ok(g.add(&y, x)?)
    }
}

/// Feature fusion block: (lateral RCU1 + top) -> RCU2 -> bilinear resize -> 1x1 conv.
struct Fusion {
    rc1: Option<Rcu>,
    rc2: Rcu,
    out: Conv,
}

impl Fusion {
    /// Fusion block `k` under `p` (the coarsest, 4, has no lateral unit).
    fn bind(w: &BoundWeights<'_>, p: &str, k: usize) -> Result<Self, Error> {
        Ok(Fusion {
            rc1: match k {
                4 => None,
                _ => Some(Rcu::bind(w, &format!("{p}.rc1"))?),
            },
            rc2: Rcu::bind(w, &format!("{p}.rc2"))?,
            out: Conv::bind(w, &format!("{p}.out"))?,
        })
    }
    /// `size`: the (W, H) to resize to; None doubles.
    fn forward(
        &self,
        g: &Ops,
        top: &Tensor,
        lateral: Option<&Tensor>,
        size: Option<(i64, i64)>,
    ) -> Result<Tensor, Error> {
        let mut y = top.clone();
        if let (Some(rc1), Some(lateral)) = (&self.rc1, lateral) {
            y = g.add(&y, &rc1.forward(g, lateral)?)?;
        }
        let y = self.rc2.forward(g, &y)?;
        let [w, h, c, n] = y.ne();
        let (tw, th) = size.unwrap_or((2 * w, 2 * h));
        let y = g.interpolate(
            &y,
            [tw, th, c, n],
            Interpolation::Bilinear {
                align_corners: true,
            },
        )?;
        self.out.forward(g, &y)
    }
}

enum Resize {
    Up(ConvTranspose),
    Identity,
    Down(Conv),
}

/// DPT / DualDPT head: depth, confidence, sky (the DualDPT ray branch is [`RayHead`]).
pub struct Head {
    cfg: HeadConfig,
    norm: Option<Norm>,
    proj: Vec<Conv>,
    resize: Vec<Resize>,
    layer_rn: Vec<Conv>,
    fusion: Vec<Fusion>,
    out1: Conv,
    out2a: Conv,
    out2b: Conv,
    sky: Option<(Conv, Conv)>,
}

/// The head's outputs, each [W, H] (one view) or [W, H, views] at the processed resolution.
pub struct HeadOutput {
    pub depth: Tensor,
    /// The depth channel before its activation (a parity probe: DA2's ReLU zeroes much of
    /// its output on synthetic weights).
    pub depth_logits: Tensor,
    pub confidence: Option<Tensor>,
    pub sky: Option<Tensor>,
    /// The four stage maps after `layer{k}_rn` (the input of both fusion chains).
    pub stages: Vec<Tensor>,
}

impl Head {
    /// The head of `cfg` (`head.*`).
    pub fn bind(w: &BoundWeights<'_>, cfg: &HeadConfig) -> Result<Self, Error> {
        Self::bind_at(w, "head", cfg)
    }

    /// A DPT head of `cfg` whose tensors are under `p`.
    fn bind_at(w: &BoundWeights<'_>, p: &str, cfg: &HeadConfig) -> Result<Self, Error> {
        let stages = |name: &dyn Fn(usize) -> String| {
            (0..4)
                .map(|s| Conv::bind(w, &name(s)))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Head {
            cfg: cfg.clone(),
            norm: match cfg.norm {
                true => Some(Norm::bind(w, &format!("{p}.norm"), cfg.ln_eps)?),
                false => None,
            },
            proj: stages(&|s| format!("{p}.proj.{s}"))?,
            resize: vec![
                Resize::Up(ConvTranspose::bind(w, &format!("{p}.resize.0"))?),
                Resize::Up(ConvTranspose::bind(w, &format!("{p}.resize.1"))?),
                Resize::Identity,
                Resize::Down(Conv::bind_strided(w, &format!("{p}.resize.3"), 2)?),
            ],
            layer_rn: stages(&|s| format!("{p}.scratch.layer{}_rn", s + 1))?,
            fusion: (1..=4)
                .map(|k| Fusion::bind(w, &format!("{p}.scratch.rn{k}"), k))
                .collect::<Result<Vec<_>, _>>()?,
            out1: Conv::bind(w, &format!("{p}.scratch.out1"))?,
            out2a: Conv::bind(w, &format!("{p}.scratch.out2a"))?,
            out2b: Conv::bind(w, &format!("{p}.scratch.out2b"))?,
            sky: match cfg.sky {
                true => Some((
                    Conv::bind(w, "head.scratch.sky_out2a")?,
                    Conv::bind(w, "head.scratch.sky_out2b")?,
                )),
                false => None,
            },
        })
    }

    /// `features`: four [C, gw*gh] (or [C, gw*gh, views]) patch-token features; returns maps
    /// at (`width`, `height`), every view through the same ops as a batch.
    pub fn forward(
        &self,
        g: &Ops,
        features: &[Tensor],
        grid: (i64, i64),
        size: (i64, i64),
        c: &HeadConstants,
    ) -> Result<HeadOutput, Error> {
        let (fused, rn) = self.fuse(g, features, grid, c)?;
        let out = self.out1.forward(g, &fused)?;
        let [_, _, ch, n] = out.ne();
        let out = match (self.cfg.pos_embed, &c.output_uv) {
            (true, Some(uv)) => uv.resize_and_add(g, &out)?,
            _ => g.interpolate(
                &out,
                [size.0, size.1, ch, n],
                Interpolation::Bilinear {
                    align_corners: true,
                },
            )?,
        };
        self.outputs(g, &out, size, rn)
    }

    /// The projected, resized stages (`layer{k}_rn`) and the map the fusion chain makes of
    /// them, at the finest stage's size.
    fn fuse(
        &self,
        g: &Ops,
        features: &[Tensor],
        grid: (i64, i64),
        c: &HeadConstants,
    ) -> Result<(Tensor, Vec<Tensor>), Error> {
        let (gw, gh) = grid;
        let mut rn = Vec::with_capacity(4);
        for (s, feature) in features.iter().enumerate() {
            let x = match &self.norm {
                Some(norm) => norm.forward(g, feature)?,
                None => feature.clone(),
            };
            let [channels, _, views, _] = x.ne();
            let map = g.reshape(&g.cont(&g.transpose(&x)?)?, &[gw, gh, channels, views])?;
            let mut y = self.proj[s].forward(g, &map)?;
            if self.cfg.pos_embed {
                y = g.add(&y, &c.stage_uv[s])?;
            }
            let y = match &self.resize[s] {
                Resize::Up(up) => up.forward(g, &y)?,
                Resize::Identity => y,
                Resize::Down(down) => down.forward(g, &y)?,
            };
            rn.push(
                self.layer_rn[s]
                    .forward(g, &y)?
                    .named(&format!("layer{}_rn", s + 1)),
            );
        }
        let size_of = |t: &Tensor| (t.ne()[0], t.ne()[1]);
        let out = self.fusion[3].forward(g, &rn[3], None, Some(size_of(&rn[2])))?;
        let out = self.fusion[2].forward(g, &out, Some(&rn[2]), Some(size_of(&rn[1])))?;
        let out = self.fusion[1].forward(g, &out, Some(&rn[1]), Some(size_of(&rn[0])))?;
        let out = self.fusion[0]
            .forward(g, &out, Some(&rn[0]), None)?
            .named("fused");
        Ok((out, rn))
    }

    /// Depth, confidence and sky from `out`, the map at the output size.
    fn outputs(
        &self,
        g: &Ops,
        out: &Tensor,
        size: (i64, i64),
        rn: Vec<Tensor>,
    ) -> Result<HeadOutput, Error> {
        let logits = self
            .out2b
            .forward_of_relu(g, &self.out2a.forward(g, out)?)?;
        let (w, h) = size;
        let views = logits.ne()[3];
        let channel = |i: i64| -> Result<Tensor, Error> {
            let nb = logits.nb();
            let offset = i as usize * nb[2];
            Ok(if views == 1 {
                g.view(&logits, &[w, h], &[nb[1]], offset)?
            } else {
                g.view(&logits, &[w, h, views], &[nb[1], nb[3]], offset)?
            })
        };
        let logits0 = g.cont(&channel(0)?)?;
        let depth = match self.cfg.activation {
            DepthActivation::Exp => g.exp(&logits0)?,
            // The official head ends in a ReLU and the model applies another; one is the same.
            DepthActivation::Relu => g.relu(&logits0)?,
            DepthActivation::Sigmoid { max_depth } => g.scale(&g.sigmoid(&logits0)?, max_depth)?,
        }
        .named("depth");
        let confidence = match self.cfg.kind {
            HeadKind::DualDpt => {
                let conf = g.exp(&g.cont(&channel(1)?)?)?;
                Some(g.scale_bias(&conf, 1.0, 1.0)?.named("confidence"))
            }
            HeadKind::Dpt => None,
        };
        let sky = match &self.sky {
            Some((a, b)) => {
                let s = b.forward_of_relu(g, &a.forward(g, out)?)?;
                let shape = if views == 1 {
                    vec![w, h]
                } else {
                    vec![w, h, views]
                };
                Some(g.relu(&g.reshape(&s, &shape)?)?.named("sky"))
            }
            None => None,
        };
        Ok(HeadOutput {
            depth,
            depth_logits: logits0,
            confidence,
            sky,
            stages: rn,
        })
    }
}

/// The 3D Gaussian head (the official `GSDPT`): a DPT over the backbone's features whose
/// upsampled map gets three GELU convolutions of the normalised image added, then the UV
/// embedding, before its output convolutions.
pub struct GaussianHead {
    dpt: Head,
    merger: [Conv; 3],
}

impl GaussianHead {
    /// The head (`gs.*`), where the model has it loaded.
    pub fn bind(w: &BoundWeights<'_>, g: &GaussianConfig) -> Result<Option<Self>, Error> {
        if !w.has(GAUSSIAN_HEAD_PROBE) {
            return Ok(None);
        }
        // The official GSDPT: no norm (`norm_type` "idt"), UV embeddings, one output conv
        // stack of `output_dim` channels, no sky.
        let cfg = HeadConfig {
            kind: HeadKind::Dpt,
            features: g.features,
            out_channels: g.out_channels,
            output_dim: g.output_dim(),
            pos_embed: true,
            norm: false,
            sky: false,
            ln_eps: 1e-5,
            activation: DepthActivation::Exp,
        };
        let merger = |i: usize| Conv::bind(w, &format!("gs.merger.{i}"));
        Ok(Some(GaussianHead {
            dpt: Head::bind_at(w, "gs", &cfg)?,
            merger: [merger(0)?, merger(1)?, merger(2)?],
        }))
    }

    /// `features` as [`Head::forward`] takes them, `image` the normalised input `[W, H, 3,
    /// views]`; `c` must hold UV embeddings of `features / 2` channels (the depth head's
    /// width, which the official giant's Gaussian head shares). Returns the head's output
    /// `[W, H, output_dim, views]`: the raw Gaussian channels and the opacity logit last.
    pub fn forward(
        &self,
        g: &Ops,
        features: &[Tensor],
        image: &Tensor,
        grid: (i64, i64),
        c: &HeadConstants,
    ) -> Result<Tensor, Error> {
        let (fused, _) = self.dpt.fuse(g, features, grid, c)?;
        let out = self.dpt.out1.forward(g, &fused)?;
        let uv = c.output_uv.as_ref().ok_or_else(|| {
            Error::Input("the Gaussian head needs the output UV embedding".to_owned())
        })?;
        let out = uv.resize_and_add(g, &out)?;
        let mut merged = image.clone();
        for conv in &self.merger {
            merged = g.gelu_erf(&conv.forward(g, &merged)?)?;
        }
        let out = g.add(&out, &merged)?;
        let y = self.dpt.out2a.forward(g, &out)?;
        Ok(self
            .dpt
            .out2b
            .forward_of_relu(g, &y)?
            .named("gaussians_raw"))
    }
}

/// The camera decoder (DualDPT models): pose encoding (t, quaternion xyzw, fov h/w) from the
/// camera token.
pub struct CameraDecoder {
    bb0: Linear,
    bb2: Linear,
    fc_t: Linear,
    fc_q: Linear,
    fc_fov: Linear,
}

impl CameraDecoder {
    /// The decoder, where the model has one (`cam.*`).
    pub fn bind(w: &BoundWeights<'_>) -> Result<Option<Self>, Error> {
        if !w.has("cam.bb0.weight") {
            return Ok(None);
        }
        Ok(Some(CameraDecoder {
            bb0: Linear::bind(w, "cam.bb0")?,
            bb2: Linear::bind(w, "cam.bb2")?,
            fc_t: Linear::bind(w, "cam.fc_t")?,
            fc_q: Linear::bind(w, "cam.fc_q")?,
            fc_fov: Linear::bind(w, "cam.fc_fov")?,
        }))
    }
    /// `token`: [D, views] -> pose encodings [9, views].
    pub fn forward(&self, g: &Ops, token: &Tensor) -> Result<Tensor, Error> {
        let h = g.relu(&self.bb0.forward(g, token)?)?;
        let h = g.relu(&self.bb2.forward(g, &h)?)?;
        let t = self.fc_t.forward(g, &h)?;
        let q = self.fc_q.forward(g, &h)?;
        let fov = g.relu(&self.fc_fov.forward(g, &h)?)?;
        Ok(g.concat(&g.concat(&t, &q, 0)?, &fov, 0)?
            .named("pose_encoding"))
    }
}

/// The DualDPT auxiliary (ray) branch: its own fusion chain over the same stage maps
/// (`refinenet{k}_aux`), then, for the last (finest) level only, as the official forward
/// returns it: `output_conv1_aux[3]` (five 3x3 convolutions, no activations), the 0.1 x UV
/// embedding, and `output_conv2_aux[3]` (3x3 conv, LayerNorm over channels with eps 1e-5,
/// ReLU, 1x1 conv to 7 channels). Not resized: the map is twice the finest stage, 8/14 of
/// the processed size. Channels 0..6 are the ray (linear), channel 6 its confidence (expp1).
pub struct RayHead {
    pos_embed: bool,
    fusion: Vec<Fusion>,
    out1: Vec<Conv>,
    out2a: Conv,
    out2_norm: Norm,
    out2b: Conv,
}

/// The ray map's channels: a ray direction and origin per pixel (the official `ray`).
pub const RAY_CHANNELS: usize = 6;

impl RayHead {
    /// The branch, where the model has it (`head.scratch.*_aux`).
    pub fn bind(w: &BoundWeights<'_>, cfg: &HeadConfig) -> Result<Option<Self>, Error> {
        if cfg.kind != HeadKind::DualDpt || !w.has("head.scratch.rn1_aux.rc2.c1.weight") {
            return Ok(None);
        }
        let p = "head.scratch";
        Ok(Some(RayHead {
            pos_embed: cfg.pos_embed,
            fusion: (1..=4)
                .map(|k| Fusion::bind(w, &format!("{p}.rn{k}_aux"), k))
                .collect::<Result<Vec<_>, _>>()?,
            out1: (0..ray_output_widths(cfg.features).len())
                .map(|j| Conv::bind(w, &format!("{p}.out1_aux.{j}")))
                .collect::<Result<Vec<_>, _>>()?,
            out2a: Conv::bind(w, &format!("{p}.out2a_aux"))?,
            out2_norm: Norm::bind(w, &format!("{p}.out2_aux_ln"), 1e-5)?,
            out2b: Conv::bind(w, &format!("{p}.out2b_aux"))?,
        }))
    }

    /// `stages`: [`HeadOutput::stages`]; `uv`: the 0.1 x UV embedding at the ray map's size
    /// with `features / 2` channels (models with `pos_embed`). Returns (ray `[w, h, 6, views]`,
    /// confidence `[w, h, views]`).
    pub fn forward(
        &self,
        g: &Ops,
        stages: &[Tensor],
        uv: Option<&UvEmbedding>,
    ) -> Result<(Tensor, Tensor), Error> {
        let size_of = |t: &Tensor| (t.ne()[0], t.ne()[1]);
        let rn = stages;
        let out = self.fusion[3].forward(g, &rn[3], None, Some(size_of(&rn[2])))?;
        let out = self.fusion[2].forward(g, &out, Some(&rn[2]), Some(size_of(&rn[1])))?;
        let out = self.fusion[1].forward(g, &out, Some(&rn[1]), Some(size_of(&rn[0])))?;
        let mut out = self.fusion[0].forward(g, &out, Some(&rn[0]), None)?;
        for conv in &self.out1 {
            out = conv.forward(g, &out)?;
        }
        if let (true, Some(uv)) = (self.pos_embed, uv) {
            out = uv.add_to(g, &out)?;
        }
        let y = self.out2a.forward(g, &out)?;
        // LayerNorm over the channels: [W, H, C, N] -> [C, W, H, N] and back.
        let channels_first = g.cont(&g.permute(&y, [1, 2, 0, 3])?)?;
        let normed = self.out2_norm.forward(g, &channels_first)?;
        let y = g.cont(&g.permute(&normed, [2, 0, 1, 3])?)?;
        let logits = self.out2b.forward_of_relu(g, &y)?;
        let [w, h, _, views] = logits.ne();
        let nb = logits.nb();
        let ray = g.view(
            &logits,
            &[w, h, RAY_CHANNELS as i64, views],
            &[nb[1], nb[2], nb[3]],
            0,
        )?;
        let conf = g.view(
            &logits,
            &[w, h, views],
            &[nb[1], nb[3]],
            RAY_CHANNELS * nb[2],
        )?;
        let ray = g.cont(&ray)?.named("ray");
        let conf = g
            .scale_bias(&g.exp(&g.cont(&conf)?)?, 1.0, 1.0)?
            .named("ray_conf");
        Ok((ray, conf))
    }
}
