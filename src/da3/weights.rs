//! Loading weights from a GGUF file: every tensor is declared with the shape the architecture
//! expects before any memory is touched; a missing or misshapen tensor is an error naming it.

use super::config::{Config, FileLayout, HeadKind};
use super::ops::Ops;
use super::weight_error::WeightError;
use super::Error;
use crate::ggml::{
    dequantize, pack_linear_panels, pack_linear_panels_bf16, pack_linear_panels_f16,
    pack_linear_panels_q8, quantize, BufferUsage, Context, DType, Device, KernelConfig,
    SharedContext, Tensor, TensorView, LINEAR_PANEL, LINEAR_Q8_RECORD,
};
use crate::gguf::{GgufFile, TensorInfo};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// How a tensor is used, which decides the types it may have on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The first operand of a matrix product: kept in the file's type (f32, f16, q8_0, ...).
    Matmul,
    /// Everything else (norms, biases, tokens): converted to f32.
    F32,
    /// A convolution kernel: f32, or f16 as [`Loader::conv_kernels`] says.
    ConvKernel,
}

/// The type convolution kernels are kept in (see [`Loader::conv_kernels`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConvKernels {
    /// f32, whatever the file stores.
    #[default]
    F32,
    /// f16 where the file stores a half type, f16 or bf16 (a half-precision file), else f32.
    AsFileHalf,
    /// f16 always (f32 and bf16 kernels rounded at load).
    F16,
}

struct Pending {
    tensor: Tensor,
    name: String,
    /// The type the file's data is converted to on the way in, if it is not copied as is.
    convert: Option<DType>,
    conv_kernel: bool,
    /// How a linear weight is stored packed for the CPU kernel, if it is.
    packed: Option<Packing>,
    /// Values computed at load from file tensors, instead of the file's own.
    derive: Option<Derive>,
    /// The order the tensor's rows are stored in, if not the file's ([`Loader::reorder_rows`]).
    reorder: Option<Arc<[usize]>>,
}

/// What a declared tensor's values are computed from when a LayerNorm's scale and shift or a
/// LayerScale is folded into the linear layer beside it ([`Loader::fold_affine`]). Names are
/// the architecture's. With `W` [out, in] and bias `b`, a LayerNorm `n * g + s` before and a
/// LayerScale `l` after: `l * (W (n * g + s) + b) = W' n + b'`.
#[derive(Clone)]
enum Derive {
    /// `W'[o][i] = l[o] * W[o][i] * g[i]`, then centred where `centred` says.
    Weight {
        input_scale: Option<String>,
        output_scale: Option<String>,
        centred: Option<CentredOutputs>,
    },
    /// `b'[o] = l[o] * (b[o] + sum_i W[o][i] * s[i])`, from the file's weight `weight`, then
    /// centred where `centred` says.
    Bias {
        weight: String,
        input_shift: Option<String>,
        output_scale: Option<String>,
        centred: Option<CentredOutputs>,
    },
}

/// Outputs of a linear layer computed with their mean subtracted: the first `rows` outputs,
/// in runs of `group` (attention heads), each run's mean over its outputs taken out of the
/// weight and the bias at load. A LayerNorm over such a run then equals an RMS norm of it,
/// which ggml's GPU backends fuse with the scale and shift after it into one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CentredOutputs {
    pub rows: usize,
    pub group: usize,
}

/// How a loader packs linear weights for our CPU kernels ([`Loader::pack_linears`]): the
/// kernels' configuration (whether half-precision weights become bf16 products) and whether
/// quantised weights become int8 products.
#[derive(Debug, Clone, Copy)]
pub struct LinearPacking {
    /// The CPU kernels the packed weights are for.
    pub config: KernelConfig,
    /// Quantised weights packed for int8 products (else ggml's quantised product).
    pub int8: bool,
}

/// The layouts of a packed linear weight (see [`Loader::pack_linears`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Packing {
    F32,
    Bf16,
    /// An f16 weight kept in f16, widened to f32 as the products load it (CPUs without
    /// bf16 products: half the memory traffic of f32 panels).
    F16,
    /// A q8_0 weight for int8 products.
    Q8,
}

/// Where declared tensors come from.
enum Source<'f> {
    File(&'f GgufFile),
    /// Weights loaded before: declared tensors are the shared ones, imported into a graph
    /// context (see [`Loader::bind`]).
    Bound {
        weights: &'f LoadedWeights,
        host: Option<Context>,
    },
    /// No file: only record what the architecture declares (for writing files).
    Recording {
        config: Box<Config>,
        declared: Vec<(String, Vec<usize>)>,
        /// The declared names that are convolution kernels.
        conv_kernels: Vec<String>,
    },
}

/// Declares the tensors a model needs, then moves their data onto a device.
pub struct Loader<'f> {
    source: Source<'f>,
    device_ctx: Context,
    host_ctx: Option<Context>,
    host_names: HashSet<String>,
    used: HashSet<String>,
    pending: Vec<Pending>,
    pack_linears: Option<LinearPacking>,
    conv_kernels: ConvKernels,
    fold_affine: bool,
    half_linears_bf16: bool,
    vision_rope: bool,
    centre_qk_heads: bool,
    /// Prefixes of the linear layers loaded with a norm or a layer scale folded in.
    folded: HashSet<String>,
    file_shapes: HashMap<String, Vec<usize>>,
    host_values: HashMap<String, Vec<f32>>,
    /// How the file names the tensors the architecture declares.
    layout: FileLayout,
}

/// A weight deliberately kept in plain host memory (only for reproducing the crash): each
/// session gets its own copy, so that the planner's fixes never touch shared memory.
pub struct HostTensor {
    name: String,
    dtype: DType,
    ne: Vec<i64>,
    bytes: Vec<u8>,
}

/// Where the loaded weights live: shared, read-only, `Send + Sync`.
pub struct LoadedWeights {
    /// All device-resident weights, in one buffer of the device's memory.
    pub shared: SharedContext,
    /// Weights deliberately left in plain host memory (only for reproducing the crash).
    host: Vec<HostTensor>,
    /// PyTorch shapes of the file's tensors that were declared or looked up.
    file_shapes: HashMap<String, Vec<usize>>,
    /// Values read on the host (e.g. the positional embedding), by name.
    host_values: HashMap<String, Vec<f32>>,
    /// Linear weights stored packed for the CPU kernel.
    packed: HashSet<String>,
    /// Prefixes of the linear layers loaded with a norm or a layer scale folded in
    /// ([`Loader::fold_affine`]), so that binding them again builds the same layers.
    folded: HashSet<String>,
    /// Rotated heads are laid out for one vision-mode RoPE node ([`Loader::vision_rope`]).
    vision_rope: bool,
    /// Normalised query and key heads are centred by the layer computing them
    /// ([`Loader::centre_qk_heads`]).
    centred_qk_heads: bool,
    /// Bytes of device memory the shared weights take.
    pub device_bytes: usize,
    /// File tensors the architecture did not use.
    pub unused: Vec<String>,
    /// The CPU kernels of attention and convolutions multiply in bf16: the fast mode of a
    /// half-precision file (its linear weights packed for bf16 products) or of a quantised one
    /// (int8 linear products), on a CPU whose bf16 products pay
    /// ([`KernelConfig::linear_bf16`]).
    pub bf16_products: bool,
    /// Some linear weights compute with int8 products (a quantised file on the CPU kernels).
    pub int8_products: bool,
    /// Some convolution kernels are f16, computed by ggml's direct convolution.
    pub half_convolutions: bool,
}

impl LoadedWeights {
    /// How many linear layers hold a folded norm or layer scale ([`Loader::fold_affine`]).
    pub fn folded_layers(&self) -> usize {
        self.folded.len()
    }
    /// Whether rotated heads are laid out for one vision-mode RoPE node per query and key
    /// ([`Loader::vision_rope`]).
    pub fn vision_rope(&self) -> bool {
        self.vision_rope
    }
    /// Whether normalised query and key heads are centred by the layer computing them, their
    /// LayerNorms computed as RMS norms ([`Loader::centre_qk_heads`]).
    pub fn centred_qk_heads(&self) -> bool {
        self.centred_qk_heads
    }
}

impl std::fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("pending", &self.pending.len())
            .field("used", &self.used.len())
            .field("host_only", &self.host_names)
            .field("pack_linears", &self.pack_linears)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LoadedWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedWeights")
            .field("shared", &self.shared)
            .field("device_bytes", &self.device_bytes)
            .field("host_tensors", &self.host.len())
            .field("unused", &self.unused)
            .field("bf16_products", &self.bf16_products)
            .field("int8_products", &self.int8_products)
            .field("half_convolutions", &self.half_convolutions)
            .finish_non_exhaustive()
    }
}

/// A shape of up to four dimensions padded with ones to ggml's four.
fn pad4<T: Copy + From<u8>>(ne: &[T]) -> [T; 4] {
    let mut out = [T::from(1); 4];
    out[..ne.len()].copy_from_slice(ne);
    out
}

impl<'f> Loader<'f> {
    /// `host_only` names tensors to keep in host memory with no buffer, the layout of the
    /// engine that crashed on Metal; empty for normal use.
    pub fn new(file: &'f GgufFile, host_only: &[&str]) -> Result<Self, Error> {
        let device_ctx = Context::metadata_with_graph(file.tensors().len() + 1, 1)?;
        let layout = FileLayout::of(file);
        let host_names: HashSet<String> = host_only.iter().map(|s| s.to_string()).collect();
        let host_ctx = if host_names.is_empty() {
            None
        } else {
            let bytes: u64 = file
                .tensors()
                .iter()
                .filter(|t| host_names.iter().any(|h| layout.file_name(h) == t.name))
                .map(|t| t.n_elements() * 4 + 1024)
                .sum();
            Some(Context::host(bytes as usize + 4096)?)
        };
        Ok(Loader {
            source: Source::File(file),
            device_ctx,
            host_ctx,
            host_names,
            used: HashSet::new(),
            pending: Vec::new(),
            pack_linears: None,
            conv_kernels: ConvKernels::F32,
            fold_affine: false,
            half_linears_bf16: false,
            vision_rope: false,
            centre_qk_heads: false,
            folded: HashSet::new(),
            file_shapes: HashMap::new(),
            host_values: HashMap::new(),
            layout,
        })
    }

    /// A loader that declares nothing new: each declared tensor is the shared weight of that
    /// name, imported into `graph_ctx` (and checked against the declaration), and host-only
    /// weights are copied into a host context of the caller's own. Running a model's `load`
    /// functions through it gives the per-session layer handles of already loaded weights.
    pub fn bind(weights: &'f LoadedWeights, graph_ctx: &Context) -> Result<Self, Error> {
        let host = if weights.host.is_empty() {
            None
        } else {
            let bytes: usize = weights.host.iter().map(|t| t.bytes.len() + 1024).sum();
            let ctx = Context::host(bytes + 4096)?;
            for t in &weights.host {
                let tensor = ctx.new_tensor(t.dtype, &t.ne)?.named(&t.name);
                ctx.write_bytes(&tensor, &t.bytes)?;
            }
            Some(ctx)
        };
        Ok(Loader {
            source: Source::Bound { weights, host },
            device_ctx: graph_ctx.clone(),
            host_ctx: None,
            host_names: HashSet::new(),
            used: HashSet::new(),
            pending: Vec::new(),
            pack_linears: None,
            conv_kernels: ConvKernels::F32,
            fold_affine: false,
            half_linears_bf16: false,
            vision_rope: false,
            centre_qk_heads: false,
            folded: HashSet::new(),
            file_shapes: HashMap::new(),
            host_values: HashMap::new(),
            layout: FileLayout::Standard,
        })
    }

    /// The host context of a bound loader's host-only weights (kept alive by the caller).
    pub fn into_host_context(self) -> Option<Context> {
        match self.source {
            Source::Bound { host, .. } => host,
            _ => None,
        }
    }

    /// Stores linear weights packed for the CPU's matrix-product kernel
    /// ([`crate::ggml::Context::linear_panels`]); only for models computed on the CPU backend.
    /// f32 weights stay f32; f16 and bf16 weights become bf16 products where the CPU has them
    /// ([`KernelConfig::linear_bf16`]), the "fast" mode of half-precision files; quantised
    /// weights become int8 products where `packing.int8` (q8_0 kept exactly, other types
    /// decoded and stored as q8_0). None: no packing (graphs without our kernels).
    pub fn pack_linears(mut self, packing: Option<LinearPacking>) -> Self {
        self.pack_linears = packing;
        self
    }

    /// Folds each block's LayerNorm scale and shift into the linear layer after it and its
    /// LayerScale into the one before, at load, where the weights allow (f32, f16 or bf16,
    /// not packed, none kept host-only): the graph then has one node for such a norm instead
    /// of three and none for the scale, each a kernel of its own on ggml's GPU backends, which
    /// do not fuse them. The CPU kernels fuse both into their products already.
    pub fn fold_affine(mut self, on: bool) -> Self {
        self.fold_affine = on;
        self
    }

    /// Keeps f16 linear weights that are not packed as bf16 (rounded at load): ggml-cuda
    /// multiplies bf16 weights by cuBLAS with f32 sums and output, f16 ones with f16 sums
    /// and a conversion of each product's result.
    pub fn half_linears_bf16(mut self, on: bool) -> Self {
        self.half_linears_bf16 = on;
        self
    }

    /// Lets a model lay out the weights that feed a rotary embedding for ggml's vision-mode
    /// RoPE (one node rotating two axes), reordering their rows at load
    /// ([`Loader::reorder_rows`]) where [`Loader::lays_out_for_vision_rope`] says so: one pass
    /// over each of Q and K instead of two (on GPUs, a kernel fewer each; on the CPU, a pass of
    /// ggml's RoPE fewer). Packed linear weights are packed from the reordered rows.
    pub fn vision_rope(mut self, on: bool) -> Self {
        self.vision_rope = on;
        self
    }

    /// Whether the model lays out its rotated heads for vision-mode RoPE: reading a file, with
    /// [`Loader::vision_rope`] on; binding loaded weights, as they were loaded; recording,
    /// never.
    pub fn lays_out_for_vision_rope(&self) -> bool {
        match &self.source {
            Source::Recording { .. } => false,
            Source::Bound { weights, .. } => weights.vision_rope,
            Source::File(_) => self.vision_rope,
        }
    }

    /// Lets a model whose query and key heads are LayerNormed (QK-norm) take each head's mean
    /// out of the layer computing them ([`CentredOutputs`]), where
    /// [`Loader::centres_qk_heads`] says so: the norm is then an RMS norm, which ggml's GPU
    /// backends fuse with its scale and shift (one kernel instead of three for each of Q
    /// and K). Only where the layer is folded anyway ([`Loader::fold_affine`]).
    pub fn centre_qk_heads(mut self, on: bool) -> Self {
        self.centre_qk_heads = on;
        self
    }

    /// Whether QK-normed heads are centred by the layer computing them: reading a file, with
    /// [`Loader::centre_qk_heads`] and [`Loader::fold_affine`] on and linear layers not
    /// packed; binding loaded weights, as they were loaded; recording, never. The layer must
    /// also fold ([`Loader::folds_into`]).
    pub fn centres_qk_heads(&self) -> bool {
        match &self.source {
            Source::Recording { .. } => false,
            Source::Bound { weights, .. } => weights.centred_qk_heads,
            Source::File(_) => {
                self.centre_qk_heads && self.fold_affine && self.pack_linears.is_none()
            }
        }
    }

    /// Stores declared tensor `name` with its rows in `order`: row `i` of the stored tensor
    /// is row `order[i]` of the file's (after any folding), a row being one of `order.len()`
    /// equal runs of its data (a weight's outputs, or a vector's values); a packed weight is
    /// packed from the reordered rows. Binding or recording, nothing changes.
    pub fn reorder_rows(&mut self, name: &str, order: Arc<[usize]>) -> Result<(), Error> {
        if !matches!(self.source, Source::File(_)) {
            return Ok(());
        }
        let mut sorted = order.to_vec();
        sorted.sort_unstable();
        if sorted.iter().enumerate().any(|(i, &j)| i != j) {
            return Err(WeightError::Other(format!(
                "tensor `{name}`: a row order must name each row once"
            ))
            .into());
        }
        if !self.pending.iter().any(|p| p.name == name) {
            return Err(WeightError::NotLoaded {
                name: name.to_owned(),
                what: "declared",
            }
            .into());
        }
        // The file's rows: a packed weight's stored shape is its panels'.
        let info = self.info(name)?;
        let block = info.dtype.block_size();
        let values: usize = info.shape().iter().map(|&d| d as usize).product();
        let whole_rows =
            values.is_multiple_of(order.len()) && (values / order.len()).is_multiple_of(block);
        if !whole_rows {
            // PyTorch's order, as the other shape errors print it.
            let shape: Vec<u64> = info.shape().iter().rev().copied().collect();
            return Err(WeightError::Other(format!(
                "tensor `{name}` ({shape:?}, {}) cannot have its rows reordered as {} rows",
                info.dtype,
                order.len()
            ))
            .into());
        }
        let pending = self
            .pending
            .iter_mut()
            .find(|p| p.name == name)
            .expect("found above");
        pending.reorder = Some(order);
        Ok(())
    }

    /// The type convolution kernels are kept in: f32 (the default, exact), or f16 for ggml's
    /// direct convolution, which GPUs compute on tensor cores ([`Conv::forward`] follows
    /// the kernel's type).
    pub fn conv_kernels(mut self, kernels: ConvKernels) -> Self {
        self.conv_kernels = kernels;
        self
    }

    /// A loader that reads nothing and records the tensors (name, PyTorch shape) that the
    /// architecture of `config` declares: the layout a file for it must have.
    pub fn recording(config: &Config) -> Result<Self, Error> {
        Ok(Loader {
            source: Source::Recording {
                config: Box::new(config.clone()),
                declared: Vec::new(),
                conv_kernels: Vec::new(),
            },
            device_ctx: Context::metadata_with_graph(1 << 14, 1)?,
            host_ctx: None,
            host_names: HashSet::new(),
            used: HashSet::new(),
            pending: Vec::new(),
            pack_linears: None,
            conv_kernels: ConvKernels::F32,
            fold_affine: false,
            half_linears_bf16: false,
            vision_rope: false,
            centre_qk_heads: false,
            folded: HashSet::new(),
            file_shapes: HashMap::new(),
            host_values: HashMap::new(),
            layout: FileLayout::Standard,
        })
    }

    /// Leaves the file's tensors whose names start with `prefix` out of the model on purpose:
    /// nothing is loaded, and they are not reported as unused.
    pub fn leave_out(&mut self, prefix: &str) {
        if let Some(file) = self.file() {
            let prefix = self.layout.file_name(prefix);
            for t in file
                .tensors()
                .iter()
                .filter(|t| t.name.starts_with(&*prefix))
            {
                self.used.insert(t.name.clone());
            }
        }
    }

    /// The tensors declared so far, in order; empty for a loader reading a file.
    pub fn into_declared(self) -> Vec<(String, Vec<usize>)> {
        match self.source {
            Source::Recording { declared, .. } => declared,
            _ => Vec::new(),
        }
    }

    /// Of a recording loader, the declared tensors that are convolution kernels.
    pub fn declared_conv_kernels(&self) -> &[String] {
        match &self.source {
            Source::Recording { conv_kernels, .. } => conv_kernels,
            _ => &[],
        }
    }

    fn file(&self) -> Option<&'f GgufFile> {
        match &self.source {
            Source::File(f) => Some(f),
            _ => None,
        }
    }

    fn info(&self, name: &str) -> Result<&'f TensorInfo, Error> {
        let file = self.file().ok_or_else(|| {
            WeightError::Other(format!("tensor `{name}`: a recording loader has no file"))
        })?;
        let in_file = self.layout.file_name(name);
        file.tensor(&in_file).ok_or_else(|| {
            Error::from(WeightError::MissingTensor {
                name: in_file.into_owned(),
            })
        })
    }

    /// Declares tensor `name` with PyTorch shape `shape` (outermost first, as the official code
    /// writes it); the file stores ggml order, the reverse.
    pub fn tensor(&mut self, name: &str, shape: &[usize], role: Role) -> Result<Tensor, Error> {
        Ok(self.declare(name, shape, role, false)?.0)
    }

    /// Declares the weight of a linear layer, PyTorch shape [n_out, n_in]; returns it and
    /// whether it is stored packed (see [`Loader::pack_linears`]: f32, f16 or bf16 in the
    /// file, in device memory, and a whole number of panels of outputs).
    fn linear_weight(
        &mut self,
        name: &str,
        n_in: usize,
        n_out: usize,
    ) -> Result<(Tensor, bool), Error> {
        self.declare(
            name,
            &[n_out, n_in],
            Role::Matmul,
            self.pack_linears.is_some(),
        )
    }

    /// Whether linear layer `prefix` (`{prefix}.weight`, `.bias`) is loaded with `folded`
    /// folded into it: reading a file, with [`Loader::fold_affine`] on, its weight f32, f16
    /// or bf16 and none of the tensors kept host-only; binding loaded weights, as they were
    /// loaded; recording, never (the file holds every tensor as it is).
    pub fn folds_into(&self, prefix: &str, folded: Folded<'_>) -> bool {
        if folded.is_empty() {
            return false;
        }
        match &self.source {
            Source::Recording { .. } => false,
            Source::Bound { weights, .. } => weights.folded.contains(prefix),
            Source::File(_) => {
                let weight = format!("{prefix}.weight");
                let half_or_f32 = self
                    .info(&weight)
                    .is_ok_and(|info| matches!(info.dtype, DType::F32 | DType::F16 | DType::BF16));
                let names = [weight, format!("{prefix}.bias")]
                    .into_iter()
                    .chain(folded.vectors().into_iter().map(|(name, _)| name));
                self.fold_affine
                    && self.pack_linears.is_none()
                    && half_or_f32
                    && !names.into_iter().any(|n| self.host_names.contains(&n))
            }
        }
    }

    /// Checks that the file holds vector `name` of `len` values usable as f32 and counts it
    /// as used, without placing it anywhere: its values are folded into a linear layer.
    fn declare_folded_away(&mut self, name: &str, len: usize) -> Result<(), Error> {
        if !matches!(self.source, Source::File(_)) {
            return Ok(());
        }
        let info = self.info(name)?;
        if pad4(&[len as u64]) != pad4(info.shape()) {
            let got: Vec<u64> = info.shape().iter().rev().copied().collect();
            return Err(WeightError::TensorShape {
                name: name.to_owned(),
                expected: vec![len],
                got: got.iter().map(|&d| d as usize).collect(),
            }
            .into());
        }
        if storage(Role::F32, info.dtype, self.conv_kernels).is_none() {
            return Err(unusable_type(name, info.dtype));
        }
        if !self.used.insert(self.layout.file_name(name).into_owned()) {
            return Err(declared_twice(name));
        }
        self.file_shapes.insert(name.to_owned(), vec![len]);
        Ok(())
    }

    /// Declares linear layer `prefix` [n_out, n_in] with `folded` folded into its weight and
    /// bias (see [`Loader::folds_into`], which the caller asked).
    fn linear_folded(
        &mut self,
        prefix: &str,
        n_in: usize,
        n_out: usize,
        folded: Folded<'_>,
    ) -> Result<Linear, Error> {
        for (name, len) in folded.vectors() {
            let len = if len == FoldedLen::In { n_in } else { n_out };
            self.declare_folded_away(&name, len)?;
        }
        let (input_scale, input_shift) = match folded.norm_before {
            Some(norm) => (Some(format!("{norm}.weight")), Some(format!("{norm}.bias"))),
            None => (None, None),
        };
        let output_scale = folded.scale_after.map(str::to_owned);
        let centred = folded.centred;
        if let Some(c) = centred {
            if c.group == 0 || c.rows > n_out || !c.rows.is_multiple_of(c.group) {
                return Err(WeightError::Other(format!(
                    "linear layer `{prefix}` ({n_out} outputs) cannot centre {} outputs in \
                     runs of {}",
                    c.rows, c.group
                ))
                .into());
            }
        }
        let weight_name = format!("{prefix}.weight");
        let (weight, _) = self.declare(&weight_name, &[n_out, n_in], Role::Matmul, false)?;
        self.derive_last(Derive::Weight {
            input_scale,
            output_scale: output_scale.clone(),
            centred,
        });
        let (bias, _) = self.declare(&format!("{prefix}.bias"), &[n_out], Role::F32, false)?;
        self.derive_last(Derive::Bias {
            weight: weight_name,
            input_shift,
            output_scale,
            centred,
        });
        self.folded.insert(prefix.to_owned());
        Ok(Linear {
            weight,
            bias,
            n_in,
            packed: false,
        })
    }

    /// Makes the tensor declared last computed at load (reading a file; bound tensors hold
    /// their values already).
    fn derive_last(&mut self, derive: Derive) {
        if matches!(self.source, Source::File(_)) {
            self.pending.last_mut().expect("just declared").derive = Some(derive);
        }
    }

    /// [`Loader::tensor`], packing a two-dimensional weight for the CPU's matrix-product
    /// kernel where `pack` asks for it and the weight allows it.
    fn declare(
        &mut self,
        name: &str,
        shape: &[usize],
        role: Role,
        pack: bool,
    ) -> Result<(Tensor, bool), Error> {
        if let Source::Recording {
            declared,
            conv_kernels,
            ..
        } = &mut self.source
        {
            declared.push((name.to_owned(), shape.to_vec()));
            if role == Role::ConvKernel {
                conv_kernels.push(name.to_owned());
            }
            let ne: Vec<i64> = shape.iter().rev().map(|&d| d as i64).collect();
            return Ok((
                self.device_ctx.new_tensor(DType::F32, &ne)?.named(name),
                false,
            ));
        }
        if let Source::Bound { weights, host } = &self.source {
            let packed = weights.packed.contains(name);
            let found = match host.as_ref().and_then(|h| h.tensor(name)) {
                Some(t) => Some(t),
                None => self.device_ctx.import(&weights.shared, name),
            };
            let tensor = found.ok_or_else(|| {
                Error::from(WeightError::NotLoaded {
                    name: name.to_owned(),
                    what: "loaded",
                })
            })?;
            if !packed {
                let expected: Vec<i64> = shape.iter().rev().map(|&d| d as i64).collect();
                if pad4(&expected) != tensor.ne() {
                    return Err(WeightError::TensorShape {
                        name: name.to_owned(),
                        expected: shape.to_vec(),
                        got: tensor
                            .shape()
                            .dims()
                            .iter()
                            .rev()
                            .map(|&d| d as usize)
                            .collect(),
                    }
                    .into());
                }
            }
            return Ok((tensor, packed));
        }
        let info = self.info(name)?;
        let expected: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        if pad4(&expected) != pad4(info.shape()) {
            let got: Vec<u64> = info.shape().iter().rev().copied().collect();
            return Err(WeightError::TensorShape {
                name: name.to_owned(),
                expected: shape.to_vec(),
                got: got.iter().map(|&d| d as usize).collect(),
            }
            .into());
        }
        // `used` holds the file's names: the ones left over are reported unused.
        if !self.used.insert(self.layout.file_name(name).into_owned()) {
            return Err(declared_twice(name));
        }
        self.file_shapes.insert(name.to_owned(), shape.to_vec());
        let Some((dtype, convert)) = storage(role, info.dtype, self.conv_kernels) else {
            return Err(unusable_type(name, info.dtype));
        };
        let (dtype, convert) = match (role, dtype) {
            (Role::Matmul, DType::F16) if self.half_linears_bf16 && !pack => {
                (DType::BF16, Some(DType::BF16))
            }
            _ => (dtype, convert),
        };
        let host = self.host_names.contains(name);
        let bf16_linears = self.pack_linears.is_some_and(|p| p.config.linear_bf16());
        let int8_linears = self.pack_linears.is_some_and(|p| p.int8);
        let packed = match (shape, dtype) {
            (_, _) if !pack || host => None,
            (&[n_out, _], _) if !n_out.is_multiple_of(LINEAR_PANEL) => None,
            ([_, _], DType::F32) => Some(Packing::F32),
            (&[_, n_in], DType::F16 | DType::BF16) if bf16_linears && n_in % 2 == 0 => {
                Some(Packing::Bf16)
            }
            ([_, _], DType::F16) => Some(Packing::F16),
            // Other quantised types are decoded and stored as q8_0 for the int8 products:
            // a second rounding far finer than theirs (a q4_k step is 8 of q8_0's), for the
            // speed of int8 products over ggml's quantised ones.
            (&[_, n_in], dtype)
                if dtype.is_quantized() && int8_linears && n_in % DType::Q8_0.block_size() == 0 =>
            {
                Some(Packing::Q8)
            }
            _ => None,
        };
        let (dtype, ne): (DType, Vec<i64>) = match (packed, shape) {
            (Some(packing), &[n_out, n_in]) => {
                let (dtype, row, depth) = match packing {
                    Packing::F32 => (DType::F32, LINEAR_PANEL, n_in),
                    Packing::Bf16 => (DType::I32, LINEAR_PANEL, n_in / 2),
                    Packing::F16 => (DType::F16, LINEAR_PANEL, n_in),
                    Packing::Q8 => (DType::I8, LINEAR_Q8_RECORD, n_in / DType::Q8_0.block_size()),
                };
                (
                    dtype,
                    vec![row as i64, depth as i64, (n_out / LINEAR_PANEL) as i64],
                )
            }
            _ => (dtype, expected.iter().map(|&d| d as i64).collect()),
        };
        let ctx = if host {
            self.host_ctx.as_ref().expect("created with host names")
        } else {
            &self.device_ctx
        };
        let tensor = ctx.new_tensor(dtype, &ne)?.named(name);
        self.pending.push(Pending {
            tensor: tensor.clone(),
            name: name.to_owned(),
            convert,
            conv_kernel: role == Role::ConvKernel,
            packed,
            derive: None,
            reorder: None,
        });
        Ok((tensor, packed.is_some()))
    }

    /// The PyTorch shape of a file tensor (for deriving sizes the metadata gets wrong).
    pub fn shape_of(&mut self, name: &str) -> Result<Vec<usize>, Error> {
        if let Source::Recording { config, .. } = &self.source {
            let e = config.vit.embed_dim;
            return match name {
                "vit.pos_embed" => Ok(vec![
                    1,
                    config.vit.pos_embed_grid * config.vit.pos_embed_grid + 1,
                    e,
                ]),
                "cam.bb0.weight" => config
                    .cam_dim
                    .map(|d| vec![d, d])
                    .ok_or_else(|| WeightError::Other("no camera decoder".into()).into()),
                "head.scratch.rn1_aux.rc2.c1.weight" if config.head.kind == HeadKind::DualDpt => {
                    let f = config.head.features;
                    Ok(vec![f, f, 3, 3])
                }
                // The official models with a camera decoder have the camera encoder too.
                "cam_enc.token_norm.weight" => config
                    .cam_dim
                    .map(|_| vec![e])
                    .ok_or_else(|| WeightError::Other("no camera encoder".into()).into()),
                other => Err(WeightError::Other(format!(
                    "a recording loader cannot tell the shape of `{other}`"
                ))
                .into()),
            };
        }
        if let Source::Bound { weights, .. } = &self.source {
            return weights.file_shapes.get(name).cloned().ok_or_else(|| {
                Error::from(WeightError::MissingTensor {
                    name: name.to_owned(),
                })
            });
        }
        let shape: Vec<usize> = self
            .info(name)?
            .shape()
            .iter()
            .rev()
            .map(|&d| d as usize)
            .collect();
        self.file_shapes.insert(name.to_owned(), shape.clone());
        Ok(shape)
    }

    /// Reads a tensor as f32 on the host (for host-side preprocessing such as the
    /// positional-embedding resample), without placing it on any device.
    pub fn host_f32(&mut self, name: &str) -> Result<Vec<f32>, Error> {
        if let Source::Bound { weights, .. } = &self.source {
            return weights.host_values.get(name).cloned().ok_or_else(|| {
                Error::from(WeightError::NotLoaded {
                    name: name.to_owned(),
                    what: "read",
                })
            });
        }
        let info = self.info(name)?;
        self.used.insert(self.layout.file_name(name).into_owned());
        let file = self.file().expect("info found a file");
        let bytes = file.read_tensor_data(info)?;
        check_finite(name, info.dtype, &bytes)?;
        let values = to_f32(name, info.dtype, &bytes)?;
        self.host_values.insert(name.to_owned(), values.clone());
        Ok(values)
    }

    /// Allocates the declared tensors on `device`, copies their data there and freezes them
    /// into shared weights. Every layer handle from this loader must be dropped first (the
    /// layers are bound again per session, see [`Loader::bind`]).
    pub fn finish(self, device: &Device) -> Result<LoadedWeights, Error> {
        let Some(file) = self.file() else {
            return Err(
                WeightError::Other("only a loader reading a file has data to load".into()).into(),
            );
        };
        let device_bytes = self
            .device_ctx
            .allocate_in(device.buffer_type()?, BufferUsage::Weights)?;
        for p in &self.pending {
            let info = file
                .tensor(&self.layout.file_name(&p.name))
                .expect("checked when declared");
            // Copied with positioned reads, not through the file's memory map: a file
            // truncated meanwhile is an error, not SIGBUS.
            let data = file.read_tensor_data(info)?;
            check_finite(&p.name, info.dtype, &data)?;
            // Rows of any type are whole runs of bytes; a derived tensor is reordered once
            // computed (its layer scale follows the file's rows).
            let data = match &p.reorder {
                Some(order) if p.derive.is_none() => Cow::Owned(reordered(&data, order)),
                _ => Cow::Borrowed(&*data),
            };
            let data = &*data;
            let ctx = if self.host_names.contains(&p.name) {
                self.host_ctx.as_ref().expect("host ctx")
            } else {
                &self.device_ctx
            };
            if let Some(derive) = &p.derive {
                let read = |name: &str| -> Result<Vec<f32>, Error> {
                    let info = file
                        .tensor(&self.layout.file_name(name))
                        .expect("checked when declared");
                    let data = file.read_tensor_data(info)?;
                    check_finite(name, info.dtype, &data)?;
                    to_f32(name, info.dtype, &data)
                };
                let own = to_f32(&p.name, info.dtype, data)?;
                let n_in = info.shape()[0] as usize;
                let mut values = derived_values(&p.name, own, n_in, derive, read)?;
                if let Some(order) = &p.reorder {
                    values = reordered(&values, order);
                }
                write_values(ctx, &p.tensor, &p.name, &values)?;
            } else if let Some(packing) = p.packed {
                // The file's ggml shape is [n_in, n_out], checked when declared.
                let (n_in, n_out) = (info.shape()[0] as usize, info.shape()[1] as usize);
                match packing {
                    Packing::F32 => {
                        let plain = to_f32(&p.name, info.dtype, data)?;
                        ctx.write(&p.tensor, &pack_linear_panels(&plain, n_in, n_out)?.0)?
                    }
                    Packing::Bf16 => {
                        let plain = to_f32(&p.name, info.dtype, data)?;
                        ctx.write(&p.tensor, &pack_linear_panels_bf16(&plain, n_in, n_out)?.0)?
                    }
                    Packing::F16 => {
                        let plain = to_f32(&p.name, info.dtype, data)?;
                        ctx.write(&p.tensor, &pack_linear_panels_f16(&plain, n_in, n_out)?.0)?
                    }
                    Packing::Q8 if info.dtype == DType::Q8_0 => {
                        ctx.write_bytes(&p.tensor, &pack_linear_panels_q8(data, n_in, n_out)?.0)?
                    }
                    Packing::Q8 => {
                        let plain = dequantize(info.dtype, data, n_in)?;
                        let q8 = quantize(DType::Q8_0, &plain, n_in)
                            .map_err(|e| WeightError::Other(format!("tensor `{}`: {e}", p.name)))?;
                        ctx.write_bytes(&p.tensor, &pack_linear_panels_q8(&q8, n_in, n_out)?.0)?
                    }
                }
            } else if p.convert.is_some() {
                write_values(ctx, &p.tensor, &p.name, &to_f32(&p.name, info.dtype, data)?)?;
            } else {
                ctx.write_bytes(&p.tensor, data)?;
            }
        }
        // A file rewritten in place while it was read may have mixed old and new bytes.
        file.check_unchanged()?;
        let mut unused: Vec<String> = file
            .tensors()
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| !self.used.contains(n))
            .collect();
        unused.sort();
        let int8_products = self.pending.iter().any(|p| p.packed == Some(Packing::Q8));
        // A quantised file already rounds its products' inputs to 8 bits; where bf16 products
        // pay, its attention and convolutions follow in bf16 as a half-precision file's do.
        let bf16_products = self.pending.iter().any(|p| p.packed == Some(Packing::Bf16))
            || (int8_products && self.pack_linears.is_some_and(|p| p.config.linear_bf16()));
        let half_convolutions = self
            .pending
            .iter()
            .any(|p| p.conv_kernel && p.tensor.dtype() == DType::F16);
        let packed: HashSet<String> = self
            .pending
            .iter()
            .filter(|p| p.packed.is_some())
            .map(|p| p.name.clone())
            .collect();
        let mut host = Vec::new();
        if let Some(host_ctx) = &self.host_ctx {
            for p in self
                .pending
                .iter()
                .filter(|p| self.host_names.contains(&p.name))
            {
                host.push(HostTensor {
                    name: p.name.clone(),
                    dtype: p.tensor.dtype(),
                    ne: p.tensor.shape().dims().to_vec(),
                    bytes: host_ctx.read_bytes(&p.tensor)?,
                });
            }
        }
        let Loader {
            device_ctx,
            pending,
            file_shapes,
            host_values,
            folded,
            vision_rope,
            centre_qk_heads,
            fold_affine,
            pack_linears,
            ..
        } = self;
        // The pending handles keep the context alive; freezing needs it alone.
        drop(pending);
        let shared = device_ctx.freeze()?;
        Ok(LoadedWeights {
            shared,
            host,
            file_shapes,
            host_values,
            packed,
            folded,
            vision_rope,
            centred_qk_heads: centre_qk_heads && fold_affine && pack_linears.is_none(),
            device_bytes,
            unused,
            bf16_products,
            int8_products,
            half_convolutions,
        })
    }
}

/// Fails naming the tensor when f32, f16 or bf16 data holds a NaN or an infinity (one pass
/// over the bits as the data is copied; quantised types are not checked).
pub fn check_finite(name: &str, dtype: DType, bytes: &[u8]) -> Result<(), Error> {
    let first_bad = match dtype {
        DType::F32 => bytes.chunks_exact(4).position(|b| {
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7F80_0000 == 0x7F80_0000
        }),
        DType::F16 => bytes
            .chunks_exact(2)
            .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7C00 == 0x7C00),
        DType::BF16 => bytes
            .chunks_exact(2)
            .position(|b| u16::from_le_bytes([b[0], b[1]]) & 0x7F80 == 0x7F80),
        _ => None,
    };
    match first_bad {
        Some(element) => Err(WeightError::NonFinite {
            name: name.to_owned(),
            element,
        }
        .into()),
        None => Ok(()),
    }
}

/// The device type of a tensor of `role` stored as `file` in the file, and the type its data is
/// converted to on the way in (None: copied as is); None where the role cannot use the type.
fn storage(role: Role, file: DType, conv: ConvKernels) -> Option<(DType, Option<DType>)> {
    Some(match (role, file, conv) {
        // bf16 kernels become f16 too: ggml's direct convolution takes f16 or f32 kernels.
        (Role::ConvKernel, DType::F16, ConvKernels::AsFileHalf | ConvKernels::F16) => {
            (DType::F16, None)
        }
        (Role::ConvKernel, DType::BF16, ConvKernels::AsFileHalf) => (DType::F16, Some(DType::F16)),
        (Role::ConvKernel, DType::F32 | DType::BF16, ConvKernels::F16) => {
            (DType::F16, Some(DType::F16))
        }
        (_, DType::F32, _) => (DType::F32, None),
        (Role::F32 | Role::ConvKernel, DType::F16 | DType::BF16, _) => {
            (DType::F32, Some(DType::F32))
        }
        (Role::Matmul, dtype, _) if dtype_supported_for_matmul(dtype) => (dtype, None),
        _ => return None,
    })
}

fn dtype_supported_for_matmul(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::F32
            | DType::F16
            | DType::BF16
            | DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// Converts little-endian f32/f16/bf16 bytes to f32 values.
pub fn to_f32(name: &str, dtype: DType, bytes: &[u8]) -> Result<Vec<f32>, Error> {
    Ok(match dtype {
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(WeightError::TensorType {
                name: name.to_owned(),
                dtype: other,
                expected: Some("f32, f16 or bf16"),
            }
            .into())
        }
    })
}

/// `values` rounded to f16; a finite value beyond f16's range (65504) is an error naming the
/// tensor, not an infinity in the weights.
/// The values of a tensor with a norm or a layer scale folded in ([`Derive`]): `own` is the
/// tensor's file values as f32 (a weight's rows of `n_in` inputs, one per output, or a bias),
/// `read` reads another file tensor as f32.
fn derived_values(
    name: &str,
    mut own: Vec<f32>,
    n_in: usize,
    derive: &Derive,
    read: impl Fn(&str) -> Result<Vec<f32>, Error>,
) -> Result<Vec<f32>, Error> {
    // Each output's values (a weight row, or one bias value) times its layer scale.
    let scale_outputs = |values: &mut [f32], scale: &Option<String>, per_output: usize| {
        if let Some(scale) = scale {
            let l = read(scale)?;
            for (values, &l) in values.chunks_exact_mut(per_output).zip(&l) {
                values.iter_mut().for_each(|x| *x *= l);
            }
        }
        Ok::<_, Error>(())
    };
    match derive {
        Derive::Weight {
            input_scale,
            output_scale,
            centred,
        } => {
            if let Some(scale) = input_scale {
                let g = read(scale)?;
                for row in own.chunks_exact_mut(n_in) {
                    row.iter_mut().zip(&g).for_each(|(w, &g)| *w *= g);
                }
            }
            scale_outputs(&mut own, output_scale, n_in)?;
            if let Some(c) = centred {
                centre_runs(&mut own[..c.rows * n_in], c.group, n_in);
            }
        }
        Derive::Bias {
            weight,
            input_shift,
            output_scale,
            centred,
        } => {
            if let Some(shift) = input_shift {
                let s = read(shift)?;
                let w = read(weight)?;
                for (b, row) in own.iter_mut().zip(w.chunks_exact(s.len())) {
                    let dot: f64 = row.iter().zip(&s).map(|(&w, &s)| w as f64 * s as f64).sum();
                    *b += dot as f32;
                }
            }
            scale_outputs(&mut own, output_scale, 1)?;
            if let Some(c) = centred {
                centre_runs(&mut own[..c.rows], c.group, 1);
            }
        }
    }
    if let Some(i) = own.iter().position(|x| !x.is_finite()) {
        return Err(WeightError::Unrepresentable {
            name: name.to_owned(),
            element: i,
            value: own[i],
            reason: "once the norm or layer scale beside it is folded in",
        }
        .into());
    }
    Ok(own)
}

/// Subtracts from each of the `values`' runs of `group` rows (of `width` values each) the
/// run's mean row, summed in f64: the outputs the rows compute then have zero mean over each
/// run, whatever the input.
fn centre_runs(values: &mut [f32], group: usize, width: usize) {
    for run in values.chunks_exact_mut(group * width) {
        let mut mean = vec![0f64; width];
        for row in run.chunks_exact(width) {
            mean.iter_mut().zip(row).for_each(|(m, &v)| *m += v as f64);
        }
        mean.iter_mut().for_each(|m| *m /= group as f64);
        for row in run.chunks_exact_mut(width) {
            row.iter_mut()
                .zip(&mean)
                .for_each(|(v, &m)| *v = (*v as f64 - m) as f32);
        }
    }
}

/// What is folded into a linear layer at load where the loader folds
/// ([`Loader::fold_affine`]): the LayerNorm before it (the prefix of its `.weight` and
/// `.bias`) and the LayerScale after it (a vector of the outputs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Folded<'a> {
    pub norm_before: Option<&'a str>,
    pub scale_after: Option<&'a str>,
    /// Outputs centred at load (for the LayerNorm after them; see [`CentredOutputs`]).
    pub centred: Option<CentredOutputs>,
}

/// Which side of a linear layer a folded vector spans.
#[derive(PartialEq, Eq)]
enum FoldedLen {
    In,
    Out,
}

impl<'a> Folded<'a> {
    /// The LayerNorm `prefix` before the layer.
    pub fn norm(prefix: &'a str) -> Self {
        Folded {
            norm_before: Some(prefix),
            ..Folded::default()
        }
    }
    /// The LayerScale `name` after the layer.
    pub fn scale(name: &'a str) -> Self {
        Folded {
            scale_after: Some(name),
            ..Folded::default()
        }
    }
    /// These, and the first `rows` outputs centred in runs of `group`.
    pub fn centring(self, rows: usize, group: usize) -> Self {
        Folded {
            centred: Some(CentredOutputs { rows, group }),
            ..self
        }
    }
    fn is_empty(&self) -> bool {
        self.norm_before.is_none() && self.scale_after.is_none() && self.centred.is_none()
    }
    /// The folded vectors and the side each spans.
    fn vectors(&self) -> Vec<(String, FoldedLen)> {
        let mut v = Vec::new();
        if let Some(norm) = self.norm_before {
            v.push((format!("{norm}.weight"), FoldedLen::In));
            v.push((format!("{norm}.bias"), FoldedLen::In));
        }
        if let Some(scale) = self.scale_after {
            v.push((scale.to_owned(), FoldedLen::Out));
        }
        v
    }
}

/// `data` as `order.len()` equal rows, row `i` of the result being row `order[i]` of `data`
/// (the caller checked that the rows divide the data).
fn reordered<T: Copy>(data: &[T], order: &[usize]) -> Vec<T> {
    let row = data.len() / order.len();
    order
        .iter()
        .flat_map(|&i| &data[i * row..(i + 1) * row])
        .copied()
        .collect()
}

/// Writes f32 `values` into `tensor` in its type (f32, f16 or bf16).
fn write_values(ctx: &Context, tensor: &Tensor, name: &str, values: &[f32]) -> Result<(), Error> {
    match tensor.dtype() {
        DType::F16 => ctx.write(tensor, &to_f16(name, values)?)?,
        DType::BF16 => {
            let halves: Vec<half::bf16> = values.iter().map(|&x| half::bf16::from_f32(x)).collect();
            ctx.write(tensor, &halves)?
        }
        _ => ctx.write(tensor, values)?,
    }
    Ok(())
}

fn to_f16(name: &str, values: &[f32]) -> Result<Vec<half::f16>, Error> {
    let halves: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f32(x)).collect();
    match halves.iter().position(|h| !h.is_finite()) {
        Some(i) => Err(WeightError::Unrepresentable {
            name: name.to_owned(),
            element: i,
            value: values[i],
            reason: "beyond the range of f16, the type it is kept in",
        }
        .into()),
        None => Ok(halves),
    }
}

/// `y = x W^T + b` with W stored as PyTorch (out, in), or packed for the CPU kernel. Every
/// linear layer of DA3 has a bias.
pub struct Linear {
    pub weight: Tensor,
    pub bias: Tensor,
    pub n_in: usize,
    packed: bool,
}

impl Linear {
    pub fn load(
        l: &mut Loader<'_>,
        prefix: &str,
        n_in: usize,
        n_out: usize,
    ) -> Result<Self, Error> {
        let (weight, packed) = l.linear_weight(&format!("{prefix}.weight"), n_in, n_out)?;
        Ok(Linear {
            weight,
            bias: l.tensor(&format!("{prefix}.bias"), &[n_out], Role::F32)?,
            n_in,
            packed,
        })
    }
    /// `x`: [n_in, T] -> [n_out, T].
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        if self.packed {
            return Ok(g.linear_panels(&self.weight, x, &self.bias, false)?);
        }
        Ok(g.add(&g.mul_mat(&self.weight, x)?, &self.bias)?)
    }
    /// [`Linear::load`] with `folded` folded into the weight and bias where the loader
    /// folds ([`Loader::folds_into`]); the caller asks that first, to leave out what is
    /// folded ([`Norm::load_unless_folded`], no layer scale).
    pub fn load_folded(
        l: &mut Loader<'_>,
        prefix: &str,
        n_in: usize,
        n_out: usize,
        folded: Folded<'_>,
    ) -> Result<Self, Error> {
        if l.folds_into(prefix, folded) {
            return l.linear_folded(prefix, n_in, n_out, folded);
        }
        Self::load(l, prefix, n_in, n_out)
    }
    /// `residual + scale * forward(x)` (a layer-scaled residual branch), fused into the
    /// product where it is packed; `residual + forward(x)` without a scale (one folded into
    /// the layer).
    pub fn forward_scaled_residual(
        &self,
        g: &Ops,
        x: &Tensor,
        scale: Option<&Tensor>,
        residual: &Tensor,
    ) -> Result<Tensor, Error> {
        match scale {
            Some(scale) if self.packed => {
                Ok(g.linear_panels_residual(&self.weight, x, &self.bias, scale, residual)?)
            }
            Some(scale) => Ok(g.add(residual, &g.mul(&self.forward(g, x)?, scale)?)?),
            None => Ok(g.add(residual, &self.forward(g, x)?)?),
        }
    }
    /// GELU (erf form) of [`Linear::forward`], fused into the product where it is packed.
    pub fn forward_gelu(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        if self.packed {
            return Ok(g.linear_panels(&self.weight, x, &self.bias, true)?);
        }
        Ok(g.gelu_erf(&self.forward(g, x)?)?)
    }
}

/// LayerNorm over ne[0].
pub struct Norm {
    /// Scale and shift; none where they are folded into the next linear layer.
    affine: Option<(Tensor, Tensor)>,
    eps: f32,
    /// The rows normalised have zero mean already (centred by the layer computing them, see
    /// [`CentredOutputs`]): an RMS norm computes the LayerNorm.
    centred_input: bool,
}

impl Norm {
    pub fn load(l: &mut Loader<'_>, prefix: &str, dim: usize, eps: f32) -> Result<Self, Error> {
        Self::load_unless_folded(l, prefix, dim, eps, false)
    }
    /// [`Norm::load`], or only the normalisation where `folded`: the scale and shift are then
    /// part of the next linear layer ([`Folded::norm_before`]), which declares them.
    pub fn load_unless_folded(
        l: &mut Loader<'_>,
        prefix: &str,
        dim: usize,
        eps: f32,
        folded: bool,
    ) -> Result<Self, Error> {
        if folded {
            return Ok(Norm {
                affine: None,
                eps,
                centred_input: false,
            });
        }
        Ok(Norm {
            affine: Some((
                l.tensor(&format!("{prefix}.weight"), &[dim], Role::F32)?,
                l.tensor(&format!("{prefix}.bias"), &[dim], Role::F32)?,
            )),
            eps,
            centred_input: false,
        })
    }
    /// [`Norm::load`] for rows that the layer computing them centres (see
    /// [`CentredOutputs`]), where `centred`.
    pub fn load_centred(
        l: &mut Loader<'_>,
        prefix: &str,
        dim: usize,
        eps: f32,
        centred: bool,
    ) -> Result<Self, Error> {
        Ok(Norm {
            centred_input: centred,
            ..Self::load(l, prefix, dim, eps)?
        })
    }
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        Ok(match (&self.affine, self.centred_input) {
            (Some((weight, bias)), true) => g.rms_norm_affine(x, weight, bias, self.eps)?,
            (Some((weight, bias)), false) => g.layer_norm(x, weight, bias, self.eps)?,
            (None, true) => g.rms_norm(x, self.eps)?,
            (None, false) => g.norm(x, self.eps)?,
        })
    }
}

/// A 2D convolution with PyTorch weights (out, in, kh, kw).
pub struct Conv {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub stride: i32,
    pub padding: i32,
}

impl Conv {
    #[allow(clippy::too_many_arguments)]
    pub fn load(
        l: &mut Loader<'_>,
        prefix: &str,
        n_in: usize,
        n_out: usize,
        kernel: usize,
        stride: i32,
        padding: i32,
        bias: bool,
    ) -> Result<Self, Error> {
        let weight = l.tensor(
            &format!("{prefix}.weight"),
            &[n_out, n_in, kernel, kernel],
            Role::ConvKernel,
        )?;
        let bias = if bias {
            Some(l.tensor(&format!("{prefix}.bias"), &[n_out], Role::F32)?)
        } else {
            None
        };
        Ok(Conv {
            weight,
            bias,
            stride,
            padding,
        })
    }
    /// `x`: a map [W, H, C_in, 1] -> [W', H', C_out, 1].
    /// f16 kernels ([`Loader::conv_kernels`]) run ggml's direct convolution; f32 ones
    /// [`Context::conv_2d`] (the CPU kernels' direct f32 convolution where they apply, else
    /// im2col and a matrix product). (f16 columns and a cuBLAS product were slower on an
    /// H200: ggml's im2col kernel wrote DA3-large's 1.1 GB of columns in 3.5 ms, where the
    /// direct convolution takes 4.0 ms in all.)
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        let (stride, padding) = ((self.stride, self.stride), (self.padding, self.padding));
        if self.weight.dtype() == DType::F16 {
            let y = g.conv_2d_direct(&self.weight, x, stride, padding, (1, 1))?;
            return match &self.bias {
                Some(bias) => add_channel_bias(g, &y, bias),
                None => Ok(y),
            };
        }
        Ok(match &self.bias {
            Some(bias) => g.conv_2d_bias(&self.weight, x, bias, stride, padding, (1, 1))?,
            None => g.conv_2d(&self.weight, x, stride, padding, (1, 1))?,
        })
    }
    /// [`Conv::forward`] of `relu(x)`: on the CPU kernels, ReLU applied as the convolution
    /// reads its input ([`Context::conv_2d_of_relu`]), not as a pass of its own.
    pub fn forward_of_relu(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        // f16 kernels take ggml's direct convolution (see `forward`), which has no ReLU on
        // its input: a node of its own.
        if self.weight.dtype() == DType::F16 {
            return self.forward(g, &g.relu(x)?);
        }
        let (stride, padding) = ((self.stride, self.stride), (self.padding, self.padding));
        let bias = self.bias.as_ref();
        Ok(g.conv_2d_of_relu(&self.weight, x, bias, stride, padding, (1, 1))?)
    }
}

/// A transposed convolution (kernel == stride, no padding), PyTorch weights (in, out, k, k).
pub struct ConvTranspose {
    pub weight: Tensor,
    pub bias: Tensor,
    pub stride: i32,
}

impl ConvTranspose {
    pub fn load(
        l: &mut Loader<'_>,
        prefix: &str,
        n_in: usize,
        n_out: usize,
        kernel: usize,
    ) -> Result<Self, Error> {
        Ok(ConvTranspose {
            weight: l.tensor(
                &format!("{prefix}.weight"),
                &[n_in, n_out, kernel, kernel],
                Role::F32,
            )?,
            bias: l.tensor(&format!("{prefix}.bias"), &[n_out], Role::F32)?,
            stride: kernel as i32,
        })
    }
    pub fn forward(&self, g: &Ops, x: &Tensor) -> Result<Tensor, Error> {
        Ok(g.conv_transpose_2d_bias(&self.weight, x, &self.bias, self.stride)?)
    }
}

/// Adds a per-channel bias [C] to a map [W, H, C, N].
fn add_channel_bias(g: &Ops, map: &Tensor, bias: &Tensor) -> Result<Tensor, Error> {
    let bias = g.reshape(bias, &[1, 1, bias.nelements()])?;
    Ok(g.add(map, &bias)?)
}

/// A tensor stored in a type this model cannot use for it.
fn unusable_type(name: &str, dtype: DType) -> Error {
    WeightError::TensorType {
        name: name.to_owned(),
        dtype,
        expected: None,
    }
    .into()
}

/// A tensor the architecture's loader declared a second time.
fn declared_twice(name: &str) -> Error {
    WeightError::DeclaredTwice {
        name: name.to_owned(),
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::CpuKernels;

    /// Rows are whole runs of the data, moved intact (a quantised row's bytes included).
    #[test]
    fn reordered_moves_whole_rows() {
        let bytes: Vec<u8> = (0..12).collect();
        assert_eq!(
            reordered(&bytes, &[2, 0, 1]),
            [8, 9, 10, 11, 0, 1, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(reordered(&[1.0f32, 2.0, 3.0], &[0, 2, 1]), [1.0, 3.0, 2.0]);
    }

    /// A LayerNorm's scale and shift before a linear layer and a LayerScale after it, folded
    /// into the layer, give what the three compute in turn.
    #[test]
    fn folded_layer_computes_norm_affine_layer_and_scale() {
        let (n_in, n_out) = (5, 3);
        let w: Vec<f32> = (0..n_in * n_out).map(|i| (i as f32 * 0.37).sin()).collect();
        let b = vec![0.5, -1.25, 2.0];
        let g = vec![1.5, -0.5, 2.0, 0.25, 1.0];
        let s = vec![0.1, 0.2, -0.3, 0.4, -0.5];
        let l = vec![0.01, -2.0, 0.5];
        let tensors: HashMap<&str, Vec<f32>> = [
            ("w", w.clone()),
            ("n.weight", g.clone()),
            ("n.bias", s.clone()),
            ("ls", l.clone()),
        ]
        .into_iter()
        .collect();
        let read = |name: &str| Ok(tensors[name].clone());
        let w_derive = Derive::Weight {
            input_scale: Some("n.weight".into()),
            output_scale: Some("ls".into()),
            centred: None,
        };
        let b_derive = Derive::Bias {
            weight: "w".into(),
            input_shift: Some("n.bias".into()),
            output_scale: Some("ls".into()),
            centred: None,
        };
        let w2 = derived_values("w", w.clone(), n_in, &w_derive, read).unwrap();
        let b2 = derived_values("b", b.clone(), n_out, &b_derive, read).unwrap();
        let x = [0.3f32, -1.1, 0.8, 2.0, -0.2]; // a normalised token
        for o in 0..n_out {
            let row = &w[o * n_in..][..n_in];
            let unfolded = l[o]
                * (b[o]
                    + (0..n_in)
                        .map(|i| row[i] * (x[i] * g[i] + s[i]))
                        .sum::<f32>());
            let folded = b2[o] + (0..n_in).map(|i| w2[o * n_in + i] * x[i]).sum::<f32>();
            assert!(
                (unfolded - folded).abs() < 1e-5,
                "output {o}: {unfolded} vs {folded}"
            );
        }
        // Values that overflow once folded are an error naming the tensor.
        let huge = |name: &str| {
            Ok(if name == "ls" {
                vec![f32::MAX; 3]
            } else {
                tensors[name].clone()
            })
        };
        let err = derived_values("w", vec![4.0; 15], n_in, &w_derive, huge).unwrap_err();
        assert!(err.to_string().contains("`w`"), "{err}");
    }

    /// Heads centred at load: a LayerNorm of each head of the file's layer equals an RMS norm
    /// of the centred layer's head, and outputs past the centred rows (V) are untouched.
    #[test]
    fn centred_heads_turn_layer_norm_into_rms_norm() {
        let (n_in, n_out, head) = (4, 6, 2); // q and k: two heads of 2, then v: 2 outputs
        let w: Vec<f32> = (0..n_in * n_out).map(|i| (i as f32 * 0.71).cos()).collect();
        let b: Vec<f32> = (0..n_out).map(|i| 0.3 * i as f32 - 0.4).collect();
        let g = vec![1.5, -0.5, 2.0, 0.25];
        let s = vec![0.1, 0.2, -0.3, 0.4];
        let tensors: HashMap<&str, Vec<f32>> = [("w", w.clone()), ("n.weight", g), ("n.bias", s)]
            .into_iter()
            .collect();
        let read = |name: &str| Ok(tensors[name].clone());
        let centred = Some(CentredOutputs {
            rows: 4,
            group: head,
        });
        let w_derive = |centred| Derive::Weight {
            input_scale: Some("n.weight".into()),
            output_scale: None,
            centred,
        };
        let b_derive = |centred| Derive::Bias {
            weight: "w".into(),
            input_shift: Some("n.bias".into()),
            output_scale: None,
            centred,
        };
        let layer = |centred| {
            let w = derived_values("w", w.clone(), n_in, &w_derive(centred), read).unwrap();
            let b = derived_values("b", b.clone(), n_out, &b_derive(centred), read).unwrap();
            let x = [0.9f32, -1.3, 0.2, 1.7];
            (0..n_out)
                .map(|o| b[o] + (0..n_in).map(|i| w[o * n_in + i] * x[i]).sum::<f32>())
                .collect::<Vec<f32>>()
        };
        let (plain, centred_out) = (layer(None), layer(centred));
        let eps = 1e-6;
        for h in 0..2 {
            let run = |y: &[f32]| y[h * head..][..head].to_vec();
            let (p, c) = (run(&plain), run(&centred_out));
            let mean = p.iter().sum::<f32>() / head as f32;
            let var = p.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / head as f32;
            let ms = c.iter().map(|v| v * v).sum::<f32>() / head as f32;
            assert!(
                c.iter().sum::<f32>().abs() < 1e-5,
                "head {h} not centred: {c:?}"
            );
            for (p, c) in p.iter().zip(&c) {
                let layer_norm = (p - mean) / (var + eps).sqrt();
                let rms_norm = c / (ms + eps).sqrt();
                assert!(
                    (layer_norm - rms_norm).abs() < 1e-4,
                    "{layer_norm} vs {rms_norm}"
                );
            }
        }
        assert_eq!(plain[4..], centred_out[4..]);
    }

    #[test]
    fn convolution_kernels_are_f16_only_where_asked() {
        use ConvKernels::*;
        let conv = |file, asked| storage(Role::ConvKernel, file, asked);
        // The default: f32 whatever the file stores.
        assert_eq!(conv(DType::F32, F32), Some((DType::F32, None)));
        assert_eq!(conv(DType::F16, F32), Some((DType::F32, Some(DType::F32))));
        assert_eq!(conv(DType::BF16, F32), Some((DType::F32, Some(DType::F32))));
        // As the file: half types become f16 (bf16 converted), f32 stays.
        assert_eq!(conv(DType::F32, AsFileHalf), Some((DType::F32, None)));
        assert_eq!(conv(DType::F16, AsFileHalf), Some((DType::F16, None)));
        assert_eq!(
            conv(DType::BF16, AsFileHalf),
            Some((DType::F16, Some(DType::F16)))
        );
        // Always f16.
        assert_eq!(conv(DType::F32, F16), Some((DType::F16, Some(DType::F16))));
        assert_eq!(conv(DType::F16, F16), Some((DType::F16, None)));
        // No quantised kernels, and other roles ignore the choice.
        assert_eq!(conv(DType::Q8_0, F16), None);
        assert_eq!(
            storage(Role::F32, DType::F16, F16),
            Some((DType::F32, Some(DType::F32)))
        );
        assert_eq!(
            storage(Role::Matmul, DType::F16, F16),
            Some((DType::F16, None))
        );
    }

    /// A linear weight packed for the CPU kernels after its rows (outputs) were reordered
    /// computes the reordered layer, for an f32 and a q8_0 file (int8 products: within their
    /// rounding); orders that are no permutation, undeclared tensors and rows that split a
    /// quantised block are refused, naming the tensor.
    #[test]
    fn packed_weights_are_packed_from_their_reordered_rows() {
        use crate::ggml::{Backend, Gallocr};
        use crate::gguf::GgufWriter;
        let (n_in, n_out, t) = (64usize, 2 * LINEAR_PANEL, 3usize);
        let w: Vec<f32> = (0..n_in * n_out)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let b: Vec<f32> = (0..n_out).map(|i| i as f32 * 0.1).collect();
        let x: Vec<f32> = (0..n_in * t)
            .map(|i| ((i * 13) % 29) as f32 / 14.0 - 1.0)
            .collect();
        // Output i of the stored layer is output order[i] of the file's.
        let order: Arc<[usize]> = (0..n_out).map(|i| (i * 5 + 3) % n_out).collect();
        let f32_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        for (dtype, bound) in [(DType::F32, 1e-5f32), (DType::Q8_0, 5e-2)] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("layer.gguf");
            let weight_bytes = match dtype {
                DType::F32 => f32_bytes(&w),
                _ => quantize(dtype, &w, n_in).unwrap(),
            };
            let mut writer = GgufWriter::new();
            let ne = [n_in as u64, n_out as u64];
            writer
                .add_tensor("l.weight", dtype, &ne, weight_bytes)
                .unwrap();
            writer
                .add_tensor("l.bias", DType::F32, &[n_out as u64], f32_bytes(&b))
                .unwrap();
            writer
                .add_tensor(
                    "q",
                    DType::Q8_0,
                    &[32, 4],
                    quantize(DType::Q8_0, &w[..128], 32).unwrap(),
                )
                .unwrap();
            writer.write_to(&path).unwrap();
            let file = GgufFile::open(&path).unwrap();
            let packing = LinearPacking {
                config: KernelConfig::detect(),
                int8: true,
            };
            let mut l = Loader::new(&file, &[]).unwrap().pack_linears(Some(packing));
            let declared = Linear::load(&mut l, "l", n_in, n_out).unwrap();
            assert!(declared.packed, "{dtype}: the weight is packed");
            // Loading freezes the context: no handle may outlive the declaration.
            drop(declared);
            l.reorder_rows("l.weight", order.clone()).unwrap();
            l.reorder_rows("l.bias", order.clone()).unwrap();
            // Refusals, each naming the tensor.
            let refused = |l: &mut Loader<'_>, name: &str, order: Vec<usize>, what: &str| {
                let text = l.reorder_rows(name, order.into()).unwrap_err().to_string();
                assert!(text.contains(name) && text.contains(what), "{text}");
            };
            refused(&mut l, "l.bias", vec![0; n_out], "each row once");
            refused(&mut l, "missing", (0..n_out).collect(), "not declared");
            l.tensor("q", &[4, 32], Role::Matmul).unwrap();
            refused(
                &mut l,
                "q",
                (0..8).collect(),
                "cannot have its rows reordered",
            );
            let weights = l.finish(&Device::cpu()).unwrap();

            let graph_ctx = Ops::new(
                Context::metadata(16).unwrap(),
                Some(CpuKernels::f32(KernelConfig::detect())),
            );
            let mut binder = Loader::bind(&weights, &graph_ctx).unwrap();
            let layer = Linear::load(&mut binder, "l", n_in, n_out).unwrap();
            let input = graph_ctx
                .new_tensor(DType::F32, &[n_in as i64, t as i64])
                .unwrap();
            input.mark_input();
            let y = layer.forward(&graph_ctx, &input).unwrap();
            y.mark_output();
            let graph = graph_ctx.new_graph(16).unwrap();
            graph.expand(&y).unwrap();
            let cpu = Backend::cpu(1).unwrap();
            let mut gallocr = Gallocr::for_backend(&cpu).unwrap();
            let run = gallocr.alloc(&graph).unwrap();
            run.write(&input, &x).unwrap();
            run.compute(&cpu).unwrap();
            let got = run.read::<f32>(&y).unwrap();
            for (j, column) in x.chunks_exact(n_in).enumerate() {
                for (i, &o) in order.iter().enumerate() {
                    let want: f64 = b[o] as f64
                        + (0..n_in)
                            .map(|k| w[o * n_in + k] as f64 * column[k] as f64)
                            .sum::<f64>();
                    let diff = (got[j * n_out + i] as f64 - want).abs();
                    assert!(
                        diff < bound as f64,
                        "{dtype} output {i} of token {j}: {diff}"
                    );
                }
            }
        }
    }

    #[test]
    fn kernels_beyond_the_f16_range_are_an_error_naming_the_tensor() {
        let err = to_f16("head.out1.weight", &[1.0, 7.0e4]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("head.out1.weight") && text.contains("element 1"),
            "{text}"
        );
        assert_eq!(
            to_f16("t", &[0.5, -65504.0]).unwrap(),
            [half::f16::from_f32(0.5), half::f16::from_f32(-65504.0)]
        );
    }
}
