//! Options shared by several subcommands: device choice, model and image sources.

use anyhow::Context as _;
use da3::da3::outputs;
use da3::da3::preprocess::{load_image, RgbImage8};
use da3::da3::{convert, synthetic, LoadOptions, Model};
use da3::ggml::{Backend, Device};
use std::path::{Path, PathBuf};

/// Most CPU threads `--threads` takes (ggml's own limit), and at most 4 per available CPU.
pub const MAX_THREADS: usize = 512;

#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to compute: `auto` (a GPU if ggml has one, else the CPU), `cpu`, a device name
    /// from `da3 devices` (e.g. `CUDA0`, `MTL0`), or `rpc:HOST:PORT` for a `da3 rpc-server`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// CPU threads (0: all cores; at most 4 per core, and 512).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl DeviceArgs {
    /// The compute backend and the CPU backend the planner falls back to.
    pub fn backends(&self) -> anyhow::Result<(Backend, Backend)> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let limit = (4 * cpus).min(MAX_THREADS);
        if self.threads > limit {
            anyhow::bail!(
                "--threads {}: at most {limit} (4 per CPU available here, {cpus}, and never more than {MAX_THREADS})",
                self.threads
            );
        }
        let cpu = Backend::cpu(self.threads)?;
        let device = match self.device.as_str() {
            "auto" => Device::best(),
            "cpu" | "CPU" => return Ok((cpu.clone(), cpu)),
            spec => match spec.strip_prefix("rpc:") {
                Some(endpoint) => {
                    check_rpc_endpoint(endpoint)?;
                    Device::rpc(endpoint)?
                }
                None => Device::by_name(spec).with_context(|| format!("--device {spec}"))?,
            },
        };
        if device.kind() == da3::ggml::DeviceKind::Cpu {
            return Ok((cpu.clone(), cpu));
        }
        Ok((Backend::new(device)?, cpu))
    }
}

/// `HOST:PORT` with a port number, so a typo gets its own message instead of "unreachable".
fn check_rpc_endpoint(endpoint: &str) -> anyhow::Result<()> {
    let usage = "expected rpc:HOST:PORT, e.g. rpc:127.0.0.1:50052";
    match endpoint.rsplit_once(':') {
        None => anyhow::bail!("--device rpc:{endpoint}: the port is missing ({usage})"),
        Some(("", _)) => {
            anyhow::bail!("--device rpc:{endpoint}: the host is missing ({usage})")
        }
        Some((_, port)) => match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(()),
            _ => anyhow::bail!(
                "--device rpc:{endpoint}: `{port}` is not a port number 1-65535 ({usage})"
            ),
        },
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// A DA3 model in depth-anything.cpp's GGUF layout. Default: the built-in model
    /// (da3-tiny with synthetic weights: the right shape, not trained).
    #[arg(long, value_name = "FILE.gguf")]
    pub model: Option<PathBuf>,
}

impl ModelArgs {
    pub fn load(
        &self,
        device: Backend,
        cpu: Backend,
        options: &LoadOptions,
    ) -> anyhow::Result<Model> {
        match &self.model {
            Some(path) => Model::load(path, device, cpu, options)
                .with_context(|| format!("loading model {}", path.display())),
            None => {
                let file = convert::builtin_model_file()?;
                Ok(Model::from_gguf(&file, device, cpu, options)?)
            }
        }
    }
    pub fn describe(&self) -> String {
        match &self.model {
            Some(p) => p.display().to_string(),
            None => "built-in da3-tiny (synthetic weights)".to_owned(),
        }
    }
}

/// `--input`, or the built-in synthetic 640x427 image.
pub fn load_input(input: Option<&PathBuf>) -> anyhow::Result<RgbImage8> {
    match input {
        Some(path) => Ok(load_image(path)?),
        None => Ok(synthetic::image(640, 427)),
    }
}

/// Before any work: every output (`(flag, path)`) can be written (see
/// [`outputs::check_writable`]), none is one of the `inputs` (`(what, path)`), and no two
/// outputs are the same file.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (i, (flag, path)) in outputs.iter().enumerate() {
        outputs::check_writable(path)
            .and_then(|()| outputs::check_not_an_input(path, inputs))
            .map_err(|e| anyhow::anyhow!("{flag}: {e}"))?;
        if let Some((other, _)) = outputs[..i]
            .iter()
            .find(|(_, earlier)| earlier == path || outputs::same_file(earlier, path))
        {
            anyhow::bail!("{flag} {}: the same file as {other}", path.display());
        }
    }
    Ok(())
}

/// The files a run reads, for [`check_outputs`].
pub fn input_files<'a>(
    model: &'a ModelArgs,
    image: Option<&'a PathBuf>,
) -> Vec<(&'static str, &'a Path)> {
    [
        ("the model", model.model.as_ref()),
        ("the input image", image),
    ]
    .into_iter()
    .filter_map(|(what, path)| Some((what, path?.as_path())))
    .collect()
}
