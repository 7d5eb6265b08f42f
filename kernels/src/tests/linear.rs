//! Linear layers: every instance's f32, f16, bf16 and int8 products against their definitions.

use super::*;

/// A linear layer's operands for the kernels: `panels` (f32 words, of `packing`, `ne`,
/// `nb`), the input x [kd, t], bias, scale [n] and a residual [n, t] whose rows lie
/// `n + 5` apart (so that its row stride, not n, is what the epilogue must use).
struct LinearCase {
    panels: Vec<f32>,
    packing: Packing,
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
    fn new(kd: usize, n: usize, t: usize, panels: Vec<f32>, packing: Packing) -> LinearCase {
        let depth = if packing == Packing::Bf16Pairs {
            kd / 2
        } else {
            kd
        };
        LinearCase {
            panels,
            packing,
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
        panels.packing = self.packing;
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
        let what = format!("{set} {:?} {}x{n}, rows {rows:?}", self.packing, self.kd);
        let mut product = vec![f32::NAN; out_len];
        plain(&srcs[..3], &mut product, ne, rows.clone(), 0.0);
        assert!(product.iter().all(|y| y.is_finite()), "{what}");
        let mut fused = vec![f32::NAN; out_len];
        gelu(&srcs[..3], &mut fused, ne, rows.clone(), 0.0);
        let mut separate = vec![f32::NAN; out_len];
        let flat = [out_len, 1, 1, 1];
        gelu_alone(&[src(&product, flat)], &mut separate, flat, 0..1, 0.0);
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same(&fused, &separate),
            "{what}: fused GELU differs from the GELU kernel"
        );
        let fma = set != "portable" || cfg!(any(target_feature = "fma", target_arch = "aarch64"));
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
        let case = LinearCase::new(kd, n, 205, pack_panels(&weight, kd, n), Packing::F32);
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
        let f32_case = LinearCase::new(kd, n, 205, pack_panels(&rounded, kd, n), Packing::F32);
        let f16_words: Vec<f32> = pack_panels(&rounded, kd, n)
            .chunks(2)
            .map(|pair| {
                let [lo, hi] = [pair[0], pair[1]].map(|w| half::f16::from_f32(w).to_bits());
                f32::from_bits(u32::from(lo) | (u32::from(hi) << 16))
            })
            .collect();
        let f16_case = LinearCase::new(kd, n, 205, f16_words, Packing::F16);
        let bf16_words: Vec<f32> = pack_panels_bf16(&weight, kd, n)
            .into_iter()
            .map(|w| f32::from_bits(w as u32))
            .collect();
        let bf16_case = LinearCase::new(kd, n, 205, bf16_words, Packing::Bf16Pairs);
        // q8_0 rows are whole blocks of 32.
        let q8_case = kd.is_multiple_of(Q8_BLOCK).then(|| {
            let q8 = quantize_q8_0(&weight);
            let words = pack_panels_q8(&q8, kd, n);
            let panels = words.iter().map(|&w| f32::from_bits(w)).collect();
            let mut case = LinearCase::new(kd, n, 205, panels, Packing::Q8Records);
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
                for (case, bound) in rounded_cases.into_iter().filter_map(|(c, b)| Some((c?, b))) {
                    let got = case.product_checking_epilogues(set, entries, rows.clone());
                    let diff = max_abs_difference(&want, &got);
                    assert!(
                        diff < bound,
                        "{set} {:?}, depth {kd}, rows {rows:?}: {diff} (largest {largest})",
                        case.packing
                    );
                }
            }
        }
    }
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
    let mut q8 = quantize_q8_0(&weight);
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
    srcs[0].packing = Packing::Q8Records;
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
    if Cpu::detect().best() == KernelSet::Portable {
        eprintln!("no AVX2 on this CPU: the 7-bit instance cannot run here");
        return;
    }
    let (k, n, t) = (128, 2 * PANEL, 11);
    let weight = values(k * n, 21);
    let mut q8 = quantize_q8_0(&weight);
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
    srcs[0].packing = Packing::Q8Records;
    srcs[0].nb = [1, Q8_RECORD, Q8_RECORD * k / Q8_BLOCK, words.len()];
    let mut got = vec![f32::NAN; n * t];
    // SAFETY: the CPU has AVX2, FMA and F16C (KernelSet::detect is not Portable).
    unsafe {
        super::avx2_int7::run::linear_bias_rows(&config(), &srcs, &mut got, [n, t, 1, 1], 0..t, 0.0)
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
        linear_f16[0].packing = Packing::F16;
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
