//! 3D Gaussians from the Gaussian head's raw output (`place`, which
//! [`crate::Request::gaussians`] runs), rendered from any camera ([`render()`]) along the
//! official camera paths ([`trajectory`]).
//!
//! The placement is the official `GaussianAdapter`
//! (`depth_anything_3/model/gs_adapter.py` of `depth-anything-3==0.1.1`), one Gaussian per
//! pixel of every view, in the predicted world frame.
//!
//! Per pixel `(x, y)` of a `W x H` view with raw channels `r` (xy offset, 3 scales, a
//! quaternion, 3 x the SH coefficients, depth offset; [`GaussianConfig::raw_channels`]) and the
//! opacity logit after them:
//! - position: the ray through `((x + 0.5 + r_x) / W, (y + 0.5 + r_y) / H)` of the intrinsics
//!   normalised by the image size, as a unit vector, times `depth + r_depth`, from the camera
//!   centre (the official code scales the unit ray by the z-depth, not the ray's length);
//! - scales: `min + (max - min) sigmoid(r_s)`, times that depth and `0.1 (sum of the rows of
//!   K_n[:2,:2]^-1 (1/W, 1/H))`, about one pixel's footprint;
//! - rotation: the normalised quaternion rotated into the world frame through the same
//!   component order the official code uses (its quaternion helpers take x, y, z, w and are
//!   handed w, x, y, z; the stored result is what its renderer reads as w, x, y, z);
//! - colour: spherical harmonics, band `l` scaled by `0.1 x 0.25^l` (`l > 0`), rotated from the
//!   camera into the world frame;
//! - opacity: `sigmoid` of the logit (the official `map_pdf_to_opacity` at step 0 is the
//!   identity).

pub mod render;
pub mod trajectory;

pub use render::{render, Rendered};
pub use trajectory::{camera_path, Trajectory};

use super::config::GaussianConfig;
use super::outputs::Pose;
use super::poses::mat_to_quat;
use super::Error;
use crate::geometry::rotation::matrix_of_xyzw;

/// One Gaussian per pixel of every view, views in order, rows top to bottom (the official
/// `(v h w)` order), in the world frame of the scene's poses.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Gaussians {
    /// Views, and the processed size of each.
    pub views: usize,
    pub width: usize,
    pub height: usize,
    /// Centres.
    pub means: Vec<[f32; 3]>,
    /// Standard deviations along the Gaussian's axes.
    pub scales: Vec<[f32; 3]>,
    /// Orientation quaternions as 3DGS stores them (`rot_0..3`, w first).
    pub rotations: Vec<[f32; 4]>,
    /// Spherical-harmonic coefficients, per Gaussian `3 x sh_coefficients` (red's first).
    pub harmonics: Vec<f32>,
    /// Coefficients per colour channel ((degree + 1)^2).
    pub sh_coefficients: usize,
    /// Opacities in 0..1.
    pub opacities: Vec<f32>,
}

impl Gaussians {
    /// How many Gaussians.
    pub fn len(&self) -> usize {
        self.means.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.means.is_empty()
    }

    /// The colour coefficients of Gaussian `i`, `3 x sh_coefficients`.
    pub fn harmonics_of(&self, i: usize) -> &[f32] {
        let n = 3 * self.sh_coefficients;
        &self.harmonics[i * n..(i + 1) * n]
    }
}

/// Places the Gaussians of every view: `raw` is the head's output `[W, H, C, views]` in ggml's
/// order (`x` fastest), `depth` each view's depth (`W x H`, before any post-processing) and
/// `poses` each view's camera at the processed size.
pub(crate) fn place(
    cfg: &GaussianConfig,
    raw: &[f32],
    width: usize,
    height: usize,
    depth: &[&[f32]],
    poses: &[Pose],
) -> Result<Gaussians, Error> {
    let views = depth.len();
    let channels = cfg.output_dim();
    let plane = width * height;
    if raw.len() != plane * channels * views || poses.len() != views {
        return Err(Error::Input(format!(
            "Gaussian head output of {} values for {views} view(s) of {width}x{height} with \
             {channels} channels and {} pose(s)",
            raw.len(),
            poses.len()
        )));
    }
    if let Some(v) = depth.iter().position(|d| d.len() != plane) {
        return Err(Error::Input(format!(
            "view {v}: depth is not {width}x{height}"
        )));
    }
    let d_sh = cfg.sh_coefficients();
    let sh_mask: Vec<f64> = (0..d_sh)
        .map(|k| match sh_degree_of(k) {
            0 => 1.0,
            l => 0.1 * 0.25f64.powi(l as i32),
        })
        .collect();
    let n = plane * views;
    let mut g = Gaussians {
        views,
        width,
        height,
        means: Vec::with_capacity(n),
        scales: Vec::with_capacity(n),
        rotations: Vec::with_capacity(n),
        harmonics: Vec::with_capacity(n * 3 * d_sh),
        sh_coefficients: d_sh,
        opacities: Vec::with_capacity(n),
    };
    let (wf, hf) = (width as f64, height as f64);
    // Channel offsets in the raw output.
    let xy = 0;
    let scale_at = 2 * cfg.offset_xy as usize;
    let quat_at = scale_at + 3;
    let sh_at = quat_at + 4;
    let depth_at = sh_at + 3 * d_sh;
    let opacity_at = cfg.raw_channels();
    // One colour channel's coefficients, before and after the rotation (at most 9: degree 2).
    let (mut band, mut rotated) = ([0.0f64; 9], [0.0f64; 9]);
    for (v, (pose, depth)) in poses.iter().zip(depth).enumerate() {
        let camera = ViewCamera::new(pose, wf, hf)?;
        let sh_rotation = ShRotation::new(cfg.sh_degree, &camera.rotation);
        let channel = |c: usize| &raw[(v * channels + c) * plane..(v * channels + c + 1) * plane];
        for p in 0..plane {
            let (x, y) = ((p % width) as f64, (p / width) as f64);
            let r = |c: usize| channel(c)[p] as f64;
            let mut d = depth[p] as f64;
            if cfg.offset_depth {
                d += r(depth_at);
            }
            let (mut u, mut w) = ((x + 0.5) / wf, (y + 0.5) / hf);
            if cfg.offset_xy {
                u += r(xy) / wf;
                w += r(xy + 1) / hf;
            }
            let ray = camera.world_ray(u, w);
            g.means.push(std::array::from_fn(|k| {
                (camera.centre[k] + ray[k] * d) as f32
            }));
            let footprint = d * camera.pixel_scale;
            g.scales.push(std::array::from_fn(|k| {
                let s = cfg.scale_min as f64
                    + (cfg.scale_max - cfg.scale_min) as f64 * sigmoid(r(scale_at + k));
                (s * footprint) as f32
            }));
            let q: [f64; 4] = std::array::from_fn(|k| r(quat_at + k));
            g.rotations.push(world_rotation(q, &camera.rotation));
            for colour in 0..3 {
                for (k, b) in band[..d_sh].iter_mut().enumerate() {
                    *b = r(sh_at + colour * d_sh + k) * sh_mask[k];
                }
                sh_rotation.apply(&band[..d_sh], &mut rotated[..d_sh]);
                g.harmonics
                    .extend(rotated[..d_sh].iter().map(|&c| c as f32));
            }
            g.opacities.push(sigmoid(r(opacity_at)) as f32);
        }
    }
    Ok(g)
}

/// The covariance `R S^2 R^T` of a Gaussian with rotation `q` (w, x, y, z; any length but
/// zero) and standard deviations `scales` along its axes.
pub fn covariance(q: [f32; 4], scales: [f32; 3]) -> [[f64; 3]; 3] {
    let r = crate::geometry::rotation::matrix_of_wxyz(q.map(f64::from));
    let s = scales.map(|v| (v as f64) * (v as f64));
    std::array::from_fn(|i| std::array::from_fn(|j| (0..3).map(|k| r[i][k] * r[j][k] * s[k]).sum()))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The band of coefficient `k` (`l^2 <= k < (l + 1)^2`).
fn sh_degree_of(k: usize) -> usize {
    (k as f64).sqrt().floor() as usize
}

type Mat3 = [[f64; 3]; 3];

/// A view's camera as the adapter uses it: camera-to-world rotation and centre, the inverse of
/// the intrinsics normalised by the image size, and the scale multiplier.
struct ViewCamera {
    rotation: Mat3,
    centre: [f64; 3],
    inverse_normalised_k: Mat3,
    pixel_scale: f64,
}

impl ViewCamera {
    fn new(pose: &Pose, w: f64, h: f64) -> Result<ViewCamera, Error> {
        let e = &pose.extrinsics;
        let r_wc: Mat3 = std::array::from_fn(|i| std::array::from_fn(|j| e[i][j] as f64));
        let t: [f64; 3] = std::array::from_fn(|i| e[i][3] as f64);
        // The inverse of a rigid [R | t]: [R^T | -R^T t].
        let rotation: Mat3 = std::array::from_fn(|i| std::array::from_fn(|j| r_wc[j][i]));
        let centre: [f64; 3] =
            std::array::from_fn(|i| -(0..3).map(|j| rotation[i][j] * t[j]).sum::<f64>());
        let k = &pose.intrinsics;
        let mut kn: Mat3 = std::array::from_fn(|i| std::array::from_fn(|j| k[i][j] as f64));
        kn[0].iter_mut().for_each(|v| *v /= w);
        kn[1].iter_mut().for_each(|v| *v /= h);
        let inverse_normalised_k = super::export::invert3(&kn).ok_or_else(|| {
            Error::Input(format!(
                "singular intrinsics {k:?}: no Gaussians can be placed"
            ))
        })?;
        // 0.1 x the sum of the rows of inverse(K_n[:2, :2]) (1/W, 1/H).
        let [[a, b], [c, d]] = [[kn[0][0], kn[0][1]], [kn[1][0], kn[1][1]]];
        let det = a * d - b * c;
        let inv = [[d / det, -b / det], [-c / det, a / det]];
        let pixel = [1.0 / w, 1.0 / h];
        let pixel_scale = 0.1
            * (0..2)
                .map(|i| inv[i][0] * pixel[0] + inv[i][1] * pixel[1])
                .sum::<f64>();
        Ok(ViewCamera {
            rotation,
            centre,
            inverse_normalised_k,
            pixel_scale,
        })
    }

    /// The unit world-space ray through normalised image point `(u, v)`.
    fn world_ray(&self, u: f64, v: f64) -> [f64; 3] {
        let k = &self.inverse_normalised_k;
        let cam: [f64; 3] = std::array::from_fn(|i| k[i][0] * u + k[i][1] * v + k[i][2]);
        let norm = cam.iter().map(|c| c * c).sum::<f64>().sqrt();
        std::array::from_fn(|i| (0..3).map(|j| self.rotation[i][j] * cam[j]).sum::<f64>() / norm)
    }
}

/// The official `cam_quat_xyzw_to_world_quat_wxyz` on a raw quaternion `q`: normalised
/// (`q / (|q| + 1e-8)`), reordered `(q3, q0, q1, q2)` and handed to a matrix conversion that
/// reads `(x, y, z, w)`, rotated by `c2w`, converted back to `(x, y, z, w)` with a
/// non-negative last component. The four values are stored in that order.
fn world_rotation(q: [f64; 4], c2w: &Mat3) -> [f32; 4] {
    let norm = q.iter().map(|v| v * v).sum::<f64>().sqrt() + 1e-8;
    let q = q.map(|v| v / norm);
    // The official code hands (w, x, y, z) to a conversion that reads (x, y, z, w).
    let m = matrix_of_xyzw([q[3], q[0], q[1], q[2]]);
    let world: Mat3 =
        std::array::from_fn(|a| std::array::from_fn(|b| (0..3).map(|c| c2w[a][c] * m[c][b]).sum()));
    mat_to_quat(&world).map(|v| v as f32)
}

/// The official `rotate_sh` (through e3nn): the colour coefficients of band `l` multiplied by
/// e3nn's Wigner matrix `D_l(R')` in e3nn's real basis, where `R' = F P^-1 R P F^-1` for the
/// camera-to-world rotation `R`, `P` the official axis permutation (yzx to xyz) and `F` a half
/// turn about e3nn's y axis (the official code negates the middle Euler angle, which is the
/// same as conjugating by that turn). For band 1 this is the rotation of 3DGS's basis
/// (`f'(d) = f(R^T d)`); for band 2 it is not, but it is what the trained network's colours
/// went through, so it is kept. `D_l(R')` is fitted from e3nn's basis at fixed directions:
/// `Y(R' d) = D Y(d)` holds exactly for a band.
struct ShRotation {
    bands: Vec<Vec<f64>>,
}

impl ShRotation {
    fn new(degree: usize, rotation: &Mat3) -> ShRotation {
        // P^-1 R P with P = [[0,0,1],[1,0,0],[0,1,0]]: (P^-1 R P)[i][j] = R[p(i)][p(j)] with
        // p = (1, 2, 0); then F = diag(-1, 1, -1) on both sides.
        let p = [1, 2, 0];
        let f = [-1.0, 1.0, -1.0];
        let r: Mat3 =
            std::array::from_fn(|i| std::array::from_fn(|j| f[i] * rotation[p[i]][p[j]] * f[j]));
        let bands = (1..=degree)
            .map(|l| {
                // More directions than the band has functions, spread over the sphere (a
                // Fibonacci lattice), and the least-squares fit.
                let count = 4 * (2 * l + 1);
                let dirs: Vec<[f64; 3]> = (0..count)
                    .map(|i| {
                        let z = 1.0 - 2.0 * (i as f64 + 0.5) / count as f64;
                        let phi = i as f64 * 2.399_963_229_728_653; // the golden angle
                        let s = (1.0 - z * z).sqrt();
                        [s * phi.cos(), s * phi.sin(), z]
                    })
                    .collect();
                // Rows Y(d_i) and Y(R' d_i): Y(R' d_i) = D Y(d_i) for every i, so
                // D^T = (Y^T Y)^-1 Y^T Yr.
                let y: Vec<Vec<f64>> = dirs.iter().map(|d| e3nn_band(l, d)).collect();
                let yr: Vec<Vec<f64>> = dirs
                    .iter()
                    .map(|d| {
                        let turned: [f64; 3] =
                            std::array::from_fn(|i| (0..3).map(|j| r[i][j] * d[j]).sum::<f64>());
                        e3nn_band(l, &turned)
                    })
                    .collect();
                let m = 2 * l + 1;
                let gram = |a: &[Vec<f64>], b: &[Vec<f64>]| -> Vec<Vec<f64>> {
                    (0..m)
                        .map(|i| {
                            (0..m)
                                .map(|j| a.iter().zip(b).map(|(ra, rb)| ra[i] * rb[j]).sum())
                                .collect()
                        })
                        .collect()
                };
                let transposed = solve(gram(&y, &y), gram(&y, &yr));
                (0..m * m)
                    .map(|k| transposed[(k % m) * m + k / m])
                    .collect()
            })
            .collect();
        ShRotation { bands }
    }

    /// One colour channel's coefficients `c` (every band up to the degree) rotated into `out`
    /// (as long).
    fn apply(&self, c: &[f64], out: &mut [f64]) {
        out.copy_from_slice(c);
        for (l, d) in (1..).zip(&self.bands) {
            let n = 2 * l + 1;
            let start = l * l;
            for i in 0..n {
                out[start + i] = (0..n).map(|j| d[i * n + j] * c[start + j]).sum();
            }
        }
    }
}

/// e3nn's real spherical harmonics of band `l` (1 or 2) at unit direction `d`, in its order
/// and "component" normalisation (`o3.spherical_harmonics(l, d, normalize=True)`).
fn e3nn_band(l: usize, d: &[f64; 3]) -> Vec<f64> {
    let [x, y, z] = *d;
    let (s3, s5, s15) = (3f64.sqrt(), 5f64.sqrt(), 15f64.sqrt());
    match l {
        1 => vec![s3 * x, s3 * y, s3 * z],
        2 => vec![
            s15 * x * z,
            s15 * x * y,
            s5 * (y * y - (x * x + z * z) / 2.0),
            s15 * y * z,
            s15 / 2.0 * (z * z - x * x),
        ],
        _ => unreachable!("bands 1 and 2"),
    }
}

/// `A^-1 B` for square `A` (rows), by Gaussian elimination with partial pivoting; row-major
/// `n x n` result.
fn solve(mut a: Vec<Vec<f64>>, mut b: Vec<Vec<f64>>) -> Vec<f64> {
    let n = a.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .expect("rows");
        a.swap(col, pivot);
        b.swap(col, pivot);
        for row in 0..n {
            if row != col {
                let f = a[row][col] / a[col][col];
                for k in 0..n {
                    a[row][k] -= f * a[col][k];
                    b[row][k] -= f * b[col][k];
                }
            }
        }
    }
    (0..n)
        .flat_map(|i| {
            let p = a[i][i];
            b[i].iter().map(move |v| v / p).collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(r: &ShRotation, c: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; c.len()];
        r.apply(c, &mut out);
        out
    }

    fn rotation_about(axis: [f64; 3], angle: f64) -> Mat3 {
        let n = axis.iter().map(|v| v * v).sum::<f64>().sqrt();
        let [x, y, z] = axis.map(|v| v / n);
        let (s, c) = angle.sin_cos();
        let t = 1.0 - c;
        [
            [t * x * x + c, t * x * y - s * z, t * x * z + s * y],
            [t * x * y + s * z, t * y * y + c, t * y * z - s * x],
            [t * x * z - s * y, t * y * z + s * x, t * z * z + c],
        ]
    }

    /// e3nn's `wigner_D` is a representation in its basis: `Y(R' d) = D Y(d)`, so the fitted
    /// matrices are orthogonal, compose, and leave the identity alone; band 1 is the rotation
    /// of 3DGS's basis `(-y, z, -x)`: `f'(d) = f(R^T d)`.
    #[test]
    fn harmonic_rotations_are_e3nn_representations() {
        let a = rotation_about([0.3, -0.5, 0.8], 1.1);
        let b = rotation_about([-0.2, 0.9, 0.1], -0.7);
        let ab: Mat3 = std::array::from_fn(|i| {
            std::array::from_fn(|j| (0..3).map(|k| a[i][k] * b[k][j]).sum())
        });
        let (ra, rb, rab) = (
            ShRotation::new(2, &a),
            ShRotation::new(2, &b),
            ShRotation::new(2, &ab),
        );
        let c: Vec<f64> = (0..9).map(|k| ((k * 37 % 11) as f64 - 5.0) / 7.0).collect();
        let composed = apply(&ra, &apply(&rb, &c));
        for (x, y) in composed.iter().zip(apply(&rab, &c)) {
            assert!((x - y).abs() < 1e-12);
        }
        let norm = |v: &[f64]| v[4..9].iter().map(|x| x * x).sum::<f64>();
        assert!((norm(&apply(&ra, &c)) - norm(&c)).abs() < 1e-12);
        let id = ShRotation::new(2, &rotation_about([1.0, 0.0, 0.0], 0.0));
        for (x, y) in apply(&id, &c).iter().zip(&c) {
            assert!((x - y).abs() < 1e-12);
        }
        // Band 1 in 3DGS's basis: the value at R d after equals the value at d before.
        let band1 = |c: &[f64], d: &[f64; 3]| -c[1] * d[1] + c[2] * d[2] - c[3] * d[0];
        let rotated = apply(&ra, &c);
        for d in [[0.0, 0.0, 1.0], [0.6, 0.0, 0.8], [-0.48, 0.6, 0.64]] {
            let rd: [f64; 3] = std::array::from_fn(|i| (0..3).map(|j| a[i][j] * d[j]).sum());
            assert!((band1(&rotated, &rd) - band1(&c, &d)).abs() < 1e-12);
        }
    }
}
