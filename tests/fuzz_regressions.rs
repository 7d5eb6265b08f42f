//! Every input the fuzz targets (`fuzz/`, `cargo +nightly fuzz run TARGET`) found crashing,
//! replayed through the same target bodies: `tests/fixtures/fuzz/TARGET-NAME`. Each must
//! return, the process alive.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

use std::path::Path;

fn replay(target: &str, body: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fuzz");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with(&format!("{target}-")) {
            eprintln!("replaying {name}");
            body(&std::fs::read(&path).unwrap());
            n += 1;
        }
    }
    n
}

#[test]
fn gguf_model_inputs() {
    replay("gguf_model", targets::gguf_model);
    targets::gguf_model(b"");
    targets::gguf_model(b"GGUF");
}

#[test]
fn image_preprocess_inputs() {
    replay("image_preprocess", targets::image_preprocess);
    targets::image_preprocess(b"\x7f\x89PNG\r\n\x1a\n");
}

#[test]
fn graph_ops_inputs() {
    // Each aborted the process before its fix (see the commit that added it).
    assert!(replay("graph_ops", targets::graph_ops) >= 15);
    for op in 0..36u8 {
        targets::graph_ops(&[
            1, 3, 0, 2, 3, 3, 1, 2, 3, 3, 0, 1, 2, 2, 3, 2, 3, 8, 0, 1, 2, op,
        ]);
        targets::graph_ops(&[
            0, 3, 0, 2, 3, 3, 1, 2, 3, 3, 0, 1, 2, 2, 3, 2, 3, 8, 0, 1, 2, op,
        ]);
    }
}
