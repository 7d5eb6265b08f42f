//! The DINOv2 backbone with DA3's additions: a camera token, 2D RoPE, QK-norm, and
//! alternating local/global attention. Tokens are `[embed, n_tokens]` (ggml order), token 0
//! first.

use super::architecture::camera_encoder_vit;
use super::config::{Ffn, VitConfig};
use super::layers::{Linear, Norm};
use super::ops::Ops;
use super::weights::BoundWeights;
use super::Error;
use crate::ggml::{RopeMode, Tensor, TensorView};

/// Host-computed inputs that depend only on the resolution (set once per graph).
pub struct BackboneConstants {
    /// Positional embedding resampled to the patch grid, cls row first: [embed, tokens].
    pub pos_embed: Tensor,
    /// RoPE positions of local blocks ("patch at (r+1, c+1)") and of global ones (every
    /// patch at (1, 1) for a single view), token 0 at (0, 0) in both: i32 `[4 * tokens]`, the
    /// rows of all tokens, then their columns, then zeros (the layout of ggml's vision-mode
    /// RoPE, [`RopeLayout::Vision`]).
    pub local_positions: Tensor,
    pub global_positions: Tensor,
    /// How attention is computed ([`AttentionKernel::for_device`]).
    pub attention: AttentionKernel,
    /// Views of one scene in the graph (1 for a single image). Tokens are then
    /// `[embed, tokens, views]`, stored as `[embed, tokens * views]`, and the positions above
    /// hold `tokens * views` values (the same per view, as the official code tiles them).
    pub views: usize,
    /// With several views: which camera token (0 reference, 1 other) each view takes at
    /// `alt_start`, i32 `[views]`, written per request.
    pub camera_slots: Option<Tensor>,
    /// Known cameras: the camera encoder's token of every view, `[embed, views]`, which
    /// replaces token 0 at `alt_start` instead of the learnt camera tokens (the official
    /// `cam_token` argument); `camera_slots` is then unused.
    pub camera_tokens: Option<Tensor>,
}

enum FfnWeights {
    Mlp { fc1: Linear, fc2: Linear },
    SwiGlu { w12: Linear, w3: Linear },
}

struct Block {
    norm1: Norm,
    attn_qkv: Linear,
    qk_norm: Option<(Norm, Norm)>,
    attn_proj: Linear,
    /// The layer scales; none where folded into the layer before
    /// ([`super::weights::Loader::fold_affine`]).
    ls1: Option<Tensor>,
    norm2: Norm,
    ffn: FfnWeights,
    ls2: Option<Tensor>,
    /// How the block's queries and keys are rotated, if they are.
    rope: Option<RopeLayout>,
}

/// How a block's 2D RoPE is computed. DA3 rotates the first half of each head by the token's
/// row and the second by its column, each half in rotate-half pairs `(i, i + D/4)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RopeLayout {
    /// As the file lays heads out: one rotation per half, two nodes for each of Q and K.
    Halves,
    /// The heads' second and third quarters swapped at load (the rows of the QKV weight and
    /// bias, and the QK-norm's scale and shift, for Q and K, as the architecture's
    /// [`super::architecture::TensorSpec::vision_rope_rows`] give them; attention scores do
    /// not change when Q and K permute alike): the pairs are then `(i, i + D/2)`, the row axis
    /// on the first quarter and the column axis on the second, one node of ggml's vision mode
    /// for each of Q and K (on GPUs, where each node is a kernel: DA3-large's 64 rotations 32).
    Vision,
}

/// Backbone weights.
pub struct Backbone {
    cfg: VitConfig,
    patch_embed_w: Tensor,
    patch_embed_b: Tensor,
    cls_token: Tensor,
    camera_token: Option<Tensor>,
    blocks: Vec<Block>,
    norm: Norm,
}

/// What the head and the camera decoder take from the backbone.
pub struct BackboneOutput {
    /// Per out layer, patch tokens only: [feature_dim, n_patches] (one view) or
    /// [feature_dim, n_patches, views].
    pub features: Vec<Tensor>,
    /// Token 0 of the last out layer, concat(local_x, x), not normalised: [feature_dim, views].
    /// Absent when the blocks run stop before the last out layer.
    pub camera_token: Option<Tensor>,
    /// The tokens the first block of the run received (after patch and positional embedding
    /// for a run from block 0), for stage checks.
    pub tokens_in: Tensor,
    /// The tokens after the last block of the run: [embed, tokens * views].
    pub tokens_out: Tensor,
}

/// How attention is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionKernel {
    /// Exact, in f32: the CPU kernels' fused attention, or explicit products elsewhere.
    Exact,
    /// ggml's fused kernel (`flash_attn_ext`) with K and V rounded to f16 and f32 sums,
    /// what GPUs run fastest (about 1e-5 on DA3's depth correlation). With `convert_in_graph`
    /// the graph converts K and V (Metal and Vulkan take f16 only); without, the backend
    /// converts f32 ones itself (CUDA, where that beat the graph's copies of the permuted
    /// views: DA3-large on an H200 13.7-14.1 ms against 14.3, the same depth bit for bit).
    FusedHalfKv { convert_in_graph: bool },
}

impl AttentionKernel {
    /// The kernel for `device`: fused on a GPU, exact on the CPU and on an RPC server
    /// (which computes on a CPU whatever it reports). Part of the execution plan.
    pub fn for_device(device: &crate::ggml::Device) -> Self {
        let gpu = matches!(
            device.kind(),
            crate::ggml::DeviceKind::Gpu | crate::ggml::DeviceKind::IntegratedGpu
        );
        if device.is_rpc() || !gpu {
            return AttentionKernel::Exact;
        }
        AttentionKernel::FusedHalfKv {
            convert_in_graph: !super::plan::is_cuda(device),
        }
    }
}

/// How a block attends.
#[derive(Debug, Clone, Copy)]
struct AttentionMode {
    kernel: AttentionKernel,
    /// With more than 1, the T tokens are that many views of T / views tokens each and every
    /// view attends only within itself (a local block of a scene); a global block has 1: all
    /// tokens attend jointly.
    views: usize,
}

impl Block {
    /// Block `i` of a stack shaped by `cfg`, its tensors under `p`. Where the loader folded
    /// (GPUs), each norm's scale and shift are part of the layer after it and each layer scale
    /// of the layer before: 3 of a block's kernels instead of 9.
    fn bind(w: &BoundWeights<'_>, cfg: &VitConfig, p: &str, i: usize) -> Result<Self, Error> {
        let eps = cfg.block_ln_eps;
        let (ffn_in, ffn_out) = match cfg.ffn {
            Ffn::Mlp => (format!("{p}.mlp_fc1"), format!("{p}.mlp_fc2")),
            Ffn::SwiGlu => (format!("{p}.mlp_w12"), format!("{p}.mlp_w3")),
        };
        let qkv = format!("{p}.attn_qkv");
        // The QK-norm of a folded block is an RMS norm of heads the QKV layer centres: one
        // fused kernel for each of Q and K on GPUs instead of three.
        let centred_heads = w.centres(&qkv);
        let qk_norm = match cfg.qknorm_start.is_some_and(|start| i >= start) {
            true => {
                let norm = |name: &str| {
                    Norm::bind_centred(w, &format!("{p}.{name}"), cfg.qk_ln_eps, centred_heads)
                };
                Some((norm("attn_qnorm")?, norm("attn_knorm")?))
            }
            false => None,
        };
        let ffn = match cfg.ffn {
            Ffn::Mlp => FfnWeights::Mlp {
                fc1: Linear::bind(w, &ffn_in)?,
                fc2: Linear::bind(w, &ffn_out)?,
            },
            Ffn::SwiGlu => FfnWeights::SwiGlu {
                w12: Linear::bind(w, &ffn_in)?,
                w3: Linear::bind(w, &ffn_out)?,
            },
        };
        let scale = |name: String| match w.folded_away(&name) {
            true => Ok(None),
            false => w.tensor(&name).map(Some),
        };
        let rotates = cfg.rope_start.is_some_and(|s| i >= s);
        let rope = rotates.then(|| match w.rows_reordered(&format!("{qkv}.weight")) {
            true => RopeLayout::Vision,
            false => RopeLayout::Halves,
        });
        Ok(Block {
            norm1: Norm::bind(w, &format!("{p}.norm1"), eps)?,
            attn_qkv: Linear::bind(w, &qkv)?,
            qk_norm,
            attn_proj: Linear::bind(w, &format!("{p}.attn_proj"))?,
            ls1: scale(format!("{p}.ls1"))?,
            norm2: Norm::bind(w, &format!("{p}.norm2"), eps)?,
            ffn,
            ls2: scale(format!("{p}.ls2"))?,
            rope,
        })
    }

    /// `x + ls1 * proj(attn(norm1(x)))`, then `+ ls2 * ffn(norm2(x))`.
    fn forward(
        &self,
        g: &Ops,
        cfg: &VitConfig,
        x: &Tensor,
        pos: Option<&Tensor>,
        mode: AttentionMode,
        name: &str,
    ) -> Result<Tensor, Error> {
        let h = self.norm1.forward(g, x)?;
        let heads = self.attention(g, cfg, &h, pos, mode)?;
        let x = self
            .attn_proj
            .forward_scaled_residual(g, &heads, self.ls1.as_ref(), x)?;
        let h = self.norm2.forward(g, &x)?;
        let (hidden, out) = match &self.ffn {
            FfnWeights::Mlp { fc1, fc2 } => (fc1.forward_gelu(g, &h)?, fc2),
            // w12's output holds both halves of each row; one GLU node computes silu of the
            // first times the second.
            FfnWeights::SwiGlu { w12, w3 } => (g.swiglu(&w12.forward(g, &h)?)?, w3),
        };
        Ok(out
            .forward_scaled_residual(g, &hidden, self.ls2.as_ref(), &x)?
            .named(name))
    }

    /// Self-attention of `h` up to the joined heads [E, T], before the output projection
    /// (which the caller fuses with the residual).
    fn attention(
        &self,
        g: &Ops,
        cfg: &VitConfig,
        h: &Tensor,
        pos: Option<&Tensor>,
        mode: AttentionMode,
    ) -> Result<Tensor, Error> {
        let AttentionMode { kernel, views } = mode;
        let (e, heads, d) = (
            cfg.embed_dim as i64,
            cfg.num_heads as i64,
            cfg.head_dim() as i64,
        );
        let qkv = self.attn_qkv.forward(g, h)?; // [3E, T], rows ordered (q|k|v, head, dim)
        let t = qkv.ne()[1];
        // [D, H, T] views, not copies: norm, RoPE and attention read strided rows.
        let row = qkv.nb()[1];
        let split = |i: i64| {
            g.view(
                &qkv,
                &[d, heads, t],
                &[d as usize * 4, row],
                (i * e) as usize * 4,
            )
        };
        let (mut q, mut k, v) = (split(0)?, split(1)?, split(2)?);
        if let Some((qn, kn)) = &self.qk_norm {
            q = qn.forward(g, &q)?;
            k = kn.forward(g, &k)?;
        }
        if let (Some(layout), Some(pos)) = (self.rope, pos) {
            q = rope_2d(g, &q, pos, layout, cfg.rope_freq)?;
            k = rope_2d(g, &k, pos, layout, cfg.rope_freq)?;
        }
        // [D, H, T] -> [D, T, H]; with views, [D, H, T/S, S] -> [D, T/S, H, S] (a batch of
        // views for the attention op).
        let s = views as i64;
        let per_head = |x: &Tensor| {
            if s == 1 {
                return g.permute(x, [0, 2, 1, 3]);
            }
            let nb = x.nb();
            let per_view = g.view(
                x,
                &[d, heads, t / s, s],
                &[nb[1], nb[2], nb[2] * (t / s) as usize],
                0,
            )?;
            g.permute(&per_view, [0, 2, 1, 3])
        };
        let scale = 1.0 / (d as f32).sqrt();
        let out = match kernel {
            AttentionKernel::Exact => {
                g.attention(&per_head(&q)?, &per_head(&k)?, &per_head(&v)?, scale)?
            }
            AttentionKernel::FusedHalfKv {
                convert_in_graph: false,
            } => g.flash_attn_ext(&per_head(&q)?, &per_head(&k)?, &per_head(&v)?, None, scale)?,
            AttentionKernel::FusedHalfKv {
                convert_in_graph: true,
            } => g.attention_half_kv(&per_head(&q)?, &per_head(&k)?, &per_head(&v)?, scale)?,
        }; // [D, H, T] (or [D, H, T/S, S])
        Ok(g.reshape(&out, &[e, t])?)
    }
}

/// 2D RoPE of `x [D, H, T]` by `positions` (rows, then columns, then zeros: `[4 T]`): the
/// first half of each head rotates by the row position, the second by the column, each with
/// rotate-half pairing (i, i + D/4) and frequencies `freq^(-4i/D)`. Laid out in halves, two
/// in-row rotations (no halves copied out and joined again); laid out for vision mode, one.
fn rope_2d(
    g: &Ops,
    x: &Tensor,
    positions: &Tensor,
    layout: RopeLayout,
    freq: f32,
) -> Result<Tensor, Error> {
    let half = x.ne()[0] as usize / 2;
    if layout == RopeLayout::Vision {
        return Ok(g.rope_vision(x, positions, [half / 2, half / 2], freq)?);
    }
    let t = x.ne()[2];
    let rows = g.view(positions, &[t], &[], 0)?;
    let cols = g.view(positions, &[t], &[], t as usize * 4)?;
    let y_rotated = g.rope_at(x, &rows, 0, half, RopeMode::Neox, freq)?;
    Ok(g.rope_at(&y_rotated, &cols, half, half, RopeMode::Neox, freq)?)
}

impl Backbone {
    /// The backbone of `cfg` (`vit.*`).
    pub fn bind(w: &BoundWeights<'_>, cfg: &VitConfig) -> Result<Self, Error> {
        Ok(Backbone {
            cfg: cfg.clone(),
            patch_embed_w: w.tensor("vit.patch_embed.weight")?,
            patch_embed_b: w.tensor("vit.patch_embed.bias")?,
            cls_token: w.tensor("vit.cls_token")?,
            camera_token: match cfg.alt_start {
                Some(_) => Some(w.tensor("vit.camera_token")?),
                None => None,
            },
            blocks: (0..cfg.depth)
                .map(|i| Block::bind(w, cfg, &format!("vit.blk.{i}"), i))
                .collect::<Result<Vec<_>, _>>()?,
            norm: Norm::bind(w, "vit.norm", cfg.final_ln_eps)?,
        })
    }

    /// Patch embedding, cls token and positional embedding: [embed, tokens * views].
    pub fn embed(&self, g: &Ops, image: &Tensor, c: &BackboneConstants) -> Result<Tensor, Error> {
        let cfg = &self.cfg;
        let (e, p) = (cfg.embed_dim as i64, cfg.patch_size as i32);
        let s = c.views as i64;
        // Patch embedding as one product: columns [3*p*p, gw, gh, S] x kernel -> [E, patches].
        let columns = g.im2col(
            &self.patch_embed_w,
            image,
            (p, p),
            (0, 0),
            (1, 1),
            crate::ggml::DType::F32,
        )?;
        let [k, gw, gh, _] = columns.ne();
        let columns = g.reshape(&columns, &[k, gw * gh * s])?;
        let kernel = g.reshape(&self.patch_embed_w, &[k, e])?;
        let patches = g.add(&g.mul_mat(&kernel, &columns)?, &self.patch_embed_b)?;
        let cls = g.reshape(&self.cls_token, &[e, 1])?;
        if s == 1 {
            let tokens = g.concat(&cls, &patches, 1)?;
            return Ok(g.add(&tokens, &c.pos_embed)?.named("tokens_in"));
        }
        // Per view: the cls token, then that view's patches; the same positional embedding.
        let mut cls_per_view = cls.clone();
        for _ in 1..s {
            cls_per_view = g.concat(&cls_per_view, &cls, 1)?;
        }
        let cls_per_view = g.reshape(&cls_per_view, &[e, 1, s])?;
        let patches = g.reshape(&patches, &[e, gw * gh, s])?;
        let tokens = g.add(&g.concat(&cls_per_view, &patches, 1)?, &c.pos_embed)?;
        Ok(g.reshape(&tokens, &[e, (gw * gh + 1) * s])?
            .named("tokens_in"))
    }

    /// Runs `blocks` on `x` ([embed, tokens * views], the input of the first of them). A run
    /// that starts after `alt_start` would miss the camera token; one that starts at a global
    /// block has no latest local output: both are refused.
    pub fn forward_blocks(
        &self,
        g: &Ops,
        x: &Tensor,
        blocks: std::ops::Range<usize>,
        c: &BackboneConstants,
    ) -> Result<BackboneOutput, Error> {
        let cfg = &self.cfg;
        let e = cfg.embed_dim as i64;
        let is_global = |i: usize| cfg.alt_start.is_some_and(|s| i >= s && i % 2 == 1);
        if blocks.end > cfg.depth
            || cfg.alt_start.is_some_and(|a| blocks.start > a)
            || (blocks.start < blocks.end && is_global(blocks.start))
        {
            return Err(Error::Input(format!(
                "cannot run backbone blocks {blocks:?} on their own (depth {}, alt_start {:?})",
                cfg.depth, cfg.alt_start
            )));
        }
        let tokens_in = x.clone();
        let mut x = x.clone();
        let s = c.views as i64;
        let t = x.ne()[1] / s; // tokens per view
        let row = x.nb()[1];

        let mut local_x = x.clone();
        let mut features = Vec::new();
        let mut camera_token = None;
        for i in blocks {
            let block = &self.blocks[i];
            if cfg.alt_start == Some(i) {
                let cam = self.camera_token.as_ref().expect("loaded with alt_start");
                x = if let Some(tokens) = &c.camera_tokens {
                    // Token 0 of each view := the encoded camera of that view.
                    let cams = g.reshape(tokens, &[e, 1, s])?;
                    let rest = g.view(&x, &[e, t - 1, s], &[row, row * t as usize], row)?;
                    g.reshape(&g.concat(&cams, &rest, 1)?, &[e, t * s])?
                } else if s == 1 {
                    let cam0 = g.view(cam, &[e, 1], &[cam.nb()[1]], 0)?;
                    let rest = g.view(&x, &[e, t - 1], &[row], row)?;
                    g.concat(&cam0, &rest, 1)?
                } else {
                    // Token 0 of each view := camera_token[slot of the view] (0 for the
                    // reference view, 1 for the others).
                    let slots = c.camera_slots.as_ref().ok_or_else(|| {
                        Error::Input("several views need camera slots".to_owned())
                    })?;
                    let table = g.reshape(cam, &[e, 2])?;
                    let cams = g.reshape(&g.get_rows(&table, slots)?, &[e, 1, s])?;
                    let rest = g.view(&x, &[e, t - 1, s], &[row, row * t as usize], row)?;
                    g.reshape(&g.concat(&cams, &rest, 1)?, &[e, t * s])?
                };
            }
            let global = is_global(i);
            let pos = match global {
                true => &c.global_positions,
                false => &c.local_positions,
            };
            let mode = AttentionMode {
                kernel: c.attention,
                views: if global { 1 } else { c.views },
            };
            x = block.forward(g, cfg, &x, Some(pos), mode, &format!("blk.{i}"))?;
            if !global {
                local_x = x.clone();
            }
            if cfg.out_layers.contains(&i) {
                let normed = self.norm.forward(g, &x)?;
                let (feature, raw) = if cfg.cat_token {
                    (
                        g.concat(&local_x, &normed, 0)?,
                        Some(g.concat(&local_x, &x, 0)?),
                    )
                } else {
                    (normed, None)
                };
                let c_dim = feature.ne()[0];
                let fr = feature.nb()[1];
                let patches = if s == 1 {
                    g.view(&feature, &[c_dim, t - 1], &[fr], fr)?
                } else {
                    g.view(&feature, &[c_dim, t - 1, s], &[fr, fr * t as usize], fr)?
                };
                features.push(g.cont(&patches)?.named(&format!("feat{}", features.len())));
                if let Some(raw) = raw {
                    let rr = raw.nb()[1];
                    camera_token =
                        Some(g.cont(&g.view(&raw, &[c_dim, s], &[rr * t as usize], 0)?)?);
                }
            }
        }
        let camera_token = match camera_token {
            Some(token) => Some(token),
            None if features.is_empty() => None,
            None => Some(g.cont(&g.view(&x, &[e, s], &[row * t as usize], 0)?)?),
        };
        Ok(BackboneOutput {
            features,
            camera_token,
            tokens_in,
            tokens_out: x,
        })
    }
}

/// The camera encoder (`cam_enc` of the DualDPT models): known cameras to camera tokens. The
/// official `CameraEnc`: the 9-value pose encoding of every view through an MLP (9 -> E/2,
/// GELU, -> E), a LayerNorm, four transformer blocks (16 heads, MLP ratio 4, LayerScale, no
/// RoPE, no QK-norm) attending over the views of the scene, and a final LayerNorm; every
/// LayerNorm with PyTorch's default epsilon 1e-5.
pub struct CameraEncoder {
    cfg: VitConfig,
    fc1: Linear,
    fc2: Linear,
    token_norm: Norm,
    blocks: Vec<Block>,
    trunk_norm: Norm,
}

impl CameraEncoder {
    /// The encoder beside a backbone of `vit`, where the model loaded one.
    pub fn bind(w: &BoundWeights<'_>, vit: &VitConfig) -> Result<Option<Self>, Error> {
        if !w.has("cam_enc.token_norm.weight") {
            return Ok(None);
        }
        let cfg = camera_encoder_vit(vit);
        let eps = cfg.final_ln_eps;
        Ok(Some(CameraEncoder {
            fc1: Linear::bind(w, "cam_enc.pose.fc1")?,
            fc2: Linear::bind(w, "cam_enc.pose.fc2")?,
            token_norm: Norm::bind(w, "cam_enc.token_norm", eps)?,
            blocks: (0..cfg.depth)
                .map(|i| Block::bind(w, &cfg, &format!("cam_enc.blk.{i}"), i))
                .collect::<Result<Vec<_>, _>>()?,
            trunk_norm: Norm::bind(w, "cam_enc.trunk_norm", eps)?,
            cfg,
        }))
    }

    /// `encoding`: `[9, views]` (t, quaternion xyzw, fov h/w of camera-to-world poses) ->
    /// camera tokens `[embed, views]`.
    pub fn forward(
        &self,
        g: &Ops,
        encoding: &Tensor,
        kernel: AttentionKernel,
    ) -> Result<Tensor, Error> {
        let h = self.fc2.forward(g, &self.fc1.forward_gelu(g, encoding)?)?;
        let mut x = self.token_norm.forward(g, &h)?;
        let mode = AttentionMode { kernel, views: 1 };
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(g, &self.cfg, &x, None, mode, &format!("cam_enc.blk.{i}"))?;
        }
        Ok(self.trunk_norm.forward(g, &x)?.named("cam_enc.tokens"))
    }
}
