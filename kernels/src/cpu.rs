//! What the CPU has ([`Cpu`]), what a caller asks for ([`Request`]) and what the kernels then
//! run with ([`Config`]): decided once by the caller (the model's execution plan), passed to
//! every kernel call, never read from the environment or a process-wide setting.

/// An instruction set the CPU kernels are compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelSet {
    /// AVX-512F vectors, bf16 products with `vdpbf16ps` and int8 products with `vpdpbusd`
    /// (AVX512_VNNI; AMD Zen 4, Intel Cooper Lake and Sapphire Rapids).
    Avx512Bf16,
    /// AVX2 vectors with FMA and AVX-VNNI's 256-bit int8 products (Intel Alder Lake and
    /// later without AVX-512, AMD Zen 5).
    Avx2Vnni,
    /// AVX2 vectors with FMA and F16C (x86-64-v3: Intel Haswell, AMD Zen 1 and later).
    Avx2,
    /// Plain arrays the compiler may vectorise: correct, not fast. The ops that have a ggml
    /// equivalent use ggml's instead ([`KernelSet::beats_ggml`]).
    Portable,
}

impl KernelSet {
    /// Fastest first: a request can only go down from what the CPU has.
    pub const ALL: [KernelSet; 4] = [
        KernelSet::Avx512Bf16,
        KernelSet::Avx2Vnni,
        KernelSet::Avx2,
        KernelSet::Portable,
    ];

    /// "avx512bf16", "avx2vnni", "avx2" or "portable".
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Avx512Bf16 => "avx512bf16",
            KernelSet::Avx2Vnni => "avx2vnni",
            KernelSet::Avx2 => "avx2",
            KernelSet::Portable => "portable",
        }
    }

    /// The set of this [`KernelSet::name`].
    pub fn from_name(name: &str) -> Option<KernelSet> {
        KernelSet::ALL.into_iter().find(|set| set.name() == name)
    }

    /// Whether the kernels of this set are faster than ggml's ops for the same nodes: the
    /// vector ones are; the portable register tile is several times slower than ggml's
    /// vectorised product, so with it every node keeps ggml's op.
    pub fn beats_ggml(self) -> bool {
        self != KernelSet::Portable
    }

    /// Whether this set multiplies bf16 pairs in one instruction (the fast mode of f16 files).
    pub fn has_bf16_products(self) -> bool {
        self == KernelSet::Avx512Bf16
    }

    fn rank(self) -> usize {
        KernelSet::ALL.iter().position(|s| *s == self).unwrap_or(0)
    }
}

impl std::fmt::Display for KernelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What this CPU offers the kernels, found by CPUID (and, for AMX, by asking the OS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cpu {
    best: KernelSet,
    avx2_vnni: bool,
    vendor: Option<String>,
    zen4: bool,
    amx: bool,
}

impl Cpu {
    /// This CPU. Cheap: CPUID reads, cached feature flags, and on an AMX CPU one
    /// `arch_prctl` that asks Linux for the tile state (asking again changes nothing).
    pub fn detect() -> Cpu {
        let vendor = cpu_vendor();
        #[cfg(target_arch = "x86_64")]
        let (zen4, amx) = (
            vendor.as_deref() == Some("AuthenticAMD")
                && cpu_family() == 0x19
                && is_x86_feature_detected!("avx512f"),
            crate::amx::available(),
        );
        #[cfg(not(target_arch = "x86_64"))]
        let (zen4, amx) = (false, false);
        Cpu {
            best: detect_best(),
            avx2_vnni: avx2_vnni_detected(),
            vendor,
            zen4,
            amx,
        }
    }

    /// The fastest set this CPU runs.
    pub fn best(&self) -> KernelSet {
        self.best
    }

    /// The CPUID vendor string ("AuthenticAMD", "GenuineIntel", ...), where there is one.
    pub fn vendor(&self) -> Option<&str> {
        self.vendor.as_deref()
    }

    /// Whether the CPU has AMX-BF16 tiles that the OS grants this process.
    pub fn has_amx_tiles(&self) -> bool {
        self.amx
    }

    /// Whether the CPU runs `set` (a set below the best one; AVX-VNNI also needs its flag,
    /// which an AVX-512 CPU such as Zen 4 may lack).
    pub fn runs(&self, set: KernelSet) -> bool {
        set.rank() >= self.best.rank() && (set != KernelSet::Avx2Vnni || self.avx2_vnni)
    }
}

/// A caller's requests, each `None` for the default: lower sets and other routes, mostly to
/// compare one against another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// A kernel set at or below the CPU's best (one it lacks gives the best one below it).
    pub set: Option<KernelSet>,
    /// Vector bf16 products where the set has them: on by default only on AMD (see
    /// [`Config::bf16_products_pay`]).
    pub bf16_products: Option<bool>,
    /// AMX tiles where the CPU has them (default on).
    pub amx: Option<bool>,
    /// Winograd's F(4x4, 3x3) for 3x3 f32 convolutions (default on).
    pub winograd: Option<bool>,
    /// The int8 products' activation bits, 7 or 8 (default 7 in the AVX2 set, 8 elsewhere; 7 is
    /// honoured only in the AVX2 set).
    pub int8_activation_bits: Option<u32>,
}

impl Request {
    /// The settings [`Request::set`] takes, each with the values it takes.
    pub const KEYS: [(&'static str, &'static str); 5] = [
        ("kernels", "portable, avx2, avx2vnni or avx512bf16"),
        ("bf16-products", "on or off"),
        ("amx", "on or off"),
        ("winograd", "on or off"),
        ("int8-activation-bits", "7 or 8"),
    ];

    /// Sets the request `key` (one of [`Request::KEYS`]) to `value` as a person writes it
    /// (`kernels=avx2`, `winograd=off`, ...); an unknown key or value is an error that names
    /// what the key takes, and changes nothing.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), String> {
        let Some((_, takes)) = Request::KEYS.iter().find(|(k, _)| *k == key) else {
            return Err(format!("unknown setting `{key}`"));
        };
        let bad = || format!("`{value}` for {key}: it takes {takes}");
        let switch = || match value {
            "on" => Ok(Some(true)),
            "off" => Ok(Some(false)),
            _ => Err(bad()),
        };
        match key {
            "kernels" => self.set = Some(KernelSet::from_name(value).ok_or_else(bad)?),
            "bf16-products" => self.bf16_products = switch()?,
            "amx" => self.amx = switch()?,
            "winograd" => self.winograd = switch()?,
            _ => {
                self.int8_activation_bits = match value {
                    "7" => Some(7),
                    "8" => Some(8),
                    _ => return Err(bad()),
                }
            }
        }
        Ok(())
    }
}

/// What the kernels run with: one instruction set and the choices within it. Only
/// [`Config::new`] (and [`Config::detect`]) make one, and only with what [`Cpu::detect`]
/// found, so a `Config` never names a feature the CPU lacks: that is what makes running the
/// instances it names sound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Config {
    set: KernelSet,
    bf16_products_pay: bool,
    amx_tiles: bool,
    winograd: bool,
    int8_activation_bits: u32,
    narrow_vectors_on_padding: bool,
}

impl Config {
    /// The kernels for `cpu` as `request` asks.
    pub fn new(cpu: &Cpu, request: &Request) -> Config {
        let set = match request.set {
            Some(set) => KernelSet::ALL[set.rank().max(cpu.best.rank())],
            None => cpu.best,
        };
        // Below AVX-512 the order is not a chain: a CPU with AVX-512 may lack AVX-VNNI (AMD
        // Zen 4), so a request for `avx2vnni` there gives `avx2`.
        let set = if set == KernelSet::Avx2Vnni && !cpu.avx2_vnni {
            KernelSet::Avx2
        } else {
            set
        };
        Config {
            set,
            bf16_products_pay: bf16_decision(cpu.vendor(), request.bf16_products),
            amx_tiles: set.has_bf16_products() && cpu.amx && request.amx != Some(false),
            winograd: request.winograd != Some(false),
            int8_activation_bits: int8_bits_decision(set, request.int8_activation_bits),
            narrow_vectors_on_padding: cpu.zen4,
        }
    }

    /// The default kernels of this CPU.
    pub fn detect() -> Config {
        Config::new(&Cpu::detect(), &Request::default())
    }

    /// The instruction set.
    pub fn set(&self) -> KernelSet {
        self.set
    }

    /// Whether bf16 products beat f32 FMAs on this CPU, where it has both. One `vdpbf16ps`
    /// does twice the multiply-adds of an f32 FMA, which pays on AMD Zen 4 (measured: an f16
    /// file 1.66x faster than f32, da3-small, 2 threads). On Intel's AVX512_BF16 Xeons it
    /// issues at half the FMA rate (one port instead of two), so the products gain nothing and
    /// the rounding of activations costs time: on the H200 host's Xeon (Sapphire Rapids class,
    /// 2 pinned cores) the f16 file took 586 ms against 401 ms for f32 (da3-small), attention
    /// and convolutions 1.5-1.7x slower. So: AMD yes, others no, unless requested.
    pub fn bf16_products_pay(&self) -> bool {
        self.bf16_products_pay
    }

    /// Whether the vector kernels (attention, convolutions, linear layers without AMX)
    /// multiply in bf16 when asked to: the set has bf16 products and they pay.
    pub fn vector_bf16(&self) -> bool {
        self.set.has_bf16_products() && self.bf16_products_pay
    }

    /// Whether bf16 products run on AMX tiles (Intel Xeons since Sapphire Rapids): linear
    /// layers, attention and the convolutions that [`amx_convolution_fits`].
    pub fn amx_tiles(&self) -> bool {
        self.amx_tiles
    }

    /// Whether linear layers of half-precision weights multiply in bf16 (panels packed by
    /// [`crate::pack_panels_bf16`]): vector bf16 products that pay, or AMX tiles.
    pub fn linear_bf16(&self) -> bool {
        self.vector_bf16() || self.amx_tiles
    }

    /// Whether 3x3 f32 convolutions run by Winograd's F(4x4, 3x3) where it pays (a quarter of
    /// the direct kernel's multiply-adds) rather than the direct kernel.
    pub fn winograd(&self) -> bool {
        self.winograd
    }

    /// How many bits the int8 products quantise their activations to: 8, as ggml does (the
    /// sums then equal ggml's `vec_dot_q8_0_q8_0`), except in the AVX2 set (AVX2 without
    /// VNNI), where it is 7 unless 8 is requested: without VNNI the exact route is held back
    /// by the instructions around its products, and 7-bit activations make the int8 layers
    /// 1.3-1.45x faster for a little more rounding (da3-small and da3-base q8_0 files on the
    /// AVX2 kernels, depth correlation with the f32 file 0.99967 and 0.99986 against 0.99989
    /// and 0.99996 with 8 bits). oneDNN and ONNX Runtime's `reduce_range` narrow int8 operands
    /// to 7 bits on such CPUs for the same reason.
    pub fn int8_activation_bits(&self) -> u32 {
        self.int8_activation_bits
    }

    /// Whether the CPU runs 512-bit vectors as two halves (AMD Zen 4), so that the AVX2
    /// instance is as fast per lane and pads a narrow map's rows less.
    pub(crate) fn narrow_vectors_on_padding(&self) -> bool {
        self.narrow_vectors_on_padding
    }
}

/// Whether a convolution kernel [KW, KH, IC, OC] runs on AMX tiles where a [`Config`] has
/// them: its input channels must fill whole tiles of pairs (a multiple of 32), and its output
/// channels a good part of a 32-row block (16 or more).
pub fn amx_convolution_fits([_, _, ic, oc]: [usize; 4]) -> bool {
    ic.is_multiple_of(32) && ic > 0 && oc >= 16
}

/// [`Config::bf16_products_pay`] from the CPU vendor string and the request.
fn bf16_decision(vendor: Option<&str>, requested: Option<bool>) -> bool {
    requested.unwrap_or(vendor == Some("AuthenticAMD"))
}

/// [`Config::int8_activation_bits`] from the kernel set and the request.
fn int8_bits_decision(set: KernelSet, requested: Option<u32>) -> u32 {
    match (set, requested) {
        (KernelSet::Avx2, Some(8)) => 8,
        (KernelSet::Avx2, _) => 7,
        _ => 8,
    }
}

/// The best set this CPU runs.
fn detect_best() -> KernelSet {
    #[cfg(target_arch = "x86_64")]
    {
        // The AVX-512 instance is compiled with AVX2, FMA and F16C too, and a request for a
        // lower set runs the AVX2 one: every such CPU has them, but a VM may mask features
        // one by one.
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return KernelSet::Avx512Bf16;
        }
        if avx2_vnni_detected() {
            return KernelSet::Avx2Vnni;
        }
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return KernelSet::Avx2;
        }
    }
    KernelSet::Portable
}

/// Whether the CPU runs the AVX2 set with AVX-VNNI.
fn avx2_vnni_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CPU family (with the extended family for base family 0xf).
#[cfg(target_arch = "x86_64")]
fn cpu_family() -> u32 {
    // SAFETY: CPUID leaf 1 exists on every x86-64 CPU and only reads registers.
    #[allow(unused_unsafe)]
    let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
    let base = (eax >> 8) & 0xf;
    if base == 0xf {
        base + ((eax >> 20) & 0xff)
    } else {
        base
    }
}

/// The CPUID vendor string ("AuthenticAMD", "GenuineIntel", ...).
fn cpu_vendor() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads registers.
        #[allow(unused_unsafe)]
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let bytes: Vec<u8> = [r.ebx, r.edx, r.ecx]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_products_only_where_they_pay_unless_asked() {
        assert!(bf16_decision(Some("AuthenticAMD"), None));
        assert!(!bf16_decision(Some("GenuineIntel"), None));
        assert!(!bf16_decision(None, None));
        assert!(bf16_decision(Some("GenuineIntel"), Some(true)));
        assert!(!bf16_decision(Some("AuthenticAMD"), Some(false)));
    }

    #[test]
    fn seven_bit_activations_only_in_the_avx2_set_unless_asked() {
        assert_eq!(int8_bits_decision(KernelSet::Avx2, None), 7);
        assert_eq!(int8_bits_decision(KernelSet::Avx2, Some(8)), 8);
        assert_eq!(int8_bits_decision(KernelSet::Avx2, Some(7)), 7);
        for set in [
            KernelSet::Avx512Bf16,
            KernelSet::Avx2Vnni,
            KernelSet::Portable,
        ] {
            assert_eq!(int8_bits_decision(set, None), 8);
            assert_eq!(int8_bits_decision(set, Some(7)), 8);
        }
    }

    #[test]
    fn requests_only_go_down_from_what_the_cpu_runs() {
        let cpu = Cpu::detect();
        for set in KernelSet::ALL {
            let config = Config::new(
                &cpu,
                &Request {
                    set: Some(set),
                    ..Request::default()
                },
            );
            assert!(cpu.runs(config.set()), "{set} gave {}", config.set());
            assert!(config.set().rank() >= set.rank().min(cpu.best().rank()));
            if cpu.runs(set) {
                assert_eq!(config.set(), set);
            }
        }
        let portable = Request {
            set: Some(KernelSet::Portable),
            ..Request::default()
        };
        let config = Config::new(&cpu, &portable);
        assert!(!config.amx_tiles() && !config.vector_bf16() && !config.linear_bf16());
        let no_amx = Request {
            amx: Some(false),
            ..Request::default()
        };
        assert!(!Config::new(&cpu, &no_amx).amx_tiles());
    }

    #[test]
    fn requests_are_set_by_key_and_refused_with_what_they_take() {
        let mut request = Request::default();
        for (key, value) in [
            ("kernels", "avx2"),
            ("bf16-products", "off"),
            ("amx", "off"),
            ("winograd", "off"),
            ("int8-activation-bits", "8"),
        ] {
            request.set(key, value).unwrap();
        }
        let expected = Request {
            set: Some(KernelSet::Avx2),
            bf16_products: Some(false),
            amx: Some(false),
            winograd: Some(false),
            int8_activation_bits: Some(8),
        };
        assert_eq!(request, expected);
        let e = request.set("winograd", "maybe").unwrap_err();
        assert!(e.contains("winograd") && e.contains("on or off"), "{e}");
        let e = request.set("kernels", "avx9000").unwrap_err();
        assert!(e.contains("avx512bf16"), "{e}");
        assert!(request.set("speed", "max").is_err());
        assert_eq!(request, expected, "a refused value changes nothing");
    }

    #[test]
    fn set_names_round_trip() {
        for set in KernelSet::ALL {
            assert_eq!(KernelSet::from_name(set.name()), Some(set));
        }
        assert_eq!(KernelSet::from_name("avx9000"), None);
    }
}
