//! Loading weights from a GGUF file: the file is checked against the architecture's table of
//! tensors ([`super::architecture::tensors`]) before any memory is touched (a missing or
//! misshapen tensor is an error naming it), then each tensor goes through the transforms the
//! plan chose ([`super::transforms`]) onto the device. Sessions bind the loaded tensors by
//! name into graph contexts of their own ([`BoundWeights`]).

use super::architecture::{self, CentredOutputs, Fold, Role, TensorSpec};
use super::config::FileLayout;
use super::transforms::{
    check_finite, check_row_order, derived_values, reordered, storage, to_f32, write_values,
    Derive, Packing,
};
use super::weight_error::WeightError;
use super::Error;
use crate::ggml::{
    BufferUsage, Context, DType, Device, KernelConfig, SharedContext, Tensor, TensorView,
};
use crate::gguf::{GgufFile, TensorInfo};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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

/// A weight deliberately kept in plain host memory (only for reproducing the crash): each
/// session gets its own copy, so that the planner's fixes never touch shared memory.
pub struct HostTensor {
    name: String,
    dtype: DType,
    ne: Vec<i64>,
    bytes: Vec<u8>,
}

/// Checks a file against the architecture's tensors and moves their data onto a device, each
/// through the transforms the options below choose.
pub struct Loader<'f> {
    file: &'f GgufFile,
    /// How the file names the tensors the architecture declares.
    layout: FileLayout,
    host_names: HashSet<String>,
    /// Prefixes of the file's tensors left out on purpose ([`Loader::leave_out`]).
    left_out: Vec<String>,
    pack_linears: Option<LinearPacking>,
    conv_kernels: ConvKernels,
    fold_affine: bool,
    half_linears_bf16: bool,
    vision_rope: bool,
    centre_qk_heads: bool,
}

/// A tensor on its way to the device.
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
    /// The order the tensor's rows are stored in, if not the file's.
    reorder: Option<Arc<[usize]>>,
    /// Kept in plain host memory (the crash layout).
    host: bool,
}

/// Where a loaded tensor of the architecture ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// In the shared weights (or, for the crash layout, host memory).
    Device {
        /// Packed for the CPU kernels ([`Loader::pack_linears`]).
        packed: bool,
        /// Rows stored in the order of [`TensorSpec::vision_rope_rows`].
        reordered: bool,
    },
    /// Folded into the linear layer beside it ([`Loader::fold_affine`]): nowhere of its own.
    FoldedAway,
    /// Read as f32 on the host ([`Role::Host`]).
    Host,
}

/// Where the loaded weights live: shared, read-only, `Send + Sync`.
pub struct LoadedWeights {
    /// All device-resident weights, in one buffer of the device's memory.
    pub shared: SharedContext,
    /// Weights deliberately left in plain host memory (only for reproducing the crash).
    host: Vec<HostTensor>,
    /// The architecture's tensors, by name, and where each ended up.
    tensors: HashMap<String, (TensorSpec, Placement)>,
    /// Values read on the host (e.g. the positional embedding), by name.
    host_values: HashMap<String, Vec<f32>>,
    /// Prefixes of the linear layers loaded with a norm or a layer scale folded in
    /// ([`Loader::fold_affine`]).
    folded: HashSet<String>,
    /// Prefixes of the folded linear layers whose outputs are centred ([`CentredOutputs`]).
    centred: HashSet<String>,
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
    /// Takes the values of tensor `name` read on the host ([`Role::Host`]).
    pub fn take_host_values(&mut self, name: &str) -> Result<Vec<f32>, Error> {
        self.host_values.remove(name).ok_or_else(|| {
            WeightError::NotLoaded {
                name: name.to_owned(),
                what: "read",
            }
            .into()
        })
    }
    /// The loaded tensors, imported into `graph_ctx` by name as layers ask for them, and
    /// host-only weights copied into a host context of the caller's own
    /// ([`BoundWeights::into_host_context`]): the per-session handles of the shared weights.
    pub fn bind(&self, graph_ctx: &Context) -> Result<BoundWeights<'_>, Error> {
        let host = if self.host.is_empty() {
            None
        } else {
            let bytes: usize = self.host.iter().map(|t| t.bytes.len() + 1024).sum();
            let ctx = Context::host(bytes + 4096)?;
            for t in &self.host {
                let tensor = ctx.new_tensor(t.dtype, &t.ne)?.named(&t.name);
                ctx.write_bytes(&tensor, &t.bytes)?;
            }
            Some(ctx)
        };
        Ok(BoundWeights {
            weights: self,
            ctx: graph_ctx.clone(),
            host,
        })
    }
}

/// Loaded weights as one session's graph context sees them: layers look their tensors up by
/// the architecture's names.
pub struct BoundWeights<'w> {
    weights: &'w LoadedWeights,
    ctx: Context,
    host: Option<Context>,
}

impl BoundWeights<'_> {
    /// Whether the loaded architecture has tensor `name` (optional parts, biases).
    pub fn has(&self, name: &str) -> bool {
        self.weights.tensors.contains_key(name)
    }
    /// The architecture's entry of tensor `name`.
    pub fn spec(&self, name: &str) -> Result<&TensorSpec, Error> {
        self.entry(name).map(|(spec, _)| spec)
    }
    fn entry(&self, name: &str) -> Result<&(TensorSpec, Placement), Error> {
        self.weights.tensors.get(name).ok_or_else(|| {
            WeightError::NotLoaded {
                name: name.to_owned(),
                what: "loaded",
            }
            .into()
        })
    }
    /// Tensor `name`: the shared weight imported into the session's context, or its copy of a
    /// host-only one.
    pub fn tensor(&self, name: &str) -> Result<Tensor, Error> {
        let found = match self.host.as_ref().and_then(|h| h.tensor(name)) {
            Some(t) => Some(t),
            None => self.ctx.import(&self.weights.shared, name),
        };
        found.ok_or_else(|| {
            WeightError::NotLoaded {
                name: name.to_owned(),
                what: "loaded",
            }
            .into()
        })
    }
    /// Whether linear weight `name` is stored packed for the CPU kernels.
    pub fn packed(&self, name: &str) -> bool {
        matches!(
            self.entry(name),
            Ok((_, Placement::Device { packed: true, .. }))
        )
    }
    /// Whether tensor `name` was folded into the linear layer beside it.
    pub fn folded_away(&self, name: &str) -> bool {
        matches!(self.entry(name), Ok((_, Placement::FoldedAway)))
    }
    /// Whether tensor `name`'s rows are stored in their vision-mode RoPE order.
    pub fn rows_reordered(&self, name: &str) -> bool {
        matches!(
            self.entry(name),
            Ok((
                _,
                Placement::Device {
                    reordered: true,
                    ..
                }
            ))
        )
    }
    /// Whether linear layer `prefix` centres its outputs ([`CentredOutputs`]).
    pub fn centres(&self, prefix: &str) -> bool {
        self.weights.centred.contains(prefix)
    }
    /// This session's copies of the host-only weights (kept alive by the caller).
    pub fn into_host_context(self) -> Option<Context> {
        self.host
    }
}

impl std::fmt::Debug for Loader<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
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
    /// A loader of `file`. `host_only` names tensors to keep in host memory with no buffer,
    /// the layout of the engine that crashed on Metal; empty for normal use.
    pub fn new(file: &'f GgufFile, host_only: &[&str]) -> Self {
        Loader {
            file,
            layout: FileLayout::of(file),
            host_names: host_only.iter().map(|s| s.to_string()).collect(),
            left_out: Vec::new(),
            pack_linears: None,
            conv_kernels: ConvKernels::F32,
            fold_affine: false,
            half_linears_bf16: false,
            vision_rope: false,
            centre_qk_heads: false,
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
    /// not packed, none kept host-only; see [`TensorSpec::fold`]): the graph then has one node
    /// for such a norm instead of three and none for the scale, each a kernel of its own on
    /// ggml's GPU backends, which do not fuse them. The CPU kernels fuse both into their
    /// products already.
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

    /// Lays out the weights that feed a rotary embedding for ggml's vision-mode RoPE (one node
    /// rotating two axes), storing their rows in the order the architecture gives
    /// ([`TensorSpec::vision_rope_rows`]): one pass over each of Q and K instead of two (on
    /// GPUs, a kernel fewer each; on the CPU, a pass of ggml's RoPE fewer). Packed linear
    /// weights are packed from the reordered rows.
    pub fn vision_rope(mut self, on: bool) -> Self {
        self.vision_rope = on;
        self
    }

    /// Lets the layers computing LayerNormed (QK-norm) query and key heads take each head's
    /// mean out ([`CentredOutputs`], where [`Fold::centrable`] allows): the norm is then an RMS
    /// norm, which ggml's GPU backends fuse with its scale and shift (one kernel instead of
    /// three for each of Q and K). Only where the layer is folded anyway
    /// ([`Loader::fold_affine`]) and linear layers are not packed.
    pub fn centre_qk_heads(mut self, on: bool) -> Self {
        self.centre_qk_heads = on;
        self
    }

    /// The type convolution kernels are kept in: f32 (the default, exact), or f16 for ggml's
    /// direct convolution, which GPUs compute on tensor cores
    /// ([`super::layers::Conv::forward`] follows the kernel's type).
    pub fn conv_kernels(mut self, kernels: ConvKernels) -> Self {
        self.conv_kernels = kernels;
        self
    }

    /// Leaves the file's tensors whose names start with `prefix` out of the model on purpose:
    /// they are not reported as unused.
    pub fn leave_out(mut self, prefix: &str) -> Self {
        self.left_out
            .push(self.layout.file_name(prefix).into_owned());
        self
    }

    fn info(&self, name: &str) -> Result<&'f TensorInfo, Error> {
        let in_file = self.layout.file_name(name);
        self.file.tensor(&in_file).ok_or_else(|| {
            Error::from(WeightError::MissingTensor {
                name: in_file.into_owned(),
            })
        })
    }

    /// Whether QK-normed heads are centred by the layer computing them (where it folds).
    fn centres_qk_heads(&self) -> bool {
        self.centre_qk_heads && self.fold_affine && self.pack_linears.is_none()
    }

    /// Whether linear layer `prefix` is loaded with `fold` folded in: with
    /// [`Loader::fold_affine`] on, linear layers not packed, its weight f32, f16 or bf16 and
    /// none of the tensors kept host-only.
    fn folds(&self, prefix: &str, fold: &Fold) -> bool {
        let weight = format!("{prefix}.weight");
        let half_or_f32 = self
            .info(&weight)
            .is_ok_and(|info| matches!(info.dtype, DType::F32 | DType::F16 | DType::BF16));
        let names = [weight, format!("{prefix}.bias")]
            .into_iter()
            .chain(fold.vectors().into_iter().map(|(name, _)| name));
        self.fold_affine
            && self.pack_linears.is_none()
            && half_or_f32
            && !names.into_iter().any(|n| self.host_names.contains(&n))
    }

    /// The file's tensor `name` checked against its entry of the architecture: present, of the
    /// shape it declares (by number of values for those read on the host).
    fn checked_info(&self, spec: &TensorSpec) -> Result<&'f TensorInfo, Error> {
        let info = self.info(&spec.name)?;
        let got: Vec<usize> = info.shape().iter().rev().map(|&d| d as usize).collect();
        let fits = match spec.role {
            Role::Host => got.iter().product::<usize>() == spec.values(),
            _ => {
                let expected: Vec<u64> = spec.shape.iter().rev().map(|&d| d as u64).collect();
                pad4(&expected) == pad4(info.shape())
            }
        };
        if !fits {
            return Err(WeightError::TensorShape {
                name: spec.name.clone(),
                expected: spec.shape.clone(),
                got,
            }
            .into());
        }
        Ok(info)
    }

    /// Checks the file against `tensors` (the architecture's, see
    /// [`super::architecture::tensors`]), allocates them on `device`, copies their data there
    /// through the chosen transforms and freezes them into shared weights.
    pub fn load(self, tensors: Vec<TensorSpec>, device: &Device) -> Result<LoadedWeights, Error> {
        let file = self.file;
        let device_ctx = Context::metadata_with_graph(file.tensors().len() + 1, 1)?;
        let host_ctx = if self.host_names.is_empty() {
            None
        } else {
            let bytes: u64 = file
                .tensors()
                .iter()
                .filter(|t| {
                    self.host_names
                        .iter()
                        .any(|h| self.layout.file_name(h) == t.name)
                })
                .map(|t| t.n_elements() * 4 + 1024)
                .sum();
            Some(Context::host(bytes as usize + 4096)?)
        };
        // The linear layers that fold, and the vectors folded into them.
        let mut folds: HashMap<String, (Fold, Option<CentredOutputs>)> = HashMap::new();
        for spec in &tensors {
            let (Some(fold), Some(prefix)) = (&spec.fold, spec.name.strip_suffix(".weight")) else {
                continue;
            };
            if !self.folds(prefix, fold) {
                continue;
            }
            let centred = fold.centrable.filter(|_| self.centres_qk_heads());
            if let Some(c) = centred {
                let n_out = spec.shape[0];
                if c.group == 0 || c.rows > n_out || !c.rows.is_multiple_of(c.group) {
                    return Err(WeightError::Other(format!(
                        "linear layer `{prefix}` ({n_out} outputs) cannot centre {} outputs \
                         in runs of {}",
                        c.rows, c.group
                    ))
                    .into());
                }
            }
            folds.insert(prefix.to_owned(), (fold.clone(), centred));
        }
        let folded_away: HashSet<String> = folds
            .values()
            .flat_map(|(fold, _)| fold.vectors().into_iter().map(|(name, _)| name))
            .collect();

        // `used` holds the file's names: the ones left over are reported unused.
        let mut used: HashSet<String> = HashSet::new();
        let mut pending = Vec::new();
        let mut placed = HashMap::new();
        let mut host_values = HashMap::new();
        for spec in tensors {
            let name = spec.name.as_str();
            let info = self.checked_info(&spec)?;
            if !used.insert(self.layout.file_name(name).into_owned()) {
                return Err(WeightError::DeclaredTwice {
                    name: name.to_owned(),
                }
                .into());
            }
            let placement = if spec.role == Role::Host {
                let bytes = file.read_tensor_data(info)?;
                check_finite(name, info.dtype, &bytes)?;
                host_values.insert(name.to_owned(), to_f32(name, info.dtype, &bytes)?);
                Placement::Host
            } else if folded_away.contains(name) {
                if storage(Role::F32, info.dtype, self.conv_kernels).is_none() {
                    return Err(unusable_type(name, info.dtype));
                }
                Placement::FoldedAway
            } else {
                let p = self.pending(&spec, info, &folds, &device_ctx, host_ctx.as_ref())?;
                let placement = Placement::Device {
                    packed: p.packed.is_some(),
                    reordered: p.reorder.is_some(),
                };
                pending.push(p);
                placement
            };
            placed.insert(spec.name.clone(), (spec, placement));
        }

        let device_bytes = device_ctx.allocate_in(device.buffer_type()?, BufferUsage::Weights)?;
        for p in &pending {
            let ctx = match p.host {
                true => host_ctx.as_ref().expect("created with host names"),
                false => &device_ctx,
            };
            self.write(ctx, p)?;
        }
        // A file rewritten in place while it was read may have mixed old and new bytes.
        file.check_unchanged()?;
        let mut unused: Vec<String> = file
            .tensors()
            .iter()
            .map(|t| t.name.clone())
            .filter(|n| !used.contains(n) && !self.left_out.iter().any(|p| n.starts_with(p)))
            .collect();
        unused.sort();
        let unexpected: Vec<&String> = unused
            .iter()
            .filter(|n| {
                !architecture::UNCOMPUTED_IN_CHECKPOINTS
                    .iter()
                    .any(|p| n.starts_with(p))
            })
            .collect();
        if !unexpected.is_empty() {
            log::warn!(
                "{} tensors of the file are no part of the architecture, left unused: {}",
                unexpected.len(),
                unexpected
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        let int8_products = pending.iter().any(|p| p.packed == Some(Packing::Q8));
        // A quantised file already rounds its products' inputs to 8 bits; where bf16 products
        // pay, its attention and convolutions follow in bf16 as a half-precision file's do.
        let bf16_products = pending.iter().any(|p| p.packed == Some(Packing::Bf16))
            || (int8_products && self.pack_linears.is_some_and(|p| p.config.linear_bf16()));
        let half_convolutions = pending
            .iter()
            .any(|p| p.conv_kernel && p.tensor.dtype() == DType::F16);
        let mut host = Vec::new();
        if let Some(host_ctx) = &host_ctx {
            for p in pending.iter().filter(|p| p.host) {
                host.push(HostTensor {
                    name: p.name.clone(),
                    dtype: p.tensor.dtype(),
                    ne: p.tensor.shape().dims().to_vec(),
                    bytes: host_ctx.read_bytes(&p.tensor)?,
                });
            }
        }
        // The pending handles keep the context alive; freezing needs it alone.
        drop(pending);
        let centred = folds
            .iter()
            .filter(|(_, (_, centred))| centred.is_some())
            .map(|(prefix, _)| prefix.clone())
            .collect();
        Ok(LoadedWeights {
            shared: device_ctx.freeze()?,
            host,
            tensors: placed,
            host_values,
            folded: folds.into_keys().collect(),
            centred,
            vision_rope: self.vision_rope,
            centred_qk_heads: self.centres_qk_heads(),
            device_bytes,
            unused,
            bf16_products,
            int8_products,
            half_convolutions,
        })
    }

    /// Decides how tensor `spec` (`info` in the file) is stored and declares it in its
    /// context: its device type, whether it is packed, folded or reordered.
    fn pending(
        &self,
        spec: &TensorSpec,
        info: &TensorInfo,
        folds: &HashMap<String, (Fold, Option<CentredOutputs>)>,
        device_ctx: &Context,
        host_ctx: Option<&Context>,
    ) -> Result<Pending, Error> {
        let name = spec.name.as_str();
        let Some((dtype, convert)) = storage(spec.role, info.dtype, self.conv_kernels) else {
            return Err(unusable_type(name, info.dtype));
        };
        let pack = spec.role == Role::Matmul && self.pack_linears.is_some();
        let (dtype, convert) = match (spec.role, dtype) {
            (Role::Matmul, DType::F16) if self.half_linears_bf16 && !pack => {
                (DType::BF16, Some(DType::BF16))
            }
            _ => (dtype, convert),
        };
        let host = self.host_names.contains(name);
        let packed = match self.pack_linears {
            Some(packing) if pack && !host => Packing::choose(&spec.shape, dtype, packing),
            _ => None,
        };
        let (dtype, ne) = match (packed, spec.shape.as_slice()) {
            (Some(packing), &[n_out, n_in]) => packing.layout(n_in, n_out),
            _ => (dtype, spec.shape.iter().rev().map(|&d| d as i64).collect()),
        };
        let ctx = match host {
            true => host_ctx.expect("created with host names"),
            false => device_ctx,
        };
        let tensor = ctx.new_tensor(dtype, &ne)?.named(name);
        let reorder = match &spec.vision_rope_rows {
            Some(order) if self.vision_rope => {
                check_row_order(name, order, info)?;
                Some(order.clone())
            }
            _ => None,
        };
        Ok(Pending {
            tensor,
            name: name.to_owned(),
            convert,
            conv_kernel: spec.role == Role::ConvKernel,
            packed,
            derive: derive(name, folds),
            reorder,
            host,
        })
    }

    /// Reads tensor `p` from the file and writes it into `ctx` through its transforms.
    fn write(&self, ctx: &Context, p: &Pending) -> Result<(), Error> {
        let file = self.file;
        let info = self.info(&p.name)?;
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
        if let Some(derive) = &p.derive {
            let read = |name: &str| -> Result<Vec<f32>, Error> {
                let info = self.info(name)?;
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
            packing.write(ctx, &p.tensor, &p.name, info, data)?;
        } else if p.convert.is_some() {
            write_values(ctx, &p.tensor, &p.name, &to_f32(&p.name, info.dtype, data)?)?;
        } else {
            ctx.write_bytes(&p.tensor, data)?;
        }
        Ok(())
    }
}

/// What tensor `name` is computed from where it is the weight or the bias of a folded linear
/// layer of `folds`.
fn derive(name: &str, folds: &HashMap<String, (Fold, Option<CentredOutputs>)>) -> Option<Derive> {
    let (prefix, field) = name.rsplit_once('.')?;
    let (fold, centred) = folds.get(prefix)?;
    let centred = *centred;
    let output_scale = fold.scale_after.clone();
    let norm = fold.norm_before.as_deref();
    match field {
        "weight" => Some(Derive::Weight {
            input_scale: norm.map(|n| format!("{n}.weight")),
            output_scale,
            centred,
        }),
        "bias" => Some(Derive::Bias {
            weight: format!("{prefix}.weight"),
            input_shift: norm.map(|n| format!("{n}.bias")),
            output_scale,
            centred,
        }),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da3::layers::Linear;
    use crate::da3::ops::Ops;
    use crate::ggml::{quantize, CpuKernels, LINEAR_PANEL};

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
            // Refusals, each naming the tensor.
            let refused = |name: &str, order: Vec<usize>, what: &str| {
                let info = file.tensor(name).unwrap();
                let text = check_row_order(name, &order, info).unwrap_err().to_string();
                assert!(text.contains(name) && text.contains(what), "{text}");
            };
            refused("l.bias", vec![0; n_out], "each row once");
            refused("q", (0..8).collect(), "cannot have its rows reordered");
            let spec = |name: &str, shape: Vec<usize>, role| TensorSpec {
                name: name.to_owned(),
                shape,
                role,
                quantised: false,
                fold: None,
                vision_rope_rows: Some(order.clone()),
            };
            let tensors = vec![
                spec("l.weight", vec![n_out, n_in], Role::Matmul),
                spec("l.bias", vec![n_out], Role::F32),
            ];
            let weights = Loader::new(&file, &[])
                .pack_linears(Some(packing))
                .vision_rope(true)
                .load(tensors, &Device::cpu())
                .unwrap();
            assert_eq!(weights.unused, ["q"]);

            let graph_ctx = Ops::new(
                Context::metadata(16).unwrap(),
                Some(CpuKernels::f32(KernelConfig::detect())),
            );
            let binding = weights.bind(&graph_ctx).unwrap();
            assert!(binding.packed("l.weight"), "{dtype}: the weight is packed");
            assert!(binding.rows_reordered("l.weight") && binding.rows_reordered("l.bias"));
            let layer = Linear::bind(&binding, "l").unwrap();
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
}
