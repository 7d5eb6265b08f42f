//! Images: from a file, from encoded bytes, or from the caller's RGB pixels.

use crate::{borrow, check_out, file_path, free_handle, guard, write_optional, write_out};
use crate::{Da3Status, Failure};
use std::ffi::c_char;

/// An 8-bit RGB image. Opaque.
///
/// Thread safety: an image is never changed after it is made; the functions that take a
/// `const da3_image*` may run on any thread at the same time.
pub struct Da3Image {
    pub(crate) image: da3::Image,
}

/// Hands `image` to C through the out-pointer `out`, checked non-null by the caller.
///
/// # Safety
/// `out` must be non-null and valid for writing a pointer.
unsafe fn hand_out(out: *mut *mut Da3Image, image: da3::Image) {
    let handle = Box::into_raw(Box::new(Da3Image { image }));
    // SAFETY: the caller guarantees `out` is non-null and valid for a write.
    unsafe { write_out(out, handle) }
}

/// Reads the image file at `path` (PNG, JPEG, WebP, TIFF, BMP, GIF; a JPEG's EXIF orientation
/// applied, alpha dropped) into `*image`, which the caller frees with `da3_image_free`. On
/// failure `*image` is NULL.
///
/// Statuses: `DA3_STATUS_IO` (the file cannot be read), `DA3_STATUS_IMAGE` (it does not
/// decode, or is too large), `DA3_STATUS_INVALID_ARGUMENT`.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `image` NULL or valid for writing a
/// pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_image_load(
    path: *const c_char,
    image: *mut *mut Da3Image,
) -> Da3Status {
    guard(|| {
        check_out(image, "image")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(image, std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a NUL-terminated string or NULL.
        let file = unsafe { file_path(path, "path") }?;
        let loaded = da3::load_image(file)?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { hand_out(image, loaded) };
        Ok(())
    })
}

/// Decodes an encoded image (the bytes of a PNG, JPEG, ... file) of `length` bytes into
/// `*image`, which the caller frees with `da3_image_free`. On failure `*image` is NULL.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `bytes` must be NULL or valid for reading `length` bytes; `image` NULL or valid for
/// writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_image_decode(
    bytes: *const u8,
    length: usize,
    image: *mut *mut Da3Image,
) -> Da3Status {
    guard(|| {
        check_out(image, "image")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(image, std::ptr::null_mut()) };
        if bytes.is_null() {
            return Err(Failure::null("bytes"));
        }
        // SAFETY: non-null, and the caller guarantees `length` readable bytes that stay
        // unchanged during the call.
        let encoded = unsafe { std::slice::from_raw_parts(bytes, length) };
        let decoded = da3::decode_image(encoded)?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { hand_out(image, decoded) };
        Ok(())
    })
}

/// Copies `width` x `height` pixels of interleaved 8-bit RGB (`width * height * 3` bytes, rows
/// top to bottom, no padding) into a new image `*image`, which the caller frees with
/// `da3_image_free`. On failure `*image` is NULL.
///
/// Statuses: `DA3_STATUS_IMAGE` (a zero or too large side), `DA3_STATUS_INVALID_ARGUMENT`.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `rgb` must be NULL or valid for reading `width * height * 3` bytes; `image` NULL or valid
/// for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn da3_image_from_rgb(
    width: usize,
    height: usize,
    rgb: *const u8,
    image: *mut *mut Da3Image,
) -> Da3Status {
    guard(|| {
        check_out(image, "image")?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { write_out(image, std::ptr::null_mut()) };
        if rgb.is_null() {
            return Err(Failure::null("rgb"));
        }
        let length = width
            .checked_mul(height)
            .and_then(|pixels| pixels.checked_mul(3))
            .ok_or_else(|| {
                Failure::new(Da3Status::Image, format!("{width}x{height} is too large"))
            })?;
        // SAFETY: non-null, and the caller guarantees `width * height * 3` readable bytes,
        // unchanged during the call.
        let pixels = unsafe { std::slice::from_raw_parts(rgb, length) };
        let copied = da3::Image::new(width, height, pixels.to_vec())?;
        // SAFETY: checked non-null; valid for a write.
        unsafe { hand_out(image, copied) };
        Ok(())
    })
}

/// The pixels of `image`: `*rgb` points to its `width * height * 3` bytes of interleaved RGB,
/// valid until the image is freed. `width` and `height` may be NULL when not wanted.
///
/// Thread safety: any thread, several at once.
///
/// # Safety
/// `image` must be NULL or a live image; `rgb` NULL or valid for writing a pointer; `width`
/// and `height` NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn da3_image_pixels(
    image: *const Da3Image,
    rgb: *mut *const u8,
    width: *mut usize,
    height: *mut usize,
) -> Da3Status {
    guard(|| {
        check_out(rgb, "rgb")?;
        // SAFETY: the caller guarantees a live image or NULL.
        let image = &unsafe { borrow(image, "image") }?.image;
        // SAFETY: `rgb` is checked non-null; the caller guarantees every out-pointer given is
        // valid for a write.
        unsafe {
            write_out(rgb, image.data.as_ptr());
            write_optional(width, image.width);
            write_optional(height, image.height);
        }
        Ok(())
    })
}

/// Frees an image; NULL is a no-op. Runs given it have their own copy: an image may be freed
/// right after `da3_session_run` returns.
///
/// Thread safety: any thread, once no other call is using this image.
///
/// # Safety
/// `image` must be NULL or an image from this library not yet freed.
#[no_mangle]
pub unsafe extern "C" fn da3_image_free(image: *mut Da3Image) {
    // SAFETY: the caller guarantees a live image or NULL.
    unsafe { free_handle(image) }
}
