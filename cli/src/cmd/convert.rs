//! `da3 convert`: an official checkpoint (a DA3 directory, or a Depth Anything V2 `.pth`
//! file) to a GGUF file.

use anyhow::Context as _;
use da3::convert::{checkpoint_outputs, convert_checkpoint, convert_da2_checkpoint, WeightType};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// Folder with `config.json` ({"model_name": "da3-small"} or another preset) and
    /// `model.safetensors`, as the official DepthAnything3 class saves them; or a Depth
    /// Anything V2 checkpoint file (`depth_anything_v2_vits.pth`, ..., relative or metric).
    checkpoint: PathBuf,
    /// Output file (written atomically).
    #[arg(short, long, value_name = "OUT.gguf")]
    output: PathBuf,
    /// Storage type of the matrix weights (block linears and camera decoder): f32, f16, bf16,
    /// q8_0, q6_k, q5_k or q4_k (k-quants fall back to q8_0 where rows are not a multiple of
    /// 256); everything else stays f32.
    #[arg(long = "type", default_value = "f32")]
    weight_type: WeightType,
    /// A Depth Anything V2 metric model's maximum depth in metres (default: 20 for a file
    /// named `..._hypersim_...`, 80 for `..._vkitti_...`; none: a relative model).
    #[arg(long, value_name = "METRES")]
    max_depth: Option<f32>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.checkpoint.is_file() {
        return convert_da2(&args);
    }
    if args.max_depth.is_some() {
        anyhow::bail!("--max-depth: only Depth Anything V2 checkpoints (.pth files) take it");
    }
    let (config, weights) = (
        args.checkpoint.join("config.json"),
        args.checkpoint.join("model.safetensors"),
    );
    super::common::check_outputs(
        &[("--output", &args.output)],
        &[
            ("the checkpoint's config", &config),
            ("the checkpoint's weights", &weights),
        ],
    )?;
    let files = checkpoint_outputs(&args.checkpoint, &args.output)
        .with_context(|| format!("converting {}", args.checkpoint.display()))?;
    // A nested model's metric branch goes beside --output.
    if let Some(metric) = files.get(1) {
        super::common::check_outputs(&[("the metric branch's file", metric.as_path())], &[])?;
    }
    let skipped = convert_checkpoint(&args.checkpoint, &args.output, args.weight_type)
        .with_context(|| format!("converting {}", args.checkpoint.display()))?;
    outln!("wrote {}", args.output.display());
    if let Some(metric) = files.get(1) {
        outln!(
            "wrote {} (the metric branch: da3 depth --model {} --metric-model {})",
            metric.display(),
            args.output.display(),
            metric.display()
        );
    }
    if !skipped.is_empty() {
        outln!(
            "left out {} tensors single-image depth does not use (ray branch, camera encoder, ...)",
            skipped.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// A Depth Anything V2 `.pth` file.
fn convert_da2(args: &Args) -> anyhow::Result<ExitCode> {
    super::common::check_outputs(
        &[("--output", &args.output)],
        &[("the checkpoint", &args.checkpoint)],
    )?;
    let skipped = convert_da2_checkpoint(
        &args.checkpoint,
        &args.output,
        args.weight_type,
        args.max_depth,
    )
    .with_context(|| format!("converting {}", args.checkpoint.display()))?;
    outln!("wrote {}", args.output.display());
    if !skipped.is_empty() {
        outln!(
            "left out {} tensors the network does not use: {}",
            skipped.len(),
            skipped.join(", ")
        );
    }
    Ok(ExitCode::SUCCESS)
}
