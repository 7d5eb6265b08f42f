//! [`GgufFile`]: a validated file, its metadata getters and its tensor data.

use std::borrow::Cow;
use std::fmt;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::parse::{parse, Header};
use super::{Array, GgufError, TensorInfo, Value};
use crate::ggml::{Backend, BufferUsage, Context, MappedFile};

enum Backing {
    /// A file on disk: the loader reads it with `pread` (a file that shrinks gives an error);
    /// the map serves only [`GgufFile::tensor_data`] and [`GgufFile::data_section`].
    Mmap {
        map: MappedFile,
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
    /// Replacing the file by rename, as [`GgufWriter::write_to`](super::GgufWriter::write_to)
    /// does, is fine on Unix.
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
        // Only `tensor_data` and `data_section` read through the map, and their callers take
        // on `MappedFile::map`'s obligation; the header and `read_tensor_data` use positioned
        // reads instead.
        let map = MappedFile::map(&file).map_err(io_err)?;
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
            map.release(offset..offset + bytes.len());
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

impl GgufFile {
    /// Every tensor of the file, named as in the file, in one `backend` buffer of `usage`.
    /// Shapes and types are the file's; the data is copied from the file with positioned reads
    /// ([`read_tensor_data`](Self::read_tensor_data)).
    pub fn load_tensors(
        &self,
        backend: &Backend,
        usage: BufferUsage,
    ) -> Result<Context, GgufError> {
        let ctx = Context::metadata_with_graph(self.tensors().len().max(1), 1)?;
        let mut loaded = Vec::with_capacity(self.tensors().len());
        for info in self.tensors() {
            let ne: Vec<i64> = info.shape().iter().map(|&d| d as i64).collect();
            let tensor = ctx.new_tensor(info.dtype, &ne)?.named(&info.name);
            loaded.push((tensor, info));
        }
        ctx.allocate_on(backend, usage)?;
        for (tensor, info) in &loaded {
            ctx.write_bytes(tensor, &self.read_tensor_data(info)?)?;
        }
        Ok(ctx)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::DType;
    use crate::gguf::testing::*;
    use crate::gguf::*;

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
}
