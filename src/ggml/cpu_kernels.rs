//! Kernels of the CPU custom ops: safe Rust over slices (`cpu_ops.rs` hands them to ggml),
//! except the register tiles that the matrix products, the convolution and attention share
//! (f32 and bf16 in one, int8 in another), written with intrinsics.
//!
//! The kernels (`cpu_kernels/body.rs`) are compiled once per instruction set, AVX-512 with
//! BF16 and VNNI, AVX2 with FMA and AVX-VNNI, AVX2 with FMA, and portable arrays, each inside
//! functions enabling those features
//! (`#[target_feature]`); which one runs is decided once per process from what the CPU has
//! ([`kernel_set`]), not from the features the crate was built with. So a build for the
//! baseline x86-64 target runs the AVX2 or AVX-512 kernels on a CPU that has them.

#[cfg(target_arch = "x86_64")]
mod amx;

use super::cpu_ops::{PlaneRows, Src};
use super::dtype::DType;
use std::ops::Range;
use std::sync::OnceLock;

/// The instruction set the CPU kernels use in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSet {
    /// AVX-512F vectors, bf16 products with `vdpbf16ps` and int8 products with `vpdpbusd`
    /// (AVX512_VNNI; AMD Zen 4, Intel Cooper Lake and Sapphire Rapids).
    Avx512Bf16,
    /// AVX2 vectors with FMA and AVX-VNNI's 256-bit int8 products (Intel Alder Lake and
    /// later without AVX-512, AMD Zen 5).
    Avx2Vnni,
    /// AVX2 vectors with FMA and F16C (x86-64-v3: Intel Haswell, AMD Zen 1 and later).
    Avx2,
    /// Plain arrays the compiler may vectorise: correct, not fast. The ops that have a ggml
    /// equivalent use ggml's instead ([`KernelSet::beats_ggml`]).
    Portable,
}

impl KernelSet {
    /// "avx512bf16", "avx2vnni", "avx2" or "portable" (the values `DA3_CPU_KERNELS` accepts).
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Avx512Bf16 => "avx512bf16",
            KernelSet::Avx2Vnni => "avx2vnni",
            KernelSet::Avx2 => "avx2",
            KernelSet::Portable => "portable",
        }
    }

    /// Whether the kernels of this set are faster than ggml's ops for the same nodes: the
    /// vector ones are; the portable register tile is several times slower than ggml's
    /// vectorised product, so with it every node keeps ggml's op.
    pub fn beats_ggml(self) -> bool {
        self != KernelSet::Portable
    }

    /// Whether this set multiplies bf16 pairs in one instruction (the fast mode of f16 files).
    pub fn has_bf16_products(self) -> bool {
        self == KernelSet::Avx512Bf16
    }

    /// The best set this CPU runs.
    fn detect() -> KernelSet {
        #[cfg(target_arch = "x86_64")]
        {
            // The AVX-512 instance is compiled with AVX2, FMA and F16C too, and a request
            // for a lower set (`DA3_CPU_KERNELS`) runs the AVX2 one: every such CPU has
            // them, but a VM may mask features one by one.
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bf16")
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return KernelSet::Avx512Bf16;
            }
            if avx2_vnni_detected() {
                return KernelSet::Avx2Vnni;
            }
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return KernelSet::Avx2;
            }
        }
        KernelSet::Portable
    }
}

/// Whether the CPU runs the AVX2 set with AVX-VNNI.
#[cfg(target_arch = "x86_64")]
fn avx2_vnni_detected() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
        && is_x86_feature_detected!("avxvnni")
}

/// The kernel set of this process: the best the CPU runs, or a lower one named by the
/// environment variable `DA3_CPU_KERNELS` (`portable`, `avx2`, `avx2vnni`, `avx512bf16`; a set
/// the CPU lacks gives the best one below it). Decided on first use, then fixed.
pub fn kernel_set() -> KernelSet {
    static SET: OnceLock<KernelSet> = OnceLock::new();
    *SET.get_or_init(|| {
        let best = KernelSet::detect();
        // Fastest first: a request can only go down from what the CPU has.
        let order = [
            KernelSet::Avx512Bf16,
            KernelSet::Avx2Vnni,
            KernelSet::Avx2,
            KernelSet::Portable,
        ];
        let rank = |set: KernelSet| order.iter().position(|s| *s == set).unwrap_or(0);
        let requested = std::env::var("DA3_CPU_KERNELS").ok();
        let chosen = match order
            .iter()
            .find(|s| Some(s.name()) == requested.as_deref())
        {
            Some(&set) => order[rank(set).max(rank(best))],
            None => best,
        };
        // Below AVX-512 the order is not a chain: a CPU with AVX-512 may lack AVX-VNNI (AMD
        // Zen 4), so a request for `avx2vnni` there gives `avx2`.
        #[cfg(target_arch = "x86_64")]
        if chosen == KernelSet::Avx2Vnni && !avx2_vnni_detected() {
            return KernelSet::Avx2;
        }
        chosen
    })
}

/// Whether bf16 products beat f32 FMAs on this CPU, where it has both. One `vdpbf16ps` does
/// twice the multiply-adds of an f32 FMA, which pays on AMD Zen 4 (measured: an f16 file
/// 1.66x faster than f32, da3-small, 2 threads). On Intel's AVX512_BF16 Xeons it issues at
/// half the FMA rate (one port instead of two), so the products gain nothing and the rounding
/// of activations costs time: on the H200 host's Xeon (Sapphire Rapids class, 2 pinned cores)
/// the f16 file took 586 ms against 401 ms for f32 (da3-small), attention and convolutions
/// 1.5-1.7x slower. So: AMD yes, others no; `DA3_BF16_PRODUCTS=on|off` overrides.
pub fn bf16_products_pay() -> bool {
    static PAY: OnceLock<bool> = OnceLock::new();
    *PAY.get_or_init(|| {
        bf16_decision(
            cpu_vendor().as_deref(),
            std::env::var("DA3_BF16_PRODUCTS").ok().as_deref(),
        )
    })
}

/// Whether bf16 products run on AMX tiles (`cpu_kernels/amx.rs`): where the CPU has
/// AMX-BF16, the OS grants the tile state and `DA3_AMX` is not `off`. Linear layers and
/// attention then multiply on the tiles, and the convolutions that
/// [`amx_convolution_fits`]; the others keep the vector kernels ([`bf16_products_pay`]).
pub fn amx_bf16_tiles() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        amx::bf16_tiles()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether a convolution kernel [KW, KH, IC, OC] runs on AMX tiles where the process has
/// them ([`amx_bf16_tiles`]): its input channels must fill whole tiles of pairs (a multiple
/// of 32), and its output channels a good part of a 32-row block (16 or more).
pub fn amx_convolution_fits([_, _, ic, oc]: [usize; 4]) -> bool {
    ic.is_multiple_of(32) && ic > 0 && oc >= 16
}

/// [`bf16_products_pay`] from the CPU vendor string and the override.
fn bf16_decision(vendor: Option<&str>, requested: Option<&str>) -> bool {
    match requested {
        Some("on") => true,
        Some("off") => false,
        _ => vendor == Some("AuthenticAMD"),
    }
}

/// Whether 3x3 f32 convolutions run by Winograd's F(4x4, 3x3) (`cpu_kernels/winograd.rs`: a
/// quarter of the direct kernel's multiply-adds) rather than the direct kernel:
/// `DA3_WINOGRAD=off` keeps the direct one, for measuring one against the other.
pub fn winograd_convolutions() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("DA3_WINOGRAD").as_deref() != Ok("off"))
}

/// How many bits the int8 products of quantised files' linear layers quantise their
/// activations to: 8, as ggml does (the sums then equal ggml's `vec_dot_q8_0_q8_0`), except
/// in the AVX2 set (AVX2 without VNNI), where it is 7 unless `DA3_INT8_ACTIVATION_BITS=8`:
/// without VNNI the exact route is held back by the instructions around its products, and
/// 7-bit activations make the int8 layers 1.3-1.45x faster ([`avx2_int7`]) for a little more
/// rounding (da3-small and da3-base q8_0 files on the AVX2 kernels, depth correlation with
/// the f32 file 0.99967 and 0.99986 against 0.99989 and 0.99996 with 8 bits). oneDNN and
/// ONNX Runtime's `reduce_range` narrow int8 operands to 7 bits on such CPUs for the same
/// reason.
pub fn int8_activation_bits() -> u32 {
    static BITS: OnceLock<u32> = OnceLock::new();
    *BITS.get_or_init(|| {
        int8_bits_decision(
            kernel_set(),
            std::env::var("DA3_INT8_ACTIVATION_BITS").ok().as_deref(),
        )
    })
}

/// [`int8_activation_bits`] from the kernel set and the override.
fn int8_bits_decision(set: KernelSet, requested: Option<&str>) -> u32 {
    match (set, requested) {
        (KernelSet::Avx2, Some("8")) => 8,
        (KernelSet::Avx2, _) => 7,
        _ => 8,
    }
}

/// A thread's scratch vector, taken from `slot` for one kernel call and put back when
/// dropped, so that the next call on the same thread finds it allocated: ggml's workers
/// outlive a graph, and a fresh vector per call (up to 2.4 MB for a linear layer's packed
/// rows) had its pages faulted in and zeroed every time. Its values are what the previous
/// user left (or the fill value where it grew): callers write before they read.
pub(super) struct Scratch<T: 'static> {
    slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
    data: Vec<T>,
    len: usize,
}

impl<T: Copy> Scratch<T> {
    /// `len` values of `slot`'s vector, grown with `fill` where it is shorter.
    pub fn take(
        slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
        len: usize,
        fill: T,
    ) -> Self {
        let mut data = slot.take();
        if data.len() < len {
            data.resize(len, fill);
        }
        Scratch { slot, data, len }
    }
}

impl<T> std::ops::Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.data[..self.len]
    }
}

impl<T> std::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.data[..self.len]
    }
}

impl<T> Drop for Scratch<T> {
    fn drop(&mut self) {
        self.slot.set(std::mem::take(&mut self.data));
    }
}

// The [`Scratch`] vectors of the kernels, shared by all of them (and every instance), so
// that a thread keeps no more than the largest buffers any one kernel holds at once: a
// kernel takes each slot at most once at a time, its largest buffer from the first. Per
// thread, the largest are a linear layer's packed rows (2.4 MB at 3,072 inputs) and
// Winograd's transformed kernels, 36 values per input and output channel (2.4 MB at 128 ->
// 128 channels, 9.4 MB at 256 -> 256: DA3-large's head).
thread_local! {
    pub(super) static SCRATCH_0: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(super) static SCRATCH_1: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(super) static SCRATCH_2: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(super) static SCRATCH_3: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
    /// Words of bf16 pairs.
    pub(super) static SCRATCH_PAIRS_0: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
    pub(super) static SCRATCH_PAIRS_1: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs kernel `$name` with `$args` in the instance of `$set`, which must be [`kernel_set`]
/// or, in its place where that is the AVX-512 set, the AVX2 one ([`set_for_width`]).
macro_rules! run_in {
    ($set:expr, $name:ident($($arg:expr),* $(,)?)) => {
        match $set {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: kernel_set() gives this set only where KernelSet::detect found avx512f,
            // avx512bf16, avx512vnni, avx2, fma and f16c, this instance's features.
            KernelSet::Avx512Bf16 => unsafe { avx512::run::$name($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: kernel_set() gives this set only where the CPU has avx2, fma, f16c and
            // avxvnni (avx2_vnni_detected).
            KernelSet::Avx2Vnni => unsafe { avx2vnni::run::$name($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has avx2, fma and f16c: kernel_set() gives this set only where
            // KernelSet::detect found at least them, and set_for_width only in place of the
            // AVX-512 set, which detect gives only with them.
            KernelSet::Avx2 => unsafe { avx2::run::$name($($arg),*) },
            _ => portable::run::$name($($arg),*),
        }
    };
}

/// Calls `$f::<R>($args)` for a group of `$rows` output channels, with `R` the register
/// tile's rows for it: `CONV_CHANNELS`, 4, 2 or 1, the sizes the convolutions'
/// `channel_groups` makes (`CONV_CHANNELS` is the calling instance's).
macro_rules! by_group_rows {
    ($rows:expr, $f:ident($($arg:expr),* $(,)?)) => {
        match $rows {
            r if r == CONV_CHANNELS => $f::<CONV_CHANNELS>($($arg),*),
            4 => $f::<4>($($arg),*),
            2 => $f::<2>($($arg),*),
            _ => $f::<1>($($arg),*),
        }
    };
}

/// Output rows (and columns) of a Winograd tile: [`conv_winograd_rows`] is shared among
/// threads by bands of this many rows.
pub(super) const WINOGRAD_TILE: usize = 4;

/// Whether a 3x3 convolution over a `w` x `h` map is faster by Winograd's F(4x4, 3x3) than
/// by the direct kernel, in the instance that runs it ([`winograd_set`]: its vectors pad the
/// rows of tiles).
pub(super) fn winograd_pays(w: usize, h: usize) -> bool {
    match winograd_set(w) {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx512Bf16 => avx512::winograd_pays(w, h),
        _ => portable::winograd_pays(w, h),
    }
}

/// The instance that runs Winograd over a map `w` pixels wide ([`set_for_width`]). On Zen 4
/// (2 threads), 144x96 128 -> 128 channels took 7.2 ms in AVX2 against 8.8 in AVX-512 (rows
/// padded to 160 pixels against 192), 72x48 2.6 against 3.3 (96 against 128); at 504 wide
/// (512 either way) 13.1 against 12.6.
fn winograd_set(w: usize) -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    return set_for_width(w, avx512::WINO_ROW_STEP, avx2::WINO_ROW_STEP);
    #[cfg(not(target_arch = "x86_64"))]
    kernel_set()
}

/// The instance that runs the direct convolution over a map `w` pixels wide
/// ([`set_for_width`]): on Zen 4, 18x12 768 -> 128 channels took 3.3 ms in AVX2 (rows of 32
/// pixels) against 4.7 in AVX-512 (48).
fn direct_set(w: usize) -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    return set_for_width(w, avx512::CONV_ROW_STEP, avx2::CONV_ROW_STEP);
    #[cfg(not(target_arch = "x86_64"))]
    kernel_set()
}

/// [`kernel_set`], but on AMD Zen 4 the AVX2 instance for a map `w` pixels wide where its
/// narrower vectors pad each row less (rows padded to `wide_step` pixels in AVX-512,
/// `narrow_step` in AVX2): the padding is computed and dropped, and Zen 4 runs AVX-512 as two
/// halves, so a vector of 16 lanes does no more than two of 8. (Where 512-bit vectors run
/// whole, as on Intel's AVX-512 cores, they stay: twice the work per instruction outweighs
/// the padding.)
#[cfg(target_arch = "x86_64")]
fn set_for_width(w: usize, wide_step: usize, narrow_step: usize) -> KernelSet {
    let set = kernel_set();
    let padded = |step: usize| w.div_ceil(step) * step;
    // kernel_set() gives the AVX-512 set only where the CPU also has AVX2, FMA and F16C
    // (KernelSet::detect), which the AVX2 instance needs.
    if set == KernelSet::Avx512Bf16 && padded(narrow_step) < padded(wide_step) && amd_zen4() {
        return KernelSet::Avx2;
    }
    set
}

/// Whether the CPU is an AMD Zen 4 (family 19h with AVX-512), whose AVX-512 instructions run
/// as two 256-bit halves.
#[cfg(target_arch = "x86_64")]
fn amd_zen4() -> bool {
    static ZEN4: OnceLock<bool> = OnceLock::new();
    *ZEN4.get_or_init(|| {
        // SAFETY: CPUID leaf 1 exists on every x86-64 CPU and only reads registers.
        #[allow(unused_unsafe)]
        let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
        let base = (eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((eax >> 20) & 0xff)
        } else {
            base
        };
        cpu_vendor().as_deref() == Some("AuthenticAMD")
            && family == 0x19
            && is_x86_feature_detected!("avx512f")
    })
}

/// The direct convolution of the rows `out` holds, in the instance [`direct_set`] picks for
/// the map's width.
pub(super) fn conv_direct_rows(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(direct_set(ne[0]), conv_direct_rows(srcs, out, ne, param))
}

/// The transposed convolution of disjoint patches, in the instance of [`kernel_set`].
pub(super) fn conv_transpose_rows(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(kernel_set(), conv_transpose_rows(srcs, out, ne, param))
}

/// [`conv_direct_rows`] with bf16 products, in the instance of [`kernel_set`].
pub(super) fn conv_direct_rows_bf16(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(kernel_set(), conv_direct_rows_bf16(srcs, out, ne, param))
}

/// The direct (or, on large maps, Winograd) convolution of output channels `channels`, in
/// the instance [`direct_set`] picks for the map's width.
pub(super) fn conv_same_planes(
    srcs: &[Src<'_>],
    out: &mut [f32],
    ne: [usize; 4],
    channels: Range<usize>,
    param: f32,
) {
    run_in!(
        direct_set(ne[0]),
        conv_same_planes(srcs, out, ne, channels, param)
    )
}

/// Winograd's 3x3 convolution of the rows `out` holds, in the instance [`winograd_set`]
/// picks for the map's width.
pub(super) fn conv_winograd_rows(
    srcs: &[Src<'_>],
    out: &mut PlaneRows<'_>,
    ne: [usize; 4],
    param: f32,
) {
    run_in!(
        winograd_set(ne[0]),
        conv_winograd_rows(srcs, out, ne, param)
    )
}

/// The CPUID vendor string ("AuthenticAMD", "GenuineIntel", ...).
fn cpu_vendor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads registers.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Output columns per panel of a packed matrix-product weight: the same for every kernel
/// set (two AVX-512 vectors, four AVX2 ones), so that packed weights do not depend on the
/// CPU.
pub(super) const PANEL: usize = 32;
/// The attention kernel takes value rows of whole vectors of every set.
pub(super) const ATTENTION_DV_MULTIPLE: usize = 16;

/// One x86 vector width: its type, lanes, registers and the four intrinsics used. The
/// functions are safe to call only because the module they are expanded into is private to
/// one kernel instance, whose code runs only inside that instance's `run` functions.
///
/// The vector helpers here and in the instances' `simd` modules use no closures around
/// intrinsics: a closure is a function of its own without the instance's features, and
/// where the compiler did not inline one its intrinsics became calls (the 7-bit instance's
/// `q8_bytes` in a build for the baseline target: its int8 layers at 55-85% of their speed).
#[cfg(target_arch = "x86_64")]
macro_rules! x86_vectors {
    ($f:ty, $lanes:expr, $registers:expr, $splat:ident, $fma:ident, $mul:ident, $add:ident, $sub:ident, $div:ident, $min:ident, $max:ident, $load:ident, $store:ident) => {
        use std::arch::x86_64::*;
        pub type F = $f;
        pub const LANES: usize = $lanes;
        pub const REGISTERS: usize = $registers;
        pub const FMA: bool = true;
        #[inline(always)]
        pub fn splat(x: f32) -> F {
            // SAFETY: only reached from this instance's `run` functions, compiled with the
            // instruction set and called only where the CPU has it (see `dispatch!`).
            unsafe { $splat(x) }
        }
        #[inline(always)]
        pub fn fma(a: F, b: F, c: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $fma(a, b, c) }
        }
        #[inline(always)]
        pub fn mul(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $mul(a, b) }
        }
        #[inline(always)]
        pub fn add(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $add(a, b) }
        }
        #[inline(always)]
        pub fn sub(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $sub(a, b) }
        }
        #[inline(always)]
        pub fn div(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $div(a, b) }
        }
        /// `b` where either is NaN, as `minps` does.
        #[inline(always)]
        pub fn min(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $min(a, b) }
        }
        /// `b` where either is NaN, as `maxps` does.
        #[inline(always)]
        pub fn max(a: F, b: F) -> F {
            // SAFETY: as for `splat`.
            unsafe { $max(a, b) }
        }
        // The lanes of a vector and back: for the bf16 fallback, which the AVX-512 set lacks.
        #[allow(dead_code)]
        #[inline(always)]
        pub fn to_lanes(v: F) -> [f32; LANES] {
            // SAFETY: a vector is LANES plain f32 values.
            unsafe { std::mem::transmute::<F, [f32; LANES]>(v) }
        }
        #[allow(dead_code)]
        #[inline(always)]
        pub fn from_lanes(lanes: [f32; LANES]) -> F {
            // SAFETY: as above.
            unsafe { std::mem::transmute::<[f32; LANES], F>(lanes) }
        }
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load(p: *const f32) -> F {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { $load(p) }
        }
        /// # Safety
        /// `p` is valid for writing LANES values.
        #[inline(always)]
        pub unsafe fn store(p: *mut f32, v: F) {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { $store(p, v) }
        }
    };
}

/// bf16 pairs multiplied lane by lane in f32, where the vector unit has no bf16 products:
/// nothing asks for them there, but such operands still compute correctly.
macro_rules! bf16_by_lanes {
    () => {
        pub type Bf16Splat = [f32; 2];
        #[inline(always)]
        pub fn bf16_splat(x: u32) -> [f32; 2] {
            super::super::bf16_unpack(x)
        }
        #[inline(always)]
        pub fn bf16_madd(acc: F, [x0, x1]: [f32; 2], b: F) -> F {
            let mut lanes = to_lanes(acc);
            for (a, b) in lanes.iter_mut().zip(to_lanes(b)) {
                let [b0, b1] = super::super::bf16_unpack(b.to_bits());
                *a = x1.mul_add(b1, x0.mul_add(b0, *a));
            }
            from_lanes(lanes)
        }
    };
}

/// The kernel entry points of one instance, as functions with the attribute `$attr` (its
/// `target_feature`; the instance's kernels are `#[inline(always)]`, so they are compiled
/// inside these, with those features).
macro_rules! entries {
    ($attr:meta) => {
        pub(super) mod run {
            use super::*;
            // The direct convolution whatever the kernel's size, and Winograd's whatever the
            // map's, for the tests that compare them.
            #[cfg(test)]
            entries!(@each $attr; conv_direct_planes conv_winograd_planes);
            entries!(@bands $attr; conv_winograd_rows conv_direct_rows conv_direct_rows_bf16
                conv_transpose_rows);
            entries!(@each $attr; conv_same_planes conv_same_planes_bf16 gelu_erf_rows
                bilinear_align_corners_planes concat_rows transpose_rows attention_tokens
                attention_tokens_bf16 attention_tokens_int8 linear_bias_rows linear_bias_gelu_rows
                linear_scaled_residual_rows layer_norm_rows);
        }
    };
    // Only the int8 products (linear layers, attention's scores): the 7-bit int8 instance
    // runs nothing else.
    (@int8 $attr:meta) => {
        pub(super) mod run {
            use super::*;
            entries!(@each $attr; linear_bias_rows linear_bias_gelu_rows
                linear_scaled_residual_rows attention_tokens_int8);
        }
    };
    (@bands $attr:meta; $($name:ident)*) => {
        $(
            #[$attr]
            pub(in super::super) fn $name(
                srcs: &[Src<'_>],
                out: &mut PlaneRows<'_>,
                ne: [usize; 4],
                param: f32,
            ) {
                super::$name(srcs, out, ne, param)
            }
        )*
    };
    (@each $attr:meta; $($name:ident)*) => {
        $(
            #[$attr]
            pub(in super::super) fn $name(
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                super::$name(srcs, out, ne, units, param)
            }
        )*
    };
}

/// AVX-512 with BF16 products.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    mod simd {
        x86_vectors!(
            __m512,
            16,
            32,
            _mm512_set1_ps,
            _mm512_fmadd_ps,
            _mm512_mul_ps,
            _mm512_add_ps,
            _mm512_sub_ps,
            _mm512_div_ps,
            _mm512_min_ps,
            _mm512_max_ps,
            _mm512_loadu_ps,
            _mm512_storeu_ps
        );
        /// Whether [`exp2_softmax`] is a vector routine of its own (else the body's formula
        /// lane by lane, which the compiler vectorises in its loops anyway).
        pub const EXP2_VECTOR: bool = true;
        /// The body's `exp2_softmax` on a vector, the same fit and the same rounding of `t`
        /// to the nearest integer `n`, with `vroundscaleps` for that and `vscalefps` for
        /// `p * 2^n` (no integer arithmetic on the exponent bits): 9 instructions per
        /// vector against 14, in the f32 attention's softmax.
        #[inline(always)]
        pub fn exp2_softmax(t: F) -> F {
            // SAFETY: as for `splat`.
            unsafe {
                let t = _mm512_max_ps(t, _mm512_set1_ps(-100.0));
                let n =
                    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
                let f = _mm512_sub_ps(t, n);
                let mut p = _mm512_set1_ps(super::EXP2_FIT[0]);
                for &c in &super::EXP2_FIT[1..] {
                    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
                }
                _mm512_scalef_ps(p, n)
            }
        }
        /// LANES f16 values (bits) from `p`, widened to f32.
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load_f16(p: *const u16) -> F {
            // SAFETY: as the caller promises (32 bytes); the instruction set as for `splat`.
            unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
        }
        /// The bf16 linear products run on AMX tiles where the CPU has them
        /// ([`super::super::amx::bf16_tiles`]): every AMX CPU has this set's features.
        pub const AMX_TILES: bool = true;
        /// [`super::super::to_bf16_pairs`] 16 values per `vcvtneps2bf16`, which rounds to
        /// nearest even as well (and flushes subnormals to zero).
        #[inline(always)]
        pub fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
            let whole = src.len() / LANES * LANES;
            for (chunk, words) in src[..whole]
                .chunks_exact(LANES)
                .zip(dst.chunks_exact_mut(LANES / 2))
            {
                // SAFETY: the load reads the 16 values of `chunk`, the store writes the 8
                // words of `words`; the instruction set (avx512bf16) as for `splat`.
                unsafe {
                    let pairs = _mm512_cvtneps_pbh(_mm512_loadu_ps(chunk.as_ptr()));
                    _mm256_storeu_si256(
                        words.as_mut_ptr() as *mut __m256i,
                        std::mem::transmute::<__m256bh, __m256i>(pairs),
                    );
                }
            }
            if let Some(rest) = dst.get_mut(whole / 2..) {
                super::super::to_bf16_pairs(&src[whole..], rest);
            }
        }
        /// Values `4 i + j` of `src` (`4 * LANES` of them) as vector `j`, the `i`s in the
        /// lane order 0 4 8 12 1 5 9 13 2 6 10 14 3 7 11 15 (a 4 x 4 transpose per 128-bit
        /// quarter; see the AVX2 set's).
        #[inline(always)]
        pub fn deinterleave4(src: &[f32]) -> [F; 4] {
            assert!(src.len() >= 4 * LANES);
            // SAFETY: the assertion covers the four loads; the instruction set as for `splat`.
            unsafe {
                let p = src.as_ptr();
                let (a, b) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
                let (c, d) = (_mm512_loadu_ps(p.add(32)), _mm512_loadu_ps(p.add(48)));
                transpose_quarters(a, b, c, d)
            }
        }
        /// The inverse of [`deinterleave4`]: `dst[4 i + j]` is lane `i` of `v[j]`.
        #[inline(always)]
        pub fn interleave4(v: [F; 4], dst: &mut [f32]) {
            assert!(dst.len() >= 4 * LANES);
            let [a, b, c, d] = v;
            // SAFETY: the assertion covers the four stores; the instruction set as for `splat`.
            unsafe {
                let rows = transpose_quarters(a, b, c, d);
                for (i, r) in rows.into_iter().enumerate() {
                    _mm512_storeu_ps(dst.as_mut_ptr().add(16 * i), r);
                }
            }
        }
        /// A 4 x 4 transpose of each 128-bit quarter of four vectors (its own inverse).
        #[inline(always)]
        fn transpose_quarters(a: F, b: F, c: F, d: F) -> [F; 4] {
            // SAFETY: the instruction set as for `splat`.
            unsafe {
                let (ab_lo, ab_hi) = (_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
                let (cd_lo, cd_hi) = (_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
                [
                    _mm512_shuffle_ps::<0x44>(ab_lo, cd_lo),
                    _mm512_shuffle_ps::<0xEE>(ab_lo, cd_lo),
                    _mm512_shuffle_ps::<0x44>(ab_hi, cd_hi),
                    _mm512_shuffle_ps::<0xEE>(ab_hi, cd_hi),
                ]
            }
        }
        pub type Bf16Splat = __m512bh;
        #[inline(always)]
        pub fn bf16_splat(x: u32) -> __m512bh {
            // SAFETY: the instruction set as for `splat`; the transmute reads 16 words as 32
            // bf16 values.
            unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(x as i32)) }
        }
        #[inline(always)]
        pub fn bf16_madd(acc: F, x: __m512bh, b: F) -> F {
            // SAFETY: the instruction set (avx512bf16) as for `splat`; the transmute as above.
            unsafe { _mm512_dpbf16_ps(acc, x, std::mem::transmute::<F, __m512bh>(b)) }
        }
        // int8 products: activations offset to unsigned bytes, four per lane per `vpdpbusd`.
        pub type I = __m512i;
        pub type Q8Weights = __m512i;
        /// An activation word as the tile reads it: four bytes.
        pub type Q8Word = u32;
        pub const Q8_LEVELS: f32 = 127.0;
        /// Added to the activations: `vpdpbusd` multiplies unsigned bytes by signed ones.
        pub const Q8_OFFSET: f32 = 128.0;
        #[inline(always)]
        pub fn q8_word(bytes: u32) -> u32 {
            bytes
        }
        /// 6 x 2 integer sums with 12 f32 results take 24 of the 32 registers.
        pub const Q8_TILE: (usize, usize) = (6, 2);
        /// # Safety
        /// `p` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_load(p: *const f32) -> __m512i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm512_loadu_si512(p as *const __m512i) }
        }
        /// The start of a block's sums: its correction for the offset (see `Q8_OFFSET`).
        /// # Safety
        /// `correction` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_init(correction: *const f32) -> __m512i {
            // SAFETY: as for `q8_load`.
            unsafe { q8_load(correction) }
        }
        /// # Safety
        /// `x` is valid for reading.
        #[inline(always)]
        pub unsafe fn q8_splat(x: *const u32) -> __m512i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm512_set1_epi32(x.read() as i32) }
        }
        #[inline(always)]
        pub fn q8_dot(acc: __m512i, x: __m512i, w: __m512i) -> __m512i {
            // SAFETY: the instruction set (avx512vnni) as for `splat`.
            unsafe { _mm512_dpbusd_epi32(acc, x, w) }
        }
        #[inline(always)]
        pub fn q8_to_f32(i: __m512i) -> F {
            // SAFETY: the instruction set as for `splat`.
            unsafe { _mm512_cvtepi32_ps(i) }
        }
        /// The largest magnitude of a block.
        #[inline(always)]
        pub fn q8_max(values: &[f32; 32]) -> f32 {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32 values.
            unsafe {
                let a = _mm512_abs_ps(_mm512_loadu_ps(values.as_ptr()));
                let b = _mm512_abs_ps(_mm512_loadu_ps(values.as_ptr().add(16)));
                _mm512_reduce_max_ps(_mm512_max_ps(a, b))
            }
        }
        /// The low bytes of the bits of `v * inverse + shift` for a block.
        #[inline(always)]
        pub fn q8_bytes(values: &[f32; 32], inverse: f32, shift: f32) -> [u8; 32] {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32
            // values and the stores write the 32 bytes of `out`.
            unsafe {
                let (m, s) = (_mm512_set1_ps(inverse), _mm512_set1_ps(shift));
                let mut out = [0u8; 32];
                for h in 0..2 {
                    let v = _mm512_add_ps(
                        _mm512_mul_ps(_mm512_loadu_ps(values.as_ptr().add(16 * h)), m),
                        s,
                    );
                    let bytes = _mm512_cvtepi32_epi8(_mm512_castps_si512(v));
                    _mm_storeu_si128(out.as_mut_ptr().add(16 * h) as *mut __m128i, bytes);
                }
                out
            }
        }
    }
    macro_rules! instance_features {
        ($($item:tt)*) => { #[target_feature(enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c")] $($item)* };
    }
    include!("cpu_kernels/body.rs");
    include!("cpu_kernels/winograd.rs");
    entries!(target_feature(
        enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c"
    ));
    /// [`exp2_vector_and_lanes_for_tests`] compiled with this set's features.
    ///
    /// # Safety
    /// The CPU has the features of this set.
    #[cfg(test)]
    #[target_feature(enable = "avx512f,avx512bf16,avx512vnni,avx2,fma,f16c")]
    pub(super) unsafe fn exp2_lanes_for_tests(t: [f32; 16]) -> ([f32; 16], [f32; 16]) {
        exp2_vector_and_lanes_for_tests(t)
    }
}

/// The AVX2 vector unit the AVX2 sets share: f32 vectors, bf16 pairs lane by lane, and the
/// parts of the int8 products that do not depend on VNNI.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_vectors {
    () => {
        x86_vectors!(
            __m256,
            8,
            16,
            _mm256_set1_ps,
            _mm256_fmadd_ps,
            _mm256_mul_ps,
            _mm256_add_ps,
            _mm256_sub_ps,
            _mm256_div_ps,
            _mm256_min_ps,
            _mm256_max_ps,
            _mm256_loadu_ps,
            _mm256_storeu_ps
        );
        bf16_by_lanes!();
        /// The int8 products' integer sums, eight i32 lanes.
        pub type I = __m256i;
        #[inline(always)]
        pub fn q8_to_f32(i: __m256i) -> F {
            // SAFETY: the instruction set as for `splat`.
            unsafe { _mm256_cvtepi32_ps(i) }
        }
        /// AMX tiles only with the AVX-512 set (every AMX CPU has it).
        pub const AMX_TILES: bool = false;
        /// A vector routine of its own: the body's formula vectorised by the compiler
        /// re-broadcast its six constants from memory for every vector (each broadcast an
        /// operation of a vector port on Zen 4) and started the fit from 0 by a multiply-add.
        pub const EXP2_VECTOR: bool = true;
        /// The body's `exp2_softmax` on a vector, bit for bit: `vroundps` rounds `t` to the
        /// nearest integer `n` (ties to even, as the body's added 1.5 * 2^23 does), the fit
        /// runs on `t - n`, and `2^n` is built in the exponent bits.
        #[inline(always)]
        pub fn exp2_softmax(t: F) -> F {
            // SAFETY: as for `splat`.
            unsafe {
                let t = _mm256_max_ps(t, _mm256_set1_ps(-100.0));
                let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
                let f = _mm256_sub_ps(t, n);
                let mut p = _mm256_set1_ps(super::EXP2_FIT[0]);
                for &c in &super::EXP2_FIT[1..] {
                    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
                }
                let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
                _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased)))
            }
        }
        /// LANES f16 values (bits) from `p`, widened to f32 (F16C).
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load_f16(p: *const u16) -> F {
            // SAFETY: as the caller promises (16 bytes); the instruction set (f16c, which
            // every AVX2 set requires) as for `splat`.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)) }
        }
        pub(super) use super::super::to_bf16_pairs;
        /// Values `4 i + j` of `src` (`4 * LANES` of them) as vector `j`, the `i`s in the
        /// lane order 0 2 4 6 1 3 5 7 (two 4 x 4 transposes, one per 128-bit half; the
        /// Winograd transforms treat lanes alike, so their order does not matter as long as
        /// [`interleave4`] undoes it).
        #[inline(always)]
        pub fn deinterleave4(src: &[f32]) -> [F; 4] {
            assert!(src.len() >= 4 * LANES);
            // SAFETY: the assertion covers the four loads; the instruction set as for `splat`.
            unsafe {
                let p = src.as_ptr();
                let (a, b) = (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)));
                let (c, d) = (_mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24)));
                transpose_halves(a, b, c, d)
            }
        }
        /// The inverse of [`deinterleave4`]: `dst[4 i + j]` is lane `i` of `v[j]`.
        #[inline(always)]
        pub fn interleave4(v: [F; 4], dst: &mut [f32]) {
            assert!(dst.len() >= 4 * LANES);
            let [a, b, c, d] = v;
            // SAFETY: the assertion covers the four stores; the instruction set as for `splat`.
            unsafe {
                let rows = transpose_halves(a, b, c, d);
                for (i, r) in rows.into_iter().enumerate() {
                    _mm256_storeu_ps(dst.as_mut_ptr().add(8 * i), r);
                }
            }
        }
        /// A 4 x 4 transpose of each 128-bit half of four vectors, which
        /// [`deinterleave4`] and [`interleave4`] share (it is its own inverse).
        #[inline(always)]
        fn transpose_halves(a: F, b: F, c: F, d: F) -> [F; 4] {
            // SAFETY: the instruction set as for `splat`.
            unsafe {
                let (ab_lo, ab_hi) = (_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
                let (cd_lo, cd_hi) = (_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
                [
                    _mm256_shuffle_ps::<0x44>(ab_lo, cd_lo),
                    _mm256_shuffle_ps::<0xEE>(ab_lo, cd_lo),
                    _mm256_shuffle_ps::<0x44>(ab_hi, cd_hi),
                    _mm256_shuffle_ps::<0xEE>(ab_hi, cd_hi),
                ]
            }
        }
        /// The largest magnitude of a block.
        #[inline(always)]
        pub fn q8_max(values: &[f32; 32]) -> f32 {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32 values.
            unsafe {
                let sign = _mm256_set1_ps(-0.0);
                let mut v = [sign; 4];
                for (i, v) in v.iter_mut().enumerate() {
                    *v = _mm256_andnot_ps(sign, _mm256_loadu_ps(values.as_ptr().add(8 * i)));
                }
                let m = _mm256_max_ps(_mm256_max_ps(v[0], v[1]), _mm256_max_ps(v[2], v[3]));
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
            }
        }
        /// The low bytes of the bits of `v * inverse + shift` for a block.
        #[inline(always)]
        pub fn q8_bytes(values: &[f32; 32], inverse: f32, shift: f32) -> [u8; 32] {
            // SAFETY: the instruction set as for `splat`; the loads read the block's 32
            // values and the store writes the 32 bytes of `out`.
            unsafe {
                let (m, s) = (_mm256_set1_ps(inverse), _mm256_set1_ps(shift));
                let low = _mm256_set1_epi32(0xff);
                let mut v = [_mm256_setzero_si256(); 4];
                for (i, v) in v.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(values.as_ptr().add(8 * i));
                    let bits = _mm256_castps_si256(_mm256_add_ps(_mm256_mul_ps(x, m), s));
                    *v = _mm256_and_si256(bits, low);
                }
                // Bytes 0..255 pass both unsigned packs unchanged; the packs work per
                // 128-bit half, so the dwords come out as a0 b0 c0 d0 | a1 b1 c1 d1.
                let packed = _mm256_packus_epi16(
                    _mm256_packus_epi32(v[0], v[1]),
                    _mm256_packus_epi32(v[2], v[3]),
                );
                let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
                let bytes = _mm256_permutevar8x32_epi32(packed, order);
                let mut out = [0u8; 32];
                _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, bytes);
                out
            }
        }
    };
}

/// The int8 operands of the AVX2 sets that multiply bytes as they are (`vpdpbusd`,
/// `vpmaddubsw`): weight vectors loaded as stored, activation words of four bytes broadcast.
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_byte_words {
    () => {
        pub type Q8Weights = __m256i;
        /// An activation word as the tile reads it: four bytes.
        pub type Q8Word = u32;
        #[inline(always)]
        pub fn q8_word(bytes: u32) -> u32 {
            bytes
        }
        /// # Safety
        /// `p` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_load(p: *const f32) -> __m256i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm256_loadu_si256(p as *const __m256i) }
        }
        /// # Safety
        /// `x` is valid for reading.
        #[inline(always)]
        pub unsafe fn q8_splat(x: *const u32) -> __m256i {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe { _mm256_set1_epi32(x.read() as i32) }
        }
    };
}

/// AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    mod simd {
        avx2_vectors!();
        // int8 products without VNNI on ggml's 8-bit activations (`DA3_INT8_ACTIVATION_BITS=8`;
        // by default this set's int8 layers run in `avx2_int7`), by `vpmaddwd` on bytes
        // widened to i16: each lane sums two exact products into i32, 16 multiply-adds per
        // instruction. The `vpmaddubsw` route (unsigned by signed bytes in pairs saturating
        // at i16, so |w| and x with w's sign, then `vpmaddwd` by ones) takes three
        // instructions per 32 multiply-adds, and measured on Zen 4 `vpsignb`, `vpmaddubsw`
        // and `vpmaddwd` all issue on the same two ports, two per cycle together; the shifts
        // that widen the bytes here issue on others.
        //
        // A weight word holds bytes k .. k + 3 of one column, a lane per column. Its 16-bit
        // halves shifted left by 8 then arithmetically right by 8 give (k, k + 2) as i16,
        // shifted right by 8 alone (k + 1, k + 3): two `vpmaddwd` against the activations'
        // (x_k, x_k+2) and (x_k+1, x_k+3), each broadcast as a 32-bit pair, sum the word's
        // four products into the column's lane.
        /// A vector of weights as its (k, k + 2) and (k + 1, k + 3) pairs of i16.
        pub type Q8Weights = (__m256i, __m256i);
        /// An activation word: (x_k, x_k+2) then (x_k+1, x_k+3), each value an i16.
        pub type Q8Word = u64;
        pub const Q8_LEVELS: f32 = 127.0;
        pub const Q8_OFFSET: f32 = 0.0;
        /// Four signed bytes (k .. k + 3) as the pairs of i16 the tile broadcasts.
        #[inline(always)]
        pub fn q8_word(bytes: u32) -> u64 {
            let [b0, b1, b2, b3] = bytes.to_le_bytes().map(|b| b as i8 as i16 as u16 as u64);
            b0 | b2 << 16 | b1 << 32 | b3 << 48
        }
        /// # Safety
        /// `p` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_load(p: *const f32) -> Q8Weights {
            // SAFETY: as the caller promises; the instruction set as for `splat`.
            unsafe {
                let w = _mm256_loadu_si256(p as *const __m256i);
                (
                    _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(w)),
                    _mm256_srai_epi16::<8>(w),
                )
            }
        }
        /// # Safety
        /// Reads nothing: without the offset, blocks start from zero.
        #[inline(always)]
        pub unsafe fn q8_init(_correction: *const f32) -> __m256i {
            // SAFETY: the instruction set as for `splat`.
            unsafe { _mm256_setzero_si256() }
        }
        /// Broadcast from memory, each half by its own load: a 64-bit value taken into a
        /// general register first costs two moves and two shuffles per row.
        /// # Safety
        /// `x` is valid for reading.
        #[inline(always)]
        pub unsafe fn q8_splat(x: *const u64) -> (__m256i, __m256i) {
            // SAFETY: as the caller promises, `x` holds two 32-bit halves; the instruction
            // set as for `splat`.
            unsafe {
                let halves = x as *const i32;
                (
                    _mm256_set1_epi32(halves.read_unaligned()),
                    _mm256_set1_epi32(halves.add(1).read_unaligned()),
                )
            }
        }
        #[inline(always)]
        pub fn q8_dot(
            acc: __m256i,
            (x_even, x_odd): (__m256i, __m256i),
            (w_even, w_odd): Q8Weights,
        ) -> __m256i {
            // SAFETY: the instruction set as for `splat`.
            unsafe {
                let even = _mm256_madd_epi16(w_even, x_even);
                _mm256_add_epi32(_mm256_add_epi32(acc, even), _mm256_madd_epi16(w_odd, x_odd))
            }
        }
        /// Five rows of two vectors of columns: 10 sums, 4 weight vectors and a row's two
        /// activation pairs take the 16 registers (the f32 results wait in memory between
        /// blocks of 32 inputs). Each broadcast then feeds two products: counting Zen 4's
        /// broadcasts from memory as vector operations predicted each tile's speed (about 18
        /// multiply-adds per cycle for 6 x 1, 20 for 5 x 2), and this ran 125-140 GFLOP/s on
        /// one core against 106-134 for 6 x 1 and 4 x 1 (DA3's 865 tokens are 173 groups).
        pub const Q8_TILE: (usize, usize) = (5, 2);
    }
    macro_rules! instance_features {
        ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c")] $($item)* };
    }
    include!("cpu_kernels/body.rs");
    include!("cpu_kernels/winograd.rs");
    entries!(target_feature(enable = "avx2,fma,f16c"));
    /// [`exp2_vector_and_lanes_for_tests`] compiled with this set's features.
    ///
    /// # Safety
    /// The CPU has the features of this set.
    #[cfg(test)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn exp2_lanes_for_tests(t: [f32; 8]) -> ([f32; 8], [f32; 8]) {
        exp2_vector_and_lanes_for_tests(t)
    }
}

/// AVX2 with FMA and AVX-VNNI (Intel Alder Lake and later, AMD Zen 5): the AVX2 kernels with
/// `vpdpbusd` on 256-bit vectors for the int8 products.
#[cfg(target_arch = "x86_64")]
mod avx2vnni {
    mod simd {
        avx2_vectors!();
        // int8 products as with AVX-512: offset activations, four bytes per lane.
        avx2_byte_words!();
        pub const Q8_LEVELS: f32 = 127.0;
        pub const Q8_OFFSET: f32 = 128.0;
        /// One `vpdpbusd` per product: 3 x 2 sums, their 6 results, two weight vectors and a
        /// broadcast fit the 16 registers.
        pub const Q8_TILE: (usize, usize) = (3, 2);
        /// The start of a block's sums: its correction for the offset.
        /// # Safety
        /// `correction` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_init(correction: *const f32) -> __m256i {
            // SAFETY: as for `q8_load`.
            unsafe { q8_load(correction) }
        }
        #[inline(always)]
        pub fn q8_dot(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
            // SAFETY: the instruction set (avxvnni) as for `splat`.
            unsafe { _mm256_dpbusd_avx_epi32(acc, x, w) }
        }
    }
    macro_rules! instance_features {
        ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c,avxvnni")] $($item)* };
    }
    include!("cpu_kernels/body.rs");
    include!("cpu_kernels/winograd.rs");
    entries!(target_feature(enable = "avx2,fma,f16c,avxvnni"));
}

/// AVX2 with FMA, the int8 products of quantised files (their linear layers and attention's
/// scores) on activations quantised to 7 bits ([`int8_activation_bits`]); every other kernel
/// runs in [`avx2`].
///
/// `vpmaddubsw` multiplies unsigned bytes by signed ones and adds the pairs into an i16,
/// saturating: exact for activations offset to 1..127 (x + 64 for x in -63..63) by weights
/// in -128..127 (at most 32,512 in magnitude). With `vpmaddwd` by ones widening the pairs into
/// i32, that is two instructions of the multiply ports per 32 multiply-adds, as the exact
/// route's two `vpmaddwd` on widened bytes; but it needs neither the 6 shifts that widen the
/// weights nor a second broadcast per row, and one add instead of two, so the other ports stop
/// limiting it. Measured on Zen 4 held to AVX2 (`kernel_speed 1 products`, one core, int8
/// panels, DA3-small's block shapes): 171-182 GFLOP/s against 119-138 for the exact route.
/// The offset is undone by each block's correction: the packing's `-128 Σ w`, halved.
#[cfg(target_arch = "x86_64")]
#[allow(dead_code)]
mod avx2_int7 {
    mod simd {
        avx2_vectors!();
        avx2_byte_words!();
        /// Activations in -63..63, each byte x + 64.
        pub const Q8_LEVELS: f32 = 63.0;
        pub const Q8_OFFSET: f32 = 64.0;
        /// 6 x 2 sums, two weight vectors, a broadcast and the ones take the 16 registers
        /// (5 x 2 ran as fast).
        pub const Q8_TILE: (usize, usize) = (6, 2);
        /// The start of a block's sums, `-64 Σ w`: half the packing's correction for an
        /// offset of 128 (an even number, so the shift is exact).
        /// # Safety
        /// `correction` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_init(correction: *const f32) -> __m256i {
            // SAFETY: as for `q8_load`.
            unsafe { _mm256_srai_epi32::<1>(q8_load(correction)) }
        }
        #[inline(always)]
        pub fn q8_dot(acc: __m256i, x: __m256i, w: __m256i) -> __m256i {
            // SAFETY: the instruction set as for `splat`.
            unsafe {
                let pairs = _mm256_maddubs_epi16(x, w);
                _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
            }
        }
    }
    macro_rules! instance_features {
        ($($item:tt)*) => { #[target_feature(enable = "avx2,fma,f16c")] $($item)* };
    }
    include!("cpu_kernels/body.rs");
    include!("cpu_kernels/winograd.rs");
    entries!(@int8 target_feature(enable = "avx2,fma,f16c"));
}

/// Plain arrays, for any target.
mod portable {
    mod simd {
        pub type F = [f32; LANES];
        pub const LANES: usize = 8;
        pub const REGISTERS: usize = 16;
        pub const AMX_TILES: bool = false;
        /// The body's formula lane by lane (its loops vectorise it).
        pub const EXP2_VECTOR: bool = false;
        #[allow(dead_code)]
        #[inline(always)]
        pub fn exp2_softmax(t: F) -> F {
            t.map(super::exp2_softmax)
        }
        pub(super) use super::super::to_bf16_pairs;
        /// `mul_add` is one instruction only where the target has FMA (elsewhere a slow
        /// library call).
        pub const FMA: bool = cfg!(any(target_feature = "fma", target_arch = "aarch64"));
        #[inline(always)]
        pub fn splat(x: f32) -> F {
            [x; LANES]
        }
        #[inline(always)]
        pub fn to_lanes(v: F) -> [f32; LANES] {
            v
        }
        #[inline(always)]
        pub fn from_lanes(lanes: [f32; LANES]) -> F {
            lanes
        }
        #[inline(always)]
        pub fn mul(a: F, b: F) -> F {
            std::array::from_fn(|i| a[i] * b[i])
        }
        #[inline(always)]
        pub fn add(a: F, b: F) -> F {
            std::array::from_fn(|i| a[i] + b[i])
        }
        #[inline(always)]
        pub fn sub(a: F, b: F) -> F {
            std::array::from_fn(|i| a[i] - b[i])
        }
        #[inline(always)]
        pub fn div(a: F, b: F) -> F {
            std::array::from_fn(|i| a[i] / b[i])
        }
        /// `b` where either is NaN, as x86's `minps` does.
        #[inline(always)]
        pub fn min(a: F, b: F) -> F {
            std::array::from_fn(|i| if a[i] < b[i] { a[i] } else { b[i] })
        }
        /// `b` where either is NaN, as x86's `maxps` does.
        #[inline(always)]
        pub fn max(a: F, b: F) -> F {
            std::array::from_fn(|i| if a[i] > b[i] { a[i] } else { b[i] })
        }
        #[inline(always)]
        pub fn fma(a: F, b: F, c: F) -> F {
            std::array::from_fn(|i| {
                if FMA {
                    a[i].mul_add(b[i], c[i])
                } else {
                    a[i] * b[i] + c[i]
                }
            })
        }
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load(p: *const f32) -> F {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::read_unaligned(p as *const F) }
        }
        /// # Safety
        /// `p` is valid for reading LANES values.
        #[inline(always)]
        pub unsafe fn load_f16(p: *const u16) -> F {
            // SAFETY: as the caller promises.
            let bits = unsafe { std::ptr::read_unaligned(p as *const [u16; LANES]) };
            bits.map(|b| half::f16::from_bits(b).to_f32())
        }
        /// # Safety
        /// `p` is valid for writing LANES values.
        #[inline(always)]
        pub unsafe fn store(p: *mut f32, v: F) {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::write_unaligned(p as *mut F, v) }
        }
        bf16_by_lanes!();
        /// Values `4 i + j` of `src` (`4 * LANES` of them) as vector `j`, in order.
        #[inline(always)]
        pub fn deinterleave4(src: &[f32]) -> [F; 4] {
            std::array::from_fn(|j| std::array::from_fn(|i| src[4 * i + j]))
        }
        /// The inverse of [`deinterleave4`]: `dst[4 i + j]` is lane `i` of `v[j]`.
        #[inline(always)]
        pub fn interleave4(v: [F; 4], dst: &mut [f32]) {
            for (i, dst) in dst[..4 * LANES].chunks_exact_mut(4).enumerate() {
                for (j, d) in dst.iter_mut().enumerate() {
                    *d = v[j][i];
                }
            }
        }
        // int8 products lane by lane, signed bytes without offset.
        pub type I = [i32; LANES];
        pub type Q8Weights = [u32; LANES];
        /// An activation word as the tile reads it: four bytes.
        pub type Q8Word = u32;
        pub const Q8_LEVELS: f32 = 127.0;
        pub const Q8_OFFSET: f32 = 0.0;
        #[inline(always)]
        pub fn q8_word(bytes: u32) -> u32 {
            bytes
        }
        pub const Q8_TILE: (usize, usize) = (4, 1);
        /// # Safety
        /// `p` is valid for reading LANES words.
        #[inline(always)]
        pub unsafe fn q8_load(p: *const f32) -> Q8Weights {
            // SAFETY: as the caller promises.
            unsafe { std::ptr::read_unaligned(p as *const Q8Weights) }
        }
        /// # Safety
        /// Reads nothing: without the offset, blocks start from zero.
        #[inline(always)]
        pub unsafe fn q8_init(_correction: *const f32) -> I {
            [0; LANES]
        }
        /// # Safety
        /// `x` is valid for reading.
        #[inline(always)]
        pub unsafe fn q8_splat(x: *const u32) -> u32 {
            // SAFETY: as the caller promises.
            unsafe { x.read() }
        }
        #[inline(always)]
        pub fn q8_dot(acc: I, x: u32, w: Q8Weights) -> I {
            let x = x.to_le_bytes();
            std::array::from_fn(|l| {
                let w = w[l].to_le_bytes();
                (0..4).fold(acc[l], |a, j| a + x[j] as i8 as i32 * w[j] as i8 as i32)
            })
        }
        #[inline(always)]
        pub fn q8_to_f32(i: I) -> F {
            i.map(|v| v as f32)
        }
        /// The largest magnitude of a block (plain comparisons, as the vector sets' max).
        #[inline(always)]
        pub fn q8_max(values: &[f32; 32]) -> f32 {
            values
                .iter()
                .fold(0.0f32, |m, &v| if v.abs() > m { v.abs() } else { m })
        }
        /// The low bytes of the bits of `v * inverse + shift` for a block.
        #[inline(always)]
        pub fn q8_bytes(values: &[f32; 32], inverse: f32, shift: f32) -> [u8; 32] {
            std::array::from_fn(|i| (values[i] * inverse + shift).to_bits() as u8)
        }
    }
    macro_rules! instance_features {
        ($($item:tt)*) => { $($item)* };
    }
    include!("cpu_kernels/body.rs");
    include!("cpu_kernels/winograd.rs");
    entries!(inline);
}

/// The kernels ggml calls (`cpu_ops.rs`), each running the instance of [`kernel_set`].
macro_rules! dispatch {
    ($($name:ident)*) => {
        $(
            pub(super) fn $name(
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                run_in!(kernel_set(), $name(srcs, out, ne, units, param))
            }
        )*
    };
}

dispatch!(conv_same_planes_bf16 gelu_erf_rows bilinear_align_corners_planes
    concat_rows transpose_rows attention_tokens attention_tokens_bf16 layer_norm_rows);

/// The kernels ggml calls that may run int8 products (`$int8(srcs)` says whether a call
/// does): as [`dispatch!`]'s, except that the int8 products of the AVX2 set take 7-bit
/// activations where [`int8_activation_bits`] says so.
macro_rules! dispatch_int8 {
    ($int8:expr; $($name:ident)*) => {
        $(
            pub(super) fn $name(
                srcs: &[Src<'_>],
                out: &mut [f32],
                ne: [usize; 4],
                units: Range<usize>,
                param: f32,
            ) {
                #[cfg(target_arch = "x86_64")]
                if $int8(srcs) && int8_activation_bits() == 7 {
                    // SAFETY: int8_activation_bits() is 7 only in the AVX2 set, which
                    // kernel_set() gives only where the CPU has avx2, fma and f16c, the
                    // features of this instance.
                    return unsafe { avx2_int7::run::$name(srcs, out, ne, units, param) };
                }
                run_in!(kernel_set(), $name(srcs, out, ne, units, param))
            }
        )*
    };
}

// Linear layers take int8 products for weights packed for them; attention's int8 kernel
// always does.
dispatch_int8!(|srcs: &[Src<'_>]| srcs[0].dtype == DType::I8;
    linear_bias_rows linear_bias_gelu_rows linear_scaled_residual_rows);
dispatch_int8!(|_: &[Src<'_>]| true; attention_tokens_int8);

/// Part `part` of `parts` of `data`, asked into the L2 cache ahead of its use: a linear
/// layer reads its weight once per image, from memory, and the hardware prefetchers stop at
/// every 4 KB page, so the first group of rows to meet a panel waited for it line by line.
/// A hint: it never faults and changes no result.
#[inline(always)]
fn prefetch_part<T>(data: &[T], part: usize, parts: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        const LINE: usize = 64;
        let bytes = std::mem::size_of_val(data);
        let chunk = bytes.div_ceil(parts.max(1)).next_multiple_of(LINE);
        let start = (part * chunk).min(bytes);
        let end = (start + chunk).min(bytes);
        // Whole lines from the one holding byte `start`: `data` need not start on a line, and
        // steps from an unaligned start would miss the part's last line.
        let at_start = (data.as_ptr() as *const u8).wrapping_add(start);
        let misaligned = at_start as usize % LINE;
        let first_line = at_start.wrapping_sub(misaligned);
        let lines = if start < end {
            (end - start + misaligned).div_ceil(LINE)
        } else {
            0
        };
        for line in 0..lines {
            // SAFETY: the address is built with wrapping arithmetic and never dereferenced
            // (the first line may begin up to LINE - 1 bytes before the part, the line of its
            // first byte); a prefetch reads nothing architecturally and cannot fault (SSE,
            // part of x86-64's baseline).
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
                _mm_prefetch::<_MM_HINT_T1>(first_line.wrapping_add(line * LINE) as *const i8);
            }
        }
    }
    // Elsewhere the hardware's prefetchers are all there is.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (data, part, parts);
}

/// The two bf16 values of a word, as f32.
#[inline(always)]
fn bf16_unpack(w: u32) -> [f32; 2] {
    [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
}

/// A matrix-product weight `w` (`n` rows of `k` values, ggml's [k, n]) as panels: `n / PANEL`
/// blocks of [k][PANEL], so that the kernel reads one row of a panel with whole vectors.
pub(super) fn pack_panels(w: &[f32], k: usize, n: usize) -> Vec<f32> {
    let mut packed = vec![0.0; k * n];
    for (p, panel) in packed.chunks_exact_mut(k * PANEL).enumerate() {
        for (i, row) in panel.chunks_exact_mut(PANEL).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = w[(p * PANEL + j) * k + i];
            }
        }
    }
    packed
}

/// Weights per block of a q8_0 row (and of the int8 products' quantised inputs).
pub(super) const Q8_BLOCK: usize = 32;
/// Words per (panel, block) of a weight packed for int8 products ([`pack_panels_q8`]): the
/// block's bytes as 8 rows of PANEL words (four consecutive inputs each), then the PANEL
/// scales (f32), then the PANEL offset corrections (i32, `-128 Σ w` over the block).
pub(super) const Q8_RECORD: usize = 8 * PANEL + 2 * PANEL;
/// Where a record's scales and corrections start.
const Q8_SCALES: usize = 8 * PANEL;
const Q8_CORRECTIONS: usize = 9 * PANEL;

/// A q8_0 matrix (`n` rows of `k` values in ggml's blocks: an f16 scale, then 32 signed
/// bytes) packed for the int8 products: `n / PANEL` panels of `k / 32` records
/// ([`Q8_RECORD`] words each). The values are kept exactly; only the layout changes.
pub(super) fn pack_panels_q8(q8: &[u8], k: usize, n: usize) -> Vec<u32> {
    const BLOCK_BYTES: usize = 2 + Q8_BLOCK;
    let blocks = k / Q8_BLOCK;
    let mut packed = vec![0u32; n / PANEL * blocks * Q8_RECORD];
    for (i, record) in packed.chunks_exact_mut(Q8_RECORD).enumerate() {
        let (p, b) = (i / blocks, i % blocks);
        for c in 0..PANEL {
            let block = &q8[((p * PANEL + c) * blocks + b) * BLOCK_BYTES..][..BLOCK_BYTES];
            let scale = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            let quants = block[2..].try_into().expect("a block's bytes");
            q8_record_column(c, quants, scale, true, |i, word| record[i] = word);
        }
    }
    packed
}

/// Column `column` of a record of the int8 products' packing ([`Q8_RECORD`]): a block's 32
/// signed bytes (`quants`), its scale and its offset correction, each word handed to `put`
/// with its place in the record. The one place that knows a record's layout, for the weights
/// packed at load ([`pack_panels_q8`]) and the queries and values that attention packs as it
/// runs. The correction undoes the offset that sets taking unsigned activations add to them
/// (`-128 Σ w`); `offset_activations` false writes zero, for activations that are unsigned
/// bytes as they are (attention's probabilities, 0..127 in every set).
#[inline(always)]
pub(super) fn q8_record_column(
    column: usize,
    quants: &[u8; Q8_BLOCK],
    scale: f32,
    offset_activations: bool,
    mut put: impl FnMut(usize, u32),
) {
    for (q, quad) in quants.chunks_exact(4).enumerate() {
        put(
            q * PANEL + column,
            u32::from_le_bytes([quad[0], quad[1], quad[2], quad[3]]),
        );
    }
    let sum: i32 = quants.iter().map(|&v| v as i8 as i32).sum();
    put(Q8_SCALES + column, scale.to_bits());
    let correction = if offset_activations { -128 * sum } else { 0 };
    put(Q8_CORRECTIONS + column, correction as u32);
}

/// f32 to bf16, rounding to nearest even (the weights and inputs of bf16 products are finite).
#[inline(always)]
fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// `src` as bf16 pairs into `dst` (`dst[i]` = (src[2i], src[2i + 1]), zero past the end):
/// the same bits as converting the values in order, written word by word. Branch-free over
/// whole pairs, so the loop vectorises.
#[inline(always)]
pub(super) fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
    let whole = src.len() / 2;
    for (w, pair) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *w = bf16_bits(pair[0]) | bf16_bits(pair[1]) << 16;
    }
    if let (Some(w), [.., last]) = (dst.get_mut(whole), src) {
        if src.len() % 2 == 1 {
            *w = bf16_bits(*last);
        }
    }
}

/// Two values as one word of bf16 pairs: `lo` in the low half, as `vdpbf16ps` pairs them.
#[inline(always)]
fn bf16_pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | bf16_bits(hi) << 16
}

/// [`pack_panels`] in bf16 for an even `k`: `n / PANEL` blocks of [k / 2][PANEL] words, each
/// the pair (w[j][2i], w[j][2i + 1]).
pub(super) fn pack_panels_bf16(w: &[f32], k: usize, n: usize) -> Vec<i32> {
    let k2 = k / 2;
    let mut packed = vec![0; k2 * n];
    for (p, panel) in packed.chunks_exact_mut(k2 * PANEL).enumerate() {
        for (i, row) in panel.chunks_exact_mut(PANEL).enumerate() {
            for (c, word) in row.iter_mut().enumerate() {
                let j = p * PANEL + c;
                *word = bf16_pair(w[j * k + 2 * i], w[j * k + 2 * i + 1]) as i32;
            }
        }
    }
    packed
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn bf16_products_only_where_they_pay_unless_asked() {
        use super::bf16_decision as d;
        assert!(d(Some("AuthenticAMD"), None));
        assert!(!d(Some("GenuineIntel"), None));
        assert!(!d(None, None));
        assert!(d(Some("GenuineIntel"), Some("on")));
        assert!(!d(Some("AuthenticAMD"), Some("off")));
        assert!(d(Some("AuthenticAMD"), Some("nonsense")));
        // This machine's vendor string reads as one of the known ones, twelve characters.
        #[cfg(target_arch = "x86_64")]
        assert_eq!(super::cpu_vendor().map(|v| v.len()), Some(12));
    }

    #[test]
    fn seven_bit_activations_only_in_the_avx2_set_unless_asked() {
        use super::int8_bits_decision as d;
        assert_eq!(d(KernelSet::Avx2, None), 7);
        assert_eq!(d(KernelSet::Avx2, Some("7")), 7);
        assert_eq!(d(KernelSet::Avx2, Some("nonsense")), 7);
        assert_eq!(d(KernelSet::Avx2, Some("8")), 8);
        // The VNNI sets multiply 8-bit activations at full speed; the portable one is exact.
        for set in [
            KernelSet::Avx512Bf16,
            KernelSet::Avx2Vnni,
            KernelSet::Portable,
        ] {
            assert_eq!(d(set, None), 8);
            assert_eq!(d(set, Some("7")), 8);
        }
    }

    /// Softmax's `exp` (every instance shares the portable one's arithmetic): within 2 ulp of
    /// f64's down to the flush threshold, exactly 0 below it, never subnormal.
    #[test]
    fn exp_is_accurate_and_flushes_before_subnormals() {
        let mut x = 0.0f32;
        while x > -90.0 {
            let ours = super::portable::exp_for_tests(x);
            if x < -60.0 {
                assert_eq!(ours, 0.0, "exp({x})");
            } else {
                let exact = (x as f64).exp() as f32;
                let ulps = (ours.to_bits() as i64 - exact.to_bits() as i64).abs();
                assert!(ulps <= 2, "exp({x}) = {ours}, exact {exact}: {ulps} ulp");
            }
            assert!(
                ours == 0.0 || ours.is_normal(),
                "exp({x}) = {ours} is subnormal"
            );
            x -= 0.0137;
        }
    }

    /// The vector 2^t of the AVX-512 set (rounding and scaling by `vroundscaleps` and
    /// `vscalefps`) and of the AVX2 one (`vroundps`, exponent bits) equal the formula lane by
    /// lane, bit for bit, from 0 past the clamp, ties of the rounding (t = -0.5, -1.5, ...)
    /// and a NaN (the clamp's -100) included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_exp2_equals_the_formula() {
        let avx512 = KernelSet::detect() == KernelSet::Avx512Bf16;
        let avx2 = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c");
        let mut t = 0.0f32;
        let mut step = 0;
        while t > -130.0 {
            let lanes: [f32; 16] = std::array::from_fn(|i| match i {
                15 if step == 3 => f32::NAN,
                14 => t.floor() - 0.5,
                _ => t - i as f32 * 0.0371,
            });
            // (inputs, vector, formula) per vector of each set.
            let mut results: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = Vec::new();
            if avx512 {
                // SAFETY: the CPU has the AVX-512 set's features (detected above).
                let (v, f) = unsafe { super::avx512::exp2_lanes_for_tests(lanes) };
                results.push((lanes.to_vec(), v.to_vec(), f.to_vec()));
            }
            if avx2 {
                for half in lanes.chunks_exact(8) {
                    // SAFETY: the CPU has the AVX2 set's features (detected above).
                    let (v, f) =
                        unsafe { super::avx2::exp2_lanes_for_tests(half.try_into().unwrap()) };
                    results.push((half.to_vec(), v.to_vec(), f.to_vec()));
                }
            }
            for (inputs, vector, formula) in results {
                for ((v, f), t) in vector.iter().zip(&formula).zip(&inputs) {
                    assert_eq!(v.to_bits(), f.to_bits(), "2^{t}: {v} against {f}");
                }
            }
            step += 1;
            t -= 0.59;
        }
    }

    /// The f32 attention's 2^t: within 5e-7 (4 ulp) of f64's down to the clamp at -100, 2^-100
    /// below it, never subnormal; exactly 1 at 0 (the row's largest score).
    #[test]
    fn softmax_exp2_is_accurate_and_clamped() {
        let mut t = 0.0f32;
        while t > -130.0 {
            let ours = super::portable::exp2_softmax_for_tests(t) as f64;
            let exact = 2f64.powf((t as f64).max(-100.0));
            assert!(
                (ours / exact - 1.0).abs() < 5e-7,
                "2^{t} = {ours}, exact {exact}"
            );
            assert!((ours as f32).is_normal(), "2^{t} = {ours} is subnormal");
            t -= 0.0173;
        }
        assert_eq!(super::portable::exp2_softmax_for_tests(0.0), 1.0);
    }

    /// A kernel entry point (every instance's have this type).
    type Entry = fn(&[Src<'_>], &mut [f32], [usize; 4], Range<usize>, f32);

    /// The f32 and bf16 entry points of each instance this CPU runs: the portable one always
    /// (its bf16 products multiply lane by lane), so the bf16 kernels' packing is checked on
    /// every machine, not only on those with AVX512_BF16.
    fn instances() -> Vec<(&'static str, [Entry; 6])> {
        let mut sets: Vec<(&'static str, [Entry; 6])> = vec![(
            "portable",
            [
                super::portable::run::attention_tokens,
                super::portable::run::attention_tokens_bf16,
                super::portable::run::conv_same_planes,
                super::portable::run::conv_same_planes_bf16,
                super::portable::run::linear_bias_rows,
                super::portable::run::linear_bias_rows,
            ],
        )];
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() != KernelSet::Portable {
            sets.push((
                "avx2",
                [
                    avx2_attention,
                    avx2_attention_bf16,
                    avx2_conv,
                    avx2_conv_bf16,
                    avx2_linear,
                    avx2_linear,
                ],
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx2_vnni_detected() {
            sets.push((
                "avx2vnni",
                [
                    avx2vnni_attention,
                    avx2vnni_attention_bf16,
                    avx2vnni_conv,
                    avx2vnni_conv_bf16,
                    avx2vnni_linear,
                    avx2vnni_linear,
                ],
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() == KernelSet::Avx512Bf16 {
            sets.push((
                "avx512bf16",
                [
                    avx512_attention,
                    avx512_attention_bf16,
                    avx512_conv,
                    avx512_conv_bf16,
                    avx512_linear,
                    avx512_linear,
                ],
            ));
        }
        sets
    }

    /// Safe entry points to the x86 instances, for [`instances`], which offers each only
    /// where the CPU has its features.
    #[cfg(target_arch = "x86_64")]
    macro_rules! x86_entries {
        ($($name:ident = $module:ident::$kernel:ident;)*) => {
            $(
                fn $name(srcs: &[Src<'_>], out: &mut [f32], ne: [usize; 4], units: Range<usize>, param: f32) {
                    // SAFETY: `instances` and `convolution_instances` list this entry only
                    // where the CPU has the features its instance is compiled for
                    // (KernelSet::detect, avx2_vnni_detected).
                    unsafe { super::$module::run::$kernel(srcs, out, ne, units, param) }
                }
            )*
        };
    }
    #[cfg(target_arch = "x86_64")]
    x86_entries! {
        avx2_attention = avx2::attention_tokens;
        avx2_attention_bf16 = avx2::attention_tokens_bf16;
        avx2_conv = avx2::conv_same_planes;
        avx2_conv_bf16 = avx2::conv_same_planes_bf16;
        avx2_linear = avx2::linear_bias_rows;
        avx2vnni_attention = avx2vnni::attention_tokens;
        avx2vnni_attention_bf16 = avx2vnni::attention_tokens_bf16;
        avx2vnni_conv = avx2vnni::conv_same_planes;
        avx2vnni_conv_bf16 = avx2vnni::conv_same_planes_bf16;
        avx2vnni_linear = avx2vnni::linear_bias_rows;
        avx512_attention = avx512::attention_tokens;
        avx512_attention_bf16 = avx512::attention_tokens_bf16;
        avx512_conv = avx512::conv_same_planes;
        avx512_conv_bf16 = avx512::conv_same_planes_bf16;
        avx512_linear = avx512::linear_bias_rows;
        avx2_linear_gelu = avx2::linear_bias_gelu_rows;
        avx2vnni_linear_gelu = avx2vnni::linear_bias_gelu_rows;
        avx512_linear_gelu = avx512::linear_bias_gelu_rows;
        avx2_linear_residual = avx2::linear_scaled_residual_rows;
        avx2vnni_linear_residual = avx2vnni::linear_scaled_residual_rows;
        avx512_linear_residual = avx512::linear_scaled_residual_rows;
        avx2_gelu = avx2::gelu_erf_rows;
        avx2vnni_gelu = avx2vnni::gelu_erf_rows;
        avx512_gelu = avx512::gelu_erf_rows;
        avx2_conv_direct = avx2::conv_direct_planes;
        avx2vnni_conv_direct = avx2vnni::conv_direct_planes;
        avx512_conv_direct = avx512::conv_direct_planes;
        avx2_conv_winograd = avx2::conv_winograd_planes;
        avx2_attention_int8 = avx2::attention_tokens_int8;
        avx2int7_attention_int8 = avx2_int7::attention_tokens_int8;
        avx2vnni_attention_int8 = avx2vnni::attention_tokens_int8;
        avx512_attention_int8 = avx512::attention_tokens_int8;
        avx2vnni_conv_winograd = avx2vnni::conv_winograd_planes;
        avx512_conv_winograd = avx512::conv_winograd_planes;
    }

    /// Each instance's linear layers (bias, bias and GELU, scaled residual) and its
    /// standalone GELU.
    fn linear_instances() -> Vec<(&'static str, [Entry; 4])> {
        use super::portable::run as portable;
        let mut sets: Vec<(&'static str, [Entry; 4])> = vec![(
            "portable",
            [
                portable::linear_bias_rows,
                portable::linear_bias_gelu_rows,
                portable::linear_scaled_residual_rows,
                portable::gelu_erf_rows,
            ],
        )];
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() != KernelSet::Portable {
            let entries = [
                avx2_linear,
                avx2_linear_gelu,
                avx2_linear_residual,
                avx2_gelu,
            ];
            sets.push(("avx2", entries));
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx2_vnni_detected() {
            sets.push((
                "avx2vnni",
                [
                    avx2vnni_linear,
                    avx2vnni_linear_gelu,
                    avx2vnni_linear_residual,
                    avx2vnni_gelu,
                ],
            ));
        }
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() == KernelSet::Avx512Bf16 {
            sets.push((
                "avx512bf16",
                [
                    avx512_linear,
                    avx512_linear_gelu,
                    avx512_linear_residual,
                    avx512_gelu,
                ],
            ));
        }
        sets
    }

    /// A linear layer's operands for the kernels: `panels` (f32 words, of `dtype`, `ne`,
    /// `nb`), the input x [kd, t], bias, scale [n] and a residual [n, t] whose rows lie
    /// `n + 5` apart (so that its row stride, not n, is what the epilogue must use).
    struct LinearCase {
        panels: Vec<f32>,
        dtype: DType,
        panel_ne: [usize; 4],
        panel_nb: Option<[usize; 4]>,
        x: Vec<f32>,
        b: Vec<f32>,
        scale: Vec<f32>,
        residual: Vec<f32>,
        kd: usize,
        n: usize,
        t: usize,
    }

    impl LinearCase {
        fn new(kd: usize, n: usize, t: usize, panels: Vec<f32>, dtype: DType) -> LinearCase {
            let depth = if dtype == DType::I32 { kd / 2 } else { kd };
            LinearCase {
                panels,
                dtype,
                panel_ne: [PANEL, depth, n / PANEL, 1],
                panel_nb: None,
                x: values(kd * t, 22),
                b: values(n, 23),
                scale: values(n, 24),
                residual: values((n + 5) * t, 25),
                kd,
                n,
                t,
            }
        }

        /// The sources of the scaled-residual entry; the others take the first three.
        fn srcs(&self) -> [Src<'_>; 5] {
            let mut panels = src(&self.panels, self.panel_ne);
            panels.dtype = self.dtype;
            if let Some(nb) = self.panel_nb {
                panels.nb = nb;
            }
            let mut residual = src(&self.residual, [self.n, self.t, 1, 1]);
            residual.nb = [1, self.n + 5, (self.n + 5) * self.t, (self.n + 5) * self.t];
            [
                panels,
                src(&self.x, [self.kd, self.t, 1, 1]),
                src(&self.b, [self.n, 1, 1, 1]),
                src(&self.scale, [self.n, 1, 1, 1]),
                residual,
            ]
        }

        /// One instance's plain product of `rows`, after checking that its fused GELU equals
        /// the plain product followed by the standalone GELU kernel, and its fused scaled
        /// residual `y * scale + residual` in the instance's own rounding (one FMA; plain
        /// arithmetic only in a portable build without FMA), both bit for bit.
        fn product_checking_epilogues(
            &self,
            set: &str,
            [plain, gelu, scaled_residual, gelu_alone]: [Entry; 4],
            rows: Range<usize>,
        ) -> Vec<f32> {
            let (n, srcs) = (self.n, self.srcs());
            let ne = [n, self.t, 1, 1];
            let out_len = n * rows.len();
            let what = format!("{set} {:?} {}x{n}, rows {rows:?}", self.dtype, self.kd);
            let mut product = vec![f32::NAN; out_len];
            plain(&srcs[..3], &mut product, ne, rows.clone(), 0.0);
            assert!(product.iter().all(|y| y.is_finite()), "{what}");
            let mut fused = vec![f32::NAN; out_len];
            gelu(&srcs[..3], &mut fused, ne, rows.clone(), 0.0);
            let mut separate = vec![f32::NAN; out_len];
            let flat = [out_len, 1, 1, 1];
            gelu_alone(&[src(&product, flat)], &mut separate, flat, 0..1, 0.0);
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same(&fused, &separate),
                "{what}: fused GELU differs from the GELU kernel"
            );
            let fma =
                set != "portable" || cfg!(any(target_feature = "fma", target_arch = "aarch64"));
            let mut fused = vec![f32::NAN; out_len];
            scaled_residual(&srcs, &mut fused, ne, rows.clone(), 0.0);
            let want: Vec<f32> = product
                .chunks_exact(n)
                .enumerate()
                .flat_map(|(r, y)| {
                    let res = &self.residual[(rows.start + r) * (n + 5)..][..n];
                    (0..n).map(move |j| {
                        if fma {
                            y[j].mul_add(self.scale[j], res[j])
                        } else {
                            y[j] * self.scale[j] + res[j]
                        }
                    })
                })
                .collect();
            assert!(same(&fused, &want), "{what}: fused scaled residual differs");
            product
        }
    }

    /// Row ranges of a thread's share: past a row block (`LINEAR_ROW_BLOCK`, 192) ending in
    /// groups of 1, 2, 4 (the narrow tail tile with AVX-512's 12-row groups, a full tile with
    /// AVX2's 6) and 9 or 10 rows, inside one tile, and starting past 0.
    const LINEAR_ROWS: [Range<usize>; 6] = [3..205, 9..203, 0..196, 0..9, 0..2, 0..1];

    /// Every instance's f32 linear layer against sums in f64, over a depth that ends inside
    /// a slice of the panel (`LINEAR_DEPTH_BLOCK`, 192 steps) and an odd one (the packing's
    /// 4 x 4 transposes and their tail), for each of [`LINEAR_ROWS`]; its fused epilogues
    /// against the plain product (bit for bit, [`LinearCase::product_checking_epilogues`]).
    #[test]
    fn every_instance_linear_layers_match_f64_sums_and_their_epilogues() {
        for (kd, n) in [(450usize, 64usize), (7, 32)] {
            let weight = values(kd * n, 21);
            let case = LinearCase::new(kd, n, 205, pack_panels(&weight, kd, n), DType::F32);
            for (set, entries) in linear_instances() {
                for rows in LINEAR_ROWS {
                    let product = case.product_checking_epilogues(set, entries, rows.clone());
                    for (r, got) in product.chunks_exact(n).enumerate() {
                        let row = rows.start + r;
                        for (j, &got) in got.iter().enumerate() {
                            let sum: f64 = (0..kd)
                                .map(|i| {
                                    f64::from(case.x[row * kd + i]) * f64::from(weight[j * kd + i])
                                })
                                .sum::<f64>()
                                + f64::from(case.b[j]);
                            let bound = 1e-5 * (1.0 + sum.abs());
                            assert!(
                                (f64::from(got) - sum).abs() <= bound,
                                "{set} {kd}x{n}, row {row}, column {j}: {got} against {sum}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// The other panel kinds through the same row ranges and depth slices: f16 panels equal
    /// the f32 panels of the same rounded weight bit for bit; bf16 pairs (226 pairs, on
    /// vectors; 208 and 32, on AMX tiles where the CPU has them) stay within bf16 rounding of
    /// the f32 product; q8_0 panels (depths 416 and 64) within its rounding; each with its
    /// fused epilogues equal to the plain product's.
    #[test]
    fn every_instance_half_and_int8_linear_layers_keep_their_epilogues() {
        let n = 64;
        for kd in [452usize, 416, 64] {
            let weight = values(kd * n, 21);
            let rounded: Vec<f32> = weight
                .iter()
                .map(|&w| half::f16::from_f32(w).to_f32())
                .collect();
            let f32_case = LinearCase::new(kd, n, 205, pack_panels(&rounded, kd, n), DType::F32);
            let f16_words: Vec<f32> = pack_panels(&rounded, kd, n)
                .chunks(2)
                .map(|pair| {
                    let [lo, hi] = [pair[0], pair[1]].map(|w| half::f16::from_f32(w).to_bits());
                    f32::from_bits(u32::from(lo) | (u32::from(hi) << 16))
                })
                .collect();
            let f16_case = LinearCase::new(kd, n, 205, f16_words, DType::F16);
            let bf16_words: Vec<f32> = pack_panels_bf16(&weight, kd, n)
                .into_iter()
                .map(|w| f32::from_bits(w as u32))
                .collect();
            let bf16_case = LinearCase::new(kd, n, 205, bf16_words, DType::I32);
            // q8_0 rows are whole blocks of 32.
            let q8_case = kd.is_multiple_of(Q8_BLOCK).then(|| {
                let q8 = super::super::quant::quantize(DType::Q8_0, &weight, kd).unwrap();
                let words = pack_panels_q8(&q8, kd, n);
                let panels = words.iter().map(|&w| f32::from_bits(w)).collect();
                let mut case = LinearCase::new(kd, n, 205, panels, DType::I8);
                case.panel_ne = [Q8_RECORD * 4, kd / Q8_BLOCK, n / PANEL, 1];
                case.panel_nb = Some([1, Q8_RECORD, Q8_RECORD * kd / Q8_BLOCK, words.len()]);
                case
            });
            for (set, entries) in linear_instances() {
                for rows in LINEAR_ROWS {
                    let want = f32_case.product_checking_epilogues(set, entries, rows.clone());
                    let got = f16_case.product_checking_epilogues(set, entries, rows.clone());
                    assert_eq!(
                        max_abs_difference(&want, &got),
                        0.0,
                        "{set} f16 panels, depth {kd}, rows {rows:?}"
                    );
                    // Bounds relative to the largest result: a lost or repeated slice of
                    // the depth (a third of it or more) would miss by far more.
                    let largest = want.iter().fold(0.0f32, |m, y| m.max(y.abs()));
                    let rounded_cases = [
                        (Some(&bf16_case), 0.01 * largest),
                        (q8_case.as_ref(), 0.03 * largest),
                    ];
                    for (case, bound) in
                        rounded_cases.into_iter().filter_map(|(c, b)| Some((c?, b)))
                    {
                        let got = case.product_checking_epilogues(set, entries, rows.clone());
                        let diff = max_abs_difference(&want, &got);
                        assert!(
                            diff < bound,
                            "{set} {:?}, depth {kd}, rows {rows:?}: {diff} (largest {largest})",
                            case.dtype
                        );
                    }
                }
            }
        }
    }

    /// Winograd's F(4x4, 3x3) against the direct kernel, in every instance: images narrower
    /// than a tile, than a vector of tiles and wider than a block, heights that end inside a
    /// tile, one input channel and several, channel ranges that start past 0 and leave partial
    /// groups (what a thread's share is), with and without a bias.
    #[test]
    fn every_instance_winograd_matches_the_direct_convolution() {
        assert!(
            super::winograd_convolutions(),
            "DA3_WINOGRAD=off in the environment"
        );
        let shapes = [
            (1, 1, 1, 1),
            (3, 5, 2, 3),
            (17, 6, 3, 7),
            (33, 9, 8, 13),
            (70, 13, 5, 9),
            (203, 4, 4, 8),
        ];
        for (w, h, ic, oc) in shapes {
            let (kernel, input, bias) = (
                values(9 * ic * oc, 11),
                values(w * h * ic, 12),
                values(oc, 13),
            );
            let with_bias = [
                src(&kernel, [3, 3, ic, oc]),
                src(&input, [w, h, ic, 1]),
                src(&bias, [oc, 1, 1, 1]),
            ];
            for srcs in [&with_bias[..], &with_bias[..2]] {
                for channels in [0..oc, oc / 3..oc] {
                    let ne = [w, h, oc, 1];
                    let run = |entry: Entry| {
                        let mut out = vec![f32::NAN; w * h * channels.len()];
                        entry(srcs, &mut out, ne, channels.clone(), 0.0);
                        out
                    };
                    for ConvEntries {
                        set,
                        winograd,
                        direct,
                        ..
                    } in convolution_instances()
                    {
                        let (fast, reference) = (run(winograd), run(direct));
                        assert!(reference.iter().all(|x| x.is_finite()));
                        // Relative to the largest output: F(4x4, 3x3)'s transforms round
                        // at about 1e-6 of it in f32 (the direct kernel at 1e-7).
                        let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
                        let diff = max_abs_difference(&reference, &fast) / largest;
                        assert!(
                            diff < 1e-5,
                            "{set}: {w}x{h} {ic}->{oc}, channels {channels:?}, bias {}: {diff}",
                            srcs.len() == 3
                        );
                    }
                }
            }
        }
    }

    /// A band entry point (every instance's Winograd by rows has this type).
    type BandEntry = fn(&[Src<'_>], &mut PlaneRows<'_>, [usize; 4], f32);

    /// One instance's convolution entry points, for the tests that compare them.
    struct ConvEntries {
        set: &'static str,
        /// Winograd over whole planes, whatever the map's size.
        winograd: Entry,
        /// The direct kernel over whole planes.
        direct: Entry,
        /// Winograd by bands of rows.
        winograd_rows: BandEntry,
    }

    /// The convolution entry points of every instance this CPU runs.
    fn convolution_instances() -> Vec<ConvEntries> {
        let mut sets = vec![ConvEntries {
            set: "portable",
            winograd: super::portable::run::conv_winograd_planes,
            direct: super::portable::run::conv_direct_planes,
            winograd_rows: super::portable::run::conv_winograd_rows,
        }];
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() != KernelSet::Portable {
            sets.push(ConvEntries {
                set: "avx2",
                winograd: avx2_conv_winograd,
                direct: avx2_conv_direct,
                winograd_rows: avx2_winograd_rows,
            });
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx2_vnni_detected() {
            sets.push(ConvEntries {
                set: "avx2vnni",
                winograd: avx2vnni_conv_winograd,
                direct: avx2vnni_conv_direct,
                winograd_rows: avx2vnni_winograd_rows,
            });
        }
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() == KernelSet::Avx512Bf16 {
            sets.push(ConvEntries {
                set: "avx512bf16",
                winograd: avx512_conv_winograd,
                direct: avx512_conv_direct,
                winograd_rows: avx512_winograd_rows,
            });
        }
        sets
    }

    /// Safe entry points to the x86 instances' band kernels, as [`x86_entries`].
    #[cfg(target_arch = "x86_64")]
    macro_rules! x86_band_entries {
        ($($name:ident = $module:ident::$kernel:ident;)*) => {
            $(
                fn $name(srcs: &[Src<'_>], out: &mut PlaneRows<'_>, ne: [usize; 4], param: f32) {
                    // SAFETY: `convolution_instances` lists this entry only where the CPU
                    // has the features its instance is compiled for.
                    unsafe { super::$module::run::$kernel(srcs, out, ne, param) }
                }
            )*
        };
    }
    #[cfg(target_arch = "x86_64")]
    x86_band_entries! {
        avx2_winograd_rows = avx2::conv_winograd_rows;
        avx2vnni_winograd_rows = avx2vnni::conv_winograd_rows;
        avx512_winograd_rows = avx512::conv_winograd_rows;
    }

    /// Winograd by bands of rows, as threads share a map, writes exactly its band's rows of
    /// every output channel, each equal to the same rows computed over whole planes: bands of
    /// one and of several tile rows, a last band ending inside a tile row at the map's foot,
    /// an empty band past it, in every instance.
    #[test]
    fn every_instance_winograd_bands_write_their_rows_as_over_whole_planes() {
        for (w, h, ic, oc) in [(70, 13, 5, 9), (33, 22, 8, 13), (130, 9, 3, 4)] {
            let (kernel, input, bias) = (
                values(9 * ic * oc, 31),
                values(w * h * ic, 32),
                values(oc, 33),
            );
            let srcs = [
                src(&kernel, [3, 3, ic, oc]),
                src(&input, [w, h, ic, 1]),
                src(&bias, [oc, 1, 1, 1]),
            ];
            let ne = [w, h, oc, 1];
            let bands = [0..4, 4..12, 12..h.next_multiple_of(4), h..h + 8];
            for conv in convolution_instances() {
                let (set, by_rows, over_planes) = (conv.set, conv.winograd_rows, conv.winograd);
                let mut want = vec![f32::NAN; w * h * oc];
                over_planes(&srcs, &mut want, ne, 0..oc, 0.0);
                for band in &bands {
                    let mut got = vec![f32::NAN; w * h * oc];
                    let mut out = PlaneRows::whole(&mut got, [w, h, oc]).narrowed(band.clone());
                    by_rows(&srcs, &mut out, ne, 0.0);
                    for (i, (g, x)) in got.iter().zip(&want).enumerate() {
                        let y = i / w % h;
                        if band.contains(&y) {
                            assert_eq!(
                                g.to_bits(),
                                x.to_bits(),
                                "{set} {w}x{h}, band {band:?}, value {i}"
                            );
                        } else {
                            assert!(g.is_nan(), "{set} {w}x{h}: band {band:?} wrote row {y}");
                        }
                    }
                }
            }
        }
    }

    /// Scratch vectors carry what the last kernel left (`Scratch`): no stale value reaches a
    /// result. Every instance's Winograd by rows (input through ReLU) and f32 attention (13
    /// queries: a partial vector, whose rows past the last read stale columns and are
    /// dropped) give the same bits with empty scratch slots and with slots full of NaN.
    #[test]
    fn stale_scratch_never_reaches_a_result() {
        fn fill_slots(x: Option<f32>) {
            for slot in [&SCRATCH_0, &SCRATCH_1, &SCRATCH_2, &SCRATCH_3] {
                slot.set(x.map_or_else(Vec::new, |x| vec![x; 1 << 22]));
            }
        }
        for (w, h, ic, oc) in [(70, 13, 6, 9), (130, 9, 3, 4), (33, 22, 8, 13)] {
            let (kernel, input, bias) = (
                values(9 * ic * oc, 41),
                values(w * h * ic, 42),
                values(oc, 43),
            );
            let srcs = [
                src(&kernel, [3, 3, ic, oc]),
                src(&input, [w, h, ic, 1]),
                src(&bias, [oc, 1, 1, 1]),
            ];
            for conv in convolution_instances() {
                let (set, by_rows) = (conv.set, conv.winograd_rows);
                let run = || {
                    let mut out = vec![0.0; w * h * oc];
                    by_rows(
                        &srcs,
                        &mut PlaneRows::whole(&mut out, [w, h, oc]),
                        [w, h, oc, 1],
                        1.0,
                    );
                    out
                };
                fill_slots(None);
                let clean = run();
                fill_slots(Some(f32::NAN));
                let stale = run();
                let same = clean
                    .iter()
                    .zip(&stale)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{set}: Winograd {w}x{h} {ic} -> {oc}");
            }
        }
        let (d, tq, tk, heads) = (64, 13, 300, 2);
        let (q, k, v) = (
            values(d * tq * heads, 44),
            values(d * tk * heads, 45),
            values(d * tk * heads, 46),
        );
        let srcs = [
            src(&q, [d, tq, heads, 1]),
            src(&k, [d, tk, heads, 1]),
            src(&v, [d, tk, heads, 1]),
        ];
        for (set, [attention, ..]) in instances() {
            let run = || {
                let mut out = vec![0.0; d * heads * tq];
                attention(&srcs, &mut out, [d, heads, tq, 1], 0..tq, 0.0);
                out
            };
            fill_slots(None);
            let clean = run();
            fill_slots(Some(f32::NAN));
            let stale = run();
            let same = clean
                .iter()
                .zip(&stale)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{set}: attention");
        }
        fill_slots(None);
    }

    /// The convolution entry runs Winograd only on maps of at least `WINO_MIN_TILES` tiles
    /// (here 130x40: 330 or more once rows are padded to vectors) and the direct kernel on
    /// smaller ones (17x6: 5 to 16), where transforming the kernels costs more than it saves.
    #[test]
    fn convolutions_take_winograd_only_on_large_maps() {
        let (ic, oc) = (3, 5);
        let kernel = values(9 * ic * oc, 21);
        for (w, h, large) in [(17, 6, false), (130, 40, true)] {
            let input = values(w * h * ic, 22);
            let srcs = [src(&kernel, [3, 3, ic, oc]), src(&input, [w, h, ic, 1])];
            let run = |entry: Entry| {
                let mut out = vec![f32::NAN; w * h * oc];
                entry(&srcs, &mut out, [w, h, oc, 1], 0..oc, 0.0);
                out
            };
            let same = run(super::portable::run::conv_same_planes);
            let (winograd, direct) = (
                run(super::portable::run::conv_winograd_planes),
                run(super::portable::run::conv_direct_planes),
            );
            assert_ne!(
                winograd, direct,
                "the two must differ in rounding to tell them apart"
            );
            assert_eq!(same, if large { winograd } else { direct }, "{w}x{h}");
        }
    }

    /// Values in [-1, 1) from a seed: [`super::super::cpu_ops::tests::values`] halved.
    fn values(n: usize, seed: u32) -> Vec<f32> {
        let values = super::super::cpu_ops::tests::values(n, seed);
        values.into_iter().map(|x| 0.5 * x).collect()
    }

    /// A contiguous f32 operand of shape `ne` over `data`.
    fn src(data: &[f32], ne: [usize; 4]) -> Src<'_> {
        let nb = [1, ne[0], ne[0] * ne[1], ne[0] * ne[1] * ne[2]];
        Src {
            data,
            ne,
            nb,
            dtype: DType::F32,
        }
    }

    use super::super::cpu_ops::tests::max_abs_difference;

    /// One kernel's operands (for its f32 and its bf16 entry), output shape, units and the
    /// bound of its bf16 difference.
    struct Case<'a> {
        what: &'static str,
        srcs: &'a [Src<'a>],
        srcs_bf16: &'a [Src<'a>],
        ne: [usize; 4],
        units: usize,
        bound: f32,
    }

    /// The int8 products of every instance on 8-bit activations agree with the portable ones
    /// (whose integer sums are plain arithmetic): the offset bytes and corrections of
    /// `vpdpbusd`, the bytes widened to pairs of i16 for `vpmaddwd` and the portable sums
    /// give the same integers, scaled alike; 11 rows leave a partial group in every set's
    /// tile. Weights of -128 (which ggml's quantiser never writes, but a file may hold)
    /// included. (The 7-bit instance: `seven_bit_int8_products_are_their_definition`.)
    #[test]
    fn every_instance_computes_the_same_int8_products() {
        let (k, n, t) = (128, 2 * PANEL, 11);
        let weight = values(k * n, 21);
        let mut q8 = super::super::quant::quantize(DType::Q8_0, &weight, k).unwrap();
        // Byte 5 of the first block of rows 0 and 3 (after the f16 scale): -128.
        for row in [0, 3] {
            q8[row * (k / Q8_BLOCK) * 34 + 2 + 5] = 0x80;
        }
        let words = pack_panels_q8(&q8, k, n);
        let panels: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
        let (x, b) = (values(k * t, 22), values(n, 23));
        let mut srcs = [
            src(&panels, [Q8_RECORD * 4, k / Q8_BLOCK, n / PANEL, 1]),
            src(&x, [k, t, 1, 1]),
            src(&b, [n, 1, 1, 1]),
        ];
        srcs[0].dtype = DType::I8;
        srcs[0].nb = [1, Q8_RECORD, Q8_RECORD * k / Q8_BLOCK, words.len()];
        let ne = [n, t, 1, 1];
        let run = |entry: Entry| {
            let mut out = vec![f32::NAN; n * t];
            entry(&srcs, &mut out, ne, 0..t, 0.0);
            out
        };
        let sets = instances();
        let reference = run(sets[0].1[4]);
        // The f32 products of the weight's q8_0 values, to show that the int8 ones are that
        // product, within the rounding of the inputs to 8 bits.
        let dequantized: Vec<f32> = q8
            .chunks_exact(34)
            .flat_map(|block| {
                let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                block[2..].iter().map(move |&q| d * q as i8 as f32)
            })
            .collect();
        let exact: Vec<f32> = (0..t * n)
            .map(|i| {
                let (r, c) = (i / n, i % n);
                let w = &dequantized[c * k..][..k];
                b[c] + x[r * k..][..k]
                    .iter()
                    .zip(w)
                    .map(|(x, w)| x * w)
                    .sum::<f32>()
            })
            .collect();
        let off_exact = max_abs_difference(&reference, &exact);
        // Each input off by up to 1/254 of its block's largest: about 0.015 per sum of 128.
        assert!(off_exact < 0.1, "int8 products are {off_exact} from f32");
        for (set, entries) in &sets {
            let diff = max_abs_difference(&reference, &run(entries[4]));
            assert!(
                diff < 1e-5,
                "{set}: int8 products differ from portable by {diff}"
            );
        }
    }

    /// The 7-bit int8 instance computes what its definition says, to the last bit of f32: each
    /// block of 32 inputs quantised to `round_ties_even(x * 63 / max |x|)` with the scale
    /// `max / 63` rounded through f16, the exact integer sums with the weight's bytes (weights
    /// of -128 included: `vpmaddubsw` saturates beyond 32,767 and these reach 32,512), each
    /// scaled by the two scales into the f32 sum in block order. And that is the f32 product
    /// within the coarser rounding of the inputs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn seven_bit_int8_products_are_their_definition() {
        if KernelSet::detect() == KernelSet::Portable {
            eprintln!("no AVX2 on this CPU: the 7-bit instance cannot run here");
            return;
        }
        let (k, n, t) = (128, 2 * PANEL, 11);
        let weight = values(k * n, 21);
        let mut q8 = super::super::quant::quantize(DType::Q8_0, &weight, k).unwrap();
        // Byte 5 of the first block of rows 0 and 3 at -128, and inputs of row 0 that make
        // byte 4 and 5 of the first block +63: a pair of products of -32,512 after the offset.
        for row in [0, 3] {
            q8[row * (k / Q8_BLOCK) * 34 + 2 + 4] = 0x80;
            q8[row * (k / Q8_BLOCK) * 34 + 2 + 5] = 0x80;
        }
        let words = pack_panels_q8(&q8, k, n);
        let panels: Vec<f32> = words.iter().map(|&w| f32::from_bits(w)).collect();
        let (mut x, b) = (values(k * t, 22), values(n, 23));
        let largest = x[..Q8_BLOCK].iter().fold(0f32, |m, v| m.max(v.abs()));
        x[4] = largest;
        x[5] = largest;
        let mut srcs = [
            src(&panels, [Q8_RECORD * 4, k / Q8_BLOCK, n / PANEL, 1]),
            src(&x, [k, t, 1, 1]),
            src(&b, [n, 1, 1, 1]),
        ];
        srcs[0].dtype = DType::I8;
        srcs[0].nb = [1, Q8_RECORD, Q8_RECORD * k / Q8_BLOCK, words.len()];
        let mut got = vec![f32::NAN; n * t];
        // SAFETY: the CPU has AVX2, FMA and F16C (KernelSet::detect is not Portable).
        unsafe {
            super::avx2_int7::run::linear_bias_rows(&srcs, &mut got, [n, t, 1, 1], 0..t, 0.0)
        };
        let blocks: Vec<(f32, &[u8])> = q8
            .chunks_exact(34)
            .map(|block| {
                let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
                (d, &block[2..])
            })
            .collect();
        let mut want = vec![0f32; n * t];
        let mut exact = vec![0f32; n * t];
        for r in 0..t {
            let row = &x[r * k..][..k];
            for c in 0..n {
                let mut acc = b[c];
                for (bi, xs) in row.chunks_exact(Q8_BLOCK).enumerate() {
                    let max = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let inverse = if max != 0.0 { 63.0 / max } else { 0.0 };
                    let dx = half::f16::from_f32(max / 63.0).to_f32();
                    let (dw, ws) = blocks[c * k / Q8_BLOCK + bi];
                    let sum: i32 = xs
                        .iter()
                        .zip(ws)
                        .map(|(&v, &w)| (v * inverse).round_ties_even() as i32 * w as i8 as i32)
                        .sum();
                    acc = (sum as f32).mul_add(dw * dx, acc);
                }
                want[r * n + c] = acc;
                exact[r * n + c] = b[c]
                    + row
                        .iter()
                        .enumerate()
                        .map(|(i, v)| {
                            let (dw, ws) = blocks[c * k / Q8_BLOCK + i / Q8_BLOCK];
                            v * dw * ws[i % Q8_BLOCK] as i8 as f32
                        })
                        .sum::<f32>();
            }
        }
        let diff = max_abs_difference(&want, &got);
        assert!(
            diff < 1e-5,
            "7-bit int8 products are {diff} from their definition"
        );
        // Each input off by up to 1/126 of its block's largest: about 0.03 per sum of 128.
        let off_exact = max_abs_difference(&got, &exact);
        assert!(
            off_exact < 0.15,
            "7-bit int8 products are {off_exact} from f32"
        );
    }

    /// Convolutions whose taps fill AMX tiles (where the CPU has them, the AVX-512 instance
    /// computes these on the tiles): every instance's bf16 kernel agrees with the portable
    /// one, the same bf16 products summed in another order, over all the channels at once
    /// and split as two threads would take them (partial blocks of 32 channels), with rows
    /// of pixels that end in a partial block of 32.
    #[test]
    fn every_instance_computes_the_same_bf16_convolutions() {
        for (w, h, ic, oc, k) in [(37, 5, 32, 40, 3), (20, 3, 64, 16, 1)] {
            assert!(super::amx_convolution_fits([k, k, ic, oc]));
            let (kernel, input, bias) = (
                values(k * k * ic * oc, 11),
                values(w * h * ic, 12),
                values(oc, 13),
            );
            let srcs = [
                src(&kernel, [k, k, ic, oc]),
                src(&input, [w, h, ic, 1]),
                src(&bias, [oc, 1, 1, 1]),
            ];
            let ne = [w, h, oc, 1];
            let run = |entry: Entry, split: usize| {
                let mut out = vec![f32::NAN; w * h * oc];
                let (first, second) = out.split_at_mut(split * w * h);
                entry(&srcs, first, ne, 0..split, 0.0);
                entry(&srcs, second, ne, split..oc, 0.0);
                out
            };
            let sets = instances();
            let reference = run(sets[0].1[3], oc);
            assert!(reference.iter().all(|x| x.is_finite()));
            for (set, entries) in &sets {
                for split in [oc, oc * 3 / 5] {
                    let diff = max_abs_difference(&reference, &run(entries[3], split));
                    assert!(
                        diff < 1e-3,
                        "{set} {w}x{h}x{ic} -> {oc}, {k}x{k}, split at {split}: {diff}"
                    );
                }
            }
        }
    }

    /// f16 panels (CPUs without bf16 products) widen each weight exactly: every instance's
    /// product over them equals its product over f32 panels of the same f16-rounded weight.
    #[test]
    fn every_instance_multiplies_f16_panels_as_their_f32_values() {
        for (kd, n, t) in [(96usize, 64usize, 13usize), (40, 32, 70)] {
            let weight: Vec<f32> = values(kd * n, 11)
                .into_iter()
                .map(|w| half::f16::from_f32(w).to_f32())
                .collect();
            let panels = pack_panels(&weight, kd, n);
            // Two halves per f32 word of a source, in memory order.
            let panels_f16: Vec<f32> = panels
                .chunks(2)
                .map(|pair| {
                    let [lo, hi] = [pair[0], pair[1]].map(|w| half::f16::from_f32(w).to_bits());
                    f32::from_bits(u32::from(lo) | (u32::from(hi) << 16))
                })
                .collect();
            let (x, b) = (values(kd * t, 12), values(n, 13));
            let linear = [
                src(&panels, [PANEL, kd, n / PANEL, 1]),
                src(&x, [kd, t, 1, 1]),
                src(&b, [n, 1, 1, 1]),
            ];
            let mut linear_f16 = linear;
            linear_f16[0] = src(&panels_f16, [PANEL, kd, n / PANEL, 1]);
            linear_f16[0].dtype = DType::F16;
            for (set, entries) in instances() {
                let mut want = vec![f32::NAN; n * t];
                let mut got = vec![f32::NAN; n * t];
                entries[4](&linear, &mut want, [n, t, 1, 1], 0..t, 0.0);
                entries[4](&linear_f16, &mut got, [n, t, 1, 1], 0..t, 0.0);
                assert!(want.iter().all(|v| v.is_finite()), "{set}");
                let diff = max_abs_difference(&want, &got);
                assert!(
                    diff <= 1e-6,
                    "{set} {kd}x{n}x{t}: f16 panels differ by {diff}"
                );
            }
        }
    }

    /// Scores far below zero over key counts that leave the last group of keys partial: the
    /// f32 kernel shifts each query's scores by the largest score of the keys that exist. Were
    /// the zero rows that pad the last group counted, the shift would be 0, every probability
    /// would sit at the exponential's 2^-100 floor and the result would be the values' mean.
    /// Every instance against an f64 softmax.
    #[test]
    fn every_instance_attention_shifts_by_the_largest_real_score() {
        // 11 keys (groups of 8 + 3 or 6 + 5, by instance) and 3 queries (one vector, a tile's
        // tail); then 251 keys (a block of 240 and a partial one, whose last key scores
        // highest, so the second block rescales the first) and 100 queries (whole spans of
        // queries and a tail on every instance).
        for (tq, tk) in [(3, 11), (100, 251)] {
            let d = 16;
            // Key j scores -256 - 1.6 (tk - 1 - j) after the 1/4 scale: the last keys carry
            // nearly all the weight.
            let q = vec![8.0f32; d * tq];
            let k: Vec<f32> = (0..d * tk)
                .map(|i| -(8.0 + 0.05 * (tk - 1 - i / d) as f32))
                .collect();
            let v: Vec<f32> = (0..d * tk)
                .map(|i| (i / d) as f32 + 0.01 * (i % d) as f32)
                .collect();
            let srcs = [
                src(&q, [d, tq, 1, 1]),
                src(&k, [d, tk, 1, 1]),
                src(&v, [d, tk, 1, 1]),
            ];
            let scores: Vec<f64> = (0..tk)
                .map(|j| (0..d).map(|i| 8.0 * k[j * d + i] as f64).sum::<f64>() / 4.0)
                .collect();
            let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            let row: Vec<f64> = (0..d)
                .map(|i| {
                    (0..tk)
                        .map(|j| weights[j] * v[j * d + i] as f64)
                        .sum::<f64>()
                        / total
                })
                .collect();
            let expected = row.repeat(tq);
            for (name, entries) in instances() {
                let mut out = vec![f32::NAN; d * tq];
                entries[0](&srcs, &mut out, [d, 1, tq, 1], 0..tq, 0.0);
                let diff = out
                    .iter()
                    .zip(&expected)
                    .map(|(&o, &e)| (o as f64 - e).abs() / e.abs().max(1.0))
                    .fold(0.0, f64::max);
                assert!(
                    diff < 1e-5,
                    "{name}, {tq} x {tk}: relative {diff} (first value {}, expected {})",
                    out[0],
                    expected[0]
                );
            }
        }
    }

    /// Each instance's int8 attention, with the levels its keys are quantised to (the 7-bit
    /// instance's 63, 127 elsewhere) and the keys per block of its running softmax.
    fn int8_attention_instances() -> Vec<(&'static str, Entry, f32, usize)> {
        let mut sets: Vec<(&'static str, Entry, f32, usize)> = vec![(
            "portable",
            super::portable::run::attention_tokens_int8,
            127.0,
            super::portable::Q8_KEY_BLOCK,
        )];
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() != KernelSet::Portable {
            let (exact, int7) = (super::avx2::Q8_KEY_BLOCK, super::avx2_int7::Q8_KEY_BLOCK);
            sets.push(("avx2", avx2_attention_int8, 127.0, exact));
            sets.push(("avx2_int7", avx2int7_attention_int8, 63.0, int7));
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx2_vnni_detected() {
            let key_block = super::avx2vnni::Q8_KEY_BLOCK;
            sets.push(("avx2vnni", avx2vnni_attention_int8, 127.0, key_block));
        }
        #[cfg(target_arch = "x86_64")]
        if KernelSet::detect() == KernelSet::Avx512Bf16 {
            let key_block = super::avx512::Q8_KEY_BLOCK;
            sets.push(("avx512bf16", avx512_attention_int8, 127.0, key_block));
        }
        sets
    }

    /// Int8 attention is its definition in every instance, computed in f64 from the
    /// quantised operands. Scores: the keys less their mean (in f32, summed in key order as
    /// the kernel sums them) quantised per block of 32 to the instance's levels with an
    /// f16-rounded scale, the queries to 127 levels with an f32 scale; each block's integer
    /// sum scaled by both. Weighted values: a running softmax over the instance's key blocks
    /// (the probabilities of a block relative to the largest score so far, the sums so far
    /// rescaled where a block raises it), the probabilities of each block of 32 keys
    /// quantised to 0..127 with the scale `max p / 127`, the values less their mean per
    /// channel to -127..127 per channel and block of 32 keys; the mean added back after the
    /// division by the sum of the unquantised probabilities. A probability within 1e-3 of a
    /// rounding boundary may round either way (the kernel's exponential is within 2e-7 of
    /// the f64 one, not equal to it): each such one widens its outputs' tolerance by one
    /// level times its value. Keys and values with a large common part (which the means
    /// take out), 2 heads, 650 keys (two whole blocks and a partial one of every set, the
    /// last block of 32 partial, partial score groups), queries 3..104 of 107 (whole and
    /// partial tiles, spans and row groups); and one head of one block over 5 keys (fewer
    /// than a group) for one query (a single vector). It also stays within 2% of the
    /// largest value of exact attention.
    #[test]
    fn every_instance_int8_attention_is_its_definition() {
        int8_attention_against_its_definition((64, 32), (107, 650, 2), 3..104);
        int8_attention_against_its_definition((32, 32), (2, 5, 1), 1..2);
    }

    /// [`every_instance_int8_attention_is_its_definition`] for heads of `d` and `dv` values,
    /// `tq` queries, `tk` keys and `heads` heads, computing `tokens`.
    fn int8_attention_against_its_definition(
        (d, dv): (usize, usize),
        (tq, tk, heads): (usize, usize, usize),
        tokens: Range<usize>,
    ) {
        let q = values(d * tq * heads, 41);
        let k: Vec<f32> = values(d * tk * heads, 42)
            .iter()
            .enumerate()
            .map(|(i, x)| x + if i % d < 8 { 3.0 } else { 0.0 })
            .collect();
        let v: Vec<f32> = values(dv * tk * heads, 43)
            .iter()
            .enumerate()
            .map(|(i, x)| x + if i % dv < 4 { 2.0 } else { 0.0 })
            .collect();
        let srcs = [
            src(&q, [d, tq, heads, 1]),
            src(&k, [d, tk, heads, 1]),
            src(&v, [dv, tk, heads, 1]),
        ];
        // (integers, scale) per block of 32, the scale's rounding given by `round_scale`.
        let quantise = |xs: &[f32], levels: f32, round_scale: fn(f32) -> f32| {
            let max = xs.iter().fold(0f32, |m, x| m.max(x.abs()));
            let inverse = if max != 0.0 { levels / max } else { 0.0 };
            let ints: Vec<i64> = xs
                .iter()
                .map(|x| (x * inverse).round_ties_even() as i64)
                .collect();
            (ints, round_scale(max / levels))
        };
        let to_f16 = |x: f32| half::f16::from_f32(x).to_f32();
        // f32 means of `tk` rows in key order, as the kernel sums them.
        fn mean_of<'a>(rows: impl Fn(usize) -> &'a [f32], tk: usize, width: usize) -> Vec<f32> {
            let mut mean = vec![0f32; width];
            for j in 0..tk {
                for (m, &x) in mean.iter_mut().zip(rows(j)) {
                    *m += x;
                }
            }
            let inverse = 1.0 / tk as f32;
            mean.iter_mut().for_each(|m| *m *= inverse);
            mean
        }
        // Outputs [token][head][dv], and how far each may be from them by ambiguous roundings.
        let attention = |key_levels: f32, key_block: usize, exact: bool| {
            let mut out = vec![0f64; dv * heads * tokens.len()];
            let mut tolerance = vec![0f64; out.len()];
            for h in 0..heads {
                let key = |j: usize| &k[(h * tk + j) * d..][..d];
                let value = |j: usize| &v[(h * tk + j) * dv..][..dv];
                let key_mean = mean_of(key, tk, d);
                let keys: Vec<Vec<(Vec<i64>, f32)>> = (0..tk)
                    .map(|j| {
                        let centred: Vec<f32> =
                            key(j).iter().zip(&key_mean).map(|(x, m)| x - m).collect();
                        centred
                            .chunks_exact(Q8_BLOCK)
                            .map(|b| quantise(b, key_levels, to_f16))
                            .collect()
                    })
                    .collect();
                // [channel][block of 32 keys] -> (integers, scale).
                let value_mean = mean_of(value, tk, dv);
                let value_blocks: Vec<Vec<(Vec<i64>, f32)>> = (0..dv)
                    .map(|c| {
                        let column: Vec<f32> =
                            (0..tk).map(|j| value(j)[c] - value_mean[c]).collect();
                        column
                            .chunks(Q8_BLOCK)
                            .map(|b| quantise(b, 127.0, |s| s))
                            .collect()
                    })
                    .collect();
                for (t_out, t) in tokens.clone().enumerate() {
                    let query = &q[(h * tq + t) * d..][..d];
                    let blocks: Vec<(Vec<i64>, f32)> = query
                        .chunks_exact(Q8_BLOCK)
                        .map(|b| quantise(b, 127.0, |s| s))
                        .collect();
                    let scores: Vec<f64> = (0..tk)
                        .map(|j| {
                            let dot: f64 = if exact {
                                query
                                    .iter()
                                    .zip(key(j))
                                    .map(|(&a, &b)| a as f64 * b as f64)
                                    .sum()
                            } else {
                                blocks
                                    .iter()
                                    .zip(&keys[j])
                                    .map(|((qi, qs), (ki, ks))| {
                                        let sum: i64 = qi.iter().zip(ki).map(|(a, b)| a * b).sum();
                                        sum as f64 * *qs as f64 * *ks as f64
                                    })
                                    .sum()
                            };
                            dot / (d as f64).sqrt()
                        })
                        .collect();
                    let at = (t_out * heads + h) * dv;
                    if exact {
                        let top = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
                        let total: f64 = weights.iter().sum();
                        for c in 0..dv {
                            out[at + c] = (0..tk)
                                .map(|j| weights[j] * value(j)[c] as f64)
                                .sum::<f64>()
                                / total;
                        }
                        continue;
                    }
                    let (mut top, mut total) = (f64::NEG_INFINITY, 0f64);
                    let (mut acc, mut slack) = (vec![0f64; dv], vec![0f64; dv]);
                    for j0 in (0..tk).step_by(key_block) {
                        let block = j0..(j0 + key_block).min(tk);
                        let block_top = scores[block.clone()].iter().cloned().fold(top, f64::max);
                        let rescale = (top - block_top).exp();
                        total *= rescale;
                        acc.iter_mut().chain(&mut slack).for_each(|a| *a *= rescale);
                        top = block_top;
                        let p: Vec<f64> = scores[block.clone()]
                            .iter()
                            .map(|s| (s - top).exp())
                            .collect();
                        total += p.iter().sum::<f64>();
                        for (i, p) in p.chunks(Q8_BLOCK).enumerate() {
                            let b = (j0 + i * Q8_BLOCK) / Q8_BLOCK;
                            let max = p.iter().cloned().fold(0f64, f64::max);
                            let (levels, step) = (127.0 / max, max / 127.0);
                            for (jj, &p) in p.iter().enumerate() {
                                let level = (p * levels).round_ties_even();
                                let ambiguous = ((p * levels).fract() - 0.5).abs() < 1e-3;
                                for c in 0..dv {
                                    let (ints, scale) = &value_blocks[c][b];
                                    let value = ints[jj] as f64 * *scale as f64;
                                    acc[c] += level * step * value;
                                    if ambiguous {
                                        slack[c] += step * value.abs();
                                    }
                                }
                            }
                        }
                    }
                    for c in 0..dv {
                        out[at + c] = acc[c] / total + value_mean[c] as f64;
                        tolerance[at + c] = slack[c] / total;
                    }
                }
            }
            (out, tolerance)
        };
        let (exact, _) = attention(127.0, tk, true);
        let largest = exact.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (name, entry, key_levels, key_block) in int8_attention_instances() {
            let (want, tolerance) = attention(key_levels, key_block, false);
            let mut got = vec![f32::NAN; dv * heads * tokens.len()];
            entry(&srcs, &mut got, [dv, heads, tq, 1], tokens.clone(), 0.0);
            for ((&g, &w), &slack) in got.iter().zip(&want).zip(&tolerance) {
                let off = (g as f64 - w).abs();
                assert!(
                    off <= 2e-6 * largest + slack,
                    "{name}: {off} from its definition {w} (slack {slack}, values up to {largest})"
                );
            }
            let approximation = got
                .iter()
                .zip(&exact)
                .map(|(&g, &w)| (g as f64 - w).abs())
                .fold(0.0, f64::max);
            assert!(
                approximation < 0.02 * largest,
                "{name}: {approximation} from exact attention (values up to {largest})"
            );
        }
    }

    /// Every instance's f32 kernels agree with the portable ones, and its bf16 kernels stay
    /// within bf16 rounding of its f32 ones: attention over several key blocks and query
    /// tiles, a 3x3 convolution with a partial channel group, a product with partial row
    /// groups.
    #[test]
    fn every_instance_agrees_and_its_bf16_kernels_stay_close() {
        // Attention: q [64, 100, 2], k and v [64, 500, 2] -> [64, 2, 100].
        let (d, tq, tk, heads) = (64, 100, 500, 2);
        let (q, k, v) = (
            values(d * tq * heads, 1),
            values(d * tk * heads, 2),
            values(d * tk * heads, 3),
        );
        let attention = [
            src(&q, [d, tq, heads, 1]),
            src(&k, [d, tk, heads, 1]),
            src(&v, [d, tk, heads, 1]),
        ];
        // Convolution: kernel [3, 3, 5, 7], input [20, 9, 5, 1], bias [7] -> [20, 9, 7].
        let (w, h, ic, oc) = (20, 9, 5, 7);
        let (kernel, input, bias) = (values(9 * ic * oc, 4), values(w * h * ic, 5), values(oc, 6));
        let conv = [
            src(&kernel, [3, 3, ic, oc]),
            src(&input, [w, h, ic, 1]),
            src(&bias, [oc, 1, 1, 1]),
        ];
        // Product: x [96, 13] times W^T for W [64, 96], bias [64].
        let (kd, n, t) = (96, 64, 13);
        let weight = values(kd * n, 7);
        let panels = pack_panels(&weight, kd, n);
        let panels_bf16: Vec<f32> = pack_panels_bf16(&weight, kd, n)
            .into_iter()
            .map(|w| f32::from_bits(w as u32))
            .collect();
        let (x, b) = (values(kd * t, 8), values(n, 9));
        let panel_ne = [PANEL, kd, n / PANEL, 1];
        let linear = [
            src(&panels, panel_ne),
            src(&x, [kd, t, 1, 1]),
            src(&b, [n, 1, 1, 1]),
        ];
        let mut linear_bf16 = [
            src(&panels_bf16, [PANEL, kd / 2, n / PANEL, 1]),
            src(&x, [kd, t, 1, 1]),
            src(&b, [n, 1, 1, 1]),
        ];
        linear_bf16[0].dtype = DType::I32;
        let cases = [
            Case {
                what: "attention",
                srcs: &attention,
                srcs_bf16: &attention,
                ne: [d, heads, tq, 1],
                units: tq,
                bound: 2e-3,
            },
            Case {
                what: "convolution",
                srcs: &conv,
                srcs_bf16: &conv,
                ne: [w, h, oc, 1],
                units: oc,
                bound: 3e-2,
            },
            Case {
                what: "product",
                srcs: &linear,
                srcs_bf16: &linear_bf16,
                ne: [n, t, 1, 1],
                units: t,
                bound: 5e-2,
            },
        ];
        let run = |entry: Entry, srcs: &[Src<'_>], ne: [usize; 4], units: usize| {
            let mut out = vec![f32::NAN; ne.iter().product()];
            entry(srcs, &mut out, ne, 0..units, 0.0);
            out
        };
        let sets = instances();
        for (c, case) in cases.iter().enumerate() {
            let (what, ne, units) = (case.what, case.ne, case.units);
            let (srcs, srcs_bf16, bound) = (case.srcs, case.srcs_bf16, case.bound);
            let reference = run(sets[0].1[2 * c], srcs, ne, units);
            assert!(reference.iter().all(|x| x.is_finite()), "{what}");
            for (set, entries) in &sets {
                let f32_out = run(entries[2 * c], srcs, ne, units);
                let diff = max_abs_difference(&reference, &f32_out);
                assert!(
                    diff < 1e-5,
                    "{set} {what}: f32 differs from portable by {diff}"
                );
                let bf16_out = run(entries[2 * c + 1], srcs_bf16, ne, units);
                let diff = max_abs_difference(&f32_out, &bf16_out);
                assert!(
                    diff > 0.0 && diff < bound,
                    "{set} {what}: bf16 differs from f32 by {diff}"
                );
            }
        }
    }
}
