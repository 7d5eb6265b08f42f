//! Options shared by several subcommands: device choice, model and image sources.

use anyhow::Context as _;
use da3::da3::preprocess::{load_image, RgbImage8};
use da3::da3::{convert, synthetic, LoadOptions, Model};
use da3::ggml::{Backend, Device};
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to compute: `auto` (a GPU if ggml has one, else the CPU), `cpu`, a device name
    /// from `da3 devices` (e.g. `CUDA0`, `MTL0`), or `rpc:HOST:PORT` for a `da3 rpc-server`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// CPU threads (0: one per physical core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl DeviceArgs {
    /// The compute backend and the CPU backend the planner falls back to.
    pub fn backends(&self) -> anyhow::Result<(Backend, Backend)> {
        let cpu = Backend::cpu(self.threads)?;
        let device = match self.device.as_str() {
            "auto" => Device::best(),
            "cpu" | "CPU" => return Ok((cpu.clone(), cpu)),
            spec => match spec.strip_prefix("rpc:") {
                Some(endpoint) => Device::rpc(endpoint)?,
                None => Device::by_name(spec).with_context(|| format!("--device {spec}"))?,
            },
        };
        if device.kind() == da3::ggml::DeviceKind::Cpu {
            return Ok((cpu.clone(), cpu));
        }
        Ok((Backend::new(device)?, cpu))
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
