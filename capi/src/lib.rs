//! The C ABI of the `da3` library: Depth Anything 3 on ggml for C and C++ programs.
//!
//! Builds `libda3.so` and `libda3.a`; `include/da3.h` is generated from this crate by cbindgen
//! (the doc comments here are the header's comments). The handles are opaque:
//!
//! - `da3_model`: the weights, loaded once onto a device and shared by every thread;
//! - `da3_session`: one computation at a time, on the thread that created it;
//! - `da3_image`: an RGB image;
//! - `da3_output`: what a run returns: depth, confidence, camera pose per view, and the exports.
//!
//! Every fallible function returns a [`Da3Status`] and leaves a message for [`da3_last_error`]
//! on its thread. No function unwinds into C: a panic becomes [`Da3Status::Panic`]. A null
//! pointer where one is required is [`Da3Status::InvalidArgument`], never a crash.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod image;
pub mod model;
pub mod output;
pub mod session;

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// What every fallible function returns.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Da3Status {
    /// Success.
    Ok = 0,
    /// A null pointer where one is required, a value out of range, a string that is not
    /// UTF-8, or a request the model cannot take (names or poses not one per image, a bad
    /// camera pose, a process resolution out of range, ...).
    InvalidArgument = 1,
    /// A file that cannot be opened, read or written.
    Io = 2,
    /// An image that cannot be decoded, or that no model can take (empty, too large).
    Image = 3,
    /// A model file that is not a usable Depth Anything 3 GGUF.
    Model = 4,
    /// The device failed or cannot be used: an unknown device name, memory it cannot
    /// allocate, a computation that failed on it.
    Device = 5,
    /// Something the model does not predict (confidence, sky, a camera pose), or an export
    /// that needs it.
    NotAvailable = 6,
    /// A session used or freed on a thread other than the one that created it.
    WrongThread = 7,
    /// A bug in da3, caught before it reached C (a Rust panic). The handles the call was
    /// given may be in any state but are safe to free.
    Panic = 8,
}

thread_local! {
    /// The message of this thread's last call, as [`da3_last_error`] hands it out.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The message of the last call on this thread that returned a status: empty after
/// `DA3_STATUS_OK`, otherwise what failed and why, one cause per line (UTF-8).
///
/// Never NULL. The string belongs to the library; it stays valid until the next call of a
/// `da3_` function that returns a status, on this thread.
///
/// Thread safety: any thread; each thread has its own message.
#[no_mangle]
pub extern "C" fn da3_last_error() -> *const c_char {
    // `try_with` fails only while the thread's locals are being destroyed (a C thread-exit
    // handler calling in): an empty message then.
    LAST_ERROR
        .try_with(|message| message.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The version of the library, e.g. `"0.1.0"`. Never NULL; a static string.
///
/// Thread safety: any thread.
#[no_mangle]
pub extern "C" fn da3_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// A failed call: the status C sees and the message [`da3_last_error`] returns.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: Da3Status,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(status: Da3Status, message: impl Into<String>) -> Failure {
        Failure {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(Da3Status::InvalidArgument, message)
    }

    pub(crate) fn null(what: &str) -> Failure {
        Failure::invalid(format!("{what} is NULL"))
    }
}

impl From<da3::Error> for Failure {
    fn from(error: da3::Error) -> Failure {
        // `Debug` is the message with its causes, one per line.
        Failure::new(status_of(&error), format!("{error:?}"))
    }
}

impl From<da3::preprocess::PreprocessError> for Failure {
    fn from(error: da3::preprocess::PreprocessError) -> Failure {
        Failure::from(da3::Error::from(error))
    }
}

/// The status of a library error: what the caller can do about it.
fn status_of(error: &da3::Error) -> Da3Status {
    use da3::preprocess::PreprocessError as P;
    use da3::Error as E;
    match error {
        E::Input(_) => Da3Status::InvalidArgument,
        E::Preprocess(
            P::ProcessResTooLarge { .. } | P::ProcessResTooSmall { .. } | P::BufferLength { .. },
        ) => Da3Status::InvalidArgument,
        E::Preprocess(P::Open { .. }) => Da3Status::Io,
        E::Image(da3::image::ImageError::IoError(_)) => Da3Status::Io,
        E::Preprocess(_) | E::Image(_) => Da3Status::Image,
        E::Gguf(da3::gguf::GgufError::Io { .. }) | E::Output { .. } => Da3Status::Io,
        E::Ggml(_) | E::Residency(_) => Da3Status::Device,
        _ => Da3Status::Model,
    }
}

fn set_last_error(message: &str) {
    // A NUL inside the message would cut it short in C.
    let message = CString::new(message.replace('\0', "\u{FFFD}")).unwrap_or_default();
    // Ignored while the thread's locals are being destroyed: no message can be read then.
    let _ = LAST_ERROR.try_with(|last| *last.borrow_mut() = message);
}

/// Runs the body of an exported function: its error or panic becomes a status and this
/// thread's last error, so that nothing unwinds into C.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> Da3Status {
    // Unwind safety: after a panic the caller is told the handles may be in any state; none
    // is used again by this library unless the caller passes it again, knowingly.
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let (status, message) = match outcome {
        Ok(Ok(())) => (Da3Status::Ok, String::new()),
        Ok(Err(failure)) => (failure.status, failure.message),
        Err(payload) => {
            let reason = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            (
                Da3Status::Panic,
                format!("internal error (a bug in da3): {reason}"),
            )
        }
    };
    set_last_error(&message);
    status
}

/// `pointer` as a shared reference, or an `InvalidArgument` failure naming `what` when NULL.
///
/// # Safety
/// A non-null `pointer` must point to a live `T` that nothing mutates during `'a`.
pub(crate) unsafe fn borrow<'a, T>(pointer: *const T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller guarantees a non-null `pointer` is valid for `'a`; `as_ref` checks
    // null.
    unsafe { pointer.as_ref() }.ok_or_else(|| Failure::null(what))
}

/// `pointer` as an exclusive reference, or an `InvalidArgument` failure naming `what`.
///
/// # Safety
/// A non-null `pointer` must point to a live `T` that nothing else uses during `'a`.
pub(crate) unsafe fn borrow_mut<'a, T>(pointer: *mut T, what: &str) -> Result<&'a mut T, Failure> {
    // SAFETY: the caller guarantees a non-null `pointer` is valid and unaliased for `'a`.
    unsafe { pointer.as_mut() }.ok_or_else(|| Failure::null(what))
}

/// Writes `value` through the out-pointer `out`, which [`check_out`] has found non-null.
///
/// # Safety
/// `out` must be non-null, aligned and valid for writes of a `T` (its old contents are not
/// read or dropped, so they may be uninitialised).
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: the caller guarantees `out` is valid for a write; `write` neither reads nor
    // drops the old contents.
    unsafe { out.write(value) }
}

/// An `InvalidArgument` failure naming `what` when the out-pointer `out` is NULL.
pub(crate) fn check_out<T>(out: *mut T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        Err(Failure::null(what))
    } else {
        Ok(())
    }
}

/// Writes `value` through `out` unless it is NULL (an output the caller does not want).
///
/// # Safety
/// A non-null `out` must be aligned and valid for writes of a `T`.
pub(crate) unsafe fn write_optional<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null, and the caller guarantees it is valid for a write.
        unsafe { out.write(value) }
    }
}

/// The NUL-terminated string at `pointer` as UTF-8, or an `InvalidArgument` failure naming
/// `what` (NULL, or not UTF-8).
///
/// # Safety
/// A non-null `pointer` must point to a NUL-terminated string that stays unchanged during `'a`.
pub(crate) unsafe fn utf8<'a>(pointer: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if pointer.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string that lives for `'a`.
    let text = unsafe { CStr::from_ptr(pointer) };
    text.to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// The file path at `pointer` (any bytes but NUL on Unix, UTF-8 elsewhere), or an
/// `InvalidArgument` failure naming `what`.
///
/// # Safety
/// A non-null `pointer` must point to a NUL-terminated string that stays unchanged during the
/// call.
pub(crate) unsafe fn file_path(pointer: *const c_char, what: &str) -> Result<PathBuf, Failure> {
    if pointer.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: non-null, and the caller guarantees a NUL-terminated string.
    let bytes = unsafe { CStr::from_ptr(pointer) }.to_bytes();
    if bytes.is_empty() {
        return Err(Failure::invalid(format!("{what} is empty")));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Ok(PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
    }
    #[cfg(not(unix))]
    {
        std::str::from_utf8(bytes)
            .map(PathBuf::from)
            .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
    }
}

/// Frees a handle made by `Box::into_raw`; NULL is a no-op.
///
/// # Safety
/// A non-null `handle` must come from `Box::into_raw` of this type and not have been freed.
pub(crate) unsafe fn free_handle<T>(handle: *mut T) {
    if !handle.is_null() {
        // Dropping the library's objects should not panic; if it does, the object is leaked
        // rather than unwinding into C.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the caller guarantees the pointer came from `Box::into_raw` and is
            // freed once.
            drop(unsafe { Box::from_raw(handle) });
        }));
    }
}

#[cfg(test)]
mod tests;
