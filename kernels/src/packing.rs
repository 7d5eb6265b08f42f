//! Packing of weights for the register tiles (f32, f16, bf16 pairs, q8_0 records), the
//! bf16 conversions, and the prefetch hint the linear layers use.

use crate::PANEL;

/// Part `part` of `parts` of `data`, asked into the L2 cache ahead of its use: a linear
/// layer reads its weight once per image, from memory, and the hardware prefetchers stop at
/// every 4 KB page, so the first group of rows to meet a panel waited for it line by line.
/// A hint: it never faults and changes no result.
#[inline(always)]
pub(crate) fn prefetch_part<T>(data: &[T], part: usize, parts: usize) {
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
pub(crate) fn bf16_unpack(w: u32) -> [f32; 2] {
    [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
}

/// A matrix-product weight `w` (`n` rows of `k` values, ggml's [k, n]) as panels: `n / PANEL`
/// blocks of [k][PANEL], so that the kernel reads one row of a panel with whole vectors.
pub fn pack_panels(w: &[f32], k: usize, n: usize) -> Vec<f32> {
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
pub const Q8_BLOCK: usize = 32;
/// Words per (panel, block) of a weight packed for int8 products ([`pack_panels_q8`]): the
/// block's bytes as 8 rows of PANEL words (four consecutive inputs each), then the PANEL
/// scales (f32), then the PANEL offset corrections (i32, `-128 Σ w` over the block).
pub const Q8_RECORD: usize = 8 * PANEL + 2 * PANEL;
/// Where a record's scales and corrections start.
pub(crate) const Q8_SCALES: usize = 8 * PANEL;
pub(crate) const Q8_CORRECTIONS: usize = 9 * PANEL;

/// A q8_0 matrix (`n` rows of `k` values in ggml's blocks: an f16 scale, then 32 signed
/// bytes) packed for the int8 products: `n / PANEL` panels of `k / 32` records
/// ([`Q8_RECORD`] words each). The values are kept exactly; only the layout changes.
pub fn pack_panels_q8(q8: &[u8], k: usize, n: usize) -> Vec<u32> {
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
pub fn q8_record_column(
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
pub(crate) fn bf16_bits(x: f32) -> u32 {
    let bits = x.to_bits();
    (bits + 0x7fff + ((bits >> 16) & 1)) >> 16
}

/// `src` as bf16 pairs into `dst` (`dst[i]` = (`src[2i]`, `src[2i + 1]`), zero past the end):
/// the same bits as converting the values in order, written word by word. Branch-free over
/// whole pairs, so the loop vectorises.
#[inline(always)]
pub fn to_bf16_pairs(src: &[f32], dst: &mut [u32]) {
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
pub(crate) fn bf16_pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) | bf16_bits(hi) << 16
}

/// [`pack_panels`] in bf16 for an even `k`: `n / PANEL` blocks of [k / 2][PANEL] words, each
/// the pair (`w[j][2i]`, `w[j][2i + 1]`).
pub fn pack_panels_bf16(w: &[f32], k: usize, n: usize) -> Vec<i32> {
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
