//! The corrupted-model probe: a model file written by depth-anything.cpp's own converter,
//! damaged in every part of its header in turn (bytes replaced, the file cut short), then
//! opened and loaded as `da3` would (read, configuration, weights, a session and its first
//! graph). Each case must return, an error or a model: no panic, no abort, no signal.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

use da3::gguf::GgufFile;
use std::path::Path;

fn peer_file() -> Vec<u8> {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peer/peer-tiny-seed0-f32.gguf");
    std::fs::read(path).unwrap()
}

/// A corruption of the file: bytes replaced at an offset, or the file cut short.
#[derive(Debug, Clone, Copy)]
enum Damage {
    Replace { at: usize, with: Pattern },
    Cut { at: usize },
}

#[derive(Debug, Clone, Copy)]
enum Pattern {
    Zero,
    Ones,
    TopBitFlipped,
}

impl Damage {
    fn apply(self, original: &[u8]) -> Option<Vec<u8>> {
        match self {
            Damage::Replace { at, with } => {
                let mut bytes = original.to_vec();
                bytes[at] = match with {
                    Pattern::Zero => 0,
                    Pattern::Ones => 0xff,
                    Pattern::TopBitFlipped => bytes[at] ^ 0x80,
                };
                (bytes[at] != original[at]).then_some(bytes)
            }
            Damage::Cut { at } => Some(original[..at].to_vec()),
        }
    }
}

/// The damage done: in the header, metadata and tensor table every byte replaced three ways
/// (so every byte of every field: magic, version, counts, string lengths, value types, array
/// lengths, dimensions, element types, offsets); the file cut short every 16 bytes of the
/// header and every 64 KiB of the tensor data.
fn damage(original: &[u8]) -> Vec<Damage> {
    let data_offset = GgufFile::from_bytes(original.to_vec())
        .expect("the fixture opens")
        .data_offset() as usize;
    let mut out = Vec::new();
    for at in 0..data_offset {
        for with in [Pattern::Zero, Pattern::Ones, Pattern::TopBitFlipped] {
            out.push(Damage::Replace { at, with });
        }
    }
    let cuts = (0..data_offset)
        .step_by(16)
        .chain((data_offset..original.len()).step_by(65_536));
    out.extend(cuts.map(|at| Damage::Cut { at }));
    out
}

#[test]
fn every_corruption_of_the_peer_header_is_an_error_or_a_model() {
    let original = peer_file();
    let damage = damage(&original);
    let (mut files, mut opened, mut loaded) = (0, 0, 0);
    for d in damage {
        let Some(bytes) = d.apply(&original) else {
            continue; // the byte already had that value
        };
        files += 1;
        // A panic fails the test naming the case; an abort or a signal ends the whole run.
        let outcome = std::panic::catch_unwind(|| targets::gguf_model(&bytes));
        assert!(outcome.is_ok(), "{d:?}: panicked");
        if let Ok(file) = GgufFile::from_bytes(bytes) {
            opened += 1;
            let options = da3::LoadOptions {
                device: da3::Device::Cpu,
                threads: 1,
                ..Default::default()
            };
            loaded += usize::from(da3::Model::from_gguf(&file, &options).is_ok());
        }
    }
    eprintln!("{files} corrupted files: {opened} still parse as GGUF, {loaded} still load");
    assert!(files > 20_000, "{files} cases");
    // Most damage is caught: a byte of a tensor's name or of a metadata string may leave a
    // file that still loads (a renamed unused key), but not most of them.
    assert!(loaded < files / 2, "{loaded} of {files} loaded");
}
