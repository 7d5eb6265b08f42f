//! The adapter between ggml and our CPU kernels (the `da3-kernels` crate): nodes that ggml's
//! CPU backend runs on its own threads as GGML_OP_CUSTOM, each a kernel descriptor
//! ([`Kernel`]), the [`KernelConfig`] the caller decided and the entry point ggml calls
//! ([`run_kernel`]). Other backends refuse these nodes, so only a graph for the CPU backend
//! asks for them, and it asks explicitly: every op here is named `cpu_*` (or works on
//! packed panels) and takes the [`CpuKernels`] to run with; no ggml op changes meaning.
//!
//! The kernels index by shapes checked when the op is built; a panic in one would abort the
//! process at the FFI boundary, as a failed ggml assertion does.

use super::context::Context;
use super::dtype::DType;
use super::error::{Error, Result};
use super::tensor::{Tensor, TensorView};
use da3_kernels as kernels;
use da3_kernels::{BandFn, KernelFn, Packing, PlaneRows, Src};
pub use da3_kernels::{Config as KernelConfig, Cpu, KernelSet, Request as KernelRequest};
use ggml_sys as sys;
use std::os::raw::{c_int, c_void};

/// What a graph's CPU kernels run with: the kernels' configuration and the products the
/// model's weights were loaded for. The one input of every `cpu_*` op's choice of kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuKernels {
    /// The instruction set and its choices.
    pub config: KernelConfig,
    /// Products in bf16 with f32 sums where they pay: the fast mode of half-precision files
    /// (their linear layers, attention and convolutions), and of quantised files' attention
    /// and convolutions beside their int8 linear products. About twice as fast or more, with
    /// about 2^-9 relative error per product.
    pub bf16_products: bool,
    /// int8 products: quantised files' linear layers and attention (queries, keys, values
    /// and probabilities quantised per block of 32 values; the softmax in f32).
    pub int8_products: bool,
}

impl CpuKernels {
    /// f32 products with `config`.
    pub fn f32(config: KernelConfig) -> CpuKernels {
        CpuKernels {
            config,
            bf16_products: false,
            int8_products: false,
        }
    }

    /// Whether attention computes its scores and weighted values with int8 products: asked
    /// for, and bf16 products not on AMX tiles (which beat them). Where bf16 products are on
    /// as well, int8 wins except on AMX tiles: on Zen 4 (AVX-512 VNNI and BF16), 2 threads,
    /// 865 keys of 12 heads, 5.7 ms against 9.3 in bf16 and 12.2 in f32; held to AVX2, 9.5 ms
    /// against 12.2 in f32.
    pub fn int8_attention(&self) -> bool {
        self.int8_products && !(self.bf16_products && self.config.amx_tiles())
    }

    /// Whether attention multiplies in bf16: on AMX tiles, or with vector products that pay.
    pub fn bf16_attention(&self) -> bool {
        self.bf16_products && (self.config.vector_bf16() || self.config.amx_tiles())
    }

    /// Whether a convolution multiplies in bf16: on AMX tiles where its shape fits them
    /// (`on_tiles`), or with vector products that pay.
    pub fn bf16_convolutions(&self, on_tiles: bool) -> bool {
        self.bf16_products && (self.config.vector_bf16() || on_tiles)
    }
}

/// The views a kernel reads its operands through.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    Contiguous,
    /// Strided views whose rows are contiguous.
    RowsContiguous,
    /// Any strides in whole values (the transpose kernel).
    Any,
}

/// A kernel's entry point, by the way its result is shared between threads: each thread
/// gets a disjoint range of units, rows (`ne[0]` values) or planes (`ne[0] * ne[1]` values)
/// as one slice; or bands of this many rows (`ne[1]`) of every plane, written through
/// [`PlaneRows`].
#[derive(Clone, Copy)]
enum Run {
    Rows(KernelFn),
    Planes(KernelFn),
    Bands(BandFn, usize),
}

struct Kernel {
    run: Run,
    /// What views the operands may be.
    layout: Layout,
    /// Whether the first operand may be a weight packed as bf16 pairs (i32 words).
    packed_weights: bool,
    /// For kernels that compute one item of a batch: the operands that are batches along
    /// `ne[3]` (the others, weights and biases, serve every item). The result's `ne[3]` is
    /// the batch; [`run_kernel`] hands the kernel one item at a time, so its units (rows or
    /// planes of one item) never span two items.
    per_item: &'static [usize],
    param: f32,
}

static GELU_ERF: Kernel = Kernel {
    run: Run::Rows(kernels::gelu_erf_rows),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static CONV_SAME: Kernel = Kernel {
    run: Run::Planes(kernels::conv_same_planes),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
/// The 3x3 convolution by Winograd's F(4x4, 3x3), shared among threads by bands of whole
/// tiles' rows.
static CONV_WINOGRAD: Kernel = Kernel {
    run: Run::Bands(kernels::conv_winograd_rows, kernels::WINOGRAD_TILE),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
/// The transposed convolution of disjoint patches (kernel = stride), by bands of one input
/// row's output rows: one static per stride, as a kernel's band height is fixed.
static CONV_TRANSPOSE_2: Kernel = Kernel {
    run: Run::Bands(kernels::conv_transpose_rows, 2),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONV_TRANSPOSE_4: Kernel = Kernel {
    run: Run::Bands(kernels::conv_transpose_rows, 4),
    ..CONV_TRANSPOSE_2
};

/// Kernel values (KW x KH x IC x OC) up to which the direct convolution is shared by rows.
const DIRECT_ROWS_MAX_WEIGHTS: i64 = 64 * 1024;

/// The direct convolution shared among threads by rows of every output channel, for
/// kernels small enough that each thread packing all of them costs little.
static CONV_DIRECT_ROWS: Kernel = Kernel {
    run: Run::Bands(kernels::conv_direct_rows, 1),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONV_DIRECT_ROWS_BF16: Kernel = Kernel {
    run: Run::Bands(kernels::conv_direct_rows_bf16, 1),
    ..CONV_DIRECT_ROWS
};
static CONV_DIRECT_ROWS_RELU: Kernel = Kernel {
    param: 1.0,
    ..CONV_DIRECT_ROWS
};
static CONV_DIRECT_ROWS_BF16_RELU: Kernel = Kernel {
    param: 1.0,
    ..CONV_DIRECT_ROWS_BF16
};
/// The convolutions of the input through ReLU, applied as they read it: a parameter of 1.
static CONV_SAME_RELU: Kernel = Kernel {
    param: 1.0,
    ..CONV_SAME
};
static CONV_SAME_BF16_RELU: Kernel = Kernel {
    param: 1.0,
    ..CONV_SAME_BF16
};
static CONV_WINOGRAD_RELU: Kernel = Kernel {
    param: 1.0,
    ..CONV_WINOGRAD
};
static CONV_SAME_BF16: Kernel = Kernel {
    run: Run::Planes(kernels::conv_same_planes_bf16),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONCAT_ROWS: Kernel = Kernel {
    run: Run::Rows(kernels::concat_rows),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static TRANSPOSE: Kernel = Kernel {
    run: Run::Rows(kernels::transpose_rows),
    layout: Layout::Any,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static BILINEAR_ALIGNED: Kernel = Kernel {
    run: Run::Planes(kernels::bilinear_align_corners_planes),
    layout: Layout::Contiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR: Kernel = Kernel {
    run: Run::Rows(kernels::linear_bias_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR_GELU: Kernel = Kernel {
    run: Run::Rows(kernels::linear_bias_gelu_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR_SCALED_RESIDUAL: Kernel = Kernel {
    run: Run::Rows(kernels::linear_scaled_residual_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static ATTENTION_BF16: Kernel = Kernel {
    run: Run::Planes(kernels::attention_tokens_bf16),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};
static ATTENTION_INT8: Kernel = Kernel {
    run: Run::Planes(kernels::attention_tokens_int8),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};
static ATTENTION: Kernel = Kernel {
    run: Run::Planes(kernels::attention_tokens),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};

/// LayerNorm; its epsilon is the call's parameter ([`KernelCall::param`]).
static LAYER_NORM: Kernel = Kernel {
    run: Run::Rows(kernels::layer_norm_rows),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};

/// What one custom node hands ggml as its user data: the kernel, the configuration it runs
/// with and its parameter. Boxed and owned by the context that holds the node
/// ([`Context::cpu_op`]), so it lives as long as the node.
struct KernelCall {
    kernel: &'static Kernel,
    config: KernelConfig,
    param: f32,
}

fn shape(t: *const sys::ggml_tensor) -> [usize; 4] {
    // SAFETY: a live tensor of the graph being computed; plain field reads.
    unsafe { (*t).ne.map(|d| d as usize) }
}

/// The entry point ggml calls on each of its `nth` threads.
unsafe extern "C" fn run_kernel(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) {
    // SAFETY: `userdata` is a KernelCall boxed by `Context::cpu_op` and owned by the context
    // that holds this node, which lives while a graph of it is computed.
    let call = unsafe { &*(userdata as *const KernelCall) };
    let (kernel, config) = (call.kernel, &call.config);
    let ne = shape(dst);
    // A band kernel writes one item's planes at a time, so a batch is always items to it.
    let batch = match kernel.run {
        Run::Bands(..) => ne[3],
        _ if kernel.per_item.is_empty() => 1,
        _ => ne[3],
    };
    // Units per item of the batch (all of them, without one).
    let item_units = match kernel.run {
        Run::Rows(_) => ne[1] * ne[2] * ne[3] / batch,
        Run::Planes(_) => ne[2] * ne[3] / batch,
        Run::Bands(_, rows) => ne[1].div_ceil(rows.max(1)),
    };
    let n_units = item_units * batch;
    let per_thread = n_units.div_ceil(nth.max(1) as usize);
    let first = (ith.max(0) as usize * per_thread).min(n_units);
    let units = first..(first + per_thread).min(n_units);
    // SAFETY: `Context::cpu_op` made every source a contiguous f32 tensor (or one with
    // contiguous rows, where the kernel takes those), and ggml calls this only once they are
    // allocated and computed.
    let srcs: Vec<Src<'_>> = unsafe {
        (*dst)
            .src
            .iter()
            .take_while(|s| !s.is_null())
            .map(|&s| Src {
                data: std::slice::from_raw_parts((*s).data as *const f32, sys::ggml_nbytes(s) / 4),
                ne: shape(s),
                nb: (*s).nb.map(|b| b / 4),
                packing: match DType::from_id((*s).type_) {
                    Some(DType::I32) => Packing::Bf16Pairs,
                    Some(DType::I8) => Packing::Q8Records,
                    Some(DType::F16) => Packing::F16,
                    _ => Packing::F32,
                },
            })
            .collect()
    };
    let item_len = ne[0] * ne[1] * ne[2];
    // The units of one item at a time: the batched operands from that item's first value
    // (their data spans every item, `Context::cpu_op` checked the batch sizes).
    let mut unit = units.start;
    while unit < units.end {
        let item = unit / item_units;
        let end = ((item + 1) * item_units).min(units.end);
        let item_srcs: Vec<Src<'_>> = srcs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if batch > 1 && kernel.per_item.contains(&i) {
                    Src {
                        data: &s.data[item * s.nb[3]..],
                        ne: [s.ne[0], s.ne[1], s.ne[2], 1],
                        ..*s
                    }
                } else {
                    *s
                }
            })
            .collect();
        let (item_ne, item_units_run) = if batch > 1 {
            (
                [ne[0], ne[1], ne[2], 1],
                unit - item * item_units..end - item * item_units,
            )
        } else {
            (ne, unit..end)
        };
        match kernel.run {
            Run::Rows(run) | Run::Planes(run) => {
                let unit_len = match kernel.run {
                    Run::Rows(_) => ne[0],
                    _ => ne[0] * ne[1],
                };
                // SAFETY: the result is a contiguous f32 tensor of `ne` (`Context::cpu_op`);
                // GGML_OP_CUSTOM never runs in place (ggml_op_can_inplace), so it shares no
                // memory with a source, and each thread's units are disjoint values of it.
                let out = unsafe {
                    std::slice::from_raw_parts_mut(
                        ((*dst).data as *mut f32).add(unit * unit_len),
                        (end - unit) * unit_len,
                    )
                };
                run(config, &item_srcs, out, item_ne, item_units_run, call.param);
            }
            Run::Bands(run, rows) => {
                let band = item_units_run.start * rows..item_units_run.end * rows;
                // SAFETY: as above, the result is contiguous f32 of `ne`, shared with no
                // source; this item's planes start `item * item_len` values in, and the
                // threads' bands are disjoint ranges of rows, so no two threads write the
                // same row.
                let mut out = unsafe {
                    PlaneRows::band(
                        ((*dst).data as *mut f32).add(item * item_len),
                        [ne[0], ne[1], ne[2]],
                        band,
                    )
                };
                run(config, &item_srcs, &mut out, item_ne, call.param);
            }
        }
        unit = end;
    }
}

/// Columns per panel of a weight packed by [`pack_linear_panels`] (the same for every CPU).
pub const LINEAR_PANEL: usize = kernels::PANEL;

/// Packs the weight of a linear layer, `n` rows of `k` values (ggml's [k, n], PyTorch's
/// [n, k]), for [`Context::linear_panels`]: the result has ggml shape
/// [[`LINEAR_PANEL`], k, n / [`LINEAR_PANEL`]]. `n` must be a multiple of [`LINEAR_PANEL`].
pub fn pack_linear_panels(w: &[f32], k: usize, n: usize) -> Result<(Vec<f32>, [i64; 3])> {
    check_linear_weight("pack_linear_panels", w, k, n)?;
    Ok((kernels::pack_panels(w, k, n), panel_shape(k, n)))
}

/// The ggml shape of `n` outputs of `k` inputs packed one value per input:
/// [[`LINEAR_PANEL`], k, n / [`LINEAR_PANEL`]].
fn panel_shape(k: usize, n: usize) -> [i64; 3] {
    [LINEAR_PANEL as i64, k as i64, (n / LINEAR_PANEL) as i64]
}

/// `w` holds an `n` x `k` weight whose outputs fill whole panels.
fn check_linear_weight(op: &'static str, w: &[f32], k: usize, n: usize) -> Result<()> {
    if k == 0 || n == 0 || !n.is_multiple_of(LINEAR_PANEL) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{n} outputs of {k} inputs: outputs must be a positive multiple of {LINEAR_PANEL}"
            ),
        });
    }
    if w.len() != k * n {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{} values for a {n} x {k} weight", w.len()),
        });
    }
    Ok(())
}

/// As [`pack_linear_panels`], rounding the weight to bf16 and storing pairs of consecutive
/// inputs as one i32 word: ggml shape [[`LINEAR_PANEL`], k / 2, n / [`LINEAR_PANEL`]], `k` even. The
/// product then rounds the layer's input to bf16 as well and accumulates in f32: about 2^-9
/// relative error per product, for twice the speed of f32 where [`KernelConfig::linear_bf16`]
/// holds.
pub fn pack_linear_panels_bf16(w: &[f32], k: usize, n: usize) -> Result<(Vec<i32>, [i64; 3])> {
    let op = "pack_linear_panels_bf16";
    check_linear_weight(op, w, k, n)?;
    // Pairs of inputs fill whole words: an odd depth would leave the packing unable to tell
    // K from K + 1, and a mismatched input would go unnoticed.
    if !k.is_multiple_of(2) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!("{k} inputs: bf16 pairs need an even number"),
        });
    }
    let shape = [
        LINEAR_PANEL as i64,
        (k / 2) as i64,
        (n / LINEAR_PANEL) as i64,
    ];
    Ok((kernels::pack_panels_bf16(w, k, n), shape))
}

/// As [`pack_linear_panels`], storing the weight as f16 (ggml shape and layout the same,
/// dtype F16): half the memory of f32 panels for the products of CPUs without bf16 ones,
/// which widen each weight to f32 as they load it (F16C). Exact for a weight read from an f16
/// file; the products themselves stay in f32.
pub fn pack_linear_panels_f16(w: &[f32], k: usize, n: usize) -> Result<(Vec<half::f16>, [i64; 3])> {
    check_linear_weight("pack_linear_panels_f16", w, k, n)?;
    let packed = kernels::pack_panels(w, k, n);
    let halves = packed.into_iter().map(half::f16::from_f32).collect();
    Ok((halves, panel_shape(k, n)))
}

/// Bytes per (panel, block of 32 inputs) of a weight packed by [`pack_linear_panels_q8`]:
/// the packed tensor's first dimension.
pub const LINEAR_Q8_RECORD: usize = kernels::Q8_RECORD * 4;

/// Packs a q8_0 weight (`n` rows of `k` values in ggml's q8_0 blocks, as a file stores it)
/// for int8 products in [`Context::linear_panels`]: ggml shape
/// [[`LINEAR_Q8_RECORD`], k / 32, n / [`LINEAR_PANEL`]] of i8, the same values
/// and scales in another order. The product quantises each 32 inputs of the layer's input
/// to 8 bits with a scale, as ggml's q8_0 product does, and sums them exactly in integers.
pub fn pack_linear_panels_q8(q8: &[u8], k: usize, n: usize) -> Result<(Vec<u8>, [i64; 3])> {
    let op = "pack_linear_panels_q8";
    let block = kernels::Q8_BLOCK;
    if k == 0 || !k.is_multiple_of(block) || n == 0 || !n.is_multiple_of(LINEAR_PANEL) {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{n} outputs of {k} inputs: inputs must be a positive multiple of {block} and outputs of {LINEAR_PANEL}"
            ),
        });
    }
    let expected = n * (k / block) * DType::Q8_0.type_size();
    if q8.len() != expected {
        return Err(Error::InvalidArgument {
            op,
            reason: format!(
                "{} bytes for a {n} x {k} q8_0 weight, which takes {expected}",
                q8.len()
            ),
        });
    }
    let words = kernels::pack_panels_q8(q8, k, n);
    let bytes = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let shape = [
        LINEAR_Q8_RECORD as i64,
        (k / block) as i64,
        (n / LINEAR_PANEL) as i64,
    ];
    Ok((bytes, shape))
}

impl Context {
    /// A linear layer on the CPU with a packed weight: `x` [K, T] times the weight packed by
    /// [`pack_linear_panels`] ([PANEL, K, N / PANEL]; or [`pack_linear_panels_bf16`],
    /// [`pack_linear_panels_q8`]) plus `bias` \[N\], then GELU (erf form)
    /// when `gelu` is set; the result is [N, T]. A blocked product that keeps a tile of the
    /// result in registers, where ggml's f32 product reaches about 60% of this CPU's peak.
    /// Only the CPU backend runs it.
    pub fn linear_panels(
        &self,
        kernels: &CpuKernels,
        panels: &Tensor,
        x: &Tensor,
        bias: &Tensor,
        gelu: bool,
    ) -> Result<Tensor> {
        let ne = self.check_linear_panels(panels, x, bias)?;
        let kernel = if gelu { &LINEAR_GELU } else { &LINEAR };
        self.cpu_op(
            "linear_panels",
            (kernel, &kernels.config),
            &[panels, x, bias],
            ne,
        )
    }

    /// The result shape [N, T] of a packed linear layer, or why it cannot be computed.
    fn check_linear_panels(&self, panels: &Tensor, x: &Tensor, bias: &Tensor) -> Result<[i64; 4]> {
        let op = "linear_panels";
        let (pn, xn) = (panels.ne(), x.ne());
        let invalid = |reason: String| Error::InvalidArgument { op, reason };
        // Inputs per output: one per row of a panel in f32, two per word in bf16, 32 per
        // record of int8 products.
        let (inputs, row_len) = match panels.dtype() {
            DType::F32 | DType::F16 => (pn[1], LINEAR_PANEL),
            DType::I32 => (2 * pn[1], LINEAR_PANEL),
            DType::I8 => (kernels::Q8_BLOCK as i64 * pn[1], LINEAR_Q8_RECORD),
            _ => (0, 0),
        };
        let n = LINEAR_PANEL as i64 * pn[2];
        if pn[0] != row_len as i64 || pn[3] != 1 || inputs == 0 {
            return Err(invalid(format!(
                "weight {} is not a packing into panels of {LINEAR_PANEL}",
                panels.describe()
            )));
        }
        if x.dtype() != DType::F32 || x.nb()[0] != 4 {
            return Err(invalid(format!(
                "x {} must be f32 with contiguous rows",
                x.describe()
            )));
        }
        if xn[0] != inputs || xn[2] != 1 || xn[3] != 1 || bias.ne() != [n, 1, 1, 1] {
            return Err(Error::ShapeMismatch {
                op,
                operands: vec![panels.describe(), x.describe(), bias.describe()],
                reason: format!(
                    "expected x [{inputs}, T] (the packed depth) and a bias of {n} values"
                ),
            });
        }
        Ok([n, xn[1], 1, 1])
    }

    /// `residual + scale * (x W^T + bias)` with a packed weight, as [`Context::linear_panels`]
    /// computes the product (a transformer block's layer-scaled residual branch, in one pass):
    /// `scale` \[N\], `residual` [N, T].
    pub fn linear_panels_residual(
        &self,
        kernels: &CpuKernels,
        panels: &Tensor,
        x: &Tensor,
        bias: &Tensor,
        scale: &Tensor,
        residual: &Tensor,
    ) -> Result<Tensor> {
        let op = "linear_panels";
        let ne @ [n, t, _, _] = self.check_linear_panels(panels, x, bias)?;
        if scale.ne() != [n, 1, 1, 1] || residual.ne() != ne {
            return Err(Error::ShapeMismatch {
                op,
                reason: format!("expected a scale of {n} values and a residual [{n}, {t}]"),
                operands: vec![scale.describe(), residual.describe()],
            });
        }
        self.cpu_op(
            op,
            (&LINEAR_SCALED_RESIDUAL, &kernels.config),
            &[panels, x, bias, scale, residual],
            ne,
        )
    }

    /// LayerNorm over `ne[0]` with weight and bias in one pass (ggml: norm, mul, add), as
    /// [`Context::layer_norm`] computes it. Rows may be strided (the per-head norms of a fused
    /// QKV projection). Only where [`Context::cpu_layer_norm_applies`].
    pub fn cpu_layer_norm(
        &self,
        kernels: &CpuKernels,
        a: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        let op = "layer_norm";
        if !Self::cpu_layer_norm_applies(a, weight, bias) {
            return Err(not_for_kernel(op, &[a, weight, bias]));
        }
        let call = (&LAYER_NORM, &kernels.config);
        self.cpu_op_with(op, call, Some(eps), &[a, weight, bias], a.ne())
    }

    /// Whether [`Context::cpu_layer_norm`] computes this LayerNorm: f32 rows, weight and bias
    /// f32 vectors of `a`'s row length.
    pub fn cpu_layer_norm_applies(a: &Tensor, weight: &Tensor, bias: &Tensor) -> bool {
        let f32_rows = |t: &Tensor| t.dtype() == DType::F32 && t.nb()[0] == 4;
        let vector = |p: &Tensor| p.ne()[0] == a.ne()[0] && p.nelements() == p.ne()[0];
        f32_rows(a) && [weight, bias].iter().all(|p| f32_rows(p) && vector(p))
    }

    /// A custom op computing an f32 tensor of shape `ne` from `srcs` with `kernel`.
    fn cpu_op(
        &self,
        op: &'static str,
        call: (&'static Kernel, &KernelConfig),
        srcs: &[&Tensor],
        ne: [i64; 4],
    ) -> Result<Tensor> {
        self.cpu_op_with(op, call, None, srcs, ne)
    }

    /// [`Context::cpu_op`] with `param` in place of the kernel's own parameter.
    fn cpu_op_with(
        &self,
        op: &'static str,
        (kernel, config): (&'static Kernel, &KernelConfig),
        param: Option<f32>,
        srcs: &[&Tensor],
        ne: [i64; 4],
    ) -> Result<Tensor> {
        for (i, src) in srcs.iter().enumerate() {
            let packed = i == 0 && kernel.packed_weights;
            super::ops::require_dtype(
                op,
                src,
                if packed {
                    &[DType::F32, DType::I32, DType::I8, DType::F16]
                } else {
                    &[DType::F32]
                },
            )?;
            let rows_contiguous = src.nb()[0] == 4 && src.nb().iter().all(|b| b % 4 == 0);
            let values = src.nb().iter().all(|b| b % 4 == 0);
            let fits = match kernel.layout {
                Layout::Contiguous => src.is_contiguous(),
                Layout::RowsContiguous => src.is_contiguous() || rows_contiguous,
                Layout::Any => values,
            };
            if !fits {
                return Err(Error::NotContiguous {
                    op,
                    operand: src.describe(),
                });
            }
        }
        for &i in kernel.per_item {
            if let Some(src) = srcs.get(i) {
                if src.ne()[3] != ne[3] {
                    return Err(Error::ShapeMismatch {
                        op,
                        reason: format!(
                            "a batch of {} items for a result of {}",
                            src.ne()[3],
                            ne[3]
                        ),
                        operands: vec![src.describe()],
                    });
                }
            }
        }
        if srcs.len() >= sys::GGML_MAX_SRC as usize {
            return Err(Error::InvalidArgument {
                op,
                reason: format!("{} operands, at most {}", srcs.len(), sys::GGML_MAX_SRC - 1),
            });
        }
        self.reserve_result(DType::F32, ne)?;
        let mut args: Vec<*mut sys::ggml_tensor> = srcs.iter().map(|s| s.as_ptr()).collect();
        let call = self.hold_node_data(Box::new(KernelCall {
            kernel,
            config: *config,
            param: param.unwrap_or(kernel.param),
        }));
        let userdata = call as *mut c_void;
        // SAFETY: fewer than GGML_MAX_SRC operands (ggml_custom_4d's assertion), positive dims
        // (the callers' shapes come from live tensors); the call is held by this context, so it
        // outlives every graph holding the node.
        let raw = unsafe {
            sys::ggml_custom_4d(
                self.raw(),
                DType::F32.id(),
                ne[0],
                ne[1],
                ne[2],
                ne[3],
                args.as_mut_ptr(),
                args.len() as c_int,
                Some(run_kernel),
                sys::GGML_N_TASKS_MAX,
                userdata,
            )
        };
        // Named after the op, so that profiles tell the custom nodes apart.
        Ok(self.result(raw, op, srcs)?.named(op))
    }

    /// Whether [`Context::cpu_concat_rows`] joins these: f32 matrices with contiguous rows.
    pub fn cpu_concat_rows_applies(a: &Tensor, b: &Tensor) -> bool {
        let matrix = |t: &Tensor| {
            t.dtype() == DType::F32 && t.nb()[0] == 4 && t.ne()[2] == 1 && t.ne()[3] == 1
        };
        matrix(a) && matrix(b)
    }

    /// Rows of `a` followed by the rows of `b` (concat along dim 0) as row copies, as
    /// [`Context::concat`] joins them; ggml's kernel computes an index per value. Only where
    /// [`Context::cpu_concat_rows_applies`] and the rows' other dims agree.
    pub fn cpu_concat_rows(&self, kernels: &CpuKernels, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = "concat";
        if !Self::cpu_concat_rows_applies(a, b) || a.ne()[1] != b.ne()[1] {
            return Err(not_for_kernel(op, &[a, b]));
        }
        let ne = [a.ne()[0] + b.ne()[0], a.ne()[1], 1, 1];
        self.cpu_op(op, (&CONCAT_ROWS, &kernels.config), &[a, b], ne)
    }

    /// Whether [`Context::cpu_transpose`] makes `a` contiguous: the transpose of a contiguous
    /// f32 matrix.
    pub fn cpu_transpose_applies(a: &Tensor) -> bool {
        let [n0, n1, n2, n3] = a.ne();
        a.dtype() == DType::F32
            && n2 == 1
            && n3 == 1
            && a.nb()[1] == 4
            && a.nb()[0] == 4 * n1 as usize
            && n0 > 1
    }

    /// A contiguous copy of a transposed matrix, by cache-sized tiles, as [`Context::cont`]
    /// makes it; ggml's copy walks the source with a stride per value. Only where
    /// [`Context::cpu_transpose_applies`].
    pub fn cpu_transpose(&self, kernels: &CpuKernels, a: &Tensor) -> Result<Tensor> {
        if !Self::cpu_transpose_applies(a) {
            return Err(not_for_kernel("cont", &[a]));
        }
        self.cpu_op("cont", (&TRANSPOSE, &kernels.config), &[a], a.ne())
    }

    /// GELU (erf form) vectorised, as [`Context::gelu_erf`]; ggml's CPU kernel calls the
    /// scalar `erff` per value. Only for contiguous f32 tensors.
    pub fn cpu_gelu_erf(&self, kernels: &CpuKernels, a: &Tensor) -> Result<Tensor> {
        if !Self::cpu_gelu_erf_applies(a) {
            return Err(not_for_kernel("gelu_erf", &[a]));
        }
        self.cpu_op("gelu_erf", (&GELU_ERF, &kernels.config), &[a], a.ne())
    }

    /// Whether [`Context::cpu_gelu_erf`] computes GELU of `a`: contiguous f32.
    pub fn cpu_gelu_erf_applies(a: &Tensor) -> bool {
        a.dtype() == DType::F32 && a.is_contiguous()
    }

    /// Attention as [`Context::attention`] computes it, with the usual scale `1 / sqrt(D)`:
    /// per head, the scores of a tile of queries against every key, an exact softmax and the
    /// weighted sum of the values, with the keys of a head transposed once per thread (ggml's
    /// fused kernel transposes them again for every tile of queries).
    /// In int8 or bf16 where `kernels` say so ([`CpuKernels::int8_attention`],
    /// [`CpuKernels::bf16_attention`]). Only for the cases [`Context::cpu_attention_applies`]
    /// accepts, with the usual scale.
    pub fn cpu_attention(
        &self,
        kernels: &CpuKernels,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
    ) -> Result<Tensor> {
        let scale = 1.0 / (q.ne()[0] as f32).sqrt();
        if !Self::cpu_attention_applies(q, k, v, scale) {
            return Err(not_for_kernel("attention", &[q, k, v]));
        }
        let (qn, vn) = (q.ne(), v.ne());
        let kernel = if kernels.int8_attention() && Self::int8_attention_applies(q, v) {
            &ATTENTION_INT8
        } else if kernels.bf16_attention() {
            &ATTENTION_BF16
        } else {
            &ATTENTION
        };
        self.cpu_op(
            "attention",
            (kernel, &kernels.config),
            &[q, k, v],
            [vn[0], qn[2], qn[1], qn[3]],
        )
    }

    /// Whether int8 attention takes these heads: queries (so keys) and values of whole
    /// blocks of 32 values, the blocks its products quantise.
    fn int8_attention_applies(q: &Tensor, v: &Tensor) -> bool {
        let whole_blocks = |t: &Tensor| (t.ne()[0] as usize).is_multiple_of(kernels::Q8_BLOCK);
        whole_blocks(q) && whole_blocks(v)
    }

    /// Whether [`Context::cpu_attention`] computes this attention: f32 heads of matching
    /// sizes (a batch of attentions along `ne[3]`, the same for Q, K and V), value rows a
    /// whole number of vectors, the usual scale.
    pub fn cpu_attention_applies(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> bool {
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        let shapes_agree = kn[0] == qn[0] && vn[1] == kn[1] && qn[2] == kn[2] && vn[2] == kn[2];
        let one_batch = kn[3] == qn[3] && vn[3] == qn[3];
        let f32_rows = [q, k, v]
            .iter()
            .all(|t| t.dtype() == DType::F32 && t.nb()[0] == 4);
        shapes_agree
            && one_batch
            && f32_rows
            && (vn[0] as usize).is_multiple_of(kernels::ATTENTION_DV_MULTIPLE)
            && scale == 1.0 / (qn[0] as f32).sqrt()
    }

    /// Bilinear resampling with aligned corners of the planes of `a` to `w` x `h` (a copy at
    /// its own size), as ggml's kernel computes it but with the per-column coordinates worked
    /// out once, not per value; plus the separable `offset` (along x, along y) when given, in
    /// the same pass, where the offset is `[w, 1, C, 1]` and `[1, h, C, 1]` f32. Contiguous
    /// f32 operands; `w` and `h` positive.
    pub fn cpu_bilinear_align_corners(
        &self,
        kernels: &CpuKernels,
        a: &Tensor,
        w: i64,
        h: i64,
        offset: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        let ne = a.ne();
        let ne = [w, h, ne[2], ne[3]];
        let contiguous_f32 = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
        let offset_fits = offset.is_none_or(|(x, y)| {
            contiguous_f32(x)
                && contiguous_f32(y)
                && x.ne() == [w, 1, ne[2], 1]
                && y.ne() == [1, h, ne[2], 1]
        });
        if w < 1 || h < 1 || !contiguous_f32(a) || !offset_fits {
            let mut operands = vec![a];
            operands.extend(offset.into_iter().flat_map(|(x, y)| [x, y]));
            return Err(not_for_kernel("interpolate", &operands));
        }
        let call = (&BILINEAR_ALIGNED, &kernels.config);
        match offset {
            Some((x, y)) => self.cpu_op("interpolate_add", call, &[a, x, y], ne),
            None => self.cpu_op("interpolate", call, &[a], ne),
        }
    }

    /// A transposed convolution whose kernel [s, s, OC, IC] is its stride, plus `bias`
    /// `[OC]`, where a CPU kernel computes it (s = 2 or 4, f32 contiguous operands); None
    /// elsewhere.
    pub fn cpu_conv_transpose_2d_bias(
        &self,
        kernels: &CpuKernels,
        kernel: &Tensor,
        input: &Tensor,
        bias: &Tensor,
        stride: i32,
    ) -> Result<Option<Tensor>> {
        let (kn, inp) = (kernel.ne(), input.ne());
        let f32_contiguous = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
        let op = match stride {
            2 => &CONV_TRANSPOSE_2,
            4 => &CONV_TRANSPOSE_4,
            _ => return Ok(None),
        };
        let s = stride as i64;
        if !(kn[0] == s
            && kn[1] == s
            && kn[3] == inp[2]
            && bias.nelements() == kn[2]
            && [kernel, input, bias].into_iter().all(f32_contiguous))
        {
            return Ok(None);
        }
        let ne = [inp[0] * s, inp[1] * s, kn[2], inp[3]];
        self.cpu_op(
            "conv_transpose",
            (op, &kernels.config),
            &[kernel, input, bias],
            ne,
        )
        .map(Some)
    }

    /// Whether [`Context::cpu_conv_2d_same`] computes this convolution.
    pub fn cpu_conv_2d_applies(
        kernel: &Tensor,
        input: &Tensor,
        stride: (i32, i32),
        padding: (i32, i32),
        dilation: (i32, i32),
    ) -> bool {
        let (kn, inp) = (kernel.ne(), input.ne());
        let f32_contiguous = |t: &Tensor| t.dtype() == DType::F32 && t.is_contiguous();
        kn[0] % 2 == 1
            && kn[1] % 2 == 1
            && (padding.0 as i64, padding.1 as i64) == (kn[0] / 2, kn[1] / 2)
            && stride == (1, 1)
            && dilation == (1, 1)
            && kn[2] == inp[2]
            && f32_contiguous(kernel)
            && f32_contiguous(input)
    }

    /// A stride-1 convolution with "same" zero padding plus an optional per-channel bias,
    /// computed from the input rows with no im2col buffer (at full resolution that buffer
    /// outgrows the caches and costs as much as the product), of the input through ReLU
    /// where `relu_input` (applied as the kernel reads it; a node of its own before AMX
    /// tiles). Only for the cases [`Context::cpu_conv_2d_applies`] accepts (stride 1, "same"
    /// padding, no dilation), with a bias of OC contiguous f32 values.
    pub fn cpu_conv_2d_same(
        &self,
        kernels: &CpuKernels,
        kernel: &Tensor,
        input: &Tensor,
        bias: Option<&Tensor>,
        relu_input: bool,
    ) -> Result<Tensor> {
        let (kn, inp) = (kernel.ne(), input.ne());
        let same = Self::cpu_conv_2d_applies(
            kernel,
            input,
            (1, 1),
            ((kn[0] / 2) as i32, (kn[1] / 2) as i32),
            (1, 1),
        );
        let bias_fits = bias
            .is_none_or(|b| b.dtype() == DType::F32 && b.is_contiguous() && b.nelements() == kn[3]);
        if !same || !bias_fits {
            let mut operands = vec![kernel, input];
            operands.extend(bias);
            return Err(not_for_kernel("conv_2d", &operands));
        }
        let config = &kernels.config;
        let kernel_tensor = kernel;
        let on_tiles = || {
            let shape = kn.map(|n| n as usize);
            config.amx_tiles() && kernels::amx_convolution_fits(shape)
        };
        // Winograd's F(4x4, 3x3), shared by rows, where it pays: in f32 also where products
        // may be bf16 (f16 and bf16 files) but not on AMX tiles, since a quarter of the
        // products in f32 beat vector bf16 products (AVX512_BF16, Zen 4, 2 threads: 504x336
        // 64 -> 32 channels 12.6 ms against 21.7). The direct kernel, by output channels,
        // elsewhere.
        let winograd = kn[..2] == [3, 3]
            && config.winograd()
            && kernels::winograd_pays(config, inp[0] as usize, inp[1] as usize);
        let tiles = on_tiles();
        let bf16 = kernels.bf16_convolutions(tiles) && (tiles || !winograd);
        // AMX tiles read the input as it is: a ReLU node before them.
        let relu = relu_input && !(bf16 && tiles);
        // The direct kernel by rows where its weights are small: with a channel split, each
        // thread gathered every input row for its share, and a kernel of two output channels
        // (the head's last) kept one channel per thread on a 1-row tile. Large kernels split
        // by channels, as each thread packs the weights it multiplies (3.5 MB at 768 -> 128
        // channels, 3x3).
        let by_rows = kn.iter().product::<i64>() <= DIRECT_ROWS_MAX_WEIGHTS;
        let pick = |plain, with_relu| if relu { with_relu } else { plain };
        let (op, kernel): (_, &'static Kernel) = if winograd && !bf16 {
            (
                "conv_2d_winograd",
                pick(&CONV_WINOGRAD, &CONV_WINOGRAD_RELU),
            )
        } else if bf16 && tiles {
            ("conv_2d", &CONV_SAME_BF16)
        } else if bf16 && by_rows {
            (
                "conv_2d",
                pick(&CONV_DIRECT_ROWS_BF16, &CONV_DIRECT_ROWS_BF16_RELU),
            )
        } else if bf16 {
            ("conv_2d", pick(&CONV_SAME_BF16, &CONV_SAME_BF16_RELU))
        } else if by_rows {
            ("conv_2d", pick(&CONV_DIRECT_ROWS, &CONV_DIRECT_ROWS_RELU))
        } else {
            ("conv_2d", pick(&CONV_SAME, &CONV_SAME_RELU))
        };
        let relu_node;
        let input = if relu_input && !relu {
            relu_node = self.relu(input)?;
            &relu_node
        } else {
            input
        };
        let mut srcs = vec![kernel_tensor, input];
        srcs.extend(bias);
        self.cpu_op(op, (kernel, config), &srcs, [inp[0], inp[1], kn[3], inp[3]])
    }
}

/// The error of a `cpu_*` op asked for operands its kernel does not take.
fn not_for_kernel(op: &'static str, operands: &[&Tensor]) -> Error {
    let reason = "not operands the CPU kernel takes (see the op's `_applies` check)";
    super::ops::mismatch(op, reason, operands)
}
