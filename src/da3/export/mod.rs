//! 3D exports of predictions: coloured point clouds in one world frame, written as PLY, glb
//! (glTF 2.0), COLMAP sparse models and the official `mini_npz` archive, a self-contained
//! HTML page that draws them with WebGL ([`write_viewer`]), fused triangle meshes as PLY
//! and glb ([`write_mesh_ply`], [`write_mesh_glb`]), and 3D Gaussians as 3DGS PLY
//! ([`write_gaussian_ply`]).
//!
//! The geometry follows the official exporter (`depth_anything_3/utils/export/glb.py` of
//! `depth-anything-3==0.1.1`, `_depths_to_world_points_with_colors`): pixel `(u, v)` (integer
//! coordinates, no half-pixel offset) at depth `d` is the camera-space point
//! `d * K^-1 (u, v, 1)`, and the world point is the inverse of the world-to-camera extrinsics
//! applied to it. Every view goes into the same world frame. Colours come from the image at the
//! processed resolution (`ProcessedImage::rgb8`, the official `processed_images`).
//!
//! Filtering, as the official glb export: a point is kept when its depth is finite and
//! positive and its confidence is at least `clamp(min_confidence, P_lower, P_upper)`, the
//! percentiles taken over every view's non-sky confidences (over all of them when 10 or fewer
//! pixels are non-sky). One deliberate difference: sky pixels (sky >= 0.3) are dropped, where
//! the official glb export keeps them at the 98th-percentile depth as a backdrop. Above
//! `max_points`, points are subsampled deterministically (evenly strided), where the official
//! code draws a random subset.

mod colmap;
mod gaussians;
mod glb;
mod mesh;
mod npz;
mod ply;
mod saving;
mod viewer;

pub use colmap::{write_colmap, ColmapFormat};
pub use gaussians::{write_gaussian_ply, GaussianPlyOptions};
pub use glb::{write_glb, GlbOptions};
pub use mesh::{write_mesh_glb, write_mesh_ply};
pub use npz::write_mini_npz;
pub use ply::write_ply;
pub use saving::ExportOptions;
pub use viewer::{
    viewer_html, write_viewer, ViewerCaps, ViewerScene, DEFAULT_VIEWER_POINTS,
    DEFAULT_VIEWER_TRIANGLES, VIEWER_JS,
};

use super::outputs::{quantile, Pose, Prediction};
use super::preprocess::RgbImage8;
use super::Error;

/// One predicted view with everything a 3D export needs.
#[derive(Debug, Clone)]
pub struct View<'a> {
    /// Processed width and height (the depth map's size).
    pub width: usize,
    pub height: usize,
    /// Row-major depth, `width * height`.
    pub depth: &'a [f32],
    pub confidence: Option<&'a [f32]>,
    pub sky: Option<&'a [f32]>,
    /// Interleaved RGB8 at the processed resolution, `width * height * 3`.
    pub colors: &'a [u8],
    /// Intrinsics at the processed resolution and world-to-camera extrinsics.
    pub pose: Pose,
    /// Image file name (COLMAP's `NAME`).
    pub name: String,
    /// Size of the original image (COLMAP cameras are written at this size).
    pub original_size: (usize, usize),
}

impl<'a> View<'a> {
    /// A view from a prediction and the processed image it came from, with the predicted pose.
    ///
    /// # Errors
    /// [`Error::Input`] when the prediction has no pose (mono/metric models predict none: use
    /// [`View::with_pose`] and, for instance, [`assumed_pose`]) or the sizes disagree.
    pub fn new(prediction: &'a Prediction, processed: &'a RgbImage8) -> Result<Self, Error> {
        let pose = prediction.pose.ok_or_else(|| {
            Error::Input(
                "a 3D export needs camera intrinsics and extrinsics, and this prediction has \
                 none (only models with a camera decoder predict them)"
                    .into(),
            )
        })?;
        Self::with_pose(prediction, processed, pose)
    }

    /// A view with a pose given by the caller (for models that predict none).
    pub fn with_pose(
        prediction: &'a Prediction,
        processed: &'a RgbImage8,
        pose: Pose,
    ) -> Result<Self, Error> {
        let view = View {
            width: prediction.width,
            height: prediction.height,
            depth: &prediction.depth,
            confidence: prediction.confidence.as_deref(),
            sky: prediction.sky.as_deref(),
            colors: &processed.data,
            pose,
            name: "image.png".into(),
            original_size: (prediction.width, prediction.height),
        };
        view.validate()?;
        Ok(view)
    }

    /// Sets the image name and original size (COLMAP export).
    pub fn named(mut self, name: impl Into<String>, original_size: (usize, usize)) -> Self {
        self.name = name.into();
        self.original_size = original_size;
        self
    }

    /// Checks sizes, finiteness of the pose and that both matrices are invertible.
    pub fn validate(&self) -> Result<(), Error> {
        let n = self.width * self.height;
        if n == 0 {
            return Err(Error::Input(format!(
                "view {:?} is empty ({}x{})",
                self.name, self.width, self.height
            )));
        }
        let check = |what: &str, len: usize, expected: usize| {
            if len == expected {
                Ok(())
            } else {
                Err(Error::Input(format!(
                    "view {:?}: {what} has {len} values, {}x{} needs {expected}",
                    self.name, self.width, self.height
                )))
            }
        };
        check("depth", self.depth.len(), n)?;
        if let Some(c) = self.confidence {
            check("confidence", c.len(), n)?;
        }
        if let Some(s) = self.sky {
            check("sky", s.len(), n)?;
        }
        check("the colour image", self.colors.len(), n * 3)?;
        if self.original_size.0 == 0 || self.original_size.1 == 0 {
            return Err(Error::Input(format!(
                "view {:?}: original size {}x{} is empty",
                self.name, self.original_size.0, self.original_size.1
            )));
        }
        let finite = self.pose.intrinsics.iter().flatten().all(|v| v.is_finite())
            && self.pose.extrinsics.iter().flatten().all(|v| v.is_finite());
        if !finite {
            return Err(Error::Input(format!(
                "view {:?}: the camera pose is not finite",
                self.name
            )));
        }
        if invert3(&to_f64(&self.pose.intrinsics)).is_none() {
            return Err(Error::Input(format!(
                "view {:?}: the intrinsics are not invertible",
                self.name
            )));
        }
        if camera_to_world(&self.pose).is_none() {
            return Err(Error::Input(format!(
                "view {:?}: the extrinsics' rotation is not invertible",
                self.name
            )));
        }
        Ok(())
    }
}

/// A pinhole camera at the world origin looking down +z with the given horizontal field of
/// view, principal point at the centre, square pixels: a stand-in pose for models that predict
/// none.
pub fn assumed_pose(width: usize, height: usize, horizontal_fov_degrees: f32) -> Pose {
    let f = (width as f32 / 2.0) / (horizontal_fov_degrees.to_radians() / 2.0).tan();
    pinhole_pose(width, height, f)
}

/// A pinhole camera at the world origin looking down +z with focal length `focal` (pixels),
/// principal point at the centre, square pixels.
pub fn pinhole_pose(width: usize, height: usize, focal: f32) -> Pose {
    let (w, h) = (width as f32, height as f32);
    let f = focal;
    Pose {
        intrinsics: [[f, 0.0, w / 2.0], [0.0, f, h / 2.0], [0.0, 0.0, 1.0]],
        extrinsics: [
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0, 0.0],
            [0.0, 0.0, 1.0, 0.0],
        ],
    }
}

/// Which points a cloud keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudOptions {
    /// Base confidence threshold (official `conf_thresh`, 1.05).
    pub min_confidence: f32,
    /// The threshold is raised to at least this percentile of the confidences (official
    /// `conf_thresh_percentile`, 40).
    pub lower_percentile: f64,
    /// ... and lowered to at most this one (official `ensure_thresh_percentile`, 90).
    pub upper_percentile: f64,
    /// Pixels whose sky value is at least this are dropped (the official sky rule's 0.3).
    pub sky_threshold: f32,
    /// At most this many points (official `num_max_points`, 1 000 000); `None`: no cap.
    pub max_points: Option<usize>,
}

impl Default for CloudOptions {
    /// The official glb export's defaults.
    fn default() -> Self {
        CloudOptions {
            min_confidence: 1.05,
            lower_percentile: 40.0,
            upper_percentile: 90.0,
            sky_threshold: 0.3,
            max_points: Some(1_000_000),
        }
    }
}

impl CloudOptions {
    /// The official COLMAP export's rule: confidence at least its 40th percentile, no cap.
    pub fn colmap() -> Self {
        CloudOptions {
            min_confidence: f32::NEG_INFINITY,
            lower_percentile: 40.0,
            upper_percentile: 40.0,
            max_points: None,
            ..Default::default()
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let ok = |p: f64| (0.0..=100.0).contains(&p);
        if !ok(self.lower_percentile)
            || !ok(self.upper_percentile)
            || self.lower_percentile > self.upper_percentile
        {
            return Err(Error::Input(format!(
                "confidence percentiles {} and {} must be in 0..=100, lower first",
                self.lower_percentile, self.upper_percentile
            )));
        }
        if self.max_points == Some(0) {
            return Err(Error::Input("a point cap of 0 keeps nothing".into()));
        }
        Ok(())
    }
}

/// A coloured point cloud in the world frame, with where each point came from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PointCloud {
    pub positions: Vec<[f32; 3]>,
    pub colors: Vec<[u8; 3]>,
    /// `(view index, pixel index)` of each point (pixel index `v * width + u`).
    pub sources: Vec<(u32, u32)>,
    /// The confidence threshold that was applied (`None`: the views carry no confidence).
    pub confidence_threshold: Option<f32>,
}

impl PointCloud {
    pub fn len(&self) -> usize {
        self.positions.len()
    }
    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }
}

/// The confidence threshold of the official glb export over `views` (`None` when no view has
/// a confidence map).
pub fn confidence_threshold(views: &[View<'_>], options: &CloudOptions) -> Option<f32> {
    let with_conf: Vec<&View> = views.iter().filter(|v| v.confidence.is_some()).collect();
    if with_conf.is_empty() {
        return None;
    }
    let mut non_sky = Vec::new();
    let mut all = Vec::new();
    for v in &with_conf {
        let conf = v.confidence.unwrap_or_default();
        all.extend(conf.iter().copied().filter(|c| c.is_finite()));
        match v.sky {
            Some(sky) => non_sky.extend(
                conf.iter()
                    .zip(sky)
                    .filter(|(c, &s)| c.is_finite() && s < options.sky_threshold)
                    .map(|(&c, _)| c),
            ),
            None => non_sky.extend(conf.iter().copied().filter(|c| c.is_finite())),
        }
    }
    let pixels = if non_sky.len() > 10 { non_sky } else { all };
    if pixels.is_empty() {
        return Some(f32::INFINITY);
    }
    let lower = quantile(pixels.clone(), options.lower_percentile / 100.0);
    let upper = quantile(pixels, options.upper_percentile / 100.0);
    Some(options.min_confidence.max(lower).min(upper))
}

/// Back-projects every view into one world frame and filters as [`CloudOptions`] says.
///
/// # Errors
/// [`Error::Input`] for an invalid view or option.
pub fn point_cloud(views: &[View<'_>], options: &CloudOptions) -> Result<PointCloud, Error> {
    options.validate()?;
    for v in views {
        v.validate()?;
    }
    let threshold = confidence_threshold(views, options);
    let mut cloud = PointCloud {
        confidence_threshold: threshold,
        ..Default::default()
    };
    for (vi, view) in views.iter().enumerate() {
        let k_inv = invert3(&to_f64(&view.pose.intrinsics)).expect("validated");
        let (rot, centre) = camera_to_world(&view.pose).expect("validated");
        for v in 0..view.height {
            for u in 0..view.width {
                let i = v * view.width + u;
                let d = view.depth[i];
                if !(d.is_finite() && d > 0.0) {
                    continue;
                }
                if let (Some(conf), Some(t)) = (view.confidence, threshold) {
                    if conf[i].is_nan() || conf[i] < t {
                        continue;
                    }
                }
                if let Some(sky) = view.sky {
                    if sky[i] >= options.sky_threshold {
                        continue;
                    }
                }
                let pix = [u as f64, v as f64, 1.0];
                let ray = mat3_vec(&k_inv, pix);
                let cam = ray.map(|r| r * d as f64);
                let world = mat3_vec(&rot, cam);
                let p = [
                    (world[0] + centre[0]) as f32,
                    (world[1] + centre[1]) as f32,
                    (world[2] + centre[2]) as f32,
                ];
                if !p.iter().all(|c| c.is_finite()) {
                    continue;
                }
                cloud.positions.push(p);
                let c = &view.colors[i * 3..i * 3 + 3];
                cloud.colors.push([c[0], c[1], c[2]]);
                cloud.sources.push((vi as u32, i as u32));
            }
        }
    }
    if let Some(max) = options.max_points {
        let n = cloud.len();
        if n > max {
            let keep: Vec<usize> = (0..max).map(|j| j * n / max).collect();
            cloud.positions = keep.iter().map(|&j| cloud.positions[j]).collect();
            cloud.colors = keep.iter().map(|&j| cloud.colors[j]).collect();
            cloud.sources = keep.iter().map(|&j| cloud.sources[j]).collect();
            log::debug!("point cloud: kept {max} of {n} points (evenly strided)");
        }
    }
    Ok(cloud)
}

pub(crate) fn to_f64<const R: usize, const C: usize>(m: &[[f32; C]; R]) -> [[f64; C]; R] {
    m.map(|row| row.map(f64::from))
}

pub(crate) fn mat3_vec(m: &[[f64; 3]; 3], x: [f64; 3]) -> [f64; 3] {
    [0, 1, 2].map(|r| m[r][0] * x[0] + m[r][1] * x[1] + m[r][2] * x[2])
}

/// The inverse of a 3x3 matrix (adjugate over determinant), `None` when singular.
pub(crate) fn invert3(m: &[[f64; 3]; 3]) -> Option<[[f64; 3]; 3]> {
    let c = |r: usize, k: usize| {
        let (r1, r2) = ((r + 1) % 3, (r + 2) % 3);
        let (k1, k2) = ((k + 1) % 3, (k + 2) % 3);
        m[r1][k1] * m[r2][k2] - m[r1][k2] * m[r2][k1]
    };
    let det = m[0][0] * c(0, 0) + m[0][1] * c(0, 1) + m[0][2] * c(0, 2);
    if !det.is_finite() || det.abs() < 1e-12 {
        return None;
    }
    let mut inv = [[0.0; 3]; 3];
    for (r, row) in inv.iter_mut().enumerate() {
        for (k, v) in row.iter_mut().enumerate() {
            *v = c(k, r) / det; // transpose of the cofactors
        }
    }
    Some(inv)
}

/// Camera-to-world rotation and camera centre: the exact inverse of world-to-camera `[R | t]`
/// (`R^-1`, `-R^-1 t`), for any invertible `R`.
pub(crate) fn camera_to_world(pose: &Pose) -> Option<([[f64; 3]; 3], [f64; 3])> {
    let e = to_f64(&pose.extrinsics);
    let r = [
        [e[0][0], e[0][1], e[0][2]],
        [e[1][0], e[1][1], e[1][2]],
        [e[2][0], e[2][1], e[2][2]],
    ];
    let r_inv = invert3(&r)?;
    let t = [e[0][3], e[1][3], e[2][3]];
    let c = mat3_vec(&r_inv, t).map(|v| -v);
    Some((r_inv, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view<'a>(depth: &'a [f32], conf: Option<&'a [f32]>, colors: &'a [u8], w: usize) -> View<'a> {
        View {
            width: w,
            height: depth.len() / w,
            depth,
            confidence: conf,
            sky: None,
            colors,
            pose: assumed_pose(w, depth.len() / w, 90.0),
            name: "t.png".into(),
            original_size: (w, depth.len() / w),
        }
    }

    #[test]
    fn threshold_is_the_base_clamped_between_the_percentiles() {
        let depth = vec![1.0f32; 100];
        let colors = vec![0u8; 300];
        let conf: Vec<f32> = (0..100).map(|i| 1.0 + i as f32 / 10.0).collect();
        let v = view(&depth, Some(&conf), &colors, 10);
        // P40 of 1.0..10.9 is 4.96: above the base 1.05.
        let t = confidence_threshold(std::slice::from_ref(&v), &CloudOptions::default()).unwrap();
        assert!((t - 4.96).abs() < 1e-4, "{t}");
        let cloud = point_cloud(&[v], &CloudOptions::default()).unwrap();
        assert_eq!(cloud.len(), 60);
        // A base above the upper percentile is lowered to it (P90 = 9.91).
        let options = CloudOptions {
            min_confidence: 50.0,
            ..Default::default()
        };
        let v = view(&depth, Some(&conf), &colors, 10);
        let t = confidence_threshold(&[v], &options).unwrap();
        assert!((t - 9.91).abs() < 1e-4, "{t}");
    }

    #[test]
    fn cap_subsamples_evenly_and_deterministically() {
        let depth = vec![2.0f32; 64];
        let colors: Vec<u8> = (0..192).map(|i| i as u8).collect();
        let options = CloudOptions {
            max_points: Some(16),
            ..Default::default()
        };
        let a = point_cloud(&[view(&depth, None, &colors, 8)], &options).unwrap();
        let b = point_cloud(&[view(&depth, None, &colors, 8)], &options).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.len(), 16);
        let pixels: Vec<u32> = a.sources.iter().map(|s| s.1).collect();
        assert_eq!(pixels, (0..16).map(|j| j * 4).collect::<Vec<_>>());
    }

    #[test]
    fn bad_views_are_errors() {
        let depth = vec![1.0f32; 4];
        let colors = vec![0u8; 11];
        let v = view(&depth, None, &colors, 2);
        assert!(matches!(v.validate(), Err(Error::Input(_))));
        let colors = vec![0u8; 12];
        let mut v = view(&depth, None, &colors, 2);
        v.pose.intrinsics = [[0.0; 3]; 3];
        assert!(point_cloud(&[v], &CloudOptions::default()).is_err());
    }

    #[test]
    fn inverse_of_a_rotation_with_translation() {
        // w2c: 90 degrees about z, t = (1, 2, 3); the camera centre is -R^T t.
        let pose = Pose {
            intrinsics: [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],
            extrinsics: [
                [0.0, -1.0, 0.0, 1.0],
                [1.0, 0.0, 0.0, 2.0],
                [0.0, 0.0, 1.0, 3.0],
            ],
        };
        let (r, c) = camera_to_world(&pose).unwrap();
        assert_eq!(r, [[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]);
        assert_eq!(c, [-2.0, 1.0, -3.0]);
    }
}
