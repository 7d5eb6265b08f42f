//! The one graph builder of a session, and its cache: a graph of `views` views of one
//! processed size (one image is a scene of one view). Tokens are `[embed, tokens, views]`,
//! local blocks attend per view, global blocks over the scene, the head and the camera decoder
//! run batched over the views. When the reference view depends on the tokens (the saddle
//! strategies, three or more views), the forward is cut before block `alt_start - 1` into a
//! stem (image to those tokens, read by the host to select the reference) and a trunk (the
//! tokens to the outputs, with the camera token of every view chosen).

use super::{ModelShared, Session};
use crate::da3::backbone::BackboneConstants;
use crate::da3::head::{HeadConstants, UvEmbedding};
use crate::da3::ops::Ops;
use crate::da3::{preprocess, Error};
use crate::ggml::{BufferUsage, Context, DType, Graph, Tensor};
use std::collections::HashMap;

/// Graph capacity of one view: the giant variant builds about 2,700 nodes.
const GRAPH_NODES: usize = 8192;

/// Which blocks a graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Part {
    /// Image to outputs.
    Whole,
    /// Image to the tokens before block `n` (the input of the selection).
    Stem(usize),
    /// Tokens before block `n` to outputs.
    Trunk(usize),
}

/// What changes a graph: everything else (the weights, the plan) is the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct GraphKey {
    /// Processed width, a multiple of the patch size.
    pub width: usize,
    /// Processed height.
    pub height: usize,
    /// Views of the scene (1 for one image).
    pub views: usize,
    /// Which blocks run.
    pub part: Part,
    /// Whether the graph takes known cameras (through the camera encoder).
    pub posed: bool,
    /// Whether it computes the DualDPT ray branch.
    pub rays: bool,
    /// Whether it computes the 3D Gaussian head.
    pub gaussians: bool,
}

/// A session's graphs by [`GraphKey`], built on first use.
pub(super) type Graphs = HashMap<GraphKey, SceneGraph>;

/// One built graph and its named inputs and outputs.
pub(super) struct SceneGraph {
    pub graph: Graph,
    /// The image `[W, H, 3, views]` (Whole, Stem) or the tokens `[embed, tokens * views]`.
    pub input: Tensor,
    /// i32 `[views]`: the camera token of every view (several views with `alt_start`).
    pub slots: Option<Tensor>,
    /// Known cameras: f32 `[9, views]`, the camera encoder's input.
    pub pose_encoding: Option<Tensor>,
    /// Stem: the tokens it ends with.
    pub tokens_out: Option<Tensor>,
    /// Features of the out layers before the cut: outputs of the stem, inputs of the trunk.
    pub carried: Vec<Tensor>,
    pub depth: Option<Tensor>,
    pub confidence: Option<Tensor>,
    pub sky: Option<Tensor>,
    pub pose: Option<Tensor>,
    /// The ray branch: ray `[w, h, 6, views]` and its confidence `[w, h, views]`.
    pub rays: Option<(Tensor, Tensor)>,
    /// The Gaussian head's output `[w, h, channels, views]`.
    pub gaussians: Option<Tensor>,
    /// Trunk graphs with the Gaussian head: the image `[W, H, 3, views]` (the merger's input).
    pub image: Option<Tensor>,
    pub probes: Vec<(String, Tensor)>,
    /// Keeps the graph's tensors and the constants alive.
    _ctx: Ops,
    _constants: Context,
}

/// The constants a graph of one size reads, in a context of their own: the resampled
/// position embedding, the RoPE positions (repeated for each view of a scene) and the head's
/// UV embeddings.
struct Constants {
    ctx: Context,
    pos: Tensor,
    positions: Vec<Tensor>,
    stage_uv: Vec<Tensor>,
    output_uv: Option<UvEmbedding>,
    /// The ray branch's UV embedding (graphs with rays, heads with UV embeddings).
    ray_uv: Option<UvEmbedding>,
}

impl Session {
    /// The cached graph of `key`, built on first use.
    pub(super) fn graph_of(&mut self, key: GraphKey) -> Result<&SceneGraph, Error> {
        if !self.graphs.contains_key(&key) {
            let graph = self.build(key)?;
            self.graphs.insert(key, graph);
        }
        Ok(&self.graphs[&key])
    }

    /// The patch grid of a processed size; an error unless both sides are positive multiples
    /// of the patch size.
    pub(super) fn patch_grid(&self, width: usize, height: usize) -> Result<(usize, usize), Error> {
        let p = self.model.shared.config.vit.patch_size;
        if !width.is_multiple_of(p) || !height.is_multiple_of(p) || width < p || height < p {
            return Err(Error::Input(format!(
                "processed size {width}x{height} is not a positive multiple of the patch size {p}"
            )));
        }
        Ok((width / p, height / p))
    }

    /// Declares, allocates on the device and writes the constants of `key`'s graph.
    fn constants(&self, key: GraphKey) -> Result<Constants, Error> {
        let shared = &self.model.shared;
        let GraphKey {
            width,
            height,
            views,
            ..
        } = key;
        let (gw, gh) = self.patch_grid(width, height)?;
        let tokens = (gw * gh + 1) as i64;
        let ctx = Context::metadata_with_graph(16, 1)?;
        let e = shared.config.vit.embed_dim as i64;
        let pos = ctx
            .new_tensor(DType::F32, &[e, tokens])?
            .named("pos_embed.resampled");
        let positions = ["local", "global"]
            .into_iter()
            .map(|kind| {
                ctx.new_tensor(DType::I32, &[4 * tokens * views as i64])
                    .map(|t| t.named(&format!("rope.{kind}_positions")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        // The UV embeddings exist only for heads that add them.
        let head = &shared.config.head;
        let half = head.features / 2;
        let (stage_uv, output_uv) = if head.pos_embed {
            let stages = head
                .out_channels
                .iter()
                .map(|&c| ctx.new_tensor(DType::F32, &[gw as i64, gh as i64, c as i64, 1]))
                .collect::<Result<_, _>>()?;
            let output = UvEmbedding::declare(&ctx, width, height, half)?;
            (stages, Some(output))
        } else {
            (Vec::new(), None)
        };
        // The ray branch's map: twice the finest stage (4x the patch grid), 8x the grid.
        let ray_uv = if key.rays && head.pos_embed {
            Some(UvEmbedding::declare(&ctx, 8 * gw, 8 * gh, half)?)
        } else {
            None
        };
        ctx.allocate_on(self.executor.device(), BufferUsage::Any)?;

        let aspect = width as f64 / height as f64;
        if let Some(uv) = &ray_uv {
            uv.write(&ctx, aspect)?;
        }
        ctx.write(&pos, &self.resampled_pos_embed(gh, gw)?)?;
        let (local, global) = rope_positions(gh, gw, views);
        ctx.write(&positions[0], &local)?;
        ctx.write(&positions[1], &global)?;
        for (t, &channels) in stage_uv.iter().zip(&head.out_channels) {
            ctx.write(t, &scaled_uv(gw, gh, channels, aspect)?)?;
        }
        if let Some(uv) = &output_uv {
            uv.write(&ctx, aspect)?;
        }
        Ok(Constants {
            ctx,
            pos,
            positions,
            stage_uv,
            output_uv,
            ray_uv,
        })
    }

    fn build(&self, key: GraphKey) -> Result<SceneGraph, Error> {
        let shared = &self.model.shared;
        let GraphKey {
            width,
            height,
            views,
            part,
            posed,
            rays: with_rays,
            gaussians: with_gaussians,
        } = key;
        let v = &shared.config.vit;
        let (gw, gh) = self.patch_grid(width, height)?;
        let tokens = gw * gh + 1;
        let s = views as i64;
        let e = v.embed_dim as i64;

        let Constants {
            ctx: constants,
            pos,
            positions,
            stage_uv,
            output_uv,
            ray_uv,
        } = self.constants(key)?;

        // The per-view parts (head, camera decoder) add about 160 nodes a view.
        let nodes = GRAPH_NODES + 256 * views;
        let ctx = graph_context(shared, nodes)?;
        let input = match part {
            Part::Whole | Part::Stem(_) => ctx
                .new_tensor(DType::F32, &[width as i64, height as i64, 3, s])?
                .named("image"),
            Part::Trunk(_) => ctx
                .new_tensor(DType::F32, &[e, tokens as i64 * s])?
                .named("tokens"),
        };
        input.mark_input();
        let gaussian_head = self.layers.gaussians.as_ref().filter(|_| with_gaussians);
        // A trunk starts from tokens; the Gaussian head also reads the image.
        let image = match (part, gaussian_head) {
            (Part::Trunk(_), Some(_)) => {
                let t = ctx
                    .new_tensor(DType::F32, &[width as i64, height as i64, 3, s])?
                    .named("image");
                t.mark_input();
                Some(t)
            }
            _ => None,
        };
        let needs_slots =
            views > 1 && v.alt_start.is_some() && !posed && !matches!(part, Part::Stem(_));
        let slots = if needs_slots {
            let t = ctx.new_tensor(DType::I32, &[s])?.named("camera_slots");
            t.mark_input();
            Some(t)
        } else {
            None
        };
        let attention = shared.plan.attention();
        let (pose_encoding, camera_tokens) = match (posed, &self.layers.camera_encoder) {
            (false, _) => (None, None),
            (true, Some(encoder)) if v.alt_start.is_some() && part == Part::Whole => {
                let t = ctx
                    .new_tensor(DType::F32, &[9, s])?
                    .named("pose_encoding_in");
                t.mark_input();
                let tokens = encoder.forward(&ctx, &t, attention)?;
                (Some(t), Some(tokens))
            }
            (true, _) => {
                return Err(Error::Input(
                    "this model cannot take known poses (no camera encoder)".to_owned(),
                ))
            }
        };
        let bconst = BackboneConstants {
            pos_embed: pos,
            local_positions: positions[0].clone(),
            global_positions: positions[1].clone(),
            attention,
            views,
            camera_slots: slots.clone(),
            camera_tokens,
        };
        let (x, blocks) = match part {
            Part::Whole => (
                self.layers.backbone.embed(&ctx, &input, &bconst)?,
                0..v.depth,
            ),
            Part::Stem(n) => (self.layers.backbone.embed(&ctx, &input, &bconst)?, 0..n),
            Part::Trunk(n) => (input.clone(), n..v.depth),
        };
        // Out layers before the cut: the stem hands their features to the trunk.
        let carried_in: Vec<Tensor> = match part {
            Part::Trunk(n) => v
                .out_layers
                .iter()
                .filter(|&&layer| layer < n)
                .map(|layer| {
                    let t = ctx
                        .new_tensor(DType::F32, &[v.feature_dim() as i64, tokens as i64 - 1, s])?
                        .named(&format!("carried.{layer}"));
                    t.mark_input();
                    Ok(t)
                })
                .collect::<Result<_, Error>>()?,
            _ => Vec::new(),
        };
        let mut features = self
            .layers
            .backbone
            .forward_blocks(&ctx, &x, blocks, &bconst)?;
        let carried = match part {
            Part::Stem(_) => features.features.clone(),
            _ => carried_in.clone(),
        };
        if !carried_in.is_empty() {
            features.features = carried_in.into_iter().chain(features.features).collect();
        }
        let graph = ctx.new_graph(nodes)?;
        let mut built = SceneGraph {
            graph,
            input,
            slots,
            pose_encoding,
            tokens_out: None,
            carried,
            depth: None,
            confidence: None,
            sky: None,
            pose: None,
            rays: None,
            gaussians: None,
            image,
            probes: Vec::new(),
            _ctx: ctx,
            _constants: constants,
        };
        let ctx = &built._ctx;
        let mut outputs: Vec<Tensor> = Vec::new();
        if let Part::Stem(_) = part {
            let t = features.tokens_out.clone();
            outputs.push(t.clone());
            outputs.extend(built.carried.iter().cloned());
            built.tokens_out = Some(t);
        } else {
            let hconst = HeadConstants {
                stage_uv,
                output_uv,
            };
            let out = self.layers.head.forward(
                ctx,
                &features.features,
                (gw as i64, gh as i64),
                (width as i64, height as i64),
                &hconst,
            )?;
            built.pose = match (&self.layers.camera, &features.camera_token) {
                (Some(cam), Some(token)) => Some(cam.forward(ctx, token)?),
                _ => None,
            };
            if let (true, Some(rays)) = (with_rays, &self.layers.rays) {
                let (ray, conf) = rays.forward(ctx, &out.stages, ray_uv.as_ref())?;
                outputs.push(ray.clone());
                outputs.push(conf.clone());
                built.rays = Some((ray, conf));
            }
            if let Some(head) = gaussian_head {
                let image = built.image.as_ref().unwrap_or(&built.input);
                let raw = head.forward(
                    ctx,
                    &features.features,
                    image,
                    (gw as i64, gh as i64),
                    &hconst,
                )?;
                outputs.push(raw.clone());
                built.gaussians = Some(raw);
            }
            if shared.probes {
                built
                    .probes
                    .push(("depth_logits".to_owned(), out.depth_logits.clone()));
            }
            outputs.push(out.depth.clone());
            outputs.extend(out.confidence.iter().cloned());
            outputs.extend(out.sky.iter().cloned());
            outputs.extend(built.pose.iter().cloned());
            built.depth = Some(out.depth);
            built.confidence = out.confidence;
            built.sky = out.sky;
            if shared.probes {
                if part == Part::Whole {
                    built
                        .probes
                        .push(("tokens_in".to_owned(), features.tokens_in.clone()));
                }
                for (i, f) in features.features.iter().enumerate() {
                    built.probes.push((format!("feat{i}"), f.clone()));
                }
                if let Some(t) = &features.camera_token {
                    built.probes.push(("cam_token".to_owned(), t.clone()));
                }
            }
        }
        for t in outputs.iter().chain(built.probes.iter().map(|(_, t)| t)) {
            t.mark_output();
            built.graph.expand(t)?;
        }
        Ok(built)
    }

    /// `vit.pos_embed` resampled to the patch grid, returned as [embed, tokens] (token-major
    /// rows of `embed` values, which is ggml's [embed, tokens]).
    fn resampled_pos_embed(&self, gh: usize, gw: usize) -> Result<Vec<f32>, Error> {
        let shared = &self.model.shared;
        let v = &shared.config.vit;
        let e = v.embed_dim;
        let grid = v.pos_embed_grid;
        let (cls, patches) = shared.pos_embed.split_at(e);
        let resampled = preprocess::resample_pos_embed(
            patches,
            e,
            grid,
            grid,
            gh,
            gw,
            v.interpolate_offset as f64,
        )?;
        let mut out = Vec::with_capacity(e * (gh * gw + 1));
        out.extend_from_slice(cls);
        out.extend_from_slice(&resampled);
        Ok(out)
    }
}

/// The ops of a new graph of up to `nodes` nodes (and the tensors they make) of `shared`'s
/// model, resolved through its execution plan: on the CPU, our kernels where the plan runs
/// them (direct convolutions, fused attention), in the precision the weights were loaded for;
/// a graph for another device keeps to ops every backend has.
fn graph_context(shared: &ModelShared, nodes: usize) -> Result<Ops, Error> {
    let ctx = Context::metadata_with_graph(3 * nodes, nodes)?;
    Ok(Ops::new(ctx, shared.plan.cpu_kernels().copied()))
}

fn scaled_uv(w: usize, h: usize, channels: usize, aspect: f64) -> Result<Vec<f32>, Error> {
    Ok(
        preprocess::uv_embedding_with_aspect(w, h, channels, aspect)?
            .into_iter()
            .map(|v| v * 0.1)
            .collect(),
    )
}

/// RoPE positions of local and of global blocks for `views` views of a `gh` x `gw` patch
/// grid, each `[rows; columns; 0; 0]` over all tokens ([`BackboneConstants`]'s layout):
/// local (row+1, col+1) per patch, global (1, 1) for every patch, token 0 at (0, 0) in both;
/// the same in every view (no view index, as the official code tiles them).
fn rope_positions(gh: usize, gw: usize, views: usize) -> (Vec<i32>, Vec<i32>) {
    let n = gh * gw + 1;
    let (mut ly, mut lx) = (vec![0i32; n], vec![0i32; n]);
    for r in 0..gh {
        for c in 0..gw {
            ly[1 + r * gw + c] = r as i32 + 1;
            lx[1 + r * gw + c] = c as i32 + 1;
        }
    }
    let mut global = vec![1i32; n];
    global[0] = 0;
    let unused = vec![0i32; 2 * n * views];
    let layout = |rows: &[i32], cols: &[i32]| {
        [rows.repeat(views), cols.repeat(views), unused.clone()].concat()
    };
    (layout(&ly, &lx), layout(&global, &global))
}
