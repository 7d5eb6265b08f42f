//! Depth Anything V2's preprocessing, as its `image2tensor` does it: the RGB image divided by
//! 255 (float), one `cv2.resize(..., INTER_CUBIC)` to the `Resize(input_size, input_size,
//! keep_aspect_ratio=True, ensure_multiple_of=14, resize_method="lower_bound")` size, then the
//! ImageNet normalisation in float64, stored as float32. Unlike DA3's `InputProcessor` there is
//! no intermediate 8-bit image and no area filter, even when shrinking.

use super::{
    check_process_res, cubic_values, rgb_len, PreprocessError, ProcessedImage, RgbImage8, CN,
    IMAGENET_MEAN, IMAGENET_STD, MAX_PROCESS_RES, PATCH_SIZE,
};

/// The processed size of a `width` x `height` image: the scale that brings the shortest side
/// to `input_size` applied to both sides, each side then rounded to the nearest multiple of 14
/// (half to even, as `np.round`) and raised to the next one where that falls below
/// `input_size` (DA2's `constrain_to_multiple_of` with `min_val`).
///
/// # Errors
/// An empty or oversized image, `input_size` outside 14..=2048, or a longest side beyond four
/// times that bound (a very thin image).
pub fn da2_processed_size(
    width: usize,
    height: usize,
    input_size: usize,
) -> Result<(usize, usize), PreprocessError> {
    rgb_len(width, height)?;
    check_process_res(input_size)?;
    let scale_w = input_size as f64 / width as f64;
    let scale_h = input_size as f64 / height as f64;
    // "lower_bound": the larger scale, so that neither side ends below input_size.
    let scale = if scale_w > scale_h { scale_w } else { scale_h };
    let m = PATCH_SIZE as f64;
    let side = |s: usize| {
        let x = scale * s as f64;
        let y = (x / m).round_ties_even() * m;
        let y = if y < input_size as f64 {
            (x / m).ceil() * m
        } else {
            y
        };
        y as usize
    };
    let (w, h) = (side(width), side(height));
    if w.max(h) > 4 * MAX_PROCESS_RES {
        return Err(PreprocessError::ProcessResTooLarge {
            process_res: w.max(h),
        });
    }
    Ok((w, h))
}

/// DA2's `image2tensor` for one image at `input_size` (518 in the official `infer_image`).
///
/// # Errors
/// An invalid image ([`RgbImage8::validate`]) or any error of [`da2_processed_size`].
pub fn preprocess_da2(
    img: &RgbImage8,
    input_size: usize,
) -> Result<ProcessedImage, PreprocessError> {
    img.validate()?;
    let (width, height) = da2_processed_size(img.width, img.height, input_size)?;
    // The filter is linear: filtering 0..255 and dividing by 255 afterwards equals filtering
    // v / 255 up to f64 rounding.
    let values = cubic_values(img, width, height);
    let plane = width * height;
    let mut chw = vec![0f32; plane * CN];
    for (c, out) in chw.chunks_exact_mut(plane).enumerate() {
        let (mean, std) = (f64::from(IMAGENET_MEAN[c]), f64::from(IMAGENET_STD[c]));
        for (o, px) in out.iter_mut().zip(values.chunks_exact(CN)) {
            *o = ((px[c] / 255.0 - mean) / std) as f32;
        }
    }
    let data = values
        .iter()
        .map(|v| v.round_ties_even().clamp(0.0, 255.0) as u8)
        .collect();
    Ok(ProcessedImage {
        width,
        height,
        chw,
        rgb8: RgbImage8 {
            width,
            height,
            data,
            focal_length_35mm: None,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sizes DA2's `Resize` gives, worked out by hand from its Python.
    #[test]
    fn sizes_follow_the_official_lower_bound_rule() {
        // 640x480: scale 518/480; width 690.67 -> 49.33 patches -> 686; height exactly 518
        // (37 patches).
        assert_eq!(da2_processed_size(640, 480, 518).unwrap(), (686, 518));
        // Portrait: the width is the short side.
        assert_eq!(da2_processed_size(480, 640, 518).unwrap(), (518, 686));
        // 640x427: height 518 = 37 patches; width 776.39 -> 55.46 -> 55 patches = 770.
        assert_eq!(da2_processed_size(640, 427, 518).unwrap(), (770, 518));
        // A short side that rounds below the bound is raised to the next multiple: 196 from
        // a 100x100 image is 14 patches exactly; 200 gives 14.29 -> 14 -> 196 < 200 -> 15.
        assert_eq!(da2_processed_size(100, 100, 196).unwrap(), (196, 196));
        assert_eq!(da2_processed_size(100, 100, 200).unwrap(), (210, 210));
        // A large image shrinks to the bound too.
        assert_eq!(da2_processed_size(4000, 3000, 518).unwrap(), (686, 518));
        assert!(da2_processed_size(0, 10, 518).is_err());
        assert!(da2_processed_size(10, 10, 7).is_err());
        // 20000x10: the long side would be 1,035,916 pixels.
        assert!(matches!(
            da2_processed_size(20000, 10, 518),
            Err(PreprocessError::ProcessResTooLarge { .. })
        ));
    }

    /// A uniform image stays uniform, normalised as the official float pipeline does.
    #[test]
    fn a_uniform_image_normalises_exactly() {
        let img = RgbImage8::new(30, 20, [200u8, 100, 50].repeat(600)).unwrap();
        let out = preprocess_da2(&img, 28).unwrap();
        assert_eq!((out.width, out.height), (42, 28));
        let plane = out.width * out.height;
        for (c, v) in [200.0f64, 100.0, 50.0].iter().enumerate() {
            let expected =
                ((v / 255.0 - f64::from(IMAGENET_MEAN[c])) / f64::from(IMAGENET_STD[c])) as f32;
            let channel = &out.chw[c * plane..(c + 1) * plane];
            assert!(channel.iter().all(|&x| (x - expected).abs() <= 1e-6));
        }
        assert!(out.rgb8.data.chunks_exact(3).all(|p| p == [200, 100, 50]));
    }
}
