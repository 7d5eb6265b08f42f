//! Ops with Rust kernels (`cpu_kernels.rs`) that ggml's CPU backend runs on its own threads
//! as GGML_OP_CUSTOM nodes, where ggml's CPU kernel is far from what the hardware allows.
//! Other backends refuse these nodes: the ops that pick them ([`Context::attention`],
//! [`Context::conv_2d`], [`Context::conv_2d_bias`], [`Context::gelu_erf`],
//! [`Context::interpolate`]) do so only in contexts marked with [`Context::use_cpu_kernels`].
//!
//! The kernels index by shapes checked when the op is built; a panic in one would abort the
//! process at the FFI boundary, as a failed ggml assertion does.

use super::context::Context;
use super::cpu_kernels;
pub use super::cpu_kernels::KernelSet;
use super::dtype::DType;
use super::error::{Error, Result};
use super::tensor::{Tensor, TensorView};
use ggml_sys as sys;
use std::ops::Range;
use std::os::raw::{c_int, c_void};
use std::sync::Mutex;

/// An operand as a kernel sees it: f32 data from its first value to its last, ggml's shape
/// and its strides in values (contiguous rows: `nb[0]` is 1).
#[derive(Clone, Copy)]
pub(super) struct Src<'a> {
    pub data: &'a [f32],
    pub ne: [usize; 4],
    pub nb: [usize; 4],
    /// Only f32, or for a packed weight (read through `data` as words) i32 for pairs of bf16,
    /// i8 for int8 products or f16 (two halves per word).
    pub dtype: DType,
}

impl Src<'_> {
    /// The data as f16 bits, two per word (a weight packed as f16 panels).
    pub fn halves(&self) -> &[u16] {
        // SAFETY: `data` is a live slice of f32, 4-byte aligned and so 2-byte aligned; its
        // bytes read as twice as many u16 cover exactly the same memory, borrowed as long.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u16, self.data.len() * 2) }
    }
}

/// Rows `rows` of every plane of a result of `planes` planes of `width` x `height`, written
/// by one thread: a map split among threads by rows, not by planes (a kernel whose work on
/// a row serves every output channel, Winograd's input transform, would otherwise repeat it
/// on each thread).
pub(super) struct PlaneRows<'a> {
    data: *mut f32,
    shape: [usize; 3],
    rows: Range<usize>,
    _borrow: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> PlaneRows<'a> {
    /// Every row of the `planes` planes of `width` x `height` in `data`.
    pub fn whole(data: &'a mut [f32], [width, height, planes]: [usize; 3]) -> Self {
        let len = width
            .checked_mul(height)
            .and_then(|n| n.checked_mul(planes));
        assert!(
            len.is_some_and(|len| data.len() >= len),
            "planes past the result"
        );
        PlaneRows {
            data: data.as_mut_ptr(),
            shape: [width, height, planes],
            rows: 0..height,
            _borrow: std::marker::PhantomData,
        }
    }

    /// Rows `rows` of the planes at `data`.
    ///
    /// # Safety
    /// `data` holds `width * height * planes` f32 values, valid for writes for `'a`, and no
    /// other reference to rows `rows` of any plane is used for `'a` (other threads' bands
    /// cover other rows).
    unsafe fn band(
        data: *mut f32,
        [width, height, planes]: [usize; 3],
        rows: Range<usize>,
    ) -> Self {
        PlaneRows {
            data,
            shape: [width, height, planes],
            rows: rows.start.min(height)..rows.end.min(height),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Only rows `rows` of these (what a thread would be given).
    #[cfg(test)]
    pub fn narrowed(self, rows: Range<usize>) -> Self {
        let start = rows.start.clamp(self.rows.start, self.rows.end);
        PlaneRows {
            rows: start..rows.end.clamp(start, self.rows.end),
            ..self
        }
    }

    /// The rows this band may write.
    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// Row `y` (one of [`PlaneRows::rows`]) of plane `plane`.
    pub fn row_mut(&mut self, plane: usize, y: usize) -> &mut [f32] {
        let [width, height, planes] = self.shape;
        assert!(
            plane < planes && self.rows.contains(&y),
            "row {y} of plane {plane} outside rows {:?} of {planes} planes",
            self.rows
        );
        // SAFETY: within the `width * height * planes` values at `data` (plane < planes,
        // y < height), a row of this band, which no one else uses for 'a (`whole` holds the
        // only borrow of them; `band`'s caller keeps other threads to other rows); `&mut
        // self` keeps one row at a time.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.add((plane * height + y) * width), width)
        }
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

/// Writes units `units` of the result (of shape `ne`) into `out`, which holds exactly those;
/// `param` is the kernel's scalar parameter (an epsilon), unused by most.
type KernelFn =
    fn(srcs: &[Src<'_>], out: &mut [f32], ne: [usize; 4], units: Range<usize>, param: f32);

/// Writes the rows `out` holds of a result of shape `ne` (one item of a batch); `param` as
/// for [`KernelFn`].
type BandFn = fn(srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32);

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
    run: Run::Rows(cpu_kernels::gelu_erf_rows),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static CONV_SAME: Kernel = Kernel {
    run: Run::Planes(cpu_kernels::conv_same_planes),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
/// The 3x3 convolution by Winograd's F(4x4, 3x3), shared among threads by bands of whole
/// tiles' rows.
static CONV_WINOGRAD: Kernel = Kernel {
    run: Run::Bands(cpu_kernels::conv_winograd_rows, cpu_kernels::WINOGRAD_TILE),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
/// The transposed convolution of disjoint patches (kernel = stride), by bands of one input
/// row's output rows: one static per stride, as a kernel's band height is fixed.
static CONV_TRANSPOSE_2: Kernel = Kernel {
    run: Run::Bands(cpu_kernels::conv_transpose_rows, 2),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONV_TRANSPOSE_4: Kernel = Kernel {
    run: Run::Bands(cpu_kernels::conv_transpose_rows, 4),
    ..CONV_TRANSPOSE_2
};

/// Kernel values (KW x KH x IC x OC) up to which the direct convolution is shared by rows.
const DIRECT_ROWS_MAX_WEIGHTS: i64 = 64 * 1024;

/// The direct convolution shared among threads by rows of every output channel, for
/// kernels small enough that each thread packing all of them costs little.
static CONV_DIRECT_ROWS: Kernel = Kernel {
    run: Run::Bands(cpu_kernels::conv_direct_rows, 1),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONV_DIRECT_ROWS_BF16: Kernel = Kernel {
    run: Run::Bands(cpu_kernels::conv_direct_rows_bf16, 1),
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
    run: Run::Planes(cpu_kernels::conv_same_planes_bf16),
    layout: Layout::Contiguous,
    packed_weights: false,
    per_item: &[1],
    param: 0.0,
};
static CONCAT_ROWS: Kernel = Kernel {
    run: Run::Rows(cpu_kernels::concat_rows),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static TRANSPOSE: Kernel = Kernel {
    run: Run::Rows(cpu_kernels::transpose_rows),
    layout: Layout::Any,
    packed_weights: false,
    per_item: &[],
    param: 0.0,
};
static BILINEAR_ALIGNED: Kernel = Kernel {
    run: Run::Planes(cpu_kernels::bilinear_align_corners_planes),
    layout: Layout::Contiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR: Kernel = Kernel {
    run: Run::Rows(cpu_kernels::linear_bias_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR_GELU: Kernel = Kernel {
    run: Run::Rows(cpu_kernels::linear_bias_gelu_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static LINEAR_SCALED_RESIDUAL: Kernel = Kernel {
    run: Run::Rows(cpu_kernels::linear_scaled_residual_rows),
    layout: Layout::RowsContiguous,
    packed_weights: true,
    per_item: &[],
    param: 0.0,
};
static ATTENTION_BF16: Kernel = Kernel {
    run: Run::Planes(cpu_kernels::attention_tokens_bf16),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};
static ATTENTION_INT8: Kernel = Kernel {
    run: Run::Planes(cpu_kernels::attention_tokens_int8),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};
static ATTENTION: Kernel = Kernel {
    run: Run::Planes(cpu_kernels::attention_tokens),
    layout: Layout::RowsContiguous,
    packed_weights: false,
    per_item: &[0, 1, 2],
    param: 0.0,
};

/// The LayerNorm kernel for `eps`. Kernels are handed to ggml as `'static` user data, so one
/// is leaked per distinct epsilon (models use one or two).
fn layer_norm_kernel(eps: f32) -> &'static Kernel {
    static KERNELS: Mutex<Vec<&'static Kernel>> = Mutex::new(Vec::new());
    let mut kernels = KERNELS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(kernel) = kernels.iter().find(|k| k.param.to_bits() == eps.to_bits()) {
        return kernel;
    }
    let kernel: &'static Kernel = Box::leak(Box::new(Kernel {
        run: Run::Rows(cpu_kernels::layer_norm_rows),
        layout: Layout::RowsContiguous,
        packed_weights: false,
        per_item: &[],
        param: eps,
    }));
    kernels.push(kernel);
    kernel
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
    // SAFETY: `userdata` is one of the `'static` kernels above (see `Context::cpu_op`).
    let kernel = unsafe { &*(userdata as *const Kernel) };
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
                dtype: DType::from_id((*s).type_).unwrap_or(DType::F32),
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
                run(&item_srcs, out, item_ne, item_units_run, kernel.param);
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
                run(&item_srcs, &mut out, item_ne, kernel.param);
            }
        }
        unit = end;
    }
}

/// Columns per panel of a weight packed by [`pack_linear_panels`] (the same for every CPU).
pub const LINEAR_PANEL: usize = cpu_kernels::PANEL;

/// Packs the weight of a linear layer, `n` rows of `k` values (ggml's [k, n], PyTorch's
/// [n, k]), for [`Context::linear_panels`]: the result has ggml shape
/// [[`LINEAR_PANEL`], k, n / [`LINEAR_PANEL`]]. `n` must be a multiple of [`LINEAR_PANEL`].
pub fn pack_linear_panels(w: &[f32], k: usize, n: usize) -> Result<(Vec<f32>, [i64; 3])> {
    check_linear_weight("pack_linear_panels", w, k, n)?;
    Ok((cpu_kernels::pack_panels(w, k, n), panel_shape(k, n)))
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

/// Whether this process computes linear layers with bf16 products ([`pack_linear_panels_bf16`]):
/// where the CPU kernels are the AVX-512 BF16 set ([`kernel_set`]) and either its vector bf16
/// products are faster than its f32 ones (`vector_bf16`) or it multiplies on AMX tiles
/// ([`amx_bf16_tiles`]). Decided at run time, whatever the build's target features.
pub fn linear_bf16() -> bool {
    kernel_set().has_bf16_products() && (cpu_kernels::bf16_products_pay() || amx_bf16_tiles())
}

/// Whether the vector kernels (attention, convolutions, and linear layers without AMX) gain
/// by multiplying in bf16 on this CPU ([`cpu_kernels::bf16_products_pay`]): on AMD's
/// AVX512_BF16, not on Intel's.
pub(crate) fn vector_bf16() -> bool {
    kernel_set().has_bf16_products() && cpu_kernels::bf16_products_pay()
}

/// Whether bf16 products run on AMX tiles (Intel Xeons since Sapphire Rapids): an f16
/// file's linear layers, attention and the convolutions whose channels fill the tiles;
/// `DA3_AMX=off` keeps the vector kernels.
pub fn amx_bf16_tiles() -> bool {
    kernel_set().has_bf16_products() && cpu_kernels::amx_bf16_tiles()
}

/// The CPU kernel set of this process (see [`KernelSet`]).
pub fn kernel_set() -> KernelSet {
    cpu_kernels::kernel_set()
}

/// Bits of the activations in the int8 products of quantised files ([`linear_q8`]): 8, as
/// ggml quantises them, or 7 in the AVX2 set without VNNI, where that makes the products
/// 1.3-1.45x faster (`DA3_INT8_ACTIVATION_BITS=8` keeps 8 there).
pub fn int8_activation_bits() -> u32 {
    cpu_kernels::int8_activation_bits()
}

/// As [`pack_linear_panels`], rounding the weight to bf16 and storing pairs of consecutive
/// inputs as one i32 word: ggml shape [[`LINEAR_PANEL`], k / 2, n / [`LINEAR_PANEL`]], `k` even. The
/// product then rounds the layer's input to bf16 as well and accumulates in f32: about 2^-9
/// relative error per product, for twice the speed of f32 where [`linear_bf16`] holds.
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
    Ok((cpu_kernels::pack_panels_bf16(w, k, n), shape))
}

/// As [`pack_linear_panels`], storing the weight as f16 (ggml shape and layout the same,
/// dtype F16): half the memory of f32 panels for the products of CPUs without bf16 ones,
/// which widen each weight to f32 as they load it (F16C). Exact for a weight read from an f16
/// file; the products themselves stay in f32.
pub fn pack_linear_panels_f16(w: &[f32], k: usize, n: usize) -> Result<(Vec<half::f16>, [i64; 3])> {
    check_linear_weight("pack_linear_panels_f16", w, k, n)?;
    let packed = cpu_kernels::pack_panels(w, k, n);
    let halves = packed.into_iter().map(half::f16::from_f32).collect();
    Ok((halves, panel_shape(k, n)))
}

/// Bytes per (panel, block of 32 inputs) of a weight packed by [`pack_linear_panels_q8`]:
/// the packed tensor's first dimension.
pub const LINEAR_Q8_RECORD: usize = cpu_kernels::Q8_RECORD * 4;

/// Whether this process computes the linear layers of q8_0 weights with int8 products
/// ([`pack_linear_panels_q8`]): where the CPU kernels are a vector set ([`kernel_set`]);
/// `DA3_Q8_PRODUCTS=off` keeps ggml's quantised product (to compare the two). Decided on
/// first use, then fixed, as the kernel set is.
pub fn linear_q8() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        kernel_set().beats_ggml() && std::env::var("DA3_Q8_PRODUCTS").as_deref() != Ok("off")
    })
}

/// Packs a q8_0 weight (`n` rows of `k` values in ggml's q8_0 blocks, as a file stores it)
/// for int8 products in [`Context::linear_panels`]: ggml shape
/// [[`LINEAR_Q8_RECORD`], k / 32, n / [`LINEAR_PANEL`]] of i8, the same values
/// and scales in another order. The product quantises each 32 inputs of the layer's input
/// to 8 bits with a scale, as ggml's q8_0 product does, and sums them exactly in integers.
pub fn pack_linear_panels_q8(q8: &[u8], k: usize, n: usize) -> Result<(Vec<u8>, [i64; 3])> {
    let op = "pack_linear_panels_q8";
    let block = cpu_kernels::Q8_BLOCK;
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
    let words = cpu_kernels::pack_panels_q8(q8, k, n);
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
    /// Only in contexts marked with [`Context::use_cpu_kernels`]: no other backend runs it.
    pub fn linear_panels(
        &self,
        panels: &Tensor,
        x: &Tensor,
        bias: &Tensor,
        gelu: bool,
    ) -> Result<Tensor> {
        let ne = self.check_linear_panels(panels, x, bias)?;
        let kernel = if gelu { &LINEAR_GELU } else { &LINEAR };
        self.cpu_op("linear_panels", kernel, &[panels, x, bias], ne)
    }

    /// The result shape [N, T] of a packed linear layer, or why it cannot be computed.
    fn check_linear_panels(&self, panels: &Tensor, x: &Tensor, bias: &Tensor) -> Result<[i64; 4]> {
        let op = "linear_panels";
        let (pn, xn) = (panels.ne(), x.ne());
        let invalid = |reason: String| Error::InvalidArgument { op, reason };
        if !self.cpu_kernels() {
            return Err(invalid(
                "packed weights are only computed by the CPU kernels; this context is not marked for them".into(),
            ));
        }
        // Inputs per output: one per row of a panel in f32, two per word in bf16, 32 per
        // record of int8 products.
        let (inputs, row_len) = match panels.dtype() {
            DType::F32 | DType::F16 => (pn[1], LINEAR_PANEL),
            DType::I32 => (2 * pn[1], LINEAR_PANEL),
            DType::I8 => (cpu_kernels::Q8_BLOCK as i64 * pn[1], LINEAR_Q8_RECORD),
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
            &LINEAR_SCALED_RESIDUAL,
            &[panels, x, bias, scale, residual],
            ne,
        )
    }

    /// LayerNorm over `ne[0]` with weight and bias in one pass (ggml: norm, mul, add). Rows
    /// may be strided (the per-head norms of a fused QKV projection).
    pub(super) fn cpu_layer_norm(
        &self,
        a: &Tensor,
        weight: &Tensor,
        bias: &Tensor,
        eps: f32,
    ) -> Result<Tensor> {
        self.cpu_op(
            "layer_norm",
            layer_norm_kernel(eps),
            &[a, weight, bias],
            a.ne(),
        )
    }

    /// A custom op computing an f32 tensor of shape `ne` from `srcs` with `kernel`.
    fn cpu_op(
        &self,
        op: &'static str,
        kernel: &'static Kernel,
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
        let userdata = kernel as *const Kernel as *mut c_void;
        // SAFETY: fewer than GGML_MAX_SRC operands (ggml_custom_4d's assertion), positive dims
        // (the callers' shapes come from live tensors); the kernel is 'static, so it outlives
        // every graph holding the node.
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
    pub(super) fn cpu_concat_rows_applies(a: &Tensor, b: &Tensor) -> bool {
        let matrix = |t: &Tensor| {
            t.dtype() == DType::F32 && t.nb()[0] == 4 && t.ne()[2] == 1 && t.ne()[3] == 1
        };
        matrix(a) && matrix(b)
    }

    /// Rows of `a` followed by the rows of `b` (concat along dim 0) as row copies; ggml's
    /// kernel computes an index per value.
    pub(super) fn cpu_concat_rows(&self, a: &Tensor, b: &Tensor, ne: [i64; 4]) -> Result<Tensor> {
        self.cpu_op("concat", &CONCAT_ROWS, &[a, b], ne)
    }

    /// Whether [`Context::cpu_transpose`] makes `a` contiguous: the transpose of a contiguous
    /// f32 matrix.
    pub(super) fn cpu_transpose_applies(a: &Tensor) -> bool {
        let [n0, n1, n2, n3] = a.ne();
        a.dtype() == DType::F32
            && n2 == 1
            && n3 == 1
            && a.nb()[1] == 4
            && a.nb()[0] == 4 * n1 as usize
            && n0 > 1
    }

    /// A contiguous copy of a transposed matrix, by cache-sized tiles; ggml's copy walks the
    /// source with a stride per value.
    pub(super) fn cpu_transpose(&self, a: &Tensor) -> Result<Tensor> {
        self.cpu_op("cont", &TRANSPOSE, &[a], a.ne())
    }

    /// GELU (erf form) vectorised; ggml's CPU kernel calls the scalar `erff` per value.
    pub(super) fn cpu_gelu_erf(&self, a: &Tensor) -> Result<Tensor> {
        self.cpu_op("gelu_erf", &GELU_ERF, &[a], a.ne())
    }

    /// Attention as [`Context::attention`] computes it, with the usual scale `1 / sqrt(D)`:
    /// per head, the scores of a tile of queries against every key, an exact softmax and the
    /// weighted sum of the values, with the keys of a head transposed once per thread (ggml's
    /// fused kernel transposes them again for every tile of queries).
    /// Only for the cases [`Context::cpu_attention_applies`] accepts.
    pub(super) fn cpu_attention(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        let (qn, vn) = (q.ne(), v.ne());
        let kernel = if self.int8_attention() && Self::int8_attention_applies(q, v) {
            &ATTENTION_INT8
        } else if self.bf16_attention() {
            &ATTENTION_BF16
        } else {
            &ATTENTION
        };
        self.cpu_op(
            "attention",
            kernel,
            &[q, k, v],
            [vn[0], qn[2], qn[1], qn[3]],
        )
    }

    /// Whether int8 attention takes these heads: queries (so keys) and values of whole
    /// blocks of 32 values, the blocks its products quantise.
    fn int8_attention_applies(q: &Tensor, v: &Tensor) -> bool {
        let whole_blocks = |t: &Tensor| (t.ne()[0] as usize).is_multiple_of(cpu_kernels::Q8_BLOCK);
        whole_blocks(q) && whole_blocks(v)
    }

    /// Whether [`Context::cpu_attention`] computes this attention: f32 heads of matching
    /// sizes (a batch of attentions along `ne[3]`, the same for Q, K and V), value rows a
    /// whole number of vectors, the usual scale.
    pub(super) fn cpu_attention_applies(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32) -> bool {
        let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
        let shapes_agree = kn[0] == qn[0] && vn[1] == kn[1] && qn[2] == kn[2] && vn[2] == kn[2];
        let one_batch = kn[3] == qn[3] && vn[3] == qn[3];
        let f32_rows = [q, k, v]
            .iter()
            .all(|t| t.dtype() == DType::F32 && t.nb()[0] == 4);
        shapes_agree
            && one_batch
            && f32_rows
            && (vn[0] as usize).is_multiple_of(cpu_kernels::ATTENTION_DV_MULTIPLE)
            && scale == 1.0 / (qn[0] as f32).sqrt()
    }

    /// Bilinear resampling with aligned corners of the planes of `a` to `w` x `h` (a copy at
    /// its own size), as ggml's kernel computes it but with the per-column coordinates worked
    /// out once, not per value; plus the separable `offset` (along x, along y) when given, in
    /// the same pass. The offset's shapes are the caller's to check
    /// ([`Context::interpolate_add_separable`]).
    pub(super) fn cpu_bilinear_align_corners(
        &self,
        a: &Tensor,
        w: i64,
        h: i64,
        offset: Option<(&Tensor, &Tensor)>,
    ) -> Result<Tensor> {
        let ne = a.ne();
        let ne = [w, h, ne[2], ne[3]];
        match offset {
            Some((x, y)) => self.cpu_op("interpolate_add", &BILINEAR_ALIGNED, &[a, x, y], ne),
            None => self.cpu_op("interpolate", &BILINEAR_ALIGNED, &[a], ne),
        }
    }

    /// A transposed convolution whose kernel [s, s, OC, IC] is its stride, plus `bias`
    /// [OC], where a CPU kernel computes it (s = 2 or 4, f32 contiguous operands); None
    /// elsewhere.
    pub(super) fn cpu_conv_transpose_2d_bias(
        &self,
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
        if !(self.cpu_kernels()
            && kn[0] == s
            && kn[1] == s
            && kn[3] == inp[2]
            && bias.nelements() == kn[2]
            && [kernel, input, bias].into_iter().all(f32_contiguous))
        {
            return Ok(None);
        }
        let ne = [inp[0] * s, inp[1] * s, kn[2], inp[3]];
        self.cpu_op("conv_transpose", op, &[kernel, input, bias], ne)
            .map(Some)
    }

    /// Whether [`Context::cpu_conv_2d_same`] computes this convolution.
    pub(super) fn cpu_conv_2d_applies(
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
    /// tiles). Only for the cases [`Context::cpu_conv_2d_applies`] accepts, with a bias of
    /// OC f32 values.
    pub(super) fn cpu_conv_2d_same(
        &self,
        kernel: &Tensor,
        input: &Tensor,
        bias: Option<&Tensor>,
        relu_input: bool,
    ) -> Result<Tensor> {
        let (kn, inp) = (kernel.ne(), input.ne());
        let kernel_tensor = kernel;
        let on_tiles = || {
            let shape = kn.map(|n| n as usize);
            super::amx_bf16_tiles() && cpu_kernels::amx_convolution_fits(shape)
        };
        // Winograd's F(4x4, 3x3), shared by rows, where it pays: in f32 also where products
        // may be bf16 (f16 and bf16 files) but not on AMX tiles, since a quarter of the
        // products in f32 beat vector bf16 products (AVX512_BF16, Zen 4, 2 threads: 504x336
        // 64 -> 32 channels 12.6 ms against 21.7). The direct kernel, by output channels,
        // elsewhere.
        let winograd = kn[..2] == [3, 3]
            && cpu_kernels::winograd_convolutions()
            && cpu_kernels::winograd_pays(inp[0] as usize, inp[1] as usize);
        let tiles = on_tiles();
        let bf16 = self.bf16_convolutions(tiles) && (tiles || !winograd);
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
        self.cpu_op(op, kernel, &srcs, [inp[0], inp[1], kn[3], inp[3]])
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! Each CPU kernel against ggml's own op on the same data.
    use crate::ggml::{
        Backend, Context, DType, Gallocr, Interpolation, Result, Tensor, TensorView,
    };

    /// Deterministic values in [-2, 2) (also the kernels' own tests' operands).
    pub(in crate::ggml) fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state as f32 / u32::MAX as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Builds `op` over inputs of shapes `shapes` (filled with `values`) in a context with and
    /// without CPU kernels, computes both on the CPU and returns the largest difference.
    fn max_difference(
        shapes: &[&[i64]],
        op: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
    ) -> f32 {
        max_difference_between(shapes, op, |ctx, cpu_kernels| {
            ctx.use_cpu_kernels(cpu_kernels)
        })
    }

    /// As [`max_difference`], between contexts set up by `setup(ctx, false)` and
    /// `setup(ctx, true)`.
    fn max_difference_between(
        shapes: &[&[i64]],
        op: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
        setup: impl Fn(&Context, bool),
    ) -> f32 {
        let backend = Backend::cpu(2).unwrap();
        let [a, b] = [false, true].map(|variant| {
            let (result, _) = compute_with(&backend, shapes, &op, |ctx| setup(ctx, variant));
            result
        });
        max_abs_difference(&a, &b)
    }

    /// `op` on inputs of `shapes` (deterministic values) in a context set up by `setup`,
    /// computed on `backend`: the result and the name of its node.
    fn compute_with(
        backend: &Backend,
        shapes: &[&[i64]],
        op: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
        setup: impl Fn(&Context),
    ) -> (Vec<f32>, String) {
        let ctx = Context::metadata(64).unwrap();
        setup(&ctx);
        let inputs: Vec<Tensor> = shapes
            .iter()
            .map(|ne| ctx.new_tensor(DType::F32, ne).unwrap())
            .collect();
        inputs.iter().for_each(|t| _ = t.mark_input());
        let out = op(&ctx, &inputs).unwrap();
        out.mark_output();
        let graph = ctx.new_graph(64).unwrap();
        graph.expand(&out).unwrap();
        let mut gallocr = Gallocr::for_backend(backend).unwrap();
        let run = gallocr.alloc(&graph).unwrap();
        for (i, t) in inputs.iter().enumerate() {
            run.write(t, &values(t.nelements() as usize, i as u32))
                .unwrap();
        }
        run.compute(backend).unwrap();
        (run.read::<f32>(&out).unwrap(), out.name())
    }

    /// The three epilogues of a packed product against ggml's ops on the plain weight.
    #[derive(Clone, Copy, Debug)]
    enum Epilogue {
        Bias,
        Gelu,
        ScaledResidual,
    }

    /// A weight as a tensor's type and bytes.
    struct Weight<'a> {
        dtype: DType,
        ne: [i64; 3],
        bytes: &'a [u8],
    }

    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// `x W^T + b` for `t` rows, then `epilogue`: ggml's ops on the plain weight (`plain`, of
    /// ggml shape [k, n]) and the packed kernel on `packed`, the operands from `seed`;
    /// returns (ggml's result, the kernel's).
    fn packed_against_ggml(
        plain: Weight<'_>,
        packed: Weight<'_>,
        (k, n, t): (i64, i64, i64),
        epilogue: Epilogue,
        seed: u32,
    ) -> (Vec<f32>, Vec<f32>) {
        let backend = Backend::cpu(2).unwrap();
        let ctx = Context::metadata(16).unwrap();
        ctx.use_cpu_kernels(true);
        let plain_t = ctx.new_tensor(plain.dtype, &plain.ne).unwrap();
        let panels = ctx.new_tensor(packed.dtype, &packed.ne).unwrap();
        let bias = ctx.new_tensor(DType::F32, &[n]).unwrap();
        let x = ctx.new_tensor(DType::F32, &[k, t]).unwrap();
        let scale = ctx.new_tensor(DType::F32, &[n]).unwrap();
        let residual = ctx.new_tensor(DType::F32, &[n, t]).unwrap();
        for input in [&plain_t, &panels, &bias, &x, &scale, &residual] {
            input.mark_input();
        }
        let product = ctx.add(&ctx.mul_mat(&plain_t, &x).unwrap(), &bias).unwrap();
        let (reference, packed_out) = match epilogue {
            Epilogue::Bias => (product, ctx.linear_panels(&panels, &x, &bias, false)),
            Epilogue::Gelu => {
                // ggml's own GELU: the context's CPU kernel is tested on its own.
                ctx.use_cpu_kernels(false);
                let g = ctx.gelu_erf(&product).unwrap();
                ctx.use_cpu_kernels(true);
                (g, ctx.linear_panels(&panels, &x, &bias, true))
            }
            Epilogue::ScaledResidual => (
                ctx.add(&residual, &ctx.mul(&product, &scale).unwrap())
                    .unwrap(),
                ctx.linear_panels_residual(&panels, &x, &bias, &scale, &residual),
            ),
        };
        let packed_out = packed_out.unwrap();
        let graph = ctx.new_graph(16).unwrap();
        for out in [&reference, &packed_out] {
            out.mark_output();
            graph.expand(out).unwrap();
        }
        let mut gallocr = Gallocr::for_backend(&backend).unwrap();
        let run = gallocr.alloc(&graph).unwrap();
        crate::ggml::buffer::write_tensor_bytes(&plain_t, plain.bytes).unwrap();
        crate::ggml::buffer::write_tensor_bytes(&panels, packed.bytes).unwrap();
        for (i, input) in [&bias, &x, &scale, &residual].into_iter().enumerate() {
            if graph.contains(input) {
                run.write(input, &values(input.nelements() as usize, seed + i as u32))
                    .unwrap();
            }
        }
        run.compute(&backend).unwrap();
        (
            run.read::<f32>(&reference).unwrap(),
            run.read::<f32>(&packed_out).unwrap(),
        )
    }

    /// `x W^T + b`, then GELU or a layer-scaled residual, with a packed weight against
    /// ggml's product of the plain one.
    #[test]
    fn packed_linear_matches_ggml_product() {
        let p = super::LINEAR_PANEL as i64;
        // Row counts below, at and past the register tile; odd depths; one to three panels.
        for (k, n, t, epilogue) in [
            (7, p, 1, Epilogue::Bias),
            (33, 3 * p, 29, Epilogue::Gelu),
            (130, p, 13, Epilogue::Bias),
            (19, 2 * p, 17, Epilogue::ScaledResidual),
        ] {
            let w = values((k * n) as usize, 1);
            let (packed, shape) = super::pack_linear_panels(&w, k as usize, n as usize).unwrap();
            let (a, b) = packed_against_ggml(
                Weight {
                    dtype: DType::F32,
                    ne: [k, n, 1],
                    bytes: &f32_bytes(&w),
                },
                Weight {
                    dtype: DType::F32,
                    ne: shape,
                    bytes: &f32_bytes(&packed),
                },
                (k, n, t),
                epilogue,
                2,
            );
            let diff = max_abs_difference(&a, &b);
            assert!(diff < 1e-4, "k {k}, n {n}, t {t}, {epilogue:?}: {diff}");
        }
    }

    /// The largest absolute difference between two results of the same length (also the
    /// kernels' own tests' measure).
    pub(in crate::ggml) fn max_abs_difference(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    }

    /// int8 products of a q8_0 weight against ggml's own q8_0 product (which quantises the
    /// input the same way): rows below, at and past the register tile and a row block,
    /// one to three panels, each epilogue.
    #[test]
    fn packed_q8_linear_matches_ggml_q8_0_product() {
        let p = super::LINEAR_PANEL as i64;
        for (k, n, t, epilogue) in [
            (32, p, 1, Epilogue::Bias),
            (96, 3 * p, 7, Epilogue::Gelu),
            (160, p, 29, Epilogue::ScaledResidual),
            (64, 2 * p, 203, Epilogue::Bias),
        ] {
            let w = values((k * n) as usize, 11);
            let q8 = crate::ggml::quantize(DType::Q8_0, &w, k as usize).unwrap();
            let (packed, shape) =
                super::pack_linear_panels_q8(&q8, k as usize, n as usize).unwrap();
            let (a, b) = packed_against_ggml(
                Weight {
                    dtype: DType::Q8_0,
                    ne: [k, n, 1],
                    bytes: &q8,
                },
                Weight {
                    dtype: DType::I8,
                    ne: shape,
                    bytes: &packed,
                },
                (k, n, t),
                epilogue,
                12,
            );
            let largest = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let diff = max_abs_difference(&a, &b);
            assert!(
                largest > 1.0 && diff < 1e-5 * largest,
                "k {k}, n {n}, t {t}, {epilogue:?}: {diff} of {largest}"
            );
        }
    }

    /// What does not pack for int8 products is refused, naming why; a packed weight is
    /// refused with an input of another depth or a record that is not the kernel's.
    #[test]
    fn q8_packing_refuses_what_does_not_fit() {
        let p = super::LINEAR_PANEL;
        let q8 = crate::ggml::quantize(DType::Q8_0, &values(64 * p, 1), 64).unwrap();
        for (bytes, k, n, expected) in [
            (&q8[..], 48, p, "32 outputs of 48 inputs"),
            (&q8[..], 64, p + 1, "33 outputs of 64 inputs"),
            (
                &q8[..q8.len() - 1],
                64,
                p,
                "2175 bytes for a 32 x 64 q8_0 weight",
            ),
            (&q8[..], 0, p, "32 outputs of 0 inputs"),
        ] {
            let err = super::pack_linear_panels_q8(bytes, k, n)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{k} x {n}: {err}");
        }
        let (_, shape) = super::pack_linear_panels_q8(&q8, 64, p).unwrap();
        assert_eq!(shape, [super::LINEAR_Q8_RECORD as i64, 2, 1]);
        let ctx = Context::metadata(8).unwrap();
        ctx.use_cpu_kernels(true);
        let panels = ctx.new_tensor(DType::I8, &shape).unwrap();
        let bias = ctx.new_tensor(DType::F32, &[p as i64]).unwrap();
        let x = ctx.new_tensor(DType::F32, &[64, 3]).unwrap();
        assert!(ctx.linear_panels(&panels, &x, &bias, false).is_ok());
        let shallow = ctx.new_tensor(DType::F32, &[32, 3]).unwrap();
        let err = ctx
            .linear_panels(&panels, &shallow, &bias, false)
            .unwrap_err();
        assert!(err.to_string().contains("packed depth"), "{err}");
        let short_record = ctx.new_tensor(DType::I8, &[1024, 2, 1]).unwrap();
        let err = ctx
            .linear_panels(&short_record, &x, &bias, false)
            .unwrap_err();
        assert!(err.to_string().contains("panels"), "{err}");
    }

    /// bf16 products: exact against the same sums over operands rounded to bf16 (f64 on the
    /// host).
    #[test]
    fn packed_bf16_linear_matches_bf16_rounded_sums() {
        let backend = Backend::cpu(2).unwrap();
        let round = |v: f32| half::bf16::from_f32(v).to_f32() as f64;
        for (k, n, t) in [
            (8usize, super::LINEAR_PANEL, 5usize),
            (66, 2 * super::LINEAR_PANEL, 29),
        ] {
            let (w, x, b) = (values(k * n, 5), values(k * t, 6), values(n, 7));
            let (packed, shape) = super::pack_linear_panels_bf16(&w, k, n).unwrap();
            let ctx = Context::metadata(8).unwrap();
            ctx.use_cpu_kernels(true);
            let panels = ctx.new_tensor(DType::I32, &shape).unwrap();
            let bias = ctx.new_tensor(DType::F32, &[n as i64]).unwrap();
            let input = ctx.new_tensor(DType::F32, &[k as i64, t as i64]).unwrap();
            for tensor in [&panels, &bias, &input] {
                tensor.mark_input();
            }
            let y = ctx.linear_panels(&panels, &input, &bias, false).unwrap();
            y.mark_output();
            let graph = ctx.new_graph(8).unwrap();
            graph.expand(&y).unwrap();
            let mut gallocr = Gallocr::for_backend(&backend).unwrap();
            let run = gallocr.alloc(&graph).unwrap();
            run.write(&panels, &packed).unwrap();
            run.write(&bias, &b).unwrap();
            run.write(&input, &x).unwrap();
            run.compute(&backend).unwrap();
            let got = run.read::<f32>(&y).unwrap();
            for (i, &g) in got.iter().enumerate() {
                let (row, col) = (i / n, i % n);
                let want = b[col] as f64
                    + (0..k)
                        .map(|j| round(x[row * k + j]) * round(w[col * k + j]))
                        .sum::<f64>();
                assert!(
                    (g as f64 - want).abs() < 1e-4,
                    "k {k} ({row}, {col}): {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn packed_linear_refuses_what_does_not_fit() {
        let p = super::LINEAR_PANEL;
        assert!(
            super::pack_linear_panels(&[0.0; 10], 2, 5).is_err(),
            "5 outputs"
        );
        assert!(
            super::pack_linear_panels(&vec![0.0; p], 2, p).is_err(),
            "too few values"
        );
        let (_, shape) = super::pack_linear_panels(&vec![0.0; 4 * p], 4, p).unwrap();
        let ctx = Context::metadata(8).unwrap();
        let panels = ctx.new_tensor(DType::F32, &shape).unwrap();
        let bias = ctx.new_tensor(DType::F32, &[p as i64]).unwrap();
        let x = ctx.new_tensor(DType::F32, &[4, 3]).unwrap();
        let err = ctx.linear_panels(&panels, &x, &bias, false).unwrap_err();
        assert!(err.to_string().contains("CPU kernels"), "{err}");
        ctx.use_cpu_kernels(true);
        let wrong_depth = ctx.new_tensor(DType::F32, &[5, 3]).unwrap();
        let err = ctx
            .linear_panels(&panels, &wrong_depth, &bias, false)
            .unwrap_err();
        assert!(err.to_string().contains("shapes do not fit"), "{err}");
        let plain = ctx.new_tensor(DType::F32, &[4, p as i64]).unwrap();
        let err = ctx.linear_panels(&plain, &x, &bias, false).unwrap_err();
        assert!(err.to_string().contains("panels"), "{err}");
        // The residual must have the result's shape, the scale one value per output.
        let short_residual = ctx.new_tensor(DType::F32, &[p as i64, 2]).unwrap();
        let err = ctx
            .linear_panels_residual(&panels, &x, &bias, &bias, &short_residual)
            .unwrap_err();
        assert!(err.to_string().contains("residual"), "{err}");
        // A bf16 packing of depth 4 holds 2 words per row: x must still have 4 inputs, and
        // odd depths are refused when packing.
        assert!(super::pack_linear_panels_bf16(&vec![0.0; 3 * p], 3, p).is_err());
        let (_, bf16_shape) = super::pack_linear_panels_bf16(&vec![0.0; 4 * p], 4, p).unwrap();
        assert_eq!(bf16_shape[1], 2);
        let bf16_panels = ctx.new_tensor(DType::I32, &bf16_shape).unwrap();
        assert!(ctx.linear_panels(&bf16_panels, &x, &bias, false).is_ok());
        for depth in [3, 5] {
            let x = ctx.new_tensor(DType::F32, &[depth, 3]).unwrap();
            let err = ctx
                .linear_panels(&bf16_panels, &x, &bias, false)
                .unwrap_err();
            assert!(err.to_string().contains("packed depth"), "{depth}: {err}");
        }
        // An f16 packing: as f32 panels (outputs in whole panels, one row per input).
        assert!(super::pack_linear_panels_f16(&vec![0.0; 4 * (p + 1)], 4, p + 1).is_err());
        assert!(super::pack_linear_panels_f16(&vec![0.0; 4 * p - 1], 4, p).is_err());
        let (halves, f16_shape) = super::pack_linear_panels_f16(&vec![0.0; 4 * p], 4, p).unwrap();
        assert_eq!((halves.len(), f16_shape), (4 * p, [p as i64, 4, 1]));
        let f16_panels = ctx.new_tensor(DType::F16, &f16_shape).unwrap();
        assert!(ctx.linear_panels(&f16_panels, &x, &bias, false).is_ok());
        let deeper = ctx.new_tensor(DType::F32, &[8, 3]).unwrap();
        let err = ctx
            .linear_panels(&f16_panels, &deeper, &bias, false)
            .unwrap_err();
        assert!(err.to_string().contains("packed depth"), "{err}");
    }

    #[test]
    fn layer_norm_matches_ggml() {
        let diff = max_difference(&[&[100, 7, 3], &[100], &[100]], |g, t| {
            g.layer_norm(&t[0], &t[1], &t[2], 1e-5)
        });
        assert!(diff < 1e-5, "contiguous rows: {diff}");
        // Per-head rows of a fused projection: 3 heads of 16 values in rows of 64.
        let diff = max_difference(&[&[64, 5], &[16], &[16]], |g, t| {
            let heads = g.view(&t[0], &[16, 3, 5], &[64, t[0].nb()[1]], 64)?;
            g.layer_norm(&heads, &t[1], &t[2], 1e-6)
        });
        assert!(diff < 1e-5, "strided rows: {diff}");
    }

    #[test]
    fn row_concat_and_transpose_match_ggml() {
        let diff = max_difference(&[&[5, 7], &[3, 7]], |g, t| g.concat(&t[0], &t[1], 0));
        assert_eq!(diff, 0.0, "concat");
        for ne in [[37i64, 6], [16, 16], [2, 41]] {
            let diff = max_difference(&[&ne], |g, t| g.cont(&g.transpose(&t[0])?));
            assert_eq!(diff, 0.0, "transpose of {ne:?}");
        }
    }

    #[test]
    fn gelu_erf_matches_ggml() {
        let diff = max_difference(&[&[100, 37]], |g, t| g.gelu_erf(&t[0]));
        assert!(diff < 2e-6, "{diff}");
    }

    #[test]
    fn same_convolutions_match_im2col() {
        // Widths below, at and past a block of 48 pixels; channel counts that leave partial
        // groups of 4; 1x1, 3x3 and 5x3 kernels.
        for (w, h, ic, oc, kw, kh) in [
            (5, 4, 3, 1, 3, 3),
            (48, 3, 2, 7, 3, 3),
            (70, 9, 5, 6, 1, 1),
            (33, 6, 4, 9, 5, 3),
        ] {
            let padding = (kw as i32 / 2, kh as i32 / 2);
            let shapes: [&[i64]; 3] = [&[kw, kh, ic, oc], &[w, h, ic, 1], &[oc]];
            let diff = max_difference(&shapes, |g, t| {
                g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), padding, (1, 1))
            });
            assert!(diff < 1e-4, "{w}x{h}x{ic} -> {oc}, {kw}x{kh}: {diff}");
        }
    }

    /// Maps large enough for Winograd run it shared among threads by bands of tile rows: on
    /// any thread count (more threads than tile rows, bands that end inside a tile row at
    /// the map's foot, a batch of two images) the result equals ggml's im2col convolution
    /// and is the same, value for value, as on one thread. (On an AVX-512 CPU the 128-wide
    /// map runs the AVX-512 instance, the 144-wide one the AVX2 instance, whose rows of
    /// tiles pad less.)
    #[test]
    fn winograd_convolutions_match_im2col_on_any_thread_count() {
        assert!(
            super::cpu_kernels::winograd_convolutions(),
            "DA3_WINOGRAD=off in the environment"
        );
        for (w, h, ic, oc, batch) in [(128, 41, 3, 10, 1), (144, 37, 16, 24, 2)] {
            let shapes: [&[i64]; 3] = [&[3, 3, ic, oc], &[w, h, ic, batch], &[oc]];
            let conv = |g: &Context, t: &[Tensor]| {
                g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), (1, 1), (1, 1))
            };
            let one = Backend::cpu(1).unwrap();
            let (reference, _) = compute_with(&one, &shapes, conv, |_| ());
            let (single, name) = compute_with(&one, &shapes, conv, |g| g.use_cpu_kernels(true));
            assert_eq!(name, "conv_2d_winograd", "{w}x{h}");
            let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let diff = max_abs_difference(&reference, &single) / largest;
            assert!(diff < 1e-5, "{w}x{h}x{ic}x{batch} -> {oc}: {diff}");
            for threads in [2, 3, 16] {
                let backend = Backend::cpu(threads).unwrap();
                let (shared, _) =
                    compute_with(&backend, &shapes, conv, |g| g.use_cpu_kernels(true));
                assert!(
                    shared == single,
                    "{w}x{h}x{ic}x{batch} -> {oc}, {threads} threads"
                );
            }
        }
        // Below Winograd's size, the direct kernel.
        let shapes: [&[i64]; 3] = [&[3, 3, 4, 4], &[20, 12, 4, 1], &[4]];
        let (_, name) = compute_with(
            &Backend::cpu(2).unwrap(),
            &shapes,
            |g, t| g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), (1, 1), (1, 1)),
            |g| g.use_cpu_kernels(true),
        );
        assert_eq!(name, "conv_2d");
    }

    /// The direct kernel shared among threads by rows (small kernels) equals ggml's im2col
    /// convolution on any thread count, value for value the same as on one thread: 3x3 and
    /// 1x1 kernels, the 1x1 reading planes in place (630 pixels) and through the band (1024
    /// pixels, planes 4 KB apart), a batch of two, more threads than rows.
    #[test]
    fn direct_convolutions_by_rows_match_im2col_on_any_thread_count() {
        for (w, h, ic, oc, k, batch) in [
            (20, 12, 4, 6, 3, 1),
            (70, 9, 5, 11, 1, 2),
            (64, 16, 3, 5, 1, 1),
            (33, 5, 9, 2, 1, 1),
        ] {
            let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, batch], &[oc]];
            let pad = (k / 2) as i32;
            let conv = |g: &Context, t: &[Tensor]| {
                g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), (pad, pad), (1, 1))
            };
            let one = Backend::cpu(1).unwrap();
            let (reference, _) = compute_with(&one, &shapes, conv, |_| ());
            let (single, _) = compute_with(&one, &shapes, conv, |g| g.use_cpu_kernels(true));
            let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let what = format!("{w}x{h}x{ic}x{batch} -> {oc}, {k}x{k}");
            let diff = max_abs_difference(&reference, &single) / largest;
            assert!(diff < 1e-5, "{what}: {diff}");
            // With bf16 products too (vector ones, where they pay; f32 elsewhere).
            let bf16 = |g: &Context| {
                g.use_cpu_kernels(true);
                g.use_bf16_products(true);
            };
            let (single_bf16, _) = compute_with(&one, &shapes, conv, bf16);
            for threads in [2, 3, 16] {
                let backend = Backend::cpu(threads).unwrap();
                let (shared, _) =
                    compute_with(&backend, &shapes, conv, |g| g.use_cpu_kernels(true));
                assert!(shared == single, "{what}, {threads} threads");
                let (shared, _) = compute_with(&backend, &shapes, conv, bf16);
                assert!(shared == single_bf16, "{what}, bf16, {threads} threads");
            }
        }
    }

    /// A convolution of the input through ReLU, applied as the kernel reads it, equals a
    /// ReLU node then the same kernel, value for value: direct 3x3 and 1x1 kernels, Winograd
    /// (in both instances' widths on AVX-512, a batch), with and without a bias, with bf16
    /// products where they apply; and it is one node, not two.
    #[test]
    fn convolutions_of_relu_equal_a_relu_node_then_the_convolution() {
        let backend = Backend::cpu(2).unwrap();
        for (w, h, ic, oc, k, batch) in [
            (20, 12, 4, 6, 3, 1),
            (70, 9, 5, 2, 1, 1),
            (128, 41, 3, 10, 3, 1),
            (144, 37, 16, 24, 3, 2),
        ] {
            let all: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, batch], &[oc]];
            let pad = (k / 2) as i32;
            for (bf16, with_bias) in [(false, true), (false, false), (true, true)] {
                let shapes = &all[..if with_bias { 3 } else { 2 }];
                let bias = |t: &[Tensor]| with_bias.then(|| t[2].clone());
                let fused = |g: &Context, t: &[Tensor]| {
                    let y = g.conv_2d_of_relu(
                        &t[0],
                        &t[1],
                        bias(t).as_ref(),
                        (1, 1),
                        (pad, pad),
                        (1, 1),
                    )?;
                    // One node: the convolution reads the input tensor itself.
                    assert!(y.name().starts_with("conv_2d"), "{}", y.name());
                    assert!(
                        y.sources().iter().any(|s| s.raw() == t[1].raw()),
                        "the convolution reads a node made from the input"
                    );
                    Ok(y)
                };
                let unfused = |g: &Context, t: &[Tensor]| {
                    let x = g.relu(&t[1])?;
                    match bias(t) {
                        Some(b) => g.conv_2d_bias(&t[0], &x, &b, (1, 1), (pad, pad), (1, 1)),
                        None => g.conv_2d(&t[0], &x, (1, 1), (pad, pad), (1, 1)),
                    }
                };
                let setup = |g: &Context| {
                    g.use_cpu_kernels(true);
                    g.use_bf16_products(bf16);
                };
                let (a, _) = compute_with(&backend, shapes, fused, setup);
                let (b, _) = compute_with(&backend, shapes, unfused, setup);
                let what =
                    format!("{w}x{h}x{ic}x{batch} -> {oc}, {k}x{k}, bf16 {bf16}, bias {with_bias}");
                assert!(a == b, "{what}");
                // And against ggml's own ops (im2col), within f32 rounding.
                let (reference, _) = compute_with(&backend, shapes, unfused, |_| ());
                let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let bound = if bf16 && super::vector_bf16() {
                    2e-2
                } else {
                    1e-5
                };
                let diff = max_abs_difference(&reference, &a) / largest;
                assert!(diff < bound, "{what}: {diff}");
            }
        }
    }

    /// The transposed convolution of disjoint patches (kernel = stride, 2 and 4) with its
    /// bias as one CPU node equals ggml's route (copies, a product, permutes, a bias add):
    /// widths past a span (50), partial groups of virtual channels (5 x 2 x 2 = 20), a batch,
    /// on 1, 2, 3 and 16 threads; a stride of 3 keeps ggml's route.
    #[test]
    fn disjoint_transposed_convolutions_match_ggml() {
        for (w, h, ic, oc, s, batch) in [
            (36, 24, 48, 48, 4, 1),
            (7, 5, 3, 5, 2, 2),
            (50, 3, 2, 3, 4, 1),
            (9, 4, 4, 2, 3, 1),
        ] {
            let shapes: [&[i64]; 3] = [&[s, s, oc, ic], &[w, h, ic, batch], &[oc]];
            let deconv =
                |g: &Context, t: &[Tensor]| g.conv_transpose_2d_bias(&t[0], &t[1], &t[2], s as i32);
            let one = Backend::cpu(1).unwrap();
            let (reference, _) = compute_with(&one, &shapes, deconv, |_| ());
            let what = format!("{w}x{h}x{ic}x{batch} -> {oc}, stride {s}");
            for threads in [1, 2, 3, 16] {
                let backend = Backend::cpu(threads).unwrap();
                let (ours, name) =
                    compute_with(&backend, &shapes, deconv, |g| g.use_cpu_kernels(true));
                assert_eq!(name == "conv_transpose", s != 3, "{what}: {name}");
                let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                let diff = max_abs_difference(&reference, &ours) / largest;
                assert!(diff < 1e-5, "{what}, {threads} threads: {diff}");
            }
        }
    }

    /// A batch along `ne[3]` is one node whose kernel takes the items in turn: images of a
    /// batch (with and without a bias), and the backbone's per-view attention of a scene
    /// (`[D, H, T, S]` permuted to `[D, T, H, S]`: strided rows, items `nb[3]` apart).
    #[test]
    fn batched_convolutions_and_attention_match_ggml() {
        for (w, h, ic, oc, k) in [(50, 7, 3, 5, 3), (9, 4, 2, 3, 1)] {
            let padding = (k as i32 / 2, k as i32 / 2);
            let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, 3], &[oc]];
            let diff = max_difference(&shapes, |g, t| {
                g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), padding, (1, 1))
            });
            assert!(diff < 1e-4, "{w}x{h}x{ic}x3 -> {oc}, bias: {diff}");
            let diff = max_difference(&shapes[..2], |g, t| {
                g.conv_2d(&t[0], &t[1], (1, 1), padding, (1, 1))
            });
            assert!(diff < 1e-4, "{w}x{h}x{ic}x3 -> {oc}: {diff}");
        }
        let (d, heads, t, views) = (64, 2, 37, 3);
        let shape = [d, heads, t, views];
        let shapes: [&[i64]; 3] = [&shape; 3];
        let diff = max_difference(&shapes, |g, x| {
            let per_head = |a: &Tensor| g.permute(a, [0, 2, 1, 3]);
            g.attention(
                &per_head(&x[0])?,
                &per_head(&x[1])?,
                &per_head(&x[2])?,
                0.125,
            )
        });
        assert!(diff < 1e-5, "{diff}");
    }

    #[test]
    fn attention_matches_explicit_products() {
        // Key counts below, at and past a span of 48 and the f32 kernel's block of 240 keys
        // (one key past a block; three blocks, the last partial, which rescales the running
        // softmax); query counts that leave partial tiles (of 24 and 96) and partial groups;
        // value rows of one vector; shares whose last tile ends in single vectors of queries
        // past a full span (97 and 145 queries over 2 threads: 49 = 48 + 1, 73 = 48 + 25).
        for (d, tq, tk, heads) in [
            (64, 5, 7, 2),
            (64, 30, 48, 3),
            (32, 61, 100, 1),
            (16, 97, 241, 1),
            (64, 100, 500, 2),
            (64, 145, 300, 2),
        ] {
            let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[d, tk, heads]];
            let scale = 1.0 / (d as f32).sqrt();
            let diff = max_difference(&shapes, |g, t| g.attention(&t[0], &t[1], &t[2], scale));
            assert!(diff < 1e-5, "D {d}, {tq} x {tk}, {heads} heads: {diff}");
        }
    }

    /// The largest difference between the CPU kernels without and with bf16 products.
    fn bf16_difference(
        shapes: &[&[i64]],
        op: impl Fn(&Context, &[Tensor]) -> Result<Tensor>,
    ) -> f32 {
        max_difference_between(shapes, op, |ctx, bf16| {
            ctx.use_cpu_kernels(true);
            ctx.use_bf16_products(bf16);
        })
    }

    /// Within `bound` of f32 where the op multiplies in bf16 on this CPU (`applies`);
    /// identical where it does not.
    fn assert_bf16_close(diff: f32, bound: f32, applies: bool, what: &str) {
        if applies {
            assert!(diff > 0.0 && diff < bound, "{what}: {diff}");
        } else {
            assert_eq!(diff, 0.0, "{what}");
        }
    }

    /// Values in [-2, 2): bf16 keeps 8 bits, so each product errs by about 2^-8 of its size.
    #[test]
    fn bf16_attention_stays_close_to_f32() {
        let (d, tq, tk, heads) = (64, 30, 61, 2);
        let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[d, tk, heads]];
        let diff = bf16_difference(&shapes, |g, t| g.attention(&t[0], &t[1], &t[2], 0.125));
        // On AMX tiles, or with vector products where those pay.
        let applies = super::vector_bf16() || super::amx_bf16_tiles();
        assert_bf16_close(diff, 3e-2, applies, "attention");
    }

    /// A context told to use int8 products computes attention in int8: close to f32 but not
    /// equal; heads of 48 values (not whole blocks of 32), in the queries or in the values,
    /// stay in f32; and beside bf16 products int8 wins, except on AMX tiles.
    #[test]
    fn int8_attention_is_chosen_where_it_applies_and_stays_close_to_f32() {
        let int8_difference_of = |d: i64, dv: i64, bf16: bool| {
            let (tq, tk, heads) = (30, 61, 2);
            let shapes: [&[i64]; 3] = [&[d, tq, heads], &[d, tk, heads], &[dv, tk, heads]];
            let scale = 1.0 / (d as f32).sqrt();
            max_difference_between(
                &shapes,
                |g, t| g.attention(&t[0], &t[1], &t[2], scale),
                |ctx, int8| {
                    ctx.use_cpu_kernels(true);
                    ctx.use_bf16_products(bf16);
                    ctx.use_int8_products(int8);
                },
            )
        };
        let int8_difference = |d: i64, bf16: bool| int8_difference_of(d, d, bf16);
        let diff = int8_difference(64, false);
        assert!(diff > 0.0 && diff < 3e-2, "int8 attention: {diff}");
        assert_eq!(int8_difference(48, false), 0.0, "heads of 48");
        assert_eq!(int8_difference_of(64, 48, false), 0.0, "values of 48");
        let beside_bf16 = int8_difference(64, true);
        assert_eq!(
            beside_bf16 == 0.0,
            super::amx_bf16_tiles(),
            "beside bf16: {beside_bf16}"
        );
    }

    /// Odd tap counts leave a half-empty last pair; sums of up to 27 products.
    #[test]
    fn bf16_convolution_stays_close_to_f32() {
        for (w, h, ic, oc, k) in [(50i64, 7i64, 3i64, 5i64, 3i64), (20, 4, 4, 9, 1)] {
            let shapes: [&[i64]; 3] = [&[k, k, ic, oc], &[w, h, ic, 1], &[oc]];
            let pad = (k / 2) as i32;
            let diff = bf16_difference(&shapes, |g, t| {
                g.conv_2d_bias(&t[0], &t[1], &t[2], (1, 1), (pad, pad), (1, 1))
            });
            let what = format!("{w}x{h}x{ic} -> {oc}, {k}x{k}");
            // Vector products where they pay; these channels fit no AMX tiles.
            assert_bf16_close(diff, 0.1, super::vector_bf16(), &what);
        }
    }

    #[test]
    fn bilinear_resize_matches_ggml() {
        for (from, to) in [([7, 5], [13, 9]), ([36, 24], [72, 48]), ([9, 1], [4, 3])] {
            let diff = max_difference(&[&[from[0], from[1], 3, 1]], |g, t| {
                g.interpolate(
                    &t[0],
                    [to[0], to[1], 3, 1],
                    Interpolation::Bilinear {
                        align_corners: true,
                    },
                )
            });
            assert!(diff < 1e-6, "{from:?} -> {to:?}: {diff}");
        }
    }

    /// The fused resize-and-offset kernel against ggml's resampling and two broadcast adds:
    /// a resize, a map of the target's own size (the offset alone), and a batch of two items
    /// sharing one offset.
    #[test]
    fn separable_offset_matches_ggml_adds() {
        let (c, mode) = (
            4,
            Interpolation::Bilinear {
                align_corners: true,
            },
        );
        for (from, to, n) in [
            ([7, 5], [13, 9], 1),
            ([13, 9], [13, 9], 1),
            ([6, 4], [11, 7], 2),
        ] {
            let shapes: [&[i64]; 3] = [
                &[from[0], from[1], c, n],
                &[to[0], 1, c, 1],
                &[1, to[1], c, 1],
            ];
            let diff = max_difference(&shapes, |g, t| {
                g.interpolate_add_separable(&t[0], [to[0], to[1], c, n], mode, &t[1], &t[2])
            });
            assert!(diff < 1e-6, "{from:?} -> {to:?} x {n}: {diff}");
        }
        let shapes: [&[i64]; 3] = [&[5, 3, c, 1], &[5, 1, c, 1], &[1, 3, c, 1]];
        let diff = max_difference(&shapes, |g, t| g.add_separable(&t[0], &t[1], &t[2]));
        assert_eq!(diff, 0.0, "an add on both paths");
    }

    #[test]
    fn separable_offset_checks_its_factors() {
        let ctx = Context::metadata(8).unwrap();
        ctx.use_cpu_kernels(true);
        let map = ctx.new_tensor(DType::F32, &[5, 3, 4, 1]).unwrap();
        let x = ctx.new_tensor(DType::F32, &[5, 1, 4, 1]).unwrap();
        let wrong_y = ctx.new_tensor(DType::F32, &[1, 4, 4, 1]).unwrap();
        let err = ctx
            .add_separable(&map, &x, &wrong_y)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("interpolate_add_separable") && err.contains("[1, 3, 4, 1]"),
            "{err}"
        );
        // The kernel path is one custom node; without the kernels, two of ggml's adds.
        let y = ctx.new_tensor(DType::F32, &[1, 3, 4, 1]).unwrap();
        assert_eq!(
            ctx.add_separable(&map, &x, &y).unwrap().name(),
            "interpolate_add"
        );
        ctx.use_cpu_kernels(false);
        assert_ne!(
            ctx.add_separable(&map, &x, &y).unwrap().name(),
            "interpolate_add"
        );
    }
}
