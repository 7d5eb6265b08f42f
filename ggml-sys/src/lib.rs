//! Raw FFI bindings to ggml 0.26.0: the core, the allocator, the backend API with its
//! registry, the CPU and RPC backends, and GGUF.
//!
//! Everything here is `unsafe` and unchecked: ggml aborts the process on most precondition
//! failures. Use the safe layer of the `da3` crate (`da3::ggml`) unless you need the raw API.
//!
//! How ggml is obtained (pinned registry package, `GGML_SOURCE_DIR`, `GGML_LIB_DIR`) and which
//! backends are built is described in the crate's build script.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
#![allow(clippy::all)]

#[cfg(not(feature = "bindgen"))]
include!("bindings.rs");
#[cfg(feature = "bindgen")]
include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The ggml version of the source this crate was built from ("0.26.0"), or "unknown" when
/// linked against a prebuilt library.
pub const GGML_SOURCE_VERSION: &str = match option_env!("GGML_SYS_SOURCE_VERSION") {
    Some(v) => v,
    None => "unknown",
};

/// Fingerprint of the headers this build saw ("unknown" for a prebuilt library without
/// `GGML_INCLUDE_DIR`). Equal to [`BINDINGS_HEADERS_FINGERPRINT`] when the bindings fit.
pub const BUILD_HEADERS_FINGERPRINT: &str = env!("GGML_SYS_HEADERS_FINGERPRINT");
