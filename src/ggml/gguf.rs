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

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::Mmap;

use super::dtype::DType;

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

/// Errors from reading, querying or writing GGUF files.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// Opening, mapping, creating, writing or renaming a file failed.
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
    /// Tensor data of the wrong length was given to [`GgufWriter::add_tensor`].
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

/// The type of a GGUF metadata value, with the ids used in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// `u8`.
    U8 = 0,
    /// `i8`.
    I8 = 1,
    /// `u16`.
    U16 = 2,
    /// `i16`.
    I16 = 3,
    /// `u32`.
    U32 = 4,
    /// `i32`.
    I32 = 5,
    /// `f32`.
    F32 = 6,
    /// Boolean, one byte.
    Bool = 7,
    /// UTF-8 string.
    String = 8,
    /// Homogeneous array.
    Array = 9,
    /// `u64`.
    U64 = 10,
    /// `i64`.
    I64 = 11,
    /// `f64`.
    F64 = 12,
}

impl ValueType {
    /// Looks up a type by its id in the file.
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The id stored in the file.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// gguf.cpp's short name (`"u8"`, `"str"`, `"arr"`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "str",
            Array => "arr",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Encoded size of one value, or `None` for strings and arrays.
    fn fixed_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// Boolean. Any nonzero byte reads as `true`, as in ggml; `true` is written as 1.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
    /// Homogeneous array (arrays of arrays do not exist in ggml's GGUF).
    Array(Array),
}

/// A homogeneous GGUF array. The variant carries the element type, so an empty
/// array round-trips exactly.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// Boolean elements.
    Bool(Vec<bool>),
    /// String elements.
    String(Vec<String>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

/// Applies `$e` to the vector inside any [`Array`] variant.
macro_rules! with_array {
    ($a:expr, $v:ident => $e:expr) => {
        match $a {
            Array::U8($v) => $e,
            Array::I8($v) => $e,
            Array::U16($v) => $e,
            Array::I16($v) => $e,
            Array::U32($v) => $e,
            Array::I32($v) => $e,
            Array::F32($v) => $e,
            Array::Bool($v) => $e,
            Array::String($v) => $e,
            Array::U64($v) => $e,
            Array::I64($v) => $e,
            Array::F64($v) => $e,
        }
    };
}

impl Value {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
            Value::Array(_) => ValueType::Array,
        }
    }

    /// Type name for messages: `"u32"`, `"str"`, or `"arr[f32]"` for arrays.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Array(a) => a.type_name(),
            v => v.value_type().name(),
        }
    }

    /// The value as an integer, if it is a scalar integer of any width.
    fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        with_array!(self, v => v.len())
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Type name for messages, such as `"arr[f32]"`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Array::U8(_) => "arr[u8]",
            Array::I8(_) => "arr[i8]",
            Array::U16(_) => "arr[u16]",
            Array::I16(_) => "arr[i16]",
            Array::U32(_) => "arr[u32]",
            Array::I32(_) => "arr[i32]",
            Array::F32(_) => "arr[f32]",
            Array::Bool(_) => "arr[bool]",
            Array::String(_) => "arr[str]",
            Array::U64(_) => "arr[u64]",
            Array::I64(_) => "arr[i64]",
            Array::F64(_) => "arr[f64]",
        }
    }

    /// The elements as integers, if the element type is an integer type.
    fn ints(&self) -> Option<Vec<i128>> {
        fn widen<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => widen(v),
            Array::I8(v) => widen(v),
            Array::U16(v) => widen(v),
            Array::I16(v) => widen(v),
            Array::U32(v) => widen(v),
            Array::I32(v) => widen(v),
            Array::U64(v) => widen(v),
            Array::I64(v) => widen(v),
            _ => return None,
        })
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant(v)
            }
        }
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Self {
                Array::$variant(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Self {
                Value::Array(Array::$variant(v))
            }
        }
    )*};
}

value_from!(
    u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64,
);

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::Array(Array::String(v.into_iter().map(str::to_owned).collect()))
    }
}

impl From<Array> for Value {
    fn from(v: Array) -> Self {
        Value::Array(v)
    }
}

/// Description of one tensor in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (at most [`MAX_TENSOR_NAME_LEN`] bytes).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Shape in ggml order (`ne[0]` is the contiguous row); unused dimensions are 1.
    pub ne: [u64; 4],
    /// Number of dimensions stored in the file, `0..=4` (0 means a scalar).
    pub n_dims: usize,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Size of the tensor data in bytes.
    ///
    /// Infos returned by [`GgufFile`] are validated, so this is exact for them; for a
    /// hand-built info with an invalid shape it returns `u64::MAX`.
    pub fn nbytes(&self) -> u64 {
        self.dtype.nbytes(self.ne).unwrap_or(u64::MAX)
    }

    /// Number of elements (saturating; exact for validated infos).
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().fold(1u64, |acc, &n| acc.saturating_mul(n))
    }

    /// The stored dimensions, `ne[0]` first (`&ne[..n_dims]`).
    pub fn shape(&self) -> &[u64] {
        &self.ne[..self.n_dims.min(MAX_DIMS)]
    }
}

/// Checks a tensor shape the way ggml does and returns it padded to four
/// dimensions together with the data size in bytes.
fn check_shape(tensor: &str, dtype: DType, dims: &[u64]) -> Result<([u64; 4], u64), GgufError> {
    if dims.len() > MAX_DIMS {
        return Err(GgufError::BadDims {
            tensor: tensor.to_owned(),
            n_dims: dims.len() as u64,
        });
    }
    let bad = |reason| GgufError::BadShape {
        tensor: tensor.to_owned(),
        ne: dims.to_vec(),
        reason,
    };
    // ggml stores dimensions as int64_t and rejects negative ones.
    if dims.iter().any(|&n| i64::try_from(n).is_err()) {
        return Err(bad("a dimension exceeds i64::MAX"));
    }
    let mut ne = [1u64; 4];
    ne[..dims.len()].copy_from_slice(dims);
    // Same left-to-right product as gguf.cpp: the element count must fit in int64_t.
    let count = ne.iter().try_fold(1u64, |acc, &n| {
        acc.checked_mul(n).filter(|&p| i64::try_from(p).is_ok())
    });
    if count.is_none() {
        return Err(bad("the element count overflows i64"));
    }
    if !ne[0].is_multiple_of(dtype.block_size() as u64) {
        return Err(GgufError::NotBlockAligned {
            tensor: tensor.to_owned(),
            dtype,
            ne0: ne[0],
        });
    }
    let nbytes = dtype
        .nbytes(ne)
        .ok_or_else(|| bad("the size in bytes overflows u64"))?;
    Ok((ne, nbytes))
}

fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? & !(alignment - 1))
}

fn check_alignment(alignment: u64) -> Result<u64, GgufError> {
    if alignment.is_power_of_two() && alignment <= u64::from(u32::MAX) {
        Ok(alignment)
    } else {
        Err(GgufError::BadAlignment(alignment))
    }
}

/// The alignment a metadata value selects: it must be a valid `u32`.
fn alignment_from(value: Option<&Value>) -> Result<u64, GgufError> {
    match value {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) => check_alignment(u64::from(*a)),
        Some(v) => Err(GgufError::WrongType {
            key: ALIGNMENT_KEY.to_owned(),
            expected: "u32",
            found: v.type_name(),
        }),
    }
}

// ---------------------------------------------------------------------------
// Reading

/// Bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Fixed-size little-endian scalars.
trait Scalar: Sized {
    fn read(r: &mut Reader<'_>, what: &dyn Fn() -> String) -> Result<Self, GgufError>;
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! scalar {
    ($($t:ty),*) => {$(
        impl Scalar for $t {
            fn read(r: &mut Reader<'_>, what: &dyn Fn() -> String) -> Result<Self, GgufError> {
                r.bytes::<{ std::mem::size_of::<$t>() }>(what).map(<$t>::from_le_bytes)
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}

scalar!(u8, i8, u16, i16, u32, i32, f32, u64, i64, f64);

impl<'a> Reader<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn bytes<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        match self.buf.get(self.pos..).and_then(<[u8]>::first_chunk::<N>) {
            Some(b) => {
                self.pos += N;
                Ok(*b)
            }
            None => Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
            }),
        }
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let buf = self.buf;
        match self
            .pos
            .checked_add(n)
            .and_then(|end| buf.get(self.pos..end))
        {
            Some(b) => {
                self.pos += n;
                Ok(b)
            }
            None => Err(GgufError::Truncated {
                what: what(),
                offset: self.offset(),
            }),
        }
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        u32::read(self, what)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        u64::read(self, what)
    }

    /// Checks that `count` items of at least `min_size` bytes each fit in the rest of
    /// the file and do not exceed `cap`, before anything is allocated for them.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        cap: u64,
        offset: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let limit = (self.remaining() / min_size).min(cap);
        match usize::try_from(count) {
            Ok(n) if count <= limit => Ok(n),
            _ => Err(GgufError::TooLarge {
                what: what(),
                offset,
                count,
                limit,
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let offset = self.offset();
        let len = self.u64(what)?;
        let len = self.check_count(len, 1, MAX_STRING_LEN, offset, &|| {
            format!("length of {}", what())
        })?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    fn vec<T: Scalar>(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<Vec<T>, GgufError> {
        // The caller checked that `n` elements fit in the file, so this is bounded by its size.
        (0..n).map(|_| T::read(self, what)).collect()
    }

    fn value(&mut self, ty: ValueType, key: &str) -> Result<Value, GgufError> {
        let what = &|| format!("value of key '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(Scalar::read(self, what)?),
            ValueType::I8 => Value::I8(Scalar::read(self, what)?),
            ValueType::U16 => Value::U16(Scalar::read(self, what)?),
            ValueType::I16 => Value::I16(Scalar::read(self, what)?),
            ValueType::U32 => Value::U32(Scalar::read(self, what)?),
            ValueType::I32 => Value::I32(Scalar::read(self, what)?),
            ValueType::F32 => Value::F32(Scalar::read(self, what)?),
            ValueType::Bool => Value::Bool(u8::read(self, what)? != 0),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::U64 => Value::U64(Scalar::read(self, what)?),
            ValueType::I64 => Value::I64(Scalar::read(self, what)?),
            ValueType::F64 => Value::F64(Scalar::read(self, what)?),
            ValueType::Array => Value::Array(self.array(key)?),
        })
    }

    fn array(&mut self, key: &str) -> Result<Array, GgufError> {
        let type_id = self.u32(&|| format!("element type of array '{key}'"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::BadValueType {
            key: key.to_owned(),
            type_id,
        })?;
        let nested = || GgufError::NestedArray {
            key: key.to_owned(),
        };
        if ty == ValueType::Array {
            return Err(nested());
        }
        let offset = self.offset();
        let count = self.u64(&|| format!("length of array '{key}'"))?;
        // A string element takes at least its 8-byte length prefix.
        let min_size = ty.fixed_size().unwrap_or(8);
        let n = self.check_count(count, min_size, MAX_ARRAY_LEN, offset, &|| {
            format!("length of array '{key}'")
        })?;
        let what = &|| format!("element of array '{key}'");
        Ok(match ty {
            ValueType::U8 => Array::U8(self.vec(n, what)?),
            ValueType::I8 => Array::I8(self.vec(n, what)?),
            ValueType::U16 => Array::U16(self.vec(n, what)?),
            ValueType::I16 => Array::I16(self.vec(n, what)?),
            ValueType::U32 => Array::U32(self.vec(n, what)?),
            ValueType::I32 => Array::I32(self.vec(n, what)?),
            ValueType::F32 => Array::F32(self.vec(n, what)?),
            ValueType::Bool => Array::Bool(
                self.vec::<u8>(n, what)?
                    .into_iter()
                    .map(|b| b != 0)
                    .collect(),
            ),
            ValueType::String => {
                let mut items = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    items.push(self.string(what)?);
                }
                Array::String(items)
            }
            ValueType::U64 => Array::U64(self.vec(n, what)?),
            ValueType::I64 => Array::I64(self.vec(n, what)?),
            ValueType::F64 => Array::F64(self.vec(n, what)?),
            ValueType::Array => return Err(nested()),
        })
    }
}

/// Everything in a GGUF file except the tensor data.
struct Header {
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    data_offset: u64,
}

/// Parses the header at the start of `buf`, which holds the first bytes of a file of
/// `file_size` bytes (all of them, or a prefix that ends after the header).
fn parse(buf: &[u8], file_size: u64, path: Option<&Path>) -> Result<Header, GgufError> {
    let mut r = Reader { buf, pos: 0 };

    let magic = r.bytes::<4>(&|| "magic".to_owned())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            path: path.map(Path::to_path_buf),
            found: magic,
        });
    }
    let version = r.u32(&|| "version".to_owned())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors_offset = r.offset();
    let n_tensors = r.u64(&|| "tensor count".to_owned())?;
    let n_kv_offset = r.offset();
    let n_kv = r.u64(&|| "metadata count".to_owned())?;
    let n_kv = r.check_count(n_kv, MIN_KV_BYTES, u64::MAX, n_kv_offset, &|| {
        "metadata count".to_owned()
    })?;
    let n_tensors = r.check_count(
        n_tensors,
        MIN_TENSOR_INFO_BYTES,
        u64::MAX,
        n_tensors_offset,
        &|| "tensor count".to_owned(),
    )?;

    let mut metadata = Vec::with_capacity(n_kv.min(MAX_PREALLOC));
    let mut key_index = HashMap::with_capacity(n_kv.min(MAX_PREALLOC));
    for i in 0..n_kv {
        let key = r.string(&|| format!("key of metadata pair #{i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { index: i as u64 });
        }
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey(key));
        }
        let type_id = r.u32(&|| format!("value type of key '{key}'"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::BadValueType {
            key: key.clone(),
            type_id,
        })?;
        let value = r.value(ty, &key)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    let alignment = alignment_from(
        key_index
            .get(ALIGNMENT_KEY)
            .and_then(|&i| metadata.get(i))
            .map(|(_, v)| v),
    )?;

    let mut tensors = Vec::with_capacity(n_tensors.min(MAX_PREALLOC));
    let mut tensor_index = HashMap::with_capacity(n_tensors.min(MAX_PREALLOC));
    for i in 0..n_tensors {
        let name = r.string(&|| format!("name of tensor #{i}"))?;
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::TensorNameTooLong { name });
        }
        if tensor_index.contains_key(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        let n_dims = r.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDims {
                tensor: name,
                n_dims: n_dims.into(),
            });
        }
        let mut dims = [0u64; MAX_DIMS];
        for d in &mut dims[..n_dims as usize] {
            *d = r.u64(&|| format!("shape of tensor '{name}'"))?;
        }
        let type_id = r.u32(&|| format!("type of tensor '{name}'"))?;
        let dtype = DType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        let (ne, _) = check_shape(&name, dtype, &dims[..n_dims as usize])?;
        let offset = r.u64(&|| format!("data offset of tensor '{name}'"))?;
        tensor_index.insert(name.clone(), tensors.len());
        tensors.push(TensorInfo {
            name,
            dtype,
            ne,
            n_dims: n_dims as usize,
            offset,
        });
    }

    // Like gguf.cpp, the data section is aligned only when there are tensors.
    let header_end = r.offset();
    let data_offset = if tensors.is_empty() {
        header_end
    } else {
        match align_up(header_end, alignment) {
            Some(d) if d <= file_size => d,
            _ => {
                return Err(GgufError::Truncated {
                    what: "padding before the tensor data section".to_owned(),
                    offset: header_end,
                })
            }
        }
    };
    check_tensor_ranges(&tensors, alignment, data_offset, file_size)?;

    Ok(Header {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

/// Checks tensor offsets the way gguf.cpp does, and that the data is inside the file.
///
/// ggml requires the tensors to be packed in file order, each padded to the
/// alignment, so every offset is determined by the tensors before it. This also
/// rules out overlapping data and catches headers whose alignment does not match
/// the layout. Unlike ggml's allocating loader, the padding after the last tensor
/// may be missing (ggml's mmap path does not need it either).
fn check_tensor_ranges(
    tensors: &[TensorInfo],
    alignment: u64,
    data_offset: u64,
    file_size: u64,
) -> Result<(), GgufError> {
    let mut expected = 0u64;
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        if t.offset != expected {
            return Err(GgufError::UnexpectedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                expected,
            });
        }
        let size = t.nbytes();
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(size));
        // `end <= file_size` makes the padded next offset overflow-free in practice;
        // it is still computed with checks.
        let next = t
            .offset
            .checked_add(size)
            .and_then(|e| align_up(e, alignment));
        match (end, next) {
            (Some(end), Some(next)) if end <= file_size => expected = next,
            _ => {
                return Err(GgufError::DataOutOfBounds {
                    tensor: t.name.clone(),
                    offset: start.unwrap_or(u64::MAX),
                    size,
                    file_size,
                })
            }
        }
    }
    Ok(())
}

enum Backing {
    /// A file on disk: the loader reads it with `pread` (a file that shrinks gives an error);
    /// the map serves only [`GgufFile::tensor_data`] and [`GgufFile::data_section`].
    Mmap {
        map: Mmap,
        file: File,
        /// Size and modification time when opened, to notice a file changed while in use.
        stamp: (u64, Option<std::time::SystemTime>),
    },
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap { map, .. } => map,
            Backing::Owned(v) => v,
        }
    }
}

/// Most header bytes [`GgufFile::open`] reads to parse a file's metadata and tensor infos.
pub const MAX_HEADER_BYTES: u64 = 256 << 20;

/// Reads `len` bytes at `offset` of `file` (positioned reads: the file's cursor is unused).
fn read_at(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    #[cfg(unix)]
    std::os::unix::fs::FileExt::read_exact_at(file, &mut buf, offset)?;
    #[cfg(not(unix))]
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = file;
        file.seek(SeekFrom::Start(offset))?;
        file.read_exact(&mut buf)?;
    }
    Ok(buf)
}

fn stamp_of(meta: &fs::Metadata) -> (u64, Option<std::time::SystemTime>) {
    (meta.len(), meta.modified().ok())
}

/// Parses the header of `file` (`file_size` bytes) from a growing prefix read with `read`,
/// never the whole file unless the header needs it.
fn parse_file(file: &File, file_size: u64, path: &Path) -> Result<Header, GgufError> {
    let io_err = |source| GgufError::Io {
        path: path.to_owned(),
        source,
    };
    let mut n = file_size.min(1 << 20);
    loop {
        let buf = read_at(file, 0, n as usize).map_err(io_err)?;
        match parse(&buf, file_size, Some(path)) {
            // The prefix ended inside the header: read more of it.
            Err(GgufError::Truncated { .. } | GgufError::TooLarge { .. })
                if n < file_size && n < MAX_HEADER_BYTES =>
            {
                n = file_size.min(n * 4).min(MAX_HEADER_BYTES);
            }
            Err(GgufError::Truncated { what, offset }) if n < file_size => {
                return Err(GgufError::Truncated {
                    what: format!("{what} (the header is larger than {MAX_HEADER_BYTES} bytes)"),
                    offset,
                })
            }
            result => return result,
        }
    }
}

/// A validated GGUF file whose tensor data is accessed in place.
///
/// All structure is checked by [`open`](Self::open): the header, every metadata
/// value, every tensor's shape, type and data range. Metadata getters come in two
/// forms: `get_*` fails with [`GgufError::MissingKey`] when the key is absent,
/// `opt_*` returns `Ok(None)`. Both fail with [`GgufError::WrongType`] when the
/// value has an unsuitable type.
///
/// Integer getters accept a value of any GGUF integer type whose value fits the
/// requested type (so a `u8`, `u16`, `u32`, or a non-negative `i32`/`i64`/`u64`
/// below 2^32 all satisfy [`get_u32`](Self::get_u32)); a value that does not fit
/// is [`GgufError::OutOfRange`]. Booleans and floats never convert to integers.
/// [`get_f32`](Self::get_f32) accepts only `f32`; [`get_f64`](Self::get_f64)
/// accepts `f32` and `f64`.
pub struct GgufFile {
    data: Backing,
    path: Option<PathBuf>,
    header: Header,
}

/// Generates the `get_*` getter that wraps an `opt_*` getter.
macro_rules! required {
    ($($(#[$doc:meta])* $get:ident => $opt:ident -> $t:ty;)*) => {$(
        $(#[$doc])*
        pub fn $get(&self, key: &str) -> Result<$t, GgufError> {
            self.$opt(key)?.ok_or_else(|| GgufError::MissingKey { key: key.to_owned() })
        }
    )*};
}

impl GgufFile {
    /// Opens and validates the GGUF file at `path`.
    ///
    /// The header is read with ordinary reads. [`read_tensor_data`](Self::read_tensor_data)
    /// (which the DA3 loader uses) copies tensors out with positioned reads too, so a file
    /// truncated or rewritten while it is open gives an error, never a crash. The file is
    /// also memory-mapped for the borrowing accessors [`tensor_data`](Self::tensor_data)
    /// and [`data_section`](Self::data_section): a caller of those must make sure the file is
    /// not modified or truncated while the value is alive (that can raise `SIGBUS`).
    /// Replacing the file by rename, as [`GgufWriter::write_to`] does, is fine on Unix.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io {
            path: path.to_owned(),
            source,
        };
        let file = File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(io_err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "it is a directory, not a GGUF file",
            )));
        }
        let stamp = stamp_of(&meta);
        let header = parse_file(&file, stamp.0, path)?;
        // SAFETY: `Mmap::map` is unsafe because the mapped bytes belong to a file that
        // can change behind our back. We open it read-only and never write through
        // the map, but nothing stops another process (or other code in this one)
        // from writing to or truncating the file while it is mapped. A write would
        // change bytes under the `&[u8]` borrows this type hands out, which breaks
        // Rust's aliasing rules (UB in principle; in practice the reader sees
        // inconsistent data, and since every access is bounds-checked against the
        // map's fixed length it cannot go out of bounds); a truncation makes reads of
        // the lost pages raise SIGBUS. Mapping touches no page: only `tensor_data` and
        // `data_section` read through the map, and their callers take on the obligation
        // documented above (like llama.cpp, candle and safetensors do); the header and
        // `read_tensor_data` use positioned reads instead. A rename-replace is harmless
        // because the map keeps the old inode.
        let map = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        Ok(GgufFile {
            data: Backing::Mmap { map, file, stamp },
            path: Some(path.to_owned()),
            header,
        })
    }

    /// Validates a GGUF file held in memory (no `unsafe`, no mapping).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_backing(Backing::Owned(bytes), None)
    }

    fn from_backing(data: Backing, path: Option<PathBuf>) -> Result<GgufFile, GgufError> {
        let bytes = data.bytes();
        let header = parse(bytes, bytes.len() as u64, path.as_deref())?;
        Ok(GgufFile { data, path, header })
    }

    /// The path given to [`open`](Self::open), or `None` for [`from_bytes`](Self::from_bytes).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Absolute file offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.data.bytes().len() as u64
    }

    /// Everything from the data section start to the end of the file; tensor
    /// offsets index into this slice.
    pub fn data_section(&self) -> &[u8] {
        let bytes = self.data.bytes();
        // `data_offset <= file size` is checked when parsing.
        bytes
            .get(self.header.data_offset as usize..)
            .unwrap_or_default()
    }

    /// Metadata pairs in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.header.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.header.key_index.get(key)?;
        self.header.metadata.get(i).map(|(_, v)| v)
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.header.tensors
    }

    /// The tensor called `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        let &i = self.header.tensor_index.get(name)?;
        self.header.tensors.get(i)
    }

    /// Lets the pages of `info`'s bytes leave this process's resident memory (they are read
    /// again from the file if touched later): a loader that copies each tensor out of the
    /// mapping then holds one tensor of the file resident at a time, not the whole file. No
    /// effect on files read into memory or on other systems than Unix.
    pub fn release_tensor_data(&self, info: &TensorInfo) {
        #[cfg(unix)]
        if let (Backing::Mmap { map, .. }, Ok(bytes)) = (&self.data, self.tensor_data(info)) {
            let offset = bytes.as_ptr() as usize - map.as_ptr() as usize;
            // SAFETY: a read-only file mapping: MADV_DONTNEED drops its pages and a later read
            // faults the same bytes in again from the file, as after an eviction under memory
            // pressure, so no slice handed out sees its contents change.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, bytes.len())
            };
        }
    }

    /// The raw bytes of a tensor, copied out of the file with positioned reads (borrowed for
    /// a file held in memory). Unlike [`tensor_data`](Self::tensor_data) this never reads
    /// through the memory map, so a file truncated since it was opened gives
    /// [`GgufError::Changed`] instead of `SIGBUS`.
    pub fn read_tensor_data(&self, info: &TensorInfo) -> Result<Cow<'_, [u8]>, GgufError> {
        let Backing::Mmap { file, .. } = &self.data else {
            return self.tensor_data(info).map(Cow::Borrowed);
        };
        let size = info.nbytes();
        let range = self
            .header
            .data_offset
            .checked_add(info.offset)
            .filter(|start| {
                start
                    .checked_add(size)
                    .is_some_and(|end| end <= self.file_size())
            })
            .zip(usize::try_from(size).ok());
        let Some((start, len)) = range else {
            return Err(GgufError::DataOutOfBounds {
                tensor: info.name.clone(),
                offset: self.header.data_offset.saturating_add(info.offset),
                size,
                file_size: self.file_size(),
            });
        };
        read_at(file, start, len).map(Cow::Owned).map_err(|e| {
            let now = file.metadata().map(|m| m.len()).ok();
            GgufError::Changed {
                path: self.path.clone().unwrap_or_default(),
                reason: match now {
                    Some(now) if now < start + size => format!(
                        "tensor '{}' ends at byte {}, but the file now has {now} bytes (truncated while in use)",
                        info.name,
                        start + size
                    ),
                    _ => format!("reading tensor '{}': {e}", info.name),
                },
            }
        })
    }

    /// Fails with [`GgufError::Changed`] if the file's size or modification time differ from
    /// when it was opened (it was rewritten in place while in use); `Ok` for files in memory.
    pub fn check_unchanged(&self) -> Result<(), GgufError> {
        let Backing::Mmap { file, stamp, .. } = &self.data else {
            return Ok(());
        };
        let now = file.metadata().map(|m| stamp_of(&m));
        match now {
            Ok(now) if now == *stamp => Ok(()),
            Ok((len, _)) => Err(GgufError::Changed {
                path: self.path.clone().unwrap_or_default(),
                reason: if len == stamp.0 {
                    "it was modified while it was being read".to_owned()
                } else {
                    format!(
                        "its size went from {} to {len} bytes while it was being read",
                        stamp.0
                    )
                },
            }),
            Err(source) => Err(GgufError::Io {
                path: self.path.clone().unwrap_or_default(),
                source,
            }),
        }
    }

    /// The raw bytes of a tensor, borrowed from the file.
    ///
    /// `info` should come from this file's [`tensors`](Self::tensors); an info from
    /// elsewhere gets whatever bytes its range covers here, or
    /// [`GgufError::DataOutOfBounds`] if that range is outside the file.
    pub fn tensor_data(&self, info: &TensorInfo) -> Result<&[u8], GgufError> {
        let size = info.nbytes();
        let start = self.header.data_offset.checked_add(info.offset);
        let bytes = self.data.bytes();
        start
            .and_then(|s| {
                Some(usize::try_from(s).ok()?..usize::try_from(s.checked_add(size)?).ok()?)
            })
            .and_then(|range| bytes.get(range))
            .ok_or_else(|| GgufError::DataOutOfBounds {
                tensor: info.name.clone(),
                offset: start.unwrap_or(u64::MAX),
                size,
                file_size: self.file_size(),
            })
    }

    fn int<T: TryFrom<i128>>(
        &self,
        key: &str,
        target: &'static str,
    ) -> Result<Option<T>, GgufError> {
        let Some(int) = self.typed(key, target, Value::as_int)? else {
            return Ok(None);
        };
        T::try_from(int)
            .map(Some)
            .map_err(|_| GgufError::OutOfRange {
                key: key.to_owned(),
                value: int,
                target,
            })
    }

    fn typed<'s, T>(
        &'s self,
        key: &str,
        expected: &'static str,
        pick: impl FnOnce(&'s Value) -> Option<T>,
    ) -> Result<Option<T>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        pick(value).map(Some).ok_or_else(|| GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: value.type_name(),
        })
    }

    /// `key` as a `u32`, or `None` if absent (integer conversion rules above).
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.int(key, "u32")
    }

    /// `key` as an `i32`, or `None` if absent.
    pub fn opt_i32(&self, key: &str) -> Result<Option<i32>, GgufError> {
        self.int(key, "i32")
    }

    /// `key` as a `u64`, or `None` if absent.
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.int(key, "u64")
    }

    /// `key` as an `i64`, or `None` if absent.
    pub fn opt_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        self.int(key, "i64")
    }

    /// `key` as an `f32` (only an `f32` value qualifies), or `None` if absent.
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.typed(key, "f32", |v| match *v {
            Value::F32(x) => Some(x),
            _ => None,
        })
    }

    /// `key` as an `f64` (an `f32` or `f64` value), or `None` if absent.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, GgufError> {
        self.typed(key, "f64", |v| match *v {
            Value::F32(x) => Some(x.into()),
            Value::F64(x) => Some(x),
            _ => None,
        })
    }

    /// `key` as a `bool`, or `None` if absent.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.typed(key, "bool", |v| match *v {
            Value::Bool(x) => Some(x),
            _ => None,
        })
    }

    /// `key` as a string, or `None` if absent.
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.typed(key, "str", |v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
    }

    /// `key` as an array of any element type, or `None` if absent.
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.typed(key, "arr", |v| match v {
            Value::Array(a) => Some(a),
            _ => None,
        })
    }

    /// `key` as an array of `i32`, or `None` if absent. Any integer element type
    /// is accepted if every element fits in `i32`.
    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        let Some(ints) = self.typed(key, "arr[i32]", |v| match v {
            Value::Array(a) => a.ints(),
            _ => None,
        })?
        else {
            return Ok(None);
        };
        ints.into_iter()
            .map(|x| {
                i32::try_from(x).map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    value: x,
                    target: "i32",
                })
            })
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// `key` as an array of `f32` (element type must be `f32`), or `None` if absent.
    pub fn opt_f32_array(&self, key: &str) -> Result<Option<&[f32]>, GgufError> {
        self.typed(key, "arr[f32]", |v| match v {
            Value::Array(Array::F32(a)) => Some(a.as_slice()),
            _ => None,
        })
    }

    /// `key` as an array of strings, or `None` if absent.
    pub fn opt_str_array(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        self.typed(key, "arr[str]", |v| match v {
            Value::Array(Array::String(a)) => Some(a.as_slice()),
            _ => None,
        })
    }

    required! {
        /// `key` as a `u32` (see the integer conversion rules above).
        get_u32 => opt_u32 -> u32;
        /// `key` as an `i32`.
        get_i32 => opt_i32 -> i32;
        /// `key` as a `u64`.
        get_u64 => opt_u64 -> u64;
        /// `key` as an `i64`.
        get_i64 => opt_i64 -> i64;
        /// `key` as an `f32`; only an `f32` value qualifies.
        get_f32 => opt_f32 -> f32;
        /// `key` as an `f64`; an `f32` or `f64` value qualifies.
        get_f64 => opt_f64 -> f64;
        /// `key` as a `bool`.
        get_bool => opt_bool -> bool;
        /// `key` as a string.
        get_str => opt_str -> &str;
        /// `key` as an array of any element type.
        get_array => opt_array -> &Array;
        /// `key` as an array of `i32` (any integer element type whose values fit).
        get_i32_array => opt_i32_array -> Vec<i32>;
        /// `key` as an array of `f32`.
        get_f32_array => opt_f32_array -> &[f32];
        /// `key` as an array of strings.
        get_str_array => opt_str_array -> &[String];
    }
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("alignment", &self.header.alignment)
            .field("n_kv", &self.header.metadata.len())
            .field("n_tensors", &self.header.tensors.len())
            .field("data_offset", &self.header.data_offset)
            .field("file_size", &self.file_size())
            .finish()
    }
}

// ---------------------------------------------------------------------------
// Writing

struct PendingTensor<'a> {
    info: TensorInfo,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF v3 file in memory and writes it out.
///
/// Metadata keeps insertion order; tensors are laid out in insertion order, each
/// padded to the alignment, exactly as ggml's `gguf_write_to_file` does, so ggml
/// and this module's reader both accept the result. Tensor data is borrowed when
/// given as `&[u8]` (for example straight from another [`GgufFile`]) and owned
/// when given as `Vec<u8>`.
#[derive(Default)]
pub struct GgufWriter<'a> {
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<PendingTensor<'a>>,
    tensor_names: HashSet<String>,
}

impl<'a> GgufWriter<'a> {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, replacing (in place) any previous value.
    ///
    /// Keys are checked when writing: an empty key, or an [`ALIGNMENT_KEY`] that
    /// is not a valid `u32` alignment, makes the write fail.
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<Value>) -> &mut Self {
        let key = key.into();
        let value = value.into();
        let existing = self.key_index.get(&key).copied();
        match existing.and_then(|i| self.metadata.get_mut(i)) {
            Some(slot) => slot.1 = value,
            None => {
                self.key_index.insert(key.clone(), self.metadata.len());
                self.metadata.push((key, value));
            }
        }
        self
    }

    /// The value set for `key`, if any.
    pub fn get(&self, key: &str) -> Option<&Value> {
        let &i = self.key_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// Sets the data alignment (stored as the `u32` key [`ALIGNMENT_KEY`]).
    ///
    /// Fails with [`GgufError::BadAlignment`] unless `alignment` is a power of two
    /// that fits in `u32`.
    pub fn set_alignment(&mut self, alignment: u64) -> Result<&mut Self, GgufError> {
        let a = u32::try_from(check_alignment(alignment)?)
            .map_err(|_| GgufError::BadAlignment(alignment))?;
        Ok(self.set(ALIGNMENT_KEY, a))
    }

    /// Adds a tensor. `ne` is the shape in ggml order (`ne[0]` is the row), 0 to 4
    /// dimensions; `data` must be exactly the tensor's size in bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        ne: &[u64],
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<(), GgufError> {
        let name = name.into();
        if name.len() > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::TensorNameTooLong { name });
        }
        if self.tensor_names.contains(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        let (ne4, nbytes) = check_shape(&name, dtype, ne)?;
        let data = data.into();
        if data.len() as u64 != nbytes {
            return Err(GgufError::DataSizeMismatch {
                tensor: name,
                dtype,
                expected: nbytes,
                actual: data.len() as u64,
            });
        }
        self.tensor_names.insert(name.clone());
        self.tensors.push(PendingTensor {
            info: TensorInfo {
                name,
                dtype,
                ne: ne4,
                n_dims: ne.len(),
                offset: 0, // assigned when the header is encoded
            },
            data,
        });
        Ok(())
    }

    /// Encodes everything before the tensor data, padded to the alignment, after
    /// validating the metadata. Returns the header and the alignment.
    fn encode_header(&self) -> Result<(Vec<u8>, u64), GgufError> {
        let alignment = alignment_from(self.get(ALIGNMENT_KEY))?;
        let mut h = Vec::new();
        h.extend_from_slice(&GGUF_MAGIC);
        GGUF_VERSION.write(&mut h);
        (self.tensors.len() as u64).write(&mut h);
        (self.metadata.len() as u64).write(&mut h);
        for (i, (key, value)) in self.metadata.iter().enumerate() {
            if key.is_empty() {
                return Err(GgufError::EmptyKey { index: i as u64 });
            }
            put_str(&mut h, key, &|| "metadata key".to_owned())?;
            put_value(&mut h, key, value)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            let info = &t.info;
            put_str(&mut h, &info.name, &|| "tensor name".to_owned())?;
            (info.n_dims as u32).write(&mut h);
            for &n in info.shape() {
                n.write(&mut h);
            }
            info.dtype.id().write(&mut h);
            offset.write(&mut h);
            // In-memory data cannot really overflow u64, but stay panic-free.
            offset = (t.data.len() as u64)
                .checked_add(offset)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| GgufError::TooLarge {
                    what: format!("data offset of tensor '{}'", info.name),
                    offset: 0,
                    count: offset,
                    limit: u64::MAX,
                })?;
        }
        let padded = align_up(h.len() as u64, alignment).unwrap_or(h.len() as u64);
        h.resize(padded as usize, 0);
        Ok((h, alignment))
    }

    fn write_body(&self, header: &[u8], alignment: u64, w: &mut dyn Write) -> io::Result<u64> {
        w.write_all(header)?;
        let mut written = header.len() as u64;
        for t in &self.tensors {
            w.write_all(&t.data)?;
            let len = t.data.len() as u64;
            let pad = align_up(len, alignment).unwrap_or(len) - len;
            write_zeros(w, pad)?;
            written += len + pad;
        }
        w.flush()?;
        Ok(written)
    }

    /// Writes the file to `w` and returns the number of bytes written.
    pub fn write_to_writer(&self, mut w: impl Write) -> Result<u64, GgufError> {
        let (header, alignment) = self.encode_header()?;
        self.write_body(&header, alignment, &mut w)
            .map_err(GgufError::Write)
    }

    /// Writes the file to `path` atomically and returns its size.
    ///
    /// The data goes to a new temporary file in the same directory, which is
    /// flushed to disk (`fsync`) and then renamed over `path`; the directory is
    /// then synced on Unix (best effort). On any error the temporary file is
    /// removed and `path` is left as it was. Validation errors are reported before
    /// anything is created. The new file gets default permissions, and a symlink
    /// at `path` is replaced rather than followed.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<u64, GgufError> {
        let path = path.as_ref();
        let (header, alignment) = self.encode_header()?;
        let io_err = |p: &Path| {
            let p = p.to_owned();
            move |source| GgufError::Io { path: p, source }
        };

        let (tmp, file) = create_temp_beside(path).map_err(io_err(path))?;
        let mut out = io::BufWriter::with_capacity(1 << 20, file);
        let written = self
            .write_body(&header, alignment, &mut out)
            .map_err(io_err(&tmp.0))?;
        let file = out
            .into_inner()
            .map_err(|e| io_err(&tmp.0)(e.into_error()))?;
        file.sync_all().map_err(io_err(&tmp.0))?;
        drop(file);
        fs::rename(&tmp.0, path).map_err(io_err(path))?;
        tmp.disarm();
        sync_parent_dir(path);
        Ok(written)
    }
}

impl fmt::Debug for GgufWriter<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufWriter")
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

fn put_str(h: &mut Vec<u8>, s: &str, what: &dyn Fn() -> String) -> Result<(), GgufError> {
    if s.len() as u64 > MAX_STRING_LEN {
        return Err(GgufError::TooLarge {
            what: what(),
            offset: h.len() as u64,
            count: s.len() as u64,
            limit: MAX_STRING_LEN,
        });
    }
    (s.len() as u64).write(h);
    h.extend_from_slice(s.as_bytes());
    Ok(())
}

fn put_value(h: &mut Vec<u8>, key: &str, value: &Value) -> Result<(), GgufError> {
    value.value_type().id().write(h);
    let what = &|| format!("string value of key '{key}'");
    match value {
        Value::U8(x) => x.write(h),
        Value::I8(x) => x.write(h),
        Value::U16(x) => x.write(h),
        Value::I16(x) => x.write(h),
        Value::U32(x) => x.write(h),
        Value::I32(x) => x.write(h),
        Value::F32(x) => x.write(h),
        Value::Bool(x) => u8::from(*x).write(h),
        Value::String(s) => put_str(h, s, what)?,
        Value::U64(x) => x.write(h),
        Value::I64(x) => x.write(h),
        Value::F64(x) => x.write(h),
        Value::Array(a) => {
            a.elem_type().id().write(h);
            let len = a.len() as u64;
            if len > MAX_ARRAY_LEN {
                return Err(GgufError::TooLarge {
                    what: format!("length of array '{key}'"),
                    offset: h.len() as u64,
                    count: len,
                    limit: MAX_ARRAY_LEN,
                });
            }
            len.write(h);
            match a {
                Array::Bool(v) => v.iter().for_each(|&b| u8::from(b).write(h)),
                Array::String(v) => {
                    for s in v {
                        put_str(h, s, what)?;
                    }
                }
                Array::U8(v) => h.extend_from_slice(v),
                Array::I8(v) => v.iter().for_each(|x| x.write(h)),
                Array::U16(v) => v.iter().for_each(|x| x.write(h)),
                Array::I16(v) => v.iter().for_each(|x| x.write(h)),
                Array::U32(v) => v.iter().for_each(|x| x.write(h)),
                Array::I32(v) => v.iter().for_each(|x| x.write(h)),
                Array::F32(v) => v.iter().for_each(|x| x.write(h)),
                Array::U64(v) => v.iter().for_each(|x| x.write(h)),
                Array::I64(v) => v.iter().for_each(|x| x.write(h)),
                Array::F64(v) => v.iter().for_each(|x| x.write(h)),
            }
        }
    }
    Ok(())
}

fn write_zeros(w: &mut dyn Write, mut n: u64) -> io::Result<()> {
    const ZEROS: [u8; 4096] = [0; 4096];
    while n > 0 {
        let chunk = n.min(ZEROS.len() as u64) as usize;
        w.write_all(&ZEROS[..chunk])?;
        n -= chunk as u64;
    }
    Ok(())
}

/// A temporary file that is deleted on drop unless disarmed.
struct TempPath(PathBuf);

impl TempPath {
    fn disarm(self) {
        std::mem::forget(self);
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Creates a new, uniquely named file next to `path`.
fn create_temp_beside(path: &Path) -> io::Result<(TempPath, File)> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path does not name a file"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut last_err = None;
    for _ in 0..64 {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.{n}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(file) => return Ok((TempPath(tmp), file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("could not create a temporary file")))
}

/// Makes a completed rename durable; failure is ignored because the new file is
/// already in place and complete.
fn sync_parent_dir(path: &Path) {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
    }
    #[cfg(not(unix))]
    let _ = path;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Independent byte-level GGUF builder for crafting valid and corrupt files.
    struct Raw(Vec<u8>);

    impl Raw {
        fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
            Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
        }
        fn u32(mut self, v: u32) -> Raw {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Raw {
            self.0.extend_from_slice(&v.to_le_bytes());
            self
        }
        fn bytes(mut self, b: &[u8]) -> Raw {
            self.0.extend_from_slice(b);
            self
        }
        fn str(self, s: &str) -> Raw {
            self.u64(s.len() as u64).bytes(s.as_bytes())
        }
        fn kv_u32(self, key: &str, v: u32) -> Raw {
            self.str(key).u32(4).u32(v)
        }
        fn tensor(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Raw {
            let mut r = self.str(name).u32(dims.len() as u32);
            for &d in dims {
                r = r.u64(d);
            }
            r.u32(type_id).u64(offset)
        }
        fn pad(mut self, alignment: usize) -> Raw {
            while !self.0.len().is_multiple_of(alignment) {
                self.0.push(0);
            }
            self
        }
        fn zeros(mut self, n: usize) -> Raw {
            self.0.resize(self.0.len() + n, 0);
            self
        }
        fn open(self) -> Result<GgufFile, GgufError> {
            GgufFile::from_bytes(self.0)
        }
    }

    /// Deterministic xorshift64* generator.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    macro_rules! assert_err {
        ($res:expr, $pat:pat $(if $guard:expr)?) => {
            match $res {
                Err($pat) $(if $guard)? => {}
                other => panic!("expected {}, got {:?}", stringify!($pat), other),
            }
        };
    }

    fn all_metadata() -> Vec<(&'static str, Value)> {
        vec![
            ("general.architecture", "depth-anything-3".into()),
            ("u8", Value::U8(200)),
            ("i8", Value::I8(-100)),
            ("u16", Value::U16(60_000)),
            ("i16", Value::I16(-30_000)),
            ("u32", Value::U32(4_000_000_000)),
            ("i32", Value::I32(-2_000_000_000)),
            ("f32", Value::F32(1.5e-7)),
            ("bool.true", Value::Bool(true)),
            ("bool.false", Value::Bool(false)),
            ("unicode", "深度 — ünïcødé 🦀".into()),
            ("empty.string", "".into()),
            ("u64", Value::U64(u64::MAX)),
            ("i64", Value::I64(i64::MIN)),
            ("f64", Value::F64(-std::f64::consts::PI)),
            ("arr.u8", vec![0u8, 1, 255].into()),
            ("arr.i8", vec![-128i8, 127].into()),
            ("arr.u16", vec![1u16, 65535].into()),
            ("arr.i16", vec![-1i16, 2].into()),
            ("arr.u32", vec![7u32; 5].into()),
            ("arr.i32", vec![-1i32, 0, 1, i32::MAX].into()),
            ("arr.f32", vec![0.5f32, -0.0, f32::INFINITY].into()),
            ("arr.bool", vec![true, false, true].into()),
            ("arr.str", vec!["a", "", "ß", "long string 🦀"].into()),
            ("arr.u64", vec![u64::MAX, 0].into()),
            ("arr.i64", vec![i64::MIN, i64::MAX].into()),
            ("arr.f64", vec![1e300f64, -1e-300].into()),
            ("arr.empty.f32", Array::F32(vec![]).into()),
            ("arr.empty.str", Array::String(vec![]).into()),
            ("arr.empty.bool", Array::Bool(vec![]).into()),
        ]
    }

    fn all_tensors(rng: &mut Rng) -> Vec<(&'static str, DType, Vec<u64>, Vec<u8>)> {
        let specs: [(&str, DType, &[u64]); 7] = [
            ("f32.vec", DType::F32, &[3]),
            ("f16.mat", DType::F16, &[5, 3]),
            ("bf16.3d", DType::BF16, &[4, 3, 2]),
            ("q8_0.w", DType::Q8_0, &[64, 3]),
            ("q4_K.w", DType::Q4_K, &[512, 2, 1, 2]),
            ("i32.idx", DType::I32, &[7]),
            ("empty", DType::F32, &[0, 4]),
        ];
        specs
            .into_iter()
            .map(|(name, dtype, ne)| {
                let mut ne4 = [1; 4];
                ne4[..ne.len()].copy_from_slice(ne);
                let n = dtype.nbytes(ne4).unwrap() as usize;
                (name, dtype, ne.to_vec(), rng.bytes(n))
            })
            .collect()
    }

    fn sample_writer(rng: &mut Rng) -> GgufWriter<'static> {
        let mut w = GgufWriter::new();
        for (k, v) in all_metadata() {
            w.set(k, v);
        }
        for (name, dtype, ne, data) in all_tensors(rng) {
            w.add_tensor(name, dtype, &ne, data).unwrap();
        }
        w
    }

    fn sample_bytes() -> Vec<u8> {
        let mut out = Vec::new();
        sample_writer(&mut Rng(7))
            .write_to_writer(&mut out)
            .unwrap();
        out
    }

    #[test]
    fn round_trip_every_type_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.gguf");
        let mut rng = Rng(42);
        let w = sample_writer(&mut rng);
        let size = w.write_to(&path).unwrap();

        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.file_size(), size);
        assert_eq!(f.path(), Some(path.as_path()));
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), DEFAULT_ALIGNMENT);
        assert_eq!(f.data_offset() % 32, 0);

        let expected = all_metadata();
        assert_eq!(f.metadata().len(), expected.len());
        for ((k, v), (ek, ev)) in f.metadata().zip(&expected) {
            assert_eq!((k, v), (*ek, ev));
        }
        assert_eq!(f.get("unicode"), Some(&Value::from("深度 — ünïcødé 🦀")));
        assert_eq!(f.get("arr.empty.str").unwrap().type_name(), "arr[str]");

        let tensors = all_tensors(&mut Rng(42));
        assert_eq!(f.tensors().len(), tensors.len());
        let mut expected_offset = 0;
        for (info, (name, dtype, ne, data)) in f.tensors().iter().zip(&tensors) {
            assert_eq!(info.name, *name);
            assert_eq!(info.dtype, *dtype);
            assert_eq!(info.shape(), ne.as_slice());
            assert_eq!(info.n_dims, ne.len());
            assert_eq!(info.nbytes(), data.len() as u64);
            // ggml's reader requires exactly this packed layout.
            assert_eq!(info.offset, expected_offset);
            expected_offset = align_up(expected_offset + info.nbytes(), 32).unwrap();
            assert_eq!(f.tensor_data(info).unwrap(), data.as_slice());
            assert_eq!(f.tensor(name), Some(info));
            // Released pages are read again from the file: the bytes do not change.
            f.release_tensor_data(info);
            assert_eq!(f.tensor_data(info).unwrap(), data.as_slice());
        }
        assert_eq!(f.tensor("q4_K.w").unwrap().ne, [512, 2, 1, 2]);
        assert_eq!(f.tensor("nope"), None);
        assert_eq!(f.file_size(), f.data_offset() + expected_offset);
        assert_eq!(f.data_section().len() as u64, expected_offset);
        // Nothing but the output file is left in the directory.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn rewrite_is_byte_identical() {
        let mut original = sample_bytes();
        // Add a NaN with a payload: bits must survive untouched.
        let mut w = sample_writer(&mut Rng(7));
        w.set("nan", f32::from_bits(0x7fc0_1234));
        original.clear();
        w.write_to_writer(&mut original).unwrap();

        let f = GgufFile::from_bytes(original.clone()).unwrap();
        let mut w2 = GgufWriter::new();
        for (k, v) in f.metadata() {
            w2.set(k, v.clone());
        }
        for t in f.tensors() {
            w2.add_tensor(
                t.name.clone(),
                t.dtype,
                t.shape(),
                f.tensor_data(t).unwrap(),
            )
            .unwrap();
        }
        let mut again = Vec::new();
        w2.write_to_writer(&mut again).unwrap();
        assert_eq!(again, original);
    }

    #[test]
    fn writer_output_matches_ggml_layout_byte_for_byte() {
        let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut w = GgufWriter::new();
        w.set("a", 7u32);
        w.add_tensor("w", DType::F32, &[2], data.as_slice())
            .unwrap();
        let mut out = Vec::new();
        assert_eq!(w.write_to_writer(&mut out).unwrap(), 128);
        let expected = Raw::new(3, 1, 1)
            .kv_u32("a", 7)
            .tensor("w", &[2], 0, 0)
            .pad(32)
            .bytes(&data)
            .pad(32);
        assert_eq!(out, expected.0);
    }

    #[test]
    fn custom_alignment_and_replacing_keys() {
        let mut w = GgufWriter::new();
        w.set("first", 1u32).set("second", "x");
        w.set_alignment(64).unwrap();
        w.set("first", "replaced");
        w.add_tensor("a", DType::I8, &[3], vec![1, 2, 3]).unwrap();
        w.add_tensor("b", DType::I8, &[1], vec![9]).unwrap();
        let mut out = Vec::new();
        w.write_to_writer(&mut out).unwrap();
        let f = GgufFile::from_bytes(out).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.data_offset() % 64, 0);
        let keys: Vec<_> = f.metadata().map(|(k, _)| k).collect();
        assert_eq!(keys, ["first", "second", ALIGNMENT_KEY]);
        assert_eq!(f.get_str("first").unwrap(), "replaced");
        assert_eq!(f.tensor("b").unwrap().offset, 64);
        assert_eq!(f.tensor_data(f.tensor("b").unwrap()).unwrap(), [9]);
        assert_eq!(f.file_size(), f.data_offset() + 128);

        for bad in [0, 3, 48, 1 << 32] {
            assert_err!(w.set_alignment(bad), GgufError::BadAlignment(b) if b == bad);
        }
    }

    #[test]
    fn zero_tensor_file_and_scalar_tensor() {
        let mut w = GgufWriter::new();
        w.set("only", true);
        let mut out = Vec::new();
        w.write_to_writer(&mut out).unwrap();
        let f = GgufFile::from_bytes(out).unwrap();
        assert!(f.tensors().is_empty());
        assert!(f.get_bool("only").unwrap());

        // n_dims = 0 is a scalar in gguf.cpp.
        let f = Raw::new(3, 1, 0)
            .tensor("s", &[], 0, 0)
            .pad(32)
            .zeros(4)
            .open()
            .unwrap();
        let t = &f.tensors()[0];
        assert_eq!((t.n_dims, t.ne, t.nbytes()), (0, [1; 4], 4));
    }

    #[test]
    fn version_2_is_read() {
        let f = Raw::new(2, 1, 0)
            .tensor("t", &[4], 0, 0)
            .pad(32)
            .zeros(16)
            .open()
            .unwrap();
        assert_eq!(f.version(), 2);
    }

    #[test]
    fn truncated_at_every_offset() {
        let bytes = sample_bytes();
        let f = GgufFile::from_bytes(bytes.clone()).unwrap();
        let data_offset = f.data_offset() as usize;
        let last = f
            .tensors()
            .iter()
            .map(|t| t.offset + t.nbytes())
            .max()
            .unwrap();
        let data_end = data_offset + last as usize;
        for cut in 0..bytes.len() {
            let res = GgufFile::from_bytes(bytes[..cut].to_vec());
            if cut < data_offset {
                assert!(
                    matches!(
                        res,
                        Err(GgufError::Truncated { .. } | GgufError::TooLarge { .. })
                    ),
                    "cut at {cut}: {res:?}"
                );
            } else if cut < data_end {
                assert_err!(res, GgufError::DataOutOfBounds { .. });
            } else {
                // Only the trailing padding is missing; the data is all there.
                assert!(res.is_ok(), "cut at {cut}: {res:?}");
            }
        }
    }

    #[test]
    fn bad_magic_and_versions() {
        let mut bytes = sample_bytes();
        bytes[..4].copy_from_slice(b"GGML");
        match GgufFile::from_bytes(bytes) {
            Err(e @ GgufError::BadMagic { found, .. }) => {
                assert_eq!(&found, b"GGML");
                assert!(e.to_string().contains("\"GGML\""), "{e}");
            }
            other => panic!("{other:?}"),
        }
        for v in [0, 1, 4, 99, 3 << 24] {
            assert_err!(Raw::new(v, 0, 0).open(), GgufError::UnsupportedVersion(x) if x == v);
        }
        assert_err!(
            GgufFile::from_bytes(b"GG".to_vec()),
            GgufError::Truncated { offset: 0, .. }
        );
    }

    #[test]
    fn absurd_counts_are_rejected_before_allocating() {
        assert_err!(
            Raw::new(3, 1 << 60, 0).open(),
            GgufError::TooLarge { count, .. } if count == 1 << 60
        );
        assert_err!(Raw::new(3, 0, u64::MAX).open(), GgufError::TooLarge { .. });
        // Key length.
        assert_err!(
            Raw::new(3, 0, 1).u64(1 << 62).zeros(64).open(),
            GgufError::TooLarge { count, .. } if count == 1 << 62
        );
        // String value length.
        assert_err!(
            Raw::new(3, 0, 1)
                .str("k")
                .u32(8)
                .u64(u64::MAX)
                .zeros(64)
                .open(),
            GgufError::TooLarge { .. }
        );
        // Array count, for fixed-size and string elements.
        for elem in [0, 8, 12] {
            assert_err!(
                Raw::new(3, 0, 1)
                    .str("k")
                    .u32(9)
                    .u32(elem)
                    .u64(1 << 61)
                    .zeros(64)
                    .open(),
                GgufError::TooLarge { .. }
            );
        }
        // Tensor name length.
        assert_err!(
            Raw::new(3, 1, 0).u64(1 << 40).zeros(32).open(),
            GgufError::TooLarge { .. }
        );
    }

    #[test]
    fn bad_values() {
        assert_err!(
            Raw::new(3, 0, 1).str("k").u32(13).u32(0).open(),
            GgufError::BadValueType { type_id: 13, .. }
        );
        assert_err!(
            Raw::new(3, 0, 1).str("k").u32(9).u32(99).u64(0).open(),
            GgufError::BadValueType { type_id: 99, .. }
        );
        assert_err!(
            Raw::new(3, 0, 1).str("k").u32(9).u32(9).u64(0).open(),
            GgufError::NestedArray { .. }
        );
        assert_err!(
            Raw::new(3, 0, 1)
                .u64(2)
                .bytes(&[0xff, 0xfe])
                .u32(4)
                .u32(0)
                .open(),
            GgufError::InvalidUtf8 { offset: 24, .. }
        );
        assert_err!(
            Raw::new(3, 0, 1)
                .str("k")
                .u32(8)
                .u64(1)
                .bytes(&[0x80])
                .open(),
            GgufError::InvalidUtf8 { .. }
        );
        assert_err!(
            Raw::new(3, 0, 1).kv_u32("", 1).open(),
            GgufError::EmptyKey { index: 0 }
        );
        assert_err!(
            Raw::new(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).open(),
            GgufError::DuplicateKey(k) if k == "k"
        );
        // A bool byte other than 0/1 reads as true, as in ggml.
        let f = Raw::new(3, 0, 1)
            .str("b")
            .u32(7)
            .bytes(&[2])
            .open()
            .unwrap();
        assert!(f.get_bool("b").unwrap());
    }

    #[test]
    fn bad_alignment_in_file() {
        for a in [0, 3, 24] {
            assert_err!(
                Raw::new(3, 0, 1).kv_u32(ALIGNMENT_KEY, a).open(),
                GgufError::BadAlignment(x) if x == u64::from(a)
            );
        }
        assert_err!(
            Raw::new(3, 0, 1).str(ALIGNMENT_KEY).u32(10).u64(32).open(),
            GgufError::WrongType {
                expected: "u32",
                found: "u64",
                ..
            }
        );
        let f = Raw::new(3, 1, 1)
            .kv_u32(ALIGNMENT_KEY, 1)
            .tensor("t", &[3], 24, 0)
            .zeros(3)
            .open()
            .unwrap();
        assert_eq!(
            (f.alignment(), f.tensor_data(&f.tensors()[0]).unwrap().len()),
            (1, 3)
        );
    }

    #[test]
    fn bad_tensor_infos() {
        let one = |name: &str, dims: &[u64], ty: u32, offset: u64| {
            Raw::new(3, 1, 0)
                .tensor(name, dims, ty, offset)
                .pad(32)
                .zeros(4096)
                .open()
        };
        assert_err!(
            one("t", &[1; 5], 0, 0),
            GgufError::BadDims { n_dims: 5, .. }
        );
        assert_err!(
            Raw::new(3, 1, 0).str("t").u32(u32::MAX).zeros(64).open(),
            GgufError::BadDims { .. }
        );
        // Zero-sized dimensions are allowed by gguf.cpp.
        let f = one("t", &[0], 0, 0).unwrap();
        assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap(), &[] as &[u8]);
        assert_err!(one("t", &[1 << 63], 0, 0), GgufError::BadShape { .. });
        assert_err!(
            one("t", &[1 << 32, 1 << 32], 0, 0),
            GgufError::BadShape { .. }
        );
        assert_err!(
            one("t", &[1 << 40, 1 << 40, 0], 0, 0),
            GgufError::BadShape { .. }
        );
        // Element count fits in i64 but the byte size does not fit in u64.
        assert_err!(one("t", &[1 << 62], 28, 0), GgufError::BadShape { .. });
        for ty in [4, 5, 31, 36, 43, u32::MAX] {
            assert_err!(one("t", &[32], ty, 0), GgufError::UnknownTensorType { type_id, .. } if type_id == ty);
        }
        assert_err!(
            one("t", &[100], DType::Q4_K.id(), 0),
            GgufError::NotBlockAligned {
                ne0: 100,
                dtype: DType::Q4_K,
                ..
            }
        );
        assert_err!(
            one("t", &[4], 0, 1 << 20),
            GgufError::UnexpectedOffset { .. }
        );
        assert_err!(
            one("t", &[4], 0, u64::MAX - 31),
            GgufError::UnexpectedOffset { .. }
        );
        assert_err!(
            one("t", &[1 << 20], 0, 0),
            GgufError::DataOutOfBounds { size, .. } if size == 4 << 20
        );
        assert_err!(
            one("t", &[4], 0, 16),
            GgufError::MisalignedOffset { offset: 16, .. }
        );
        assert_err!(
            one(&"x".repeat(64), &[4], 0, 0),
            GgufError::TensorNameTooLong { .. }
        );
        assert!(one(&"x".repeat(63), &[4], 0, 0).is_ok());
        assert_err!(
            Raw::new(3, 2, 0).tensor("t", &[4], 0, 0).tensor("t", &[4], 0, 32).pad(32).zeros(64).open(),
            GgufError::DuplicateTensor(n) if n == "t"
        );
        // Overlapping, out-of-order, gapped: all differ from ggml's packed layout.
        let two = |a: u64, b: u64| {
            Raw::new(3, 2, 0)
                .tensor("a", &[16], 0, a)
                .tensor("b", &[4], 0, b)
                .pad(32)
                .zeros(128)
                .open()
        };
        assert!(two(0, 64).is_ok());
        assert_err!(
            two(0, 32),
            GgufError::UnexpectedOffset { tensor, offset: 32, expected: 64 } if tensor == "b"
        );
        assert_err!(
            two(64, 0),
            GgufError::UnexpectedOffset {
                offset: 64,
                expected: 0,
                ..
            }
        );
        assert_err!(
            two(0, 96),
            GgufError::UnexpectedOffset {
                offset: 96,
                expected: 64,
                ..
            }
        );
        // Offsets right but data missing.
        assert_err!(
            Raw::new(3, 2, 0).tensor("a", &[16], 0, 0).tensor("b", &[4], 0, 64).pad(32).zeros(70).open(),
            GgufError::DataOutOfBounds { tensor, size: 16, file_size, .. } if tensor == "b" && file_size == 96 + 70
        );
    }

    #[test]
    fn getters() {
        let f = GgufFile::from_bytes(sample_bytes()).unwrap();
        assert_eq!(f.get_u32("u8").unwrap(), 200);
        assert_eq!(f.get_u32("u16").unwrap(), 60_000);
        assert_eq!(f.get_u32("u32").unwrap(), 4_000_000_000);
        assert_eq!(f.get_i32("i16").unwrap(), -30_000);
        assert_eq!(f.get_i64("i64").unwrap(), i64::MIN);
        assert_eq!(f.get_u64("u64").unwrap(), u64::MAX);
        assert_eq!(f.get_f32("f32").unwrap(), 1.5e-7);
        assert_eq!(f.get_f64("f32").unwrap(), f64::from(1.5e-7f32));
        assert_eq!(f.get_f64("f64").unwrap(), -std::f64::consts::PI);
        assert!(f.get_bool("bool.true").unwrap());
        assert_eq!(
            f.get_str("general.architecture").unwrap(),
            "depth-anything-3"
        );
        assert_eq!(f.get_i32_array("arr.i32").unwrap(), [-1, 0, 1, i32::MAX]);
        assert_eq!(f.get_i32_array("arr.u8").unwrap(), [0, 1, 255]);
        assert_eq!(f.get_f32_array("arr.f32").unwrap()[0], 0.5);
        assert!(f.get_f32_array("arr.empty.f32").unwrap().is_empty());
        assert_eq!(f.get_str_array("arr.str").unwrap()[2], "ß");
        assert_eq!(
            f.get_array("arr.bool").unwrap(),
            &Array::Bool(vec![true, false, true])
        );

        assert_eq!(f.opt_u32("absent").unwrap(), None);
        assert_eq!(f.opt_str("unicode").unwrap(), Some("深度 — ünïcødé 🦀"));
        assert_err!(f.get_u32("absent"), GgufError::MissingKey { key } if key == "absent");
        assert_err!(f.get_str_array("absent"), GgufError::MissingKey { .. });
        assert_err!(
            f.get_u32("f32"),
            GgufError::WrongType {
                expected: "u32",
                found: "f32",
                ..
            }
        );
        assert_err!(
            f.opt_u32("bool.true"),
            GgufError::WrongType { found: "bool", .. }
        );
        assert_err!(f.get_f32("u32"), GgufError::WrongType { .. });
        assert_err!(f.get_f32("f64"), GgufError::WrongType { .. });
        assert_err!(
            f.get_str("arr.str"),
            GgufError::WrongType {
                found: "arr[str]",
                ..
            }
        );
        assert_err!(
            f.get_f32_array("arr.f64"),
            GgufError::WrongType {
                found: "arr[f64]",
                ..
            }
        );
        assert_err!(f.get_i32_array("arr.f32"), GgufError::WrongType { .. });
        assert_err!(f.get_bool("u8"), GgufError::WrongType { .. });
        assert_err!(
            f.get_u32("i8"),
            GgufError::OutOfRange {
                value: -100,
                target: "u32",
                ..
            }
        );
        assert_err!(f.get_i32("u32"), GgufError::OutOfRange { .. });
        assert_err!(f.get_u32("u64"), GgufError::OutOfRange { .. });
        assert_err!(f.get_i32_array("arr.u64"), GgufError::OutOfRange { .. });
        let e = f.get_u32("f32").unwrap_err().to_string();
        assert!(e.contains("'f32'") && e.contains("expected u32"), "{e}");
    }

    #[test]
    fn tensor_data_with_foreign_info_does_not_panic() {
        let f = GgufFile::from_bytes(sample_bytes()).unwrap();
        let mut info = f.tensors()[0].clone();
        info.offset = u64::MAX - 3;
        assert_err!(f.tensor_data(&info), GgufError::DataOutOfBounds { .. });
        info.ne = [u64::MAX; 4];
        assert_eq!(info.nbytes(), u64::MAX);
        assert_err!(f.tensor_data(&info), GgufError::DataOutOfBounds { .. });
        info.n_dims = 9;
        assert_eq!(info.shape().len(), 4);
    }

    #[test]
    fn writer_rejects_invalid_tensors_and_keys() {
        let mut w = GgufWriter::new();
        w.add_tensor("t", DType::F32, &[2], vec![0; 8]).unwrap();
        assert_err!(
            w.add_tensor("t", DType::F32, &[2], vec![0; 8]),
            GgufError::DuplicateTensor(_)
        );
        assert_err!(
            w.add_tensor("u", DType::F32, &[2], vec![0; 7]),
            GgufError::DataSizeMismatch {
                expected: 8,
                actual: 7,
                ..
            }
        );
        assert_err!(
            w.add_tensor("u", DType::F32, &[1; 5], vec![0; 4]),
            GgufError::BadDims { n_dims: 5, .. }
        );
        assert_err!(
            w.add_tensor("u", DType::Q8_0, &[33], vec![0; 34]),
            GgufError::NotBlockAligned { .. }
        );
        assert_err!(
            w.add_tensor("u", DType::F32, &[1 << 63], vec![]),
            GgufError::BadShape { .. }
        );
        assert_err!(
            w.add_tensor("x".repeat(64), DType::F32, &[1], vec![0; 4]),
            GgufError::TensorNameTooLong { .. }
        );
        w.add_tensor("x".repeat(63), DType::F32, &[1], vec![0; 4])
            .unwrap();
        assert_eq!(w.tensors.len(), 2);

        w.set("", 1u8);
        assert_err!(
            w.write_to_writer(Vec::new()),
            GgufError::EmptyKey { index: 0 }
        );
        let mut w = GgufWriter::new();
        w.set(ALIGNMENT_KEY, 64u64);
        assert_err!(w.write_to_writer(Vec::new()), GgufError::WrongType { .. });
        w.set(ALIGNMENT_KEY, 12u32);
        assert_err!(w.write_to_writer(Vec::new()), GgufError::BadAlignment(12));
    }

    #[test]
    fn atomic_write_leaves_nothing_behind_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.gguf");
        fs::write(&target, b"old contents").unwrap();

        // Validation failure: nothing is created, the old file is untouched.
        let mut bad = GgufWriter::new();
        bad.set(ALIGNMENT_KEY, 3u32);
        assert_err!(bad.write_to(&target), GgufError::BadAlignment(3));

        // Failure after the temporary file exists: the rename onto a non-empty
        // directory fails, and the temporary file must be cleaned up.
        let blocker = dir.path().join("blocker");
        fs::create_dir(&blocker).unwrap();
        fs::write(blocker.join("keep"), b"").unwrap();
        let w = sample_writer(&mut Rng(1));
        assert_err!(w.write_to(&blocker), GgufError::Io { path, .. } if path == blocker);

        // Missing parent directory.
        assert_err!(
            w.write_to(dir.path().join("no/such/dir/x.gguf")),
            GgufError::Io { .. }
        );
        assert_err!(w.write_to(dir.path().join("..")), GgufError::Io { .. });

        let mut names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["blocker", "out.gguf"]);
        assert_eq!(fs::read(&target).unwrap(), b"old contents");

        // Success replaces the old file.
        w.write_to(&target).unwrap();
        assert_eq!(GgufFile::open(&target).unwrap().tensors().len(), 7);
    }

    #[test]
    fn open_reports_io_errors_and_empty_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        assert_err!(GgufFile::open(&missing), GgufError::Io { path, .. } if path == missing);
        let empty = dir.path().join("empty.gguf");
        fs::write(&empty, b"").unwrap();
        assert_err!(GgufFile::open(&empty), GgufError::Truncated { .. });
        let text = dir.path().join("text.gguf");
        fs::write(&text, b"hello world").unwrap();
        match GgufFile::open(&text) {
            Err(e @ GgufError::BadMagic { .. }) => {
                assert!(e.to_string().contains("text.gguf"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn open_reads_headers_larger_than_its_first_read_and_copies_tensors_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big-header.gguf");
        let mut w = GgufWriter::new();
        // 3 MiB of metadata: more than the first 1 MiB read of the header.
        w.set("test.blob", "x".repeat(3 << 20));
        let data: Vec<u8> = (0..4096u32)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        w.add_tensor("t", DType::F32, &[4096], data.clone())
            .unwrap();
        w.write_to(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        assert_eq!(file.get_str("test.blob").unwrap().len(), 3 << 20);
        let info = file.tensor("t").unwrap();
        assert_eq!(&*file.read_tensor_data(info).unwrap(), &data[..]);
        assert_eq!(file.tensor_data(info).unwrap(), &data[..]);
        file.check_unchanged().unwrap();
        // Cut inside the header: the error of parsing the whole file at once.
        let bytes = fs::read(&path).unwrap();
        let cut = dir.path().join("cut.gguf");
        fs::write(&cut, &bytes[..2 << 20]).unwrap();
        let opened = GgufFile::open(&cut).expect_err("cut in the header");
        let parsed = GgufFile::from_bytes(bytes[..2 << 20].to_vec())
            .err()
            .unwrap();
        assert!(matches!(opened, GgufError::TooLarge { .. }), "{opened}");
        assert_eq!(opened.to_string(), parsed.to_string());
        // A directory is named as one.
        match GgufFile::open(dir.path()) {
            Err(e @ GgufError::Io { .. }) => {
                assert!(e.to_string().contains("is a directory"), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }

    /// Touches everything a caller could reach on a successfully opened file.
    fn exercise(f: &GgufFile) {
        for (k, v) in f.metadata() {
            let _ = (
                f.get_u32(k),
                f.get_i64(k),
                f.get_str(k),
                f.get_f64(k),
                v.type_name(),
            );
            let _ = (f.get_i32_array(k), f.get_f32_array(k), f.get_str_array(k));
        }
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).unwrap().len() as u64, t.nbytes());
        }
        let _ = format!("{f:?}");
    }

    #[test]
    fn random_corruption_never_panics() {
        let bytes = sample_bytes();
        let header_len = GgufFile::from_bytes(bytes.clone()).unwrap().data_offset() as usize;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut outcomes = [0usize; 2];
        for i in 0..5000 {
            let mut b = bytes.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(header_len);
                b[at] ^= 1 << rng.below(8);
                if i % 3 == 0 {
                    b[at] = rng.next() as u8;
                }
            }
            if i % 5 == 0 {
                b.truncate(rng.below(bytes.len() + 1));
            }
            match GgufFile::from_bytes(b) {
                Ok(f) => {
                    exercise(&f);
                    outcomes[0] += 1;
                }
                Err(e) => {
                    let _ = e.to_string();
                    outcomes[1] += 1;
                }
            }
        }
        // Both outcomes occur, so the loop really reaches deep into the parser.
        assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");

        // Pure noise after a valid magic and version.
        for _ in 0..2000 {
            let n = rng.below(256);
            let b = Raw::new(3, rng.below(4) as u64, rng.below(4) as u64).bytes(&rng.bytes(n));
            if let Ok(f) = b.open() {
                exercise(&f);
            }
        }
    }
}
