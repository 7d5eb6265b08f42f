//! What the GGUF tests share: a byte-level builder for valid and corrupt files, a
//! deterministic generator, and a sample file holding every value and tensor type.

use super::*;
use crate::ggml::DType;

/// Independent byte-level GGUF builder for crafting valid and corrupt files.
pub(crate) struct Raw(pub(crate) Vec<u8>);

impl Raw {
    pub(crate) fn new(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        Raw(b"GGUF".to_vec()).u32(version).u64(n_tensors).u64(n_kv)
    }
    pub(crate) fn u32(mut self, v: u32) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Raw {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(mut self, b: &[u8]) -> Raw {
        self.0.extend_from_slice(b);
        self
    }
    pub(crate) fn str(self, s: &str) -> Raw {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    pub(crate) fn kv_u32(self, key: &str, v: u32) -> Raw {
        self.str(key).u32(4).u32(v)
    }
    pub(crate) fn tensor(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Raw {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(type_id).u64(offset)
    }
    pub(crate) fn pad(mut self, alignment: usize) -> Raw {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    pub(crate) fn zeros(mut self, n: usize) -> Raw {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub(crate) fn open(self) -> Result<GgufFile, GgufError> {
        GgufFile::from_bytes(self.0)
    }
}

/// Deterministic xorshift64* generator.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
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

pub(crate) fn all_metadata() -> Vec<(&'static str, Value)> {
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

pub(crate) fn all_tensors(rng: &mut Rng) -> Vec<(&'static str, DType, Vec<u64>, Vec<u8>)> {
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

pub(crate) fn sample_writer(rng: &mut Rng) -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    for (k, v) in all_metadata() {
        w.set(k, v);
    }
    for (name, dtype, ne, data) in all_tensors(rng) {
        w.add_tensor(name, dtype, &ne, data).unwrap();
    }
    w
}

pub(crate) fn sample_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    sample_writer(&mut Rng(7))
        .write_to_writer(&mut out)
        .unwrap();
    out
}
pub(crate) use assert_err;
