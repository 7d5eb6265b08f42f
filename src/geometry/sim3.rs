//! Similarity transforms `p ↦ s R p + t` in 3-D (the group Sim(3)), their composition, and
//! the exponential and logarithm maps between the group and its tangent space sim(3).

use std::sync::OnceLock;

use nalgebra::{Matrix3, SMatrix, Vector3};

/// A similarity transform `p ↦ s R p + t`: uniform scale `s > 0`, rotation `R` (row-major,
/// orthonormal with determinant +1) and translation `t`.
///
/// In the streaming reconstruction, a window-to-world transform maps the points that the model
/// predicted for one window of frames into the coordinates of the whole video.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sim3 {
    /// Uniform scale `s`, positive.
    pub scale: f64,
    /// Rotation `R`, row-major: `rotation[row][column]`.
    pub rotation: [[f64; 3]; 3],
    /// Translation `t`, added after scaling and rotating.
    pub translation: [f64; 3],
}

const IDENTITY_ROTATION: [[f64; 3]; 3] = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];

impl Default for Sim3 {
    fn default() -> Sim3 {
        Sim3::IDENTITY
    }
}

impl Sim3 {
    /// The identity: scale 1, no rotation, no translation.
    pub const IDENTITY: Sim3 = Sim3 {
        scale: 1.0,
        rotation: IDENTITY_ROTATION,
        translation: [0.0; 3],
    };

    /// The transform `p ↦ scale · rotation · p + translation`. Nothing is checked: see
    /// [`Sim3::is_valid`].
    pub fn new(scale: f64, rotation: [[f64; 3]; 3], translation: [f64; 3]) -> Sim3 {
        Sim3 {
            scale,
            rotation,
            translation,
        }
    }

    /// A rigid transform (scale 1).
    pub fn from_rigid(rotation: [[f64; 3]; 3], translation: [f64; 3]) -> Sim3 {
        Sim3::new(1.0, rotation, translation)
    }

    /// Whether every number is finite, the scale is positive and the rotation is orthonormal
    /// with determinant +1 (each within `1e-6`).
    pub fn is_valid(&self) -> bool {
        let finite = self.scale.is_finite()
            && self.translation.iter().all(|x| x.is_finite())
            && self.rotation.iter().flatten().all(|x| x.is_finite());
        if !finite || self.scale <= 0.0 {
            return false;
        }
        let rotation = self.rotation_matrix();
        let orthonormality_error = (rotation.transpose() * rotation - Matrix3::identity())
            .abs()
            .max();
        orthonormality_error < 1e-6 && (rotation.determinant() - 1.0).abs() < 1e-6
    }

    /// `s R p + t`.
    pub fn apply(&self, p: [f64; 3]) -> [f64; 3] {
        let mapped =
            self.scale * (self.rotation_matrix() * Vector3::from(p)) + self.translation_vector();
        mapped.into()
    }

    /// `self ∘ other`: the transform that applies `other` first, then `self`.
    pub fn compose(&self, other: &Sim3) -> Sim3 {
        let rotation = self.rotation_matrix();
        let translation =
            self.scale * (rotation * other.translation_vector()) + self.translation_vector();
        Sim3::from_parts(
            self.scale * other.scale,
            &(rotation * other.rotation_matrix()),
            &translation,
        )
    }

    /// The inverse transform `p ↦ s⁻¹ Rᵀ (p − t)`.
    pub fn inverse(&self) -> Sim3 {
        let rotation_transposed = self.rotation_matrix().transpose();
        let inverse_scale = 1.0 / self.scale;
        let translation = -inverse_scale * (rotation_transposed * self.translation_vector());
        Sim3::from_parts(inverse_scale, &rotation_transposed, &translation)
    }

    /// The logarithm: the tangent vector `v` with `Sim3::exp(&v) == self`, laid out as
    /// `[ρx, ρy, ρz, ωx, ωy, ωz, σ]`: the translational part `ρ` first, then the rotation
    /// vector `ω` (axis times angle, angle in `[0, π]`), then the log-scale `σ = ln s`.
    ///
    /// `ρ` is not the translation itself: `t = V(σ, ω) ρ`, where
    /// `V = ∫₀¹ e^{στ} exp(τ[ω]ₓ) dτ`, because the group exponential couples the three parts.
    pub fn log(&self) -> [f64; 7] {
        let log_scale = self.scale.ln();
        let rotation_vector = rotation_log(&self.rotation_matrix());
        let coupling = translation_coupling(log_scale, &rotation_vector);
        // V is invertible for every angle in [0, π] (its eigenvalues are ∫₀¹ e^{(σ±iθ)τ}dτ
        // and (e^σ−1)/σ, none of which vanishes there); LU with pivoting solves it to working
        // precision.
        let rho = coupling
            .lu()
            .solve(&self.translation_vector())
            .unwrap_or_else(|| Vector3::repeat(f64::NAN));
        [
            rho.x,
            rho.y,
            rho.z,
            rotation_vector.x,
            rotation_vector.y,
            rotation_vector.z,
            log_scale,
        ]
    }

    /// The exponential of a tangent vector laid out as in [`Sim3::log`]:
    /// `[ρx, ρy, ρz, ωx, ωy, ωz, σ]`, giving `s = e^σ`, `R = exp([ω]ₓ)`, `t = V(σ, ω) ρ`.
    pub fn exp(v: &[f64; 7]) -> Sim3 {
        let rho = Vector3::new(v[0], v[1], v[2]);
        let rotation_vector = Vector3::new(v[3], v[4], v[5]);
        let log_scale = v[6];
        let translation = translation_coupling(log_scale, &rotation_vector) * rho;
        Sim3::from_parts(
            log_scale.exp(),
            &rotation_exp(&rotation_vector),
            &translation,
        )
    }

    /// The homogeneous 4×4 matrix `[sR t; 0 0 0 1]`, row-major.
    pub fn to_matrix(&self) -> [[f64; 4]; 4] {
        let mut matrix = [[0.0; 4]; 4];
        for (row, matrix_row) in matrix.iter_mut().take(3).enumerate() {
            for (column, entry) in matrix_row.iter_mut().take(3).enumerate() {
                *entry = self.scale * self.rotation[row][column];
            }
            matrix_row[3] = self.translation[row];
        }
        matrix[3][3] = 1.0;
        matrix
    }

    /// The adjoint `Ad` (7×7, tangent order of [`Sim3::log`]): `self ∘ exp(v) ∘ self⁻¹ =
    /// exp(Ad v)`. With `self = (s, R, t)` it maps `[ρ, ω, σ]` to
    /// `[s R ρ + t × (R ω) − σ t, R ω, σ]`.
    pub(crate) fn adjoint(&self) -> SMatrix<f64, 7, 7> {
        let rotation = self.rotation_matrix();
        let translation = self.translation_vector();
        let mut adjoint = SMatrix::<f64, 7, 7>::zeros();
        adjoint
            .fixed_view_mut::<3, 3>(0, 0)
            .copy_from(&(self.scale * rotation));
        adjoint
            .fixed_view_mut::<3, 3>(0, 3)
            .copy_from(&(skew(&translation) * rotation));
        adjoint
            .fixed_view_mut::<3, 1>(0, 6)
            .copy_from(&(-translation));
        adjoint.fixed_view_mut::<3, 3>(3, 3).copy_from(&rotation);
        adjoint[(6, 6)] = 1.0;
        adjoint
    }

    /// The rotation as a nalgebra matrix.
    pub(crate) fn rotation_matrix(&self) -> Matrix3<f64> {
        Matrix3::from_fn(|row, column| self.rotation[row][column])
    }

    /// The translation as a nalgebra vector.
    pub(crate) fn translation_vector(&self) -> Vector3<f64> {
        Vector3::from(self.translation)
    }

    /// Builds a transform from nalgebra parts.
    pub(crate) fn from_parts(
        scale: f64,
        rotation: &Matrix3<f64>,
        translation: &Vector3<f64>,
    ) -> Sim3 {
        let mut rows = [[0.0; 3]; 3];
        for (row, values) in rows.iter_mut().enumerate() {
            for (column, value) in values.iter_mut().enumerate() {
                *value = rotation[(row, column)];
            }
        }
        Sim3::new(scale, rows, (*translation).into())
    }
}

/// Window-to-world transforms from relative ones: `W_0 = I`, `W_{k+1} = W_k ∘ relative[k]`,
/// where `relative[k]` maps window `k + 1` coordinates into window `k` coordinates.
///
/// The result has `relative.len() + 1` entries. The official `accumulate_sim3_transforms`
/// returns the same transforms without the leading identity: its entry `k` is `chain(..)[k + 1]`.
pub fn chain(relative: &[Sim3]) -> Vec<Sim3> {
    let mut world_from_window = Vec::with_capacity(relative.len() + 1);
    let mut current = Sim3::IDENTITY;
    world_from_window.push(current);
    for step in relative {
        current = current.compose(step);
        world_from_window.push(current);
    }
    world_from_window
}

/// The transform from window A to window B, given how a common set of frames maps into each:
/// `common_to_b ∘ common_to_a⁻¹` (the official `compute_sim3_ab(S_a, S_b)`).
///
/// A loop closure predicts the frames of both ends together, aligns that prediction to window
/// A (`common_to_a`) and to window B (`common_to_b`); the result maps window-A coordinates into
/// window-B coordinates, i.e. it is the measurement of a pose-graph edge from B to A
/// (see [`PoseGraph::add_edge`](super::pose_graph::PoseGraph::add_edge)).
pub fn relative_through_common(common_to_a: &Sim3, common_to_b: &Sim3) -> Sim3 {
    common_to_b.compose(&common_to_a.inverse())
}

/// The skew-symmetric matrix `[v]ₓ` with `[v]ₓ u = v × u`.
pub(crate) fn skew(v: &Vector3<f64>) -> Matrix3<f64> {
    Matrix3::new(0.0, -v.z, v.y, v.z, 0.0, -v.x, -v.y, v.x, 0.0)
}

/// Rodrigues' formula `exp([ω]ₓ) = I + (sin θ/θ)[ω]ₓ + ((1 − cos θ)/θ²)[ω]ₓ²` with both
/// coefficients written in forms that stay accurate as θ → 0.
fn rotation_exp(rotation_vector: &Vector3<f64>) -> Matrix3<f64> {
    let angle = rotation_vector.norm();
    let half_sinc = sinc(0.5 * angle);
    let first_order = sinc(angle);
    // 1 − cos θ = 2 sin²(θ/2), so (1 − cos θ)/θ² = sinc²(θ/2)/2 without cancellation.
    let second_order = 0.5 * half_sinc * half_sinc;
    let cross = skew(rotation_vector);
    Matrix3::identity() + first_order * cross + second_order * cross * cross
}

/// The rotation vector of a rotation matrix, angle in `[0, π]`. Goes through the unit
/// quaternion (Shepperd's method in nalgebra), whose half-angle form `θ = 2 atan2(|v|, w)` is
/// accurate at every angle, unlike `acos((tr R − 1)/2)` near 0 and π.
fn rotation_log(rotation: &Matrix3<f64>) -> Vector3<f64> {
    let quaternion = nalgebra::UnitQuaternion::from_rotation_matrix(
        &nalgebra::Rotation3::from_matrix_unchecked(*rotation),
    );
    let (mut w, mut imaginary) = (quaternion.w, quaternion.imag());
    if w < 0.0 {
        // q and −q are the same rotation; w ≥ 0 picks the angle in [0, π].
        w = -w;
        imaginary = -imaginary;
    }
    let sine_half = imaginary.norm();
    // θ / sin(θ/2), with θ = 2 atan2(sin(θ/2), cos(θ/2)); its limit at 0 is 2 / w.
    let angle_per_sine_half = if sine_half < 1e-8 {
        2.0 / w * (1.0 - sine_half * sine_half / (3.0 * w * w))
    } else {
        2.0 * sine_half.atan2(w) / sine_half
    };
    imaginary * angle_per_sine_half
}

/// `sin x / x`, 1 at 0.
fn sinc(x: f64) -> f64 {
    if x.abs() < 1e-4 {
        1.0 - x * x / 6.0
    } else {
        x.sin() / x
    }
}

/// `V(σ, ω) = ∫₀¹ e^{στ} exp(τ[ω]ₓ) dτ = a I + b [ω]ₓ + c [ω]ₓ²`, the matrix that couples
/// translation to rotation and scale in the exponential map, with
/// `a = ∫ e^{στ}`, `b = ∫ e^{στ} sin(θτ)/θ`, `c = ∫ e^{στ} (1 − cos θτ)/θ²` over `τ ∈ [0, 1]`.
///
/// The closed forms of `b` and `c` divide by `θ`, `σ` and `σ² + θ²` and lose most of their
/// digits near the identity, exactly where a pose graph evaluates them. The integrands written
/// as `e^{στ} τ sinc(θτ)` and `e^{στ} τ²/2 sinc²(θτ/2)` are smooth everywhere, so Gauss–Legendre
/// quadrature evaluates all three to working precision with one formula (see
/// [`gauss_legendre`] for the range).
fn translation_coupling(log_scale: f64, rotation_vector: &Vector3<f64>) -> Matrix3<f64> {
    let angle = rotation_vector.norm();
    let (mut a, mut b, mut c) = (0.0, 0.0, 0.0);
    for &(node, weight) in gauss_legendre() {
        let growth = weight * (log_scale * node).exp();
        let half_sinc = sinc(0.5 * angle * node);
        a += growth;
        b += growth * node * sinc(angle * node);
        c += growth * 0.5 * node * node * half_sinc * half_sinc;
    }
    let cross = skew(rotation_vector);
    a * Matrix3::identity() + b * cross + c * cross * cross
}

/// Number of Gauss–Legendre nodes on [0, 1]. The rule integrates polynomials of degree 31
/// exactly; for `e^{στ}` times the sinc factors (angles up to π) its relative error stays
/// below 1e-15 for `|σ|` up to about 14 (scale ratios up to 10⁶), far beyond what a
/// reconstruction meets.
const QUADRATURE_NODES: usize = 16;

/// Gauss–Legendre nodes and weights on [0, 1], computed once by Newton's method on the
/// Legendre polynomial (no table to mistype).
fn gauss_legendre() -> &'static [(f64, f64); QUADRATURE_NODES] {
    static RULE: OnceLock<[(f64, f64); QUADRATURE_NODES]> = OnceLock::new();
    RULE.get_or_init(|| {
        let n = QUADRATURE_NODES;
        let mut rule = [(0.0, 0.0); QUADRATURE_NODES];
        for (i, entry) in rule.iter_mut().enumerate() {
            // Root i of P_n on [−1, 1], from the classical initial guess.
            let mut x = (std::f64::consts::PI * (i as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut derivative = 0.0;
            for _ in 0..100 {
                // P_n(x) and P_n'(x) by the three-term recurrence.
                let (mut previous, mut current) = (1.0, x);
                for k in 2..=n {
                    let next =
                        ((2 * k - 1) as f64 * x * current - (k - 1) as f64 * previous) / k as f64;
                    previous = current;
                    current = next;
                }
                derivative = n as f64 * (x * current - previous) / (x * x - 1.0);
                let step = current / derivative;
                x -= step;
                if step.abs() < 1e-16 {
                    break;
                }
            }
            let weight = 2.0 / ((1.0 - x * x) * derivative * derivative);
            // Map [−1, 1] onto [0, 1].
            *entry = (0.5 * (x + 1.0), 0.5 * weight);
        }
        rule
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rotation from a rotation vector, for building test transforms.
    fn rotation(v: [f64; 3]) -> [[f64; 3]; 3] {
        Sim3::exp(&[0.0, 0.0, 0.0, v[0], v[1], v[2], 0.0]).rotation
    }

    fn max_difference(a: &Sim3, b: &Sim3) -> f64 {
        let mut worst = (a.scale - b.scale).abs();
        for row in 0..3 {
            worst = worst.max((a.translation[row] - b.translation[row]).abs());
            for column in 0..3 {
                worst = worst.max((a.rotation[row][column] - b.rotation[row][column]).abs());
            }
        }
        worst
    }

    fn sample_transforms() -> Vec<Sim3> {
        vec![
            Sim3::IDENTITY,
            Sim3::new(2.5, rotation([0.3, -0.2, 0.9]), [1.0, -2.0, 0.5]),
            Sim3::new(0.01, rotation([0.0, 3.0, 0.0]), [100.0, 0.0, -3.0]),
            Sim3::new(1.0 + 1e-9, rotation([1e-9, 0.0, -2e-9]), [1e-7, 0.0, 0.0]),
            // Rotations by almost exactly π, where the trace-based angle formula fails.
            Sim3::new(
                7.0,
                rotation([std::f64::consts::PI - 1e-9, 0.0, 0.0]),
                [0.0, 1.0, 2.0],
            ),
            Sim3::new(
                0.5,
                rotation([
                    0.0,
                    -std::f64::consts::PI / 2f64.sqrt(),
                    std::f64::consts::PI / 2f64.sqrt(),
                ]),
                [3.0, 3.0, 3.0],
            ),
        ]
    }

    #[test]
    fn quadrature_integrates_polynomials_and_exponentials() {
        let rule = gauss_legendre();
        let total: f64 = rule.iter().map(|(_, w)| w).sum();
        assert!((total - 1.0).abs() < 1e-15, "weights sum to {total}");
        let moment: f64 = rule.iter().map(|(x, w)| w * x.powi(31)).sum();
        assert!((moment - 1.0 / 32.0).abs() < 1e-15, "∫τ³¹ = {moment}");
        for sigma in [-10.0f64, -1.0, 1e-3, 2.0, 12.0] {
            let integral: f64 = rule.iter().map(|(x, w)| w * (sigma * x).exp()).sum();
            let exact = sigma.exp_m1() / sigma;
            assert!(
                ((integral - exact) / exact).abs() < 1e-14,
                "σ = {sigma}: {integral} vs {exact}"
            );
        }
    }

    #[test]
    fn coupling_matches_closed_form_away_from_the_identity() {
        // Where the closed forms are well conditioned (θ and σ of order 1), they check the
        // quadrature.
        let (sigma, omega) = (0.7f64, Vector3::<f64>::new(0.4, -1.1, 0.8));
        let theta = omega.norm();
        let a = sigma.exp_m1() / sigma;
        let z2 = sigma * sigma + theta * theta;
        let b = (sigma.exp() * (sigma * theta.sin() - theta * theta.cos()) + theta) / (theta * z2);
        let real = (sigma.exp() * (sigma * theta.cos() + theta * theta.sin()) - sigma) / z2;
        let c = (a - real) / (theta * theta);
        let cross = skew(&omega);
        let expected = a * Matrix3::identity() + b * cross + c * cross * cross;
        let difference = (translation_coupling(sigma, &omega) - expected).abs().max();
        assert!(difference < 1e-14, "difference {difference}");
    }

    #[test]
    fn exp_of_log_is_the_transform() {
        for transform in sample_transforms() {
            let round_trip = Sim3::exp(&transform.log());
            let difference = max_difference(&round_trip, &transform);
            assert!(
                difference
                    < 1e-12
                        * (1.0
                            + transform
                                .translation
                                .iter()
                                .fold(0.0f64, |m, x| m.max(x.abs()))),
                "{transform:?} -> {round_trip:?}: {difference}"
            );
        }
    }

    #[test]
    fn log_of_exp_is_the_tangent_vector() {
        let vectors = [
            [0.0; 7],
            [0.1, -0.2, 0.3, 0.01, 0.02, -0.03, 0.05],
            [1e-12, 0.0, 2e-12, 1e-13, 0.0, 0.0, 1e-12],
            [5.0, 1.0, -2.0, 1.0, 2.0, 0.5, -1.5],
            [0.0, 0.0, 3.0, 0.0, 0.0, 3.1, 2.0],
            [-4.0, 2.0, 1.0, 0.0, 0.0, 0.0, 4.0],
        ];
        for v in vectors {
            let back = Sim3::exp(&v).log();
            for k in 0..7 {
                assert!(
                    (back[k] - v[k]).abs() < 1e-12 * (1.0 + v[k].abs()),
                    "{v:?} -> {back:?}"
                );
            }
        }
    }

    #[test]
    fn exp_matches_the_series_of_the_matrix_exponential() {
        // exp of the 4×4 algebra element [[σI + [ω]ₓ, ρ], [0, 0]] by its Taylor series
        // (converges fast for this small element).
        let v = [0.3, -0.1, 0.2, 0.2, -0.1, 0.15, 0.25];
        let mut algebra = nalgebra::Matrix4::<f64>::zeros();
        let omega = Vector3::new(v[3], v[4], v[5]);
        algebra
            .fixed_view_mut::<3, 3>(0, 0)
            .copy_from(&(v[6] * Matrix3::identity() + skew(&omega)));
        algebra[(0, 3)] = v[0];
        algebra[(1, 3)] = v[1];
        algebra[(2, 3)] = v[2];
        let mut series = nalgebra::Matrix4::<f64>::identity();
        let mut term = nalgebra::Matrix4::identity();
        for k in 1..40 {
            term = term * algebra / k as f64;
            series += term;
        }
        let matrix = Sim3::exp(&v).to_matrix();
        for row in 0..4 {
            for column in 0..4 {
                assert!((matrix[row][column] - series[(row, column)]).abs() < 1e-14);
            }
        }
    }

    #[test]
    fn compose_and_inverse_identities() {
        let transforms = sample_transforms();
        let point = [0.3, -1.2, 2.0];
        for a in &transforms {
            assert!(a.is_valid());
            assert!(max_difference(&a.compose(&a.inverse()), &Sim3::IDENTITY) < 1e-12);
            assert!(max_difference(&a.inverse().compose(a), &Sim3::IDENTITY) < 1e-12);
            assert!(max_difference(&a.compose(&Sim3::IDENTITY), a) == 0.0);
            assert!(max_difference(&a.inverse().inverse(), a) < 1e-10);
            for b in &transforms {
                // Composition applies the right operand first.
                let composed = a.compose(b).apply(point);
                let sequential = a.apply(b.apply(point));
                for k in 0..3 {
                    assert!(
                        (composed[k] - sequential[k]).abs() < 1e-9 * (1.0 + sequential[k].abs())
                    );
                }
                // (ab)⁻¹ = b⁻¹a⁻¹
                let left = a.compose(b).inverse();
                let right = b.inverse().compose(&a.inverse());
                assert!(
                    max_difference(&left, &right)
                        < 1e-8
                            * (1.0 + right.translation.iter().fold(0.0f64, |m, x| m.max(x.abs())))
                );
            }
        }
    }

    #[test]
    fn apply_and_to_matrix_agree() {
        let transform = Sim3::new(2.0, rotation([0.1, 0.5, -0.3]), [1.0, 2.0, 3.0]);
        let matrix = transform.to_matrix();
        let p = [0.5, -0.25, 4.0];
        let mapped = transform.apply(p);
        for row in 0..3 {
            let expected: f64 = (0..3).map(|k| matrix[row][k] * p[k]).sum::<f64>() + matrix[row][3];
            assert!((mapped[row] - expected).abs() < 1e-14);
        }
        assert_eq!(matrix[3], [0.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn adjoint_moves_a_tangent_vector_across_the_transform() {
        let v = [0.2, -0.1, 0.3, 0.05, 0.1, -0.2, 0.07];
        for transform in sample_transforms() {
            let conjugated = transform
                .compose(&Sim3::exp(&v))
                .compose(&transform.inverse());
            let moved = transform.adjoint() * nalgebra::SVector::<f64, 7>::from(v);
            let expected = Sim3::exp(&moved.into());
            let scale = 1.0
                + transform
                    .translation
                    .iter()
                    .fold(0.0f64, |m, x| m.max(x.abs()));
            assert!(
                max_difference(&conjugated, &expected) < 1e-10 * scale * scale,
                "{transform:?}"
            );
        }
    }

    #[test]
    fn chain_accumulates_from_identity() {
        let steps = [
            Sim3::new(1.1, rotation([0.0, 0.1, 0.0]), [1.0, 0.0, 0.0]),
            Sim3::new(0.9, rotation([0.2, 0.0, 0.0]), [0.0, 1.0, 0.0]),
            Sim3::new(1.3, rotation([0.0, 0.0, -0.4]), [0.0, 0.0, 1.0]),
        ];
        let world = chain(&steps);
        assert_eq!(world.len(), 4);
        assert_eq!(world[0], Sim3::IDENTITY);
        let p = [1.0, 2.0, 3.0];
        let direct = steps[0].apply(steps[1].apply(steps[2].apply(p)));
        let chained = world[3].apply(p);
        for k in 0..3 {
            assert!((direct[k] - chained[k]).abs() < 1e-12);
        }
        assert!(chain(&[]) == vec![Sim3::IDENTITY]);
    }

    #[test]
    fn relative_through_common_maps_a_to_b() {
        let common_to_a = Sim3::new(2.0, rotation([0.1, 0.2, 0.3]), [1.0, 0.0, 0.0]);
        let common_to_b = Sim3::new(0.5, rotation([-0.3, 0.0, 0.1]), [0.0, 2.0, 0.0]);
        let a_to_b = relative_through_common(&common_to_a, &common_to_b);
        let p = [0.4, 0.5, 0.6];
        let in_b = common_to_b.apply(p);
        let via_a = a_to_b.apply(common_to_a.apply(p));
        for k in 0..3 {
            assert!((in_b[k] - via_a[k]).abs() < 1e-12);
        }
    }

    #[test]
    fn invalid_transforms_are_detected() {
        assert!(!Sim3::new(0.0, IDENTITY_ROTATION, [0.0; 3]).is_valid());
        assert!(!Sim3::new(1.0, IDENTITY_ROTATION, [f64::NAN, 0.0, 0.0]).is_valid());
        let reflection = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]];
        assert!(!Sim3::new(1.0, reflection, [0.0; 3]).is_valid());
        let sheared = [[1.0, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
        assert!(!Sim3::new(1.0, sheared, [0.0; 3]).is_valid());
    }
}
