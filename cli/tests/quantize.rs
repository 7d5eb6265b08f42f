//! `da3 quantize IN.gguf OUT.gguf TYPE` run as a user runs it: the summary it prints agrees
//! with the files (read back with the GGUF reader), the output works for `da3 depth`, and bad
//! input fails with an error naming the problem and leaves no file behind.

mod common;

use common::{da3_in, Run};
use da3::convert::{write_synthetic, WeightType};
use da3::gguf::{GgufFile, GgufWriter};
use da3::Config;
use std::collections::BTreeMap;
use std::path::Path;

fn tiny(dir: &Path) {
    write_synthetic(
        &dir.join("tiny.gguf"),
        &Config::preset("da3-tiny").unwrap(),
        WeightType::F32,
    )
    .unwrap();
}

/// The number before `suffix` in the line starting with `prefix`, e.g. the `A` and `B` of
/// `file: A -> B bytes`.
fn line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` line in\n{stdout}"))
}

fn bytes_pair(l: &str) -> (u64, u64) {
    let rest = l.split_once(": ").unwrap().1;
    let (a, rest) = rest.split_once(" -> ").unwrap();
    let b = rest.split_once(' ').unwrap().0;
    (a.parse().unwrap(), b.parse().unwrap())
}

/// `TYPE COUNT (SIZE MiB), ...` as type -> count.
fn type_counts(l: &str) -> BTreeMap<String, usize> {
    l.split_once(':')
        .unwrap()
        .1
        .split(", ")
        .map(|part| {
            let mut words = part.split_whitespace();
            let t = words.next().unwrap().to_owned();
            (t, words.next().unwrap().parse().unwrap())
        })
        .collect()
}

fn file_counts(path: &Path) -> (BTreeMap<String, usize>, u64) {
    let file = GgufFile::open(path).unwrap();
    let mut counts = BTreeMap::new();
    for t in file.tensors() {
        *counts.entry(t.dtype.to_string()).or_default() += 1;
    }
    (counts, file.tensors().iter().map(|t| t.nbytes()).sum())
}

#[test]
fn summary_matches_the_files_and_the_output_runs() {
    let dir = tempfile::tempdir().unwrap();
    tiny(dir.path());
    let run = da3_in(
        dir.path(),
        &["quantize", "tiny.gguf", "tiny-q4.gguf", "q4_k"],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let out = &run.stdout;
    assert!(line(out, "wrote ").contains("tiny-q4.gguf (q4_k)"), "{out}");

    let (size_in, size_out) = bytes_pair(line(out, "file: "));
    assert_eq!(
        size_in,
        std::fs::metadata(dir.path().join("tiny.gguf"))
            .unwrap()
            .len()
    );
    assert_eq!(
        size_out,
        std::fs::metadata(dir.path().join("tiny-q4.gguf"))
            .unwrap()
            .len()
    );
    assert!(size_out < size_in);

    let (counts_in, data_in) = file_counts(&dir.path().join("tiny.gguf"));
    let (counts_out, data_out) = file_counts(&dir.path().join("tiny-q4.gguf"));
    assert_eq!(bytes_pair(line(out, "tensor data: ")), (data_in, data_out));
    assert_eq!(type_counts(line(out, "before: ")), counts_in);
    assert_eq!(type_counts(line(out, "after: ")), counts_out);

    // `matrix weights: M of T tensors; C as q4_K, F as q8_0 (rows not a multiple of 256); ...`
    let matrices = line(out, "matrix weights: ");
    let q4 = counts_out["q4_K"];
    let q8 = counts_out["q8_0"];
    let total: usize = counts_in.values().sum();
    assert!(
        matrices.starts_with(&format!("matrix weights: {} of {total} tensors; {q4} as q4_K, {q8} as q8_0 (rows not a multiple of 256)", q4 + q8)),
        "{matrices}"
    );

    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--model",
            "tiny-q4.gguf",
            "--device",
            "cpu",
            "--threads",
            "2",
            "--pfm",
            "d.pfm",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(dir.path().join("d.pfm").is_file());
}

/// Fails with `code`, an error mentioning `parts`, no panic, and no `OUT.gguf` or temporary
/// file left in the folder.
fn assert_fails(dir: &Path, args: &[&str], code: i32, parts: &[&str]) -> Run {
    let before: Vec<_> = listing(dir);
    let run = da3_in(dir, args);
    assert_eq!(run.code, Some(code), "{}", run.context());
    assert!(!run.stderr.contains("panicked"), "{}", run.context());
    for part in parts {
        assert!(
            run.stderr.contains(part),
            "stderr should mention `{part}`\n{}",
            run.context()
        );
    }
    assert_eq!(listing(dir), before, "files changed");
    run
}

fn listing(dir: &Path) -> Vec<(String, u64)> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    names.sort();
    names
}

#[test]
fn bad_input_is_a_clear_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    tiny(d);
    let fails = |args: &[&str], code: i32, parts: &[&str]| {
        let all: Vec<&str> = std::iter::once("quantize")
            .chain(args.iter().copied())
            .collect();
        assert_fails(d, &all, code, parts)
    };

    fails(
        &["tiny.gguf", "out.gguf", "q3_k"],
        2,
        &["unknown type `q3_k`", "f16, bf16, q8_0, q6_k, q5_k, q4_k"],
    );
    fails(
        &["tiny.gguf", "out.gguf", "f32"],
        2,
        &["unknown type `f32`"],
    );
    fails(&["tiny.gguf", "out.gguf"], 2, &["TYPE"]);
    fails(
        &["tiny.gguf", "tiny.gguf", "q8_0"],
        1,
        &["refusing to overwrite an input"],
    );
    fails(
        &["tiny.gguf", "./tiny.gguf", "q8_0"],
        1,
        &["refusing to overwrite an input"],
    );
    fails(&["missing.gguf", "out.gguf", "q8_0"], 1, &["missing.gguf"]);
    fails(
        &["tiny.gguf", "no-such-dir/out.gguf", "q8_0"],
        1,
        &["no-such-dir"],
    );

    std::fs::write(d.join("text.gguf"), b"hello, not a model").unwrap();
    fails(&["text.gguf", "out.gguf", "q8_0"], 1, &["not a GGUF file"]);

    let file = GgufFile::open(d.join("tiny.gguf")).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        w.set(k, v.clone());
    }
    w.set("general.architecture", "depthanything2");
    w.set("depthanything3.arch", "depthanything2");
    for t in file.tensors() {
        w.add_tensor(
            t.name.clone(),
            t.dtype,
            t.shape(),
            file.tensor_data(t).unwrap(),
        )
        .unwrap();
    }
    w.write_to(d.join("da2.gguf")).unwrap();
    fails(
        &["da2.gguf", "out.gguf", "q4_k"],
        1,
        &["a Depth Anything V2 file", "vit.alt_start"],
    );

    let run = da3_in(d, &["quantize", "tiny.gguf", "q8.gguf", "q8_0"]);
    assert_eq!(run.code, Some(0), "{}", run.context());
    fails(
        &["q8.gguf", "out.gguf", "q4_k"],
        1,
        &["already quantised (q8_0)", "f32, f16 or bf16"],
    );

    // A failed run leaves an existing output as it was.
    std::fs::write(d.join("out.gguf"), b"keep").unwrap();
    fails(&["q8.gguf", "out.gguf", "q5_k"], 1, &["already quantised"]);
    assert_eq!(std::fs::read(d.join("out.gguf")).unwrap(), b"keep");
}
