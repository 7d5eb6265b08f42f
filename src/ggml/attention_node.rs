//! Which fused-attention nodes our CUDA attention takes, and their layout: a decision on
//! ggml's node alone (no device needed), so it is tested on every machine.

use super::tensor::{TensorRef, TensorView};
use super::DType;

/// A `FLASH_ATTN_EXT` node that our CUDA attention computes: `softmax(q kᵀ · scale) v` per
/// head, f32 operands `[d, t, heads, batch]` with rows of `d` contiguous, into the node's
/// contiguous f32 `[d, heads, tq, batch]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedAttention {
    /// Head size.
    pub d: i64,
    /// Queries per head and batch.
    pub tq: i64,
    /// Keys (and values) per head and batch.
    pub tkv: i64,
    /// Heads (the same for q, k and v: no grouped heads).
    pub heads: i64,
    /// Batches (a scene's views in its local blocks; 1 in a global block).
    pub batch: i64,
    /// Strides of q, k and v in elements, for `t`, heads and batch.
    pub strides: [[i64; 3]; 3],
    /// The softmax scale.
    pub scale: f32,
}

/// Head sizes the cuDNN fused attention takes: multiples of 8 up to 256.
fn head_size_fits(d: i64) -> bool {
    d > 0 && d % 8 == 0 && d <= 256
}

/// `node` as our CUDA attention takes it, or `None` where ggml's kernel must run it: another
/// op, a mask or sinks, a bias slope or soft cap, grouped heads, a head size cuDNN does not
/// take, other types, rows that are not contiguous or strides that break 16-byte rows.
pub fn fused_attention(node: &TensorRef<'_>) -> Option<FusedAttention> {
    if node.op_name() != "FLASH_ATTN_EXT" || node.dtype() != DType::F32 || !node.is_contiguous() {
        return None;
    }
    let slots = node.sources_with_slots();
    if slots.iter().map(|(slot, _)| *slot).ne([0, 1, 2]) {
        return None; // a mask or sinks
    }
    let [q, k, v] = [0, 1, 2].map(|i| slots[i].1);
    let (qn, kn, vn) = (q.ne(), k.ne(), v.ne());
    let rows_fit = [q, k, v]
        .iter()
        .all(|t| t.dtype() == DType::F32 && t.nb()[0] == 4);
    let shapes_fit = head_size_fits(qn[0])
        && kn[0] == qn[0]
        && vn[0] == qn[0]
        && vn[1] == kn[1]
        && [kn[2], vn[2]] == [qn[2]; 2]
        && [kn[3], vn[3]] == [qn[3]; 2];
    if !rows_fit || !shapes_fit {
        return None;
    }
    // Rows start on 16 bytes: views start there in their tensors (which ggml's allocators
    // align to more), and element strides are multiples of 4.
    // SAFETY: reads each operand's own struct.
    if [q, k, v]
        .iter()
        .any(|t| unsafe { (*t.raw().as_ptr()).view_offs } % 16 != 0)
    {
        return None;
    }
    let strides = |t: &TensorRef<'_>| -> Option<[i64; 3]> {
        let nb = t.nb();
        let mut out = [0; 3];
        for (o, b) in out.iter_mut().zip(&nb[1..]) {
            if b % 16 != 0 {
                return None;
            }
            *o = *b as i64 / 4;
        }
        Some(out)
    };
    // SAFETY: a FLASH_ATTN_EXT node's op params are (scale, max_bias, logit_softcap) as f32
    // bit patterns (ggml_flash_attn_ext); this reads the node's own struct.
    let params = unsafe { (*node.raw().as_ptr()).op_params };
    let [scale, max_bias, softcap] = [0, 1, 2].map(|i| f32::from_bits(params[i] as u32));
    if max_bias != 0.0 || softcap != 0.0 {
        return None;
    }
    Some(FusedAttention {
        d: qn[0],
        tq: qn[1],
        tkv: kn[1],
        heads: qn[2],
        batch: qn[3],
        strides: [strides(&q)?, strides(&k)?, strides(&v)?],
        scale,
    })
}
