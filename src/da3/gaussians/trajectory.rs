//! Camera paths for novel-view videos of a scene's Gaussians, after the official `trj_mode`s
//! (`run_renderer_in_chunk_w_trj_mode` in `depth_anything_3/model/utils/gs_renderer.py` and
//! `utils/camera_trj_helpers.py` of `depth-anything-3==0.1.1`):
//! - `original`: the input cameras;
//! - `smooth`: the input cameras filtered by a Gaussian kernel of 51 (fewer for short paths);
//! - `extend` (the official default): the cameras interpolated (8 frames a pair with cosine
//!   easing, 2 to 18 seconds at 24 frames/s in all), smoothed, and at the middle frame a
//!   wander (a small loop of the camera centre) and a dolly zoom;
//! - `wander`, `dolly-zoom`: those two alone, about the first camera (the official choice for
//!   one view).
//!
//! One difference: between two cameras the rotation is interpolated by slerp and the centre
//! linearly, where the official code turns both about the point nearest to the two optical
//! axes; for the short baselines of a scene the two paths differ little.

use crate::da3::outputs::Pose;
use crate::geometry::rotation::slerp;
use std::f64::consts::PI;
use std::str::FromStr;

/// A camera path mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trajectory {
    Original,
    Smooth,
    #[default]
    Extend,
    Wander,
    DollyZoom,
}

impl Trajectory {
    /// The names [`FromStr`] takes.
    pub const NAMES: [&'static str; 5] = ["original", "smooth", "extend", "wander", "dolly-zoom"];
}

impl FromStr for Trajectory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "original" => Trajectory::Original,
            "smooth" => Trajectory::Smooth,
            "extend" => Trajectory::Extend,
            "wander" => Trajectory::Wander,
            "dolly-zoom" | "dolly_zoom" => Trajectory::DollyZoom,
            other => {
                return Err(format!(
                    "unknown trajectory `{other}` (one of {})",
                    Self::NAMES.join(", ")
                ))
            }
        })
    }
}

/// A camera: camera-to-world `[R | c]` (rows) and pixel intrinsics.
#[derive(Debug, Clone, Copy)]
struct Camera {
    c2w: [[f64; 4]; 3],
    k: [[f64; 3]; 3],
}

impl Camera {
    fn of(pose: &Pose) -> Camera {
        let e = &pose.extrinsics;
        let r: [[f64; 3]; 3] = std::array::from_fn(|i| std::array::from_fn(|j| e[i][j] as f64));
        let t: [f64; 3] = std::array::from_fn(|i| e[i][3] as f64);
        let c2w = std::array::from_fn(|i| {
            let mut row = [0.0; 4];
            for (j, v) in row.iter_mut().take(3).enumerate() {
                *v = r[j][i];
            }
            row[3] = -(0..3).map(|j| r[j][i] * t[j]).sum::<f64>();
            row
        });
        let k = std::array::from_fn(|i| std::array::from_fn(|j| pose.intrinsics[i][j] as f64));
        Camera { c2w, k }
    }

    fn pose(&self) -> Pose {
        let c = &self.c2w;
        Pose {
            intrinsics: std::array::from_fn(|i| std::array::from_fn(|j| self.k[i][j] as f32)),
            extrinsics: std::array::from_fn(|i| {
                let mut row = [0.0f32; 4];
                for (j, v) in row.iter_mut().take(3).enumerate() {
                    *v = c[j][i] as f32;
                }
                row[3] = -(0..3).map(|j| c[j][i] * c[j][3]).sum::<f64>() as f32;
                row
            }),
        }
    }

    /// This camera moved by `offset` in its own frame, `c2w @ [I | offset]`.
    fn moved(&self, offset: [f64; 3]) -> Camera {
        let mut out = *self;
        for (i, row) in out.c2w.iter_mut().enumerate() {
            row[3] += (0..3).map(|j| self.c2w[i][j] * offset[j]).sum::<f64>();
        }
        out
    }
}

/// The cameras of `mode` for a scene whose views have `poses` (in view order). One view
/// always gets a wander.
pub fn camera_path(poses: &[Pose], mode: Trajectory) -> Vec<Pose> {
    let cameras: Vec<Camera> = poses.iter().map(Camera::of).collect();
    let Some(&first) = cameras.first() else {
        return Vec::new();
    };
    let mode = if cameras.len() == 1 && !matches!(mode, Trajectory::DollyZoom) {
        Trajectory::Wander
    } else {
        mode
    };
    let path = match mode {
        Trajectory::Original => cameras,
        Trajectory::Smooth => smooth(&cameras, 50),
        Trajectory::Wander => wander(&first, 120, 24.0),
        // The official standalone dolly zoom: D_focus 30, max_disp 2.
        Trajectory::DollyZoom => dolly_zoom(&first, 120, 2.0, 30.0),
        Trajectory::Extend => {
            let path = smooth(&interpolate(&cameras), 50);
            let mid = path.len() / 2;
            let frames = (mid / 2).clamp(36, 60);
            let mut out = path[..mid].to_vec();
            out.extend(wander(&path[mid], frames, 24.0));
            out.extend(dolly_zoom(&path[mid], frames, 0.1, 10.0));
            out.extend_from_slice(&path[mid..]);
            out
        }
    };
    path.iter().map(Camera::pose).collect()
}

/// The official interpolation's frame count between two views, eased by `(cos(pi (t + 1)) +
/// 1) / 2`, each pair's first frame left out after the first pair.
fn interpolate(cameras: &[Camera]) -> Vec<Camera> {
    let pairs = cameras.len() - 1;
    let mut inter = 8;
    if pairs * inter > 24 * 18 {
        inter = (24 * 10 / pairs).max(1);
    }
    if pairs * inter < 24 * 2 {
        inter = (24 * 2 / pairs).max(1);
    }
    if inter <= 2 {
        return cameras.to_vec();
    }
    let mut out = Vec::new();
    for (p, pair) in cameras.windows(2).enumerate() {
        for i in usize::from(p > 0)..inter {
            let t = i as f64 / (inter - 1) as f64;
            let eased = ((PI * (t + 1.0)).cos() + 1.0) / 2.0;
            out.push(between(&pair[0], &pair[1], eased));
        }
    }
    out
}

/// The camera a fraction `t` of the way from `a` to `b`: rotation by slerp, centre and
/// intrinsics linearly.
fn between(a: &Camera, b: &Camera, t: f64) -> Camera {
    let rot = |c: &Camera| -> [[f64; 3]; 3] {
        std::array::from_fn(|i| std::array::from_fn(|j| c.c2w[i][j]))
    };
    let r = slerp(&rot(a), &rot(b), t);
    Camera {
        c2w: std::array::from_fn(|i| {
            let mut row = [0.0; 4];
            row[..3].copy_from_slice(&r[i]);
            row[3] = a.c2w[i][3] + (b.c2w[i][3] - a.c2w[i][3]) * t;
            row
        }),
        k: std::array::from_fn(|i| {
            std::array::from_fn(|j| a.k[i][j] + (b.k[i][j] - a.k[i][j]) * t)
        }),
    }
}

/// The official `render_stabilization_path`: the first two axes and the centre of the
/// cameras filtered by OpenCV's Gaussian kernel of `k_size` (made odd, at most the path's
/// length, at least 3) with reflected ends, the axes renormalised and the third their cross
/// product.
fn smooth(cameras: &[Camera], k_size: usize) -> Vec<Camera> {
    let n = cameras.len();
    if n <= 1 {
        return cameras.to_vec();
    }
    let mut k = k_size.max(1) | 1;
    let max_odd = if n % 2 == 1 { n } else { n - 1 };
    k = k.min(max_odd.max(1));
    if n >= 3 && k < 3 {
        k = 3;
    }
    let kernel = gaussian_kernel(k);
    let pad = k / 2;
    // PyTorch's "reflect" padding: index -1 is 1, index n is n - 2.
    let reflect = |i: isize| -> usize {
        let last = n as isize - 1;
        let mut i = i;
        while i < 0 || i > last {
            i = if i < 0 { -i } else { 2 * last - i };
        }
        i as usize
    };
    let column = |c: &Camera, col: usize| -> [f64; 3] { std::array::from_fn(|i| c.c2w[i][col]) };
    let filter = |col: usize, f: usize| -> [f64; 3] {
        let mut out = [0.0; 3];
        for (j, w) in kernel.iter().enumerate() {
            let src = reflect(f as isize + j as isize - pad as isize);
            let v = column(&cameras[src], col);
            for i in 0..3 {
                out[i] += w * v[i];
            }
        }
        out
    };
    (0..n)
        .map(|f| {
            let unit = |v: [f64; 3]| {
                let n = v.iter().map(|x| x * x).sum::<f64>().sqrt();
                v.map(|x| x / n)
            };
            let r1 = unit(filter(0, f));
            let r2 = unit(filter(1, f));
            let t = filter(3, f);
            let r3 = [
                r1[1] * r2[2] - r1[2] * r2[1],
                r1[2] * r2[0] - r1[0] * r2[2],
                r1[0] * r2[1] - r1[1] * r2[0],
            ];
            Camera {
                c2w: std::array::from_fn(|i| [r1[i], r2[i], r3[i], t[i]]),
                k: cameras[f].k,
            }
        })
        .collect()
}

/// `cv2.getGaussianKernel(k, -1)`: OpenCV's fixed kernels up to 7 taps, otherwise sampled
/// with `sigma = 0.3 ((k - 1) / 2 - 1) + 0.8`, normalised.
fn gaussian_kernel(k: usize) -> Vec<f64> {
    match k {
        1 => vec![1.0],
        3 => vec![0.25, 0.5, 0.25],
        5 => vec![0.0625, 0.25, 0.375, 0.25, 0.0625],
        7 => vec![
            0.03125, 0.109375, 0.21875, 0.28125, 0.21875, 0.109375, 0.03125,
        ],
        _ => {
            let sigma = 0.3 * ((k as f64 - 1.0) * 0.5 - 1.0) + 0.8;
            let c = (k as f64 - 1.0) / 2.0;
            let w: Vec<f64> = (0..k)
                .map(|i| (-(i as f64 - c).powi(2) / (2.0 * sigma * sigma)).exp())
                .collect();
            let sum: f64 = w.iter().sum();
            w.into_iter().map(|v| v / sum).collect()
        }
    }
}

/// The official `render_wander_path`: the centre moved on a small loop (`max_disp` pixels of
/// parallax at unit depth) over `frames` frames, the camera itself first and last.
fn wander(camera: &Camera, frames: usize, max_disp: f64) -> Vec<Camera> {
    let r = max_disp / camera.k[0][0];
    let mut out = vec![*camera];
    for i in 0..frames {
        let th = 2.0 * PI * i as f64 / (frames.max(2) - 1) as f64;
        let (x, yz) = (r * th.sin(), r * th.cos() / 3.0);
        out.push(camera.moved([-x, -yz, -yz]));
    }
    out.push(*camera);
    out
}

/// The official `render_dolly_zoom_path`: the camera backs away by up to `max_disp` along
/// its axis and returns while the focal length shrinks to keep a plane at `focus` framed.
fn dolly_zoom(camera: &Camera, frames: usize, max_disp: f64, focus: f64) -> Vec<Camera> {
    (0..frames)
        .map(|i| {
            let t = 2.0 * i as f64 / (frames.max(2) - 1) as f64;
            let z = 0.5 * (1.0 - (PI * t).cos()) * max_disp;
            let mut c = camera.moved([0.0, 0.0, -z]);
            let scale = (focus / (focus + z)).max(1e-6);
            c.k[0][0] *= scale;
            c.k[1][1] *= scale;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pose(yaw: f64, x: f64) -> Pose {
        let (s, c) = yaw.sin_cos();
        // World-to-camera of a camera at (x, 0, 0) turned by `yaw` about y.
        let r = [[c, 0.0, -s], [0.0, 1.0, 0.0], [s, 0.0, c]];
        let t: [f64; 3] = std::array::from_fn(|i| -r[i][0] * x);
        Pose {
            intrinsics: [[100.0, 0.0, 32.0], [0.0, 100.0, 24.0], [0.0, 0.0, 1.0]],
            extrinsics: std::array::from_fn(|i| {
                [r[i][0] as f32, r[i][1] as f32, r[i][2] as f32, t[i] as f32]
            }),
        }
    }

    fn centre(p: &Pose) -> [f64; 3] {
        Camera::of(p).c2w.map(|row| row[3])
    }

    /// The official kernels: OpenCV's table up to 7 taps, sampled beyond, summing to one.
    #[test]
    fn kernels_are_opencvs() {
        assert_eq!(gaussian_kernel(3), vec![0.25, 0.5, 0.25]);
        let k = gaussian_kernel(51);
        assert_eq!(k.len(), 51);
        assert!((k.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        // sigma = 0.3 * 24 + 0.8 = 8.0.
        assert!((k[25] / k[33] - (0.5f64).exp()).abs() < 1e-12);
    }

    /// Poses survive the round trip through cameras; original is the input; a straight
    /// path stays straight through smoothing (a linear signal under a symmetric kernel).
    #[test]
    fn paths_start_from_the_input_cameras() {
        let poses: Vec<Pose> = (0..5).map(|i| pose(0.0, i as f64)).collect();
        let original = camera_path(&poses, Trajectory::Original);
        for (a, b) in original.iter().zip(&poses) {
            for i in 0..3 {
                for j in 0..4 {
                    assert!((a.extrinsics[i][j] - b.extrinsics[i][j]).abs() < 1e-6);
                }
            }
        }
        let smoothed = camera_path(&poses, Trajectory::Smooth);
        assert_eq!(smoothed.len(), 5);
        // Interior frames of a line stay on it (reflection bends only the ends).
        assert!((centre(&smoothed[2])[0] - 2.0).abs() < 1e-6);
    }

    /// extend: the interpolated, smoothed path with a wander and a dolly zoom at its middle;
    /// lengths as the official: 2 views -> 48 frames, + 2 x 36.
    #[test]
    fn extend_inserts_a_wander_and_a_dolly_zoom() {
        let poses = [pose(0.0, 0.0), pose(0.3, 1.0)];
        let path = camera_path(&poses, Trajectory::Extend);
        let wander_frames = 36 + 2;
        assert_eq!(path.len(), 48 + wander_frames + 36);
        // The dolly zoom narrows the focal length and restores it.
        let focal: Vec<f32> = path.iter().map(|p| p.intrinsics[0][0]).collect();
        assert!(focal.iter().any(|&f| f < 100.0));
        assert!((focal[0] - 100.0).abs() < 1e-4 && (focal[path.len() - 1] - 100.0).abs() < 1e-4);
        // One view: a wander about it, starting and ending there.
        let single = camera_path(&poses[..1], Trajectory::Extend);
        assert_eq!(single.len(), 122);
        assert_eq!(centre(&single[0]), centre(&single[121]));
        assert!(centre(&single[30]) != centre(&single[0]));
    }

    /// Slerp between two cameras passes their halfway rotation.
    #[test]
    fn interpolation_turns_halfway() {
        let (a, b) = (Camera::of(&pose(0.0, 0.0)), Camera::of(&pose(0.6, 2.0)));
        let mid = between(&a, &b, 0.5);
        let expected = Camera::of(&pose(0.3, 0.0));
        for i in 0..3 {
            for j in 0..3 {
                assert!((mid.c2w[i][j] - expected.c2w[i][j]).abs() < 1e-6);
            }
        }
        assert!((mid.c2w[0][3] - 1.0).abs() < 1e-6);
    }
}
