//! Reading image files and bytes into [`RgbImage8`]: format sniffing, limits checked before
//! pixels are decoded, truncation caught, the EXIF orientation (and, for the metric model, the
//! EXIF 35 mm focal length) read.

use super::{PreprocessError, RgbImage8};
use std::path::Path;

/// Most pixels [`load_image`] decodes (50 megapixels, e.g. 8660 x 5773): a larger image is
/// refused from its header, before any pixel memory is allocated.
pub const MAX_IMAGE_PIXELS: u64 = 50_000_000;
/// Longest side [`load_image`] decodes.
pub const MAX_IMAGE_SIDE: u32 = 32_768;
/// Most memory the image decoder may allocate at once, decoded pixels included (a 50 Mpx
/// 16-bit RGBA PNG needs 400 MB).
pub const MAX_DECODE_BYTES: u64 = 1 << 30;
/// Largest image file [`load_image`] reads.
pub const MAX_IMAGE_FILE_BYTES: u64 = 1 << 30;

/// Decodes an image file (PNG, JPEG, WebP, TIFF, BMP or GIF's first frame; the format sniffed
/// from the content like PIL does) to RGB8, upright as its EXIF orientation says.
///
/// Alpha is dropped (not composited) and grey is replicated, as PIL's `convert("RGB")` does;
/// 8-bit PNGs (RGB, RGBA, grey, palette) decode exactly as PIL decodes them. Known deviations
/// from the official PIL loader: JPEGs are decoded by the `image` crate rather than
/// libjpeg-turbo, so pixels differ by up to a few levels (IDCT and chroma upsampling differ);
/// 16-bit PNGs are reduced to 8 bits differently; the EXIF orientation is applied (a phone's
/// portrait photo is upright), which the official loader does not do.
///
/// Limits, checked before pixels are decoded: [`MAX_IMAGE_FILE_BYTES`], [`MAX_IMAGE_SIDE`],
/// [`MAX_IMAGE_PIXELS`], and [`MAX_DECODE_BYTES`] of decoder memory. A JPEG without its
/// end-of-image marker (a truncated file, which the decoder would fill in with grey) is an
/// error, as is a PNG that ends early or fails a CRC check.
///
/// # Errors
/// [`PreprocessError::Open`], [`PreprocessError::Decode`] or
/// [`PreprocessError::ImageTooLarge`], naming the path and the cause.
pub fn load_image(path: impl AsRef<Path>) -> Result<RgbImage8, PreprocessError> {
    load_image_with(path, &ReadOptions::default())
}

/// How [`load_image_with`] and [`decode_image_with`] read an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    /// Turn the image upright as its EXIF orientation says (default `true`; `false` reads the
    /// stored pixels as the official PIL loader does).
    pub apply_orientation: bool,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            apply_orientation: true,
        }
    }
}

/// [`load_image`] with [`ReadOptions`].
///
/// # Errors
/// As [`load_image`].
pub fn load_image_with(
    path: impl AsRef<Path>,
    options: &ReadOptions,
) -> Result<RgbImage8, PreprocessError> {
    use std::io::Read;
    let path = path.as_ref();
    let open_err = |source| PreprocessError::Open {
        path: path.to_path_buf(),
        source,
    };
    let decode_err = |reason: String| PreprocessError::Decode {
        path: path.to_path_buf(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if meta.is_dir() {
        return Err(open_err(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a directory",
        )));
    }
    if meta.len() > MAX_IMAGE_FILE_BYTES {
        return Err(decode_err(format!(
            "the file is {} bytes, more than the limit of {MAX_IMAGE_FILE_BYTES}",
            meta.len()
        )));
    }
    let mut bytes = Vec::new();
    file.take(MAX_IMAGE_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(open_err)?;
    decode_bytes(&bytes, path, options)
}

/// Decodes image bytes (format sniffed from the content) as [`load_image`] decodes a
/// file, with the same limits; errors name the path `<memory>`.
pub fn decode_image(bytes: &[u8]) -> Result<RgbImage8, PreprocessError> {
    decode_image_with(bytes, &ReadOptions::default())
}

/// [`decode_image`] with [`ReadOptions`].
///
/// # Errors
/// As [`decode_image`].
pub fn decode_image_with(
    bytes: &[u8],
    options: &ReadOptions,
) -> Result<RgbImage8, PreprocessError> {
    let path = Path::new("<memory>");
    if bytes.len() as u64 > MAX_IMAGE_FILE_BYTES {
        return Err(PreprocessError::Decode {
            path: path.to_path_buf(),
            reason: format!(
                "the image is {} bytes, more than the limit of {MAX_IMAGE_FILE_BYTES}",
                bytes.len()
            ),
        });
    }
    decode_bytes(bytes, path, options)
}

fn decode_bytes(
    bytes: &[u8],
    path: &Path,
    options: &ReadOptions,
) -> Result<RgbImage8, PreprocessError> {
    use image::ImageDecoder;
    let open_err = |source| PreprocessError::Open {
        path: path.to_path_buf(),
        source,
    };
    let decode_err = |reason: String| PreprocessError::Decode {
        path: path.to_path_buf(),
        reason,
    };
    let mut reader = image::ImageReader::new(std::io::Cursor::new(bytes))
        .with_guessed_format()
        .map_err(open_err)?;
    let format = reader.format();
    if format == Some(image::ImageFormat::Jpeg) && !jpeg_has_end_marker(bytes) {
        return Err(decode_err(
            "JPEG: no end-of-image marker after the image data (the file is truncated)".into(),
        ));
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_IMAGE_SIDE);
    limits.max_image_height = Some(MAX_IMAGE_SIDE);
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let described = |e: image::ImageError| decode_err(describe_image_error(format, &e));
    let mut decoder = reader.into_decoder().map_err(|e| match &e {
        image::ImageError::Limits(_) => PreprocessError::ImageTooLarge {
            path: path.to_path_buf(),
            reason: format!("a side exceeds the limit of {MAX_IMAGE_SIDE} px"),
        },
        _ => described(e),
    })?;
    let (width, height) = decoder.dimensions();
    if u64::from(width) * u64::from(height) > MAX_IMAGE_PIXELS {
        return Err(PreprocessError::ImageTooLarge {
            path: path.to_path_buf(),
            reason: format!(
                "{width}x{height} is {} pixels, more than the limit of {MAX_IMAGE_PIXELS}",
                u64::from(width) * u64::from(height)
            ),
        });
    }
    // A phone's portrait photo is stored sideways with an EXIF orientation; upright is what
    // the user sees and means (the official loader, PIL without `exif_transpose`, ignores it).
    let orientation = match options.apply_orientation {
        true => decoder
            .orientation()
            .unwrap_or(image::metadata::Orientation::NoTransforms),
        false => image::metadata::Orientation::NoTransforms,
    };
    // Metadata that cannot be read is no focal length, not a failure to decode the pixels.
    let focal_length_35mm = decoder
        .exif_metadata()
        .ok()
        .flatten()
        .and_then(|exif| crate::da3::metric::exif_focal_length_35mm(&exif));
    let mut decoded = image::DynamicImage::from_decoder(decoder).map_err(described)?;
    decoded.apply_orientation(orientation);
    let rgb = decoded.into_rgb8();
    let (width, height) = (rgb.width() as usize, rgb.height() as usize);
    Ok(RgbImage8 {
        focal_length_35mm,
        ..RgbImage8::new(width, height, rgb.into_raw())?
    })
}

/// Whether a JPEG stream has its end-of-image marker (`FF D9`) after the start of its first
/// scan. The header segments before the scan are skipped by their lengths (an EXIF thumbnail
/// has a marker of its own); inside entropy-coded data an `FF` byte is always followed by
/// `00` or a restart marker, so `FF D9` there can only be the real end.
fn jpeg_has_end_marker(bytes: &[u8]) -> bool {
    let mut pos = 2; // after SOI
    loop {
        let Some(&[0xFF, marker]) = bytes.get(pos..pos + 2) else {
            return false;
        };
        match marker {
            0xFF => pos += 1, // fill byte
            0xD0..=0xD9 | 0x01 => pos += 2,
            _ => {
                let Some(&[hi, lo]) = bytes.get(pos + 2..pos + 4) else {
                    return false;
                };
                let len = usize::from(u16::from_be_bytes([hi, lo]));
                pos += 2 + len;
                if marker == 0xDA {
                    break; // start of scan: entropy-coded data follows
                }
            }
        }
    }
    bytes
        .get(pos..)
        .is_some_and(|rest| rest.windows(2).any(|w| w == [0xFF, 0xD9]))
}

/// One line for a decoder error: the format, then the innermost cause, with the PNG decoder's
/// `ChunkType { type: IHDR, .. }` debug output reduced to the chunk's name.
fn describe_image_error(format: Option<image::ImageFormat>, error: &image::ImageError) -> String {
    let mut innermost: &dyn std::error::Error = error;
    while let Some(source) = innermost.source() {
        innermost = source;
    }
    let mut text = innermost.to_string();
    while let Some(start) = text.find("ChunkType { type: ") {
        let rest = &text[start + "ChunkType { type: ".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let end = text[start..]
            .find('}')
            .map_or(text.len(), |e| start + e + 1);
        text.replace_range(start..end, &name);
    }
    match format {
        _ if matches!(error, image::ImageError::Unsupported(_)) => text,
        Some(image::ImageFormat::Png) => format!("PNG: {text}"),
        Some(image::ImageFormat::Jpeg) => format!("JPEG: {text}"),
        Some(other) => format!("{other:?}: {text}"),
        None => text,
    }
}
