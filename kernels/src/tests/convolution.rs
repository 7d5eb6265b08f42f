//! Convolutions: Winograd against the direct kernel, bands against whole planes, bf16.

use super::*;

/// Winograd's F(4x4, 3x3) against the direct kernel, in every instance: images narrower
/// than a tile, than a vector of tiles and wider than a block, heights that end inside a
/// tile, one input channel and several, channel ranges that start past 0 and leave partial
/// groups (what a thread's share is), with and without a bias.
#[test]
fn every_instance_winograd_matches_the_direct_convolution() {
    assert!(config().winograd(), "DA3_WINOGRAD=off in the environment");
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
        winograd: portable_conv_winograd_planes,
        direct: portable_conv_direct_planes,
        winograd_rows: portable_conv_winograd_rows,
    }];
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() != KernelSet::Portable {
        sets.push(ConvEntries {
            set: "avx2",
            winograd: avx2_conv_winograd,
            direct: avx2_conv_direct,
            winograd_rows: avx2_winograd_rows,
        });
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().runs(KernelSet::Avx2Vnni) {
        sets.push(ConvEntries {
            set: "avx2vnni",
            winograd: avx2vnni_conv_winograd,
            direct: avx2vnni_conv_direct,
            winograd_rows: avx2vnni_winograd_rows,
        });
    }
    #[cfg(target_arch = "x86_64")]
    if Cpu::detect().best() == KernelSet::Avx512Bf16 {
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
                unsafe { super::$module::run::$kernel(&config(), srcs, out, ne, param) }
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
        let same = run(portable_conv_same_planes);
        let (winograd, direct) = (
            run(portable_conv_winograd_planes),
            run(portable_conv_direct_planes),
        );
        assert_ne!(
            winograd, direct,
            "the two must differ in rounding to tell them apart"
        );
        assert_eq!(same, if large { winograd } else { direct }, "{w}x{h}");
    }
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
