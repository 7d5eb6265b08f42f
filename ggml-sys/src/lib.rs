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

/// The instruction-set variants of ggml's CPU backend in this build, comma-separated:
/// "x86_64,haswell,zen4" when the `cc` build dispatches at load time (see
/// [`cpu_variant`]), "target" for one compiled for the Rust target's features,
/// "unknown" for CMake or prebuilt libraries.
pub const CPU_VARIANTS: &str = match option_env!("GGML_SYS_CPU_BUILT_VARIANTS") {
    Some(v) => v,
    None => "unknown",
};

#[cfg(ggml_sys_cpu_dispatch)]
extern "C" {
    /// The name of the CPU backend variant the running CPU got (one of [`CPU_VARIANTS`]): a
    /// static NUL-terminated string.
    pub fn ggml_sys_cpu_variant() -> *const ::std::os::raw::c_char;
}

/// The CPU backend variant in use where this build dispatches between several, else `None`.
pub fn cpu_variant() -> Option<&'static str> {
    #[cfg(ggml_sys_cpu_dispatch)]
    {
        // SAFETY: the generated dispatch code returns a pointer to a static string literal.
        let name = unsafe { ::std::ffi::CStr::from_ptr(ggml_sys_cpu_variant()) };
        name.to_str().ok()
    }
    #[cfg(not(ggml_sys_cpu_dispatch))]
    {
        None
    }
}

/// Fingerprint of the headers this build saw ("unknown" for a prebuilt library without
/// `GGML_INCLUDE_DIR`). Equal to [`BINDINGS_HEADERS_FINGERPRINT`] when the bindings fit.
pub const BUILD_HEADERS_FINGERPRINT: &str = env!("GGML_SYS_HEADERS_FINGERPRINT");
