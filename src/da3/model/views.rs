//! Several views of one scene through one graph: tokens `[embed, tokens, views]`, local blocks
//! per view, global blocks over the scene, the head and the camera decoder batched over the
//! views. When the reference view depends on the tokens (the saddle strategies, three or more
//! views), the graph is cut before block `alt_start - 1`: the first part's token 0 of every
//! view goes to [`select_reference_view`] on the host, and the second part continues from its
//! tokens with the camera token of every view chosen.

use super::*;
use crate::da3::head::RAY_CHANNELS;
use crate::da3::multiview::{
    camera_slots, positional_reference, select_reference_view, MultiPrediction, RefViewStrategy,
};
use crate::da3::outputs::RayMap;
use crate::da3::poses::{self, KnownPose};
use crate::ggml::TensorView;

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

/// A scene graph's key: width, height, views, part, whether it takes known cameras and
/// whether it computes the ray branch.
type ViewKey = (usize, usize, usize, Part, bool, bool);

/// A session's scene graphs by [`ViewKey`], built on first use.
pub(super) type ViewGraphs = HashMap<ViewKey, ViewsGraph>;

pub(super) struct ViewsGraph {
    graph: Graph,
    /// The image `[W, H, 3, views]` (Whole, Stem) or the tokens `[embed, tokens * views]`.
    input: Tensor,
    /// i32 `[views]`: the camera token of every view (several views with `alt_start`).
    slots: Option<Tensor>,
    /// Known cameras: f32 `[9, views]`, the camera encoder's input.
    pose_encoding: Option<Tensor>,
    /// Stem: the tokens it ends with.
    tokens_out: Option<Tensor>,
    /// Features of the out layers before the cut: outputs of the stem, inputs of the trunk.
    carried: Vec<Tensor>,
    depth: Option<Tensor>,
    confidence: Option<Tensor>,
    sky: Option<Tensor>,
    pose: Option<Tensor>,
    /// The ray branch: ray `[w, h, 6, views]` and its confidence `[w, h, views]`.
    rays: Option<(Tensor, Tensor)>,
    probes: Vec<(String, Tensor)>,
    _ctx: Ops,
    _constants: Context,
}

impl Model {
    /// Depth, confidence and pose for every image of one scene (the official multi-view
    /// forward, reference view by the official default `saddle_balanced`), in a session made
    /// for this call. For many scenes keep a [`Session`].
    pub fn predict_views(&self, images: &[image::DynamicImage]) -> Result<MultiPrediction, Error> {
        self.session()?.predict_views(images)
    }
}

impl Session {
    /// Whether scene predictions ([`Session::predict_views`] and the others of this
    /// session) also compute the DualDPT ray branch into [`Prediction::rays`] (off by
    /// default: the official forward computes and drops it). An error when the model file
    /// has no ray branch.
    pub fn set_ray_outputs(&mut self, on: bool) -> Result<(), Error> {
        if on && self.layers.rays.is_none() {
            return Err(Error::Input(
                "this model file has no ray branch (`head.scratch.*_aux` tensors; DualDPT \
                 models only, kept by `da3 convert`)"
                    .to_owned(),
            ));
        }
        self.ray_outputs = on;
        Ok(())
    }

    /// Whether scene predictions take each view's camera from the DualDPT ray branch instead
    /// of the camera decoder (the official `use_ray_pose`; see [`crate::ray_pose`]): a
    /// RANSAC homography per view, with fixed-seed samples. Off by default. An error when the
    /// model file has no ray branch; known poses are refused with it on (they are the output).
    pub fn set_ray_pose(&mut self, on: bool) -> Result<(), Error> {
        if on && self.layers.rays.is_none() {
            return Err(Error::Input(
                "ray pose needs the ray branch, which this model file does not have \
                 (`head.scratch.*_aux` tensors; DualDPT models only, kept by `da3 convert`)"
                    .to_owned(),
            ));
        }
        self.ray_pose = on;
        Ok(())
    }

    /// Whether scene graphs compute the ray branch (for its outputs or for ray pose).
    fn computes_rays(&self) -> bool {
        (self.ray_outputs || self.ray_pose) && self.layers.rays.is_some()
    }

    /// Every image of one scene, preprocessed at the model's process resolution (all must
    /// reach the same processed size), predicted together and post-processed per view; the
    /// reference view by the official default strategy (`saddle_balanced`).
    pub fn predict_views(
        &mut self,
        images: &[image::DynamicImage],
    ) -> Result<MultiPrediction, Error> {
        let processed = preprocess::preprocess_images(images, self.model.shared.process_res)?;
        self.predict_views_processed(&processed, RefViewStrategy::default())
    }

    /// [`Session::predict_views`] for 8-bit RGB images at an explicit process resolution
    /// and reference-view strategy.
    pub fn predict_views_at(
        &mut self,
        images: &[RgbImage8],
        process_res: usize,
        strategy: RefViewStrategy,
    ) -> Result<MultiPrediction, Error> {
        let processed = images
            .iter()
            .map(|im| preprocess::preprocess(im, process_res))
            .collect::<Result<Vec<_>, _>>()?;
        self.predict_views_processed(&processed, strategy)
    }

    /// [`Session::forward_views`] post-processed per view, as [`Session::predict_views_at`]:
    /// for callers that keep the preprocessed images (their `rgb8` colours 3D exports).
    pub fn predict_views_processed(
        &mut self,
        processed: &[ProcessedImage],
        strategy: RefViewStrategy,
    ) -> Result<MultiPrediction, Error> {
        let mut prediction = self.forward_views(processed, strategy)?;
        for view in &mut prediction.views {
            postprocess(view);
        }
        Ok(prediction)
    }

    /// Every image of one scene with its known camera (world-to-camera extrinsics and
    /// intrinsics in pixels of that image), through the camera encoder, at the model's
    /// process resolution; depth comes out in the units of the given cameras and the poses
    /// are the given ones (the official `inference(images, extrinsics, intrinsics)`, see
    /// [`crate::poses`]). View 0 is the reference.
    pub fn predict_views_with_poses(
        &mut self,
        images: &[image::DynamicImage],
        poses: &[KnownPose],
    ) -> Result<MultiPrediction, Error> {
        let images = images
            .iter()
            .map(RgbImage8::from_dynamic)
            .collect::<Result<Vec<_>, _>>()?;
        let res = self.model.shared.process_res;
        self.predict_views_with_poses_at(&images, res, poses)
    }

    /// [`Session::predict_views_with_poses`] for 8-bit RGB images at an explicit process
    /// resolution. [`MultiPrediction::pose_scale`] holds the scale the depth was divided by.
    pub fn predict_views_with_poses_at(
        &mut self,
        images: &[RgbImage8],
        process_res: usize,
        poses: &[KnownPose],
    ) -> Result<MultiPrediction, Error> {
        if poses.len() != images.len() {
            return Err(Error::Input(format!(
                "{} camera pose(s) for {} view(s): give one per view",
                poses.len(),
                images.len()
            )));
        }
        let processed = images
            .iter()
            .map(|im| preprocess::preprocess(im, process_res))
            .collect::<Result<Vec<_>, _>>()?;
        let mut intrinsics = Vec::with_capacity(images.len());
        for (im, pose) in images.iter().zip(poses) {
            let plan = preprocess::plan_resize(im.width, im.height, process_res)?;
            intrinsics.push(poses::processed_intrinsics(
                &pose.intrinsics,
                im.width,
                im.height,
                &plan,
            ));
        }
        let given: Vec<poses::Mat4> = poses.iter().map(|p| p.extrinsics).collect();
        let normalized = poses::normalize_extrinsics(&given);
        let encodings: Vec<[f32; 9]> = normalized
            .iter()
            .zip(&intrinsics)
            .zip(&processed)
            .map(|((e, k), im)| poses::pose_encoding(e, k, im.width, im.height))
            .collect();
        let mut prediction = self.forward_views_with_poses(&processed, &encodings)?;
        for view in &mut prediction.views {
            postprocess(view);
        }
        let scale = poses::align_to_known_poses(&mut prediction.views, &given, &intrinsics)?;
        prediction.pose_scale = Some(scale);
        Ok(prediction)
    }

    /// The network's outputs for preprocessed views with their cameras already encoded
    /// ([`poses::pose_encoding`] of the normalised extrinsics, one per view), before
    /// post-processing and before the alignment to the given cameras: depth and poses in the
    /// normalised frame, view 0 the reference.
    pub fn forward_views_with_poses(
        &mut self,
        images: &[ProcessedImage],
        encodings: &[[f32; 9]],
    ) -> Result<MultiPrediction, Error> {
        if encodings.len() != images.len() {
            return Err(Error::Input(format!(
                "{} pose encoding(s) for {} view(s)",
                encodings.len(),
                images.len()
            )));
        }
        if self.ray_pose {
            return Err(Error::Input(
                "known poses and ray pose do not go together: with known poses the output \
                 cameras are the given ones (turn ray pose off)"
                    .to_owned(),
            ));
        }
        if self.layers.camera_encoder.is_none() {
            return Err(Error::Input(
                if self.model.shared.camera_encoder == super::EncoderLoad::LeftOut {
                    "the model was loaded without its camera encoder, which known poses \
                     need: load it with `LoadOptions { camera_encoder: true, .. }`"
                } else {
                    "this model file has no camera encoder (`cam_enc.*` tensors), so it \
                     cannot take known poses; convert the checkpoint again with `da3 convert`"
                }
                .to_owned(),
            ));
        }
        let flat: Vec<f32> = encodings.iter().flatten().copied().collect();
        self.forward_scene(images, RefViewStrategy::First, Some(&flat))
    }

    /// The network's outputs for already preprocessed views of one scene (all of one size),
    /// in their order, before post-processing; `strategy` picks the reference view when there
    /// are three or more.
    pub fn forward_views(
        &mut self,
        images: &[ProcessedImage],
        strategy: RefViewStrategy,
    ) -> Result<MultiPrediction, Error> {
        let mut prediction = self.forward_scene(images, strategy, None)?;
        if self.ray_pose {
            for (i, view) in prediction.views.iter_mut().enumerate() {
                let rays = view
                    .rays
                    .as_ref()
                    .expect("ray pose computes the ray branch");
                let pose = crate::da3::ray_pose::pose_from_rays(rays, view.width, view.height)
                    .map_err(|e| Error::Input(format!("view {i}: {e}")))?;
                view.pose = Some(pose);
                if !self.ray_outputs {
                    // As the official forward, which drops them once the poses are solved.
                    view.rays = None;
                }
            }
        }
        Ok(prediction)
    }

    fn forward_scene(
        &mut self,
        images: &[ProcessedImage],
        strategy: RefViewStrategy,
        pose_encoding: Option<&[f32]>,
    ) -> Result<MultiPrediction, Error> {
        let first = images
            .first()
            .ok_or_else(|| Error::Input("a scene needs at least one view".to_owned()))?;
        let (w, h) = (first.width, first.height);
        if let Some(other) = images.iter().find(|im| (im.width, im.height) != (w, h)) {
            return Err(Error::Input(format!(
                "the views of a scene must share one processed size: {w}x{h} and {}x{}",
                other.width, other.height
            )));
        }
        let views = images.len();
        if let RefViewStrategy::View(v) = strategy {
            if v >= views {
                return Err(Error::Input(format!(
                    "reference view {v} of a scene of {views} view(s) (the first is 0)"
                )));
            }
        }
        let mut chw = Vec::with_capacity(first.chw.len() * views);
        for im in images {
            chw.extend_from_slice(&im.chw);
        }
        let alt_start = self.model.shared.config.vit.alt_start;
        let posed = pose_encoding.is_some();
        // Known cameras: no selection (the official backbone selects only without them).
        let known = if posed {
            Some(0)
        } else {
            positional_reference(views, strategy)
        };
        let (reference, part, tokens, carried) = match (known, alt_start) {
            (None, Some(cut)) if cut >= 1 => {
                // Run to the selection point, select, continue from the tokens.
                let stem = self.views_graph(w, h, views, Part::Stem(cut - 1), false)?;
                let stem = &self.view_graphs[&stem];
                let run = self.executor.run(&stem.graph)?;
                run.write(&stem.input, &chw)?;
                run.compute()?;
                let tokens = run.read::<f32>(stem.tokens_out.as_ref().expect("stem output"))?;
                let carried = stem
                    .carried
                    .iter()
                    .map(|t| run.read::<f32>(t))
                    .collect::<Result<Vec<_>, _>>()?;
                drop(run);
                let e = self.model.shared.config.vit.embed_dim;
                let per_view = tokens.len() / views;
                let token0: Vec<f32> = (0..views)
                    .flat_map(|v| tokens[v * per_view..v * per_view + e].iter().copied())
                    .collect();
                let reference = select_reference_view(&token0, e, strategy);
                (reference, Part::Trunk(cut - 1), tokens, carried)
            }
            _ => (known.unwrap_or(0), Part::Whole, chw, Vec::new()),
        };
        let key = self.views_graph(w, h, views, part, posed)?;
        let graph = &self.view_graphs[&key];
        let run = self.executor.run(&graph.graph)?;
        self.last_report = Some(run.report().clone());
        run.write(&graph.input, &tokens)?;
        if let (Some(t), Some(values)) = (&graph.pose_encoding, pose_encoding) {
            run.write(t, values)?;
        }
        for (t, values) in graph.carried.iter().zip(&carried) {
            run.write(t, values)?;
        }
        if let Some(slots) = &graph.slots {
            run.write(slots, &camera_slots(views, reference))?;
        }
        run.compute()?;
        let read = |t: &Option<Tensor>| t.as_ref().map(|t| run.read::<f32>(t)).transpose();
        let (depth, confidence, sky, pose) = (
            read(&graph.depth)?.expect("the trunk ends in depth"),
            read(&graph.confidence)?,
            read(&graph.sky)?,
            read(&graph.pose)?,
        );
        let rays = match &graph.rays {
            Some((ray, conf)) => {
                let (rw, rh) = (ray.ne()[0] as usize, ray.ne()[1] as usize);
                Some((rw, rh, run.read::<f32>(ray)?, run.read::<f32>(conf)?))
            }
            None => None,
        };
        let mut probes = Vec::new();
        for (name, t) in &graph.probes {
            probes.push((name.clone(), run.read::<f32>(t)?));
        }
        let plane = w * h;
        let per_view = |values: &Option<Vec<f32>>, v: usize, n: usize| {
            values.as_ref().map(|all| all[v * n..(v + 1) * n].to_vec())
        };
        let predictions = (0..views)
            .map(|v| Prediction {
                width: w,
                height: h,
                depth: depth[v * plane..(v + 1) * plane].to_vec(),
                confidence: per_view(&confidence, v, plane),
                sky: per_view(&sky, v, plane),
                pose: per_view(&pose, v, 9).map(|enc| Pose::from_encoding(&enc, w, h)),
                // Probes hold every view (views last).
                probes: probes.clone(),
                rays: rays.as_ref().map(|(rw, rh, ray, conf)| {
                    let n = rw * rh;
                    RayMap {
                        width: *rw,
                        height: *rh,
                        rays: ray[v * RAY_CHANNELS * n..(v + 1) * RAY_CHANNELS * n].to_vec(),
                        confidence: conf[v * n..(v + 1) * n].to_vec(),
                    }
                }),
            })
            .collect();
        Ok(MultiPrediction {
            views: predictions,
            reference,
            strategy,
            pose_scale: None,
            metric_scale: None,
        })
    }

    /// The key of the cached graph for this scene size and part (building it if needed).
    fn views_graph(
        &mut self,
        width: usize,
        height: usize,
        views: usize,
        part: Part,
        posed: bool,
    ) -> Result<ViewKey, Error> {
        let key = (width, height, views, part, posed, self.computes_rays());
        if !self.view_graphs.contains_key(&key) {
            let graph = self.build_views_graph(width, height, views, part, posed)?;
            self.view_graphs.insert(key, graph);
        }
        Ok(key)
    }

    fn build_views_graph(
        &self,
        width: usize,
        height: usize,
        views: usize,
        part: Part,
        posed: bool,
    ) -> Result<ViewsGraph, Error> {
        let shared = &self.model.shared;
        let v = &shared.config.vit;
        let (gw, gh) = self.patch_grid(width, height)?;
        let tokens = gw * gh + 1;
        let s = views as i64;
        let e = v.embed_dim as i64;

        // Constants of this resolution and scene size.
        let constants = self.declare_constants(width, height, views)?;
        // The ray branch's map: twice the finest stage (4x the patch grid), 8x the grid.
        let with_rays = self.computes_rays();
        let (aw, ah) = (8 * gw, 8 * gh);
        let half = shared.config.head.features / 2;
        let ray_uv = if with_rays && shared.config.head.pos_embed {
            Some(UvEmbedding::declare(&constants.ctx, aw, ah, half)?)
        } else {
            None
        };
        constants
            .ctx
            .allocate_on(self.executor.device(), BufferUsage::Any)?;
        if let Some(uv) = &ray_uv {
            uv.write(&constants.ctx, width as f64 / height as f64)?;
        }
        self.write_constants(&constants, width, height, views)?;
        let ResolutionConstants {
            ctx: constants,
            pos,
            positions,
            stage_uv,
            output_uv,
        } = constants;

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
        let mut built = ViewsGraph {
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
}
