//! `da3 quantize`: an existing DA3 GGUF file to one with quantised matrix weights.

use anyhow::Context as _;
use da3::convert::{quantize, QuantizeSummary, TypeCount, WeightType};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A DA3 model in depth-anything.cpp's GGUF layout whose matrix weights are f32, f16 or
    /// bf16.
    #[arg(value_name = "IN.gguf")]
    input: PathBuf,
    /// The file to write (atomically; never the input).
    #[arg(value_name = "OUT.gguf")]
    output: PathBuf,
    /// Storage type of the matrix weights (block linears and camera decoder): f16, bf16,
    /// q8_0, q6_k, q5_k or q4_k. k-quants fall back to q8_0 where rows are not a multiple of
    /// 256; everything else is copied as it is.
    #[arg(value_name = "TYPE", value_parser = parse_type)]
    weight_type: WeightType,
}

fn parse_type(s: &str) -> Result<WeightType, String> {
    let t: WeightType = s.parse().map_err(|_| type_list(s))?;
    if WeightType::QUANTIZED.contains(&t) {
        Ok(t)
    } else {
        Err(type_list(s))
    }
}

fn type_list(s: &str) -> String {
    let names: Vec<&str> = WeightType::QUANTIZED.iter().map(|t| t.name()).collect();
    format!("unknown type `{s}` (one of {})", names.join(", "))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    super::common::check_outputs(
        &[("OUT.gguf", &args.output)],
        &[("the input model", &args.input)],
    )?;
    let summary = quantize(&args.input, &args.output, args.weight_type)
        .with_context(|| format!("quantizing {}", args.input.display()))?;
    out!("{}", report(&args, &summary));
    Ok(ExitCode::SUCCESS)
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn types(counts: &[TypeCount]) -> String {
    counts
        .iter()
        .map(|c| format!("{} {} ({})", c.dtype, c.tensors, mib(c.bytes)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn report(args: &Args, s: &QuantizeSummary) -> String {
    let mut out = format!(
        "wrote {} ({}) from {}\n",
        args.output.display(),
        s.weight_type,
        args.input.display()
    );
    let matrices = s.converted + s.q8_0_fallback + s.left_as_stored.len();
    out += &format!(
        "matrix weights: {matrices} of {} tensors; {} as {}",
        s.tensors,
        s.converted,
        s.weight_type.dtype()
    );
    if s.q8_0_fallback > 0 {
        out += &format!(", {} as q8_0 (rows not a multiple of 256)", s.q8_0_fallback);
    }
    if !s.left_as_stored.is_empty() {
        out += &format!(
            ", {} left as stored (rows not a multiple of 32)",
            s.left_as_stored.len()
        );
    }
    out += &format!("; the other {} tensors copied\n", s.tensors - matrices);
    out += &format!("before: {}\n", types(&s.before));
    out += &format!("after:  {}\n", types(&s.after));
    let ratio = |a: u64, b: u64| 100.0 * a as f64 / b.max(1) as f64;
    out += &format!(
        "tensor data: {} -> {} bytes ({} -> {}, {:.1}%)\n",
        s.tensor_bytes_before(),
        s.tensor_bytes_after(),
        mib(s.tensor_bytes_before()),
        mib(s.tensor_bytes_after()),
        ratio(s.tensor_bytes_after(), s.tensor_bytes_before())
    );
    out += &format!(
        "file: {} -> {} bytes ({} -> {}, {:.1}%)\n",
        s.file_bytes_before,
        s.file_bytes_after,
        mib(s.file_bytes_before),
        mib(s.file_bytes_after),
        ratio(s.file_bytes_after, s.file_bytes_before)
    );
    out
}
