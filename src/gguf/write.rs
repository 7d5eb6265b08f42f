//! [`GgufWriter`]: builds a GGUF v3 file in memory and writes it out.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, Write};
use std::path::Path;

use super::parse::Scalar;
use super::tensor::{align_up, alignment_from, check_alignment, check_shape};
use super::{
    Array, GgufError, TensorInfo, Value, ALIGNMENT_KEY, GGUF_MAGIC, GGUF_VERSION, MAX_ARRAY_LEN,
    MAX_STRING_LEN, MAX_TENSOR_NAME_LEN,
};
use crate::atomic_file;
use crate::ggml::DType;

struct PendingTensor<'a> {
    info: TensorInfo,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF v3 file in memory and writes it out.
///
/// Metadata keeps insertion order; tensors are laid out in insertion order, each
/// padded to the alignment, exactly as ggml's `gguf_write_to_file` does, so ggml
/// and this module's reader both accept the result. Tensor data is borrowed when
/// given as `&[u8]` (for example straight from another [`GgufFile`](super::GgufFile)) and
/// owned when given as `Vec<u8>`.
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
    /// Validation errors are reported before anything is created; then
    /// [`atomic_file::write`] writes the file: a temporary file in the same directory, flushed
    /// to disk (`fsync`) and renamed over `path`, removed on any error, `path` left as it was.
    /// An existing `path` must be a regular file (a symbolic link, directory or device is
    /// refused) and the new file keeps its permissions.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<u64, GgufError> {
        let (header, alignment) = self.encode_header()?;
        Ok(atomic_file::write(path.as_ref(), |out| {
            self.write_body(&header, alignment, out)
        })?)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::testing::*;
    use crate::gguf::*;
    use std::fs;

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
}
