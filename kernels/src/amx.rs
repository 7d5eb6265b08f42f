//! Intel AMX tiles for the bf16 products of the linear layers (Sapphire Rapids and later
//! Xeons). One `tdpbf16ps` multiplies a 16 x 32 block of bf16 by a 32 x 16 one into 16 x 16
//! f32 sums: 8,192 multiply-adds, 16 times those of a 512-bit `vdpbf16ps`, which on these
//! Xeons issues at half the f32 FMA rate and so gains nothing over f32
//! ([`crate::Config::bf16_products_pay`]). The tiles make bf16 weights (an f16 file's fast mode) pay
//! on Intel too.
//!
//! The tile state is per thread and off by default: Linux hands a process the tile data only
//! after it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), and each thread loads a tile
//! configuration before its first tile instruction ([`Tiles::configure`]). Rust has no stable
//! AMX intrinsics, so the few instructions are inline assembly.

use std::arch::asm;
use std::arch::x86_64::{__cpuid, __cpuid_count};
use std::marker::PhantomData;

/// Whether this process may compute bf16 products on AMX tiles: the CPU has AMX-TILE and
/// AMX-BF16 and the operating system grants the process the tile state (Linux only; asking
/// is idempotent). [`crate::Cpu::detect`] asks once; a [`crate::Config`] uses the tiles only
/// where this held.
pub(crate) fn available() -> bool {
    cpu_has_amx_bf16() && os_grants_tiles()
}

/// CPUID leaf 7's AMX-BF16 (EDX bit 22) and AMX-TILE (EDX bit 24).
fn cpu_has_amx_bf16() -> bool {
    // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads registers.
    #[allow(unused_unsafe)]
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf < 7 {
        return false;
    }
    // SAFETY: leaf 7 exists (max_leaf >= 7); CPUID only reads registers.
    #[allow(unused_unsafe)]
    let edx = unsafe { __cpuid_count(7, 0) }.edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state (XFEATURE_XTILEDATA, 18) of this process; false where
/// the kernel refuses (too old, or the state disabled), and on other systems, where this
/// crate does not know how to ask.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, n) takes two integers and reads no memory of
    // ours; it only enlarges the process's XSAVE state (and signal frames) to hold the tiles.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// Rows of A (and of the result) per tile; columns of B per tile are 16 as well.
const TILE_ROWS: usize = 16;
/// bf16 pairs per row of an A tile (and rows of a B tile): 64 bytes.
pub const TILE_PAIRS: usize = 16;
/// Result rows and columns of [`Tiles::product_32x32`].
pub const BLOCK: usize = 2 * TILE_ROWS;

/// Palette 1 with eight tiles of 16 rows of 64 bytes: tmm0-3 the 2 x 2 blocks of 16 x 16 f32
/// sums, tmm4-5 two 16-row blocks of A, tmm6-7 two 16-column blocks of B. The layout is the
/// 64-byte operand of `ldtilecfg`: palette, start row, 14 reserved bytes, 16 column widths in
/// bytes (u16), 16 row counts (u8).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const TILE_CONFIG: TileConfig = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut tile = 0;
    while tile < 8 {
        bytes[16 + 2 * tile] = 64;
        bytes[48 + tile] = TILE_ROWS as u8;
        tile += 1;
    }
    TileConfig(bytes)
};

/// The calling thread's tiles, configured for [`Tiles::product_32x32`] and released when
/// dropped. Not `Send`: the configuration belongs to the thread that loaded it.
pub struct Tiles(PhantomData<*const ()>);

impl Tiles {
    /// Configures this thread's tiles, or `None` where `config` does not multiply on them.
    pub fn configure(config: &crate::Config) -> Option<Tiles> {
        if !config.amx_tiles() {
            return None;
        }
        // SAFETY: the CPU has AMX-TILE and the OS granted this process the tile state
        // (a Config has amx_tiles only where Cpu::detect found `available()`); ldtilecfg reads the 64 aligned bytes of TILE_CONFIG, a valid palette-1
        // configuration (every tile 16 rows of 64 bytes, within palette 1's limits).
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &TILE_CONFIG, options(nostack, readonly));
        }
        Some(Tiles(PhantomData))
    }

    /// `c` = 32 rows of `a` times 32 columns of `b` over `pairs` pairs of inputs, in f32 sums
    /// (tile order): row `r` of A is the `pairs` words from `a[r * a_stride]`, each a pair of
    /// bf16 (the earlier input in the low half); row `i` of B, from `b[i * b_stride]`, holds
    /// 32 words, word `j` the bf16 pair of inputs `2i` and `2i + 1` of column `j` (a panel of
    /// [`super::pack_panels_bf16`], read as words); row `r` of the result is stored at
    /// `c[r * c_stride..][..32]`. With `accumulate`, the sums start from what `c` holds
    /// instead of zero.
    ///
    /// # Panics
    /// Unless `pairs` is a positive multiple of 16, the strides hold a row each and the
    /// slices hold what is read and written.
    pub fn product_32x32(
        &self,
        a: (&[u32], usize),
        b: (&[f32], usize),
        pairs: usize,
        c: (&mut [f32], usize),
        accumulate: bool,
    ) {
        self.product_segments((a.0, a.1, BLOCK), b, &[[0, 0]], pairs, c, accumulate);
    }

    /// [`Tiles::product_32x32`] summed over segments: for each `[a_offset, b_offset]` of
    /// `segments` (in words), the product of A from `a[a_offset..]` and B from
    /// `b[b_offset..]` over `pairs` pairs, all summed into one 32 x 32 block of the tiles
    /// (a convolution's taps: one segment per kernel position). A is `(a, a_stride, rows)`:
    /// with `rows` 16, only the first 16 rows of A are read and of C computed (rows 16-31 of `c` are left as they
    /// are), in half the tile products: a block of 16 output channels.
    ///
    /// # Panics
    /// As [`Tiles::product_32x32`], for every segment, and unless `rows` is 16 or 32.
    pub fn product_segments(
        &self,
        (a, a_stride, rows): (&[u32], usize, usize),
        (b, b_stride): (&[f32], usize),
        segments: &[[usize; 2]],
        pairs: usize,
        (c, c_stride): (&mut [f32], usize),
        accumulate: bool,
    ) {
        assert!(pairs > 0 && pairs.is_multiple_of(TILE_PAIRS) && a_stride >= pairs);
        assert!(b_stride >= BLOCK && c_stride >= BLOCK);
        assert!(c.len() >= (BLOCK - 1) * c_stride + BLOCK, "C holds 32 rows");
        // The assembly's loop over segments runs at least once.
        assert!(!segments.is_empty(), "no segments");
        assert!(rows == TILE_ROWS || rows == BLOCK, "{rows} rows");
        // Each segment's A and B as addresses, checked against the slices, on the stack.
        let mut addresses = [[0usize; 2]; MAX_SEGMENTS];
        let mut accumulate = accumulate;
        for chunk in segments.chunks(MAX_SEGMENTS) {
            for (address, &[a_offset, b_offset]) in addresses.iter_mut().zip(chunk) {
                let a_rows = a_offset + (rows - 1) * a_stride + pairs;
                assert!(a_rows <= a.len(), "A holds {rows} rows from {a_offset}");
                let b_rows = b_offset + (pairs - 1) * b_stride + BLOCK;
                assert!(b_rows <= b.len(), "B holds `pairs` rows from {b_offset}");
                *address = [
                    a[a_offset..].as_ptr() as usize,
                    b[b_offset..].as_ptr() as usize,
                ];
            }
            let params = Params {
                b_step: TILE_PAIRS * b_stride * 4,
                steps: pairs / TILE_PAIRS,
                c: c.as_mut_ptr(),
                c_bytes: c_stride * 4,
                // In bounds: row 16 of the 32 that `c` holds.
                c_high: c[TILE_ROWS * c_stride..].as_mut_ptr(),
                accumulate: accumulate as usize,
                high_rows: (rows == BLOCK) as usize,
            };
            let segments = addresses[..chunk.len()].as_ptr_range();
            // SAFETY: the tiles are configured on this thread (`self`, not Send, exists only
            // after `configure`) with tmm0-7 each 16 rows of 64 bytes. For each segment (its
            // addresses made from in-bounds offsets of `a` and `b` above), step s < pairs / 16
            // reads 16 rows of 64 bytes of A at words r * a_stride + 16 s (rows 0-15 from
            // `a`; rows 16-31, from `a_high`, only where `high_rows` is set, i.e. `rows` is
            // 32) and rows 16 s .. 16 s + 16 of B (b_stride words apart, 64 bytes each from
            // words 0 and 16): within `a` and `b` by the asserts. The stores write (and with
            // `accumulate` the first loads read) 16 or 32 (`high_rows`) rows of 128 bytes
            // c_stride words apart, within `c` (which holds 32). `params` and `segments` are read only;
            // the scratch registers are outputs and tmm0-7 are declared clobbered.
            unsafe {
                asm!(
                    "mov {a}, [{p} + 16]",
                    "mov {a_high}, [{p} + 24]",
                    "mov {b}, [{p} + 32]",
                    "cmp qword ptr [{p} + 40], 0",
                    "je 3f",
                    "tileloadd tmm0, [{a} + {a_high} * 1]",
                    "tileloadd tmm1, [{a} + {a_high} * 1 + 64]",
                    "cmp qword ptr [{p} + 48], 0",
                    "je 4f",
                    "tileloadd tmm2, [{b} + {a_high} * 1]",
                    "tileloadd tmm3, [{b} + {a_high} * 1 + 64]",
                    "jmp 4f",
                    "3:",
                    "tilezero tmm0",
                    "tilezero tmm1",
                    "tilezero tmm2",
                    "tilezero tmm3",
                    // One segment: A and B from its addresses, A's second 16 rows 16 rows on.
                    "4:",
                    "mov {a}, [{segment}]",
                    "mov {b}, [{segment} + 8]",
                    "mov {a_high}, {a_bytes}",
                    "shl {a_high}, 4",
                    "add {a_high}, {a}",
                    "mov {steps}, [{p} + 8]",
                    "cmp qword ptr [{p} + 48], 0",
                    "je 6f",
                    "2:",
                    "tileloadd tmm4, [{a} + {a_bytes} * 1]",
                    "tileloadd tmm5, [{a_high} + {a_bytes} * 1]",
                    "tileloadd tmm6, [{b} + {b_bytes} * 1]",
                    "tileloadd tmm7, [{b} + {b_bytes} * 1 + 64]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    "add {a}, 64",
                    "add {a_high}, 64",
                    "add {b}, [{p}]",
                    "dec {steps}",
                    "jnz 2b",
                    "jmp 7f",
                    // 16 rows: A's first 16 only, two tile products a step.
                    "6:",
                    "tileloadd tmm4, [{a} + {a_bytes} * 1]",
                    "tileloadd tmm6, [{b} + {b_bytes} * 1]",
                    "tileloadd tmm7, [{b} + {b_bytes} * 1 + 64]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "add {a}, 64",
                    "add {b}, [{p}]",
                    "dec {steps}",
                    "jnz 6b",
                    "7:",
                    "add {segment}, 16",
                    "cmp {segment}, {segments_end}",
                    "jne 4b",
                    "mov {a}, [{p} + 16]",
                    "mov {a_high}, [{p} + 24]",
                    "mov {b}, [{p} + 32]",
                    "tilestored [{a} + {a_high} * 1], tmm0",
                    "tilestored [{a} + {a_high} * 1 + 64], tmm1",
                    "cmp qword ptr [{p} + 48], 0",
                    "je 8f",
                    "tilestored [{b} + {a_high} * 1], tmm2",
                    "tilestored [{b} + {a_high} * 1 + 64], tmm3",
                    "8:",
                    p = in(reg) &params,
                    segment = inout(reg) segments.start => _,
                    segments_end = in(reg) segments.end,
                    a_bytes = in(reg) a_stride * 4,
                    b_bytes = in(reg) b_stride * 4,
                    a = out(reg) _,
                    a_high = out(reg) _,
                    b = out(reg) _,
                    steps = out(reg) _,
                    out("tmm0") _, out("tmm1") _, out("tmm2") _, out("tmm3") _,
                    out("tmm4") _, out("tmm5") _, out("tmm6") _, out("tmm7") _,
                    options(nostack),
                );
            }
            // Later chunks add to the sums stored.
            accumulate = true;
        }
    }
}

/// Segments of [`Tiles::product_segments`] passed to the tiles at once (a 3x3 kernel's).
const MAX_SEGMENTS: usize = 9;

/// What [`Tiles::product_segments`]'s assembly reads besides the segments, at the offsets it
/// names: bytes to the next 16 rows of B (0), steps of 16 pairs (8), the first row of C (16),
/// bytes between rows of C (24), row 16 of C (32), whether to start from C (40), whether rows
/// 16-31 are computed (48).
#[repr(C)]
struct Params {
    b_step: usize,
    steps: usize,
    c: *mut f32,
    c_bytes: usize,
    c_high: *mut f32,
    accumulate: usize,
    high_rows: usize,
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured on this thread (`configure`); tilerelease returns
        // them to the initial state and touches no memory.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 32 x 32 block against the same sums in f64 of the bf16 values (exact products, f32
    /// sums, so within f32 rounding of the sums), with strides wider than a row everywhere;
    /// then accumulated onto itself, and two segments against their products one by one.
    #[test]
    fn tiles_multiply_bf16_blocks() {
        let config = crate::Config::detect();
        let Some(tiles) = Tiles::configure(&config) else {
            // Without the tiles (a CPU without AMX, or one whose OS withholds them), none may
            // be configured; the vector kernels' tests cover the products then.
            assert!(!available() || !config.set().has_bf16_products());
            return;
        };
        let (pairs, a_stride) = (48, 50);
        let bf16 = |i: usize, seed: usize| -> u32 {
            let x = (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 8.0;
            x.to_bits() >> 16
        };
        let a: Vec<u32> = (0..BLOCK * a_stride)
            .map(|i| bf16(2 * i, 1) | bf16(2 * i + 1, 1) << 16)
            .collect();
        let b: Vec<f32> = (0..pairs * BLOCK)
            .map(|i| f32::from_bits(bf16(2 * i, 2) | bf16(2 * i + 1, 2) << 16))
            .collect();
        let (b_stride, c_stride) = (BLOCK + 3, BLOCK + 5);
        // One row more than a product reads, for a segment one row on.
        let b: Vec<f32> = (0..(pairs + 1) * b_stride)
            .map(|i| b[(i / b_stride % pairs) * BLOCK + (i % b_stride) % BLOCK])
            .collect();
        let mut c = vec![f32::NAN; BLOCK * c_stride];
        tiles.product_32x32(
            (&a, a_stride),
            (&b, b_stride),
            pairs,
            (&mut c, c_stride),
            false,
        );
        let once = c.clone();
        // Again onto the first result: twice the sums.
        tiles.product_32x32(
            (&a, a_stride),
            (&b, b_stride),
            pairs,
            (&mut c, c_stride),
            true,
        );
        for r in 0..BLOCK {
            for (twice, once) in c[r * c_stride..][..BLOCK].iter().zip(&once[r * c_stride..]) {
                assert!(
                    (twice - 2.0 * once).abs() <= 1e-5 * (1.0 + once.abs()),
                    "row {r}"
                );
            }
        }
        // Two segments (A two words on, B one row on) against their products one by one.
        let (a_offset, b_offset) = (2, b_stride);
        let mut by_parts = vec![f32::NAN; BLOCK * c_stride];
        let parts = [(0, 0, false), (a_offset, b_offset, true)];
        for (a_at, b_at, accumulate) in parts {
            let (a, b) = ((&a[a_at..], a_stride), (&b[b_at..], b_stride));
            tiles.product_32x32(a, b, pairs, (&mut by_parts, c_stride), accumulate);
        }
        let segmented_rows = |rows: usize| {
            let mut c = vec![f32::NAN; BLOCK * c_stride];
            let segments = [[0, 0], [a_offset, b_offset]];
            tiles.product_segments(
                (&a, a_stride, rows),
                (&b, b_stride),
                &segments,
                pairs,
                (&mut c, c_stride),
                false,
            );
            c
        };
        // Over 32 rows, and over 16: their sums, rows 16-31 untouched.
        let (segmented, sixteen) = (segmented_rows(BLOCK), segmented_rows(TILE_ROWS));
        for r in 0..BLOCK {
            let row = |c: &[f32]| c[r * c_stride..][..BLOCK].to_vec();
            assert_eq!(row(&segmented), row(&by_parts), "row {r}");
            if r < TILE_ROWS {
                assert_eq!(row(&sixteen), row(&segmented), "16 rows: row {r}");
            } else {
                assert!(row(&sixteen).iter().all(|x| x.is_nan()), "16 rows: row {r}");
            }
        }
        let c = once;
        let half =
            |w: u32, high: bool| f32::from_bits(if high { w & 0xffff_0000 } else { w << 16 });
        for r in 0..BLOCK {
            for col in 0..BLOCK {
                let mut sum = 0.0f64;
                for i in 0..pairs {
                    let (x, w) = (a[r * a_stride + i], b[i * b_stride + col].to_bits());
                    sum += (half(x, false) * half(w, false)) as f64;
                    sum += (half(x, true) * half(w, true)) as f64;
                }
                let got = c[r * c_stride + col] as f64;
                assert!(
                    (got - sum).abs() <= 1e-5 * (1.0 + sum.abs()),
                    "({r}, {col}): {got} against {sum}"
                );
            }
        }
    }
}
