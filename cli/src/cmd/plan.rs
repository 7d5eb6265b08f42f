//! The execution plan's overrides from the command line: `--plan KEY=VALUE` flags and, for
//! compatibility with earlier releases, the `DA3_*` environment variables (the library itself
//! reads no environment). A flag wins over the variable of the same setting.

use da3::PlanOverrides;

/// The environment variables of earlier releases, by `--plan` key.
const VARIABLES: [(&str, &str); 9] = [
    ("kernels", "DA3_CPU_KERNELS"),
    ("bf16-products", "DA3_BF16_PRODUCTS"),
    ("amx", "DA3_AMX"),
    ("winograd", "DA3_WINOGRAD"),
    ("int8-activation-bits", "DA3_INT8_ACTIVATION_BITS"),
    ("int8-products", "DA3_Q8_PRODUCTS"),
    ("fold-norms", "DA3_FOLD_NORMS"),
    ("vision-rope", "DA3_VISION_ROPE"),
    ("centre-qk-heads", "DA3_CENTRE_QK_HEADS"),
];

/// Settings only a flag sets (they came after the environment variables).
const FLAG_ONLY: [&str; 1] = ["cuda-attention"];

/// The overrides the environment and then `flags` (each `KEY=VALUE[,KEY=VALUE...]`) ask for.
pub fn overrides(flags: &[String]) -> anyhow::Result<PlanOverrides> {
    let mut plan = PlanOverrides::default();
    for (key, var) in VARIABLES {
        if let Ok(value) = std::env::var(var) {
            // The variables were always lenient: an unknown value meant the default.
            let _ = apply(&mut plan, key, &value);
        }
    }
    for pair in flags.iter().flat_map(|f| f.split(',')) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--plan {pair}: expected KEY=VALUE ({})", keys()))?;
        apply(&mut plan, key.trim(), value.trim())
            .map_err(|e| anyhow::anyhow!("--plan {pair}: {e}"))?;
    }
    Ok(plan)
}

fn keys() -> String {
    VARIABLES
        .iter()
        .map(|(key, _)| *key)
        .chain(FLAG_ONLY)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets `key` of `plan` to `value`: the kernels' keys through [`KernelRequest::set`], the
/// graph's own here.
///
/// [`KernelRequest::set`]: da3::ggml::KernelRequest::set
fn apply(plan: &mut PlanOverrides, key: &str, value: &str) -> Result<(), String> {
    let target = match key {
        "int8-products" => &mut plan.int8_products,
        "fold-norms" => &mut plan.fold_norms,
        "vision-rope" => &mut plan.vision_rope,
        "centre-qk-heads" => &mut plan.centre_qk_heads,
        "cuda-attention" => &mut plan.cuda_attention,
        _ => {
            return plan
                .kernels
                .set(key, value)
                .map_err(|e| format!("{e} (settings: {})", keys()))
        }
    };
    *target = match value {
        "on" => Some(true),
        "off" => Some(false),
        _ => return Err(format!("`{value}` for {key}: it takes on or off")),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use da3::ggml::KernelSet;

    #[test]
    fn flags_set_each_override() {
        let mut plan = PlanOverrides::default();
        for (key, value) in [
            ("kernels", "avx2"),
            ("bf16-products", "off"),
            ("amx", "off"),
            ("winograd", "off"),
            ("int8-activation-bits", "8"),
            ("int8-products", "off"),
            ("fold-norms", "off"),
            ("vision-rope", "off"),
            ("centre-qk-heads", "on"),
            ("cuda-attention", "on"),
        ] {
            apply(&mut plan, key, value).unwrap();
        }
        assert_eq!(plan.kernels.set, Some(KernelSet::Avx2));
        assert_eq!(plan.kernels.bf16_products, Some(false));
        assert_eq!(plan.kernels.amx, Some(false));
        assert_eq!(plan.kernels.winograd, Some(false));
        assert_eq!(plan.kernels.int8_activation_bits, Some(8));
        assert_eq!(plan.int8_products, Some(false));
        assert_eq!(plan.fold_norms, Some(false));
        assert_eq!(plan.vision_rope, Some(false));
        assert_eq!(plan.centre_qk_heads, Some(true));
        assert_eq!(plan.cuda_attention, Some(true));
    }

    #[test]
    fn bad_flags_name_the_setting_and_what_it_takes() {
        let mut plan = PlanOverrides::default();
        let e = apply(&mut plan, "winograd", "maybe").unwrap_err();
        assert!(e.contains("winograd") && e.contains("on or off"), "{e}");
        let e = apply(&mut plan, "kernels", "avx9000").unwrap_err();
        assert!(e.contains("avx512bf16"), "{e}");
        let e = apply(&mut plan, "speed", "max").unwrap_err();
        assert!(
            e.contains("unknown setting `speed`") && e.contains("fold-norms"),
            "{e}"
        );
        let e = overrides(&["winograd".to_owned()]).unwrap_err().to_string();
        assert!(e.contains("KEY=VALUE"), "{e}");
        assert_eq!(
            plan,
            PlanOverrides::default(),
            "a refused value changes nothing"
        );
    }
}
