//! Camera poses from the DualDPT ray branch ("ray pose"), as the official `use_ray_pose` does
//! (`utils/ray_utils.py`, `get_extrinsic_from_camray`): per view, a weighted homography from the
//! image plane of an identity camera to the predicted ray directions, fitted by RANSAC, gives
//! rotation and intrinsics (QL decomposition); the confidence-weighted mean ray origin gives the
//! camera centre.
//!
//! The official RANSAC draws its samples with `torch.randperm`, unseeded; here they come from a
//! fixed-seed generator, so a result is reproducible but equals the official one only for the
//! same samples ([`pose_from_rays_with_samples`] takes them, for parity tests).

use super::outputs::{Pose, RayMap};
use super::Error;

/// RANSAC iterations (`get_params_for_ransac`).
pub const RANSAC_ITERATIONS: usize = 100;
/// Points per RANSAC sample.
pub const RANSAC_SAMPLE: usize = 8;
/// Share of the most confident rays the samples are drawn from.
const CANDIDATE_SHARE: f64 = 0.3;
/// Inlier threshold on the reprojection distance (`camray_to_caminfo`'s `reproj_threshold`).
const INLIER_DISTANCE: f64 = 0.2;
/// Rays whose direction has |z| below this take no part (`z_threshold`).
const Z_THRESHOLD: f32 = 1e-4;
/// The refit uses at most this many inliers (`max_inlier_num` as `compute_optimal_...` passes it).
const MAX_REFIT_POINTS: usize = 8000;

/// Points the samples are drawn from for a map of `points` rays: the official
/// `max(8, int(N * 0.3))` most confident.
pub fn candidate_count(points: usize) -> usize {
    RANSAC_SAMPLE.max((points as f64 * CANDIDATE_SHARE) as usize)
}

/// The pose of one view from its ray map, for a processed image of `width` x `height`.
pub fn pose_from_rays(rays: &RayMap, width: usize, height: usize) -> Result<Pose, Error> {
    let n = rays.width * rays.height;
    let mut rng = SplitMix64(0x5DA3_0000_0000_0001 ^ n as u64);
    if n < RANSAC_SAMPLE {
        return Err(ray_error(format!(
            "a ray map of {n} rays is too small (RANSAC samples {RANSAC_SAMPLE})"
        )));
    }
    let candidates = candidate_count(n);
    let samples: Vec<[usize; RANSAC_SAMPLE]> = (0..RANSAC_ITERATIONS)
        .map(|_| rng.distinct(candidates))
        .collect();
    pose_from_rays_with_samples(rays, width, height, &samples, &mut rng)
}

/// [`pose_from_rays`] with the RANSAC samples given: each row indexes the candidates (the rays
/// sorted by confidence, most confident first). `rng` subsamples a refit of more than 8000
/// inliers, as the official code does with `randperm`.
#[doc(hidden)]
pub fn pose_from_rays_with_samples(
    rays: &RayMap,
    width: usize,
    height: usize,
    samples: &[[usize; RANSAC_SAMPLE]],
    rng: &mut SplitMix64,
) -> Result<Pose, Error> {
    let (w, h) = (rays.width, rays.height);
    let n = w * h;
    if rays.rays.len() != 6 * n || rays.confidence.len() != n || n == 0 {
        return Err(ray_error(format!(
            "a {w}x{h} ray map needs {} ray values and {n} confidences, it has {} and {}",
            6 * n,
            rays.rays.len(),
            rays.confidence.len()
        )));
    }
    let channel = |c: usize, i: usize| rays.rays[c * n + i];
    // The image plane of an identity camera on a 2x2 image: pixel centres in (-1, 1).
    let (dx, dy) = (1.0 / w as f64, 1.0 / h as f64);
    let mut src = Vec::with_capacity(n);
    let mut dst = Vec::with_capacity(n);
    let mut weight = Vec::with_capacity(n);
    for i in 0..n {
        let (x, y) = (i % w, i / w);
        src.push([
            -1.0 + dx + 2.0 * dx * x as f64,
            -1.0 + dy + 2.0 * dy * y as f64,
        ]);
        let d = [channel(0, i), channel(1, i), channel(2, i)];
        let conf = rays.confidence[i];
        if !(d.iter().all(|v| v.is_finite()) && conf.is_finite()) {
            return Err(ray_error(format!("ray {i} is not finite")));
        }
        if d[2].abs() > Z_THRESHOLD {
            dst.push([f64::from(d[0] / d[2]), f64::from(d[1] / d[2])]);
            weight.push(f64::from(conf));
        } else {
            dst.push([f64::from(d[0]), f64::from(d[1])]);
            weight.push(0.0);
        }
    }
    if !weight.iter().any(|&w| w > 0.0) {
        return Err(ray_error(
            "no ray has both a confidence above zero and a direction off the image plane"
                .to_owned(),
        ));
    }
    let mut order: Vec<usize> = (0..n).collect();
    // Descending confidence; ties by index (torch's argsort does not promise an order).
    order.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    let candidates = &order[..candidate_count(n).min(n)];
    let mut best: Option<(f64, Vec<bool>)> = None;
    for sample in samples {
        let idx: Vec<usize> = sample
            .iter()
            .map(|&s| {
                candidates
                    .get(s)
                    .copied()
                    .ok_or_else(|| ray_error(format!("sample index {s} of {}", candidates.len())))
            })
            .collect::<Result<_, _>>()?;
        let Some(hom) = fit_homography(idx.iter().map(|&i| (src[i], dst[i], weight[i]))) else {
            continue;
        };
        let inliers: Vec<bool> = (0..n)
            .map(|i| reprojection_distance(&hom, src[i], dst[i]) < INLIER_DISTANCE)
            .collect();
        let score: f64 = (0..n).filter(|&i| inliers[i]).map(|i| weight[i]).sum();
        // The first of equal scores wins, as torch.argmax picks.
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            best = Some((score, inliers));
        }
    }
    let (_, inliers) =
        best.ok_or_else(|| ray_error("no RANSAC sample gave a homography".to_owned()))?;
    let mut kept: Vec<usize> = (0..n).filter(|&i| inliers[i]).collect();
    kept.sort_by(|&a, &b| weight[b].total_cmp(&weight[a]).then(a.cmp(&b)));
    if kept.len() > MAX_REFIT_POINTS {
        // The official code keeps a random 8000 of the most confident 95%.
        let keep = ((kept.len() as f64 * 0.95) as usize).max(MAX_REFIT_POINTS);
        kept.truncate(keep);
        for i in 0..MAX_REFIT_POINTS {
            let j = i + (rng.next_u64() % (kept.len() - i) as u64) as usize;
            kept.swap(i, j);
        }
        kept.truncate(MAX_REFIT_POINTS);
    }
    if kept.len() < 4 {
        return Err(ray_error(format!(
            "{} inlier ray(s): at least 4 are needed for a homography",
            kept.len()
        )));
    }
    let mut a = fit_homography(kept.iter().map(|&i| (src[i], dst[i], weight[i])))
        .ok_or_else(|| ray_error("the inliers give no homography".to_owned()))?;
    if det3(&a) < 0.0 {
        a.iter_mut().flatten().for_each(|v| *v = -*v);
    }
    let (rot, l) =
        ql_decomposition(&a).ok_or_else(|| ray_error("the homography is singular".to_owned()))?;
    let l22 = l[2][2];
    let (f, pp) = (
        [l[0][0] / l22, l[1][1] / l22],
        [l[2][0] / l22, l[2][1] / l22],
    );
    // Camera centre: the confidence-weighted mean origin (rays without z take no part).
    let total: f64 = weight.iter().sum();
    if total <= 0.0 {
        return Err(ray_error("every ray has zero confidence".to_owned()));
    }
    let mut centre = [0.0f64; 3];
    for (i, &wt) in weight.iter().enumerate() {
        for (c, v) in centre.iter_mut().enumerate() {
            *v += f64::from(channel(3 + c, i)) * wt;
        }
    }
    centre.iter_mut().for_each(|v| *v /= total);
    // The official focal and principal point are on a 2x2 image: 1/f and pp + 1.
    let (focal, principal) = ([1.0 / f[0], 1.0 / f[1]], [pp[0] + 1.0, pp[1] + 1.0]);
    let (wf, hf) = (width as f64, height as f64);
    let intrinsics = [
        [
            (focal[0] / 2.0 * wf) as f32,
            0.0,
            (principal[0] * wf * 0.5) as f32,
        ],
        [
            0.0,
            (focal[1] / 2.0 * hf) as f32,
            (principal[1] * hf * 0.5) as f32,
        ],
        [0.0, 0.0, 1.0],
    ];
    // [rot | centre] maps camera to world; the pose holds its inverse.
    let mut extrinsics = [[0.0f32; 4]; 3];
    for r in 0..3 {
        for c in 0..3 {
            extrinsics[r][c] = rot[c][r] as f32;
        }
        extrinsics[r][3] = -(0..3).map(|c| rot[c][r] * centre[c]).sum::<f64>() as f32;
    }
    let pose = Pose {
        intrinsics,
        extrinsics,
    };
    if pose.intrinsics.iter().flatten().all(|v| v.is_finite())
        && pose.extrinsics.iter().flatten().all(|v| v.is_finite())
    {
        Ok(pose)
    } else {
        Err(ray_error("the solved camera is not finite".to_owned()))
    }
}

fn ray_error(why: String) -> Error {
    Error::Input(format!("ray pose: {why}"))
}

/// The weighted least-squares homography (DLT: the right singular vector of the smallest
/// singular value, here the eigenvector of AᵀA), scaled so that `H[2][2] = 1`. `None` when
/// degenerate.
#[allow(clippy::needless_range_loop)] // matrix code reads best by index
fn fit_homography(
    points: impl Iterator<Item = ([f64; 2], [f64; 2], f64)>,
) -> Option<[[f64; 3]; 3]> {
    let mut ata = [[0.0f64; 9]; 9];
    let mut count = 0;
    for ([x, y], [u, v], w) in points {
        let rows = [
            [-x, -y, -1.0, 0.0, 0.0, 0.0, x * u, y * u, u],
            [0.0, 0.0, 0.0, -x, -y, -1.0, x * v, y * v, v],
        ];
        for row in &rows {
            for i in 0..9 {
                for j in i..9 {
                    ata[i][j] += w * row[i] * row[j];
                }
            }
        }
        count += 1;
    }
    if count < 4 {
        return None;
    }
    for i in 0..9 {
        for j in 0..i {
            ata[i][j] = ata[j][i];
        }
    }
    let v = smallest_eigenvector(ata);
    if !(v[8].is_finite() && v[8].abs() > 1e-300) {
        return None;
    }
    let mut hom = [[0.0; 3]; 3];
    for (k, value) in v.iter().enumerate() {
        hom[k / 3][k % 3] = value / v[8];
    }
    hom.iter().flatten().all(|v| v.is_finite()).then_some(hom)
}

/// Distance between `H * src` (dehomogenised) and `dst`; NaN or infinite where `H * src`
/// is at infinity (never an inlier).
fn reprojection_distance(hom: &[[f64; 3]; 3], src: [f64; 2], dst: [f64; 2]) -> f64 {
    let p = |r: usize| hom[r][0] * src[0] + hom[r][1] * src[1] + hom[r][2];
    let z = p(2);
    let (du, dv) = (p(0) / z - dst[0], p(1) / z - dst[1]);
    (du * du + dv * dv).sqrt()
}

/// Eigenvector of the smallest eigenvalue of a symmetric matrix (cyclic Jacobi rotations).
#[allow(clippy::needless_range_loop)] // matrix code reads best by index
fn smallest_eigenvector(mut a: [[f64; 9]; 9]) -> [f64; 9] {
    let mut v = [[0.0f64; 9]; 9];
    for (i, row) in v.iter_mut().enumerate() {
        row[i] = 1.0;
    }
    for _sweep in 0..64 {
        let off: f64 = (0..9)
            .flat_map(|i| (0..9).filter(move |&j| j != i).map(move |j| (i, j)))
            .map(|(i, j)| a[i][j] * a[i][j])
            .sum();
        let diag: f64 = (0..9).map(|i| a[i][i] * a[i][i]).sum();
        if off <= 1e-30 * diag.max(1e-300) {
            break;
        }
        for p in 0..9 {
            for q in p + 1..9 {
                if a[p][q] == 0.0 {
                    continue;
                }
                let theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..9 {
                    let (akp, akq) = (a[k][p], a[k][q]);
                    a[k][p] = c * akp - s * akq;
                    a[k][q] = s * akp + c * akq;
                }
                for k in 0..9 {
                    let (apk, aqk) = (a[p][k], a[q][k]);
                    a[p][k] = c * apk - s * aqk;
                    a[q][k] = s * apk + c * aqk;
                }
                for row in v.iter_mut() {
                    let (vkp, vkq) = (row[p], row[q]);
                    row[p] = c * vkp - s * vkq;
                    row[q] = s * vkp + c * vkq;
                }
            }
        }
    }
    let smallest = (0..9)
        .min_by(|&i, &j| a[i][i].total_cmp(&a[j][j]))
        .expect("nine eigenvalues");
    std::array::from_fn(|k| v[k][smallest])
}

fn det3(m: &[[f64; 3]; 3]) -> f64 {
    m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
        - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
        + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
}

type Mat3 = [[f64; 3]; 3];

fn mul3(a: &Mat3, b: &Mat3) -> Mat3 {
    std::array::from_fn(|r| std::array::from_fn(|c| (0..3).map(|k| a[r][k] * b[k][c]).sum()))
}

/// `A = Q L` with `Q` orthogonal and `L` lower triangular with a positive diagonal (the
/// official `ql_decomposition`: QR of `A P`, `P` the exchange matrix, then signs fixed).
#[allow(clippy::needless_range_loop)] // matrix code reads best by index
fn ql_decomposition(a: &Mat3) -> Option<(Mat3, Mat3)> {
    let p: Mat3 = [[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]];
    let (q_tilde, r_tilde) = qr(&mul3(a, &p))?;
    let mut q = mul3(&q_tilde, &p);
    let mut l = mul3(&mul3(&p, &r_tilde), &p);
    for i in 0..3 {
        let sign = l[i][i].signum();
        for row in q.iter_mut() {
            row[i] *= sign;
        }
        for v in l[i].iter_mut() {
            *v *= sign;
        }
    }
    Some((q, l))
}

/// Householder-free QR of a 3x3 matrix by modified Gram-Schmidt (the signs of `R`'s diagonal
/// are fixed by the caller, so the convention does not matter). `None` when singular.
#[allow(clippy::needless_range_loop)] // matrix code reads best by index
fn qr(a: &Mat3) -> Option<(Mat3, Mat3)> {
    let mut q = [[0.0f64; 3]; 3];
    let mut r = [[0.0f64; 3]; 3];
    let mut cols: [[f64; 3]; 3] = std::array::from_fn(|c| std::array::from_fn(|k| a[k][c]));
    for c in 0..3 {
        for prev in 0..c {
            let qp: [f64; 3] = std::array::from_fn(|k| q[k][prev]);
            let dot: f64 = (0..3).map(|k| qp[k] * cols[c][k]).sum();
            r[prev][c] = dot;
            for k in 0..3 {
                cols[c][k] -= dot * qp[k];
            }
        }
        let norm = cols[c].iter().map(|v| v * v).sum::<f64>().sqrt();
        if norm.is_nan() || norm <= 1e-12 {
            return None;
        }
        r[c][c] = norm;
        for k in 0..3 {
            q[k][c] = cols[c][k] / norm;
        }
    }
    Some((q, r))
}

/// A small fixed-seed generator (SplitMix64) for the RANSAC samples.
#[doc(hidden)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// [`RANSAC_SAMPLE`] distinct indices below `n` (`n >= RANSAC_SAMPLE`).
    fn distinct(&mut self, n: usize) -> [usize; RANSAC_SAMPLE] {
        let mut out = [0usize; RANSAC_SAMPLE];
        let mut k = 0;
        while k < RANSAC_SAMPLE {
            let candidate = (self.next_u64() % n as u64) as usize;
            if !out[..k].contains(&candidate) {
                out[k] = candidate;
                k += 1;
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;

    /// The ray map of a pinhole camera (`fx, fy, cx, cy` in pixels of a `width` x `height`
    /// image) at `centre` with camera-to-world rotation `rot`, at `w` x `h` ray pixels.
    fn camera_rays(
        rot: Mat3,
        centre: [f64; 3],
        k: [f64; 4],
        image: (usize, usize),
        map: (usize, usize),
    ) -> RayMap {
        let (w, h) = map;
        let n = w * h;
        let mut rays = vec![0.0f32; 6 * n];
        for y in 0..h {
            for x in 0..w {
                // Pixel centre of the ray map, in pixels of the image.
                let px = (x as f64 + 0.5) / w as f64 * image.0 as f64;
                let py = (y as f64 + 0.5) / h as f64 * image.1 as f64;
                let cam = [(px - k[2]) / k[0], (py - k[3]) / k[1], 1.0];
                let i = y * w + x;
                for r in 0..3 {
                    let d: f64 = (0..3).map(|c| rot[r][c] * cam[c]).sum();
                    rays[r * n + i] = d as f32;
                    rays[(3 + r) * n + i] = centre[r] as f32;
                }
            }
        }
        RayMap {
            width: w,
            height: h,
            rays,
            confidence: (0..n).map(|i| 1.0 + (i % 7) as f32).collect(),
        }
    }

    fn rotation(yaw: f64, pitch: f64) -> Mat3 {
        let (cy, sy, cp, sp) = (yaw.cos(), yaw.sin(), pitch.cos(), pitch.sin());
        let ry = [[cy, 0.0, sy], [0.0, 1.0, 0.0], [-sy, 0.0, cy]];
        let rx = [[1.0, 0.0, 0.0], [0.0, cp, -sp], [0.0, sp, cp]];
        mul3(&ry, &rx)
    }

    #[test]
    fn a_pinhole_cameras_rays_give_back_its_pose() {
        let rot = rotation(0.3, -0.2);
        let centre = [0.5, -1.0, 2.0];
        // The principal point at the centre: the official solver factors the homography as a
        // rotation times a lower triangle, which is exact only then (DA3's cameras are so).
        let k = [300.0, 280.0, 252.0, 168.0];
        let mut rays = camera_rays(rot, centre, k, (504, 336), (72, 48));
        // Outliers: a tenth of the rays point elsewhere, with low confidence.
        let n = rays.width * rays.height;
        for i in (0..n).step_by(10) {
            rays.rays[i] = -rays.rays[i] + 3.0;
            rays.confidence[i] = 0.5;
        }
        let pose = pose_from_rays(&rays, 504, 336).unwrap();
        let ki = pose.intrinsics;
        for (got, want) in [ki[0][0], ki[1][1], ki[0][2], ki[1][2]].iter().zip(k) {
            assert!(
                (f64::from(*got) - want).abs() < 1e-2 * want,
                "{ki:?} vs {k:?}"
            );
        }
        for r in 0..3 {
            for c in 0..3 {
                let got = f64::from(pose.extrinsics[r][c]);
                assert!((got - rot[c][r]).abs() < 1e-4, "{:?}", pose.extrinsics);
            }
            let t: f64 = -(0..3).map(|c| rot[c][r] * centre[c]).sum::<f64>();
            assert!((f64::from(pose.extrinsics[r][3]) - t).abs() < 1e-4);
        }
    }

    #[test]
    fn the_same_rays_give_the_same_pose() {
        let rays = camera_rays(
            rotation(0.1, 0.1),
            [0.0; 3],
            [200.0, 200.0, 100.0, 80.0],
            (200, 160),
            (40, 32),
        );
        assert_eq!(
            pose_from_rays(&rays, 200, 160).unwrap(),
            pose_from_rays(&rays, 200, 160).unwrap()
        );
    }

    #[test]
    fn unusable_ray_maps_are_errors_not_panics() {
        let good = camera_rays(
            rotation(0.0, 0.0),
            [0.0; 3],
            [50.0, 50.0, 20.0, 20.0],
            (40, 40),
            (8, 8),
        );
        let mut nan = good.clone();
        nan.rays[3] = f32::NAN;
        let mut flat = good.clone();
        flat.rays[2 * 64..3 * 64].iter_mut().for_each(|z| *z = 0.0);
        let mut short = good.clone();
        short.confidence.pop();
        let tiny = RayMap {
            width: 2,
            height: 2,
            rays: vec![1.0; 24],
            confidence: vec![1.0; 4],
        };
        for (what, rays) in [
            ("nan", nan),
            ("no z", flat),
            ("short", short),
            ("tiny", tiny),
        ] {
            let err = pose_from_rays(&rays, 40, 40).unwrap_err().to_string();
            assert!(err.starts_with("input: ray pose: "), "{what}: {err}");
        }
    }

    #[test]
    fn ql_gives_a_rotation_and_a_positive_lower_triangle() {
        let a = [[2.0, 0.3, -0.5], [0.1, 1.5, 0.2], [0.4, -0.2, 1.0]];
        let (q, l) = ql_decomposition(&a).unwrap();
        let back = mul3(&q, &l);
        for r in 0..3 {
            for c in 0..3 {
                assert!((back[r][c] - a[r][c]).abs() < 1e-12);
                if c > r {
                    assert!(l[r][c].abs() < 1e-12);
                }
            }
            assert!(l[r][r] > 0.0);
        }
        assert!((det3(&q) - 1.0).abs() < 1e-12);
    }
}
