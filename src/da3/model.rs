//! A loaded model (shared weights, `Send + Sync`) and sessions (per-thread graphs).
//!
//! As llama.cpp splits `llama_model` from `llama_context`: a [`Model`] holds the weights,
//! frozen on one device and shared by every thread through an `Arc`; a [`Session`] holds what
//! one computation at a time needs (a backend stream, graphs per processed resolution, their
//! allocations, the residency executor) and is single-threaded by type (`!Send`).

use super::architecture::{self, Parts, CAMERA_ENCODER_PROBE};
use super::backbone::{Backbone, BackboneConstants, CameraEncoder};
use super::config::Config;
use super::head::{CameraDecoder, Head, HeadConstants, RayHead, UvEmbedding};
use super::ops::Ops;
use super::outputs::{fill_sky, Pose, Prediction};
use super::plan::{ExecutionPlan, LoadedFacts, PlanBuilder, PlanOverrides};
use super::preprocess::{self, ProcessedImage, RgbImage8};
use super::weights::{BoundWeights, ConvKernels, LinearPacking, LoadedWeights, Loader};
use super::Error;
use crate::ggml::{
    Backend, BufferUsage, Context, DType, Device, DeviceKind, DeviceSpec, Graph, Tensor,
};
use crate::gguf::GgufFile;
use crate::residency::{Executor, Policy, Report};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

mod views;

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// Where to compute (default `auto`: a GPU when ggml has one, else the CPU).
    pub device: DeviceSpec,
    /// CPU threads of each session (0: one per physical core). Sessions of one model do not
    /// share their threads: N sessions computing at once with 0 here each use every core (a
    /// warning is logged when a second such session opens); give each
    /// `cores / N` (`da3::ggml::default_threads()` is the core count) to divide the CPU.
    pub threads: usize,
    /// Longest side of the processed image for [`Session::predict`] (the official default
    /// 504; sides become multiples of the patch size 14).
    pub process_res: usize,
    /// What the planner does with operands the device cannot read.
    pub policy: Policy,
    /// Tensors to keep in plain host memory with no buffer. Only for reproducing the engine
    /// that crashed on Metal (`da3 repro`); a normal load keeps every operand on the device.
    pub host_only: Vec<String>,
    /// Keep intermediate stages readable (for parity tests), at some memory cost.
    pub probes: bool,
    /// Log the planner's one-line decision (`log::info!`, once per graph).
    pub log_decisions: bool,
    /// Compute every node with ggml's own ops even on the CPU backend, as happens anyway
    /// where the CPU kernels would be slower than ggml's ([`crate::ggml::KernelSet::beats_ggml`]):
    /// for comparing the two paths.
    pub ggml_ops_only: bool,
    /// Load the camera encoder (`cam_enc.*`), which only computations with known camera
    /// poses use ([`Session::predict_views_with_poses`]). Off by default: it is a small
    /// transformer of its own (about 110 MiB of f32 weights for da3-base, a fifth of the
    /// model) that every other request would carry.
    pub camera_encoder: bool,
    /// What the convolutions (the heads' and the camera decoder's) compute in.
    pub conv_precision: ConvPrecision,
    /// Departures from the default execution plan (kernel set, products, transforms), to
    /// compare one route with another; [`Model::plan`] says what was decided.
    pub plan: PlanOverrides,
}

/// The precision of the convolutions ([`LoadOptions::conv_precision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvPrecision {
    /// f16 for half-precision files (f16 or bf16 convolution kernels) on a GPU whose backend
    /// runs ggml's direct convolution, f32 otherwise: what the file type asks for, at the
    /// speed of tensor cores where there are some.
    #[default]
    Auto,
    /// f32 kernels always (half-precision files widened at load): on GPUs im2col and a
    /// matrix product, on the CPU the kernels' direct f32 convolution.
    F32,
    /// f16 kernels by ggml's direct convolution whatever the file and the device (f32 kernels
    /// rounded at load): the inputs of each convolution are rounded to f16, sums stay f32.
    F16,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::Auto,
            threads: 0,
            process_res: DEFAULT_PROCESS_RES,
            policy: Policy::default(),
            host_only: Vec::new(),
            probes: false,
            log_decisions: true,
            ggml_ops_only: false,
            camera_encoder: false,
            conv_precision: ConvPrecision::Auto,
            plan: PlanOverrides::default(),
        }
    }
}

/// The official processing resolution (longest side).
pub const DEFAULT_PROCESS_RES: usize = 504;

/// Weights and hyperparameters of a Depth Anything 3 model on one device: immutable after
/// loading, `Send + Sync`, and cheap to clone (clones share the weights).
///
/// [`Model::predict`] is the one-call path; for many images, keep a [`Session`] (one per
/// thread) so that graphs are built once per resolution.
#[derive(Clone)]
pub struct Model {
    shared: Arc<ModelShared>,
}

struct ModelShared {
    config: Config,
    device: Device,
    threads: usize,
    /// Sessions open on this model (see [`LoadOptions::threads`]).
    open_sessions: std::sync::atomic::AtomicUsize,
    process_res: usize,
    policy: Policy,
    probes: bool,
    log_decisions: bool,
    /// Which kernel runs each op class, and the transforms the weights were loaded for.
    plan: ExecutionPlan,
    /// What was loaded of the camera encoder.
    camera_encoder: EncoderLoad,
    /// `vit.pos_embed` on the host, [tokens, embed] (cls first), for the per-resolution resample.
    pos_embed: Vec<f32>,
    weights: LoadedWeights,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.shared.config.name)
            .field("device", &self.shared.device)
            .field("weight_bytes", &self.shared.weights.device_bytes)
            .finish_non_exhaustive()
    }
}

/// The layer handles of one session: the shared weights, imported into its own context.
struct Layers {
    backbone: Backbone,
    head: Head,
    camera: Option<CameraDecoder>,
    /// The camera encoder (known poses in), when the file has one.
    camera_encoder: Option<CameraEncoder>,
    /// The DualDPT ray branch, when the file has it.
    rays: Option<RayHead>,
    /// Holds the imported handles (and keeps the shared weights alive).
    _weights: Context,
    /// This session's copies of host-only weights (the crash layout), if any.
    _host: Option<Context>,
}

impl Model {
    /// Opens a model file on the default device (`auto`) with default options.
    pub fn open(path: impl AsRef<Path>) -> Result<Model, Error> {
        Self::load(path, &LoadOptions::default())
    }

    /// Opens a model file with `options`.
    pub fn load(path: impl AsRef<Path>, options: &LoadOptions) -> Result<Model, Error> {
        let file = GgufFile::open(path.as_ref())?;
        Self::from_gguf(&file, options)
    }

    /// Loads a model from an open GGUF file.
    pub fn from_gguf(file: &GgufFile, options: &LoadOptions) -> Result<Model, Error> {
        let config = Config::from_gguf(file)?;
        let device = options.device.resolve()?;
        let host_only: Vec<&str> = options.host_only.iter().map(String::as_str).collect();
        let planned = PlanBuilder::new(&device, options.ggml_ops_only, &options.plan);
        let conv_kernels = match options.conv_precision {
            ConvPrecision::F32 => ConvKernels::F32,
            ConvPrecision::F16 => ConvKernels::F16,
            ConvPrecision::Auto if runs_half_convolutions(&device) => ConvKernels::AsFileHalf,
            ConvPrecision::Auto => ConvKernels::F32,
        };
        let mut loader = Loader::new(file, &host_only)
            .pack_linears(planned.kernels.map(|config| LinearPacking {
                config,
                int8: planned.int8_linears,
            }))
            .fold_affine(planned.fold_affine)
            .vision_rope(planned.vision_rope)
            .centre_qk_heads(planned.centre_qk_heads)
            .half_linears_bf16(planned.half_linears_bf16)
            .conv_kernels(conv_kernels);
        let camera_encoder = match (
            options.camera_encoder,
            file.tensor(CAMERA_ENCODER_PROBE).is_some(),
        ) {
            (_, false) => EncoderLoad::NotInFile,
            (true, true) => EncoderLoad::Loaded,
            (false, true) => EncoderLoad::LeftOut,
        };
        let parts = Parts::of_file(file, &config, camera_encoder == EncoderLoad::Loaded)?;
        if camera_encoder == EncoderLoad::LeftOut {
            loader = loader.leave_out("cam_enc.");
        }
        // Every tensor is checked here; sessions bind the loaded ones by name.
        let mut weights = loader.load(architecture::tensors(&config, &parts)?, &device)?;
        let pos_embed = weights.take_host_values("vit.pos_embed")?;
        let plan = planned.finish(
            &device,
            LoadedFacts {
                bf16_products: weights.bf16_products,
                int8_products: weights.int8_products,
                half_convolutions: weights.half_convolutions,
                folded_layers: weights.folded_layers(),
                vision_rope: weights.vision_rope(),
                centred_qk_heads: weights.centred_qk_heads(),
            },
        );
        log::debug!("execution plan {plan}");
        Ok(Model {
            shared: Arc::new(ModelShared {
                config,
                device,
                threads: options.threads,
                open_sessions: Default::default(),
                process_res: options.process_res,
                policy: options.policy,
                probes: options.probes,
                log_decisions: options.log_decisions,
                plan,
                camera_encoder,
                pos_embed,
                weights,
            }),
        })
    }

    /// The longest side images are processed at ([`LoadOptions::process_res`]).
    pub fn process_res(&self) -> usize {
        self.shared.process_res
    }

    /// Which kernel, in which precision, runs each class of op, and the graph transforms the
    /// weights were loaded for (printed by `da3 info`).
    pub fn plan(&self) -> &ExecutionPlan {
        &self.shared.plan
    }

    /// The model's hyperparameters.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }
    /// The device the weights live on.
    pub fn device(&self) -> Device {
        self.shared.device
    }
    /// Bytes of weights on the device.
    pub fn device_weight_bytes(&self) -> usize {
        self.shared.weights.device_bytes
    }
    /// File tensors the architecture did not use.
    pub fn unused_tensors(&self) -> &[String] {
        &self.shared.weights.unused
    }
    /// Whether the CPU kernels multiply in bf16 (the CPU fast mode): a half-precision file's
    /// linear layers, attention and convolutions, or a quantised file's attention and
    /// convolutions beside its int8 linear products.
    pub fn uses_bf16_products(&self) -> bool {
        self.shared.weights.bf16_products
    }
    /// Whether quantised linear layers compute with the CPU kernels' int8 products, not
    /// ggml's quantised products.
    pub fn uses_int8_products(&self) -> bool {
        self.shared.weights.int8_products
    }
    /// How many linear layers were loaded with the LayerNorm before them or the LayerScale
    /// after them folded in (models not on the CPU kernels; see
    /// [`crate::da3::weights::Loader::fold_affine`]).
    pub fn folded_layers(&self) -> usize {
        self.shared.weights.folded_layers()
    }
    /// Whether rotated heads were laid out for one vision-mode RoPE node per query and key
    /// (unless [`PlanOverrides::vision_rope`] says otherwise; see
    /// [`crate::da3::weights::Loader::vision_rope`]).
    pub fn uses_vision_rope(&self) -> bool {
        self.shared.weights.vision_rope()
    }
    /// Whether QK-normed heads are centred by the QKV layer and normalised by RMS norms
    /// (models not on the CPU kernels; see
    /// [`crate::da3::weights::Loader::centre_qk_heads`]).
    pub fn uses_centred_qk_heads(&self) -> bool {
        self.shared.weights.centred_qk_heads()
    }
    /// Whether the convolutions compute with f16 kernels by ggml's direct convolution
    /// ([`LoadOptions::conv_precision`]).
    pub fn uses_half_convolutions(&self) -> bool {
        self.shared.weights.half_convolutions
    }

    /// How many sessions of this model are open (each computes with
    /// [`LoadOptions::threads`] threads of its own).
    pub fn open_sessions(&self) -> usize {
        self.shared
            .open_sessions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A new session on the model's device: graphs, allocations and a backend stream of its
    /// own. Sessions of one model may run on different threads at the same time.
    pub fn session(&self) -> Result<Session, Error> {
        Session::new(self.clone())
    }

    /// Depth (and confidence, sky, pose) for one image, post-processed as the official code
    /// does, in a session made for this call. For many images keep a [`Session`].
    pub fn predict(&self, image: &image::DynamicImage) -> Result<Prediction, Error> {
        self.session()?.predict(image)
    }
}

/// The layers of a model, bound to its loaded weights.
struct BoundLayers {
    backbone: Backbone,
    head: Head,
    camera: Option<CameraDecoder>,
    camera_encoder: Option<CameraEncoder>,
    rays: Option<RayHead>,
}

/// What a model holds of the camera encoder ([`LoadOptions::camera_encoder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EncoderLoad {
    NotInFile,
    LeftOut,
    Loaded,
}

/// Builds the layers of the architecture of `config` from the weights `w` loaded for it (the
/// optional parts where they were loaded).
fn bind_layers(w: &BoundWeights<'_>, config: &Config) -> Result<BoundLayers, Error> {
    Ok(BoundLayers {
        backbone: Backbone::bind(w, &config.vit)?,
        head: Head::bind(w, &config.head)?,
        camera: CameraDecoder::bind(w)?,
        camera_encoder: CameraEncoder::bind(w, &config.vit)?,
        rays: RayHead::bind(w, &config.head)?,
    })
}

/// One computation at a time on a model: its graphs (one per processed resolution, built on
/// first use and reused), their allocations and the residency executor.
///
/// A session is single-threaded (`!Send`, `!Sync`: ggml graphs and contexts are); make one per
/// thread from a shared [`Model`].
pub struct Session {
    model: Model,
    /// Counts this session among the model's open ones while it lives.
    _open: OpenSession,
    layers: Layers,
    executor: Executor,
    graphs: HashMap<(usize, usize), ResolutionGraph>,
    /// Graphs of scenes of several views (see `views`).
    view_graphs: views::ViewGraphs,
    /// Whether scene graphs compute the ray branch ([`Session::set_ray_outputs`]).
    ray_outputs: bool,
    /// Whether scene poses come from the ray branch ([`Session::set_ray_pose`]).
    ray_pose: bool,
    last_report: Option<Report>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("graphs", &self.graphs.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// The graph for one processed resolution, built once and reused.
/// The constants a graph of one resolution reads, in a context of their own: the resampled
/// position embedding, the RoPE positions (repeated for each view of a scene) and the head's
/// UV embeddings.
struct ResolutionConstants {
    ctx: Context,
    pos: Tensor,
    positions: Vec<Tensor>,
    stage_uv: Vec<Tensor>,
    output_uv: Option<UvEmbedding>,
}

struct ResolutionGraph {
    graph: Graph,
    image: Tensor,
    depth: Tensor,
    confidence: Option<Tensor>,
    sky: Option<Tensor>,
    pose: Option<Tensor>,
    probes: Vec<(String, Tensor)>,
    /// Keeps the graph's tensors and the resolution's constants alive.
    _ctx: Ops,
    _constants: Context,
}

/// One open session of a model: counted from creation to drop.
struct OpenSession(Model);

impl OpenSession {
    /// Counts a new session of `model`, and warns where sessions that each take every core
    /// now compete for them.
    fn open(model: &Model) -> OpenSession {
        use std::sync::atomic::Ordering;
        let shared = &model.shared;
        let open = shared.open_sessions.fetch_add(1, Ordering::Relaxed) + 1;
        if open > 1 && shared.threads == 0 && shared.device.kind() == DeviceKind::Cpu {
            let cores = crate::ggml::default_threads();
            log::warn!(
                "{open} sessions of one model each compute with all {cores} cores; set \
                 LoadOptions::threads (da3: --threads) to {} to divide the CPU between them",
                (cores / open).max(1)
            );
        }
        OpenSession(model.clone())
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        let open = &self.0.shared.open_sessions;
        open.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Session {
    fn new(model: Model) -> Result<Session, Error> {
        let open = OpenSession::open(&model);
        let shared = &model.shared;
        let cpu = Backend::cpu(shared.threads)?;
        let device = if shared.device.kind() == DeviceKind::Cpu {
            cpu.clone()
        } else {
            Backend::new(shared.device)?
        };
        let weights_ctx = Context::metadata(1)?;
        let bound = shared.weights.bind(&weights_ctx)?;
        let BoundLayers {
            backbone,
            head,
            camera,
            camera_encoder,
            rays,
        } = bind_layers(&bound, &shared.config)?;
        let host = bound.into_host_context();
        let mut executor = Executor::new(device, cpu, shared.policy)?;
        if !shared.log_decisions {
            executor = executor.quiet();
        }
        Ok(Session {
            _open: open,
            layers: Layers {
                backbone,
                head,
                camera,
                camera_encoder,
                rays,
                _weights: weights_ctx,
                _host: host,
            },
            model,
            executor,
            graphs: HashMap::new(),
            view_graphs: Default::default(),
            ray_outputs: false,
            ray_pose: false,
            last_report: None,
        })
    }

    /// The model this session computes.
    pub fn model(&self) -> &Model {
        &self.model
    }
    /// The compute backend.
    pub fn device(&self) -> &Backend {
        self.executor.device()
    }
    /// The planner's report for the graph of a processed resolution (building it if needed).
    pub fn residency_report(&mut self, width: usize, height: usize) -> Result<Report, Error> {
        self.graph_for(width, height)?;
        Ok(self.executor.plan(&self.graphs[&(width, height)].graph)?)
    }
    /// The planner's report for the last computed image (with the scheduler's split count).
    pub fn last_report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }
    /// Drops the cached graphs (the next image of each resolution builds its graph again).
    pub fn clear_graphs(&mut self) {
        self.graphs.clear();
        self.view_graphs.clear();
    }
    /// The graph of a processed resolution (building it if needed), for inspection.
    pub fn graph(&mut self, width: usize, height: usize) -> Result<&Graph, Error> {
        Ok(&self.graph_for(width, height)?.graph)
    }

    /// Depth (and confidence, sky, pose) for an image, preprocessed at the model's process
    /// resolution and post-processed as the official code does (sky filled for mono and
    /// metric models).
    pub fn predict(&mut self, image: &image::DynamicImage) -> Result<Prediction, Error> {
        self.predict_rgb(&RgbImage8::from_dynamic(image)?)
    }

    /// [`Session::predict`] for an 8-bit RGB image.
    pub fn predict_rgb(&mut self, image: &RgbImage8) -> Result<Prediction, Error> {
        let res = self.model.shared.process_res;
        self.predict_at(image, res)
    }

    /// [`Session::predict_rgb`] at an explicit process resolution (longest side).
    pub fn predict_at(
        &mut self,
        image: &RgbImage8,
        process_res: usize,
    ) -> Result<Prediction, Error> {
        let processed = preprocess::preprocess(image, process_res)?;
        self.predict_processed(&processed)
    }

    /// [`Session::forward`] with the checks and post-processing of [`Session::predict`]: for
    /// callers that keep the preprocessed image (its `rgb8` colours 3D exports).
    pub fn predict_processed(&mut self, processed: &ProcessedImage) -> Result<Prediction, Error> {
        let mut prediction = self.forward(processed)?;
        let finite = prediction.depth.iter().filter(|v| v.is_finite()).count();
        if finite == 0 {
            return Err(Error::Input(format!(
                "{}: every depth value is NaN or infinite (weights out of range?)",
                self.model.shared.config.name
            )));
        }
        if finite < prediction.depth.len() {
            log::warn!(
                "{} of {} depth values are NaN or infinite",
                prediction.depth.len() - finite,
                prediction.depth.len()
            );
        }
        postprocess(&mut prediction);
        Ok(prediction)
    }

    /// The network's outputs for an already preprocessed image, before post-processing.
    pub fn forward(&mut self, image: &ProcessedImage) -> Result<Prediction, Error> {
        let (w, h) = (image.width, image.height);
        self.graph_for(w, h)?;
        let g = &self.graphs[&(w, h)];
        let run = self.executor.run(&g.graph)?;
        self.last_report = Some(run.report().clone());
        run.write(&g.image, &image.chw)?;
        run.compute()?;
        let read = |t: &Tensor| run.read::<f32>(t);
        let pose = match &g.pose {
            Some(t) => Some(Pose::from_encoding(&read(t)?, w, h)),
            None => None,
        };
        let mut probes = Vec::new();
        for (name, t) in &g.probes {
            probes.push((name.clone(), read(t)?));
        }
        Ok(Prediction {
            width: w,
            height: h,
            depth: read(&g.depth)?,
            confidence: g.confidence.as_ref().map(read).transpose()?,
            sky: g.sky.as_ref().map(read).transpose()?,
            pose,
            probes,
            rays: None,
        })
    }

    fn graph_for(&mut self, width: usize, height: usize) -> Result<&ResolutionGraph, Error> {
        if !self.graphs.contains_key(&(width, height)) {
            let graph = self.build_graph(width, height)?;
            self.graphs.insert((width, height), graph);
        }
        Ok(&self.graphs[&(width, height)])
    }

    /// The patch grid of a processed size; an error unless both sides are positive multiples
    /// of the patch size.
    fn patch_grid(&self, width: usize, height: usize) -> Result<(usize, usize), Error> {
        let p = self.model.shared.config.vit.patch_size;
        if !width.is_multiple_of(p) || !height.is_multiple_of(p) || width < p || height < p {
            return Err(Error::Input(format!(
                "processed size {width}x{height} is not a positive multiple of the patch size {p}"
            )));
        }
        Ok((width / p, height / p))
    }

    /// Declares the constants of a graph of `views` views of `width` x `height` in a context
    /// of their own (allocate it, then [`Session::write_constants`]).
    fn declare_constants(
        &self,
        width: usize,
        height: usize,
        views: usize,
    ) -> Result<ResolutionConstants, Error> {
        let shared = &self.model.shared;
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
            .collect::<Result<_, _>>()?;
        // The UV embeddings exist only for heads that add them.
        let head = &shared.config.head;
        let (stage_uv, output_uv) = if head.pos_embed {
            let stages = head
                .out_channels
                .iter()
                .map(|&c| ctx.new_tensor(DType::F32, &[gw as i64, gh as i64, c as i64, 1]))
                .collect::<Result<_, _>>()?;
            let output = UvEmbedding::declare(&ctx, width, height, head.features / 2)?;
            (stages, Some(output))
        } else {
            (Vec::new(), None)
        };
        Ok(ResolutionConstants {
            ctx,
            pos,
            positions,
            stage_uv,
            output_uv,
        })
    }

    /// Writes what [`Session::declare_constants`] declared, once its context is allocated.
    fn write_constants(
        &self,
        c: &ResolutionConstants,
        width: usize,
        height: usize,
        views: usize,
    ) -> Result<(), Error> {
        let head = &self.model.shared.config.head;
        let (gw, gh) = self.patch_grid(width, height)?;
        c.ctx.write(&c.pos, &self.resampled_pos_embed(gh, gw)?)?;
        let (local, global) = rope_positions(gh, gw, views);
        c.ctx.write(&c.positions[0], &local)?;
        c.ctx.write(&c.positions[1], &global)?;
        let aspect = width as f64 / height as f64;
        for (t, &channels) in c.stage_uv.iter().zip(&head.out_channels) {
            c.ctx.write(t, &scaled_uv(gw, gh, channels, aspect)?)?;
        }
        if let Some(uv) = &c.output_uv {
            uv.write(&c.ctx, aspect)?;
        }
        Ok(())
    }

    fn build_graph(&self, width: usize, height: usize) -> Result<ResolutionGraph, Error> {
        let shared = &self.model.shared;
        let (gw, gh) = self.patch_grid(width, height)?;

        // Constants of this resolution, on the device next to the weights.
        let constants = self.declare_constants(width, height, 1)?;
        constants
            .ctx
            .allocate_on(self.executor.device(), BufferUsage::Any)?;
        self.write_constants(&constants, width, height, 1)?;
        let ResolutionConstants {
            ctx: constants,
            pos,
            positions,
            stage_uv,
            output_uv,
        } = constants;

        // The graph.
        let ctx = graph_context(shared, GRAPH_NODES)?;
        let image = ctx
            .new_tensor(DType::F32, &[width as i64, height as i64, 3, 1])?
            .named("image");
        image.mark_input();
        let bconst = BackboneConstants {
            pos_embed: pos,
            local_positions: positions[0].clone(),
            global_positions: positions[1].clone(),
            attention: self.model.shared.plan.attention(),
            views: 1,
            camera_slots: None,
            camera_tokens: None,
        };
        let features = self.layers.backbone.forward(&ctx, &image, &bconst)?;
        let hconst = HeadConstants {
            stage_uv,
            output_uv,
        };
        let out = self.layers.head.forward(
            &ctx,
            &features.features,
            (gw as i64, gh as i64),
            (width as i64, height as i64),
            &hconst,
        )?;
        let pose = match (&self.layers.camera, &features.camera_token) {
            (Some(cam), Some(token)) => Some(cam.forward(&ctx, token)?),
            _ => None,
        };
        let graph = ctx.new_graph(GRAPH_NODES)?;
        let mut outputs: Vec<&Tensor> = vec![&out.depth];
        outputs.extend(out.confidence.iter());
        outputs.extend(out.sky.iter());
        outputs.extend(pose.iter());
        let mut probes = Vec::new();
        if shared.probes {
            probes.push(("tokens_in".to_owned(), features.tokens_in.clone()));
            for (i, f) in features.features.iter().enumerate() {
                probes.push((format!("feat{i}"), f.clone()));
            }
            probes.extend(
                features
                    .camera_token
                    .iter()
                    .map(|t| ("cam_token".to_owned(), t.clone())),
            );
        }
        for t in outputs.iter().copied().chain(probes.iter().map(|(_, t)| t)) {
            t.mark_output();
            graph.expand(t)?;
        }
        Ok(ResolutionGraph {
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

/// The official post-processing of the raw outputs: sky regions of mono and metric models
/// get the depth of the far non-sky scene.
pub(crate) fn postprocess(prediction: &mut Prediction) {
    if let Some(sky) = &prediction.sky {
        fill_sky(&mut prediction.depth, sky);
    }
}

/// Whether `device` is a GPU (not a remote one, whose server may be a CPU) whose backend
/// runs ggml's direct convolution with an f16 kernel, asked of a small probe node.
fn runs_half_convolutions(device: &Device) -> bool {
    if !matches!(device.kind(), DeviceKind::Gpu | DeviceKind::IntegratedGpu) || device.is_rpc() {
        return false;
    }
    let probe = || -> crate::ggml::Result<bool> {
        let ctx = Context::metadata_with_graph(4, 1)?;
        let kernel = ctx.new_tensor(DType::F16, &[3, 3, 8, 8])?;
        let input = ctx.new_tensor(DType::F32, &[16, 16, 8, 1])?;
        let conv = ctx.conv_2d_direct(&kernel, &input, (1, 1), (1, 1), (1, 1))?;
        Ok(device.supports_op(&conv))
    };
    probe().unwrap_or(false)
}

/// Graph capacity of one view: the giant variant builds about 2,700 nodes.
const GRAPH_NODES: usize = 8192;

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
