//! Quantising an existing DA3 GGUF file (`da3 quantize`): the matrix weights depth-anything.cpp's
//! quantizer converts go to the chosen type through ggml's quantisers (and, for f16 and bf16,
//! the convolution kernels too); every other tensor and every metadata key is copied as it is.

use super::{conv_kernel_names, quantised_weight_names, WeightType};
use crate::atomic_file;
use crate::da3::config::FileLayout;
use crate::da3::transforms::{check_finite, to_f32};
use crate::da3::{outputs, Config, Error};
use crate::ggml::DType;
use crate::gguf::{GgufFile, GgufWriter};
use std::collections::HashSet;
use std::path::Path;

/// Tensors of one storage type and their data size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeCount {
    /// The ggml type.
    pub dtype: DType,
    /// How many tensors are stored as it.
    pub tensors: usize,
    /// Their data in bytes (without the file's alignment padding).
    pub bytes: u64,
}

/// What [`quantize`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantizeSummary {
    /// The type asked for.
    pub weight_type: WeightType,
    /// Every tensor of the input.
    pub tensors: usize,
    /// Matrix weights stored as the type asked for.
    pub converted: usize,
    /// Matrix weights stored as q8_0 instead of a k-quant: rows not a multiple of 256.
    pub q8_0_fallback: usize,
    /// Matrix weights left as they were stored: rows the type's blocks do not divide.
    pub left_as_stored: Vec<String>,
    /// Tensors per type in the input, by ggml type id.
    pub before: Vec<TypeCount>,
    /// Tensors per type in the output, by ggml type id.
    pub after: Vec<TypeCount>,
    /// Size of the input file in bytes.
    pub file_bytes_before: u64,
    /// Size of the output file in bytes.
    pub file_bytes_after: u64,
}

impl QuantizeSummary {
    /// Tensor data of the input in bytes.
    pub fn tensor_bytes_before(&self) -> u64 {
        self.before.iter().map(|c| c.bytes).sum()
    }
    /// Tensor data of the output in bytes.
    pub fn tensor_bytes_after(&self) -> u64 {
        self.after.iter().map(|c| c.bytes).sum()
    }
}

fn count(counts: &mut Vec<TypeCount>, dtype: DType, bytes: u64) {
    match counts.iter_mut().find(|c| c.dtype == dtype) {
        Some(c) => {
            c.tensors += 1;
            c.bytes += bytes;
        }
        None => counts.push(TypeCount {
            dtype,
            tensors: 1,
            bytes,
        }),
    }
}

/// Writes `output`: the DA3 model `input` with its matrix weights ([`quantised_weight_names`], two
/// dimensions) stored as `weight_type`, computed by ggml's `ggml_quantize_chunk` from their
/// f32, f16 or bf16 values, and for `f16` and `bf16` the convolution kernels as well
/// ([`WeightType::conv_kernel_dtype`]). k-quants (q6_k, q5_k, q4_k) fall back to q8_0 for
/// matrices whose rows are not a multiple of 256; a matrix whose rows no block of the type
/// divides stays as it is. Every other tensor and every metadata key is copied unchanged (except
/// `general.file_type`, which would no longer be true, and is left out).
///
/// Refused with an error naming the problem, before anything is written: `f32` as the type,
/// an `output` that is the `input` file, an input that is not a GGUF file or not a Depth
/// Anything 3 model, a matrix weight that is already block-quantised or holds a non-finite
/// value. The output is written atomically (a temporary file renamed into place), so a failure
/// leaves no file behind and an existing `output` as it was. The output is built in memory
/// before it is written (about its size), the input is read one tensor at a time.
pub fn quantize(
    input: &Path,
    output: &Path,
    weight_type: WeightType,
) -> Result<QuantizeSummary, Error> {
    let refuse = |reason: String| Error::Quantize {
        path: input.to_path_buf(),
        reason,
    };
    if !WeightType::QUANTIZED.contains(&weight_type) {
        let names: Vec<&str> = WeightType::QUANTIZED.iter().map(|t| t.name()).collect();
        return Err(refuse(format!(
            "{weight_type} is not a type to quantize to (one of {})",
            names.join(", ")
        )));
    }
    if input == output || outputs::same_file(input, output) {
        return Err(refuse(format!(
            "the output {} is the input file; write to a new file",
            output.display()
        )));
    }
    let file = GgufFile::open(input)?;
    let config = Config::from_gguf(&file).map_err(|e| refuse(e.to_string()))?;
    // The half types apply to the convolution kernels too, as the converter writes them.
    let layout = FileLayout::of(&file);
    // The matrix weights by the architecture's own names: those of a nested model's metric
    // branch (`m_vit.`) are left as they are stored, as they were before the architecture
    // table.
    let matrices = quantised_weight_names(&config)?;
    let conv_kernels: HashSet<String> = match weight_type.conv_kernel_dtype() {
        DType::F32 => HashSet::new(),
        _ => conv_kernel_names(&config)?
            .iter()
            .map(|n| layout.file_name(n).into_owned())
            .collect(),
    };

    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        if key != "general.file_type" {
            w.set(key, value.clone());
        }
    }
    let mut summary = QuantizeSummary {
        weight_type,
        tensors: file.tensors().len(),
        converted: 0,
        q8_0_fallback: 0,
        left_as_stored: Vec::new(),
        before: Vec::new(),
        after: Vec::new(),
        file_bytes_before: file.file_size(),
        file_bytes_after: 0,
    };
    for info in file.tensors() {
        let data = file.read_tensor_data(info)?;
        count(&mut summary.before, info.dtype, data.len() as u64);
        let shape = info.shape();
        let target = if matrices.contains(&info.name) && shape.len() == 2 {
            match info.dtype {
                DType::F32 | DType::F16 | DType::BF16 => {}
                other if other.is_quantized() => {
                    return Err(refuse(format!(
                        "tensor `{}` is already quantised ({other}); quantize from an f32, f16 or bf16 file",
                        info.name
                    )))
                }
                other => {
                    return Err(refuse(format!(
                        "tensor `{}` is stored as {other}; expected f32, f16 or bf16",
                        info.name
                    )))
                }
            }
            let target = weight_type.for_row(shape[0]);
            match target {
                None => summary.left_as_stored.push(info.name.clone()),
                Some(t) if t == weight_type.dtype() => summary.converted += 1,
                Some(_) => summary.q8_0_fallback += 1,
            }
            target.filter(|&t| t != info.dtype)
        } else if conv_kernels.contains(&info.name)
            && [DType::F32, DType::F16, DType::BF16].contains(&info.dtype)
        {
            Some(weight_type.conv_kernel_dtype()).filter(|&t| t != info.dtype)
        } else {
            None
        };
        let (dtype, data) = match target {
            Some(t) => {
                check_finite(&info.name, info.dtype, &data).map_err(|e| refuse(e.to_string()))?;
                let values = to_f32(&info.name, info.dtype, &data)?;
                let bytes = crate::ggml::quantize(t, &values, shape[0] as usize)?;
                (t, std::borrow::Cow::Owned(bytes))
            }
            None => (info.dtype, data),
        };
        count(&mut summary.after, dtype, data.len() as u64);
        w.add_tensor(info.name.clone(), dtype, shape, data)?;
    }
    // A file rewritten in place while it was read gives an error, not a mixed output.
    file.check_unchanged()?;
    summary.before.sort_by_key(|c| c.dtype.id());
    summary.after.sort_by_key(|c| c.dtype.id());
    atomic_file::write(output, |out| {
        w.write_to_writer(out)
            .map(drop)
            .map_err(std::io::Error::other)
    })?;
    summary.file_bytes_after = std::fs::metadata(output)
        .map_err(|source| Error::Output {
            path: output.to_path_buf(),
            source,
        })?
        .len();
    Ok(summary)
}
