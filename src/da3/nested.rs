//! The nested model (the official `NestedDepthAnything3Net`, published as
//! DA3NESTED-GIANT-LARGE): an any-view model (depth, confidence and cameras of every view) and
//! a metric model (metric depth and sky per view) run on the same preprocessed views, and the
//! any-view outputs brought to metres. The steps, as the official forward runs them after both
//! branches ([`align_to_metric`]):
//!
//! 1. metric depth of view `i` times `f_i / 300`, `f_i` the mean of the any-view branch's
//!    focal lengths `(fx + fy) / 2` for that view (in pixels of the processed image);
//! 2. non-sky pixels: the metric branch's sky below 0.3, over all views;
//! 3. the pixels to align: non-sky, any-view confidence at least its median over the non-sky
//!    pixels, metric depth above 1e-2 and any-view depth above 1e-3;
//! 4. the least-squares scale `s = <metric, depth> / <depth, depth>` over them; every depth
//!    and every camera translation times `s`;
//! 5. sky pixels get depth `min(q99, 200)` (`q99` the 0.99 quantile of the scaled non-sky
//!    depth over all views) and confidence 1.
//!
//! The official code estimates both quantiles from 100 000 random samples when there are
//! more pixels; this uses all of them (the value the sampling estimates), so the two agree
//! exactly up to that many pixels. depth-anything.cpp ships the two branches as a pair of
//! files: the any-view one in the standard layout, the metric one under `m_vit.` / `m_head.`
//! (read by every loader here, see [`crate::da3::config::FileLayout`]).

use super::config::Family;
use super::metric::{DepthUnit, FOCAL_UNIT};
use super::model::{Model, Prepared, Session};
use super::multiview::RefViewStrategy;
use super::outputs::{quantile, Prediction};
use super::preprocess::ToRgbImage;
use super::request::{Output, Predictor, Request};
use super::{Error, HeadKind, LoadOptions};
use std::path::Path;

/// The official `compute_sky_mask` threshold: sky below it is "not sky".
const SKY_THRESHOLD: f32 = 0.3;
/// The official `sky_depth_def`: sky is never put farther than this.
const SKY_DEPTH_MAX: f32 = 200.0;

/// The two branches of a nested model, loaded and shared (`Send + Sync`, cheap to clone);
/// per-request state lives in a [`NestedSession`].
#[derive(Clone, Debug)]
pub struct NestedModel {
    anyview: Model,
    metric: Model,
}

impl NestedModel {
    /// Pairs an any-view model (a DualDPT model with a camera decoder: depth, confidence and
    /// intrinsics) with a metric model (a metric model with a sky head). An error naming the
    /// branch that does not fit.
    pub fn new(anyview: Model, metric: Model) -> Result<NestedModel, Error> {
        let a = anyview.config();
        if a.head.kind != HeadKind::DualDpt || a.cam_dim.is_none() {
            return Err(Error::Input(format!(
                "the nested model's any-view branch must be a DualDPT model with a camera \
                 decoder (depth, confidence and cameras); {} is not",
                a.name
            )));
        }
        let m = metric.config();
        if !m.head.sky || m.head.kind != HeadKind::Dpt {
            return Err(Error::Input(format!(
                "the nested model's metric branch must be a metric model with a sky head \
                 (DA3METRIC-LARGE, or depth-anything.cpp's nested `-metric` file); {} is not",
                m.name
            )));
        }
        if a.vit.patch_size != m.vit.patch_size {
            return Err(Error::Input(format!(
                "the two branches use patches of {} and {} pixels; they must see the same \
                 processed image",
                a.vit.patch_size, m.vit.patch_size
            )));
        }
        Ok(NestedModel { anyview, metric })
    }

    /// Loads both files with the same options.
    pub fn load(
        anyview: impl AsRef<Path>,
        metric: impl AsRef<Path>,
        options: &LoadOptions,
    ) -> Result<NestedModel, Error> {
        NestedModel::new(
            Model::load(anyview, options)?,
            Model::load(metric, options)?,
        )
    }

    /// The any-view branch.
    pub fn anyview(&self) -> &Model {
        &self.anyview
    }

    /// The metric branch.
    pub fn metric(&self) -> &Model {
        &self.metric
    }

    /// Per-request state for both branches.
    pub fn session(&self) -> Result<NestedSession, Error> {
        Ok(NestedSession {
            anyview: self.anyview.session()?,
            metric: self.metric.session()?,
        })
    }

    /// Metric depth, confidence and pose for one image, in a session made for this call.
    pub fn predict(&self, image: &(impl ToRgbImage + ?Sized)) -> Result<Prediction, Error> {
        self.session()?.predict(image)
    }
}

/// Per-request state of a [`NestedModel`]: a [`Session`] of each branch.
#[derive(Debug)]
pub struct NestedSession {
    anyview: Session,
    metric: Session,
}

impl NestedSession {
    /// The any-view branch's session.
    pub fn anyview(&self) -> &Session {
        &self.anyview
    }

    /// One image: the scene of one view ([`NestedSession::run`] of [`Request::image`]).
    pub fn predict(&mut self, image: &(impl ToRgbImage + ?Sized)) -> Result<Prediction, Error> {
        let image = image.to_rgb_image()?;
        self.run(&Request::image(&image))?.into_single()
    }

    /// Both branches on the request's views (preprocessed once, at the any-view model's
    /// process resolution unless the request says), then [`align_to_metric`]:
    /// [`Output::metric_scale`] holds the scale and each view's [`Prediction::sky`] is the
    /// metric branch's sky. Known poses are refused (the nested pair brings its own scale).
    pub fn run(&mut self, request: &Request<'_>) -> Result<Output, Error> {
        Predictor::run(self, request)
    }
}

impl Predictor for NestedSession {
    fn run(&mut self, request: &Request<'_>) -> Result<Output, Error> {
        request.check()?;
        if request.poses.is_some() {
            return Err(Error::Input(
                "the nested model takes no known poses: its metric branch gives the scale"
                    .to_owned(),
            ));
        }
        self.anyview.check_outputs(request)?;
        let started = std::time::Instant::now();
        let model = self.anyview.model();
        let prepared = Prepared::new(request, Family::Da3, model.process_res(), model.threads())?;
        let preprocessed = std::time::Instant::now();
        let mut scene = self.anyview.run_prepared(&prepared, request)?;
        if !request.raw {
            // The metric branch has no global attention: its views are independent, one batch.
            let metric = self
                .metric
                .forward_scene(
                    &prepared.images,
                    RefViewStrategy::First,
                    None,
                    Default::default(),
                )?
                .0;
            let scale = align_to_metric(&mut scene.views, &metric.views)?;
            scene.metric_scale = Some(scale);
            for view in &mut scene.views {
                view.depth_unit = DepthUnit::Metres;
            }
        }
        scene.timings = crate::da3::request::Timings {
            preprocess: preprocessed - started,
            compute: preprocessed.elapsed(),
        };
        prepared.attach(&mut scene, request);
        Ok(scene)
    }

    fn device_name(&self) -> String {
        self.anyview.device().name()
    }

    fn release_buffers(&mut self) -> Result<(), Error> {
        self.anyview.release_buffers()?;
        self.metric.release_buffers()
    }
}

/// The official alignment of the any-view predictions `views` to the metric branch's raw
/// outputs `metric` (same views, same order, same size): steps 1-5 of the module docs. Returns
/// the scale; sets each view's sky to the metric one. An error when a view lacks what a step
/// needs, or when no pixel is left to align.
pub fn align_to_metric(views: &mut [Prediction], metric: &[Prediction]) -> Result<f64, Error> {
    if views.len() != metric.len() {
        return Err(Error::Input(format!(
            "{} any-view prediction(s) for {} metric one(s)",
            views.len(),
            metric.len()
        )));
    }
    // Step 1: metric depth in the any-view branch's focal length.
    let mut metric_depth = Vec::with_capacity(views.len());
    for (i, (view, m)) in views.iter().zip(metric).enumerate() {
        let size = (view.width, view.height);
        if (m.width, m.height) != size || view.depth.len() != m.depth.len() {
            return Err(Error::Input(format!(
                "view {i}: the branches predicted {}x{} and {}x{}",
                view.width, view.height, m.width, m.height
            )));
        }
        let pose = view
            .pose
            .as_ref()
            .ok_or_else(|| Error::Input(format!("view {i}: the any-view branch gave no camera")))?;
        if view.confidence.is_none() {
            return Err(Error::Input(format!(
                "view {i}: the any-view branch gave no confidence"
            )));
        }
        if m.sky.is_none() {
            return Err(Error::Input(format!(
                "view {i}: the metric branch gave no sky"
            )));
        }
        let focal = (pose.intrinsics[0][0] + pose.intrinsics[1][1]) / 2.0;
        let factor = focal / FOCAL_UNIT;
        metric_depth.push(m.depth.iter().map(|d| d * factor).collect::<Vec<f32>>());
    }
    let sky = |i: usize| metric[i].sky.as_deref().expect("checked above");
    fn confidence(v: &Prediction) -> &[f32] {
        v.confidence.as_deref().expect("checked above")
    }

    // Steps 2-3: the median confidence of the non-sky pixels, then the pixels to align.
    let mut non_sky_confidence = Vec::new();
    for (i, view) in views.iter().enumerate() {
        non_sky_confidence.extend(
            confidence(view)
                .iter()
                .zip(sky(i))
                .filter(|(_, &s)| s < SKY_THRESHOLD)
                .map(|(&c, _)| c),
        );
    }
    let non_sky = non_sky_confidence.len();
    // The official code asserts more than 10 (and stops); here it is an error.
    if non_sky <= 10 {
        return Err(Error::Input(format!(
            "the metric branch sees sky almost everywhere ({non_sky} non-sky pixel(s)): \
             nothing to align the depth to"
        )));
    }
    let median = quantile(non_sky_confidence, 0.5);

    // Step 4: least squares over the aligned pixels (sums in f64).
    let (mut num, mut den, mut aligned) = (0.0f64, 0.0f64, 0usize);
    for (i, view) in views.iter().enumerate() {
        for (((&d, &c), &s), &md) in view
            .depth
            .iter()
            .zip(confidence(view))
            .zip(sky(i))
            .zip(&metric_depth[i])
        {
            if c >= median && s < SKY_THRESHOLD && md > 1e-2 && d > 1e-3 {
                num += f64::from(md) * f64::from(d);
                den += f64::from(d) * f64::from(d);
                aligned += 1;
            }
        }
    }
    if aligned == 0 {
        // The official code would scale everything by 0.
        return Err(Error::Input(
            "no pixel to align: none is non-sky with confident, positive depth in both \
             branches"
                .to_owned(),
        ));
    }
    let scale = num / den.max(1e-12);
    let s = scale as f32;
    for view in views.iter_mut() {
        for d in &mut view.depth {
            *d *= s;
        }
        let pose = view.pose.as_mut().expect("checked above");
        for row in &mut pose.extrinsics {
            row[3] *= s;
        }
    }

    // Step 5: sky at the far end of the scaled non-sky depth.
    let mut non_sky_depth = Vec::with_capacity(non_sky);
    for (i, view) in views.iter().enumerate() {
        non_sky_depth.extend(
            view.depth
                .iter()
                .zip(sky(i))
                .filter(|(_, &s)| s < SKY_THRESHOLD)
                .map(|(&d, _)| d),
        );
    }
    let far = quantile(non_sky_depth, 0.99).min(SKY_DEPTH_MAX);
    for (i, view) in views.iter_mut().enumerate() {
        let sky = sky(i);
        let confidence = view.confidence.as_mut().expect("checked above");
        for ((d, c), &s) in view.depth.iter_mut().zip(confidence).zip(sky) {
            if s >= SKY_THRESHOLD {
                *d = far;
                *c = 1.0;
            }
        }
        view.sky = Some(sky.to_vec());
    }
    Ok(scale)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da3::Pose;

    fn view(depth: Vec<f32>, confidence: Vec<f32>, focal: f32) -> Prediction {
        let n = depth.len();
        Prediction {
            width: n,
            height: 1,
            depth,
            confidence: Some(confidence),
            sky: None,
            pose: Some(Pose {
                extrinsics: [
                    [1.0, 0.0, 0.0, 0.5],
                    [0.0, 1.0, 0.0, -1.0],
                    [0.0, 0.0, 1.0, 2.0],
                ],
                intrinsics: [[focal, 0.0, 0.5], [0.0, focal, 0.5], [0.0, 0.0, 1.0]],
            }),
            probes: Vec::new(),
            rays: None,
            ..Default::default()
        }
    }

    fn metric(depth: Vec<f32>, sky: Vec<f32>) -> Prediction {
        Prediction {
            width: depth.len(),
            height: 1,
            depth,
            confidence: None,
            sky: Some(sky),
            pose: None,
            probes: Vec::new(),
            rays: None,
            ..Default::default()
        }
    }

    #[test]
    fn a_scene_that_is_a_scaled_copy_of_the_metric_one_gets_that_scale() {
        // 20 non-sky pixels per view with metric depth exactly 4x the any-view depth after
        // the focal scaling (f = 600: factor 2), and 2 sky pixels.
        let mut views = Vec::new();
        let mut metrics = Vec::new();
        for v in 0..2 {
            let depth: Vec<f32> = (0..22).map(|i| 1.0 + (i + v) as f32 * 0.1).collect();
            let conf: Vec<f32> = (0..22).map(|i| 1.0 + i as f32).collect();
            let raw: Vec<f32> = depth.iter().map(|d| d * 2.0).collect();
            let mut sky = vec![0.0; 22];
            sky[20] = 0.9;
            sky[21] = 0.3;
            views.push(view(depth, conf, 600.0));
            metrics.push(metric(raw, sky));
        }
        let scale = align_to_metric(&mut views, &metrics).unwrap();
        assert!((scale - 4.0).abs() < 1e-6, "{scale}");
        let v = &views[1];
        assert!((v.depth[3] - 4.0 * 1.4).abs() < 1e-5);
        let pose = v.pose.as_ref().unwrap();
        assert_eq!(
            [pose.extrinsics[0][3], pose.extrinsics[1][3]],
            [2.0, -4.0],
            "translations scale, rotations do not"
        );
        assert_eq!(pose.extrinsics[0][0], 1.0);
        // Sky (>= 0.3, so both) is the 0.99 quantile of all scaled non-sky depth, conf 1.
        let mut all: Vec<f32> = views
            .iter()
            .flat_map(|v| v.depth[..20].iter().copied())
            .collect();
        all.sort_by(f32::total_cmp);
        let pos = 0.99 * 39.0;
        let q = all[38] + (all[39] - all[38]) * (pos - 38.0) as f32;
        for v in &views {
            assert_eq!(&v.depth[20..], &[q, q]);
            assert_eq!(&v.confidence.as_ref().unwrap()[20..], &[1.0, 1.0]);
            assert_eq!(v.sky.as_deref().unwrap()[20], 0.9);
        }
    }

    #[test]
    fn only_confident_non_sky_pixels_with_positive_depth_decide_the_scale() {
        // Half of the pixels are confident and agree on scale 3; the others (below the
        // median confidence, or with depth at or below the thresholds) would say 100.
        let n = 40;
        let depth: Vec<f32> = (0..n)
            .map(|i| if i == 39 { 0.0005 } else { 1.0 + i as f32 })
            .collect();
        let conf: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let raw: Vec<f32> = (0..n)
            .map(|i| {
                let d = depth[i];
                match i {
                    // Confident but metric depth too small: left out.
                    30 => 0.005,
                    i if i >= 20 => 3.0 * d,
                    _ => 100.0 * d,
                }
            })
            .collect();
        let mut views = vec![view(depth, conf, 300.0)];
        let metrics = vec![metric(raw, vec![0.0; n])];
        let scale = align_to_metric(&mut views, &metrics).unwrap();
        assert!((scale - 3.0).abs() < 1e-6, "{scale}");
    }

    #[test]
    fn sky_never_goes_farther_than_200() {
        let depth: Vec<f32> = (0..30).map(|i| 50.0 + i as f32).collect();
        let mut sky = vec![0.0; 30];
        sky[29] = 1.0;
        let raw = depth.clone();
        let mut views = vec![view(depth, vec![1.0; 30], 3000.0)];
        let scale = align_to_metric(&mut views, &[metric(raw, sky)]).unwrap();
        assert!((scale - 10.0).abs() < 1e-6);
        assert_eq!(views[0].depth[29], 200.0);
    }

    #[test]
    fn a_sky_only_or_unalignable_scene_is_an_error_not_a_zero_scale() {
        let mut views = vec![view(vec![1.0; 30], vec![1.0; 30], 300.0)];
        let all_sky = metric(vec![1.0; 30], vec![0.5; 30]);
        let err = align_to_metric(&mut views, &[all_sky]).unwrap_err();
        assert!(err.to_string().contains("sky almost everywhere"), "{err}");
        let too_near = metric(vec![0.001; 30], vec![0.0; 30]);
        let err = align_to_metric(&mut views, &[too_near]).unwrap_err();
        assert!(err.to_string().contains("no pixel to align"), "{err}");
        let no_camera = Prediction {
            pose: None,
            ..views[0].clone()
        };
        let err =
            align_to_metric(&mut [no_camera], &[metric(vec![1.0; 30], vec![0.0; 30])]).unwrap_err();
        assert!(err.to_string().contains("no camera"), "{err}");
        let err = align_to_metric(&mut views, &[]).unwrap_err();
        assert!(
            err.to_string().contains("1 any-view prediction(s) for 0"),
            "{err}"
        );
    }
}
