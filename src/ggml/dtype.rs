//! ggml tensor element types (`enum ggml_type`) and their storage layout.
//!
//! The table mirrors `ggml.h` and the `type_traits` table in `ggml.c` of the
//! pinned ggml (0.26, vendored by `llama-cpp-sys-2` 0.1.161). Block sizes and
//! byte sizes come from the `block_*` structs in `ggml-common.h`.
//!
//! Ids that ggml has removed are deliberately absent, so [`DType::from_id`]
//! rejects them just as ggml's GGUF loader does:
//! 4 and 5 (`Q4_2`, `Q4_3`), 31..=33 (`Q4_0_4_4`, `Q4_0_4_8`, `Q4_0_8_8`) and
//! 36..=38 (`IQ4_NL_4_4`, `IQ4_NL_4_8`, `IQ4_NL_8_8`). Ids 43 and above do not
//! exist yet.

use std::fmt;

macro_rules! dtypes {
    ($(
        $(#[$doc:meta])*
        $variant:ident = $id:literal, $name:literal, $block:literal, $size:literal, $quant:literal;
    )*) => {
        /// A ggml tensor element type, with the same numeric id as ggml's `enum ggml_type`.
        ///
        /// Variant names follow ggml's spelling (`Q4_K`, `IQ2_XXS`, ...) rather than
        /// Rust's camel case, so they can be matched against ggml documentation directly.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DType {
            $($(#[$doc])* $variant = $id,)*
        }

        impl DType {
            /// Every type known to this build, in ascending id order.
            pub const ALL: &'static [DType] = &[$(DType::$variant,)*];

            /// Looks up a type by its ggml id; `None` for unknown or removed ids.
            pub fn from_id(id: u32) -> Option<DType> {
                match id {
                    $($id => Some(DType::$variant),)*
                    _ => None,
                }
            }

            /// Looks up a type by its ggml name (`"f32"`, `"q4_K"`, ...); case-sensitive.
            pub fn from_name(name: &str) -> Option<DType> {
                match name {
                    $($name => Some(DType::$variant),)*
                    _ => None,
                }
            }

            /// The ggml type id (the value stored in GGUF tensor infos).
            pub fn id(self) -> u32 {
                self as u32
            }

            /// ggml's name for the type, as returned by `ggml_type_name`.
            pub fn name(self) -> &'static str {
                match self {
                    $(DType::$variant => $name,)*
                }
            }

            /// Number of elements per block (`ggml_blck_size`); 1 for plain types.
            pub fn block_size(self) -> usize {
                match self {
                    $(DType::$variant => $block,)*
                }
            }

            /// Number of bytes per block (`ggml_type_size`).
            pub fn type_size(self) -> usize {
                match self {
                    $(DType::$variant => $size,)*
                }
            }

            /// Whether ggml treats the type as quantized (`ggml_is_quantized`).
            pub fn is_quantized(self) -> bool {
                match self {
                    $(DType::$variant => $quant,)*
                }
            }
        }
    };
}

dtypes! {
    /// 32-bit IEEE float.
    F32 = 0, "f32", 1, 4, false;
    /// 16-bit IEEE float.
    F16 = 1, "f16", 1, 2, false;
    /// 4-bit, 32-element blocks with an f16 scale.
    Q4_0 = 2, "q4_0", 32, 18, true;
    /// 4-bit, 32-element blocks with f16 scale and min.
    Q4_1 = 3, "q4_1", 32, 20, true;
    /// 5-bit, 32-element blocks with an f16 scale.
    Q5_0 = 6, "q5_0", 32, 22, true;
    /// 5-bit, 32-element blocks with f16 scale and min.
    Q5_1 = 7, "q5_1", 32, 24, true;
    /// 8-bit, 32-element blocks with an f16 scale.
    Q8_0 = 8, "q8_0", 32, 34, true;
    /// 8-bit, 32-element blocks with f16 scale and sum.
    Q8_1 = 9, "q8_1", 32, 36, true;
    /// 2-bit k-quant, 256-element super-blocks.
    Q2_K = 10, "q2_K", 256, 84, true;
    /// 3-bit k-quant, 256-element super-blocks.
    Q3_K = 11, "q3_K", 256, 110, true;
    /// 4-bit k-quant, 256-element super-blocks.
    Q4_K = 12, "q4_K", 256, 144, true;
    /// 5-bit k-quant, 256-element super-blocks.
    Q5_K = 13, "q5_K", 256, 176, true;
    /// 6-bit k-quant, 256-element super-blocks.
    Q6_K = 14, "q6_K", 256, 210, true;
    /// 8-bit k-quant (intermediate type for dot products).
    Q8_K = 15, "q8_K", 256, 292, true;
    /// 2.06 bpw i-quant.
    IQ2_XXS = 16, "iq2_xxs", 256, 66, true;
    /// 2.31 bpw i-quant.
    IQ2_XS = 17, "iq2_xs", 256, 74, true;
    /// 3.06 bpw i-quant.
    IQ3_XXS = 18, "iq3_xxs", 256, 98, true;
    /// 1.56 bpw i-quant.
    IQ1_S = 19, "iq1_s", 256, 50, true;
    /// 4-bit non-linear, 32-element blocks.
    IQ4_NL = 20, "iq4_nl", 32, 18, true;
    /// 3.44 bpw i-quant.
    IQ3_S = 21, "iq3_s", 256, 110, true;
    /// 2.5 bpw i-quant.
    IQ2_S = 22, "iq2_s", 256, 82, true;
    /// 4.25 bpw non-linear i-quant.
    IQ4_XS = 23, "iq4_xs", 256, 136, true;
    /// 8-bit signed integer.
    I8 = 24, "i8", 1, 1, false;
    /// 16-bit signed integer.
    I16 = 25, "i16", 1, 2, false;
    /// 32-bit signed integer.
    I32 = 26, "i32", 1, 4, false;
    /// 64-bit signed integer.
    I64 = 27, "i64", 1, 8, false;
    /// 64-bit IEEE float.
    F64 = 28, "f64", 1, 8, false;
    /// 1.75 bpw i-quant.
    IQ1_M = 29, "iq1_m", 256, 56, true;
    /// bfloat16.
    BF16 = 30, "bf16", 1, 2, false;
    /// Ternary, 1.69 bpw.
    TQ1_0 = 34, "tq1_0", 256, 54, true;
    /// Ternary, 2.06 bpw.
    TQ2_0 = 35, "tq2_0", 256, 66, true;
    /// Microscaling FP4, 32-element blocks with an E8M0 scale.
    MXFP4 = 39, "mxfp4", 32, 17, true;
    /// NVIDIA FP4, 64-element blocks with four E4M3 sub-block scales.
    NVFP4 = 40, "nvfp4", 64, 36, true;
    /// 1-bit, 128-element blocks with an f16 scale.
    Q1_0 = 41, "q1_0", 128, 18, true;
    /// 2-bit, 64-element blocks with an f16 scale.
    Q2_0 = 42, "q2_0", 64, 18, true;
}

impl DType {
    /// Bytes in one row of `ne0` elements (`ggml_row_size`).
    ///
    /// `None` if `ne0` is not a multiple of [`block_size`](Self::block_size)
    /// or the size overflows `u64`.
    pub fn row_size(self, ne0: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !ne0.is_multiple_of(block) {
            return None;
        }
        (ne0 / block).checked_mul(self.type_size() as u64)
    }

    /// Bytes of a contiguous tensor with shape `ne` (ggml order, `ne[0]` innermost).
    ///
    /// `None` if `ne[0]` is not a multiple of the block size or the size overflows `u64`.
    /// A zero in any dimension gives `Some(0)` (provided `ne[0]` is a block multiple).
    pub fn nbytes(self, ne: [u64; 4]) -> Option<u64> {
        let row = self.row_size(ne[0])?;
        if ne[1..].contains(&0) {
            return Some(0);
        }
        ne[1..].iter().try_fold(row, |acc, &n| acc.checked_mul(n))
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_rejected() {
        for &t in DType::ALL {
            assert_eq!(DType::from_id(t.id()), Some(t));
            assert_eq!(DType::from_name(t.name()), Some(t));
            assert_eq!(t.to_string(), t.name());
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, u32::MAX] {
            assert_eq!(DType::from_id(id), None, "id {id}");
        }
        assert_eq!(DType::ALL.len(), 43 - 2 - 3 - 3);
        assert!(DType::ALL.windows(2).all(|w| w[0].id() < w[1].id()));
    }

    #[test]
    fn layout_matches_ggml() {
        // (type, block size, bytes per block, quantized), checked against ggml-common.h
        let expect = [
            (DType::F32, 1, 4, false),
            (DType::F16, 1, 2, false),
            (DType::BF16, 1, 2, false),
            (DType::Q8_0, 32, 34, true),
            (DType::Q4_K, 256, 144, true),
            (DType::Q6_K, 256, 210, true),
            (DType::IQ4_NL, 32, 18, true),
            (DType::MXFP4, 32, 17, true),
            (DType::I32, 1, 4, false),
        ];
        for (t, block, size, quant) in expect {
            assert_eq!(
                (t.block_size(), t.type_size(), t.is_quantized()),
                (block, size, quant)
            );
        }
        assert_eq!(DType::Q4_K.name(), "q4_K");
        assert_eq!(DType::Q8_0.id(), 8);
        assert_eq!(DType::MXFP4.id(), 39);
    }

    #[test]
    fn sizes() {
        assert_eq!(DType::F32.row_size(10), Some(40));
        assert_eq!(DType::Q8_0.row_size(64), Some(68));
        assert_eq!(DType::Q8_0.row_size(33), None);
        assert_eq!(DType::Q4_K.nbytes([512, 3, 1, 1]), Some(2 * 144 * 3));
        assert_eq!(DType::F16.nbytes([7, 0, 5, 1]), Some(0));
        assert_eq!(DType::Q4_K.nbytes([100, 0, 1, 1]), None);
        assert_eq!(DType::F32.nbytes([u64::MAX, 1, 1, 1]), None);
        assert_eq!(DType::F32.nbytes([1 << 31, 1 << 31, 1, 1]), None);
        assert_eq!(DType::F32.nbytes([1 << 30, 1 << 30, 1, 1]), Some(1 << 62));
    }
}
