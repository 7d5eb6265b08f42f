//! A loaded model (shared weights, `Send + Sync`) and sessions (per-thread graphs).
//!
//! As llama.cpp splits `llama_model` from `llama_context`: a [`Model`] holds the weights,
//! frozen on one device and shared by every thread through an `Arc`; a [`Session`] holds what
//! one computation at a time needs (a backend stream, graphs per processed resolution, their
//! allocations, the residency executor) and is single-threaded by type (`!Send`).

use super::architecture::{self, Parts, CAMERA_ENCODER_PROBE, GAUSSIAN_HEAD_PROBE};
use super::backbone::{Backbone, CameraEncoder};
use super::config::{Config, Family};
use super::head::{CameraDecoder, GaussianHead, Head, RayHead};
use super::outputs::Prediction;
use super::plan::{ExecutionPlan, LoadedFacts, PlanBuilder, PlanOverrides};
use super::preprocess::ToRgbImage;
use super::request::{Predictor, Request};
use super::weights::{BoundWeights, ConvKernels, LinearPacking, LoadedWeights, Loader};
use super::Error;
use crate::ggml::{Backend, Context, DType, Device, DeviceKind, DeviceSpec, Graph, TensorView};
use crate::gguf::GgufFile;
use crate::residency::{Executor, Policy, Report};
use std::path::Path;
use std::sync::Arc;

mod graphs;
mod run;

pub(crate) use run::Prepared;

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
    /// The processed image's size for requests that do not give theirs (sides become
    /// multiples of the patch size 14). `None`: the model's own, the official defaults: the
    /// longest side to 504 for Depth Anything 3, the shortest side to (at least) the file's
    /// input size, 518, for Depth Anything V2.
    pub process_res: Option<usize>,
    /// What the planner does with operands the device cannot read.
    pub policy: Policy,
    /// Tensors to keep in plain host memory with no buffer. Only for reproducing the engine
    /// that crashed on Metal (`da3 repro`); a normal load keeps every operand on the device.
    pub host_only: Vec<String>,
    /// Keep intermediate stages readable (for parity tests), at some memory cost.
    pub probes: bool,
    /// Log the planner's one-line decision (`log::debug!`, once per graph).
    pub log_decisions: bool,
    /// Compute every node with ggml's own ops even on the CPU backend, as happens anyway
    /// where the CPU kernels would be slower than ggml's ([`crate::ggml::KernelSet::beats_ggml`]):
    /// for comparing the two paths.
    pub ggml_ops_only: bool,
    /// Load the camera encoder (`cam_enc.*`), which only computations with known camera
    /// poses use ([`crate::Request::poses`]). Off by default: it is a small
    /// transformer of its own (about 110 MiB of f32 weights for da3-base, a fifth of the
    /// model) that every other request would carry.
    pub camera_encoder: bool,
    /// Load the 3D Gaussian head (`gs.*`, DA3-GIANT's), which only requests for Gaussians use
    /// ([`crate::Request::gaussians`]). Off by default: a second DPT head over the backbone's
    /// features.
    pub gaussians: bool,
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
            process_res: None,
            policy: Policy::default(),
            host_only: Vec::new(),
            probes: false,
            log_decisions: true,
            ggml_ops_only: false,
            camera_encoder: false,
            gaussians: false,
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
    camera_encoder: PartLoad,
    /// What was loaded of the 3D Gaussian head.
    gaussian_head: PartLoad,
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
    /// The 3D Gaussian head, when loaded.
    gaussians: Option<GaussianHead>,
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
        if let Some(warning) = unoptimised_build_warning(cfg!(debug_assertions)) {
            // Once per process, however many models it loads.
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| log::warn!("{warning}"));
        }
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
        let camera_encoder = PartLoad::of(options.camera_encoder, file, CAMERA_ENCODER_PROBE);
        let gaussian_head = PartLoad::of(options.gaussians, file, GAUSSIAN_HEAD_PROBE);
        let parts = Parts::of_file(
            file,
            &config,
            camera_encoder == PartLoad::Loaded,
            gaussian_head == PartLoad::Loaded,
        )?;
        if camera_encoder == PartLoad::LeftOut {
            loader = loader.leave_out("cam_enc.");
        }
        if gaussian_head == PartLoad::LeftOut {
            loader = loader.leave_out("gs.");
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
        let process_res = options.process_res.unwrap_or(match config.family {
            Family::Da3 => DEFAULT_PROCESS_RES,
            Family::Da2 { input_size } => input_size,
        });
        Ok(Model {
            shared: Arc::new(ModelShared {
                config,
                device,
                threads: options.threads,
                open_sessions: Default::default(),
                process_res,
                policy: options.policy,
                probes: options.probes,
                log_decisions: options.log_decisions,
                plan,
                camera_encoder,
                gaussian_head,
                pos_embed,
                weights,
            }),
        })
    }

    /// The size requests are processed at unless they say ([`LoadOptions::process_res`]): the
    /// longest side for Depth Anything 3, the shortest side's bound for V2.
    pub fn process_res(&self) -> usize {
        self.shared.process_res
    }

    /// CPU threads of each session ([`LoadOptions::threads`]; 0: one per physical core).
    pub fn threads(&self) -> usize {
        self.shared.threads
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

    /// Depth (and confidence, sky, pose) for one image (an [`crate::Image`] or a decoded
    /// `image::DynamicImage`), post-processed as the official code does, in a session made for
    /// this call. For many images keep a [`Session`]; for scenes, known poses and other
    /// settings, [`Session::run`] a [`Request`].
    pub fn predict(&self, image: &(impl ToRgbImage + ?Sized)) -> Result<Prediction, Error> {
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
    gaussians: Option<GaussianHead>,
}

/// What a model holds of a part it loads on request ([`LoadOptions::camera_encoder`],
/// [`LoadOptions::gaussians`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartLoad {
    NotInFile,
    LeftOut,
    Loaded,
}

impl PartLoad {
    /// What loading `file` makes of the part `probe` stands for, `wanted` or not.
    fn of(wanted: bool, file: &GgufFile, probe: &str) -> PartLoad {
        match (wanted, file.tensor(probe).is_some()) {
            (_, false) => PartLoad::NotInFile,
            (true, true) => PartLoad::Loaded,
            (false, true) => PartLoad::LeftOut,
        }
    }
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
        gaussians: match &config.gaussians {
            Some(g) => GaussianHead::bind(w, g)?,
            None => None,
        },
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
    /// Graphs by what shapes them (size, views, part, known cameras, rays), built on first
    /// use and reused.
    graphs: graphs::Graphs,
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
            gaussians,
        } = bind_layers(&bound, &shared.config)?;
        let host = bound.into_host_context();
        let mut executor = Executor::new(device, cpu, shared.policy)?;
        if !shared.log_decisions {
            executor = executor.quiet();
        }
        #[cfg(feature = "cuda-kernels")]
        if let super::plan::CudaAttentionPlan::Cudnn { device, .. } = shared.plan.cuda_attention() {
            // Per session: cuDNN's handle, stream, graphs and scratch memory are request state.
            let attention = crate::ggml::CudaAttention::new(*device, None)?;
            executor = executor.with_node_kernel(Box::new(attention));
        }
        Ok(Session {
            _open: open,
            layers: Layers {
                backbone,
                head,
                camera,
                camera_encoder,
                rays,
                gaussians,
                _weights: weights_ctx,
                _host: host,
            },
            model,
            executor,
            graphs: Default::default(),
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
    /// The planner's report for the graph of one image of a processed size (building it if
    /// needed).
    pub fn residency_report(&mut self, width: usize, height: usize) -> Result<Report, Error> {
        let key = Self::image_graph(width, height);
        self.graph_of(key)?;
        Ok(self.executor.plan(&self.graphs[&key].graph)?)
    }
    /// The planner's report for the last computed request (with the scheduler's split count).
    pub fn last_report(&self) -> Option<&Report> {
        self.last_report.as_ref()
    }
    /// Drops the cached graphs (the next request of each size builds its graph again).
    pub fn clear_graphs(&mut self) {
        self.graphs.clear();
    }
    /// Frees the graphs and their compute buffers (the largest memory a session holds beside
    /// the weights); the next request builds and allocates them again.
    ///
    /// # Errors
    /// When the device cannot make a new allocator.
    pub fn release_buffers(&mut self) -> Result<(), Error> {
        self.graphs.clear();
        Ok(self.executor.release_buffers()?)
    }
    /// The graph of one image of a processed size (building it if needed), for inspection.
    pub fn graph(&mut self, width: usize, height: usize) -> Result<&Graph, Error> {
        self.scene_graph(width, height, 1)
    }
    /// The graph of a scene of `views` images of one processed size, whole (the reference
    /// view first, no known cameras, no rays), building it if needed: for inspection and
    /// profiling (`examples/profile_model`).
    pub fn scene_graph(
        &mut self,
        width: usize,
        height: usize,
        views: usize,
    ) -> Result<&Graph, Error> {
        if views == 0 {
            return Err(Error::Input("a scene of 0 views".into()));
        }
        let key = graphs::GraphKey {
            views,
            ..Self::image_graph(width, height)
        };
        Ok(&self.graph_of(key)?.graph)
    }

    /// Where the time of a scene of `views` images of one processed size goes: its whole
    /// graph (as [`Session::scene_graph`]) computed once, then one node at a time, each
    /// `repeats` times in a row (on a GPU the launch and the wait then count once), from a
    /// grey image with view 0 as the reference.
    pub fn profile_scene(
        &mut self,
        width: usize,
        height: usize,
        views: usize,
        repeats: usize,
    ) -> Result<Vec<crate::ggml::NodeTime>, Error> {
        self.scene_graph(width, height, views)?;
        let key = graphs::GraphKey {
            views,
            ..Self::image_graph(width, height)
        };
        let graph = &self.graphs[&key];
        // Profiling recomputes each node from its sources after the whole graph ran: the
        // inputs' memory must not be reused by later nodes (the camera slots index rows).
        graph.input.mark_output();
        if let Some(slots) = &graph.slots {
            slots.mark_output();
        }
        let run = self.executor.run(&graph.graph)?;
        run.write(
            &graph.input,
            &vec![0.0f32; graph.input.nelements() as usize],
        )?;
        if let Some(slots) = &graph.slots {
            run.write(slots, &super::multiview::camera_slots(views, 0))?;
        }
        // One whole compute first: the profile sees warm buffers and device state.
        run.compute()?;
        Ok(run.profile(repeats)?)
    }

    /// The key of the graph of one image, whole, with no known camera and no rays.
    fn image_graph(width: usize, height: usize) -> graphs::GraphKey {
        graphs::GraphKey {
            width,
            height,
            views: 1,
            part: graphs::Part::Whole,
            posed: false,
            rays: false,
            gaussians: false,
        }
    }

    /// Depth (and confidence, sky, pose) for one image, preprocessed at the model's process
    /// resolution and post-processed as the official code does (sky filled for mono and
    /// metric models): [`Session::run`] of [`Request::image`].
    pub fn predict(&mut self, image: &(impl ToRgbImage + ?Sized)) -> Result<Prediction, Error> {
        let image = image.to_rgb_image()?;
        self.run(&Request::image(&image))?.into_single()
    }

    /// Computes a [`Request`]: its images preprocessed, predicted together as one scene and
    /// post-processed as the official code does ([`Predictor::run`]).
    pub fn run(&mut self, request: &Request<'_>) -> Result<super::Output, Error> {
        Predictor::run(self, request)
    }
}

/// The warning a load logs when this crate was built without optimisations: a dependent
/// crate's plain `cargo run` builds it (and, without the profile below, ggml's C code)
/// unoptimised, about 100 times slower, which looks like a hang.
fn unoptimised_build_warning(debug_build: bool) -> Option<&'static str> {
    debug_build.then_some(
        "da3 was built without optimisations (a debug build): it computes about 100 times \
         slower. Build with --release, or add to your Cargo.toml: \
         [profile.dev.package.\"*\"] opt-level = 3",
    )
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

#[cfg(test)]
mod tests {
    use super::unoptimised_build_warning;

    #[test]
    fn an_unoptimised_build_warns_with_the_profile_that_fixes_it() {
        let warning = unoptimised_build_warning(true).expect("a debug build warns");
        assert!(
            warning.contains("without optimisations")
                && warning.contains("--release")
                && warning.contains("[profile.dev.package.\"*\"] opt-level = 3"),
            "{warning}"
        );
        assert_eq!(unoptimised_build_warning(false), None);
    }
}
