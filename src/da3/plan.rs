//! The execution plan: which kernel, in which precision, runs each class of op, and which
//! graph transforms the weights were loaded for. Decided once when a model is loaded, from
//! the device, the file's weight types, the [`LoadOptions`](super::LoadOptions) and the
//! detected CPU; stored with the model ([`Model::plan`](super::Model::plan)), printed by
//! `da3 info` and `da3 bench`, logged at debug level. The library reads no environment
//! variable: callers that want another route say so in [`PlanOverrides`].

use super::backbone::AttentionKernel;
use crate::ggml::{Cpu, CpuKernels, Device, DeviceKind, KernelConfig, KernelRequest, KernelSet};
use std::fmt;

/// A caller's departures from the default plan, each `None` (or `false`) for the default.
/// Mostly for measuring one route against another; the CLI fills them from its flags and,
/// for compatibility, from the `DA3_*` environment variables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanOverrides {
    /// The CPU kernels: a lower instruction set, vector bf16 products on or off, AMX tiles
    /// off, Winograd off, the int8 products' activation bits.
    pub kernels: KernelRequest,
    /// `Some(false)`: quantised files' linear layers keep ggml's quantised product instead of
    /// our int8 products.
    pub int8_products: Option<bool>,
    /// `Some(false)`: norms and layer scales stay apart from the linear layers off the CPU
    /// kernels, to measure what folding saves.
    pub fold_norms: Option<bool>,
    /// `Some(false)`: rotated heads keep two rotations per head instead of one vision-mode
    /// RoPE node, to measure what one saves.
    pub vision_rope: Option<bool>,
    /// `Some(false)`: QK-normed heads keep LayerNorms off the CPU kernels instead of being
    /// centred by the QKV layer and normalised by RMS norms.
    pub centre_qk_heads: Option<bool>,
    /// `Some(false)`: on CUDA, ggml's fused attention instead of ours (cuDNN, `da3-cuda`, in
    /// builds with the `cuda-kernels` feature), which is the default where cuDNN loads.
    pub cuda_attention: Option<bool>,
}

/// Whether attention runs on our CUDA kernels (`da3-cuda`: cuDNN's fused attention on the
/// CUDA backend's memory), decided at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaAttentionPlan {
    /// Not a CUDA device: nothing to decide.
    NotCuda,
    /// On this CUDA device, with the cuDNN of this version.
    Cudnn {
        /// The CUDA device's index (`CUDA0` -> 0).
        device: u32,
        /// The loaded cuDNN's version (`9.28.1`).
        version: String,
    },
    /// A CUDA device, but ggml's attention: why (not asked for, not built with
    /// `cuda-kernels`, cuDNN not found).
    Off(String),
}

impl CudaAttentionPlan {
    /// The decision for `device`: ours unless turned off, where this build has our CUDA
    /// kernels and cuDNN loads.
    pub(crate) fn for_device(device: &Device, overrides: &PlanOverrides) -> CudaAttentionPlan {
        if !is_cuda(device) {
            return CudaAttentionPlan::NotCuda;
        }
        // On by default: faster end to end at every scene size measured (H100, base f16:
        // network 6.88 against 7.10 ms at one image, 52.1 against 58.7 ms at 8 views, 143 against
        // 183 ms at 16; docs/notes/2026-12-06-cuda-attention.md).
        if overrides.cuda_attention == Some(false) {
            return CudaAttentionPlan::Off("turned off (--plan cuda-attention=off)".into());
        }
        let name = device.name();
        let Some(index) = name
            .strip_prefix("CUDA")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return CudaAttentionPlan::Off(format!("no device index in `{name}`"));
        };
        Self::probe(index)
    }

    #[cfg(feature = "cuda-kernels")]
    fn probe(index: u32) -> CudaAttentionPlan {
        match crate::ggml::CudaAttention::new(index, None) {
            Ok(attention) => CudaAttentionPlan::Cudnn {
                device: index,
                version: attention.cudnn_version(),
            },
            Err(e) => CudaAttentionPlan::Off(e.to_string()),
        }
    }

    #[cfg(not(feature = "cuda-kernels"))]
    fn probe(_index: u32) -> CudaAttentionPlan {
        CudaAttentionPlan::Off("built without the cuda-kernels feature".into())
    }
}

/// What runs where for one loaded model. See the module documentation.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionPlan {
    device: String,
    /// The CPU's own kernel set (shown where ggml's ops run every node).
    cpu_set: KernelSet,
    /// Our CPU kernels and their products, where they run (CPU backend, a vector set, not
    /// `ggml_ops_only`).
    kernels: Option<CpuKernels>,
    /// Quantised weights packed for int8 products (else ggml's quantised product).
    int8_linears: bool,
    attention: AttentionKernel,
    half_linears_bf16: bool,
    half_convolutions: bool,
    fold_affine: bool,
    folded_layers: usize,
    vision_rope: bool,
    centred_qk_heads: bool,
    cuda_attention: CudaAttentionPlan,
}

/// The decisions taken before the weights are read; [`PlanBuilder::finish`] adds what the
/// weights turned out to be.
#[derive(Debug, Clone)]
pub(crate) struct PlanBuilder {
    pub cpu_set: KernelSet,
    /// Our kernels' configuration, where they run.
    pub kernels: Option<KernelConfig>,
    /// Pack quantised linear weights for int8 products.
    pub int8_linears: bool,
    pub attention: AttentionKernel,
    /// f16 linear weights stored as bf16 (CUDA, where bf16 products are faster).
    pub half_linears_bf16: bool,
    pub fold_affine: bool,
    pub vision_rope: bool,
    pub centre_qk_heads: bool,
    pub cuda_attention: CudaAttentionPlan,
}

/// What the loaded weights say about the plan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadedFacts {
    pub bf16_products: bool,
    pub int8_products: bool,
    pub half_convolutions: bool,
    pub folded_layers: usize,
    pub vision_rope: bool,
    pub centred_qk_heads: bool,
}

impl PlanBuilder {
    /// The plan's decisions for `device`, before the weights are read.
    pub fn new(device: &Device, ggml_ops_only: bool, overrides: &PlanOverrides) -> PlanBuilder {
        let cpu = Cpu::detect();
        let config = KernelConfig::new(&cpu, &overrides.kernels);
        // Our kernels only where they beat ggml's ops: with the portable set, ggml's
        // vectorised ops run every node.
        let on_cpu = device.kind() == DeviceKind::Cpu;
        let kernels = (on_cpu && config.set().beats_ggml() && !ggml_ops_only).then_some(config);
        PlanBuilder {
            cpu_set: config.set(),
            kernels,
            int8_linears: kernels.is_some() && overrides.int8_products != Some(false),
            attention: AttentionKernel::for_device(device),
            // bf16 products sum in f32 and are faster there (DA3-large on an H200: 15.1 ms
            // for an f16 file, 14.6 for the same weights in bf16).
            half_linears_bf16: is_cuda(device),
            // Our kernels fuse norms and scales into their products already.
            fold_affine: kernels.is_none() && overrides.fold_norms != Some(false),
            vision_rope: overrides.vision_rope != Some(false),
            centre_qk_heads: kernels.is_none() && overrides.centre_qk_heads != Some(false),
            cuda_attention: CudaAttentionPlan::for_device(device, overrides),
        }
    }

    /// The plan, with what the weights turned out to be.
    pub fn finish(self, device: &Device, loaded: LoadedFacts) -> ExecutionPlan {
        ExecutionPlan {
            device: device.name(),
            cpu_set: self.cpu_set,
            kernels: self.kernels.map(|config| CpuKernels {
                config,
                bf16_products: loaded.bf16_products,
                int8_products: loaded.int8_products,
            }),
            int8_linears: self.int8_linears,
            attention: self.attention,
            half_linears_bf16: self.half_linears_bf16,
            half_convolutions: loaded.half_convolutions,
            fold_affine: self.fold_affine,
            folded_layers: loaded.folded_layers,
            vision_rope: loaded.vision_rope,
            centred_qk_heads: loaded.centred_qk_heads,
            cuda_attention: self.cuda_attention,
        }
    }
}

/// Whether `device` is a CUDA GPU, whose backend converts f32 K and V itself and multiplies
/// bf16 weights faster than f16 ones.
pub(crate) fn is_cuda(device: &Device) -> bool {
    device.backend_name() == "CUDA"
}

impl ExecutionPlan {
    /// Our CPU kernels and their products, where they compute (None: ggml's ops run every
    /// node).
    pub fn cpu_kernels(&self) -> Option<&CpuKernels> {
        self.kernels.as_ref()
    }

    /// How attention is computed off our CPU kernels.
    pub(crate) fn attention(&self) -> AttentionKernel {
        self.attention
    }

    /// Whether our CUDA kernels compute attention.
    pub fn cuda_attention(&self) -> &CudaAttentionPlan {
        &self.cuda_attention
    }

    /// One line per op class and one for the transforms, as `da3 info` prints them.
    fn rows(&self) -> Vec<(&'static str, String)> {
        let Some(k) = &self.kernels else {
            return self.ggml_rows();
        };
        let set = k.config.set();
        let amx = k.config.amx_tiles();
        let products = |bf16: bool, tiles: bool| match (bf16, tiles) {
            (true, true) => "bf16 on AMX tiles",
            (true, false) => "bf16",
            _ => "f32",
        };
        let linear = match (k.int8_products, k.bf16_products, self.int8_linears) {
            (true, _, _) => format!(
                "da3 {set}: int8 products for quantised weights ({}-bit activations), f32 panels \
                 for the rest",
                k.config.int8_activation_bits()
            ),
            (false, true, _) if amx => format!("da3 {set}: bf16 panels on AMX tiles"),
            (false, true, _) => format!("da3 {set}: bf16 panels"),
            (false, false, false) => {
                format!("da3 {set}: f32 or f16 panels; quantised weights by ggml mul_mat")
            }
            (false, false, true) => format!("da3 {set}: f32 or f16 panels"),
        };
        let attention = if k.int8_attention() {
            format!("da3 {set}: int8 scores and weighted values, f32 softmax")
        } else {
            format!(
                "da3 {set}: fused, {}",
                products(k.bf16_attention(), k.bf16_attention() && amx)
            )
        };
        let conv_products = if k.bf16_convolutions(amx) {
            if amx {
                "bf16 (AMX tiles where channels fill them)"
            } else {
                "bf16"
            }
        } else {
            "f32"
        };
        let winograd = if k.config.winograd() {
            "Winograd F(4x4,3x3) for 3x3 on large maps in f32, direct otherwise"
        } else {
            "direct"
        };
        vec![
            ("linear", linear),
            ("attention", attention),
            (
                "convolution",
                format!("da3 {set}: {winograd}; {conv_products}"),
            ),
            (
                "transposed conv",
                format!("da3 {set}: kernel = stride (2, 4); ggml otherwise"),
            ),
            ("norms", format!("da3 {set}: LayerNorm in one pass")),
            (
                "element-wise",
                format!("da3 {set}: GELU (erf), bilinear + offset, concat, transpose; ggml others"),
            ),
            ("transforms", self.transforms()),
        ]
    }

    /// The rows where ggml's ops run every node.
    fn ggml_rows(&self) -> Vec<(&'static str, String)> {
        let linear = if self.half_linears_bf16 {
            "ggml mul_mat (f16 weights stored as bf16)"
        } else {
            "ggml mul_mat"
        };
        let mut attention = match self.attention {
            AttentionKernel::Exact => "ggml mul_mat + soft_max, f32".to_owned(),
            AttentionKernel::FusedHalfKv { convert_in_graph } => format!(
                "ggml flash_attn_ext, K and V in f16 ({}), f32 sums",
                if convert_in_graph {
                    "converted in the graph"
                } else {
                    "converted by the backend"
                }
            ),
        };
        match &self.cuda_attention {
            CudaAttentionPlan::NotCuda => {}
            CudaAttentionPlan::Cudnn { version, .. } => {
                attention = format!(
                    "da3-cuda: cuDNN {version} fused attention, Q, K and V rounded to f16, f32 \
                     softmax and sums; {attention} for nodes it does not take"
                )
            }
            CudaAttentionPlan::Off(why) => attention = format!("{attention} (da3-cuda: {why})"),
        }
        let convolution = if self.half_convolutions {
            "ggml conv_2d_direct, f16 kernels, f32 sums"
        } else {
            "ggml im2col + mul_mat, f32"
        };
        vec![
            ("linear", linear.to_owned()),
            ("attention", attention),
            ("convolution", convolution.to_owned()),
            ("transposed conv", "ggml conv_transpose_2d".to_owned()),
            (
                "norms",
                "ggml norm, mul, add (rms_norm where centred)".to_owned(),
            ),
            ("element-wise", "ggml".to_owned()),
            ("transforms", self.transforms()),
        ]
    }

    fn transforms(&self) -> String {
        let on = |b: bool| if b { "on" } else { "off" };
        let folding = if self.fold_affine {
            format!("on ({} layers)", self.folded_layers)
        } else {
            "off".to_owned()
        };
        format!(
            "affine folding {folding}, QK centring {}, vision RoPE {}",
            on(self.centred_qk_heads),
            on(self.vision_rope)
        )
    }

    /// The plan as JSON (for `--json` outputs): the device, the kernel set and one string
    /// per op class.
    pub fn to_json(&self) -> serde_json::Value {
        let mut map = serde_json::Map::new();
        map.insert("device".into(), self.device.clone().into());
        let kernels = match &self.kernels {
            Some(k) => k.config.set().name(),
            None => "ggml",
        };
        map.insert("kernels".into(), kernels.into());
        map.insert("cpu_set".into(), self.cpu_set.name().into());
        for (class, what) in self.rows() {
            map.insert(class.replace([' ', '-'], "_"), what.into());
        }
        serde_json::Value::Object(map)
    }
}

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kernels {
            Some(k) => writeln!(f, "on {}, da3 CPU kernels {}", self.device, k.config.set())?,
            None => writeln!(
                f,
                "on {}, ggml's ops (CPU kernel set {})",
                self.device, self.cpu_set
            )?,
        }
        let rows = self.rows();
        for (i, (class, what)) in rows.iter().enumerate() {
            write!(f, "  {class:<16} {what}")?;
            if i + 1 < rows.len() {
                writeln!(f)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::DeviceSpec;

    fn cpu() -> Device {
        DeviceSpec::Cpu.resolve().unwrap()
    }

    #[test]
    fn our_kernels_run_on_the_cpu_unless_told_otherwise() {
        let device = cpu();
        let plan = PlanBuilder::new(&device, false, &PlanOverrides::default());
        let best = Cpu::detect().best();
        assert_eq!(plan.kernels.is_some(), best.beats_ggml());
        // Folding and centring are for graphs without our kernels, which fuse both.
        assert_eq!(plan.fold_affine, !best.beats_ggml());
        assert_eq!(plan.centre_qk_heads, !best.beats_ggml());
        let ggml = PlanBuilder::new(&device, true, &PlanOverrides::default());
        assert!(ggml.kernels.is_none() && ggml.fold_affine && ggml.centre_qk_heads);
        assert!(!ggml.int8_linears);
        let overrides = PlanOverrides {
            fold_norms: Some(false),
            centre_qk_heads: Some(false),
            vision_rope: Some(false),
            ..PlanOverrides::default()
        };
        let plain = PlanBuilder::new(&device, true, &overrides);
        assert!(!plain.fold_affine && !plain.centre_qk_heads && !plain.vision_rope);
    }

    #[test]
    fn a_lower_set_is_planned_as_asked() {
        let device = cpu();
        let overrides = PlanOverrides {
            kernels: KernelRequest {
                set: Some(KernelSet::Portable),
                ..KernelRequest::default()
            },
            ..PlanOverrides::default()
        };
        let plan = PlanBuilder::new(&device, false, &overrides);
        assert_eq!(plan.cpu_set, KernelSet::Portable);
        assert!(
            plan.kernels.is_none(),
            "the portable set leaves every node to ggml"
        );
        let loaded = LoadedFacts {
            bf16_products: false,
            int8_products: false,
            half_convolutions: false,
            folded_layers: 3,
            vision_rope: true,
            centred_qk_heads: true,
        };
        let shown = plan.finish(&device, loaded).to_string();
        assert!(
            shown.contains("ggml's ops (CPU kernel set portable)"),
            "{shown}"
        );
        assert!(shown.contains("affine folding on (3 layers)"), "{shown}");
    }

    #[test]
    fn the_plan_names_each_op_class_once() {
        let device = cpu();
        let plan = PlanBuilder::new(&device, false, &PlanOverrides::default());
        let loaded = LoadedFacts {
            bf16_products: false,
            int8_products: plan.kernels.is_some(),
            half_convolutions: false,
            folded_layers: 0,
            vision_rope: true,
            centred_qk_heads: false,
        };
        let plan = plan.finish(&device, loaded);
        let shown = plan.to_string();
        for class in [
            "linear",
            "attention",
            "convolution",
            "transposed conv",
            "norms",
            "element-wise",
            "transforms",
        ] {
            let lines = shown
                .lines()
                .filter(|l| l.trim_start().starts_with(class))
                .count();
            assert_eq!(lines, 1, "{class} in\n{shown}");
        }
        let json = plan.to_json();
        assert!(json["linear"].is_string() && json["transposed_conv"].is_string());
        if plan.cpu_kernels().is_some() {
            assert!(shown.contains("int8 scores"), "{shown}");
        }
    }
}
