//! Reading and writing GGUF files, the container format of ggml.
//!
//! The format and every validation rule follow `ggml/src/gguf.cpp` of the pinned
//! ggml (0.26):
//!
//! ```text
//! "GGUF" | version: u32 | n_tensors: u64 | n_kv: u64
//! n_kv      x (key: string, type: u32, value)
//! n_tensors x (name: string, n_dims: u32, ne: [u64; n_dims], type: u32, offset: u64)
//! zero padding up to `general.alignment` (default 32)
//! tensor data; each offset is relative to the start of this section
//! ```
//!
//! All integers are little-endian; a string is a `u64` byte length followed by
//! UTF-8 bytes without a terminator; an array value is an element type (`u32`),
//! a count (`u64`) and the elements. Like ggml, this module rejects GGUF v1,
//! arrays of arrays, empty keys, tensor names of 64 bytes or more, more than four
//! dimensions, and tensor offsets other than the packed layout (each tensor
//! follows the previous one, padded to the alignment). It accepts zero-sized
//! dimensions and `n_dims == 0` (a scalar), as ggml does. Two deliberate
//! differences: strings must be valid UTF-8 (ggml does not check), and the
//! padding after the last tensor may be missing (only ggml's allocating loader
//! needs it).
//!
//! [`GgufFile`] validates a whole file when it is opened, so every accessor
//! afterwards is infallible or fails only on a metadata type mismatch.
//! [`GgufWriter`] produces files that ggml reads back (tensors packed in order,
//! each padded to the alignment, exactly as `gguf_write_to_file` does).
//! [`GgufWriter::write_to`] writes a file through [`crate::atomic_file`], so a failed write
//! leaves nothing behind.
//!
//! This module sits above [`crate::ggml`] (it uses its [`DType`](crate::ggml::DType) and loads
//! tensors into its [`Context`](crate::ggml::Context)); `ggml` knows nothing of GGUF. It has
//! no `unsafe` code: the memory map of [`GgufFile::open`] is [`crate::ggml::MappedFile`].
//!
//! Files, by concept: `value` (metadata values and their types), `tensor` (tensor infos and
//! the shape and alignment rules), `parse` (the byte-level reader and the header's
//! validation), `read` ([`GgufFile`]), `write` ([`GgufWriter`]), `error` ([`GgufError`]).

mod error;
mod parse;
mod read;
mod tensor;
#[cfg(test)]
mod testing;
mod value;
mod write;

pub use error::GgufError;
pub use read::{GgufFile, MAX_HEADER_BYTES};
pub use tensor::TensorInfo;
pub use value::{Array, Value, ValueType};
pub use write::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The version [`GgufWriter`] writes. Versions 2 and 3 are read (they share one layout).
pub const GGUF_VERSION: u32 = 3;
/// Metadata key that sets the data alignment; it must hold a `u32`.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Alignment used when [`ALIGNMENT_KEY`] is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a tensor may have (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name in bytes: `GGML_MAX_NAME` (64) less the NUL terminator.
pub const MAX_TENSOR_NAME_LEN: usize = 63;

/// ggml's `GGUF_MAX_STRING_LENGTH`.
const MAX_STRING_LEN: u64 = 1 << 30;
/// ggml's `GGUF_MAX_ARRAY_ELEMENTS`.
const MAX_ARRAY_LEN: u64 = 1 << 30;
/// Smallest encoded key-value pair: key length, a 1-byte key, type id, 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Smallest encoded tensor info: name length, n_dims, type id, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;
/// Upper bound on speculative `Vec` pre-allocation driven by counts in the file.
const MAX_PREALLOC: usize = 4096;
