//! Metric depth in metres from a metric model (DA3METRIC-LARGE).
//!
//! The metric model predicts depth normalised by the focal length: the official README says
//! "to obtain metric depth in meters from `DA3METRIC-LARGE`, use
//! `metric_depth = focal * net_output / 300.`, where `focal` is the focal length in pixels
//! (typically the average of fx and fy from the camera intrinsic matrix K)", and the official
//! nested model applies exactly that (`apply_metric_scaling`, `utils/alignment.py` of
//! depth-anything-3 0.1.1) with the intrinsics of the processed image. So here the focal is
//! `(fx + fy) / 2` in pixels of the *processed* image, taken from the first of:
//!
//! 1. the given intrinsics: the request's known poses, or [`Focal::Intrinsics`] (pixels of the
//!    input image, brought to the processed image as preprocessing resizes and crops it);
//! 2. [`Focal::Pixels`]: a focal length in pixels of the input image, brought over likewise;
//! 3. [`Focal::Fov`]: a horizontal field of view, `f = (w / 2) / tan(fov / 2)` for the
//!    processed width `w`;
//! 4. the image's EXIF 35 mm-equivalent focal length ([`crate::Image::focal_length_35mm`]):
//!    `f = f35 / 36 * max(width, height)` in pixels of the input image (the long-side
//!    convention, see [`focal_from_35mm`]), brought over as in 2;
//! 5. else a horizontal field of view of [`DEFAULT_HORIZONTAL_FOV_DEGREES`], with a warning.
//!
//! The depth is scaled after the official sky fill (a scale commutes with it), and the
//! prediction records the focal and its source ([`Prediction::metric_focal`]): the 3D exports
//! place points with that focal, so their `z` is the metric depth.

use super::outputs::Prediction;
use super::poses::{self, KnownPose, Mat3};
use super::preprocess::{ResizePlan, RgbImage8};
use super::Error;

/// The official `apply_metric_scaling` divisor of the focal length (pixels): metric depth is
/// `focal / 300` times the metric model's output.
pub const FOCAL_UNIT: f32 = 300.0;

/// The horizontal field of view assumed when nothing gives the focal length: between a
/// phone's main camera (26 mm equivalent: 69 degrees across the long side) and a "normal"
/// 50 mm equivalent lens (40 degrees). A guess, hence the warning.
pub const DEFAULT_HORIZONTAL_FOV_DEGREES: f64 = 60.0;

/// The long side of the 35 mm film frame (36 x 24 mm), in millimetres.
const FILM_LONG_SIDE_MM: f64 = 36.0;

/// How a request gives the focal length that brings a metric model's output to metres
/// ([`crate::Request::focal`]); other models ignore it.
#[derive(Debug, Clone, PartialEq)]
pub enum Focal {
    /// Every view's intrinsics (3x3, pixels of that input image), one per view; the focal is
    /// the mean of `fx` and `fy` after preprocessing.
    Intrinsics(Vec<Mat3>),
    /// The focal length in pixels of the input images (every view).
    Pixels(f64),
    /// The horizontal field of view in degrees (every view).
    Fov(f64),
}

/// Where the focal length of a metric prediction came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FocalSource {
    /// The request's known poses or [`Focal::Intrinsics`].
    Intrinsics,
    /// [`Focal::Pixels`].
    Pixels,
    /// [`Focal::Fov`].
    Fov,
    /// The image's EXIF 35 mm-equivalent focal length (the value in millimetres).
    Exif35mm(u16),
    /// Nothing gave it: [`DEFAULT_HORIZONTAL_FOV_DEGREES`] was assumed.
    Default,
}

impl std::fmt::Display for FocalSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FocalSource::Intrinsics => write!(f, "given intrinsics"),
            FocalSource::Pixels => write!(f, "given focal length"),
            FocalSource::Fov => write!(f, "given field of view"),
            FocalSource::Exif35mm(mm) => write!(f, "EXIF 35 mm-equivalent focal length {mm} mm"),
            FocalSource::Default => write!(
                f,
                "assumed {DEFAULT_HORIZONTAL_FOV_DEGREES} degree horizontal field of view"
            ),
        }
    }
}

/// The focal length that brought a metric model's output to metres.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricFocal {
    /// Pixels of the prediction's image (`(fx + fy) / 2`).
    pub pixels: f32,
    /// Where it came from.
    pub source: FocalSource,
}

/// What the depth values of a prediction measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DepthUnit {
    /// A scale of the model's choosing (any-view and mono models, raw outputs).
    #[default]
    Relative,
    /// Metres: a metric model at its focal length, or the nested model.
    Metres,
    /// The units of the known cameras' translations (any-view models aligned to them).
    KnownCameras,
    /// Not a depth: Depth Anything V2's relative output, a disparity (larger is nearer) known
    /// up to a scale and a shift.
    Disparity,
}

impl DepthUnit {
    /// The name written into outputs (`relative`, `metres`, `known_cameras`).
    pub fn name(self) -> &'static str {
        match self {
            DepthUnit::Relative => "relative",
            DepthUnit::Metres => "metres",
            DepthUnit::KnownCameras => "known_cameras",
            DepthUnit::Disparity => "relative_disparity",
        }
    }
}

impl std::fmt::Display for DepthUnit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The focal length in pixels of a `width` x `height` image from its 35 mm-equivalent focal
/// length `f35_mm`: `f35 / 36 * max(width, height)`. The image's long side stands for the
/// film frame's 36 mm long side (as OpenSfM reads the tag). The standard defines the
/// equivalence by the diagonal, which gives the same for 3:2 images and about 4 % more for
/// 4:3 ones; the long side is what a camera's field of view is usually quoted across.
pub fn focal_from_35mm(f35_mm: f64, width: usize, height: usize) -> f64 {
    f35_mm / FILM_LONG_SIDE_MM * width.max(height) as f64
}

/// The focal length of a horizontal field of view `degrees` for an image `width` wide.
pub fn focal_from_fov(degrees: f64, width: usize) -> f64 {
    (width as f64 / 2.0) / (degrees.to_radians() / 2.0).tan()
}

/// Refuses a focal no camera has, before anything is computed.
pub(crate) fn check_focal(focal: &Focal, views: usize) -> Result<(), Error> {
    let positive = |f: f64| f.is_finite() && f > 0.0;
    match focal {
        Focal::Pixels(f) if !positive(*f) => Err(Error::Input(format!(
            "focal length {f} px: a focal length is a positive number of pixels"
        ))),
        Focal::Fov(deg) if !(deg.is_finite() && *deg > 0.0 && *deg < 180.0) => Err(Error::Input(
            format!("field of view {deg} degrees: it is between 0 and 180"),
        )),
        Focal::Intrinsics(list) if list.len() != views => Err(Error::Input(format!(
            "{} intrinsics for {views} view(s): give one per view",
            list.len()
        ))),
        Focal::Intrinsics(list) => match list
            .iter()
            .position(|k| !positive(k[0][0]) || !positive(k[1][1]))
        {
            Some(i) => Err(Error::Input(format!(
                "the intrinsics of view {i} have a focal length that is not positive"
            ))),
            None => Ok(()),
        },
        _ => Ok(()),
    }
}

/// The focal length of view `image` (preprocessed by `plan`) in pixels of the processed
/// image, by the precedence of the module docs; `None` when nothing gives it.
pub(crate) fn processed_focal(
    image: &RgbImage8,
    plan: &ResizePlan,
    known: Option<&KnownPose>,
    focal: Option<&Focal>,
    view: usize,
) -> Option<MetricFocal> {
    let (w, h) = (image.width, image.height);
    let centred = |f: f64| {
        [
            [f, 0.0, w as f64 / 2.0],
            [0.0, f, h as f64 / 2.0],
            [0.0, 0.0, 1.0],
        ]
    };
    let processed = |k: &Mat3| {
        let k = poses::processed_intrinsics(k, w, h, plan);
        ((k[0][0] + k[1][1]) / 2.0) as f32
    };
    let found = |pixels: f32, source: FocalSource| Some(MetricFocal { pixels, source });
    if let Some(pose) = known {
        return found(processed(&pose.intrinsics), FocalSource::Intrinsics);
    }
    match focal {
        Some(Focal::Intrinsics(list)) => found(processed(&list[view]), FocalSource::Intrinsics),
        Some(Focal::Pixels(f)) => found(processed(&centred(*f)), FocalSource::Pixels),
        Some(Focal::Fov(deg)) => found(focal_from_fov(*deg, plan.width) as f32, FocalSource::Fov),
        None => image.focal_length_35mm.map(|mm| MetricFocal {
            pixels: processed(&centred(focal_from_35mm(f64::from(mm), w, h))),
            source: FocalSource::Exif35mm(mm),
        }),
    }
}

/// Brings a metric model's post-processed views to metres: each view's depth times
/// `focal / 300` ([`processed_focal`], else the default field of view with a warning naming
/// the views and how to give the focal).
pub(crate) fn to_metres(
    views: &mut [Prediction],
    images: &[RgbImage8],
    names: impl Fn(usize) -> String,
    plans: &[ResizePlan],
    known: Option<&[KnownPose]>,
    focal: Option<&Focal>,
) {
    let mut assumed = Vec::new();
    for (i, view) in views.iter_mut().enumerate() {
        let given = processed_focal(&images[i], &plans[i], known.map(|k| &k[i]), focal, i);
        let focal = given.unwrap_or_else(|| {
            assumed.push(names(i));
            MetricFocal {
                pixels: focal_from_fov(DEFAULT_HORIZONTAL_FOV_DEGREES, plans[i].width) as f32,
                source: FocalSource::Default,
            }
        });
        // As the official `apply_metric_scaling`: the factor first, then the product.
        let factor = focal.pixels / FOCAL_UNIT;
        for d in &mut view.depth {
            *d *= factor;
        }
        view.metric_focal = Some(focal);
        view.depth_unit = DepthUnit::Metres;
    }
    if !assumed.is_empty() {
        log::warn!(
            "{}: no focal length given and no EXIF 35 mm focal length in the image; metric \
             depth assumes a {DEFAULT_HORIZONTAL_FOV_DEGREES} degree horizontal field of view \
             and scales with the focal: give it (da3: --focal PX of the input image, or --fov \
             DEGREES; library: Request::focal)",
            assumed.join(", ")
        );
    }
}

/// FocalLengthIn35mmFilm, in the Exif sub-IFD.
const TAG_FOCAL_35MM: u16 = 0xA405;
/// The pointer from IFD0 to the Exif sub-IFD.
const TAG_EXIF_IFD: u16 = 0x8769;
/// More entries than any real IFD holds: a corrupt count, not read.
const MAX_IFD_ENTRIES: usize = 1024;

/// The FocalLengthIn35mmFilm tag (0xA405, millimetres) of a raw EXIF block (a TIFF header
/// and its IFDs, optionally after `Exif\0\0`, as `image`'s `exif_metadata` returns), looked
/// for in the Exif sub-IFD and then in IFD0. `None` when it is absent, zero ("unknown", as the
/// standard says) or the block is malformed.
pub fn exif_focal_length_35mm(exif: &[u8]) -> Option<u16> {
    let tiff = exif.strip_prefix(b"Exif\0\0").unwrap_or(exif);
    let little = match tiff.get(..4)? {
        [b'I', b'I', 42, 0] => true,
        [b'M', b'M', 0, 42] => false,
        _ => return None,
    };
    let u16_at = |at: usize| -> Option<u16> {
        let b: [u8; 2] = tiff.get(at..at.checked_add(2)?)?.try_into().ok()?;
        Some(if little {
            u16::from_le_bytes(b)
        } else {
            u16::from_be_bytes(b)
        })
    };
    let u32_at = |at: usize| -> Option<u32> {
        let b: [u8; 4] = tiff.get(at..at.checked_add(4)?)?.try_into().ok()?;
        Some(if little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    };
    // The value of `tag` in the IFD at `ifd`: (type, the 4-byte value field's offset).
    let entry = |ifd: usize, tag: u16| -> Option<(u16, usize)> {
        let count = usize::from(u16_at(ifd)?);
        if count > MAX_IFD_ENTRIES {
            return None;
        }
        (0..count)
            .map(|i| ifd + 2 + 12 * i)
            .find(|&at| u16_at(at) == Some(tag))
            .and_then(|at| Some((u16_at(at + 2)?, at + 8)))
    };
    // SHORT as the standard says; LONG from writers that widen it.
    const SHORT: u16 = 3;
    const LONG: u16 = 4;
    let value = |(kind, at): (u16, usize)| -> Option<u16> {
        match kind {
            SHORT => u16_at(at),
            LONG => u32_at(at).and_then(|v| u16::try_from(v).ok()),
            _ => None,
        }
    };
    let ifd0 = usize::try_from(u32_at(4)?).ok()?;
    let exif_ifd = entry(ifd0, TAG_EXIF_IFD)
        .and_then(|(_, at)| u32_at(at))
        .and_then(|offset| usize::try_from(offset).ok());
    exif_ifd
        .and_then(|ifd| entry(ifd, TAG_FOCAL_35MM))
        .or_else(|| entry(ifd0, TAG_FOCAL_35MM))
        .and_then(value)
        .filter(|&mm| mm > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TIFF block: IFD0 with `ifd0` entries and, when `exif` has entries, a pointer to a
    /// sub-IFD holding them; each entry (tag, type, value) with the value left-justified.
    fn tiff(little: bool, ifd0: &[(u16, u16, u32)], exif: &[(u16, u16, u32)]) -> Vec<u8> {
        let u16b = |v: u16| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let u32b = |v: u32| {
            if little {
                v.to_le_bytes()
            } else {
                v.to_be_bytes()
            }
        };
        let mut out = Vec::new();
        out.extend_from_slice(if little { b"II" } else { b"MM" });
        out.extend_from_slice(&u16b(42));
        out.extend_from_slice(&u32b(8));
        let mut first: Vec<(u16, u16, u32)> = ifd0.to_vec();
        let exif_at = 8 + 2 + 12 * (first.len() + 1) + 4;
        if !exif.is_empty() {
            first.push((TAG_EXIF_IFD, LONG_TYPE, exif_at as u32));
        }
        let ifd = |out: &mut Vec<u8>, entries: &[(u16, u16, u32)]| {
            out.extend_from_slice(&u16b(entries.len() as u16));
            for &(tag, kind, v) in entries {
                out.extend_from_slice(&u16b(tag));
                out.extend_from_slice(&u16b(kind));
                out.extend_from_slice(&u32b(1));
                match kind {
                    3 => {
                        out.extend_from_slice(&u16b(v as u16));
                        out.extend_from_slice(&[0, 0]);
                    }
                    _ => out.extend_from_slice(&u32b(v)),
                }
            }
            out.extend_from_slice(&u32b(0));
        };
        ifd(&mut out, &first);
        if !exif.is_empty() {
            assert_eq!(out.len(), exif_at);
            ifd(&mut out, exif);
        }
        out
    }
    const LONG_TYPE: u16 = 4;

    #[test]
    fn the_35mm_focal_is_read_from_the_exif_ifd_in_both_byte_orders() {
        for little in [true, false] {
            let block = tiff(
                little,
                &[(0x0112, 3, 6)],
                &[(0x829A, 5, 0), (TAG_FOCAL_35MM, 3, 26)],
            );
            assert_eq!(exif_focal_length_35mm(&block), Some(26), "little {little}");
            let mut prefixed = b"Exif\0\0".to_vec();
            prefixed.extend_from_slice(&block);
            assert_eq!(exif_focal_length_35mm(&prefixed), Some(26));
        }
        // In IFD0, as a LONG.
        let block = tiff(true, &[(TAG_FOCAL_35MM, 4, 50)], &[]);
        assert_eq!(exif_focal_length_35mm(&block), Some(50));
    }

    #[test]
    fn an_absent_zero_or_malformed_focal_is_none() {
        assert_eq!(
            exif_focal_length_35mm(&tiff(true, &[(0x0112, 3, 1)], &[])),
            None
        );
        let zero = tiff(false, &[], &[(TAG_FOCAL_35MM, 3, 0)]);
        assert_eq!(exif_focal_length_35mm(&zero), None);
        let good = tiff(true, &[], &[(TAG_FOCAL_35MM, 3, 28)]);
        // Cut anywhere before the end of the value (the entry's last 2 bytes and the next-IFD
        // offset follow it).
        for cut in 0..good.len() - 6 {
            assert_eq!(exif_focal_length_35mm(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(exif_focal_length_35mm(b"not exif at all"), None);
        // A wrong type (ASCII) is not a focal length.
        let ascii = tiff(true, &[], &[(TAG_FOCAL_35MM, 2, 28)]);
        assert_eq!(exif_focal_length_35mm(&ascii), None);
    }

    #[test]
    fn the_focal_conventions() {
        // 36 mm equivalent on the long side: the focal equals the long side.
        assert_eq!(focal_from_35mm(36.0, 4032, 3024), 4032.0);
        assert_eq!(focal_from_35mm(18.0, 3000, 4000), 2000.0);
        // 90 degrees across: half the width.
        assert!((focal_from_fov(90.0, 640) - 320.0).abs() < 1e-9);
    }

    #[test]
    fn the_conversion_is_the_official_rule() {
        // metric = focal * output / 300, focal = (fx + fy) / 2 of the processed image: an
        // input of 1000 x 500 processed at 504 becomes 504 x 252 (half, then to the patch
        // grid: x 0.504 across), so fx 800 / fy 600 become 403.2 / 302.4.
        let image = RgbImage8::new(1000, 500, vec![0; 1000 * 500 * 3]).unwrap();
        let plan = crate::da3::preprocess::plan_resize(1000, 500, 504).unwrap();
        assert_eq!((plan.width, plan.height), (504, 252));
        let k = [[800.0, 0.0, 500.0], [0.0, 600.0, 250.0], [0.0, 0.0, 1.0]];
        let intrinsics = Focal::Intrinsics(vec![k]);
        let f = processed_focal(&image, &plan, None, Some(&intrinsics), 0).unwrap();
        assert_eq!(f.source, FocalSource::Intrinsics);
        assert!(
            (f.pixels - (403.2 + 302.4) / 2.0).abs() < 1e-3,
            "{}",
            f.pixels
        );

        let mut view = Prediction {
            width: 504,
            height: 252,
            depth: vec![1.0, 2.5, 30.0],
            ..Prediction::default()
        };
        let raw = view.depth.clone();
        let names = |i: usize| format!("view{i}");
        to_metres(
            std::slice::from_mut(&mut view),
            std::slice::from_ref(&image),
            names,
            std::slice::from_ref(&plan),
            None,
            Some(&Focal::Pixels(600.0)),
        );
        // 600 px of the input is 302.4 px of the processed image (both sides x 0.504).
        let focal = view.metric_focal.unwrap();
        assert_eq!(focal.source, FocalSource::Pixels);
        assert!((focal.pixels - 302.4).abs() < 1e-3);
        for (m, r) in view.depth.iter().zip(&raw) {
            assert!((m - r * 302.4 / 300.0).abs() < 1e-5 * m, "{m} vs {r}");
        }
        assert_eq!(view.depth_unit, DepthUnit::Metres);

        // The field of view is taken across the processed width.
        let fov = processed_focal(&image, &plan, None, Some(&Focal::Fov(90.0)), 0).unwrap();
        assert!((fov.pixels - 252.0).abs() < 1e-3);
        // EXIF: 36 mm on the long side of the input is its long side, 1000 px -> 504 px.
        let mut photo = image.clone();
        photo.focal_length_35mm = Some(36);
        let exif = processed_focal(&photo, &plan, None, None, 0).unwrap();
        assert_eq!(exif.source, FocalSource::Exif35mm(36));
        assert!((exif.pixels - 504.0).abs() < 1e-3);
        // A given focal wins over the EXIF one; nothing at all is None (the default's turn).
        let pixels = processed_focal(&photo, &plan, None, Some(&Focal::Pixels(600.0)), 0);
        assert_eq!(pixels.unwrap().source, FocalSource::Pixels);
        assert_eq!(processed_focal(&image, &plan, None, None, 0), None);
    }

    #[test]
    fn focals_no_camera_has_are_refused() {
        assert!(check_focal(&Focal::Pixels(0.0), 1).is_err());
        assert!(check_focal(&Focal::Pixels(f64::NAN), 1).is_err());
        assert!(check_focal(&Focal::Fov(180.0), 1).is_err());
        assert!(check_focal(&Focal::Intrinsics(vec![]), 1).is_err());
        let k = [[500.0, 0.0, 1.0], [0.0, -1.0, 1.0], [0.0, 0.0, 1.0]];
        assert!(check_focal(&Focal::Intrinsics(vec![k]), 1).is_err());
        assert!(check_focal(&Focal::Pixels(500.0), 3).is_ok());
        assert!(check_focal(&Focal::Fov(60.0), 3).is_ok());
    }
}
