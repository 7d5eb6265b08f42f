//! PyTorch checkpoints (`torch.save` of a state dict: a zip archive holding `data.pkl`, a
//! pickle, and one `data/N` file per tensor storage) read without Python, for checkpoints that
//! are published only in that format (Depth Anything V2's `.pth` files).
//!
//! The pickle is interpreted by a small stack machine that knows the opcodes `torch.save`
//! emits (protocols 2 to 5) and builds nothing but plain values: the only callables it
//! accepts are `collections.OrderedDict` and torch's tensor and parameter rebuilders, so a
//! hostile file can name no other code. Anything else is an error naming what was found.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

/// A tensor of a checkpoint, widened to `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct PthTensor {
    /// PyTorch shape, outermost first.
    pub shape: Vec<usize>,
    /// The values in row-major order (strided storages are gathered).
    pub values: Vec<f32>,
}

/// The tensors of a state dict, by key, in the file's order.
pub type StateDict = Vec<(String, PthTensor)>;

/// The largest `data.pkl` read (a state dict's pickle is a few hundred kilobytes; the values
/// live in the storages).
const MAX_PICKLE_BYTES: u64 = 64 << 20;

/// Reads the state dict of a `torch.save` file: its tensors (f32, f16 or bf16), those of a
/// nested `state_dict` or `model` entry when the top level is a wrapper dict.
///
/// # Errors
/// A message naming what is wrong: not a zip archive, no `data.pkl`, an opcode or a callable
/// outside what a state dict uses, a storage missing or shorter than its tensors.
pub fn read_state_dict(path: &Path) -> Result<StateDict, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file)).map_err(|e| {
        format!("not a PyTorch zip checkpoint ({e}); legacy (pre-1.6) .pth files are not read")
    })?;
    let pickle_name = (0..archive.len())
        .filter_map(|i| archive.name_for_index(i).map(str::to_owned))
        .find(|n| n == "data.pkl" || n.ends_with("/data.pkl"))
        .ok_or("no data.pkl in the archive (not a torch.save file)")?;
    let prefix = pickle_name.trim_end_matches("data.pkl").to_owned();
    let mut pickle = Vec::new();
    archive
        .by_name(&pickle_name)
        .map_err(|e| e.to_string())?
        .take(MAX_PICKLE_BYTES)
        .read_to_end(&mut pickle)
        .map_err(|e| format!("{pickle_name}: {e}"))?;
    let root = Unpickler::new(&pickle).run()?;
    let dict = state_dict_of(root)?;
    let mut storages: HashMap<String, Vec<u8>> = HashMap::new();
    let mut out = Vec::with_capacity(dict.len());
    for (key, value) in dict {
        let Value::Str(key) = key else {
            return Err(format!("a state-dict key that is not a string: {key:?}"));
        };
        let Value::Tensor(t) = value else {
            // Non-tensor entries (a version number, `_metadata`) are no weights.
            continue;
        };
        if !storages.contains_key(&t.storage.key) {
            let name = format!("{prefix}data/{}", t.storage.key);
            let entry = archive
                .by_name(&name)
                .map_err(|e| format!("{key}: storage {name}: {e}"))?;
            let expected = (t.storage.numel as u64)
                .checked_mul(t.storage.dtype.bytes() as u64)
                .ok_or_else(|| format!("{key}: a storage of {} values", t.storage.numel))?;
            if entry.size() < expected {
                return Err(format!(
                    "{key}: storage {name} holds {} bytes, its {} values need {expected}",
                    entry.size(),
                    t.storage.numel
                ));
            }
            // Grown as the bytes arrive: a damaged size field must not reserve memory.
            let mut bytes = Vec::new();
            entry
                .take(expected)
                .read_to_end(&mut bytes)
                .map_err(|e| format!("{key}: {name}: {e}"))?;
            if (bytes.len() as u64) < expected {
                return Err(format!(
                    "{key}: storage {name} ends after {} of its {expected} bytes",
                    bytes.len()
                ));
            }
            storages.insert(t.storage.key.clone(), bytes);
        }
        let values = gather(&t, &storages[&t.storage.key]).map_err(|e| format!("{key}: {e}"))?;
        out.push((
            key,
            PthTensor {
                shape: t.shape,
                values,
            },
        ));
    }
    Ok(out)
}

/// The dict of tensors: the root, or its `state_dict` / `model` entry.
fn state_dict_of(root: Value) -> Result<Vec<(Value, Value)>, String> {
    let Value::Dict(items) = root else {
        return Err(format!(
            "the pickle holds {}, not a state dict",
            root.kind()
        ));
    };
    let holds_tensors = items.iter().any(|(_, v)| matches!(v, Value::Tensor(_)));
    if holds_tensors {
        return Ok(items);
    }
    for wrapper in ["state_dict", "model"] {
        if let Some((_, Value::Dict(inner))) = items
            .iter()
            .find(|(k, _)| matches!(k, Value::Str(s) if s == wrapper))
        {
            return Ok(inner.clone());
        }
    }
    Err("the pickle's dict holds no tensors (nor a `state_dict` or `model` entry)".into())
}

/// A tensor's values from its storage's bytes, through its offset and strides.
fn gather(t: &TensorRef, bytes: &[u8]) -> Result<Vec<f32>, String> {
    if t.shape.len() != t.stride.len() {
        return Err(format!(
            "shape {:?} and stride {:?} differ in length",
            t.shape, t.stride
        ));
    }
    let count = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let count = count.ok_or("a shape whose size overflows")?;
    // The furthest element any index reaches must lie inside the storage.
    let extent = t
        .shape
        .iter()
        .zip(&t.stride)
        .try_fold(t.offset, |far, (&d, &s)| {
            if d == 0 {
                Some(far)
            } else {
                far.checked_add((d - 1).checked_mul(s)?)
            }
        })
        .ok_or("strides whose reach overflows")?;
    if count > 0 && extent >= t.storage.numel {
        return Err(format!(
            "shape {:?} at offset {} with strides {:?} reaches element {extent} of a storage of {}",
            t.shape, t.offset, t.stride, t.storage.numel
        ));
    }
    let width = t.storage.dtype.bytes();
    let read = |i: usize| -> f32 {
        let b = &bytes[i * width..(i + 1) * width];
        match t.storage.dtype {
            StorageType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            StorageType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
            StorageType::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
        }
    };
    let mut values = Vec::with_capacity(count);
    let mut index = vec![0usize; t.shape.len()];
    for _ in 0..count {
        let at = t.offset
            + index
                .iter()
                .zip(&t.stride)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        values.push(read(at));
        // The next index in row-major order.
        for axis in (0..index.len()).rev() {
            index[axis] += 1;
            if index[axis] < t.shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    Ok(values)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StorageType {
    F32,
    F16,
    Bf16,
}

impl StorageType {
    fn bytes(self) -> usize {
        match self {
            StorageType::F32 => 4,
            StorageType::F16 | StorageType::Bf16 => 2,
        }
    }

    /// torch's storage class (`FloatStorage`, ...) or, since torch 2, dtype name.
    fn from_name(name: &str) -> Option<StorageType> {
        match name {
            "FloatStorage" | "float32" | "float" => Some(StorageType::F32),
            "HalfStorage" | "float16" | "half" => Some(StorageType::F16),
            "BFloat16Storage" | "bfloat16" => Some(StorageType::Bf16),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct StorageRef {
    dtype: StorageType,
    key: String,
    numel: usize,
}

#[derive(Debug, Clone, PartialEq)]
struct TensorRef {
    storage: StorageRef,
    offset: usize,
    shape: Vec<usize>,
    stride: Vec<usize>,
}

/// The values a state dict's pickle builds.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Tuple(Vec<Value>),
    List(Vec<Value>),
    Dict(Vec<(Value, Value)>),
    /// A `module.name` the pickle refers to (called by REDUCE, or a storage's type).
    Global(String, String),
    Storage(StorageRef),
    Tensor(TensorRef),
    /// The stack marker of MARK.
    Mark,
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an int",
            Value::Float(_) => "a float",
            Value::Str(_) => "a string",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global(..) => "a global",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
            Value::Mark => "a mark",
        }
    }

    fn usize(&self, what: &str) -> Result<usize, String> {
        match self {
            Value::Int(v) if *v >= 0 => Ok(*v as usize),
            other => Err(format!(
                "{what}: expected a non-negative int, found {other:?}"
            )),
        }
    }

    fn usizes(&self, what: &str) -> Result<Vec<usize>, String> {
        match self {
            Value::Tuple(items) | Value::List(items) => {
                items.iter().map(|v| v.usize(what)).collect()
            }
            other => Err(format!("{what}: expected a tuple, found {}", other.kind())),
        }
    }
}

/// The pickle stack machine.
struct Unpickler<'a> {
    data: &'a [u8],
    at: usize,
    stack: Vec<Value>,
    memo: HashMap<u32, Value>,
}

/// The most values the stack or the memo may hold (a state dict of thousands of tensors needs
/// tens of thousands): a bound on what a damaged file can make this allocate.
const MAX_VALUES: usize = 1 << 22;

impl<'a> Unpickler<'a> {
    fn new(data: &'a [u8]) -> Self {
        Unpickler {
            data,
            at: 0,
            stack: Vec::new(),
            memo: HashMap::new(),
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.data.len());
        let end =
            end.ok_or_else(|| format!("the pickle ends inside an opcode at byte {}", self.at))?;
        let bytes = &self.data[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn line(&mut self) -> Result<String, String> {
        let rest = &self.data[self.at..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("a GLOBAL without its newline")?;
        let text = String::from_utf8_lossy(&rest[..end]).into_owned();
        self.at += end + 1;
        Ok(text)
    }

    fn text(&mut self, n: usize) -> Result<Value, String> {
        let bytes = self.take(n)?;
        Ok(Value::Str(String::from_utf8_lossy(bytes).into_owned()))
    }

    fn push(&mut self, v: Value) -> Result<(), String> {
        if self.stack.len() >= MAX_VALUES {
            return Err("the pickle's stack grows beyond any state dict's".into());
        }
        self.stack.push(v);
        Ok(())
    }

    fn pop(&mut self) -> Result<Value, String> {
        self.stack
            .pop()
            .ok_or_else(|| "the pickle pops an empty stack".to_owned())
    }

    /// The values above the topmost MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let mark = self
            .stack
            .iter()
            .rposition(|v| *v == Value::Mark)
            .ok_or("the pickle has no MARK where it needs one")?;
        let items = self.stack.split_off(mark + 1);
        self.stack.pop();
        Ok(items)
    }

    fn top(&mut self) -> Result<&mut Value, String> {
        self.stack
            .last_mut()
            .ok_or_else(|| "the pickle works on an empty stack".to_owned())
    }

    fn memoize(&mut self, index: u32) -> Result<(), String> {
        if self.memo.len() >= MAX_VALUES {
            return Err("the pickle's memo grows beyond any state dict's".into());
        }
        let v = self.top()?.clone();
        self.memo.insert(index, v);
        Ok(())
    }

    fn recall(&mut self, index: u32) -> Result<(), String> {
        let v =
            self.memo.get(&index).cloned().ok_or_else(|| {
                format!("the pickle recalls memo {index}, which was never stored")
            })?;
        self.push(v)
    }

    fn set_items(&mut self, pairs: Vec<Value>) -> Result<(), String> {
        if !pairs.len().is_multiple_of(2) {
            return Err("SETITEMS with an odd number of values".into());
        }
        let Value::Dict(items) = self.top()? else {
            return Err("SETITEMS on something that is not a dict".into());
        };
        let mut pairs = pairs.into_iter();
        while let (Some(k), Some(v)) = (pairs.next(), pairs.next()) {
            items.push((k, v));
        }
        Ok(())
    }

    fn run(mut self) -> Result<Value, String> {
        loop {
            let op = self.u8()?;
            match op {
                0x80 => {
                    let protocol = self.u8()?;
                    if protocol > 5 {
                        return Err(format!("pickle protocol {protocol} (at most 5 is read)"));
                    }
                }
                0x95 => {
                    self.take(8)?; // FRAME: a length hint.
                }
                b'.' => return self.pop(),
                b'(' => self.push(Value::Mark)?,
                b'N' => self.push(Value::None)?,
                0x88 => self.push(Value::Bool(true))?,
                0x89 => self.push(Value::Bool(false))?,
                b'}' => self.push(Value::Dict(Vec::new()))?,
                b']' => self.push(Value::List(Vec::new()))?,
                b')' => self.push(Value::Tuple(Vec::new()))?,
                b'K' => {
                    let v = self.u8()?;
                    self.push(Value::Int(v.into()))?
                }
                b'M' => {
                    let b = self.take(2)?;
                    self.push(Value::Int(u16::from_le_bytes([b[0], b[1]]).into()))?
                }
                b'J' => {
                    let b = self.take(4)?;
                    self.push(Value::Int(
                        i32::from_le_bytes(b.try_into().expect("4")).into(),
                    ))?
                }
                0x8a => {
                    // LONG1: a little-endian two's-complement integer of n bytes.
                    let n = self.u8()? as usize;
                    let b = self.take(n)?;
                    if n > 8 {
                        return Err(format!("an integer of {n} bytes"));
                    }
                    let mut v: i64 = 0;
                    for (i, &byte) in b.iter().enumerate() {
                        v |= i64::from(byte) << (8 * i);
                    }
                    if n > 0 && n < 8 && b[n - 1] & 0x80 != 0 {
                        v -= 1i64 << (8 * n);
                    }
                    self.push(Value::Int(v))?
                }
                b'G' => {
                    let b = self.take(8)?;
                    self.push(Value::Float(f64::from_be_bytes(b.try_into().expect("8"))))?
                }
                b'X' => {
                    let n = self.u32()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                0x8c => {
                    let n = self.u8()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'T' => {
                    let n = self.u32()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'U' => {
                    let n = self.u8()? as usize;
                    let v = self.text(n)?;
                    self.push(v)?
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Value::Global(module, name))?
                }
                0x93 => {
                    let name = self.pop()?;
                    let module = self.pop()?;
                    match (module, name) {
                        (Value::Str(m), Value::Str(n)) => self.push(Value::Global(m, n))?,
                        _ => return Err("STACK_GLOBAL of values that are not strings".into()),
                    }
                }
                b'q' => {
                    let i = self.u8()?;
                    self.memoize(i.into())?
                }
                b'r' => {
                    let i = self.u32()?;
                    self.memoize(i)?
                }
                0x94 => {
                    let i = self.memo.len() as u32;
                    self.memoize(i)?
                }
                b'h' => {
                    let i = self.u8()?;
                    self.recall(i.into())?
                }
                b'j' => {
                    let i = self.u32()?;
                    self.recall(i)?
                }
                b't' => {
                    let items = self.pop_mark()?;
                    self.push(Value::Tuple(items))?
                }
                0x85 => {
                    let a = self.pop()?;
                    self.push(Value::Tuple(vec![a]))?
                }
                0x86 => {
                    let b = self.pop()?;
                    let a = self.pop()?;
                    self.push(Value::Tuple(vec![a, b]))?
                }
                0x87 => {
                    let c = self.pop()?;
                    let b = self.pop()?;
                    let a = self.pop()?;
                    self.push(Value::Tuple(vec![a, b, c]))?
                }
                b'a' => {
                    let v = self.pop()?;
                    match self.top()? {
                        Value::List(items) => items.push(v),
                        _ => return Err("APPEND to something that is not a list".into()),
                    }
                }
                b'e' => {
                    let values = self.pop_mark()?;
                    match self.top()? {
                        Value::List(items) => items.extend(values),
                        _ => return Err("APPENDS to something that is not a list".into()),
                    }
                }
                b's' => {
                    let v = self.pop()?;
                    let k = self.pop()?;
                    self.set_items(vec![k, v])?
                }
                b'u' => {
                    let pairs = self.pop_mark()?;
                    self.set_items(pairs)?
                }
                b'b' => {
                    // BUILD: an object's state (an OrderedDict's `_metadata`): not weights.
                    self.pop()?;
                }
                b'Q' => {
                    let pid = self.pop()?;
                    let storage = persistent_storage(pid)?;
                    self.push(Value::Storage(storage))?
                }
                b'R' => {
                    let args = self.pop()?;
                    let callable = self.pop()?;
                    let v = reduce(callable, args)?;
                    self.push(v)?
                }
                other => {
                    return Err(format!(
                        "pickle opcode 0x{other:02x} at byte {} (not one a state dict uses)",
                        self.at - 1
                    ))
                }
            }
        }
    }
}

/// BINPERSID's id of a storage: `('storage', <type>, key, location, numel)`.
fn persistent_storage(pid: Value) -> Result<StorageRef, String> {
    let Value::Tuple(parts) = pid else {
        return Err(format!("a persistent id that is {}", pid.kind()));
    };
    match parts.as_slice() {
        [Value::Str(tag), Value::Global(_, type_name), Value::Str(key), _, numel]
            if tag == "storage" =>
        {
            let dtype = StorageType::from_name(type_name).ok_or_else(|| {
                format!("a {type_name} tensor (f32, f16 and bf16 weights are read)")
            })?;
            Ok(StorageRef {
                dtype,
                key: key.clone(),
                numel: numel.usize("a storage's size")?,
            })
        }
        _ => Err(format!("a persistent id that is not a storage: {parts:?}")),
    }
}

/// The callables a state dict's pickle calls, and nothing else.
fn reduce(callable: Value, args: Value) -> Result<Value, String> {
    let Value::Global(module, name) = &callable else {
        return Err(format!("REDUCE of {}", callable.kind()));
    };
    let Value::Tuple(args) = args else {
        return Err(format!("{module}.{name} called with {}", args.kind()));
    };
    match (module.as_str(), name.as_str()) {
        ("collections", "OrderedDict") => Ok(Value::Dict(Vec::new())),
        ("torch._utils", "_rebuild_tensor_v2") | ("torch._utils", "_rebuild_tensor") => {
            let [Value::Storage(storage), offset, shape, stride, ..] = args.as_slice() else {
                return Err(format!("{module}.{name} with arguments {args:?}"));
            };
            Ok(Value::Tensor(TensorRef {
                storage: storage.clone(),
                offset: offset.usize("a tensor's offset")?,
                shape: shape.usizes("a tensor's shape")?,
                stride: stride.usizes("a tensor's strides")?,
            }))
        }
        ("torch._utils", "_rebuild_parameter")
        | ("torch._utils", "_rebuild_parameter_with_state") => match args.into_iter().next() {
            Some(t @ Value::Tensor(_)) => Ok(t),
            other => Err(format!("{module}.{name} of {other:?}")),
        },
        _ => Err(format!(
            "the pickle calls {module}.{name}, which no state dict needs (only tensors, \
             parameters and OrderedDicts are rebuilt)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pickle as `torch.save` writes one (protocol 2) for
    /// `OrderedDict(a=torch.arange(6.).reshape(2, 3), b=<a transposed view>)`, with the
    /// storage given, through the unpickler and `gather`.
    #[test]
    fn a_state_dict_pickle_rebuilds_its_tensors_and_views() {
        let mut p = vec![0x80, 2];
        p.extend(b"ccollections\nOrderedDict\nq\x00)Rq\x01(X\x01\x00\x00\x00a");
        let tensor = |p: &mut Vec<u8>, shape: &[u8], stride: &[u8]| {
            p.extend(b"ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00\x00storage");
            p.extend(b"ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x06tQK\x00");
            p.push(b'(');
            for &d in shape {
                p.extend([b'K', d]);
            }
            p.push(b't');
            p.push(b'(');
            for &s in stride {
                p.extend([b'K', s]);
            }
            p.push(b't');
            p.extend(b"\x89ccollections\nOrderedDict\n)Rtq\x03R");
        };
        tensor(&mut p, &[2, 3], &[3, 1]);
        p.extend(b"X\x01\x00\x00\x00b");
        tensor(&mut p, &[3, 2], &[1, 3]);
        p.extend(b"u}bq\x04.");
        let root = Unpickler::new(&p).run().unwrap();
        let dict = state_dict_of(root).unwrap();
        assert_eq!(dict.len(), 2);
        let storage: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let values: Vec<Vec<f32>> = dict
            .iter()
            .map(|(_, v)| match v {
                Value::Tensor(t) => gather(t, &storage).unwrap(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(values[0], [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(values[1], [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn code_outside_a_state_dict_is_refused_by_name() {
        let p = b"\x80\x02cos\nsystem\nX\x02\x00\x00\x00ls\x85R.";
        let err = Unpickler::new(p).run().unwrap_err();
        assert!(err.contains("os.system"), "{err}");
        // A view reaching past its storage.
        let t = TensorRef {
            storage: StorageRef {
                dtype: StorageType::F32,
                key: "0".into(),
                numel: 4,
            },
            offset: 1,
            shape: vec![2, 2],
            stride: vec![2, 1],
        };
        assert!(gather(&t, &[0; 16])
            .unwrap_err()
            .contains("reaches element 4"));
        // Truncated and empty pickles.
        assert!(Unpickler::new(b"\x80\x02}q\x00(X\x05\x00").run().is_err());
        assert!(Unpickler::new(b"").run().is_err());
    }

    /// The pickle of a checkpoint `torch.save` wrote (the seeded tiny DA2), damaged three ways
    /// at many bytes and cut there: each copy gives a value or an error, never a panic, and
    /// the undamaged one its 127 entries.
    #[test]
    fn a_damaged_torch_pickle_is_an_error_not_a_panic() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/da2-tiny/depth_anything_v2_tiny.pth");
        let mut archive = zip::ZipArchive::new(std::fs::File::open(path).unwrap()).unwrap();
        let name = (0..archive.len())
            .map(|i| archive.name_for_index(i).unwrap().to_owned())
            .find(|n| n.ends_with("/data.pkl"))
            .unwrap();
        let mut pickle = Vec::new();
        archive
            .by_name(&name)
            .unwrap()
            .read_to_end(&mut pickle)
            .unwrap();
        let root = Unpickler::new(&pickle).run().unwrap();
        assert_eq!(state_dict_of(root).unwrap().len(), 127);
        // Every byte of the first 4 KiB (the structure around the first entries), then every
        // 16th: the rest repeats the same few opcodes per tensor.
        for at in (0..pickle.len()).filter(|&at| at < 4096 || at % 16 == 0) {
            for flip in [0xffu8, 0x01, 0x80] {
                let mut damaged = pickle.clone();
                damaged[at] ^= flip;
                let _ = Unpickler::new(&damaged).run().map(state_dict_of);
            }
            let _ = Unpickler::new(&pickle[..at]).run();
        }
    }
}
