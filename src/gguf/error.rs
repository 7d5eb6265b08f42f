//! The one error type of reading, querying and writing GGUF files.

use std::io;
use std::path::{Path, PathBuf};

use super::{MAX_DIMS, MAX_TENSOR_NAME_LEN};
use crate::ggml::DType;

/// Errors from reading, querying or writing GGUF files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening, mapping, creating, writing or renaming a file failed (for a write, the error of
    /// [`atomic_file::write`](crate::atomic_file::write), nothing left behind).
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file the operation was on.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Writing to a caller-supplied stream failed.
    #[error("failed to write GGUF data: {0}")]
    Write(#[source] io::Error),
    /// The file does not start with `GGUF`.
    #[error("{} is not a GGUF file (starts with {}, expected \"GGUF\")", origin(path.as_deref()), show_magic(found))]
    BadMagic {
        /// The file, or `None` for an in-memory buffer.
        path: Option<PathBuf>,
        /// The first four bytes.
        found: [u8; 4],
    },
    /// The version is not 2 or 3.
    #[error("{}", version_message(*.0))]
    UnsupportedVersion(u32),
    /// A fixed-size field runs past the end of the file.
    #[error("file truncated: {what} at offset {offset} runs past the end of the file")]
    Truncated {
        /// What was being read.
        what: String,
        /// File offset where it starts.
        offset: u64,
    },
    /// A count or length cannot fit in the rest of the file or exceeds ggml's limits.
    #[error("{what} at offset {offset}: {count} exceeds the limit of {limit} (file truncated or corrupt)")]
    TooLarge {
        /// What the count is of.
        what: String,
        /// File offset of the count.
        offset: u64,
        /// The count read from the file.
        count: u64,
        /// The largest count the remaining bytes (or ggml) allow.
        limit: u64,
    },
    /// A key, string value or tensor name is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string is.
        what: String,
        /// File offset of the string's length prefix.
        offset: u64,
    },
    /// A metadata key is the empty string, which ggml rejects.
    #[error("metadata key #{index} is empty")]
    EmptyKey {
        /// Position of the pair in the metadata.
        index: u64,
    },
    /// A value type id is not one of the 13 GGUF types.
    #[error("metadata key '{key}' has unknown value type id {type_id}")]
    BadValueType {
        /// The key.
        key: String,
        /// The type id found.
        type_id: u32,
    },
    /// An array whose elements are arrays; ggml does not support these.
    #[error("metadata key '{key}' is an array of arrays, which ggml does not support")]
    NestedArray {
        /// The key.
        key: String,
    },
    /// A key appears twice.
    #[error("duplicate metadata key '{0}'")]
    DuplicateKey(String),
    /// The alignment is zero, not a power of two or larger than `u32::MAX`.
    #[error("invalid alignment {0}: must be a power of two between 1 and 2^31")]
    BadAlignment(u64),
    /// A tensor name is longer than [`MAX_TENSOR_NAME_LEN`] bytes.
    #[error("tensor name '{name}' is {} bytes long; ggml allows at most {MAX_TENSOR_NAME_LEN}", name.len())]
    TensorNameTooLong {
        /// The name.
        name: String,
    },
    /// A tensor name appears twice.
    #[error("duplicate tensor name '{0}'")]
    DuplicateTensor(String),
    /// A tensor has more than [`MAX_DIMS`] dimensions.
    #[error("tensor '{tensor}' has {n_dims} dimensions; ggml supports at most {MAX_DIMS}")]
    BadDims {
        /// The tensor.
        tensor: String,
        /// The number of dimensions declared.
        n_dims: u64,
    },
    /// A tensor shape whose element count or byte size is not representable.
    #[error("tensor '{tensor}' has invalid shape {ne:?}: {reason}")]
    BadShape {
        /// The tensor.
        tensor: String,
        /// The declared dimensions, `ne[0]` first.
        ne: Vec<u64>,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A tensor type id unknown to (or removed from) ggml.
    #[error("tensor '{tensor}' has unknown or removed ggml type id {type_id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The type id found.
        type_id: u32,
    },
    /// A row length that is not a whole number of blocks of the tensor's type.
    #[error("tensor '{tensor}': row length {ne0} is not a multiple of the {dtype} block size {}", dtype.block_size())]
    NotBlockAligned {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: DType,
        /// Its row length `ne[0]`.
        ne0: u64,
    },
    /// A tensor data offset that is not a multiple of the alignment.
    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset, relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// Tensor data that extends past the end of the file.
    #[error("tensor '{tensor}': {size} bytes at file offset {offset} extend past the end of the file ({file_size} bytes)")]
    DataOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Absolute file offset of its data (saturated at `u64::MAX`).
        offset: u64,
        /// Its size in bytes.
        size: u64,
        /// The file's size.
        file_size: u64,
    },
    /// A tensor offset other than the one ggml requires: tensors are packed in
    /// file order, each padded to the alignment.
    #[error("tensor '{tensor}' has data offset {offset}, expected {expected} (tensors must be packed in order, each padded to the alignment)")]
    UnexpectedOffset {
        /// The tensor.
        tensor: String,
        /// Its offset, relative to the data section.
        offset: u64,
        /// The offset implied by the tensors before it.
        expected: u64,
    },
    /// Tensor data of the wrong length was given to
    /// [`GgufWriter::add_tensor`](super::GgufWriter::add_tensor).
    #[error("tensor '{tensor}': {dtype} data of this shape is {expected} bytes, got {actual}")]
    DataSizeMismatch {
        /// The tensor.
        tensor: String,
        /// Its type.
        dtype: DType,
        /// Bytes its shape requires.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
    /// A file that changed (truncated or rewritten) after it was opened.
    #[error("GGUF file {} changed while in use: {reason}", path.display())]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed.
        reason: String,
    },
    /// A required metadata key is absent.
    #[error("missing metadata key '{key}'")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value has a type the getter does not accept.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the getter wanted.
        expected: &'static str,
        /// The value's GGUF type (`"u8"`, `"str"`, `"arr[f32]"`, ...).
        found: &'static str,
    },
    /// An integer value that does not fit the getter's type.
    #[error("metadata key '{key}': value {value} does not fit in {target}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value.
        value: i128,
        /// The requested type.
        target: &'static str,
    },
    /// A ggml call failed while loading a file's tensors
    /// ([`GgufFile::load_tensors`](super::GgufFile::load_tensors)).
    #[error(transparent)]
    Ggml(Box<crate::ggml::Error>),
}

fn origin(path: Option<&Path>) -> String {
    path.map_or_else(|| "buffer".to_owned(), |p| p.display().to_string())
}

fn show_magic(found: &[u8; 4]) -> String {
    let escaped: String = found
        .iter()
        .flat_map(|b| b.escape_ascii())
        .map(char::from)
        .collect();
    format!("\"{escaped}\"")
}

fn version_message(version: u32) -> String {
    match version {
        1 => "GGUF version 1 is no longer supported; convert the file to version 3".to_owned(),
        v if v != 0 && v & 0xFFFF == 0 => format!(
            "GGUF version {v:#010x} looks byte-swapped: big-endian GGUF files are not supported"
        ),
        v => format!("unsupported GGUF version {v} (supported: 2 and 3)"),
    }
}

impl From<crate::ggml::Error> for GgufError {
    fn from(e: crate::ggml::Error) -> Self {
        GgufError::Ggml(Box::new(e))
    }
}

impl From<crate::atomic_file::WriteError> for GgufError {
    fn from(e: crate::atomic_file::WriteError) -> Self {
        GgufError::Io {
            path: e.path,
            source: e.source,
        }
    }
}
