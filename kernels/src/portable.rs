//! Plain arrays, for any target.

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
include!("templates/body.rs");
entries!(inline);
