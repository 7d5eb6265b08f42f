//! Point-to-plane ICP: refines the rotation and translation of a similarity transform that
//! maps a source point set onto a target surface with known normals, keeping its scale.

use nalgebra::{Matrix6, Vector3, Vector6};

use super::error::{check_finite_points, check_length, AlignError};
use super::kdtree::KdTree;
use super::sim3::Sim3;

/// Options of [`point_to_plane_icp`].
#[derive(Debug, Clone)]
pub struct IcpOptions {
    /// The most linearise-and-solve rounds.
    pub max_iterations: usize,
    /// A source point whose nearest target point is farther than this (in target units) has no
    /// correspondence in that round.
    pub max_correspondence_distance: f64,
    /// Stops when a round's update is smaller than this: rotation angle in radians plus
    /// translation length in target units.
    pub tolerance: f64,
}

impl Default for IcpOptions {
    /// 30 rounds, correspondences within 0.1 (a tenth of a metre for metric depth), stop below
    /// 1e-6.
    fn default() -> IcpOptions {
        IcpOptions {
            max_iterations: 30,
            max_correspondence_distance: 0.1,
            tolerance: 1e-6,
        }
    }
}

/// The outcome of [`point_to_plane_icp`].
#[derive(Debug, Clone)]
pub struct IcpResult {
    /// The refined transform (source onto target), with the initial transform's scale.
    pub transform: Sim3,
    /// Rounds run.
    pub iterations: usize,
    /// Under `transform`, the fraction of source points with a target point within the
    /// correspondence distance that has a defined normal.
    pub inlier_fraction: f64,
    /// Root mean square point-to-plane distance of those correspondences.
    pub rms: f64,
}

/// Refines `initial` (rotation and translation; its scale is kept) so that the source points
/// lie on the target surface: each round pairs every transformed source point with its nearest
/// target point (kd-tree, within `max_correspondence_distance`), and solves the linearised
/// least-squares problem `Σ ((R_δ x + t_δ − q) · n_q)²` for a small rotation `R_δ` (about the
/// matched points' centroid) and translation `t_δ`.
///
/// Target points whose normal is the zero vector (undefined, as [`grid_normals`] leaves them)
/// are never matched against; other normals need not be unit length. Motions the surface does
/// not constrain (sliding along a plane, turning about a sphere's centre) are left unchanged
/// rather than guessed. Errors on empty or non-finite input, mismatched target and normal
/// lengths, an invalid `initial`, invalid options, and when no source point has a
/// correspondence.
pub fn point_to_plane_icp(
    source: &[[f64; 3]],
    target: &[[f64; 3]],
    target_normals: &[[f64; 3]],
    initial: &Sim3,
    options: &IcpOptions,
) -> Result<IcpResult, AlignError> {
    check_length("target_normals", target.len(), target_normals.len())?;
    check_finite_points("source", source)?;
    check_finite_points("target", target)?;
    check_finite_points("target_normals", target_normals)?;
    if source.is_empty() || target.is_empty() {
        return Err(AlignError::TooFewPoints {
            what: if source.is_empty() {
                "source points"
            } else {
                "target points"
            },
            found: 0,
            required: 1,
        });
    }
    if !initial.is_valid() {
        return Err(AlignError::InvalidOption {
            reason: format!("the initial transform is not a valid similarity: {initial:?}"),
        });
    }
    super::error::check_positive(
        "max_correspondence_distance",
        options.max_correspondence_distance,
    )?;
    super::error::check_non_negative("tolerance", options.tolerance)?;
    let distance = options.max_correspondence_distance;

    // Only points with a usable normal can be matched, so only they go into the tree.
    let usable: Vec<usize> = (0..target.len())
        .filter(|&i| target_normals[i].iter().any(|&x| x != 0.0))
        .collect();
    let usable_points: Vec<[f64; 3]> = usable.iter().map(|&i| target[i]).collect();
    let tree = KdTree::new(&usable_points);
    let unit_normals: Vec<Vector3<f64>> = usable
        .iter()
        .map(|&i| Vector3::from(target_normals[i]).normalize())
        .collect();
    let matcher = Matcher {
        tree: &tree,
        points: &usable_points,
        normals: &unit_normals,
        distance,
    };

    let mut transform = *initial;
    let mut iterations = 0;
    while iterations < options.max_iterations {
        let matches = matcher.correspondences(source, &transform);
        if matches.pairs.is_empty() {
            return Err(AlignError::NoCorrespondences {
                points: source.len(),
                distance,
            });
        }
        iterations += 1;
        let (rotation_vector, translation) = solve_increment(&matches);
        transform = apply_increment(
            &transform,
            &rotation_vector,
            &translation,
            &matches.centroid,
        );
        if rotation_vector.norm() + translation.norm() < options.tolerance {
            break;
        }
    }

    let matches = matcher.correspondences(source, &transform);
    if matches.pairs.is_empty() {
        return Err(AlignError::NoCorrespondences {
            points: source.len(),
            distance,
        });
    }
    let squared_sum: f64 = matches.pairs.iter().map(|m| m.residual * m.residual).sum();
    Ok(IcpResult {
        transform,
        iterations,
        inlier_fraction: matches.pairs.len() as f64 / source.len() as f64,
        rms: (squared_sum / matches.pairs.len() as f64).sqrt(),
    })
}

/// Finds correspondences against the target points that have normals.
struct Matcher<'a> {
    tree: &'a KdTree,
    points: &'a [[f64; 3]],
    normals: &'a [Vector3<f64>],
    distance: f64,
}

/// One round's correspondences.
struct Matches {
    pairs: Vec<Pair>,
    /// Centroid of the matched transformed source points: the linearisation turns about it,
    /// which keeps rotation and translation decoupled however far the scene is from the origin.
    centroid: Vector3<f64>,
}

struct Pair {
    /// The transformed source point.
    point: Vector3<f64>,
    /// The unit normal at the matched target point.
    normal: Vector3<f64>,
    /// Signed point-to-plane distance `(point − target) · normal`.
    residual: f64,
}

impl Matcher<'_> {
    fn correspondences(&self, source: &[[f64; 3]], transform: &Sim3) -> Matches {
        let mut pairs = Vec::with_capacity(source.len());
        let mut centroid = Vector3::zeros();
        for &p in source {
            let moved = transform.apply(p);
            if let Some((index, _)) = self.tree.nearest_within(moved, self.distance) {
                let point = Vector3::from(moved);
                let normal = self.normals[index];
                let residual = (point - Vector3::from(self.points[index])).dot(&normal);
                centroid += point;
                pairs.push(Pair {
                    point,
                    normal,
                    residual,
                });
            }
        }
        if !pairs.is_empty() {
            centroid /= pairs.len() as f64;
        }
        Matches { pairs, centroid }
    }
}

/// The Gauss–Newton step `[ω, τ]` for `x ↦ c + R_δ(x − c) + τ` with `R_δ ≈ I + [ω]ₓ`: the
/// residual `(x − q)·n` changes by `ω · ((x − c) × n) + τ · n`. Directions whose curvature is
/// negligible next to the largest are dropped (a pseudo-inverse), so a surface that leaves a
/// motion free does not produce an arbitrary one.
fn solve_increment(matches: &Matches) -> (Vector3<f64>, Vector3<f64>) {
    let mut normal_matrix = Matrix6::zeros();
    let mut gradient = Vector6::zeros();
    for pair in &matches.pairs {
        let lever = (pair.point - matches.centroid).cross(&pair.normal);
        let jacobian = Vector6::new(
            lever.x,
            lever.y,
            lever.z,
            pair.normal.x,
            pair.normal.y,
            pair.normal.z,
        );
        normal_matrix += jacobian * jacobian.transpose();
        gradient += jacobian * pair.residual;
    }
    let eigen = normal_matrix.symmetric_eigen();
    let largest = eigen.eigenvalues.amax();
    let mut step = Vector6::zeros();
    for k in 0..6 {
        let value = eigen.eigenvalues[k];
        if value > 1e-9 * largest {
            let direction = eigen.eigenvectors.column(k);
            step -= direction * (direction.dot(&gradient) / value);
        }
    }
    (
        step.fixed_rows::<3>(0).into(),
        step.fixed_rows::<3>(3).into(),
    )
}

/// `x ↦ c + R_δ (x − c) + τ` applied after `transform`; `R_δ` is the exact rotation of `ω`, so
/// the result stays a similarity with the same scale.
fn apply_increment(
    transform: &Sim3,
    rotation_vector: &Vector3<f64>,
    translation: &Vector3<f64>,
    centroid: &Vector3<f64>,
) -> Sim3 {
    let increment_rotation = Sim3::exp(&[
        0.0,
        0.0,
        0.0,
        rotation_vector.x,
        rotation_vector.y,
        rotation_vector.z,
        0.0,
    ])
    .rotation_matrix();
    let increment_translation = centroid - increment_rotation * centroid + translation;
    Sim3::from_parts(
        transform.scale,
        &(increment_rotation * transform.rotation_matrix()),
        &(increment_rotation * transform.translation_vector() + increment_translation),
    )
}

/// Normals of an organised point map (`width × height`, row-major, as the model predicts it)
/// from central differences of the neighbouring points (one-sided where a neighbour is missing
/// or not finite): `n = normalise(∂p/∂row × ∂p/∂column)`. For a point map in camera
/// coordinates (x right, y down, z forward) this points towards the camera.
///
/// The zero vector marks a point whose normal is undefined: the point is not finite, it has no
/// finite neighbour in a row or in a column, or the two differences are parallel. If
/// `width × height` is not `points.len()`, no normal is defined and every entry is zero.
pub fn grid_normals(points: &[[f64; 3]], width: usize, height: usize) -> Vec<[f64; 3]> {
    let mut normals = vec![[0.0; 3]; points.len()];
    if width.checked_mul(height) != Some(points.len()) {
        log::warn!(
            "grid_normals: a {width}×{height} grid does not hold {} points; no normals",
            points.len()
        );
        return normals;
    }
    let finite = |index: usize| points[index].iter().all(|x| x.is_finite());
    let at = |index: usize| Vector3::from(points[index]);
    // The difference across `center` along one direction, from the neighbours that exist.
    let difference =
        |center: usize, before: Option<usize>, after: Option<usize>| -> Option<Vector3<f64>> {
            let before = before.filter(|&i| finite(i));
            let after = after.filter(|&i| finite(i));
            match (before, after) {
                (Some(b), Some(a)) => Some(at(a) - at(b)),
                (None, Some(a)) => Some(at(a) - at(center)),
                (Some(b), None) => Some(at(center) - at(b)),
                (None, None) => None,
            }
        };
    for row in 0..height {
        for column in 0..width {
            let center = row * width + column;
            if !finite(center) {
                continue;
            }
            let along_row = difference(
                center,
                column.checked_sub(1).map(|c| row * width + c),
                (column + 1 < width).then(|| center + 1),
            );
            let along_column = difference(
                center,
                row.checked_sub(1).map(|r| r * width + column),
                (row + 1 < height).then(|| center + width),
            );
            let (Some(d_column), Some(d_row)) = (along_row, along_column) else {
                continue;
            };
            let normal = d_row.cross(&d_column);
            let length = normal.norm();
            // Parallel (or vanishing) differences give no plane.
            if length > 1e-12 * d_row.norm() * d_column.norm() && length > 0.0 {
                normals[center] = (normal / length).into();
            }
        }
    }
    normals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rotation(v: [f64; 3]) -> [[f64; 3]; 3] {
        Sim3::exp(&[0.0, 0.0, 0.0, v[0], v[1], v[2], 0.0]).rotation
    }

    /// The height of a wavy surface z = f(x, y).
    fn wavy_height(x: f64, y: f64) -> f64 {
        3.0 + 0.15 * (2.5 * x).sin() * (2.0 * y).cos() + 0.05 * (4.0 * x + 3.0 * y).sin()
    }

    /// The wavy surface sampled on a grid, as an organised point map.
    fn wavy_surface(width: usize, height: usize, spacing: f64) -> Vec<[f64; 3]> {
        let mut points = Vec::with_capacity(width * height);
        for row in 0..height {
            for column in 0..width {
                let x = column as f64 * spacing - 1.0;
                let y = row as f64 * spacing - 1.0;
                points.push([x, y, wavy_height(x, y)]);
            }
        }
        points
    }

    fn angle_between(a: &Sim3, b: &Sim3) -> f64 {
        let relative = a.rotation_matrix() * b.rotation_matrix().transpose();
        ((relative.trace() - 1.0) / 2.0).clamp(-1.0, 1.0).acos()
    }

    #[test]
    fn converges_from_a_perturbed_start_and_keeps_the_scale() {
        let target = wavy_surface(80, 80, 0.025);
        let normals = grid_normals(&target, 80, 80);
        // The source samples the same surface between the target's grid points (so no source
        // point coincides with a target point), expressed in another frame:
        // source = truth⁻¹(surface point).
        let truth = Sim3::new(1.3, rotation([0.05, -0.08, 0.3]), [0.4, -0.2, 0.1]);
        let inverse = truth.inverse();
        let mut source = Vec::new();
        for row in 0..25 {
            for column in 0..25 {
                let x = -0.7 + 0.0573 * column as f64;
                let y = -0.7 + 0.0573 * row as f64;
                source.push(inverse.apply([x, y, wavy_height(x, y)]));
            }
        }
        // Start 3° and several centimetres off, with the right scale.
        let perturbation = Sim3::new(1.0, rotation([0.03, -0.02, 0.04]), [0.03, -0.04, 0.02]);
        let initial = perturbation.compose(&truth);
        let options = IcpOptions {
            max_iterations: 50,
            max_correspondence_distance: 0.3,
            tolerance: 1e-10,
        };
        let result = point_to_plane_icp(&source, &target, &normals, &initial, &options).unwrap();
        let start_angle = angle_between(&initial, &truth);
        let end_angle = angle_between(&result.transform, &truth);
        let start_offset = (initial.translation_vector() - truth.translation_vector()).norm();
        let end_offset =
            (result.transform.translation_vector() - truth.translation_vector()).norm();
        println!(
            "ICP: angle {start_angle:.2e} -> {end_angle:.2e} rad, translation {start_offset:.2e} -> {end_offset:.2e}, \
             {} rounds, {:.1}% inliers, rms {:.2e}",
            result.iterations, 100.0 * result.inlier_fraction, result.rms
        );
        assert_eq!(result.transform.scale, initial.scale);
        // The target's tangent planes approximate the surface between grid points to about
        // curvature · spacing² ≈ 1e-4, which bounds how far the optimum can sit from the truth.
        assert!(end_angle < 2e-3, "angle {end_angle}");
        assert!(end_offset < 5e-3, "offset {end_offset}");
        assert!(result.rms < 5e-4);
        assert!(result.inlier_fraction > 0.99);
        assert!(result.iterations < 50);
    }

    #[test]
    fn a_plane_leaves_sliding_untouched() {
        // Points on the plane z = 2: only z, and rotations about x and y, are constrained.
        let target: Vec<[f64; 3]> = (0..400)
            .map(|i| [(i % 20) as f64 * 0.1, (i / 20) as f64 * 0.1, 2.0])
            .collect();
        let normals = grid_normals(&target, 20, 20);
        assert!(normals.iter().all(|n| n == &[0.0, 0.0, -1.0]));
        let source: Vec<[f64; 3]> = target.iter().map(|p| [p[0], p[1], p[2] + 0.05]).collect();
        let initial = Sim3::new(1.0, rotation([0.0, 0.0, 0.0]), [0.01, 0.02, 0.0]);
        let result =
            point_to_plane_icp(&source, &target, &normals, &initial, &IcpOptions::default())
                .unwrap();
        let t = result.transform.translation;
        assert!((t[2] + 0.05).abs() < 1e-9, "z {}", t[2]);
        assert!(
            (t[0] - 0.01).abs() < 1e-9 && (t[1] - 0.02).abs() < 1e-9,
            "slid to {t:?}"
        );
        assert!(result.rms < 1e-9);
    }

    #[test]
    fn normals_of_a_tilted_plane_and_undefined_points() {
        let (width, height) = (6, 5);
        let mut points: Vec<[f64; 3]> = (0..width * height)
            .map(|i| {
                let (x, y) = ((i % width) as f64, (i / width) as f64);
                [x, y, 1.0 + 0.5 * x]
            })
            .collect();
        points[14] = [f64::NAN; 3];
        let normals = grid_normals(&points, width, height);
        let expected = Vector3::new(0.5, 0.0, -1.0).normalize();
        for (i, n) in normals.iter().enumerate() {
            if i == 14 {
                assert_eq!(n, &[0.0; 3]);
            } else {
                assert!((Vector3::from(*n) - expected).norm() < 1e-12, "{i}: {n:?}");
            }
        }
        // A single row has no vertical neighbour: nothing is defined.
        assert!(grid_normals(&points[..6], 6, 1)
            .iter()
            .all(|n| n == &[0.0; 3]));
        // A size mismatch defines nothing rather than panicking.
        assert_eq!(grid_normals(&points, 7, 5), vec![[0.0; 3]; 30]);
        assert_eq!(grid_normals(&points, usize::MAX, 2).len(), 30);
        assert!(grid_normals(&[], 0, 0).is_empty());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let target = wavy_surface(10, 10, 0.1);
        let normals = grid_normals(&target, 10, 10);
        let source = target.clone();
        let options = IcpOptions::default();
        let identity = Sim3::IDENTITY;
        let far = Sim3::from_rigid(rotation([0.0, 0.0, 0.0]), [100.0, 0.0, 0.0]);
        let cases = [
            (
                "normals length",
                point_to_plane_icp(&source, &target, &normals[..5], &identity, &options),
            ),
            (
                "empty source",
                point_to_plane_icp(&[], &target, &normals, &identity, &options),
            ),
            (
                "empty target",
                point_to_plane_icp(&source, &[], &[], &identity, &options),
            ),
            (
                "nan source",
                point_to_plane_icp(&[[f64::NAN; 3]], &target, &normals, &identity, &options),
            ),
            (
                "nan normal",
                point_to_plane_icp(
                    &source,
                    &target,
                    &vec![[f64::NAN; 3]; 100],
                    &identity,
                    &options,
                ),
            ),
            (
                "bad initial",
                point_to_plane_icp(
                    &source,
                    &target,
                    &normals,
                    &Sim3::new(-1.0, identity.rotation, [0.0; 3]),
                    &options,
                ),
            ),
            (
                "bad distance",
                point_to_plane_icp(
                    &source,
                    &target,
                    &normals,
                    &identity,
                    &IcpOptions {
                        max_correspondence_distance: 0.0,
                        ..options.clone()
                    },
                ),
            ),
            (
                "bad tolerance",
                point_to_plane_icp(
                    &source,
                    &target,
                    &normals,
                    &identity,
                    &IcpOptions {
                        tolerance: -1.0,
                        ..options.clone()
                    },
                ),
            ),
            (
                "too far",
                point_to_plane_icp(&source, &target, &normals, &far, &options),
            ),
            (
                "no normals",
                point_to_plane_icp(&source, &target, &vec![[0.0; 3]; 100], &identity, &options),
            ),
        ];
        for (name, result) in cases {
            match result {
                Err(error) => println!("{name}: {error}"),
                Ok(result) => panic!("{name} gave {result:?}"),
            }
        }
    }
}
