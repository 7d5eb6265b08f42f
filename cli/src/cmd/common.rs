//! Options shared by several subcommands: device choice, model and image sources.

use anyhow::Context as _;
use da3::preprocess::{load_image, RgbImage8};
use da3::{Device, LoadOptions, Model};
use std::path::PathBuf;

#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to compute: `auto` (a GPU if ggml has one, else the CPU), `cpu`, a device name
    /// from `da3 devices` (e.g. `CUDA0`, `MTL0`), or `rpc:HOST:PORT` for a `da3 rpc-server`.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// CPU threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

impl DeviceArgs {
    /// Load options for this device choice.
    pub fn options(&self) -> LoadOptions {
        LoadOptions {
            device: self.device.clone(),
            threads: self.threads,
            ..LoadOptions::default()
        }
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
    pub fn load(&self, options: &LoadOptions) -> anyhow::Result<Model> {
        match &self.model {
            Some(path) => Model::load(path, options)
                .with_context(|| format!("loading model {}", path.display())),
            None => {
                let file = da3::convert::builtin_model_file()?;
                Ok(Model::from_gguf(&file, options)?)
            }
        }
    }
    /// Like [`ModelArgs::load`], warning loudly when the built-in model stands in for a real
    /// one (its depth means nothing).
    pub fn load_for_results(&self, options: &LoadOptions) -> anyhow::Result<Model> {
        if self.model.is_none() {
            log::warn!(
                "no --model given: using the BUILT-IN da3-tiny with synthetic, UNTRAINED \
                 weights; its depth is meaningless. Pass --model FILE.gguf (a \
                 depth-anything.cpp GGUF file, or `da3 convert` of an official checkpoint)."
            );
        }
        self.load(options)
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
        None => Ok(da3::synthetic::image(640, 427)),
    }
}
