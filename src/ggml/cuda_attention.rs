//! ggml's fused-attention nodes computed by cuDNN through `da3-cuda`, on the CUDA backend's
//! memory: the [`NodeKernel`] the execution plan installs where ggml-cuda's own attention is
//! the slow part of a scene.

use super::attention_node::{fused_attention, FusedAttention};
use super::error::{Error, Result};
use super::node_kernel::NodeKernel;
use super::tensor::{TensorRef, TensorView};
use da3_cuda::{Attention, AttentionShape, Operand};
use std::cell::RefCell;

/// cuDNN's fused attention for `FLASH_ATTN_EXT` nodes without a mask, bias slope or soft cap,
/// on f32 operands whose rows are contiguous (ggml-cuda's own layout for DA3's attention).
pub struct CudaAttention {
    attention: RefCell<Attention>,
    device: u32,
}

impl CudaAttention {
    /// Loads cuDNN (`library`, default `libcudnn.so.9` on the loader's path) for CUDA device
    /// `device`.
    pub fn new(device: u32, library: Option<&str>) -> Result<CudaAttention> {
        let attention = Attention::new(device, library).map_err(|e| Error::NodeKernel {
            kernel: format!("da3-cuda attention on CUDA{device}"),
            node: "(none yet)".into(),
            reason: e.to_string(),
        })?;
        Ok(CudaAttention {
            attention: RefCell::new(attention),
            device,
        })
    }

    /// The loaded cuDNN's version as `major.minor.patch`.
    pub fn cudnn_version(&self) -> String {
        let v = self.attention.borrow().cudnn_version();
        format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100)
    }
}

impl NodeKernel for CudaAttention {
    fn name(&self) -> String {
        format!("da3-cuda attention (cuDNN) on CUDA{}", self.device)
    }

    fn takes(&self, node: &TensorRef<'_>) -> bool {
        fused_attention(node).is_some()
    }

    fn compute(&self, node: &TensorRef<'_>) -> Result<()> {
        let failed = |reason: String| Error::NodeKernel {
            kernel: self.name(),
            node: node.name(),
            reason,
        };
        let FusedAttention {
            d,
            tq,
            tkv,
            heads,
            batch,
            strides,
            scale,
        } = fused_attention(node).ok_or_else(|| failed("not an attention it takes".into()))?;
        let data = |t: &TensorRef<'_>| {
            // SAFETY: reads the tensor struct's data field (NULL before allocation).
            unsafe { (*t.raw().as_ptr()).data }
        };
        let sources = node.sources();
        let [q, k, v] = [0, 1, 2].map(|i| Operand {
            data: data(&sources[i]) as *const f32,
            strides: strides[i],
        });
        let out = data(node) as *mut f32;
        if [q.data, k.data, v.data].iter().any(|p| p.is_null()) || out.is_null() {
            return Err(failed("the node or an operand has no memory".into()));
        }
        let shape = AttentionShape {
            d,
            tq,
            tkv,
            h: heads,
            b: batch,
        };
        // SAFETY: the residency planner checked before this run that the node and each
        // operand live in this CUDA device's memory (`Executor`); shapes and strides are the
        // tensors' own, so every address the kernel forms lies inside them; the backend's
        // stream has finished (each segment's compute waits), and nothing else writes them.
        unsafe {
            self.attention
                .borrow_mut()
                .run(shape, q, k, v, out, scale)
                .map_err(|e| failed(e.to_string()))
        }
    }
}
