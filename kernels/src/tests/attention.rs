//! Attention: the f32 kernel's shift, and int8 attention against its definition.

use super::*;

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
        portable_attention_tokens_int8,
        127.0,
        super::portable::Q8_KEY_BLOCK,
    )];
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() != KernelSet::Portable {
        let (exact, int7) = (super::avx2::Q8_KEY_BLOCK, super::avx2_int7::Q8_KEY_BLOCK);
        sets.push(("avx2", avx2_attention_int8, 127.0, exact));
        sets.push(("avx2_int7", avx2int7_attention_int8, 63.0, int7));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().runs(KernelSet::Avx2Vnni) {
        let key_block = super::avx2vnni::Q8_KEY_BLOCK;
        sets.push(("avx2vnni", avx2vnni_attention_int8, 127.0, key_block));
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() == KernelSet::Avx512Bf16 {
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
                    let column: Vec<f32> = (0..tk).map(|j| value(j)[c] - value_mean[c]).collect();
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
