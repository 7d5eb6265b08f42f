//! Metadata values: their types (with the ids stored in the file), scalars, strings and
//! homogeneous arrays.

use std::fmt;

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
    pub(super) fn fixed_size(self) -> Option<u64> {
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
    pub(super) fn as_int(&self) -> Option<i128> {
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
    pub(super) fn ints(&self) -> Option<Vec<i128>> {
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
