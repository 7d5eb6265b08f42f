//! Depth Anything 3 on ggml's kernels, from safe Rust.
//!
//! Layers, each depending only on the ones before it:
//! - [`ggml`]: a safe layer over ggml (the crate's only `unsafe` code);
//! - [`residency`]: the pass that checks where every graph operand lives before computing,
//!   and the one compute entry point built on it;
//! - [`da3`]: the Depth Anything 3 model: GGUF loading, preprocessing, graph, outputs.

// Only the safe layer may hold `unsafe` code; the compiler enforces it for the rest.
#[deny(unsafe_code)]
pub mod da3;
pub mod ggml;
#[deny(unsafe_code)]
pub mod residency;
