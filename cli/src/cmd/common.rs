//! Options shared by several subcommands: device choice, model and image sources.

use anyhow::Context as _;
use da3::ReadOptions;
use da3::{atomic_file, outputs, Image};
use da3::{Config, ConvPrecision, Device, LoadOptions, Model, NestedModel, Predictor};
use std::path::{Path, PathBuf};

/// Most CPU threads `--threads` takes (ggml's own limit), and at most 4 per available CPU.
pub const MAX_THREADS: usize = 512;

#[derive(clap::Args, Debug, Clone)]
pub struct DeviceArgs {
    /// Where to compute: `auto` (a GPU if ggml has one, else the CPU), `cpu`, a device name
    /// from `da3 devices` (e.g. `CUDA0`, `MTL0`), or `rpc:HOST:PORT` for a `da3 rpc-server`.
    #[arg(long, default_value = "auto")]
    pub device: Device,
    /// CPU threads (0: one per physical core; at most 4 per CPU, and 512).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Convolutions in f16 (tensor cores on CUDA; inputs rounded to f16, sums in f32) or f32.
    /// `auto`: f16 for half-precision files on a GPU that runs ggml's direct convolution.
    #[arg(long, value_enum, default_value_t = ConvPrecisionArg::Auto)]
    pub conv_precision: ConvPrecisionArg,
    /// Departures from the execution plan, to compare one route with another:
    /// `kernels=portable|avx2|avx2vnni|avx512bf16`, `bf16-products=on|off`, `amx=off`,
    /// `winograd=off`, `int8-activation-bits=7|8`, `int8-products=off`, `fold-norms=off`,
    /// `vision-rope=off`, `centre-qk-heads=off`, `cuda-attention=off` (comma-separated or repeated). The `DA3_*`
    /// variables of earlier releases still apply; a flag wins. `da3 info` prints the plan.
    #[arg(long, value_name = "KEY=VALUE")]
    pub plan: Vec<String>,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvPrecisionArg {
    Auto,
    F32,
    F16,
}

impl From<ConvPrecisionArg> for ConvPrecision {
    fn from(arg: ConvPrecisionArg) -> Self {
        match arg {
            ConvPrecisionArg::Auto => ConvPrecision::Auto,
            ConvPrecisionArg::F32 => ConvPrecision::F32,
            ConvPrecisionArg::F16 => ConvPrecision::F16,
        }
    }
}

impl DeviceArgs {
    /// Load options for this device choice; refuses thread counts that would only thrash
    /// (more than 4 per available CPU, or ggml's limit of 512) before anything is loaded.
    pub fn options(&self) -> anyhow::Result<LoadOptions> {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let limit = (4 * cpus).min(MAX_THREADS);
        if self.threads > limit {
            anyhow::bail!(
                "--threads {}: at most {limit} (4 per CPU available here, {cpus}, and never more than {MAX_THREADS})",
                self.threads
            );
        }
        Ok(LoadOptions {
            device: self.device.clone(),
            threads: self.threads,
            conv_precision: self.conv_precision.into(),
            plan: super::plan::overrides(&self.plan)?,
            ..LoadOptions::default()
        })
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
        // A device that does not exist is named as the flag that asked for it.
        options
            .device
            .resolve()
            .with_context(|| format!("--device {}", options.device))?;
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
        self.warn_if_builtin();
        self.load(options)
    }
    /// The loud warning that the built-in model stands in for a real one.
    pub fn warn_if_builtin(&self) {
        if self.model.is_none() {
            log::warn!(
                "no --model given: using the BUILT-IN da3-tiny with synthetic, UNTRAINED \
                 weights; its depth is meaningless. Pass --model FILE.gguf (a \
                 depth-anything.cpp GGUF file, or `da3 convert` of an official checkpoint)."
            );
        }
    }
    /// The model's hyperparameters from its file's metadata, without loading it on a device
    /// (what the process that drives a remote device checks outputs against).
    pub fn config(&self) -> anyhow::Result<Config> {
        let file = match &self.model {
            Some(path) => da3::gguf::GgufFile::open(path)
                .map_err(da3::Error::from)
                .with_context(|| format!("loading model {}", path.display()))?,
            None => da3::convert::builtin_model_file()?,
        };
        let config = Config::from_gguf(&file);
        match &self.model {
            Some(path) => config.with_context(|| format!("loading model {}", path.display())),
            None => Ok(config?),
        }
    }
    pub fn describe(&self) -> String {
        match &self.model {
            Some(p) => p.display().to_string(),
            None => "built-in da3-tiny (synthetic weights)".to_owned(),
        }
    }
}

/// The model `--model` names, or the nested pair `--model` + `--metric-model`.
pub enum Loaded {
    Single(Model),
    Nested(NestedModel),
}

impl Loaded {
    /// Loads the model (or the pair) on `options.device`; the caller warns about the built-in
    /// model ([`ModelArgs::warn_if_builtin`]).
    pub fn load(
        model: &ModelArgs,
        metric_model: Option<&Path>,
        options: &LoadOptions,
    ) -> anyhow::Result<Loaded> {
        let anyview = model.load(options)?;
        let Some(path) = metric_model else {
            return Ok(Loaded::Single(anyview));
        };
        let metric = Model::load(path, options)
            .with_context(|| format!("loading --metric-model {}", path.display()))?;
        let nested = NestedModel::new(anyview, metric)
            .with_context(|| format!("--metric-model {}", path.display()))?;
        Ok(Loaded::Nested(nested))
    }

    /// What the outputs are checked against: a nested pair has the any-view branch's
    /// outputs and the metric branch's sky.
    pub fn config(&self) -> Config {
        match self {
            Loaded::Single(m) => m.config().clone(),
            Loaded::Nested(n) => Self::nested_config(n.anyview().config().clone()),
        }
    }

    /// [`Loaded::config`] from the files' metadata, without loading anything on a device.
    pub fn config_of_files(
        model: &ModelArgs,
        metric_model: Option<&Path>,
    ) -> anyhow::Result<Config> {
        let anyview = model.config()?;
        Ok(match metric_model {
            Some(_) => Self::nested_config(anyview),
            None => anyview,
        })
    }

    fn nested_config(mut anyview: Config) -> Config {
        anyview.head.sky = true;
        anyview
    }

    /// A session of the model or of the pair.
    pub fn predictor(&self) -> anyhow::Result<Box<dyn Predictor>> {
        Ok(match self {
            Loaded::Single(m) => Box::new(m.session()?),
            Loaded::Nested(n) => Box::new(n.session()?),
        })
    }
}

/// `--input` (read as `options` say), or the built-in synthetic 640x427 image.
pub fn load_input(input: Option<&PathBuf>, options: &ReadOptions) -> anyhow::Result<Image> {
    match input {
        Some(path) if super::video::is_video(path) => anyhow::bail!(
            "{} is a video: `da3 depth` takes images; `da3 batch --input {} --fps N --out-dir DIR` \
             decodes a video's frames (with ffmpeg) and computes each",
            path.display(),
            path.display()
        ),
        Some(path) => Ok(da3::load_image_with(path, options)?),
        None => Ok(da3::synthetic::image(640, 427)),
    }
}

/// Before any work: every output (`(flag, path)`) can be written (see
/// [`atomic_file::check_writable`]), none is one of the `inputs` (`(what, path)`), and no two
/// outputs are the same file.
pub fn check_outputs(outputs: &[(&str, &Path)], inputs: &[(&str, &Path)]) -> anyhow::Result<()> {
    for (i, (flag, path)) in outputs.iter().enumerate() {
        atomic_file::check_writable(path)
            .map_err(da3::Error::from)
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
