//! A loaded model and its per-resolution graphs.

use super::backbone::{Backbone, BackboneConstants};
use super::config::{Config, HeadKind};
use super::head::{CameraDecoder, Head, HeadConstants};
use super::outputs::{Pose, Prediction};
use super::preprocess::{self, ProcessedImage, RgbImage8};
use super::weights::{LoadedWeights, Loader};
use super::Error;
use crate::ggml::gguf::GgufFile;
use crate::ggml::{Backend, BufferUsage, Context, DType, DeviceKind, Graph, Tensor};
use crate::residency::{Executor, Policy, Report};
use std::collections::HashMap;
use std::path::Path;

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// What the planner does with operands the device cannot read.
    pub policy: Policy,
    /// Tensors to keep in plain host memory with no buffer. Only for reproducing the engine
    /// that crashed on Metal (`da3 repro`); a normal load keeps every operand on the device.
    pub host_only: Vec<String>,
    /// Keep intermediate stages readable (for parity tests), at some memory cost.
    pub probes: bool,
    /// Print the planner's one-line decision (once per graph).
    pub log_decisions: bool,
    /// Compute every node with ggml's own ops even on the CPU backend, as happens anyway
    /// where the CPU kernels would be slower than ggml's ([`crate::ggml::KernelSet::beats_ggml`]):
    /// for comparing the two paths.
    pub ggml_ops_only: bool,
}

/// Weights and hyperparameters of a Depth Anything 3 model on one device.
pub struct Model {
    config: Config,
    backbone: Backbone,
    head: Head,
    camera: Option<CameraDecoder>,
    /// `vit.pos_embed` on the host, [tokens, embed] (cls first), for the per-resolution resample.
    pos_embed: Vec<f32>,
    weights: LoadedWeights,
    executor: Executor,
    sessions: HashMap<(usize, usize), Session>,
    probes: bool,
    /// Whether graphs use the CPU kernels (on the CPU backend, where they beat ggml's ops).
    cpu_kernels: bool,
    last_report: Option<Report>,
}

/// The graph for one processed resolution, built once and reused.
struct Session {
    graph: Graph,
    image: Tensor,
    depth: Tensor,
    confidence: Option<Tensor>,
    sky: Option<Tensor>,
    pose: Option<Tensor>,
    probes: Vec<(String, Tensor)>,
    /// Keeps the graph's tensors and the resolution's constants alive.
    _ctx: Context,
    _constants: Context,
}

impl Model {
    /// Loads a GGUF file onto `device`; `cpu` is the fallback the scheduler may need.
    pub fn load(
        path: &Path,
        device: Backend,
        cpu: Backend,
        options: &LoadOptions,
    ) -> Result<Model, Error> {
        let file = GgufFile::open(path)?;
        Self::from_gguf(&file, device, cpu, options)
    }

    pub fn from_gguf(
        file: &GgufFile,
        device: Backend,
        cpu: Backend,
        options: &LoadOptions,
    ) -> Result<Model, Error> {
        let config = Config::from_gguf(file)?;
        let host_only: Vec<&str> = options.host_only.iter().map(String::as_str).collect();
        // The CPU kernels only where they beat ggml's ops: with the portable set, ggml's
        // vectorised ops run every node.
        let cpu_kernels =
            device.is_cpu() && crate::ggml::kernel_set().beats_ggml() && !options.ggml_ops_only;
        let mut loader = Loader::new(file, &host_only)?.pack_linears(cpu_kernels);
        let backbone = Backbone::load(&mut loader, &config.vit)?;
        let head = Head::load(&mut loader, &config.head, config.vit.feature_dim())?;
        let camera = if config.head.kind == HeadKind::DualDpt {
            CameraDecoder::load(&mut loader)?
        } else {
            None
        };
        if let Some(cam) = &camera {
            if cam.dim() != config.vit.feature_dim() {
                return Err(Error::Weights(format!(
                    "camera decoder width {} does not match the feature width {}",
                    cam.dim(),
                    config.vit.feature_dim()
                )));
            }
        }
        let pos_embed = loader.host_f32("vit.pos_embed")?;
        let weights = loader.finish(&device)?;
        let mut executor = Executor::new(device, cpu, options.policy)?;
        if !options.log_decisions {
            executor = executor.quiet();
        }
        Ok(Model {
            config,
            backbone,
            head,
            camera,
            pos_embed,
            weights,
            executor,
            sessions: HashMap::new(),
            probes: options.probes,
            cpu_kernels,
            last_report: None,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }
    pub fn device(&self) -> &Backend {
        self.executor.device()
    }
    /// Bytes of weights on the device.
    pub fn device_weight_bytes(&self) -> usize {
        self.weights.device_bytes
    }
    /// File tensors the architecture did not use.
    pub fn unused_tensors(&self) -> &[String] {
        &self.weights.unused
    }
    /// The planner's report for the graph of a processed resolution (building it if needed).
    pub fn residency_report(&mut self, width: usize, height: usize) -> Result<Report, Error> {
        self.session(width, height)?;
        let session = &self.sessions[&(width, height)];
        Ok(self.executor.plan(&session.graph)?)
    }
    /// The planner's report for the last computed image (with the scheduler's split count).
    pub fn last_report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }
    /// Drops the cached graphs (the next image of each resolution builds its graph again).
    pub fn clear_graphs(&mut self) {
        self.sessions.clear();
    }
    /// The graph of a processed resolution (building it if needed), for inspection.
    pub fn graph(&mut self, width: usize, height: usize) -> Result<&Graph, Error> {
        self.session(width, height)?;
        Ok(&self.sessions[&(width, height)].graph)
    }

    /// Preprocesses `image` as the official InputProcessor does at `process_res` and predicts.
    pub fn infer(&mut self, image: &RgbImage8, process_res: usize) -> Result<Prediction, Error> {
        let processed = preprocess::preprocess(image, process_res)?;
        self.infer_processed(&processed)
    }

    /// Predicts from an already preprocessed image.
    pub fn infer_processed(&mut self, image: &ProcessedImage) -> Result<Prediction, Error> {
        let (w, h) = (image.width, image.height);
        self.session(w, h)?;
        let session = &self.sessions[&(w, h)];
        let run = self.executor.run(&session.graph)?;
        self.last_report = Some(run.report().clone());
        run.write(&session.image, &image.chw)?;
        run.compute()?;
        let read = |t: &Tensor| run.read::<f32>(t);
        let pose = match &session.pose {
            Some(t) => Some(Pose::from_encoding(&read(t)?, w, h)),
            None => None,
        };
        let mut probes = Vec::new();
        for (name, t) in &session.probes {
            probes.push((name.clone(), read(t)?));
        }
        Ok(Prediction {
            width: w,
            height: h,
            depth: read(&session.depth)?,
            confidence: session.confidence.as_ref().map(read).transpose()?,
            sky: session.sky.as_ref().map(read).transpose()?,
            pose,
            probes,
        })
    }

    fn session(&mut self, width: usize, height: usize) -> Result<(), Error> {
        if self.sessions.contains_key(&(width, height)) {
            return Ok(());
        }
        let session = self.build_session(width, height)?;
        self.sessions.insert((width, height), session);
        Ok(())
    }

    fn build_session(&self, width: usize, height: usize) -> Result<Session, Error> {
        let v = &self.config.vit;
        let p = v.patch_size;
        if !width.is_multiple_of(p) || !height.is_multiple_of(p) || width < p || height < p {
            return Err(Error::Input(format!(
                "processed size {width}x{height} is not a positive multiple of the patch size {p}"
            )));
        }
        let (gw, gh) = (width / p, height / p);
        let tokens = gw * gh + 1;

        // Constants of this resolution, on the device next to the weights.
        let constants = Context::metadata_with_graph(16, 1)?;
        let e = v.embed_dim as i64;
        let pos = constants
            .new_tensor(DType::F32, &[e, tokens as i64])?
            .named("pos_embed.resampled");
        let positions: Vec<Tensor> = (0..4)
            .map(|i| {
                constants
                    .new_tensor(DType::I32, &[tokens as i64])
                    .map(|t| t.named(&format!("rope.pos{i}")))
            })
            .collect::<Result<_, _>>()?;
        // The UV embeddings exist only for heads that add them.
        let uv_channels: Vec<usize> = if self.config.head.pos_embed {
            self.config.head.out_channels.to_vec()
        } else {
            Vec::new()
        };
        let stage_uv: Vec<Tensor> = uv_channels
            .iter()
            .map(|&c| constants.new_tensor(DType::F32, &[gw as i64, gh as i64, c as i64, 1]))
            .collect::<Result<_, _>>()?;
        let half = self.config.head.features / 2;
        let output_uv = if self.config.head.pos_embed {
            Some(constants.new_tensor(DType::F32, &[width as i64, height as i64, half as i64, 1])?)
        } else {
            None
        };
        constants.allocate_on(self.executor.device(), BufferUsage::Any)?;
        constants.write(&pos, &self.resampled_pos_embed(gh, gw)?)?;
        let (ly, lx, gy, gx) = rope_positions(gh, gw);
        for (t, values) in positions.iter().zip([ly, lx, gy, gx]) {
            constants.write(t, &values)?;
        }
        let aspect = width as f64 / height as f64;
        for (t, &c) in stage_uv.iter().zip(&uv_channels) {
            constants.write(t, &scaled_uv(gw, gh, c, aspect)?)?;
        }
        if let Some(uv) = &output_uv {
            constants.write(uv, &scaled_uv(width, height, half, aspect)?)?;
        }

        // The graph.
        let ctx = Context::metadata_with_graph(GRAPH_TENSORS, GRAPH_NODES)?;
        // On the CPU, ops may use the safe layer's CPU kernels (direct convolutions, fused
        // attention); a graph for another device keeps to ops every backend has.
        ctx.use_cpu_kernels(self.cpu_kernels);
        ctx.use_bf16_products(self.weights.bf16_products);
        let image = ctx
            .new_tensor(DType::F32, &[width as i64, height as i64, 3, 1])?
            .named("image");
        image.mark_input();
        let bconst = BackboneConstants {
            pos_embed: pos,
            local_y: positions[0].clone(),
            local_x: positions[1].clone(),
            global_y: positions[2].clone(),
            global_x: positions[3].clone(),
            // GPUs run attention fastest fused with f16 K/V; the CPU (and an RPC server, which
            // computes on a CPU) keep the exact path.
            half_kv_attention: !self.executor.device().is_rpc()
                && matches!(
                    self.executor.device().device().kind(),
                    DeviceKind::Gpu | DeviceKind::IntegratedGpu
                ),
        };
        let features = self.backbone.forward(&ctx, &image, &bconst)?;
        let hconst = HeadConstants {
            stage_uv,
            output_uv,
        };
        let out = self.head.forward(
            &ctx,
            &features.features,
            (gw as i64, gh as i64),
            (width as i64, height as i64),
            &hconst,
        )?;
        let pose = match &self.camera {
            Some(cam) => Some(cam.forward(&ctx, &features.camera_token)?),
            None => None,
        };
        let graph = ctx.new_graph(GRAPH_NODES)?;
        let mut outputs: Vec<&Tensor> = vec![&out.depth];
        outputs.extend(out.confidence.iter());
        outputs.extend(out.sky.iter());
        outputs.extend(pose.iter());
        let mut probes = Vec::new();
        if self.probes {
            probes.push(("tokens_in".to_owned(), features.tokens_in.clone()));
            for (i, f) in features.features.iter().enumerate() {
                probes.push((format!("feat{i}"), f.clone()));
            }
            probes.push(("cam_token".to_owned(), features.camera_token.clone()));
        }
        for t in outputs.iter().copied().chain(probes.iter().map(|(_, t)| t)) {
            t.mark_output();
            graph.expand(t)?;
        }
        Ok(Session {
            graph,
            image,
            depth: out.depth,
            confidence: out.confidence,
            sky: out.sky,
            pose,
            probes,
            _ctx: ctx,
            _constants: constants,
        })
    }

    /// `vit.pos_embed` resampled to the patch grid, returned as [embed, tokens] (token-major
    /// rows of `embed` values, which is ggml's [embed, tokens]).
    fn resampled_pos_embed(&self, gh: usize, gw: usize) -> Result<Vec<f32>, Error> {
        let v = &self.config.vit;
        let e = v.embed_dim;
        let grid = v.pos_embed_grid;
        let (cls, patches) = self.pos_embed.split_at(e);
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

/// Graph capacity: the giant variant builds about 2,700 nodes.
const GRAPH_NODES: usize = 8192;
const GRAPH_TENSORS: usize = 3 * GRAPH_NODES;

fn scaled_uv(w: usize, h: usize, channels: usize, aspect: f64) -> Result<Vec<f32>, Error> {
    Ok(
        preprocess::uv_embedding_with_aspect(w, h, channels, aspect)?
            .into_iter()
            .map(|v| v * 0.1)
            .collect(),
    )
}

/// RoPE positions: local (row+1, col+1) per patch, global (1, 1) for every patch; token 0 at
/// (0, 0) in both.
fn rope_positions(gh: usize, gw: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>, Vec<i32>) {
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
    (ly, lx, global.clone(), global)
}
