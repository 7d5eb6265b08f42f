//! Similarity transforms estimated from corresponding points: the weighted least-squares
//! solution (Umeyama), the estimator and Huber-reweighted loop of the official DA3-Streaming
//! alignment, and the alignment of two windows' point maps on their shared frames.

use nalgebra::{Matrix3, Vector3};

pub use super::error::AlignError;
use super::error::{check_finite_points, check_length, degenerate};
use super::sim3::Sim3;

/// The fewest points with positive weight that determine a similarity transform (two leave the
/// rotation about their line free).
pub const MIN_POINTS: usize = 3;

/// Below this total weight the official estimator refuses to estimate ("total weight too small
/// for meaningful estimation"); [`robust_sim3`] and [`spread_ratio_sim3`] keep the rule.
pub const MIN_TOTAL_WEIGHT: f64 = 1e-6;

/// The weighted least-squares similarity (Umeyama 1991): the `s`, `R` (det +1) and `t` that
/// minimise `Σ wᵢ |targetᵢ − (s R sourceᵢ + t)|²`.
///
/// Weights must be finite and non-negative; at least [`MIN_POINTS`] must be positive.
/// Errors on mismatched lengths, non-finite input, source points that coincide, and points
/// that lie on one line (the rotation about it would be arbitrary).
pub fn weighted_umeyama(
    source: &[[f64; 3]],
    target: &[[f64; 3]],
    weights: &[f64],
) -> Result<Sim3, AlignError> {
    let pairs = WeightedPairs::new(source, target, weights)?;
    let moments = pairs.moments(weights)?;
    let (rotation, trace) = best_rotation(&moments.cross_covariance, pairs.len())?;
    // The least-squares scale: tr(D S) / σ²_source.
    let scale = trace / moments.source_variance;
    if scale.is_nan() || scale <= 0.0 {
        return Err(degenerate(format!(
            "the {} weighted target points coincide (least-squares scale {scale})",
            pairs.len()
        )));
    }
    let translation = moments.target_mean - scale * rotation * moments.source_mean;
    Ok(Sim3::from_parts(scale, &rotation, &translation))
}

/// The official DA3-Streaming estimator (`weighted_estimate_sim3`): weighted centroids and
/// Kabsch rotation as in [`weighted_umeyama`], but the scale is the ratio of the weighted RMS
/// distances to the centroids, `s = σ_target / σ_source`, rather than the least-squares scale.
///
/// Both agree on exact correspondences. Under noise the least-squares scale shrinks with the
/// correlation of the two point sets, while this ratio does not, and estimating in the other
/// direction gives exactly the inverse scale. Errors as [`weighted_umeyama`], and also when
/// the total weight is below [`MIN_TOTAL_WEIGHT`], as the official code does.
pub fn spread_ratio_sim3(
    source: &[[f64; 3]],
    target: &[[f64; 3]],
    weights: &[f64],
) -> Result<Sim3, AlignError> {
    let pairs = WeightedPairs::new(source, target, weights)?;
    pairs.spread_ratio_estimate(weights)
}

/// Options of the Huber-reweighted estimate ([`robust_sim3`]).
#[derive(Debug, Clone)]
pub struct RobustOptions {
    /// Residual distance (in target units) above which a point's influence decreases as
    /// `delta / residual`.
    pub huber_delta: f64,
    /// The most reweighting rounds after the initial estimate.
    pub max_iterations: usize,
    /// Stops when the parameters change by less than this (with a rotation change below
    /// 0.1°), or when the Huber cost changes by less than this fraction.
    pub tolerance: f64,
}

impl Default for RobustOptions {
    /// The official DA3-Streaming configuration (`IRLS` in `base_config.yaml`): delta 0.1,
    /// 5 iterations, tolerance 1e-9.
    fn default() -> RobustOptions {
        RobustOptions {
            huber_delta: 0.1,
            max_iterations: 5,
            tolerance: 1e-9,
        }
    }
}

/// A similarity transform estimated from correspondences, with how well it fits.
#[derive(Debug, Clone)]
pub struct Alignment {
    /// Maps source points onto target points.
    pub transform: Sim3,
    /// Reweighting rounds run (each computes residuals under the current estimate and a new
    /// estimate from Huber weights; the round that meets the stopping test discards its new
    /// estimate, as the official loop does).
    pub iterations: usize,
    /// Of the points with positive weight, the fraction whose residual under `transform` is
    /// at most the Huber delta.
    pub inlier_fraction: f64,
    /// Root mean square residual of those inliers (of all points with positive weight when
    /// there is none).
    pub rms: f64,
}

/// The official DA3-Streaming robust estimate (`robust_weighted_estimate_sim3`, method
/// `sim3`): starts from [`spread_ratio_sim3`] with `weights`, then repeats: residual distances
/// `rᵢ` under the current estimate, Huber weights `min(1, delta / rᵢ)` times `weights`,
/// normalised, and a new [`spread_ratio_sim3`] estimate. The loop stops after
/// `max_iterations` rounds, or when the new estimate moves by less than `tolerance`
/// (`|Δs| + |Δt|`, with a rotation change below 0.1°), or when the Huber cost
/// `Σ weightsᵢ huber(rᵢ)` of the current estimate changed by less than `tolerance` times the
/// previous one; the stopping round's new estimate is not taken.
///
/// Residuals are Euclidean distances in target units, not normalised: `huber_delta` is a
/// distance.
pub fn robust_sim3(
    source: &[[f64; 3]],
    target: &[[f64; 3]],
    weights: &[f64],
    options: &RobustOptions,
) -> Result<Alignment, AlignError> {
    check_robust_options(options)?;
    let pairs = WeightedPairs::new(source, target, weights)?;
    let delta = options.huber_delta;
    let mut estimate = pairs.spread_ratio_estimate(weights)?;
    let mut previous_cost = f64::INFINITY;
    let mut rounds = 0;
    let mut combined = vec![0.0; pairs.len()];
    while rounds < options.max_iterations {
        rounds += 1;
        let residuals = pairs.residuals(&estimate);
        for ((combined, &weight), &residual) in combined.iter_mut().zip(weights).zip(&residuals) {
            let huber_weight = if residual > delta {
                delta / residual
            } else {
                1.0
            };
            *combined = weight * huber_weight;
        }
        // The official code normalises here (with 1e-12 in the denominator) and the estimator
        // normalises again; both are kept so that the weights agree to the last bit.
        let total: f64 = combined.iter().sum::<f64>() + 1e-12;
        combined.iter_mut().for_each(|w| *w /= total);
        let next = pairs.spread_ratio_estimate(&combined)?;

        let parameter_change = (next.scale - estimate.scale).abs()
            + (next.translation_vector() - estimate.translation_vector()).norm();
        let rotation_change = rotation_angle_between(&next, &estimate);
        let cost: f64 = residuals
            .iter()
            .zip(weights)
            .map(|(&r, &w)| huber_cost(r, delta) * w)
            .sum();
        let settled = parameter_change < options.tolerance && rotation_change < 0.1f64.to_radians();
        // With the previous cost infinite the relative test is false, as in the official code.
        let stalled = (previous_cost - cost).abs() < options.tolerance * previous_cost;
        if settled || stalled {
            break;
        }
        estimate = next;
        previous_cost = cost;
    }
    Ok(pairs.summarise(estimate, rounds, weights, delta))
}

/// The official DA3-Streaming alignment of two windows on their shared frames
/// (`weighted_align_point_maps`, method `sim3`): keeps the points where both confidences exceed
/// `conf_threshold`, weights each by `sqrt(target_conf · source_conf)`, and returns the
/// [`robust_sim3`] transform that maps `source` points onto `target` points.
///
/// The four slices hold the shared frames' point maps flattened in the same order (frame,
/// row, column), so entry `i` of each is the same pixel of the same frame. (The official code
/// takes the first `min(b₁, b₂)` frames of each; pass equal frame counts.) Non-finite
/// confidences never pass the threshold; a kept point that is not finite is an error. The
/// returned `inlier_fraction` is a fraction of the kept points.
pub fn align_point_maps(
    target: &[[f64; 3]],
    target_conf: &[f32],
    source: &[[f64; 3]],
    source_conf: &[f32],
    conf_threshold: f64,
    options: &RobustOptions,
) -> Result<Alignment, AlignError> {
    check_length("target_conf", target.len(), target_conf.len())?;
    check_length("source", target.len(), source.len())?;
    check_length("source_conf", target.len(), source_conf.len())?;
    if conf_threshold.is_nan() {
        return Err(AlignError::InvalidOption {
            reason: "conf_threshold is NaN".to_string(),
        });
    }
    let mut kept_target = Vec::new();
    let mut kept_source = Vec::new();
    let mut kept_weights = Vec::new();
    for index in 0..target.len() {
        let (target_confidence, source_confidence) =
            (f64::from(target_conf[index]), f64::from(source_conf[index]));
        if target_confidence > conf_threshold && source_confidence > conf_threshold {
            kept_target.push(target[index]);
            kept_source.push(source[index]);
            kept_weights.push((target_confidence * source_confidence).sqrt());
        }
    }
    if kept_target.len() < MIN_POINTS {
        return Err(AlignError::TooFewPoints {
            what: "points with both confidences above the threshold",
            found: kept_target.len(),
            required: MIN_POINTS,
        });
    }
    robust_sim3(&kept_source, &kept_target, &kept_weights, options).map_err(|error| match error {
        // Report positions in the caller's arrays, not in the kept subset.
        AlignError::NonFinite { what, index } => {
            let position = nth_kept_index(target_conf, source_conf, conf_threshold, index);
            AlignError::NonFinite {
                what,
                index: position,
            }
        }
        other => other,
    })
}

/// The confidence threshold the official code uses for every alignment (`align_2pcds`): a tenth
/// of the smaller of the two confidence medians (of all values, the mean of the middle two for
/// an even count). Non-finite values are left out; `None` when either side has none left.
pub fn overlap_conf_threshold(target_conf: &[f32], source_conf: &[f32]) -> Option<f64> {
    let target_median = median(target_conf)?;
    let source_median = median(source_conf)?;
    Some(target_median.min(source_median) * 0.1)
}

fn median(values: &[f32]) -> Option<f64> {
    let mut finite: Vec<f64> = values
        .iter()
        .map(|&v| f64::from(v))
        .filter(|v| v.is_finite())
        .collect();
    if finite.is_empty() {
        return None;
    }
    finite.sort_by(f64::total_cmp);
    let middle = finite.len() / 2;
    Some(if finite.len() % 2 == 1 {
        finite[middle]
    } else {
        0.5 * (finite[middle - 1] + finite[middle])
    })
}

fn nth_kept_index(target_conf: &[f32], source_conf: &[f32], threshold: f64, n: usize) -> usize {
    target_conf
        .iter()
        .zip(source_conf)
        .enumerate()
        .filter(|(_, (&t, &s))| f64::from(t) > threshold && f64::from(s) > threshold)
        .nth(n)
        .map_or(n, |(index, _)| index)
}

fn huber_cost(residual: f64, delta: f64) -> f64 {
    let magnitude = residual.abs();
    if magnitude <= delta {
        0.5 * residual * residual
    } else {
        delta * (magnitude - 0.5 * delta)
    }
}

/// The angle of `a.rotation · b.rotationᵀ` from its trace, clamped as the official code does.
fn rotation_angle_between(a: &Sim3, b: &Sim3) -> f64 {
    let relative = a.rotation_matrix() * b.rotation_matrix().transpose();
    ((relative.trace() - 1.0) / 2.0).clamp(-1.0, 1.0).acos()
}

fn check_robust_options(options: &RobustOptions) -> Result<(), AlignError> {
    super::error::check_positive("huber_delta", options.huber_delta)?;
    super::error::check_non_negative("tolerance", options.tolerance)
}

/// Validated correspondences as nalgebra vectors, with the estimators that share them.
struct WeightedPairs {
    source: Vec<Vector3<f64>>,
    target: Vec<Vector3<f64>>,
    /// How many weights are positive.
    positive: usize,
}

/// Weighted centroids and second moments of a set of correspondences.
struct Moments {
    source_mean: Vector3<f64>,
    target_mean: Vector3<f64>,
    /// `Σ wᵢ (targetᵢ − μ_t)(sourceᵢ − μ_s)ᵀ / Σ w`.
    cross_covariance: Matrix3<f64>,
    /// `Σ wᵢ |sourceᵢ − μ_s|² / Σ w`.
    source_variance: f64,
    /// `Σ wᵢ |targetᵢ − μ_t|² / Σ w`.
    target_variance: f64,
}

impl WeightedPairs {
    fn new(
        source: &[[f64; 3]],
        target: &[[f64; 3]],
        weights: &[f64],
    ) -> Result<WeightedPairs, AlignError> {
        check_length("target", source.len(), target.len())?;
        check_length("weights", source.len(), weights.len())?;
        check_finite_points("source", source)?;
        check_finite_points("target", target)?;
        if let Some((index, &value)) = weights
            .iter()
            .enumerate()
            .find(|(_, w)| !(w.is_finite() && **w >= 0.0))
        {
            return Err(AlignError::InvalidWeight {
                what: "weights",
                index,
                value,
            });
        }
        let positive = weights.iter().filter(|&&w| w > 0.0).count();
        if positive < MIN_POINTS {
            return Err(AlignError::TooFewPoints {
                what: "points with positive weight",
                found: positive,
                required: MIN_POINTS,
            });
        }
        Ok(WeightedPairs {
            source: source.iter().map(|&p| Vector3::from(p)).collect(),
            target: target.iter().map(|&p| Vector3::from(p)).collect(),
            positive,
        })
    }

    fn len(&self) -> usize {
        self.source.len()
    }

    /// Centroids and moments under `weights` (already validated to have the right length and
    /// to be non-negative), normalised by their total.
    fn moments(&self, weights: &[f64]) -> Result<Moments, AlignError> {
        let total: f64 = weights.iter().sum();
        if total.is_nan() || total <= 0.0 {
            return Err(degenerate(format!(
                "the total weight of {} points is {total}",
                self.len()
            )));
        }
        let normalised = weights.iter().map(|w| w / total);
        let mut source_mean = Vector3::zeros();
        let mut target_mean = Vector3::zeros();
        for ((w, s), t) in normalised.clone().zip(&self.source).zip(&self.target) {
            source_mean += w * s;
            target_mean += w * t;
        }
        let mut cross_covariance = Matrix3::zeros();
        let (mut source_variance, mut target_variance) = (0.0, 0.0);
        for ((w, s), t) in normalised.zip(&self.source).zip(&self.target) {
            let (s, t) = (s - source_mean, t - target_mean);
            cross_covariance += w * t * s.transpose();
            source_variance += w * s.norm_squared();
            target_variance += w * t.norm_squared();
        }
        // Relative to the points' magnitude, a spread this small is rounding noise.
        let magnitude = self.source.iter().map(|p| p.amax()).fold(0.0, f64::max);
        if source_variance <= (1e-12 * magnitude).powi(2) {
            return Err(degenerate(format!(
                "the {} weighted source points coincide",
                self.positive
            )));
        }
        Ok(Moments {
            source_mean,
            target_mean,
            cross_covariance,
            source_variance,
            target_variance,
        })
    }

    /// The official estimator (see [`spread_ratio_sim3`]).
    fn spread_ratio_estimate(&self, weights: &[f64]) -> Result<Sim3, AlignError> {
        let total: f64 = weights.iter().sum();
        if total < MIN_TOTAL_WEIGHT {
            return Err(degenerate(format!(
                "the total weight of {} points is {total}, below {MIN_TOTAL_WEIGHT}",
                self.len()
            )));
        }
        let moments = self.moments(weights)?;
        let scale = (moments.target_variance / moments.source_variance).sqrt();
        if scale.is_nan() || scale <= 0.0 {
            return Err(degenerate(format!(
                "the {} weighted target points coincide",
                self.positive
            )));
        }
        let (rotation, _) = best_rotation(&moments.cross_covariance, self.positive)?;
        let translation = moments.target_mean - scale * rotation * moments.source_mean;
        Ok(Sim3::from_parts(scale, &rotation, &translation))
    }

    fn residuals(&self, transform: &Sim3) -> Vec<f64> {
        let scaled_rotation = transform.scale * transform.rotation_matrix();
        let translation = transform.translation_vector();
        self.source
            .iter()
            .zip(&self.target)
            .map(|(s, t)| (t - (scaled_rotation * s + translation)).norm())
            .collect()
    }

    fn summarise(
        &self,
        transform: Sim3,
        iterations: usize,
        weights: &[f64],
        delta: f64,
    ) -> Alignment {
        let residuals = self.residuals(&transform);
        let counted: Vec<f64> = residuals
            .iter()
            .zip(weights)
            .filter(|(_, &w)| w > 0.0)
            .map(|(&r, _)| r)
            .collect();
        let inliers: Vec<f64> = counted.iter().copied().filter(|&r| r <= delta).collect();
        let rms_of = |values: &[f64]| {
            (values.iter().map(|r| r * r).sum::<f64>() / values.len() as f64).sqrt()
        };
        Alignment {
            transform,
            iterations,
            inlier_fraction: inliers.len() as f64 / counted.len() as f64,
            rms: if inliers.is_empty() {
                rms_of(&counted)
            } else {
                rms_of(&inliers)
            },
        }
    }
}

/// The rotation `R` (det +1) that maximises `tr(Rᵀ C)` for the cross-covariance
/// `C = Σ w (t − μ_t)(s − μ_s)ᵀ`, with the maximum `Σ dᵢ σᵢ` (the Umeyama scale numerator).
/// When the best orthogonal matrix is a reflection, the singular direction with the smallest
/// value is flipped (Umeyama's `S`), as the official code does.
fn best_rotation(
    cross_covariance: &Matrix3<f64>,
    points: usize,
) -> Result<(Matrix3<f64>, f64), AlignError> {
    let svd = cross_covariance.svd(true, true);
    let (Some(u), Some(v_t)) = (svd.u, svd.v_t) else {
        return Err(degenerate(format!(
            "the SVD of the {points} points' covariance failed"
        )));
    };
    let singular = svd.singular_values;
    let largest = singular.max();
    let smallest_index = singular.imin();
    let middle = singular.sum() - largest - singular[smallest_index];
    // Rank below 2: all points on one line (or one point), the rotation about it is free.
    if middle.is_nan() || middle <= 1e-12 * largest {
        return Err(degenerate(format!(
            "the {points} weighted points lie on one line or coincide (covariance singular values {:.3e}, {:.3e}, {:.3e})",
            singular[0], singular[1], singular[2]
        )));
    }
    let mut signs = Vector3::repeat(1.0);
    if (u * v_t).determinant() < 0.0 {
        signs[smallest_index] = -1.0;
    }
    let rotation = u * Matrix3::from_diagonal(&signs) * v_t;
    Ok((rotation, singular.dot(&signs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotation(v: [f64; 3]) -> [[f64; 3]; 3] {
        Sim3::exp(&[0.0, 0.0, 0.0, v[0], v[1], v[2], 0.0]).rotation
    }

    /// A small deterministic generator (SplitMix64) so that tests need no dependency.
    pub(super) struct Random(u64);

    impl Random {
        pub(super) fn new(seed: u64) -> Random {
            Random(seed)
        }
        pub(super) fn next_u64(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        /// Uniform in [0, 1).
        pub(super) fn uniform(&mut self) -> f64 {
            (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
        }
        /// Standard normal (Box–Muller).
        pub(super) fn normal(&mut self) -> f64 {
            let u = 1.0 - self.uniform();
            let v = self.uniform();
            (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
        }
    }

    fn known_transform() -> Sim3 {
        Sim3::new(1.7, rotation([0.4, -0.3, 1.2]), [0.5, -2.0, 3.0])
    }

    fn cloud(random: &mut Random, n: usize) -> Vec<[f64; 3]> {
        (0..n)
            .map(|_| {
                [
                    random.normal() * 2.0,
                    random.normal(),
                    random.normal() * 0.5 + 4.0,
                ]
            })
            .collect()
    }

    fn transform_error(a: &Sim3, b: &Sim3) -> (f64, f64, f64) {
        (
            (a.scale - b.scale).abs(),
            rotation_angle_between(a, b),
            (a.translation_vector() - b.translation_vector()).norm(),
        )
    }

    #[test]
    fn umeyama_recovers_an_exact_transform() {
        let mut random = Random::new(1);
        let source = cloud(&mut random, 50);
        let truth = known_transform();
        let target: Vec<[f64; 3]> = source.iter().map(|&p| truth.apply(p)).collect();
        let weights: Vec<f64> = (0..50).map(|_| 0.2 + random.uniform()).collect();
        for estimate in [
            weighted_umeyama(&source, &target, &weights).unwrap(),
            spread_ratio_sim3(&source, &target, &weights).unwrap(),
        ] {
            let (ds, dr, dt) = transform_error(&estimate, &truth);
            assert!(ds < 1e-12 && dr < 1e-7 && dt < 1e-11, "{ds} {dr} {dt}");
            let rotation = estimate.rotation_matrix();
            assert!((rotation.determinant() - 1.0).abs() < 1e-12);
        }
    }

    #[test]
    fn umeyama_with_noise_stays_within_bound() {
        // 400 points spread ~1 unit with noise σ = 0.01 per axis: the estimate's errors are
        // of order σ/√n ≈ 5e-4; the bounds leave a margin of ~5×.
        let mut random = Random::new(2);
        let source = cloud(&mut random, 400);
        let truth = known_transform();
        let target: Vec<[f64; 3]> = source
            .iter()
            .map(|&p| {
                let q = truth.apply(p);
                [
                    q[0] + 0.01 * random.normal(),
                    q[1] + 0.01 * random.normal(),
                    q[2] + 0.01 * random.normal(),
                ]
            })
            .collect();
        let weights = vec![1.0; 400];
        let estimate = weighted_umeyama(&source, &target, &weights).unwrap();
        let (ds, dr, dt) = transform_error(&estimate, &truth);
        assert!(
            ds < 2e-3 && dr < 2e-3 && dt < 1e-2,
            "scale {ds}, angle {dr}, translation {dt}"
        );
    }

    #[test]
    fn umeyama_minimises_the_weighted_squared_error() {
        // Perturbing the optimum in any tangent direction never lowers the cost.
        let mut random = Random::new(3);
        let source = cloud(&mut random, 30);
        let target = cloud(&mut random, 30);
        let weights: Vec<f64> = (0..30).map(|_| random.uniform()).collect();
        let best = weighted_umeyama(&source, &target, &weights).unwrap();
        let cost = |t: &Sim3| -> f64 {
            source
                .iter()
                .zip(&target)
                .zip(&weights)
                .map(|((&s, &q), w)| {
                    let p = t.apply(s);
                    w * ((p[0] - q[0]).powi(2) + (p[1] - q[1]).powi(2) + (p[2] - q[2]).powi(2))
                })
                .sum()
        };
        let optimum = cost(&best);
        for k in 0..7 {
            for step in [1e-4, -1e-4] {
                let mut v = [0.0; 7];
                v[k] = step;
                assert!(cost(&best.compose(&Sim3::exp(&v))) >= optimum - 1e-12);
            }
        }
    }

    #[test]
    fn weighted_umeyama_ignores_zero_weight_points() {
        let mut random = Random::new(4);
        let source = cloud(&mut random, 20);
        let truth = known_transform();
        let mut target: Vec<[f64; 3]> = source.iter().map(|&p| truth.apply(p)).collect();
        let mut weights = vec![1.0; 20];
        for k in 0..5 {
            target[k] = [100.0, -50.0, 7.0];
            weights[k] = 0.0;
        }
        let estimate = weighted_umeyama(&source, &target, &weights).unwrap();
        let (ds, dr, dt) = transform_error(&estimate, &truth);
        assert!(ds < 1e-12 && dr < 1e-7 && dt < 1e-11);
    }

    /// Source points, target points, weights and the true transform.
    type Problem = (Vec<[f64; 3]>, Vec<[f64; 3]>, Vec<f64>, Sim3);

    fn outlier_problem(seed: u64, outlier_fraction: f64) -> Problem {
        let mut random = Random::new(seed);
        let n = 600;
        let source = cloud(&mut random, n);
        let truth = known_transform();
        let target = source
            .iter()
            .map(|&p| {
                let q = truth.apply(p);
                if random.uniform() < outlier_fraction {
                    // Gross outliers: displaced by 1–3 units, all to one side (a wrong depth
                    // layer), so they bias a plain least-squares fit.
                    let push = 1.0 + 2.0 * random.uniform();
                    [q[0] + push, q[1] + 0.5 * push, q[2] - push]
                } else {
                    [
                        q[0] + 0.005 * random.normal(),
                        q[1] + 0.005 * random.normal(),
                        q[2] + 0.005 * random.normal(),
                    ]
                }
            })
            .collect();
        let weights = (0..n).map(|_| 1.0 + random.uniform()).collect();
        (source, target, weights, truth)
    }

    #[test]
    fn robust_estimate_rejects_gross_outliers_that_break_umeyama() {
        for (seed, fraction) in [(10, 0.2), (11, 0.25), (12, 0.3)] {
            let (source, target, weights, truth) = outlier_problem(seed, fraction);
            let plain = weighted_umeyama(&source, &target, &weights).unwrap();
            let (ps, pr, pt) = transform_error(&plain, &truth);
            let options = RobustOptions {
                max_iterations: 30,
                ..RobustOptions::default()
            };
            let robust = robust_sim3(&source, &target, &weights, &options).unwrap();
            let (rs, rr, rt) = transform_error(&robust.transform, &truth);
            println!(
                "{:.0}% outliers: Umeyama errors scale {ps:.2e} angle {pr:.2e} translation {pt:.2e}; \
                 robust scale {rs:.2e} angle {rr:.2e} translation {rt:.2e} after {} rounds, {:.1}% inliers, rms {:.4}",
                fraction * 100.0, robust.iterations, robust.inlier_fraction * 100.0, robust.rms
            );
            // Huber weights bound each outlier's pull to `delta` rather than removing it, so
            // a one-sided outlier population leaves a bias of about
            // fraction · delta / (1 − fraction) ≈ 0.03–0.05 in translation: the bounds allow
            // that, and the plain estimate is more than 0.3 off.
            assert!(
                pt > 0.3,
                "plain Umeyama should be thrown off by the outliers: {pt}"
            );
            assert!(
                rs < 0.01 && rr < 0.005 && rt < 0.08,
                "robust estimate off: {rs} {rr} {rt}"
            );
            assert!(rt < pt / 8.0 && rr < pr / 5.0);
            assert!(robust.inlier_fraction > 0.6 && robust.inlier_fraction < 1.0 - fraction + 0.05);
            assert!(robust.rms < 0.05);
        }
    }

    #[test]
    fn robust_estimate_with_official_options_improves_on_its_start() {
        let (source, target, weights, truth) = outlier_problem(20, 0.15);
        let start = spread_ratio_sim3(&source, &target, &weights).unwrap();
        let robust = robust_sim3(&source, &target, &weights, &RobustOptions::default()).unwrap();
        assert!(robust.iterations <= 5);
        let (_, _, start_error) = transform_error(&start, &truth);
        let (_, _, robust_error) = transform_error(&robust.transform, &truth);
        assert!(
            robust_error < 0.5 * start_error,
            "{robust_error} vs {start_error}"
        );
    }

    #[test]
    fn align_point_maps_keeps_confident_points_and_maps_source_to_target() {
        let mut random = Random::new(30);
        let truth = known_transform();
        let source = cloud(&mut random, 200);
        let mut target: Vec<[f64; 3]> = source.iter().map(|&p| truth.apply(p)).collect();
        let mut target_conf = vec![5.0f32; 200];
        let mut source_conf = vec![4.0f32; 200];
        // Low-confidence points are garbage and must be ignored, on either side.
        for k in 0..40 {
            target[k] = [random.normal() * 10.0, 0.0, 0.0];
            if k % 2 == 0 {
                target_conf[k] = 0.1;
            } else {
                source_conf[k] = f32::NAN;
            }
        }
        target[0] = [f64::NAN; 3];
        let alignment = align_point_maps(
            &target,
            &target_conf,
            &source,
            &source_conf,
            1.0,
            &RobustOptions::default(),
        )
        .unwrap();
        let (ds, dr, dt) = transform_error(&alignment.transform, &truth);
        assert!(ds < 1e-10 && dr < 1e-7 && dt < 1e-9, "{ds} {dr} {dt}");
        assert_eq!(alignment.inlier_fraction, 1.0);
    }

    #[test]
    fn overlap_threshold_is_a_tenth_of_the_smaller_median() {
        assert_eq!(
            overlap_conf_threshold(&[1.0, 3.0, 2.0], &[10.0, 20.0, 30.0, 40.0]),
            Some(0.2)
        );
        assert_eq!(
            overlap_conf_threshold(&[4.0, 8.0, f32::NAN], &[100.0]),
            Some(0.6000000000000001)
        );
        assert_eq!(overlap_conf_threshold(&[], &[1.0]), None);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let points = [
            [0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0],
            [0.0, 1.0, 0.0],
            [0.0, 0.0, 1.0],
        ];
        let ones = [1.0; 4];
        let options = RobustOptions::default();
        let cases: Vec<(&str, Result<Sim3, AlignError>)> = vec![
            ("length", weighted_umeyama(&points, &points[..3], &ones)),
            (
                "weights length",
                weighted_umeyama(&points, &points, &ones[..3]),
            ),
            (
                "too few",
                weighted_umeyama(&points[..2], &points[..2], &ones[..2]),
            ),
            ("empty", weighted_umeyama(&[], &[], &[])),
            (
                "nan point",
                weighted_umeyama(
                    &[[f64::NAN, 0.0, 0.0], points[1], points[2]],
                    &points[..3],
                    &ones[..3],
                ),
            ),
            (
                "negative weight",
                weighted_umeyama(&points, &points, &[1.0, -1.0, 1.0, 1.0]),
            ),
            (
                "nan weight",
                weighted_umeyama(&points, &points, &[1.0, f64::NAN, 1.0, 1.0]),
            ),
            (
                "zero weights",
                weighted_umeyama(&points, &points, &[0.0, 0.0, 1.0, 1.0]),
            ),
            (
                "coincide",
                weighted_umeyama(&[[1.0, 2.0, 3.0]; 4], &points, &ones),
            ),
            (
                "target coincide",
                weighted_umeyama(&points, &[[1.0, 2.0, 3.0]; 4], &ones),
            ),
            (
                "collinear",
                weighted_umeyama(
                    &[[0.0; 3], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0], [3.0, 0.0, 0.0]],
                    &points,
                    &ones,
                ),
            ),
            (
                "tiny total",
                spread_ratio_sim3(&points, &points, &[1e-8; 4]),
            ),
            (
                "spread target coincide",
                spread_ratio_sim3(&points, &[[1.0, 2.0, 3.0]; 4], &ones),
            ),
            (
                "robust delta",
                robust_sim3(
                    &points,
                    &points,
                    &ones,
                    &RobustOptions {
                        huber_delta: 0.0,
                        ..options.clone()
                    },
                )
                .map(|a| a.transform),
            ),
            (
                "robust tolerance",
                robust_sim3(
                    &points,
                    &points,
                    &ones,
                    &RobustOptions {
                        tolerance: f64::NAN,
                        ..options.clone()
                    },
                )
                .map(|a| a.transform),
            ),
            (
                "maps none kept",
                align_point_maps(&points, &[0.0; 4], &points, &[1.0; 4], 0.5, &options)
                    .map(|a| a.transform),
            ),
            (
                "maps conf length",
                align_point_maps(&points, &[1.0; 3], &points, &[1.0; 4], 0.5, &options)
                    .map(|a| a.transform),
            ),
            (
                "maps nan threshold",
                align_point_maps(&points, &[1.0; 4], &points, &[1.0; 4], f64::NAN, &options)
                    .map(|a| a.transform),
            ),
        ];
        for (name, result) in cases {
            match result {
                Err(error) => println!("{name}: {error}"),
                Ok(transform) => panic!("{name} gave {transform:?}"),
            }
        }
        let mut bad_target = points;
        bad_target[2] = [f64::INFINITY, 0.0, 0.0];
        let error = align_point_maps(
            &bad_target,
            &[0.0, 1.0, 1.0, 1.0],
            &points,
            &[1.0; 4],
            0.5,
            &options,
        )
        .unwrap_err();
        assert!(
            matches!(
                error,
                AlignError::NonFinite {
                    what: "target",
                    index: 2
                }
            ),
            "{error}"
        );
    }
}
