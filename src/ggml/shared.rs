//! Weights shared across threads: a context frozen after loading.
//!
//! A [`Context`] is single-threaded (`!Send`, `!Sync`): building a graph mutates ggml's
//! arena, and tensor handles share it through `Rc`. Model weights, though, are written once
//! and then only read, so many graphs on many threads may use them at the same time. A
//! [`SharedContext`] is such a context after [`Context::freeze`]:
//! - every tensor is a named leaf (no op, no view) whose data lives in a backend buffer the
//!   frozen context owns;
//! - nothing can create tensors in it, and through this crate nothing can rename, flag or
//!   write its tensors any more: [`Context::import`] hands out handles for graph building whose
//!   name and flag setters leave a shared tensor untouched, and every data write is refused
//!   for tensors whose memory (directly or through a view) is a frozen buffer;
//! - ggml itself only reads such leaves while building, allocating and computing graphs
//!   (checked against ggml 0.26.0: `ggml_visit_parents` names only unnamed leaves, gallocr and
//!   the scheduler initialise only tensors without data, and the scheduler's rewiring and flag
//!   setting touch graph nodes and its own input copies, never leaves of other contexts).
//!
//! So a `SharedContext` is `Send + Sync` and cheap to clone (an `Arc`).

use super::context::{Context, ContextInner};
use super::error::{Error, Result};
use super::tensor::{Tensor, TensorView};
use ggml_sys as sys;
use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// The buffers of every live frozen context, by address: data in them must not change.
static FROZEN_BUFFERS: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn frozen_buffers() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    // A panic while holding this lock cannot leave the set inconsistent (single inserts and
    // removes), so a poisoned lock is still usable.
    FROZEN_BUFFERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `buffer` belongs to a live frozen context.
pub(crate) fn is_frozen_buffer(buffer: *mut sys::ggml_backend_buffer) -> bool {
    !buffer.is_null()
        && frozen_buffers()
            .as_ref()
            .is_some_and(|set| set.contains(&(buffer as usize)))
}

/// Whether `tensor`'s data is shared weight memory: the tensor, or the tensor it is a view
/// of, lives in a frozen context's buffer.
pub(crate) fn holds_frozen_data(tensor: &impl TensorView) -> bool {
    let mut raw = tensor.raw().as_ptr();
    // SAFETY: live tensors: the handle keeps its context alive, and a view's source outlives
    // the view. Only pointer fields are read.
    unsafe {
        while !(*raw).view_src.is_null() {
            raw = (*raw).view_src;
        }
        is_frozen_buffer((*raw).buffer)
    }
}

/// Whether `tensor` itself is a tensor of a frozen context (a shared weight, not a view).
pub(crate) fn is_frozen_leaf(raw: NonNull<sys::ggml_tensor>) -> bool {
    // SAFETY: a live tensor (see `holds_frozen_data`); only pointer fields are read.
    unsafe {
        let t = raw.as_ptr();
        (*t).view_src.is_null() && is_frozen_buffer((*t).buffer)
    }
}

struct Frozen {
    /// The ggml context; never handed out as a mutable [`Context`] again.
    inner: ContextInner,
    /// Addresses of the buffers registered in [`FROZEN_BUFFERS`].
    buffers: Vec<usize>,
    bytes: usize,
}

// SAFETY: after freezing, nothing mutates the ggml context or its tensors (see the module
// documentation): lookups by name only read ggml's object list, graph operations only read
// the leaves, and the interior-mutable fields of `ContextInner` (buffer list, keep-alive list,
// custom nodes' data) are never reached through a `Frozen`. The buffers are device memory freed once,
// by the last owner, from whichever thread drops it; ggml's buffer free functions (CPU free,
// cudaFree after selecting the device, an RPC FREE_BUFFER message through the endpoint's
// dispatcher queue) do not depend on the thread they run on.
unsafe impl Send for Frozen {}
// SAFETY: see `Send`: shared references only read.
unsafe impl Sync for Frozen {}

impl Drop for Frozen {
    fn drop(&mut self) {
        if let Some(set) = frozen_buffers().as_mut() {
            for b in &self.buffers {
                set.remove(b);
            }
        }
        // `inner` drops next: its buffers, then the ggml context.
    }
}

/// A frozen, read-only context of weights, shared across threads (see the module docs).
#[derive(Clone)]
pub struct SharedContext {
    frozen: Arc<Frozen>,
}

impl SharedContext {
    /// Names of the tensors, in creation order.
    pub fn tensor_names(&self) -> Vec<String> {
        self.raw_tensors()
            .into_iter()
            .map(|raw| super::tensor::TensorRef::new(raw).name())
            .collect()
    }

    /// Bytes of buffer memory the weights occupy.
    pub fn bytes(&self) -> usize {
        self.frozen.bytes
    }

    fn raw_tensors(&self) -> Vec<NonNull<sys::ggml_tensor>> {
        let ctx = self.frozen.inner.raw();
        let mut out = Vec::new();
        // SAFETY: iterating a live context's object list, which nothing mutates any more.
        let mut cur = unsafe { sys::ggml_get_first_tensor(ctx) };
        while let Some(raw) = NonNull::new(cur) {
            out.push(raw);
            // SAFETY: as above.
            cur = unsafe { sys::ggml_get_next_tensor(ctx, cur) };
        }
        out
    }

    fn find(&self, name: &str) -> Option<NonNull<sys::ggml_tensor>> {
        let c_name = std::ffi::CString::new(name).ok()?;
        // SAFETY: live context that nothing mutates; NUL-terminated name; NULL when absent.
        NonNull::new(unsafe { sys::ggml_get_tensor(self.frozen.inner.raw(), c_name.as_ptr()) })
    }

    fn ptr_eq(&self, other: &Arc<Frozen>) -> bool {
        Arc::ptr_eq(&self.frozen, other)
    }
}

impl std::fmt::Debug for SharedContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedContext")
            .field("bytes", &self.frozen.bytes)
            .finish_non_exhaustive()
    }
}

/// Keep-alive list of the frozen contexts a graph context imported tensors from.
#[derive(Default)]
pub(crate) struct Imports(std::cell::RefCell<Vec<Arc<Frozen>>>);

impl Context {
    /// Freezes a context of loaded weights so that graphs on any thread can share them.
    ///
    /// Fails, leaving nothing frozen, when a handle to the context or to one of its tensors
    /// is still alive (drop them first), or when a tensor is not a leaf with data in one of
    /// the context's buffers. Unnamed tensors are named `shared.N` (ggml would otherwise name
    /// them while building graphs).
    pub fn freeze(self) -> Result<SharedContext> {
        let refuse = |reason: String| Error::InvalidArgument {
            op: "freeze",
            reason,
        };
        for (i, t) in self.tensors().iter().enumerate() {
            let owned_buffer = t
                .buffer()
                .is_some_and(|b| self.inner().owns_buffer(b.as_ptr()));
            if !t.is_leaf_op() || t.view_source().is_some() || !owned_buffer {
                return Err(refuse(format!(
                    "tensor {i} (`{}`) is not a leaf with data in the context's own buffer",
                    t.name()
                )));
            }
            if t.name().is_empty() {
                t.set_name(&format!("shared.{i}"));
            }
        }
        if !self.inner().kept_alive().is_empty() {
            return Err(refuse("the context uses operands of other contexts".into()));
        }
        let inner = std::rc::Rc::try_unwrap(self.into_inner())
            .map_err(|_| refuse("handles to the context or its tensors are still alive".into()))?;
        let buffers: Vec<usize> = inner.buffer_addresses();
        let bytes = inner.buffer_bytes();
        frozen_buffers()
            .get_or_insert_with(HashSet::new)
            .extend(buffers.iter().copied());
        Ok(SharedContext {
            frozen: Arc::new(Frozen {
                inner,
                buffers,
                bytes,
            }),
        })
    }

    /// A handle to the shared tensor `name` for building graphs in this context; `None` when
    /// the shared context has no such tensor. This context keeps the shared one alive.
    ///
    /// The handle is an operand like any other; its name and flags cannot be changed (the
    /// setters leave it as it is) and its data cannot be written.
    pub fn import(&self, shared: &SharedContext, name: &str) -> Option<Tensor> {
        let raw = shared.find(name)?;
        let imports = &self.inner().imports().0;
        if !imports.borrow().iter().any(|f| shared.ptr_eq(f)) {
            imports.borrow_mut().push(shared.frozen.clone());
        }
        Some(Tensor::from_raw(raw, self.inner().clone()))
    }
}

impl ContextInner {
    fn buffer_addresses(&self) -> Vec<usize> {
        self.with_buffers(|b| b.iter().map(|b| b.as_ptr() as usize).collect())
    }
    fn buffer_bytes(&self) -> usize {
        self.with_buffers(|b| {
            b.iter()
                .map(|b| super::buffer::BufferRef::new(NonNull::new(b.as_ptr()).unwrap()).size())
                .sum()
        })
    }
}
