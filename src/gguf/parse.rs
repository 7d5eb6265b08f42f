//! The byte-level codec: a bounds-checked little-endian reader, the header parser with every
//! validation rule of ggml's `gguf.cpp`, and the scalar encoding the writer shares.

use std::collections::HashMap;
use std::path::Path;

use super::tensor::{align_up, alignment_from, check_shape};
use super::{
    Array, GgufError, TensorInfo, Value, ValueType, ALIGNMENT_KEY, GGUF_MAGIC, MAX_ARRAY_LEN,
    MAX_DIMS, MAX_PREALLOC, MAX_STRING_LEN, MAX_TENSOR_NAME_LEN, MIN_KV_BYTES,
    MIN_TENSOR_INFO_BYTES,
};
use crate::ggml::DType;

/// Bounds-checked little-endian cursor over the file bytes.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Fixed-size little-endian scalars.
pub(super) trait Scalar: Sized {
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
pub(super) struct Header {
    pub(super) version: u32,
    pub(super) alignment: u64,
    pub(super) metadata: Vec<(String, Value)>,
    pub(super) key_index: HashMap<String, usize>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
    pub(super) data_offset: u64,
}

/// Parses the header at the start of `buf`, which holds the first bytes of a file of
/// `file_size` bytes (all of them, or a prefix that ends after the header).
pub(super) fn parse(buf: &[u8], file_size: u64, path: Option<&Path>) -> Result<Header, GgufError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::testing::*;
    use crate::gguf::*;

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
