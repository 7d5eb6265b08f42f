//! What a prediction holds, camera pose from the decoder, the mono sky rule, and the files
//! the CLI writes (atomically, through [`crate::atomic_file`]).

use super::metric::{DepthUnit, MetricFocal};
use super::preprocess::RgbImage8;
use super::Error;
use crate::atomic_file;
use std::path::Path;

/// Camera parameters of the input view (DualDPT models).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pose {
    /// Pinhole intrinsics: fx, fy, principal point at the image centre.
    pub intrinsics: [[f32; 3]; 3],
    /// World-to-camera [R | t] (the decoder predicts camera-to-world; this is its inverse).
    pub extrinsics: [[f32; 4]; 3],
}

impl Pose {
    /// From the decoder's encoding (`t[3]`, quaternion `xyzw[4]`, fov `h/w[2]`) for a processed
    /// image of `width` x `height`.
    pub fn from_encoding(enc: &[f32], width: usize, height: usize) -> Pose {
        let (t, q) = ([enc[0], enc[1], enc[2]], [enc[3], enc[4], enc[5], enc[6]]);
        let (fov_h, fov_w) = (enc[7], enc[8]);
        let rot = crate::geometry::rotation::matrix_of_xyzw(q.map(f64::from))
            .map(|row| row.map(|v| v as f32));
        let mut extrinsics = [[0.0f32; 4]; 3];
        for a in 0..3 {
            for b in 0..3 {
                extrinsics[a][b] = rot[b][a];
            }
            extrinsics[a][3] = -(0..3).map(|b| rot[b][a] * t[b]).sum::<f32>();
        }
        let (w, h) = (width as f32, height as f32);
        let fy = (h / 2.0) / (fov_h / 2.0).tan().max(1e-6);
        let fx = (w / 2.0) / (fov_w / 2.0).tan().max(1e-6);
        Pose {
            intrinsics: [[fx, 0.0, w / 2.0], [0.0, fy, h / 2.0], [0.0, 0.0, 1.0]],
            extrinsics,
        }
    }
}

/// Outputs of one view at the processed resolution, row-major, rows top to bottom, with
/// the processed image and what is known of the input (its size and name), which exports
/// need.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prediction {
    /// Width of the processed image (a multiple of the patch size).
    pub width: usize,
    /// Height of the processed image.
    pub height: usize,
    /// Depth per pixel in [`Prediction::depth_unit`]: relative for any-view and mono models,
    /// metres for the metric model (at [`Prediction::metric_focal`]) and the nested one;
    /// sky regions filled as the official code does for mono and metric models.
    pub depth: Vec<f32>,
    /// Confidence of the depth per pixel (models with a confidence output).
    pub confidence: Option<Vec<f32>>,
    /// Sky probability per pixel (mono and metric models).
    pub sky: Option<Vec<f32>>,
    /// Camera intrinsics and extrinsics (DualDPT models with a camera decoder).
    pub pose: Option<Pose>,
    /// Intermediate stages, when loaded with probes.
    pub probes: Vec<(String, Vec<f32>)>,
    /// The DualDPT ray branch, when asked for ([`crate::Request::rays`]).
    pub rays: Option<RayMap>,
    /// The processed image (8-bit RGB, `width` x `height`): the colours of 3D exports (the
    /// official `processed_images`).
    pub image: RgbImage8,
    /// The input image's width and height (what [`Prediction::resize_to_input`] goes back to).
    pub input_size: (usize, usize),
    /// The input's name ([`crate::Request::names`]): the COLMAP image name, `poses.json`'s.
    pub name: String,
    /// What the depth values measure.
    pub depth_unit: DepthUnit,
    /// Metric models: the focal length (pixels of this prediction's image) that brought the
    /// output to metres, and where it came from (see [`crate::metric`]).
    pub metric_focal: Option<MetricFocal>,
}

/// The DualDPT auxiliary outputs of one view (the official `ray` and `ray_conf`), at 8/14 of
/// the processed size (`width` x `height` here).
#[derive(Debug, Clone, PartialEq)]
pub struct RayMap {
    /// Width of the map.
    pub width: usize,
    /// Height of the map.
    pub height: usize,
    /// Six values per pixel, channel-major (`6 x height x width`): channel `c` of pixel
    /// `(x, y)` at `(c * height + y) * width + x`.
    pub rays: Vec<f32>,
    /// Confidence per pixel (`height x width`, `exp(x) + 1`).
    pub confidence: Vec<f32>,
}

impl Prediction {
    /// Writes the depth as PFM (float32, rows bottom to top, as the format wants).
    pub fn save_pfm(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        write_pfm(path.as_ref(), &self.depth, self.width, self.height)
    }

    /// Writes the depth as an 8-bit PNG, scaled to its range, near = bright (for a
    /// disparity, [`DepthUnit::Disparity`], the largest values are the nearest).
    pub fn save_png(&self, path: impl AsRef<Path>, colormap: Colormap) -> Result<(), Error> {
        write_png_oriented(
            path.as_ref(),
            &self.depth,
            self.width,
            self.height,
            colormap,
            self.depth_unit != DepthUnit::Disparity,
        )
    }

    /// Writes the depth as a 16-bit greyscale PNG scaled to its range (near = bright), with
    /// the range in a text chunk.
    pub fn save_png16(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        write_png16_in(
            path.as_ref(),
            &self.depth,
            self.width,
            self.height,
            Some(self.depth_unit),
        )
    }

    /// This prediction's maps (depth, confidence, sky) at the input image's size (bilinear,
    /// pixel centres aligned), the intrinsics scaled to it and the image resampled to it
    /// (area or cubic, as preprocessing resamples), for maps that line up with the input.
    /// The ray maps stay at their size; probes are dropped. A prediction already at the input
    /// size comes back unchanged. (With a `*_crop` [`crate::ResizeMethod`] the maps cover
    /// the cropped window, stretched to the input's size.)
    pub fn resize_to_input(&self) -> Result<Prediction, Error> {
        let (w, h) = (self.width, self.height);
        let (iw, ih) = self.input_size;
        if (iw, ih) == (w, h) {
            return Ok(self.clone());
        }
        if iw == 0 || ih == 0 {
            return Err(Error::Input(
                "this prediction does not know its input's size (made by hand?)".to_owned(),
            ));
        }
        let map = |values: &[f32]| resize_bilinear(values, w, h, iw, ih);
        let (sx, sy) = (iw as f32 / w as f32, ih as f32 / h as f32);
        let pose = self.pose.map(|mut pose| {
            for v in &mut pose.intrinsics[0] {
                *v *= sx;
            }
            for v in &mut pose.intrinsics[1] {
                *v *= sy;
            }
            pose
        });
        let image = match self.image.width {
            0 => RgbImage8::default(),
            _ if iw * ih > w * h => super::preprocess::resize_cubic(&self.image, iw, ih)?,
            _ => super::preprocess::resize_area(&self.image, iw, ih)?,
        };
        Ok(Prediction {
            width: iw,
            height: ih,
            depth: map(&self.depth)?,
            confidence: self.confidence.as_deref().map(map).transpose()?,
            sky: self.sky.as_deref().map(map).transpose()?,
            pose,
            probes: Vec::new(),
            rays: self.rays.clone(),
            image,
            input_size: self.input_size,
            name: self.name.clone(),
            depth_unit: self.depth_unit,
            // The mean focal scales by the mean of the two factors, as fx and fy do apart.
            metric_focal: self.metric_focal.map(|f| MetricFocal {
                pixels: f.pixels * (sx + sy) / 2.0,
                ..f
            }),
        })
    }

    /// The camera the 3D exports place this view's points with: the predicted (or known)
    /// pose, else for a metric model the pinhole camera of its focal length at the origin
    /// (the focal its metres came from).
    pub fn camera(&self) -> Option<Pose> {
        self.pose.or_else(|| {
            self.metric_focal
                .map(|f| crate::da3::export::pinhole_pose(self.width, self.height, f.pixels))
        })
    }

    /// Writes the confidence as PFM; an error when the model has no confidence output.
    pub fn save_confidence_pfm(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let values = self
            .confidence
            .as_ref()
            .ok_or_else(|| Error::Input("this model has no confidence output".to_owned()))?;
        write_pfm(path.as_ref(), values, self.width, self.height)
    }

    /// Writes the sky probability as PFM; an error when the model has no sky head.
    pub fn save_sky_pfm(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let values = self.sky.as_ref().ok_or_else(|| {
            Error::Input("this model has no sky head (only mono/metric models do)".to_owned())
        })?;
        write_pfm(path.as_ref(), values, self.width, self.height)
    }

    /// Writes the camera pose as JSON (`width`, `height`, `intrinsics`,
    /// `extrinsics_world_to_camera`, `depth_unit`; for a metric model its pinhole camera
    /// ([`Prediction::camera`]) and `focal_source`); an error when the model has no camera
    /// decoder and is not metric.
    pub fn save_pose_json(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let pose = self.camera().ok_or_else(|| {
            Error::Input(
                "this model has no camera decoder (only DualDPT models and, with its focal \
                 length, the metric model do)"
                    .to_owned(),
            )
        })?;
        let mut json = serde_json::json!({
            "width": self.width,
            "height": self.height,
            "intrinsics": pose.intrinsics,
            "extrinsics_world_to_camera": pose.extrinsics,
            "depth_unit": self.depth_unit.name(),
        });
        if let (None, Some(focal)) = (self.pose, self.metric_focal) {
            json["focal_source"] = serde_json::json!(focal.source.to_string());
        }
        Ok(atomic_file::write(path.as_ref(), |out| {
            serde_json::to_writer_pretty(&mut *out, &json).map_err(std::io::Error::other)?;
            out.write_all(b"\n")
        })?)
    }

    /// The smallest and largest finite depth.
    pub fn depth_range(&self) -> (f32, f32) {
        self.depth
            .iter()
            .filter(|v| v.is_finite())
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
                (a.min(v), b.max(v))
            })
    }

    /// An intermediate stage by name (models loaded with probes).
    pub fn probe(&self, name: &str) -> Option<&[f32]> {
        self.probes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }
}

/// The official mono/metric post-processing: pixels with sky >= 0.3 get the 0.99 quantile of
/// the non-sky depth (the official code estimates it from 100 000 random samples when there
/// are more; this uses all of them, the value the sampling estimates). Unchanged when either
/// class has 10 pixels or fewer.
pub fn fill_sky(depth: &mut [f32], sky: &[f32]) {
    let non_sky: Vec<f32> = depth
        .iter()
        .zip(sky)
        .filter(|(_, &s)| s < 0.3)
        .map(|(&d, _)| d)
        .collect();
    let sky_count = depth.len() - non_sky.len();
    if non_sky.len() <= 10 || sky_count <= 10 {
        return;
    }
    let max = quantile(non_sky, 0.99);
    for (d, &s) in depth.iter_mut().zip(sky) {
        if s >= 0.3 {
            *d = max;
        }
    }
}

/// Linear-interpolated quantile, as `torch.quantile` computes it.
pub fn quantile(mut values: Vec<f32>, q: f64) -> f32 {
    values.sort_by(|a, b| a.total_cmp(b));
    let pos = q * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    let frac = (pos - lo as f64) as f32;
    values[lo] + (values[hi] - values[lo]) * frac
}

/// Whether `a` and `b` name the same existing file (same device and inode on Unix, same
/// canonical path elsewhere).
pub fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Refuses an output that is one of the `inputs` (`(what, path)`, e.g. `("the model", p)`).
pub fn check_not_an_input(output: &Path, inputs: &[(&str, &Path)]) -> Result<(), Error> {
    match inputs.iter().find(|(_, input)| same_file(output, input)) {
        Some((what, input)) => Err(Error::Output {
            path: output.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "it is {what} ({}); refusing to overwrite an input",
                    input.display()
                ),
            ),
        }),
        None => Ok(()),
    }
}

/// PFM: `Pf`, size, negative scale (little-endian), rows bottom to top.
pub fn write_pfm(path: &Path, values: &[f32], width: usize, height: usize) -> Result<(), Error> {
    Ok(atomic_file::write(path, |w| {
        write!(w, "Pf\n{width} {height}\n-1.0\n")?;
        for row in (0..height).rev() {
            for v in &values[row * width..(row + 1) * width] {
                w.write_all(&v.to_le_bytes())?;
            }
        }
        Ok(())
    })?)
}

/// Colour maps for 8-bit depth images.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Colormap {
    /// Grey levels, near = white.
    Gray,
    /// Google's Turbo rainbow map, near = red.
    #[default]
    Turbo,
    /// matplotlib's inferno (black, purple, orange, pale yellow), near = yellow.
    Inferno,
    /// matplotlib's viridis (purple, teal, yellow), near = yellow.
    Viridis,
}

impl std::str::FromStr for Colormap {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "gray" | "grey" => Ok(Colormap::Gray),
            "turbo" => Ok(Colormap::Turbo),
            "inferno" => Ok(Colormap::Inferno),
            "viridis" => Ok(Colormap::Viridis),
            other => Err(Error::Input(format!(
                "unknown colormap {other:?} (gray, turbo, inferno, viridis)"
            ))),
        }
    }
}

impl Colormap {
    /// The colour of `x` in 0..=1 (clamped).
    pub fn rgb(self, x: f32) -> [u8; 3] {
        match self {
            Colormap::Gray => [(x.clamp(0.0, 1.0) * 255.0).round() as u8; 3],
            Colormap::Turbo => turbo(x),
            Colormap::Inferno => lookup(&super::colormaps::INFERNO, x),
            Colormap::Viridis => lookup(&super::colormaps::VIRIDIS, x),
        }
    }
}

/// An 8-bit PNG of `values` scaled to their range, near (small depth) bright.
pub fn write_png(
    path: &Path,
    values: &[f32],
    width: usize,
    height: usize,
    colormap: Colormap,
) -> Result<(), Error> {
    write_png_oriented(path, values, width, height, colormap, true)
}

/// [`write_png`], the smallest values bright where `small_is_near` (depth), else the
/// largest (disparity).
fn write_png_oriented(
    path: &Path,
    values: &[f32],
    width: usize,
    height: usize,
    colormap: Colormap,
    small_is_near: bool,
) -> Result<(), Error> {
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let span = if hi > lo { hi - lo } else { 1.0 };
    let level = |v: f32| {
        if v.is_finite() {
            let x = ((v - lo) / span).clamp(0.0, 1.0);
            if small_is_near {
                1.0 - x
            } else {
                x
            }
        } else {
            0.0
        }
    };
    let mut rgb = Vec::with_capacity(width * height * 3);
    for &v in values {
        let x = level(v);
        rgb.extend_from_slice(&colormap.rgb(x));
    }
    let mut encoded = Vec::new();
    image::codecs::png::PngEncoder::new(&mut encoded)
        .write_image(
            &rgb,
            width as u32,
            height as u32,
            image::ExtendedColorType::Rgb8,
        )
        .map_err(|e| Error::Output {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
    Ok(atomic_file::write(path, |w| w.write_all(&encoded))?)
}

use image::ImageEncoder;

/// Google's Turbo colormap, polynomial approximation (Mikhailov 2019).
fn turbo(x: f32) -> [u8; 3] {
    let x = x.clamp(0.0, 1.0) as f64;
    let r = 0.13572138
        + x * (4.61539260
            + x * (-42.66032258 + x * (132.13108234 + x * (-152.94239396 + x * 59.28637943))));
    let g = 0.09140261
        + x * (2.19418839
            + x * (4.84296658 + x * (-14.18503333 + x * (4.27729857 + x * 2.82956604))));
    let b = 0.10667330
        + x * (12.64194608
            + x * (-60.58204836 + x * (110.36276771 + x * (-89.90310912 + x * 27.34824973))));
    [r, g, b].map(|c| (c.clamp(0.0, 1.0) * 255.0).round() as u8)
}

/// matplotlib's lookup: entry `floor(x * 256)` of the 256-entry table (x clamped to 0..=1),
/// as `Colormap.__call__` indexes a float.
fn lookup(table: &[[u8; 3]; 256], x: f32) -> [u8; 3] {
    let i = (x.clamp(0.0, 1.0) * 256.0) as usize;
    table[i.min(255)]
}

/// A 16-bit greyscale PNG of `values`: linear, the smallest finite value 0 and the largest
/// 65535 (far = bright, unlike the 8-bit image), non-finite values 0. The range is recorded in
/// `tEXt` chunks `depth_min` and `depth_max`, so `v = min + p / 65535 * (max - min)`.
pub fn write_png16(path: &Path, values: &[f32], width: usize, height: usize) -> Result<(), Error> {
    write_png16_in(path, values, width, height, None)
}

/// [`write_png16`], the depth's unit named in a `tEXt` chunk `unit` ([`DepthUnit::name`]).
pub fn write_png16_in(
    path: &Path,
    values: &[f32],
    width: usize,
    height: usize,
    unit: Option<DepthUnit>,
) -> Result<(), Error> {
    if values.len() != width * height || values.is_empty() {
        return Err(Error::Input(format!(
            "{} values for a {width}x{height} image",
            values.len()
        )));
    }
    let (lo, hi) = values
        .iter()
        .filter(|v| v.is_finite())
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let (lo, hi) = if lo.is_finite() { (lo, hi) } else { (0.0, 0.0) };
    let span = if hi > lo { hi - lo } else { 1.0 };
    let mut samples = Vec::with_capacity(values.len() * 2);
    for &v in values {
        let p = if v.is_finite() {
            (((v - lo) / span).clamp(0.0, 1.0) * 65535.0).round() as u16
        } else {
            0
        };
        samples.extend_from_slice(&p.to_be_bytes());
    }
    let err = |e: png::EncodingError| Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    };
    let mut encoded = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut encoded, width as u32, height as u32);
        encoder.set_color(png::ColorType::Grayscale);
        encoder.set_depth(png::BitDepth::Sixteen);
        encoder
            .add_text_chunk("depth_min".into(), format!("{lo:e}"))
            .map_err(err)?;
        encoder
            .add_text_chunk("depth_max".into(), format!("{hi:e}"))
            .map_err(err)?;
        if let Some(unit) = unit {
            encoder
                .add_text_chunk("unit".into(), unit.name().into())
                .map_err(err)?;
        }
        let mut writer = encoder.write_header().map_err(err)?;
        writer.write_image_data(&samples).map_err(err)?;
        writer.finish().map_err(err)?;
    }
    Ok(atomic_file::write(path, |w| w.write_all(&encoded))?)
}

/// Bilinear resampling of a row-major map to `new_width x new_height`, pixel centres aligned
/// (`align_corners = False`, as `torch.nn.functional.interpolate` and OpenCV's INTER_LINEAR):
/// the source coordinate of output pixel `x` is `(x + 0.5) * w / new_w - 0.5`, clamped.
pub fn resize_bilinear(
    values: &[f32],
    width: usize,
    height: usize,
    new_width: usize,
    new_height: usize,
) -> Result<Vec<f32>, Error> {
    if values.len() != width * height || width == 0 || height == 0 {
        return Err(Error::Input(format!(
            "{} values for a {width}x{height} map",
            values.len()
        )));
    }
    if new_width == 0 || new_height == 0 {
        return Err(Error::Input(format!(
            "cannot resize to {new_width}x{new_height}"
        )));
    }
    let axis = |n: usize, new: usize| -> Vec<(usize, usize, f32)> {
        (0..new)
            .map(|x| {
                let s = ((x as f64 + 0.5) * n as f64 / new as f64 - 0.5).clamp(0.0, (n - 1) as f64);
                let i0 = s.floor() as usize;
                let i1 = (i0 + 1).min(n - 1);
                (i0, i1, (s - i0 as f64) as f32)
            })
            .collect()
    };
    let (xs, ys) = (axis(width, new_width), axis(height, new_height));
    let mut out = Vec::with_capacity(new_width * new_height);
    for &(y0, y1, fy) in &ys {
        let (r0, r1) = (
            &values[y0 * width..][..width],
            &values[y1 * width..][..width],
        );
        for &(x0, x1, fx) in &xs {
            let top = r0[x0] + (r0[x1] - r0[x0]) * fx;
            let bottom = r1[x0] + (r1[x1] - r1[x0]) * fx;
            out.push(top + (bottom - top) * fy);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn colormaps_parse_and_span_their_tables() {
        use super::Colormap;
        // Against matplotlib's every value: tests/colormaps.rs.
        assert_eq!(
            Colormap::Viridis.rgb(0.0),
            super::super::colormaps::VIRIDIS[0]
        );
        assert_eq!(
            Colormap::Viridis.rgb(1.0),
            super::super::colormaps::VIRIDIS[255]
        );
        assert_eq!(
            Colormap::Inferno.rgb(f32::NAN),
            super::super::colormaps::INFERNO[0]
        );
        assert_eq!(Colormap::Gray.rgb(1.0), [255; 3]);
        assert_eq!("inferno".parse::<Colormap>().unwrap(), Colormap::Inferno);
        assert!("jet".parse::<Colormap>().is_err());
    }

    #[test]
    fn bilinear_resize_aligns_pixel_centres() {
        // 2x1 -> 4x1: sources -0.25 (clamped 0), 0.25, 0.75, 1.25 (clamped 1).
        let out = super::resize_bilinear(&[0.0, 4.0], 2, 1, 4, 1).unwrap();
        assert_eq!(out, vec![0.0, 1.0, 3.0, 4.0]);
        let same = super::resize_bilinear(&[1.0, 2.0, 3.0, 4.0], 2, 2, 2, 2).unwrap();
        assert_eq!(same, vec![1.0, 2.0, 3.0, 4.0]);
        assert!(super::resize_bilinear(&[1.0], 2, 2, 4, 4).is_err());
    }

    #[test]
    fn png16_reads_back_with_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.png");
        super::write_png16(&path, &[1.0, 2.0, 3.0, f32::NAN], 2, 2).unwrap();
        let decoder =
            png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
        let mut reader = decoder.read_info().unwrap();
        let texts: Vec<(String, String)> = reader
            .info()
            .uncompressed_latin1_text
            .iter()
            .map(|t| (t.keyword.clone(), t.text.clone()))
            .collect();
        assert!(
            texts.contains(&("depth_min".into(), "1e0".into())),
            "{texts:?}"
        );
        assert!(texts.contains(&("depth_max".into(), "3e0".into())));
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let frame = reader.next_frame(&mut buf).unwrap();
        assert_eq!(
            (frame.bit_depth, frame.color_type),
            (png::BitDepth::Sixteen, png::ColorType::Grayscale)
        );
        let px: Vec<u16> = buf
            .chunks(2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
            .collect();
        assert_eq!(px, vec![0, 32768, 65535, 0]);
    }

    use super::*;

    #[test]
    fn an_input_is_not_an_output() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("photo.png");
        std::fs::write(&input, b"pixels").unwrap();
        let roundabout = dir.path().join(".").join("photo.png");
        let err = check_not_an_input(&roundabout, &[("the input image", &input)]).unwrap_err();
        assert!(err.to_string().contains("the input image"), "{err}");
        let other = dir.path().join("depth.png");
        check_not_an_input(&other, &[("the input image", &input)]).unwrap();
    }

    #[test]
    fn quantile_interpolates_linearly_like_torch() {
        // torch.quantile(torch.tensor([1., 2., 3., 4.]), 0.99) == 3.97
        assert!((quantile(vec![4.0, 1.0, 3.0, 2.0], 0.99) - 3.97).abs() < 1e-6);
        assert_eq!(quantile(vec![5.0], 0.99), 5.0);
        assert_eq!(quantile(vec![0.0, 10.0], 0.5), 5.0);
    }

    #[test]
    fn sky_pixels_take_the_99th_percentile_of_the_rest() {
        let mut depth: Vec<f32> = (0..100).map(|i| i as f32).collect();
        let sky: Vec<f32> = (0..100).map(|i| if i >= 80 { 0.9 } else { 0.1 }).collect();
        fill_sky(&mut depth, &sky);
        let expected = quantile((0..80).map(|i| i as f32).collect(), 0.99); // 78.21
        assert!((expected - 78.21).abs() < 1e-4);
        assert!(depth[80..].iter().all(|&d| d == expected));
        assert!(depth[..80].iter().enumerate().all(|(i, &d)| d == i as f32));
    }

    #[test]
    fn sky_threshold_is_inclusive_at_0_3() {
        let mut depth = vec![1.0f32; 40];
        depth[39] = 2.0;
        let mut sky = vec![0.0f32; 40];
        for s in &mut sky[..20] {
            *s = 0.3;
        }
        fill_sky(&mut depth, &sky);
        let expected = quantile(depth[20..].to_vec(), 0.99);
        assert!(depth[..20].iter().all(|&d| d == expected));
    }

    #[test]
    fn few_sky_or_few_ground_pixels_leave_depth_alone() {
        let original: Vec<f32> = (0..50).map(|i| i as f32).collect();
        for sky_pixels in [0, 10, 40, 50] {
            let mut depth = original.clone();
            let sky: Vec<f32> = (0..50)
                .map(|i| if i < sky_pixels { 1.0 } else { 0.0 })
                .collect();
            fill_sky(&mut depth, &sky);
            assert_eq!(depth, original, "{sky_pixels} sky pixels");
        }
    }

    #[test]
    fn pose_of_the_identity_encoding() {
        // t = 0, quaternion (0, 0, 0, 1), fov 90 degrees both ways.
        let fov = std::f32::consts::FRAC_PI_2;
        let pose = Pose::from_encoding(&[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, fov, fov], 504, 336);
        assert!(
            (pose.intrinsics[0][0] - 252.0).abs() < 1e-3
                && (pose.intrinsics[1][1] - 168.0).abs() < 1e-3
        );
        assert_eq!(
            (pose.intrinsics[0][2], pose.intrinsics[1][2]),
            (252.0, 168.0)
        );
        for (r, row) in pose.extrinsics.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                assert_eq!(v, if r == c { 1.0 } else { 0.0 });
            }
        }
    }

    #[test]
    fn extrinsics_are_the_inverse_of_the_predicted_camera_to_world() {
        // 90 degrees about z (quaternion (0, 0, sin 45, cos 45)), translation (1, 2, 3).
        let h = std::f32::consts::FRAC_1_SQRT_2;
        let pose = Pose::from_encoding(&[1.0, 2.0, 3.0, 0.0, 0.0, h, h, 1.0, 1.0], 10, 10);
        // c2w R = [[0,-1,0],[1,0,0],[0,0,1]]; w2c = [R^T | -R^T t] with -R^T t = (-2, 1, -3).
        let expected = [
            [0.0, 1.0, 0.0, -2.0],
            [-1.0, 0.0, 0.0, 1.0],
            [0.0, 0.0, 1.0, -3.0],
        ];
        for (row, expected_row) in pose.extrinsics.iter().zip(expected) {
            for (v, e) in row.iter().zip(expected_row) {
                assert!((v - e).abs() < 1e-6, "{:?}", pose.extrinsics);
            }
        }
    }
}
