//! Host-side numeric preprocessing of Depth Anything 3 (DA3).
//!
//! Everything here reproduces what the official Python stack computes around the network, so
//! that the network sees the same numbers as the reference implementation:
//!
//! * [`preprocess`]: the official `InputProcessor` default path (`upper_bound_resize`):
//!   longest side to `process_res`, each side to the nearest multiple of 14, ImageNet
//!   normalisation. Its two resizes are OpenCV's (`cv2.resize`), reproduced by [`resize_area`]
//!   bit-exactly and by [`resize_cubic`] bit-exactly except at rare near-ties (see there).
//! * [`resample_pos_embed`]: DINOv2's `interpolate_pos_encoding` (PyTorch bicubic resampling of
//!   the 37x37 patch position-embedding grid).
//! * [`uv_embedding`]: the DPT heads' UV sin/cos position embedding.
//!
//! The reference versions are depth-anything-3 0.1.1, opencv-python-headless 4.11.0.86 (x86-64
//! wheel) and PyTorch 2.x on CPU.

use std::path::PathBuf;

mod da2;
mod decode;
pub use da2::{da2_processed_size, preprocess_da2};
pub use decode::{
    decode_image, decode_image_with, load_image, load_image_with, ReadOptions, MAX_DECODE_BYTES,
    MAX_IMAGE_FILE_BYTES, MAX_IMAGE_PIXELS, MAX_IMAGE_SIDE,
};

/// Side of a ViT patch: processed images are (nearly always) multiples of it.
pub const PATCH_SIZE: usize = 14;
/// The official default processing resolution (longest side).
pub const DEFAULT_PROCESS_RES: usize = 504;
/// DINOv2's `interpolate_offset`, as the official DA3 backbone configures it.
pub const DEFAULT_INTERPOLATE_OFFSET: f64 = 0.1;
/// ImageNet mean used by the official `InputProcessor` (RGB order).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
/// ImageNet standard deviation used by the official `InputProcessor` (RGB order).
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];

/// Largest accepted `process_res` (the processed image's longest side): four times the
/// official default. Compute grows with the square of the token count and memory with the
/// pixels; the README states what the largest size costs.
pub const MAX_PROCESS_RES: usize = 2048;

/// Largest accepted image side. OpenCV indexes pixels with 32-bit ints and computes sample
/// positions in `f32`, so far larger sides could not be reproduced faithfully anyway.
pub const MAX_SIDE: usize = 1 << 24;

/// Colour channels of an [`RgbImage8`].
const CN: usize = 3;

/// Errors of the preprocessing functions. Messages name the offending path or sizes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PreprocessError {
    /// The image file could not be opened or its format sniffed.
    #[error("cannot open image {}: {source}", path.display())]
    Open {
        /// The image file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The image file was opened but could not be decoded (one line: the format and cause).
    #[error("cannot decode image {}: {reason}", path.display())]
    Decode {
        /// The image file (`<memory>` for [`decode_image`]).
        path: PathBuf,
        /// The format and the decoder's complaint.
        reason: String,
    },
    /// An image over the limits of [`load_image`] ([`MAX_IMAGE_PIXELS`], [`MAX_IMAGE_SIDE`]).
    #[error("image {} is too large: {reason}", path.display())]
    ImageTooLarge {
        /// The image file.
        path: PathBuf,
        /// Which limit it exceeds.
        reason: String,
    },
    /// An image or map with a zero side.
    #[error("empty image size {width}x{height}")]
    EmptyImage {
        /// Width given, in pixels.
        width: usize,
        /// Height given, in pixels.
        height: usize,
    },
    /// A side exceeds [`MAX_SIDE`] or the buffer size overflows `usize`.
    #[error("image size {width}x{height} is too large (max side {MAX_SIDE})")]
    TooLarge {
        /// Width given, in pixels.
        width: usize,
        /// Height given, in pixels.
        height: usize,
    },
    /// An RGB buffer whose length is not `width * height * 3`.
    #[error(
        "RGB buffer of {len} bytes does not match a {width}x{height} image ({expected} bytes)"
    )]
    BufferLength {
        /// Image width in pixels.
        width: usize,
        /// Image height in pixels.
        height: usize,
        /// Bytes given.
        len: usize,
        /// Bytes expected (`width * height * 3`).
        expected: usize,
    },
    /// A resize to a zero-size target.
    #[error("cannot resize {src_width}x{src_height} to an empty size {width}x{height}")]
    EmptyTarget {
        /// Source width in pixels.
        src_width: usize,
        /// Source height in pixels.
        src_height: usize,
        /// Target width in pixels.
        width: usize,
        /// Target height in pixels.
        height: usize,
    },
    /// `process_res` above [`MAX_PROCESS_RES`].
    #[error("process_res {process_res} is above the limit of {MAX_PROCESS_RES}")]
    ProcessResTooLarge { process_res: usize },
    /// `process_res` below the patch size.
    #[error("process_res {process_res} is smaller than the patch size {PATCH_SIZE}")]
    ProcessResTooSmall {
        /// The longest side asked for, in pixels.
        process_res: usize,
    },
    /// The aspect ratio is so extreme that a side ends up narrower than half a patch, which the
    /// official code would turn into a 1-pixel side that no patch fits in.
    #[error(
        "image {width}x{height} at process_res {process_res} has a side of {side} px, \
         too thin for a {PATCH_SIZE}-px patch"
    )]
    TooThin {
        /// Image width in pixels.
        width: usize,
        /// Image height in pixels.
        height: usize,
        /// The longest side asked for, in pixels.
        process_res: usize,
        /// The too-thin side after resizing, in pixels.
        side: usize,
    },
    /// A position-embedding grid whose length does not match its declared shape.
    #[error(
        "position-embedding grid holds {len} values, expected {src_h}x{src_w} tokens x {embed_dim}"
    )]
    PosEmbedShape {
        /// Values the grid holds.
        len: usize,
        /// Declared grid height, in tokens.
        src_h: usize,
        /// Declared grid width, in tokens.
        src_w: usize,
        /// Declared values per token.
        embed_dim: usize,
    },
    /// A position-embedding resample PyTorch would not produce at the requested size.
    #[error(
        "cannot resample a {src_h}x{src_w} position-embedding grid to {dst_h}x{dst_w} \
         with interpolate_offset {offset}"
    )]
    PosEmbedTarget {
        /// Source grid height, in tokens.
        src_h: usize,
        /// Source grid width, in tokens.
        src_w: usize,
        /// Target grid height, in tokens.
        dst_h: usize,
        /// Target grid width, in tokens.
        dst_w: usize,
        /// The `interpolate_offset` used.
        offset: f64,
    },
    /// A UV embedding channel count that the official code rejects.
    #[error("UV embedding needs a positive channel count divisible by 4, got {channels}")]
    UvChannels {
        /// The channel count asked for.
        channels: usize,
    },
    /// A UV embedding aspect ratio that is not a positive finite number.
    #[error("UV embedding aspect ratio {aspect_ratio} is not positive and finite")]
    UvAspect {
        /// The aspect ratio given.
        aspect_ratio: f64,
    },
}

/// An 8-bit RGB image, row-major, interleaved (`data[(y * width + x) * 3 + c]`). The
/// default is the empty image (0 x 0), which no computation takes.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct RgbImage8 {
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// `width * height * 3` bytes, RGB interleaved, rows top to bottom.
    pub data: Vec<u8>,
    /// The EXIF FocalLengthIn35mmFilm (millimetres) of the file it was decoded from, where
    /// it has one: what a metric model's metres fall back on ([`crate::metric`]). Resampled
    /// and cropped images leave it behind (it describes the file's framing).
    pub focal_length_35mm: Option<u16>,
}

impl RgbImage8 {
    /// Wraps an interleaved RGB buffer after checking its size.
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Result<Self, PreprocessError> {
        let img = Self {
            width,
            height,
            data,
            focal_length_35mm: None,
        };
        img.validate()?;
        Ok(img)
    }

    /// Converts a decoded image as PIL's `convert("RGB")` does (alpha dropped, grey
    /// replicated).
    pub fn from_dynamic(image: &image::DynamicImage) -> Result<Self, PreprocessError> {
        let rgb = image.to_rgb8();
        let (width, height) = (rgb.width() as usize, rgb.height() as usize);
        Self::new(width, height, rgb.into_raw())
    }

    /// Checks that the image is non-empty, not oversized, and its buffer length matches.
    pub fn validate(&self) -> Result<(), PreprocessError> {
        let expected = rgb_len(self.width, self.height)?;
        if self.data.len() != expected {
            return Err(PreprocessError::BufferLength {
                width: self.width,
                height: self.height,
                len: self.data.len(),
                expected,
            });
        }
        Ok(())
    }
}

/// An image the model can take: an [`RgbImage8`] (as [`load_image`] returns) or a decoded
/// `image::DynamicImage` (converted as PIL's `convert("RGB")` does).
pub trait ToRgbImage {
    /// The image as 8-bit RGB, borrowed where it already is.
    fn to_rgb_image(&self) -> Result<std::borrow::Cow<'_, RgbImage8>, PreprocessError>;
}

impl ToRgbImage for RgbImage8 {
    fn to_rgb_image(&self) -> Result<std::borrow::Cow<'_, RgbImage8>, PreprocessError> {
        self.validate()?;
        Ok(std::borrow::Cow::Borrowed(self))
    }
}

impl ToRgbImage for image::DynamicImage {
    fn to_rgb_image(&self) -> Result<std::borrow::Cow<'_, RgbImage8>, PreprocessError> {
        RgbImage8::from_dynamic(self).map(std::borrow::Cow::Owned)
    }
}

/// Byte length of a valid, non-empty RGB image of the given size.
fn rgb_len(width: usize, height: usize) -> Result<usize, PreprocessError> {
    if width == 0 || height == 0 {
        return Err(PreprocessError::EmptyImage { width, height });
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(PreprocessError::TooLarge { width, height });
    }
    width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(CN))
        .ok_or(PreprocessError::TooLarge { width, height })
}

// ---------------------------------------------------------------------------------------------
// OpenCV-compatible resizing
// ---------------------------------------------------------------------------------------------

/// OpenCV's fixed-point interpolation weights carry 11 fractional bits.
const COEF_BITS: u32 = 11;
const COEF_SCALE: f32 = (1 << COEF_BITS) as f32;

/// Checks the source image and the target size; returns the target's byte length.
fn check_resize(src: &RgbImage8, width: usize, height: usize) -> Result<usize, PreprocessError> {
    src.validate()?;
    if width == 0 || height == 0 {
        return Err(PreprocessError::EmptyTarget {
            src_width: src.width,
            src_height: src.height,
            width,
            height,
        });
    }
    rgb_len(width, height)
}

/// OpenCV's `saturate_cast<short>(float)`: round half to even, then clamp.
fn sat_i16(v: f32) -> i16 {
    // The float-to-int `as` cast saturates, and so does the clamp after it.
    (v.round_ties_even() as i32).clamp(i32::from(i16::MIN), i32::from(i16::MAX)) as i16
}

/// OpenCV's `saturate_cast<uchar>` of an int.
fn sat_u8(v: i64) -> u8 {
    v.clamp(0, 255) as u8
}

/// OpenCV's `saturate_cast<uchar>(float)`: round half to even, then clamp.
fn sat_u8_f32(v: f32) -> u8 {
    sat_u8(v.round_ties_even() as i64)
}

/// OpenCV derives the sampling step from the reciprocal of `dst / src`, not from `src / dst`;
/// the two differ in the last bit for some sizes, which moves sample positions and can even
/// disable the integer-factor area path (e.g. a factor of 49).
fn cv_scale(src_len: usize, dst_len: usize) -> (f64, f64) {
    let inv_scale = dst_len as f64 / src_len as f64;
    (1.0 / inv_scale, inv_scale)
}

/// Keys' cubic weights (a = -0.75) for a fractional offset `x`, evaluated in `f32` in the same
/// operation order as OpenCV, so the rounded fixed-point weights come out identical. The last
/// weight is `1 - (others)` rather than its own polynomial.
fn cv_cubic_weights(x: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let x1 = x + 1.0;
    let w0 = ((A * x1 - 5.0 * A) * x1 + 8.0 * A) * x1 - 4.0 * A;
    let w1 = ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let y = 1.0 - x;
    let w2 = ((A + 2.0) * y - (A + 3.0)) * y * y + 1.0;
    let w3 = 1.0 - w0 - w1 - w2;
    [w0, w1, w2, w3]
}

/// One output position of OpenCV's cubic resize along an axis: the index of the first of four
/// source samples (may be out of range; access clamps, i.e. BORDER_REPLICATE) and the
/// fixed-point weights. The weights are rounded one by one, so they need not sum to 2048.
struct CubicTap {
    first: i64,
    weights: [i32; 4],
}

fn cubic_taps(src_len: usize, dst_len: usize) -> Vec<CubicTap> {
    let (scale, _) = cv_scale(src_len, dst_len);
    (0..dst_len)
        .map(|d| {
            // OpenCV rounds the sample position to f32 before splitting it.
            let pos = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let floor = pos.floor();
            let weights = cv_cubic_weights(pos - floor).map(|w| i32::from(sat_i16(w * COEF_SCALE)));
            CubicTap {
                first: floor as i64 - 1,
                weights,
            }
        })
        .collect()
}

fn clamp_index(i: i64, len: usize) -> usize {
    // `len` is at most MAX_SIDE, so it fits an i64.
    i.clamp(0, len as i64 - 1) as usize
}

/// Smallest source side for which OpenCV hands INTER_CUBIC to Intel IPP (below it, IPP
/// declines and OpenCV runs its own fixed-point code).
const IPP_CUBIC_MIN_SIDE: usize = 4;

/// Resizes like `cv2.resize(src, (width, height), interpolation=cv2.INTER_CUBIC)` on a uint8
/// RGB image (OpenCV 4.11, x86-64 opencv-python wheels).
///
/// Those wheels route 8-bit INTER_CUBIC through Intel IPP whenever the source is at least 4x4.
/// IPP evaluates the cubic (a = -0.75, pixel-centre sampling, replicated border) in floating
/// point, so the result is the exactly rounded filter output except where that lies within a
/// few 1e-5 of a half-integer, where IPP's own `f32` rounding error decides. This path computes
/// the filter in `f64` and rounds half to even: it matches IPP everywhere but at such near-ties
/// (about 5 values per million on smooth test images, off by one level). Smaller sources take
/// OpenCV's fixed-point path, which is reproduced bit-exactly.
///
/// # Errors
/// An invalid source ([`RgbImage8::validate`]) or an empty or oversized target.
pub fn resize_cubic(
    src: &RgbImage8,
    width: usize,
    height: usize,
) -> Result<RgbImage8, PreprocessError> {
    let dst_len = check_resize(src, width, height)?;
    if (width, height) == (src.width, src.height) {
        return Ok(src.clone());
    }
    let data = if src.width >= IPP_CUBIC_MIN_SIDE && src.height >= IPP_CUBIC_MIN_SIDE {
        cubic_float(src, width, height)
    } else {
        cubic_fixed_point(src, width, height)
    };
    debug_assert_eq!(data.len(), dst_len);
    Ok(RgbImage8 {
        width,
        height,
        data,
        focal_length_35mm: None,
    })
}

/// Keys' cubic weights (a = -0.75) for a fractional offset `t`, in `f64`.
fn keys_weights(t: f64) -> [f64; 4] {
    const A: f64 = -0.75;
    let near = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// Four clamped source indices and their weights for one output position.
type FloatTap = ([usize; 4], [f64; 4]);

fn cubic_float_taps(src_len: usize, dst_len: usize) -> Vec<FloatTap> {
    let scale = src_len as f64 / dst_len as f64;
    (0..dst_len)
        .map(|d| {
            let pos = (d as f64 + 0.5) * scale - 0.5;
            let floor = pos.floor();
            let first = floor as i64 - 1;
            let idx = [0, 1, 2, 3].map(|j| clamp_index(first + j, src_len));
            (idx, keys_weights(pos - floor))
        })
        .collect()
}

/// The IPP-equivalent cubic: separable, exact up to `f64` rounding, rounded half to even.
fn cubic_float(src: &RgbImage8, width: usize, height: usize) -> Vec<u8> {
    cubic_values(src, width, height)
        .into_iter()
        .map(|v| v.round_ties_even().clamp(0.0, 255.0) as u8)
        .collect()
}

/// The separable cubic (a = -0.75, pixel-centre sampling, replicated border) of an 8-bit
/// image in `f64`, neither rounded nor clamped: OpenCV's INTER_CUBIC on a float image.
fn cubic_values(src: &RgbImage8, width: usize, height: usize) -> Vec<f64> {
    let xtaps = cubic_float_taps(src.width, width);
    let ytaps = cubic_float_taps(src.height, height);
    let row_len = width * CN;
    let src_row = src.width * CN;
    let hpass = |sy: usize| -> Vec<f64> {
        let s = &src.data[sy * src_row..(sy + 1) * src_row];
        let mut row = Vec::with_capacity(row_len);
        for (idx, w) in &xtaps {
            for c in 0..CN {
                row.push((0..4).map(|j| w[j] * f64::from(s[idx[j] * CN + c])).sum());
            }
        }
        row
    };
    let mut cache: Vec<Option<Vec<f64>>> = vec![None; src.height];
    let mut out = Vec::with_capacity(row_len * height);
    let mut acc = vec![0f64; row_len];
    for (idx, w) in &ytaps {
        acc.fill(0.0);
        for j in 0..4 {
            let row = cache[idx[j]].get_or_insert_with(|| hpass(idx[j]));
            for (a, &h) in acc.iter_mut().zip(row.iter()) {
                *a += w[j] * h;
            }
        }
        out.extend_from_slice(&acc);
    }
    out
}

/// OpenCV's own INTER_CUBIC for 8-bit images: a separable fixed-point filter with a horizontal
/// integer pass (11-bit weights), then a vertical pass whose rounding depends on the code path.
/// Its SSE path (each output row in blocks of 8 values) converts to `f32`, scales the weights by
/// 2^-22 and rounds half to even, while the scalar tail of each row stays in integers and rounds
/// half up. Both are reproduced, since they disagree on exact ties.
fn cubic_fixed_point(src: &RgbImage8, width: usize, height: usize) -> Vec<u8> {
    let xtaps = cubic_taps(src.width, width);
    let ytaps = cubic_taps(src.height, height);
    let row_len = width * CN;

    // Horizontal pass over the source rows the vertical taps touch.
    let mut needed = vec![false; src.height];
    for tap in &ytaps {
        for j in 0..4 {
            needed[clamp_index(tap.first + j, src.height)] = true;
        }
    }
    let mut hrows: Vec<Vec<i32>> = vec![Vec::new(); src.height];
    for (sy, row) in hrows.iter_mut().enumerate().filter(|(sy, _)| needed[*sy]) {
        let s = &src.data[sy * src.width * CN..(sy + 1) * src.width * CN];
        row.reserve_exact(row_len);
        for tap in &xtaps {
            let xs = [0, 1, 2, 3].map(|j| clamp_index(tap.first + j, src.width) * CN);
            for c in 0..CN {
                let v: i32 = (0..4)
                    .map(|j| i32::from(s[xs[j] + c]) * tap.weights[j])
                    .sum();
                row.push(v);
            }
        }
    }

    // Vertical pass.
    const SIMD_BLOCK: usize = 8;
    const VSCALE: f32 = 1.0 / ((1u32 << (2 * COEF_BITS)) as f32);
    const ROUND_HALF: i64 = 1 << (2 * COEF_BITS - 1);
    let simd_len = row_len / SIMD_BLOCK * SIMD_BLOCK;
    let mut out = Vec::with_capacity(row_len * height);
    for tap in &ytaps {
        let rows = [0, 1, 2, 3].map(|j| &hrows[clamp_index(tap.first + j, src.height)]);
        let bf = tap.weights.map(|b| b as f32 * VSCALE);
        for x in 0..simd_len {
            let s = rows.map(|r| r[x] as f32);
            let acc = s[0] * bf[0] + (s[1] * bf[1] + (s[2] * bf[2] + s[3] * bf[3]));
            // Packs saturate to i16 and then to u8; the clamp to 0..=255 covers both.
            out.push(sat_u8(acc.round_ties_even() as i64));
        }
        for x in simd_len..row_len {
            let acc: i64 = rows
                .iter()
                .zip(tap.weights)
                .map(|(r, b)| i64::from(r[x]) * i64::from(b))
                .sum();
            out.push(sat_u8((acc + ROUND_HALF) >> (2 * COEF_BITS)));
        }
    }
    out
}

/// Resizes like `cv2.resize(src, (width, height), interpolation=cv2.INTER_AREA)` on a uint8
/// RGB image, bit-exactly (OpenCV 4.11, x86-64 wheels).
///
/// OpenCV has three different algorithms behind INTER_AREA, picked from the scale factors
/// `src / dst` (computed as `1 / (dst / src)` in `f64`):
/// * both factors integers (within `f64` epsilon): block averages in integers; a 2x2 block
///   rounds half up, larger blocks multiply by an `f32` reciprocal and round half to even;
/// * both factors >= 1 otherwise: exact box-filter coverage weights accumulated in `f32`;
/// * any factor < 1 (enlarging): a bilinear filter with area-style weights in fixed point.
///
/// # Errors
/// An invalid source ([`RgbImage8::validate`]) or an empty or oversized target.
pub fn resize_area(
    src: &RgbImage8,
    width: usize,
    height: usize,
) -> Result<RgbImage8, PreprocessError> {
    resize_area_threads(src, width, height, 1)
}

/// [`resize_area`] over up to `threads` threads (bands of output rows; the same result
/// whatever the count).
///
/// # Errors
/// As [`resize_area`].
pub fn resize_area_threads(
    src: &RgbImage8,
    width: usize,
    height: usize,
    threads: usize,
) -> Result<RgbImage8, PreprocessError> {
    let dst_len = check_resize(src, width, height)?;
    if (width, height) == (src.width, src.height) {
        return Ok(src.clone());
    }
    let (scale_x, inv_x) = cv_scale(src.width, width);
    let (scale_y, inv_y) = cv_scale(src.height, height);
    let data = if scale_x >= 1.0 && scale_y >= 1.0 {
        let kx = scale_x.round_ties_even();
        let ky = scale_y.round_ties_even();
        let integer = (scale_x - kx).abs() < f64::EPSILON && (scale_y - ky).abs() < f64::EPSILON;
        let (kx, ky) = (kx as usize, ky as usize);
        if integer && kx * width == src.width && ky * height == src.height {
            area_integer(src, width, height, (kx, ky), threads)
        } else {
            area_general(src, width, height, scale_x, scale_y, threads)
        }
    } else {
        area_enlarge(src, width, height, (scale_x, inv_x), (scale_y, inv_y))
    };
    debug_assert_eq!(data.len(), dst_len);
    Ok(RgbImage8 {
        width,
        height,
        data,
        focal_length_35mm: None,
    })
}

/// INTER_AREA for integer factors `kx` x `ky` that tile the source exactly, in bands of output
/// rows over up to `threads` threads (each row on its own: the same result).
fn area_integer(
    src: &RgbImage8,
    width: usize,
    height: usize,
    (kx, ky): (usize, usize),
    threads: usize,
) -> Vec<u8> {
    let area = kx * ky;
    // Larger blocks are averaged through an f32 reciprocal (so 1/9 is not exact).
    let recip = 1.0f32 / area as f32;
    let src_row = src.width * CN;
    let row_len = width * CN;
    let mut out = vec![0u8; row_len * height];
    let rows = |first: usize, band: &mut [u8]| {
        // The ky source rows of an output row summed column by column (contiguous, in
        // integers: the order does not change a sum), then each kx columns of that.
        let mut column_sums = vec![0u32; src_row];
        for (r, out_row) in band.chunks_mut(row_len).enumerate() {
            let dy = first + r;
            column_sums.fill(0);
            for sy in dy * ky..(dy + 1) * ky {
                let row = &src.data[sy * src_row..(sy + 1) * src_row];
                for (s, &v) in column_sums.iter_mut().zip(row) {
                    *s += u32::from(v);
                }
            }
            for (dx, out_px) in out_row.chunks_exact_mut(CN).enumerate() {
                let block = &column_sums[dx * kx * CN..(dx + 1) * kx * CN];
                for (c, o) in out_px.iter_mut().enumerate() {
                    let sum: u32 = block.iter().skip(c).step_by(CN).sum();
                    *o = if area == 4 && kx == 2 {
                        // The dedicated 2x2 kernel rounds half up in integers.
                        ((sum + 2) >> 2) as u8
                    } else {
                        sat_u8_f32(sum as f32 * recip)
                    };
                }
            }
        }
    };
    in_row_bands(&mut out, row_len, threads, rows);
    out
}

/// Runs `rows(first_row, band)` over bands of `out`'s rows (`row_len` values each), on up to
/// `threads` scoped threads; one band on the calling thread when `threads` is 1.
fn in_row_bands(
    out: &mut [u8],
    row_len: usize,
    threads: usize,
    rows: impl Fn(usize, &mut [u8]) + Sync,
) {
    let height = out.len() / row_len.max(1);
    let per_band = height.div_ceil(threads.clamp(1, height.max(1))).max(1);
    if per_band >= height {
        rows(0, out);
        return;
    }
    std::thread::scope(|scope| {
        for (i, band) in out.chunks_mut(per_band * row_len).enumerate() {
            let rows = &rows;
            scope.spawn(move || rows(i * per_band, band));
        }
    });
}

/// One source cell's share of an output cell in OpenCV's general area resize.
struct AreaTap {
    dst: usize,
    src: usize,
    weight: f32,
}

/// Coverage of each output cell `[d * scale, (d + 1) * scale)` by source pixels, normalised by
/// the cell width; slivers up to 1e-3 pixel are dropped, as OpenCV does.
fn area_taps(src_len: usize, dst_len: usize, scale: f64) -> Vec<AreaTap> {
    let mut taps = Vec::with_capacity(src_len * 2);
    let last = src_len as i64 - 1;
    for d in 0..dst_len {
        let f1 = d as f64 * scale;
        let f2 = f1 + scale;
        let cell = scale.min(src_len as f64 - f1);
        let s2 = (f2.floor() as i64).min(last);
        let s1 = (f1.ceil() as i64).min(s2);
        let mut push = |s: i64, weight: f64| {
            taps.push(AreaTap {
                dst: d,
                src: s as usize,
                weight: weight as f32,
            })
        };
        if s1 as f64 - f1 > 1e-3 {
            push(s1 - 1, (s1 as f64 - f1) / cell);
        }
        for s in s1..s2 {
            push(s, 1.0 / cell);
        }
        if f2 - s2 as f64 > 1e-3 {
            push(s2, (f2 - s2 as f64).min(1.0).min(cell) / cell);
        }
    }
    taps
}

/// INTER_AREA for non-integer shrinking: separable coverage weights, accumulated in `f32` in
/// OpenCV's order (horizontal taps into a row buffer, then row buffers into the output row),
/// and rounded half to even.
fn area_general(
    src: &RgbImage8,
    width: usize,
    height: usize,
    scale_x: f64,
    scale_y: f64,
    threads: usize,
) -> Vec<u8> {
    let xtaps = area_taps(src.width, width, scale_x);
    let ytaps = area_taps(src.height, height, scale_y);
    let row_len = width * CN;
    let mut out = vec![0u8; row_len * height];
    // Bands of output rows, each from the vertical taps of its rows alone: the same sums in
    // the same order as one pass, so the result does not depend on the threads.
    in_row_bands(&mut out, row_len, threads, |first, band_out| {
        let rows = band_out.len() / row_len;
        let start = ytaps.partition_point(|t| t.dst < first);
        let end = ytaps.partition_point(|t| t.dst < first + rows);
        area_general_rows(src, &xtaps, &ytaps[start..end], first, row_len, band_out);
    });
    out
}

/// The output rows from `first` (`out` holds them) of [`area_general`], from their vertical
/// taps (`ytaps`, in order).
fn area_general_rows(
    src: &RgbImage8,
    xtaps: &[AreaTap],
    ytaps: &[AreaTap],
    first: usize,
    row_len: usize,
    out: &mut [u8],
) {
    let src_row = src.width * CN;
    let mut buf = vec![0f32; row_len];
    let mut sum = vec![0f32; row_len];
    let mut cur_dy = match ytaps.first() {
        Some(t) => t.dst,
        None => return,
    };
    let flush = |out: &mut [u8], dy: usize, sum: &[f32]| {
        let at = (dy - first) * row_len;
        for (o, &s) in out[at..at + row_len].iter_mut().zip(sum) {
            *o = sat_u8_f32(s);
        }
    };
    for yt in ytaps {
        let row = &src.data[yt.src * src_row..(yt.src + 1) * src_row];
        buf.fill(0.0);
        for xt in xtaps {
            for c in 0..CN {
                buf[xt.dst * CN + c] += f32::from(row[xt.src * CN + c]) * xt.weight;
            }
        }
        if yt.dst != cur_dy {
            flush(out, cur_dy, &sum);
            for (s, &b) in sum.iter_mut().zip(&buf) {
                *s = yt.weight * b;
            }
            cur_dy = yt.dst;
        } else {
            for (s, &b) in sum.iter_mut().zip(&buf) {
                *s += yt.weight * b;
            }
        }
    }
    flush(out, cur_dy, &sum);
}

/// One output position of OpenCV's INTER_AREA enlarging filter: two neighbouring source
/// samples starting at `first` with 11-bit weights.
struct LinearTap {
    first: usize,
    weights: [i32; 2],
}

/// OpenCV's "area-like" bilinear weights for enlarging: the output cell `[d, d + 1)` in
/// destination units is split where it crosses a source pixel boundary. Along x a sample at the
/// last source pixel gets all the weight; along y it does not (the second row is clamped
/// instead), and the two give different fixed-point results, so `clamp_last` selects which.
fn area_enlarge_taps(
    src_len: usize,
    dst_len: usize,
    scale: f64,
    inv: f64,
    clamp_last: bool,
) -> Vec<LinearTap> {
    (0..dst_len)
        .map(|d| {
            let mut s = (d as f64 * scale).floor() as usize;
            let f = ((d + 1) as f64 - (s + 1) as f64 * inv) as f32;
            let mut f = if f <= 0.0 { 0.0 } else { f - f.floor() };
            if clamp_last && s >= src_len - 1 {
                s = src_len - 1;
                f = 0.0;
            }
            LinearTap {
                first: s,
                weights: [sat_i16((1.0 - f) * COEF_SCALE), sat_i16(f * COEF_SCALE)].map(i32::from),
            }
        })
        .collect()
}

/// INTER_AREA when at least one axis grows.
fn area_enlarge(
    src: &RgbImage8,
    width: usize,
    height: usize,
    (scale_x, inv_x): (f64, f64),
    (scale_y, inv_y): (f64, f64),
) -> Vec<u8> {
    let xtaps = area_enlarge_taps(src.width, width, scale_x, inv_x, true);
    let ytaps = area_enlarge_taps(src.height, height, scale_y, inv_y, false);
    let row_len = width * CN;
    let src_row = src.width * CN;
    let hrow = |sy: usize| -> Vec<i32> {
        let s = &src.data[sy * src_row..(sy + 1) * src_row];
        let mut row = Vec::with_capacity(row_len);
        for t in &xtaps {
            let x1 = (t.first + 1).min(src.width - 1);
            for c in 0..CN {
                row.push(
                    i32::from(s[t.first * CN + c]) * t.weights[0]
                        + i32::from(s[x1 * CN + c]) * t.weights[1],
                );
            }
        }
        row
    };
    let rows_of = |t: &LinearTap| [t.first, t.first + 1].map(|r| r.min(src.height - 1));
    let mut hrows: Vec<Vec<i32>> = vec![Vec::new(); src.height];
    for r in ytaps.iter().flat_map(rows_of) {
        if hrows[r].is_empty() {
            hrows[r] = hrow(r);
        }
    }
    let mut out = Vec::with_capacity(row_len * height);
    for t in &ytaps {
        let [r0, r1] = rows_of(t);
        // OpenCV's 8-bit bilinear vertical pass drops 4 bits before multiplying and keeps
        // only the high 16 bits of each product (its SIMD and scalar paths agree on this).
        for (&a, &b) in hrows[r0].iter().zip(&hrows[r1]) {
            let v = ((t.weights[0] * (a >> 4)) >> 16) + ((t.weights[1] * (b >> 4)) >> 16);
            out.push(sat_u8(i64::from((v + 2) >> 2)));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Official InputProcessor
// ---------------------------------------------------------------------------------------------

/// Interpolation OpenCV is asked for by the official `InputProcessor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interpolation {
    /// Bicubic (`cv2.INTER_CUBIC`), for enlarging.
    Cubic,
    /// Pixel-area averaging (`cv2.INTER_AREA`), for shrinking.
    Area,
}

/// One resize of the official preprocessing (see [`ResizePlan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizeStep {
    /// Width after this step, in pixels.
    pub width: usize,
    /// Height after this step, in pixels.
    pub height: usize,
    /// How OpenCV resamples in this step.
    pub interpolation: Interpolation,
}

/// A centred crop of the `*_crop` methods ([`ResizeMethod`]): the window kept, in pixels of
/// the image after the bound resize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CropStep {
    /// Left edge of the window.
    pub left: usize,
    /// Top edge of the window.
    pub top: usize,
    /// Width of the window, a multiple of 14.
    pub width: usize,
    /// Height of the window, a multiple of 14.
    pub height: usize,
}

/// How an image reaches its processed size: the official `process_res_method`s of the
/// `InputProcessor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ResizeMethod {
    /// Longest side to `process_res`, then each side to the nearest multiple of 14 by a
    /// small resize (the official default, `upper_bound_resize`).
    #[default]
    UpperBoundResize,
    /// Longest side to `process_res`, then each side floored to a multiple of 14 by a
    /// centred crop (`upper_bound_crop`).
    UpperBoundCrop,
    /// Shortest side to `process_res`, then the nearest multiples of 14 by a small resize
    /// (`lower_bound_resize`).
    LowerBoundResize,
    /// Shortest side to `process_res`, then a centred crop to multiples of 14
    /// (`lower_bound_crop`).
    LowerBoundCrop,
}

impl ResizeMethod {
    /// Every method, in the order of the variants.
    pub const ALL: [ResizeMethod; 4] = [
        ResizeMethod::UpperBoundResize,
        ResizeMethod::UpperBoundCrop,
        ResizeMethod::LowerBoundResize,
        ResizeMethod::LowerBoundCrop,
    ];

    /// The official name (`upper_bound_resize`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ResizeMethod::UpperBoundResize => "upper_bound_resize",
            ResizeMethod::UpperBoundCrop => "upper_bound_crop",
            ResizeMethod::LowerBoundResize => "lower_bound_resize",
            ResizeMethod::LowerBoundCrop => "lower_bound_crop",
        }
    }

    /// Whether the side `process_res` bounds is the shortest one.
    fn bounds_shortest_side(self) -> bool {
        matches!(
            self,
            ResizeMethod::LowerBoundResize | ResizeMethod::LowerBoundCrop
        )
    }

    /// Whether the patch multiple is reached by cropping (not resizing).
    fn crops(self) -> bool {
        matches!(
            self,
            ResizeMethod::UpperBoundCrop | ResizeMethod::LowerBoundCrop
        )
    }
}

impl std::fmt::Display for ResizeMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for ResizeMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResizeMethod::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = ResizeMethod::ALL.iter().map(|m| m.name()).collect();
                format!("unknown resize method {s:?} (one of {})", names.join(", "))
            })
    }
}

/// The sizes the official preprocessing goes through for a `width` x `height` image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResizePlan {
    /// The bounded side to `process_res` (skipped when it already is).
    pub bound: Option<ResizeStep>,
    /// Each side to the nearest multiple of 14 (`*_resize` methods; skipped when both
    /// already are).
    pub patch: Option<ResizeStep>,
    /// Each side floored to a multiple of 14 by a centred crop (`*_crop` methods; skipped
    /// when both already are).
    pub crop: Option<CropStep>,
    /// Final processed width, a multiple of 14.
    pub width: usize,
    /// Final processed height, a multiple of 14.
    pub height: usize,
}

impl ResizePlan {
    /// The size after the bound resize (the input's size when it is skipped).
    pub fn bounded_size(&self, width: usize, height: usize) -> (usize, usize) {
        self.bound.map_or((width, height), |s| (s.width, s.height))
    }
}

/// Refuses a process resolution below the patch size or above [`MAX_PROCESS_RES`], whatever
/// the image.
///
/// # Errors
/// [`PreprocessError::ProcessResTooSmall`] or [`PreprocessError::ProcessResTooLarge`].
pub fn check_process_res(process_res: usize) -> Result<(), PreprocessError> {
    if process_res < PATCH_SIZE {
        return Err(PreprocessError::ProcessResTooSmall { process_res });
    }
    if process_res > MAX_PROCESS_RES {
        return Err(PreprocessError::ProcessResTooLarge { process_res });
    }
    Ok(())
}

/// Plans the official `upper_bound_resize` for a `width` x `height` image
/// ([`plan_resize_by`] with the default method).
///
/// # Errors
/// As [`plan_resize_by`].
pub fn plan_resize(
    width: usize,
    height: usize,
    process_res: usize,
) -> Result<ResizePlan, PreprocessError> {
    plan_resize_by(width, height, process_res, ResizeMethod::UpperBoundResize)
}

/// Plans the official preprocessing by `method` for a `width` x `height` image.
///
/// Sizes follow the official Python: the scale `process_res / side` (the longest side, or the
/// shortest for the `lower_bound` methods) is an `f64`, each side is
/// `max(1, round(side * scale))` with round-half-to-even; each result then goes to the nearest
/// multiple of 14 with ties rounding up (`*_resize`) or is floored to one by a centred crop
/// (`*_crop`). Cubic is used whenever the image (or, in the second step, either side) grows,
/// area otherwise.
///
/// # Errors
/// An empty or oversized image, `process_res` below 14 or above [`MAX_PROCESS_RES`],
/// [`PreprocessError::TooThin`] where a side would round to no patch at all, or
/// [`PreprocessError::ProcessResTooLarge`] where the lower-bound methods would make the
/// longest side larger than [`MAX_PROCESS_RES`] times 4.
pub fn plan_resize_by(
    width: usize,
    height: usize,
    process_res: usize,
    method: ResizeMethod,
) -> Result<ResizePlan, PreprocessError> {
    rgb_len(width, height)?;
    check_process_res(process_res)?;
    let bounded = match method.bounds_shortest_side() {
        true => width.min(height),
        false => width.max(height),
    };
    let (mut w, mut h) = (width, height);
    let mut bound = None;
    if bounded != process_res {
        let scale = process_res as f64 / bounded as f64;
        let side = |s: usize| ((s as f64 * scale).round_ties_even() as usize).max(1);
        (w, h) = (side(width), side(height));
        // The shortest side bounded, the other may grow without limit: keep the token count
        // (and the memory it needs) within what the upper-bound methods allow.
        if w.max(h) > 4 * MAX_PROCESS_RES {
            return Err(PreprocessError::ProcessResTooLarge {
                process_res: w.max(h),
            });
        }
        let interpolation = if scale > 1.0 {
            Interpolation::Cubic
        } else {
            Interpolation::Area
        };
        bound = Some(ResizeStep {
            width: w,
            height: h,
            interpolation,
        });
    }
    let to_patches = |s: usize| -> Result<usize, PreprocessError> {
        let down = s / PATCH_SIZE * PATCH_SIZE;
        let up = down + PATCH_SIZE;
        let m = match method.crops() {
            true => down,
            false if up - s <= s - down => up,
            false => down,
        };
        if m == 0 {
            // The official code would produce a 1-pixel (or empty) side here.
            return Err(PreprocessError::TooThin {
                width,
                height,
                process_res,
                side: s,
            });
        }
        Ok(m)
    };
    let (pw, ph) = (to_patches(w)?, to_patches(h)?);
    let (mut patch, mut crop) = (None, None);
    if (pw, ph) != (w, h) {
        if method.crops() {
            crop = Some(CropStep {
                left: (w - pw) / 2,
                top: (h - ph) / 2,
                width: pw,
                height: ph,
            });
        } else {
            let interpolation = if pw > w || ph > h {
                Interpolation::Cubic
            } else {
                Interpolation::Area
            };
            patch = Some(ResizeStep {
                width: pw,
                height: ph,
                interpolation,
            });
        }
    }
    Ok(ResizePlan {
        bound,
        patch,
        crop,
        width: pw,
        height: ph,
    })
}

/// A preprocessed image as the network consumes it.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessedImage {
    /// Processed width, a multiple of 14.
    pub width: usize,
    /// Processed height, a multiple of 14.
    pub height: usize,
    /// `3 x height x width` (channel-major, RGB), `(v / 255 - mean) / std`.
    pub chw: Vec<f32>,
    /// The resized 8-bit image before normalisation.
    pub rgb8: RgbImage8,
}

fn apply_step(
    img: &RgbImage8,
    step: &ResizeStep,
    threads: usize,
) -> Result<RgbImage8, PreprocessError> {
    match step.interpolation {
        Interpolation::Cubic => resize_cubic(img, step.width, step.height),
        Interpolation::Area => resize_area_threads(img, step.width, step.height, threads),
    }
}

/// [`preprocess`] of decoded images (any colour type), one scene's or a batch's, in order.
pub fn preprocess_images(
    images: &[image::DynamicImage],
    process_res: usize,
) -> Result<Vec<ProcessedImage>, PreprocessError> {
    images
        .iter()
        .map(|im| preprocess(&RgbImage8::from_dynamic(im)?, process_res))
        .collect()
}

/// The official `InputProcessor` default path (`upper_bound_resize`) for one image
/// ([`preprocess_by`] with the default method).
///
/// # Errors
/// As [`preprocess_by`].
pub fn preprocess(img: &RgbImage8, process_res: usize) -> Result<ProcessedImage, PreprocessError> {
    preprocess_by(img, process_res, ResizeMethod::UpperBoundResize)
}

/// The official `InputProcessor` for one image by `method`; see [`plan_resize_by`] for the
/// sizes. Normalisation is computed in `f32` in the official order (`v / 255`, minus mean,
/// divided by std), so values match PyTorch exactly.
///
/// # Errors
/// An invalid image ([`RgbImage8::validate`]) or any error of [`plan_resize_by`].
pub fn preprocess_by(
    img: &RgbImage8,
    process_res: usize,
    method: ResizeMethod,
) -> Result<ProcessedImage, PreprocessError> {
    preprocess_by_threads(img, process_res, method, 1)
}

/// [`preprocess_by`] with its area resizes over up to `threads` threads (the same result).
///
/// # Errors
/// As [`preprocess_by`].
pub fn preprocess_by_threads(
    img: &RgbImage8,
    process_res: usize,
    method: ResizeMethod,
    threads: usize,
) -> Result<ProcessedImage, PreprocessError> {
    img.validate()?;
    let plan = plan_resize_by(img.width, img.height, process_res, method)?;
    let mut cur = match &plan.bound {
        Some(step) => apply_step(img, step, threads)?,
        None => img.clone(),
    };
    if let Some(step) = &plan.patch {
        cur = apply_step(&cur, step, threads)?;
    }
    if let Some(crop) = &plan.crop {
        cur = crop_rgb(&cur, crop);
    }
    Ok(ProcessedImage {
        width: cur.width,
        height: cur.height,
        chw: normalize_chw(&cur),
        rgb8: cur,
    })
}

/// The window `crop` of `img` (PIL's `crop`, inside the image by construction).
fn crop_rgb(img: &RgbImage8, crop: &CropStep) -> RgbImage8 {
    let mut data = Vec::with_capacity(crop.width * crop.height * CN);
    for y in crop.top..crop.top + crop.height {
        let row = (y * img.width + crop.left) * CN;
        data.extend_from_slice(&img.data[row..row + crop.width * CN]);
    }
    RgbImage8 {
        width: crop.width,
        height: crop.height,
        data,
        focal_length_35mm: None,
    }
}

/// ImageNet normalisation to channel-major `f32`, matching torchvision's `ToTensor` +
/// `Normalize` bit for bit.
pub fn normalize_chw(img: &RgbImage8) -> Vec<f32> {
    let plane = img.width * img.height;
    let mut chw = vec![0f32; plane * CN];
    for (c, out) in chw.chunks_exact_mut(plane.max(1)).enumerate().take(CN) {
        for (o, px) in out.iter_mut().zip(img.data.chunks_exact(CN)) {
            *o = (f32::from(px[c]) / 255.0 - IMAGENET_MEAN[c]) / IMAGENET_STD[c];
        }
    }
    chw
}

// ---------------------------------------------------------------------------------------------
// DINOv2 position-embedding resampling
// ---------------------------------------------------------------------------------------------

/// PyTorch's bicubic weights (a = -0.75) for a fractional offset `t`, in `f32`. PyTorch's
/// vectorised CPU builds contract these polynomials (and the sample position) into fused
/// multiply-adds; doing the same brings the resampled values from ~7e-6 to within ~1e-6 of
/// PyTorch's on unit-variance data.
fn torch_cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0).mul_add(x, -(A + 3.0)) * x).mul_add(x, 1.0);
    let far = |x: f32| {
        A.mul_add(x, -5.0 * A)
            .mul_add(x, 8.0 * A)
            .mul_add(x, -4.0 * A)
    };
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// Source indices (clamped) and weights of PyTorch's bicubic upsample (align_corners=False)
/// along one axis. `coord_scale` is the source step per destination pixel, in `f32`.
fn torch_cubic_taps(
    src_len: usize,
    dst_len: usize,
    coord_scale: f32,
) -> Vec<([usize; 4], [f32; 4])> {
    (0..dst_len)
        .map(|d| {
            // Fused, as in PyTorch's vectorised builds (see `torch_cubic_weights`).
            let real = coord_scale.mul_add(d as f32 + 0.5, -0.5);
            let floor = real.floor();
            let base = floor as i64;
            let idx = [0, 1, 2, 3].map(|j| clamp_index(base - 1 + j, src_len));
            (idx, torch_cubic_weights(real - floor))
        })
        .collect()
}

/// A 4-tap sum in PyTorch's order: starting from the first product, adding the others in turn.
fn weighted_sum(w: &[f32; 4], value: impl Fn(usize) -> f32) -> f32 {
    w.iter()
        .enumerate()
        .skip(1)
        .fold(value(0) * w[0], |acc, (k, &wk)| acc + value(k) * wk)
}

/// Source step along one axis as PyTorch derives it: from the scale factor when one is given
/// (`1 / scale_factor`, computed in `f64` and rounded to `f32`), otherwise from the sizes.
fn torch_axis_scale(src_len: usize, dst_len: usize, offset: f64) -> Option<f32> {
    if offset == 0.0 {
        return Some(src_len as f32 / dst_len as f32);
    }
    let factor = (dst_len as f64 + offset) / src_len as f64;
    // F.interpolate derives the output size as floor(size * factor); the official code
    // asserts it equals the patch grid.
    let out = (src_len as f64 * factor).floor();
    (factor > 0.0 && out == dst_len as f64).then(|| (1.0 / factor) as f32)
}

/// DINOv2's `interpolate_pos_encoding` for the patch part of the position embedding.
///
/// `grid` is the official `pos_embed[0, 1:]`: `[src_h * src_w, embed_dim]`, token-major
/// (token `y * src_w + x`). The result has the same layout for `dst_h x dst_w` tokens. As the
/// official code calls it: `F.interpolate(mode="bicubic", align_corners=False,
/// antialias=False, scale_factor=((dst_h + offset) / src_h, (dst_w + offset) / src_w))` for a
/// non-zero `interpolate_offset` (DA3 uses 0.1), or `size=(dst_h, dst_w)` for zero. PyTorch
/// then places samples with the given scale factor, not with the size ratio, and clamps
/// out-of-range taps to the border.
///
/// The official code skips the resample (returns the grid unchanged) when the token count and
/// the image's height and width are equal; for patch-aligned images that is `dst == src`,
/// which is the condition used here.
///
/// # Errors
/// [`PreprocessError::PosEmbedShape`] when `grid` does not hold `src_h * src_w * embed_dim`
/// values; [`PreprocessError::PosEmbedTarget`] for an empty target or one that the offset would
/// make PyTorch miss (the official code asserts on it).
pub fn resample_pos_embed(
    grid: &[f32],
    embed_dim: usize,
    src_h: usize,
    src_w: usize,
    dst_h: usize,
    dst_w: usize,
    interpolate_offset: f64,
) -> Result<Vec<f32>, PreprocessError> {
    let expected = src_h
        .checked_mul(src_w)
        .and_then(|n| n.checked_mul(embed_dim));
    if expected != Some(grid.len()) || grid.is_empty() {
        return Err(PreprocessError::PosEmbedShape {
            len: grid.len(),
            src_h,
            src_w,
            embed_dim,
        });
    }
    let target_err = || PreprocessError::PosEmbedTarget {
        src_h,
        src_w,
        dst_h,
        dst_w,
        offset: interpolate_offset,
    };
    let out_len = dst_h
        .checked_mul(dst_w)
        .and_then(|n| n.checked_mul(embed_dim))
        .filter(|&n| n > 0 && dst_h <= MAX_SIDE && dst_w <= MAX_SIDE)
        .ok_or_else(target_err)?;
    if (dst_h, dst_w) == (src_h, src_w) {
        return Ok(grid.to_vec());
    }
    let sy = torch_axis_scale(src_h, dst_h, interpolate_offset).ok_or_else(target_err)?;
    let sx = torch_axis_scale(src_w, dst_w, interpolate_offset).ok_or_else(target_err)?;
    let ytaps = torch_cubic_taps(src_h, dst_h, sy);
    let xtaps = torch_cubic_taps(src_w, dst_w, sx);

    // PyTorch's CPU kernel nests the sums this way round: x-interpolated rows, then y.
    let mut out = Vec::with_capacity(out_len);
    for (yi, yw) in &ytaps {
        for (xi, xw) in &xtaps {
            for c in 0..embed_dim {
                out.push(weighted_sum(yw, |r| {
                    weighted_sum(xw, |k| grid[(yi[r] * src_w + xi[k]) * embed_dim + c])
                }));
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// DPT head UV embedding
// ---------------------------------------------------------------------------------------------

/// `torch.linspace(start, end, steps, dtype=float32)` on CPU (scalar formula): the first half
/// counts up from `start`, the second half down from `end`.
fn linspace_f32(start: f64, end: f64, steps: usize) -> Vec<f32> {
    let (start, end) = (start as f32, end as f32);
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}

/// The DPT heads' UV position embedding for a `width x height` map whose image has the same
/// aspect ratio (`width / height`); see [`uv_embedding_with_aspect`].
pub fn uv_embedding(
    width: usize,
    height: usize,
    channels: usize,
) -> Result<Vec<f32>, PreprocessError> {
    uv_embedding_with_aspect(width, height, channels, width as f64 / height.max(1) as f64)
}

/// The DPT heads' UV sin/cos position embedding (`position_grid_to_embed(create_uv_grid(...))`)
/// for a `width x height` feature map of an image with aspect ratio `aspect_ratio` (the
/// official code passes the processed image's `W / H`, not the map's).
///
/// Layout: `[channels, height, width]`, channel-major, i.e. `out[(c * height + y) * width + x]`.
/// With `q = channels / 4` frequencies `w_j = 100^(-j / q)`, channel `c` is
/// `sin(u * w_c)` for `c < q`, `cos(u * w_(c - q))` for `c < 2q`, and likewise from `v` for
/// the second half. `u` spans `linspace(-sx (W-1)/W, sx (W-1)/W, W)` with
/// `sx = a / sqrt(a^2 + 1)`, `v` spans the same with `sy = 1 / sqrt(a^2 + 1)`.
///
/// The heads add `0.1 *` this to their feature maps; the 0.1 is not applied here.
///
/// # Errors
/// An empty map, a channel count that is not a positive multiple of 4 (the official code
/// asserts), or an aspect ratio that is not positive and finite.
pub fn uv_embedding_with_aspect(
    width: usize,
    height: usize,
    channels: usize,
    aspect_ratio: f64,
) -> Result<Vec<f32>, PreprocessError> {
    let len = width
        .checked_mul(height)
        .and_then(|n| n.checked_mul(channels))
        .ok_or(PreprocessError::TooLarge { width, height })?;
    let UvFactors { along_x, along_y } =
        uv_embedding_factors(width, height, channels, aspect_ratio)?;
    let mut out = Vec::with_capacity(len);
    for c in 0..channels {
        if c < channels / 2 {
            let row = &along_x[c * width..][..width];
            for _ in 0..height {
                out.extend_from_slice(row);
            }
        } else {
            for &p in &along_y[c * height..][..height] {
                out.extend(std::iter::repeat_n(p, width));
            }
        }
    }
    debug_assert_eq!(out.len(), len);
    Ok(out)
}

/// [`uv_embedding_with_aspect`] as its two factors: the first half of its channels varies only
/// along x and the second only along y, so the map is `along_x[c][x] + along_y[c][y]`.
/// `along_x` is `[channels, width]` and `along_y` `[channels, height]` (channel-major), each
/// zero in the other's half of the channels, so that two broadcast adds give the map's values
/// exactly without a `width x height x channels` array.
pub struct UvFactors {
    pub along_x: Vec<f32>,
    pub along_y: Vec<f32>,
}

/// The factors of [`uv_embedding_with_aspect`] (same arguments and errors).
pub fn uv_embedding_factors(
    width: usize,
    height: usize,
    channels: usize,
    aspect_ratio: f64,
) -> Result<UvFactors, PreprocessError> {
    if width == 0 || height == 0 {
        return Err(PreprocessError::EmptyImage { width, height });
    }
    if channels == 0 || !channels.is_multiple_of(4) {
        return Err(PreprocessError::UvChannels { channels });
    }
    if !(aspect_ratio.is_finite() && aspect_ratio > 0.0) {
        return Err(PreprocessError::UvAspect { aspect_ratio });
    }
    if width > MAX_SIDE || height > MAX_SIDE {
        return Err(PreprocessError::TooLarge { width, height });
    }

    let diag = (aspect_ratio * aspect_ratio + 1.0).powf(0.5);
    let (span_x, span_y) = (aspect_ratio / diag, 1.0 / diag);
    let coords = |span: f64, n: usize| {
        let edge = span * (n - 1) as f64 / n as f64;
        linspace_f32(-span * (n - 1) as f64 / n as f64, edge, n)
    };
    let u = coords(span_x, width);
    let v = coords(span_y, height);

    let quarter = channels / 4;
    let omega: Vec<f32> = (0..quarter)
        .map(|j| {
            let e = j as f32 / quarter as f32;
            1.0 / (100f64.powf(f64::from(e)) as f32)
        })
        .collect();
    // sin/cos of the f32 angle, rounded once: PyTorch's float kernels are accurate to ~1 ulp.
    let sin = |a: f32| f64::from(a).sin() as f32;
    let cos = |a: f32| f64::from(a).cos() as f32;

    let mut along_x = vec![0.0; channels * width];
    let mut along_y = vec![0.0; channels * height];
    for c in 0..channels {
        let (half, k) = (c / (2 * quarter), c % (2 * quarter));
        let (f, w): (fn(f32) -> f32, f32) = if k < quarter {
            (sin, omega[k])
        } else {
            (cos, omega[k - quarter])
        };
        let (coords, factor, n) = if half == 0 {
            (&u, &mut along_x, width)
        } else {
            (&v, &mut along_y, height)
        };
        for (out, &p) in factor[c * n..][..n].iter_mut().zip(coords) {
            *out = f(p * w);
        }
    }
    Ok(UvFactors { along_x, along_y })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/preprocess");

    fn fixture(name: &str) -> Vec<u8> {
        let path = format!("{FIXTURES}/{name}");
        std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read fixture {path}: {e}"))
    }

    /// Little-endian reader over a fixture file.
    struct Reader<'a> {
        buf: &'a [u8],
        pos: usize,
    }

    impl<'a> Reader<'a> {
        fn new(buf: &'a [u8]) -> Self {
            Self { buf, pos: 0 }
        }
        fn bytes(&mut self, n: usize) -> &'a [u8] {
            let s = &self.buf[self.pos..self.pos + n];
            self.pos += n;
            s
        }
        fn u32(&mut self) -> usize {
            u32::from_le_bytes(self.bytes(4).try_into().unwrap()) as usize
        }
        fn u64(&mut self) -> u64 {
            u64::from_le_bytes(self.bytes(8).try_into().unwrap())
        }
        fn f32(&mut self) -> f32 {
            f32::from_le_bytes(self.bytes(4).try_into().unwrap())
        }
        fn f64(&mut self) -> f64 {
            f64::from_le_bytes(self.bytes(8).try_into().unwrap())
        }
        fn f32s(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.f32()).collect()
        }
        fn done(&self) -> bool {
            self.pos == self.buf.len()
        }
    }

    /// FNV-1a 64, also computed by the fixture generator.
    fn fnv1a(data: &[u8]) -> u64 {
        data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    }

    /// The deterministic test image shared with the main project's parity tests.
    fn pattern(width: usize, height: usize) -> RgbImage8 {
        let mut data = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                for c in 0..3 {
                    let (x, y, c) = (x as f64, y as f64, c as f64);
                    let v = 128.0
                        + 100.0 * (0.043 * x + 0.7 * c).sin() * (0.031 * y - 0.4 * c).cos()
                        + 20.0 * (0.5 * (x + y)).sin();
                    data.push(v.round_ties_even().clamp(0.0, 255.0) as u8);
                }
            }
        }
        RgbImage8::new(width, height, data).unwrap()
    }

    /// Compares a uint8 result with OpenCV's. A one-level difference is accepted only at the
    /// near-ties the fixture lists (where IPP's float rounding decides); returns how many
    /// values differ there.
    fn compare_u8(case: &str, got: &[u8], expected: &[u8], ties: &[usize]) -> usize {
        assert_eq!(got.len(), expected.len(), "{case}: length");
        let mut at_ties = 0;
        for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
            if g != e {
                let tie = ties.binary_search(&i).is_ok();
                assert!(
                    tie && g.abs_diff(e) <= 1,
                    "{case}: value {i} is {g}, OpenCV gives {e} (near-tie: {tie})"
                );
                at_ties += 1;
            }
        }
        at_ties
    }

    #[test]
    fn resize_matches_cv2() {
        let buf = fixture("resize.bin");
        let mut r = Reader::new(&buf);
        let count = r.u32();
        for _ in 0..count {
            let kind = r.u32();
            let (sw, sh, dw, dh) = (r.u32(), r.u32(), r.u32(), r.u32());
            let input_digest = r.u64();
            let expected = r.bytes(dw * dh * 3);
            let ties: Vec<usize> = (0..r.u32()).map(|_| r.u32()).collect();
            let src = pattern(sw, sh);
            assert_eq!(
                fnv1a(&src.data),
                input_digest,
                "pattern {sw}x{sh} differs from numpy's"
            );
            let (name, got) = match kind {
                0 => ("cubic", resize_cubic(&src, dw, dh).unwrap()),
                1 => ("area", resize_area(&src, dw, dh).unwrap()),
                _ => panic!("unknown resize kind {kind}"),
            };
            assert_eq!((got.width, got.height), (dw, dh));
            let case = format!("{name} {sw}x{sh}->{dw}x{dh}");
            let off = compare_u8(&case, &got.data, expected, &ties);
            println!(
                "{case}: {off} of {} values off by one (near-ties: {})",
                expected.len(),
                ties.len()
            );
        }
        assert!(r.done());
    }

    #[test]
    fn preprocess_matches_official() {
        let buf = fixture("preprocess.bin");
        let mut r = Reader::new(&buf);
        let count = r.u32();
        for _ in 0..count {
            let (sw, sh, res, ow, oh) = (r.u32(), r.u32(), r.u32(), r.u32(), r.u32());
            let input_digest = r.u64();
            let output_digest = r.u64();
            let full = (r.u32() == 1).then(|| r.bytes(ow * oh * 3).to_vec());
            let ties: Vec<(usize, u8)> = (0..r.u32()).map(|_| (r.u32(), r.u32() as u8)).collect();
            let samples: Vec<(usize, f32)> = (0..r.u32()).map(|_| (r.u32(), r.f32())).collect();

            let case = format!("{sw}x{sh} @ {res}");
            let src = pattern(sw, sh);
            assert_eq!(
                fnv1a(&src.data),
                input_digest,
                "{case}: pattern differs from numpy's"
            );
            let out = preprocess(&src, res).unwrap();
            assert_eq!((out.width, out.height), (ow, oh), "{case}: processed size");
            assert_eq!(out.chw.len(), 3 * ow * oh);

            // Put OpenCV's values at the near-ties; the rest must then be identical.
            let mut patched = out.rgb8.data.clone();
            let mut off = Vec::new();
            for &(i, v) in &ties {
                let d = patched[i].abs_diff(v);
                assert!(
                    d <= 1,
                    "{case}: near-tie {i} is {}, OpenCV gives {v}",
                    patched[i]
                );
                if d > 0 {
                    off.push(i);
                }
                patched[i] = v;
            }
            assert_eq!(
                fnv1a(&patched),
                output_digest,
                "{case}: uint8 image differs"
            );
            if let Some(full) = full {
                let tie_idx: Vec<usize> = ties.iter().map(|t| t.0).collect();
                compare_u8(&case, &out.rgb8.data, &full, &tie_idx);
            }

            let (w, plane) = (ow, ow * oh);
            let mut err = 0f32;
            for &(i, v) in &samples {
                let (c, p) = (i / plane, i % plane);
                if off.binary_search(&(p * 3 + c)).is_err() {
                    err = err.max((out.chw[i] - v).abs());
                }
            }
            assert!(err <= 1e-6, "{case}: normalised max abs err {err}");
            println!(
                "{case} -> {ow}x{oh}: {} of {} values off by one at near-ties; \
                 normalised max abs err {err:e} on {} samples (row width {w})",
                off.len(),
                plane * 3,
                samples.len()
            );
        }
        assert!(r.done());
    }

    #[test]
    fn normalisation_is_exact_for_every_level() {
        let data: Vec<u8> = (0..=255u8).flat_map(|v| [v, v, v]).collect();
        let img = RgbImage8::new(256, 1, data).unwrap();
        let chw = normalize_chw(&img);
        let buf = fixture("normalize.bin");
        let mut r = Reader::new(&buf);
        let expected = r.f32s(3 * 256);
        assert!(r.done());
        assert_eq!(chw, expected);
    }

    #[test]
    fn plan_matches_official_sizes() {
        let plan = plan_resize(640, 427, 504).unwrap();
        assert_eq!((plan.width, plan.height), (504, 336));
        assert_eq!(
            plan.bound,
            Some(ResizeStep {
                width: 504,
                height: 336,
                interpolation: Interpolation::Area
            })
        );
        assert_eq!(plan.patch, None);
        // 504 is already the longest side: only the patch rounding (300 -> 294) remains.
        let plan = plan_resize(504, 300, 504).unwrap();
        assert_eq!(plan.bound, None);
        assert_eq!(
            plan.patch,
            Some(ResizeStep {
                width: 504,
                height: 294,
                interpolation: Interpolation::Area
            })
        );
        // 1000x200 at 112: 112x22, then 22 rounds up to 28, so the second resize is cubic.
        let plan = plan_resize(1000, 200, 112).unwrap();
        assert_eq!(
            plan.patch.map(|s| s.interpolation),
            Some(Interpolation::Cubic)
        );
        assert_eq!((plan.width, plan.height), (112, 28));
        // A tie (7 px above a multiple) rounds up.
        assert_eq!(plan_resize(500, 21, 500).unwrap().height, 28);
    }

    #[test]
    fn degenerate_inputs_are_errors() {
        let empty = RgbImage8 {
            width: 0,
            height: 5,
            data: Vec::new(),
            focal_length_35mm: None,
        };
        assert!(matches!(
            preprocess(&empty, 504),
            Err(PreprocessError::EmptyImage { .. })
        ));
        let img = pattern(20, 10);
        assert!(matches!(
            preprocess(&img, 13),
            Err(PreprocessError::ProcessResTooSmall { process_res: 13 })
        ));
        assert!(matches!(
            preprocess(&img, MAX_PROCESS_RES + 1),
            Err(PreprocessError::ProcessResTooLarge { process_res }) if process_res == 2049
        ));
        assert!(matches!(
            plan_resize(20, 10, 100_000),
            Err(PreprocessError::ProcessResTooLarge { .. })
        ));
        assert_eq!(plan_resize(640, 427, MAX_PROCESS_RES).unwrap().width, 2044);
        assert!(matches!(
            preprocess(&pattern(2000, 10), 504),
            Err(PreprocessError::TooThin { .. })
        ));
        let bad = RgbImage8 {
            width: 4,
            height: 4,
            data: vec![0; 10],
            focal_length_35mm: None,
        };
        assert!(matches!(
            preprocess(&bad, 504),
            Err(PreprocessError::BufferLength { .. })
        ));
        assert!(matches!(
            resize_cubic(&img, 0, 3),
            Err(PreprocessError::EmptyTarget { .. })
        ));
        assert!(resize_area(&bad, 2, 2).is_err());
        assert!(resample_pos_embed(&[0.0; 10], 2, 2, 2, 3, 3, 0.1).is_err());
        assert!(resample_pos_embed(&[0.0; 8], 2, 2, 2, 3, 3, 5.0).is_err());
        assert!(resample_pos_embed(&[0.0; 8], 2, 2, 2, 3, 3, f64::NAN).is_err());
        assert!(resample_pos_embed(&[0.0; 8], 2, 2, 2, 0, 3, 0.1).is_err());
        assert!(uv_embedding(4, 3, 6).is_err());
        assert!(uv_embedding(0, 3, 8).is_err());
        assert!(uv_embedding_with_aspect(4, 3, 8, f64::NAN).is_err());
        assert!(RgbImage8::new(usize::MAX, 2, Vec::new()).is_err());
    }

    #[test]
    fn pos_embed_matches_torch() {
        let buf = fixture("pos_embed.bin");
        let mut r = Reader::new(&buf);
        let (dim, sh, sw) = (r.u32(), r.u32(), r.u32());
        let grid = r.f32s(sh * sw * dim);
        let count = r.u32();
        for _ in 0..count {
            let (dh, dw, offset) = (r.u32(), r.u32(), r.f64());
            let expected = r.f32s(dh * dw * dim);
            let got = resample_pos_embed(&grid, dim, sh, sw, dh, dw, offset).unwrap();
            assert_eq!(got.len(), expected.len());
            let err = got
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(
                err < 1e-5,
                "{sh}x{sw} -> {dh}x{dw} (offset {offset}): max abs err {err}"
            );
            println!("pos_embed {sh}x{sw} -> {dh}x{dw} (offset {offset}): max abs err {err:e}");
        }
        assert!(r.done());
        // Same size: the official code returns the grid untouched.
        let same = resample_pos_embed(&grid, dim, sh, sw, sh, sw, 0.1).unwrap();
        assert_eq!(same, grid);
    }

    #[test]
    fn uv_factors_add_up_to_the_embedding() {
        for (w, h, ch, aspect) in [(7, 5, 8, 1.4), (36, 24, 32, 1.5), (5, 9, 4, 0.25)] {
            let full = uv_embedding_with_aspect(w, h, ch, aspect).unwrap();
            let UvFactors { along_x, along_y } = uv_embedding_factors(w, h, ch, aspect).unwrap();
            for c in 0..ch {
                for y in 0..h {
                    for x in 0..w {
                        let (ax, ay) = (along_x[c * w + x], along_y[c * h + y]);
                        // Each factor is zero in the other's half, so the sum is exact.
                        assert_eq!(if c < ch / 2 { ay } else { ax }, 0.0);
                        assert_eq!(ax + ay, full[(c * h + y) * w + x], "c {c} y {y} x {x}");
                    }
                }
            }
        }
        assert!(uv_embedding_factors(4, 3, 6, 1.0).is_err());
        assert!(uv_embedding_factors(0, 3, 8, 1.0).is_err());
        assert!(uv_embedding_factors(4, 3, 8, 0.0).is_err());
    }

    #[test]
    fn uv_embedding_matches_official() {
        let buf = fixture("uv.bin");
        let mut r = Reader::new(&buf);
        let count = r.u32();
        for _ in 0..count {
            let (w, h, ch, img_w, img_h) = (r.u32(), r.u32(), r.u32(), r.u32(), r.u32());
            let n = r.u32();
            let aspect = img_w as f64 / img_h as f64;
            let got = uv_embedding_with_aspect(w, h, ch, aspect).unwrap();
            assert_eq!(got.len(), w * h * ch);
            if (w, h) == (img_w, img_h) || w * img_h == h * img_w {
                assert_eq!(got, uv_embedding(w, h, ch).unwrap());
            }
            let pairs: Vec<(usize, f32)> = if n == 0 {
                r.f32s(w * h * ch).into_iter().enumerate().collect()
            } else {
                (0..n).map(|_| (r.u32(), r.f32())).collect()
            };
            let err = pairs
                .iter()
                .map(|&(i, v)| (got[i] - v).abs())
                .fold(0f32, f32::max);
            assert!(
                err < 1e-6,
                "{w}x{h}x{ch} (image {img_w}x{img_h}): max abs err {err}"
            );
            println!(
                "uv {w}x{h}x{ch} (image {img_w}x{img_h}): max abs err {err:e} on {} values",
                pairs.len()
            );
        }
        assert!(r.done());
    }

    #[test]
    fn load_image_decodes_png() {
        let path = PathBuf::from(format!("{FIXTURES}/tiny.png"));
        let img = load_image(&path).unwrap();
        assert_eq!((img.width, img.height), (7, 5));
        assert_eq!(img.data, pattern(7, 5).data);
    }

    #[test]
    fn load_image_reports_bad_files() {
        let corrupt = PathBuf::from(format!("{FIXTURES}/corrupt.png"));
        let err = load_image(&corrupt).unwrap_err();
        assert!(matches!(err, PreprocessError::Decode { .. }), "{err}");
        assert!(err.to_string().contains("corrupt.png"), "{err}");

        let missing = PathBuf::from(format!("{FIXTURES}/does-not-exist.png"));
        let err = load_image(&missing).unwrap_err();
        assert!(matches!(err, PreprocessError::Open { .. }), "{err}");
        assert!(err.to_string().contains("does-not-exist.png"), "{err}");

        let dir = PathBuf::from(FIXTURES);
        assert!(load_image(&dir).is_err());
    }
}
#[cfg(test)]
mod thread_tests {
    use super::*;

    /// Area resizes in bands of rows give the same bytes on any number of threads, for
    /// integer factors (the block sums) and others (the coverage weights), with band heights
    /// that do not divide the output.
    #[test]
    fn area_resizes_do_not_depend_on_the_threads() {
        let image = |w: usize, h: usize| RgbImage8 {
            width: w,
            height: h,
            data: (0..w * h * 3)
                .map(|i| ((i * 37 + i / 7) % 251) as u8)
                .collect(),
            focal_length_35mm: None,
        };
        for (src, (w, h)) in [
            (image(96, 72), (12, 9)),
            (image(64, 48), (32, 24)),
            (image(640, 427), (504, 336)),
            (image(101, 77), (40, 31)),
        ] {
            let one = resize_area_threads(&src, w, h, 1).unwrap();
            for threads in [2, 3, 7, 100] {
                assert_eq!(
                    resize_area_threads(&src, w, h, threads).unwrap(),
                    one,
                    "{threads}"
                );
            }
        }
    }
}
