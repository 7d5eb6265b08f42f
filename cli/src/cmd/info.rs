//! `da3 info`: what a model file holds and where its weights end up.

use super::common::{DeviceArgs, ModelArgs};
use anyhow::Context as _;
use da3::da3::architecture::{self, Parts, Role};
use da3::gguf::GgufFile;
use da3::{convert, Model};
use da3::{DepthActivation, Family};
use std::collections::BTreeMap;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    device: DeviceArgs,
    /// Print the facts as one JSON object on stdout (model, ggml, plan, architecture, tensor
    /// groups, weight bytes, unused tensors, the planner's decision) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = match &args.model.model {
        Some(path) => {
            GgufFile::open(path).with_context(|| format!("loading model {}", path.display()))?
        }
        None => convert::builtin_model_file()?,
    };
    let model = Model::from_gguf(&file, &args.device.options()?)?;
    let c = model.config().clone();
    let mut groups: BTreeMap<String, (usize, u64, BTreeMap<String, usize>)> = BTreeMap::new();
    for t in file.tensors() {
        let group = t.name.split('.').next().unwrap_or("?").to_owned();
        let entry = groups.entry(group).or_default();
        entry.0 += 1;
        entry.1 += t.nbytes();
        *entry.2.entry(t.dtype.to_string()).or_default() += 1;
    }
    let params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    // The 3D Gaussian head, when the file holds it (loaded only for Gaussians).
    let gaussians = c
        .gaussians
        .filter(|_| file.tensor(architecture::GAUSSIAN_HEAD_PROBE).is_some());
    let device = model.device().name();
    // The architecture's table of the file, the one the loader checked it against.
    let table = architecture::tensors(&c, &Parts::of_file(&file, &c, true, true)?)?;
    let count = |role| table.iter().filter(|t| t.role == role).count();
    let quantised = table.iter().filter(|t| t.quantised).count();
    let host: Vec<&str> = table
        .iter()
        .filter(|t| t.role == Role::Host)
        .map(|t| t.name.as_str())
        .collect();
    // The graph of a 640x427 photo at the model's process resolution (504x336 by default).
    let photo = da3::synthetic::image(640, 427);
    let size = da3::Request::image(&photo).processed_plans(model.process_res())?[0];
    let report = model.session()?.residency_report(size.width, size.height)?;

    if args.json {
        let groups: serde_json::Map<String, serde_json::Value> = groups
            .iter()
            .map(|(group, (count, bytes, types))| {
                let value = serde_json::json!({
                    "tensors": count, "bytes": bytes, "types": types, "device": device,
                });
                (group.clone(), value)
            })
            .collect();
        let facts = serde_json::json!({
            "model": args.model.describe(),
            "name": c.name,
            "family": if c.is_da2() { "depthanything2" } else { "depthanything3" },
            "ggml": da3::ggml::ggml_version(),
            "ggml_cpu": da3::ggml::cpu_features(),
            "gguf_version": file.version(),
            "plan": model.plan().to_json(),
            "backbone": {
                "embed_dim": c.vit.embed_dim,
                "depth": c.vit.depth,
                "heads": c.vit.num_heads,
                "ffn": format!("{:?}", c.vit.ffn),
                "mlp_hidden": c.vit.mlp_hidden,
                "out_layers": c.vit.out_layers,
                "alt_start": c.vit.alt_start,
                "rope_start": c.vit.rope_start,
                "qknorm_start": c.vit.qknorm_start,
                "cat_token": c.vit.cat_token,
            },
            "head": {
                "kind": format!("{:?}", c.head.kind),
                "features": c.head.features,
                "out_channels": c.head.out_channels,
                "sky": c.head.sky,
                "activation": format!("{:?}", c.head.activation),
            },
            "gaussians": gaussians.map(|g| serde_json::json!({
                "features": g.features,
                "out_channels": g.out_channels,
                "sh_degree": g.sh_degree,
                "offset_xy": g.offset_xy,
                "offset_depth": g.offset_depth,
                "scale_range": [g.scale_min, g.scale_max],
            })),
            "parameters": params,
            "tensors": file.tensors().len(),
            "groups": groups,
            "architecture": {
                "tensors": table.len(),
                "matrix_weights": count(Role::Matmul),
                "quantised_by_quantize": quantised,
                "convolution_kernels": count(Role::ConvKernel),
                "others": count(Role::F32) + count(Role::Host),
                "host_only": host,
            },
            "device": device,
            "device_weight_bytes": model.device_weight_bytes(),
            "unused_tensors": model.unused_tensors(),
            "residency": report.summary(),
        });
        outln!("{}", serde_json::to_string_pretty(&facts)?);
        return Ok(ExitCode::SUCCESS);
    }

    outln!("model        {}", args.model.describe());
    outln!("ggml cpu     {}", da3::ggml::cpu_features());
    outln!("plan         {}", model.plan());
    let family = match (c.family, c.head.activation) {
        (Family::Da3, _) => "depthanything3".to_owned(),
        (Family::Da2 { input_size }, DepthActivation::Sigmoid { max_depth }) => format!(
            "depthanything2, metric (metres up to {max_depth}), shortest side >= {input_size}"
        ),
        (Family::Da2 { input_size }, _) => {
            format!("depthanything2, relative (disparity), shortest side >= {input_size}")
        }
    };
    outln!(
        "architecture {family} ({}), GGUF v{}",
        c.name,
        file.version()
    );
    outln!(
        "backbone     embed {} depth {} heads {} ffn {:?} {}  out layers {:?}",
        c.vit.embed_dim,
        c.vit.depth,
        c.vit.num_heads,
        c.vit.ffn,
        c.vit.mlp_hidden,
        c.vit.out_layers
    );
    outln!(
        "             alt/rope/qk-norm start {:?}/{:?}/{:?}, cat_token {}",
        c.vit.alt_start,
        c.vit.rope_start,
        c.vit.qknorm_start,
        c.vit.cat_token
    );
    outln!(
        "head         {:?} features {} out_channels {:?} sky {}",
        c.head.kind,
        c.head.features,
        c.head.out_channels,
        c.head.sky
    );
    if let Some(g) = gaussians {
        outln!(
            "gaussians    GSDPT features {} out_channels {:?}, SH degree {}, scales {}..{} \
             (loaded for --gs-ply / --gs-video)",
            g.features,
            g.out_channels,
            g.sh_degree,
            g.scale_min,
            g.scale_max
        );
    }
    outln!(
        "parameters   {:.1} M in {} tensors",
        params as f64 / 1e6,
        file.tensors().len()
    );
    for (group, (count, bytes, types)) in &groups {
        let types: Vec<String> = types.iter().map(|(t, n)| format!("{n} {t}")).collect();
        outln!(
            "  {group:<5} {count:>4} tensors {:>9.1} MiB  [{}]  on {device}",
            *bytes as f64 / (1u64 << 20) as f64,
            types.join(", ")
        );
    }
    outln!(
        "tensors      {} in the architecture: {} matrix weights ({} stored quantised by da3 quantize), {} \
         convolution kernels, {} others",
        table.len(),
        count(Role::Matmul),
        quantised,
        count(Role::ConvKernel),
        count(Role::F32) + count(Role::Host)
    );
    outln!(
        "  ({} read on the host only, resampled per resolution)",
        host.join(", ")
    );
    outln!(
        "weights on device: {:.1} MiB",
        model.device_weight_bytes() as f64 / (1u64 << 20) as f64
    );
    if !model.unused_tensors().is_empty() {
        outln!("unused tensors: {}", model.unused_tensors().join(", "));
    }
    outln!("{}", report.summary());
    Ok(ExitCode::SUCCESS)
}
