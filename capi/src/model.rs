//! Loading a model: `da3_model_load`, `da3_model_free`.

use crate::{
    borrow, check_out, file_path, free_handle, guard, utf8, write_out, Da3Status, Failure,
};
use std::ffi::{c_char, CString};

/// A loaded model: the weights, frozen on one device. Opaque.
///
/// Thread safety: a model may be shared by every thread; the functions that take a
/// `const da3_model*` may run on any thread at the same time.
pub struct Da3Model {
    pub(crate) model: da3::Model,
    /// What `da3_model_device` hands out, living as long as the model.
    device_name: CString,
}

/// How to load a model. Start from `da3_load_options_default()`; a zeroed struct also means
/// the defaults.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Da3LoadOptions {
    /// Where to compute: `"auto"` (a GPU when the library was built with one, else the CPU),
    /// `"cpu"`, a ggml device name such as `"CUDA0"`, `"MTL0"` or `"Vulkan0"`, or
    /// `"rpc:HOST:PORT"`. NULL means `"auto"`. Read during `da3_model_load` only.
    pub device: *const c_char,
    /// CPU threads of each session; 0: one per physical core. Several sessions computing at
    /// once each use this many: give each `cores / sessions` to share the CPU.
    pub threads: usize,
    /// Size images are processed at when a run does not say (sides become multiples of the
    /// patch size 14); 0: the model's official default (DA3: the longest side to 504; DA2:
    /// the shortest side to at least 518).
    pub process_res: usize,
    /// Load the camera encoder, which only runs with known camera poses
    /// (`da3_run_options.extrinsics`) use; off: smaller and faster to load.
    pub camera_encoder: bool,
    /// Load the 3D Gaussian head (DA3-GIANT's), which only runs with
    /// `da3_run_options.gaussians` use.
    pub gaussians: bool,
}

/// The default load options: device `"auto"`, a thread per core, process resolution 504, no
/// camera encoder, no Gaussian head.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn da3_load_options_default() -> Da3LoadOptions {
    Da3LoadOptions {
        device: std::ptr::null(),
        threads: 0,
        process_res: 0,
        camera_encoder: false,
        gaussians: false,
    }
}

/// Loads the GGUF model at `path` with `options` (NULL: the defaults) into `*model`, which
/// the caller frees with `da3_model_free`. On failure `*model` is NULL.
///
/// Statuses: `DA3_STATUS_IO` (the file cannot be read), `DA3_STATUS_MODEL` (not a usable
/// model), `DA3_STATUS_DEVICE` (an unknown or failing device), `DA3_STATUS_INVALID_ARGUMENT`.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `path` and `options->device` must be NULL or NUL-terminated strings; `options` NULL or a
/// valid `da3_load_options`; `model` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_model_load(
    path: *const c_char,
    options: *const Da3LoadOptions,
    model: *mut *mut Da3Model,
) -> Da3Status {
    guard(|| {
        check_out(model, "model")?;
        // SAFETY: checked non-null; the caller guarantees it is valid for a write.
        unsafe { write_out(model, std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        let options = match options.is_null() {
            true => da3_load_options_default(),
            // SAFETY: non-null, and the caller guarantees it points to load options.
            false => *unsafe { borrow(options, "options") }?,
        };
        let device = match options.device.is_null() {
            true => da3::Device::Auto,
            // SAFETY: the caller guarantees a NUL-terminated string.
            false => unsafe { utf8(options.device, "options.device") }?
                .parse()
                .map_err(|error: da3::ggml::Error| {
                    Failure::new(Da3Status::Device, error.to_string())
                })?,
        };
        let load = da3::LoadOptions {
            device,
            threads: options.threads,
            process_res: Some(options.process_res).filter(|&res| res != 0),
            camera_encoder: options.camera_encoder,
            gaussians: options.gaussians,
            ..da3::LoadOptions::default()
        };
        let loaded = da3::Model::load(&file, &load)?;
        let device_name = CString::new(loaded.device().name()).unwrap_or_default();
        let handle = Box::into_raw(Box::new(Da3Model {
            model: loaded,
            device_name,
        }));
        // SAFETY: checked non-null above; valid for a write.
        unsafe { write_out(model, handle) };
        Ok(())
    })
}

/// Frees a model; NULL is a no-op. Sessions made from it keep the weights alive until they
/// are freed too.
///
/// Thread safety: any thread, once no other call is using this model.
///
/// # Safety
/// `model` must be NULL or a model from `da3_model_load` not yet freed.
#[no_mangle]
pub unsafe extern "C" fn da3_model_free(model: *mut Da3Model) {
    // SAFETY: the caller guarantees a live model from `da3_model_load` or NULL.
    unsafe { free_handle(model) }
}

/// The name of the device the model computes on (`"CPU"`, `"CUDA0"`, ...) into `*name`, a
/// string that lives as long as the model.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `model` must be NULL or a live model; `name` NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_model_device(
    model: *const Da3Model,
    name: *mut *const c_char,
) -> Da3Status {
    guard(|| {
        check_out(name, "name")?;
        // SAFETY: the caller guarantees a live model or NULL.
        let model = unsafe { borrow(model, "model") }?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(name, model.device_name.as_ptr()) };
        Ok(())
    })
}
