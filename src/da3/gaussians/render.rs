//! A CPU renderer of 3D Gaussians (the forward pass of 3D Gaussian Splatting, Kerbl et al.
//! 2023, as gsplat computes it): each Gaussian's covariance projected to the image through the
//! local affine approximation of the camera, dilated by 0.3 pixel^2, its colour from its
//! spherical harmonics at the viewing direction, then alpha-blended front to back in depth
//! order. Pixel `(i, j)` is sampled at its centre `(i + 0.5, j + 0.5)` in the intrinsics' pixel
//! frame, where the Gaussians were placed.
//!
//! For novel-view videos of a scene (`da3 depth --gs-video`): a frame of a few hundred thousand
//! Gaussians takes tens of milliseconds over the machine's cores.

use super::Gaussians;
use crate::da3::outputs::{Colormap, Pose};

/// One rendered view: RGB in 0..1 and the expected depth (the blend of the Gaussians' camera
/// depths by their weights, normalised by the accumulated opacity; 0 where nothing was hit).
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub width: usize,
    pub height: usize,
    /// Row-major, 3 values a pixel.
    pub rgb: Vec<f32>,
    /// Row-major.
    pub depth: Vec<f32>,
    /// Accumulated opacity, row-major.
    pub alpha: Vec<f32>,
}

impl Rendered {
    /// The colour beside the depth, as one RGB8 image `2 width x height` (the official video's
    /// "hcat" layout): depth coloured by `colormap` on its inverse between `near` and `far`
    /// (near bright), black where the Gaussians cover less than half the pixel.
    pub fn beside_depth(&self, colormap: Colormap, near: f32, far: f32) -> Vec<u8> {
        let (w, h) = (self.width, self.height);
        let mut out = vec![0u8; 2 * w * h * 3];
        let (inv_near, inv_far) = (1.0 / near.max(1e-6), 1.0 / far.max(1e-6));
        for y in 0..h {
            for x in 0..w {
                let p = y * w + x;
                let row = y * 2 * w;
                for k in 0..3 {
                    out[3 * (row + x) + k] =
                        (self.rgb[3 * p + k].clamp(0.0, 1.0) * 255.0).round() as u8;
                }
                if self.alpha[p] >= 0.5 && self.depth[p] > 0.0 {
                    let t = (1.0 / self.depth[p] - inv_far) / (inv_near - inv_far);
                    out[3 * (row + w + x)..3 * (row + w + x) + 3].copy_from_slice(&colormap.rgb(t));
                }
            }
        }
        out
    }
}

/// Cameras nearer than this (in scene units) to a Gaussian do not draw it.
const NEAR: f64 = 0.01;
/// Contributions below this opacity are skipped (3DGS's 1/255).
const MIN_ALPHA: f64 = 1.0 / 255.0;
/// A pixel stops taking Gaussians once its transmittance falls below this.
const MIN_TRANSMITTANCE: f64 = 1e-4;

/// A Gaussian as the camera sees it.
struct Splat {
    /// Centre in pixels.
    u: f64,
    v: f64,
    /// Inverse of the 2D covariance: `a dx^2 + 2 b dx dy + c dy^2`.
    a: f64,
    b: f64,
    c: f64,
    /// Bounding box in pixels (inclusive), 3 standard deviations.
    x0: usize,
    x1: usize,
    y0: usize,
    y1: usize,
    depth: f64,
    opacity: f64,
    rgb: [f64; 3],
}

/// Renders `gaussians` seen by the camera `pose` (world-to-camera extrinsics, intrinsics in
/// pixels of a `width x height` image) on up to `threads` threads (0: every core).
pub fn render(
    gaussians: &Gaussians,
    pose: &Pose,
    width: usize,
    height: usize,
    threads: usize,
) -> Rendered {
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let mut splats = project(gaussians, pose, width, height, threads);
    splats.sort_by(|p, q| p.depth.total_cmp(&q.depth));
    let mut out = Rendered {
        width,
        height,
        rgb: vec![0.0; 3 * width * height],
        depth: vec![0.0; width * height],
        alpha: vec![0.0; width * height],
    };
    // Bands of rows, one thread each: every band blends the splats that reach it, in order.
    let rows = height.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let bands = out
            .rgb
            .chunks_mut(3 * width * rows)
            .zip(out.depth.chunks_mut(width * rows))
            .zip(out.alpha.chunks_mut(width * rows))
            .enumerate();
        for (band, ((rgb, depth), alpha)) in bands {
            let splats = &splats;
            scope.spawn(move || {
                blend_band(splats, band * rows, width, rgb, depth, alpha);
            });
        }
    });
    out
}

/// Blends `splats` (sorted near to far) into the rows from `y_start` that the buffers hold.
fn blend_band(
    splats: &[Splat],
    y_start: usize,
    width: usize,
    rgb: &mut [f32],
    depth: &mut [f32],
    alpha: &mut [f32],
) {
    let band_rows = depth.len() / width;
    let y_end = y_start + band_rows;
    let mut transmittance = vec![1.0f64; width * band_rows];
    let mut colour = vec![[0.0f64; 3]; width * band_rows];
    let mut weighted_depth = vec![0.0f64; width * band_rows];
    for s in splats {
        if s.y1 < y_start || s.y0 >= y_end {
            continue;
        }
        for y in s.y0.max(y_start)..=s.y1.min(y_end - 1) {
            let dy = y as f64 + 0.5 - s.v;
            for x in s.x0..=s.x1 {
                let p = (y - y_start) * width + x;
                let t = transmittance[p];
                if t < MIN_TRANSMITTANCE {
                    continue;
                }
                let dx = x as f64 + 0.5 - s.u;
                let power = -0.5 * (s.a * dx * dx + s.c * dy * dy) - s.b * dx * dy;
                if power > 0.0 {
                    continue;
                }
                let a = (s.opacity * power.exp()).min(0.99);
                if a < MIN_ALPHA {
                    continue;
                }
                let w = a * t;
                for (c, v) in colour[p].iter_mut().zip(s.rgb) {
                    *c += w * v;
                }
                weighted_depth[p] += w * s.depth;
                transmittance[p] = t * (1.0 - a);
            }
        }
    }
    for p in 0..width * band_rows {
        let acc = 1.0 - transmittance[p];
        alpha[p] = acc as f32;
        depth[p] = if acc > 0.0 {
            (weighted_depth[p] / acc) as f32
        } else {
            0.0
        };
        for k in 0..3 {
            rgb[3 * p + k] = colour[p][k] as f32;
        }
    }
}

/// Every Gaussian in front of the camera and on the image, projected.
fn project(g: &Gaussians, pose: &Pose, width: usize, height: usize, threads: usize) -> Vec<Splat> {
    let e = &pose.extrinsics;
    let rot: [[f64; 3]; 3] = std::array::from_fn(|i| std::array::from_fn(|j| e[i][j] as f64));
    let t: [f64; 3] = std::array::from_fn(|i| e[i][3] as f64);
    // The camera centre, -R^T t, for the viewing directions of the colours.
    let centre: [f64; 3] = std::array::from_fn(|i| -(0..3).map(|j| rot[j][i] * t[j]).sum::<f64>());
    let k = &pose.intrinsics;
    let (fx, fy, cx, cy) = (
        k[0][0] as f64,
        k[1][1] as f64,
        k[0][2] as f64,
        k[1][2] as f64,
    );
    // gsplat's clamp of the projection's Jacobian to 1.3 x the half field of view.
    let (lim_x, lim_y) = (
        1.3 * 0.5 * width as f64 / fx,
        1.3 * 0.5 * height as f64 / fy,
    );
    let chunk = g.len().div_ceil(threads.max(1)).max(1);
    let indices: Vec<usize> = (0..g.len()).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = indices
            .chunks(chunk)
            .map(|ids| {
                scope.spawn(move || {
                    ids.iter()
                        .filter_map(|&i| {
                            let m = g.means[i].map(|v| v as f64);
                            let pc: [f64; 3] = std::array::from_fn(|r| {
                                (0..3).map(|c| rot[r][c] * m[c]).sum::<f64>() + t[r]
                            });
                            let z = pc[2];
                            if z < NEAR {
                                return None;
                            }
                            let sigma = super::covariance(g.rotations[i], g.scales[i]);
                            let tx = (pc[0] / z).clamp(-lim_x, lim_x) * z;
                            let ty = (pc[1] / z).clamp(-lim_y, lim_y) * z;
                            let j = [
                                [fx / z, 0.0, -fx * tx / (z * z)],
                                [0.0, fy / z, -fy * ty / (z * z)],
                            ];
                            // T = J W; the 2D covariance T Sigma T^T, dilated.
                            let tw: [[f64; 3]; 2] = std::array::from_fn(|r| {
                                std::array::from_fn(|c| (0..3).map(|q| j[r][q] * rot[q][c]).sum())
                            });
                            let ts: [[f64; 3]; 2] = std::array::from_fn(|r| {
                                std::array::from_fn(|c| {
                                    (0..3).map(|q| tw[r][q] * sigma[q][c]).sum()
                                })
                            });
                            let cov = |r: usize, c: usize| -> f64 {
                                (0..3).map(|q| ts[r][q] * tw[c][q]).sum()
                            };
                            let (s00, s01, s11) = (cov(0, 0) + 0.3, cov(0, 1), cov(1, 1) + 0.3);
                            let det = s00 * s11 - s01 * s01;
                            if det <= 0.0 {
                                return None;
                            }
                            let mid = 0.5 * (s00 + s11);
                            let lambda = mid + (mid * mid - det).max(0.1).sqrt();
                            let radius = (3.0 * lambda.sqrt()).ceil();
                            let u = fx * pc[0] / z + cx;
                            let v = fy * pc[1] / z + cy;
                            let (w, h) = (width as f64, height as f64);
                            if u + radius < 0.0
                                || u - radius >= w
                                || v + radius < 0.0
                                || v - radius >= h
                            {
                                return None;
                            }
                            let clamp = |x: f64, n: f64| x.clamp(0.0, n - 1.0) as usize;
                            let dir: [f64; 3] = {
                                let d: [f64; 3] = std::array::from_fn(|q| m[q] - centre[q]);
                                let n = d.iter().map(|v| v * v).sum::<f64>().sqrt().max(1e-12);
                                d.map(|v| v / n)
                            };
                            Some(Splat {
                                u,
                                v,
                                a: s11 / det,
                                b: -s01 / det,
                                c: s00 / det,
                                x0: clamp((u - radius).floor(), w),
                                x1: clamp((u + radius).ceil(), w),
                                y0: clamp((v - radius).floor(), h),
                                y1: clamp((v + radius).ceil(), h),
                                depth: z,
                                opacity: g.opacities[i] as f64,
                                rgb: sh_colour(g.harmonics_of(i), g.sh_coefficients, dir),
                            })
                        })
                        .collect::<Vec<Splat>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("projection does not panic"))
            .collect()
    })
}

/// 3DGS's `eval_sh` (degree up to 2) at unit direction `d`, plus 0.5, clamped at 0.
fn sh_colour(sh: &[f32], d_sh: usize, d: [f64; 3]) -> [f64; 3] {
    const C0: f64 = 0.282_094_791_773_878_14;
    const C1: f64 = 0.488_602_511_902_919_9;
    const C2: [f64; 5] = [
        1.092_548_430_592_079_2,
        -1.092_548_430_592_079_2,
        0.315_391_565_252_520_05,
        -1.092_548_430_592_079_2,
        0.546_274_215_296_039_6,
    ];
    let [x, y, z] = d;
    // The basis up to degree 2 (no allocation: this runs for every Gaussian of every frame).
    let basis = [
        C0,
        -C1 * y,
        C1 * z,
        -C1 * x,
        C2[0] * x * y,
        C2[1] * y * z,
        C2[2] * (2.0 * z * z - x * x - y * y),
        C2[3] * x * z,
        C2[4] * (x * x - y * y),
    ];
    std::array::from_fn(|c| {
        let coeffs = &sh[c * d_sh..(c + 1) * d_sh];
        let v: f64 = basis.iter().zip(coeffs).map(|(b, &k)| b * k as f64).sum();
        (v + 0.5).max(0.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_gaussian(mean: [f32; 3], scale: f32, dc: [f32; 3], opacity: f32) -> Gaussians {
        let mut harmonics = vec![0.0; 27];
        for (c, v) in dc.iter().enumerate() {
            harmonics[c * 9] = *v;
        }
        Gaussians {
            views: 1,
            width: 1,
            height: 1,
            means: vec![mean],
            scales: vec![[scale; 3]],
            rotations: vec![[1.0, 0.0, 0.0, 0.0]],
            harmonics,
            sh_coefficients: 9,
            opacities: vec![opacity],
        }
    }

    fn camera(f: f32, w: usize, h: usize) -> Pose {
        Pose {
            intrinsics: [
                [f, 0.0, w as f32 / 2.0],
                [0.0, f, h as f32 / 2.0],
                [0.0, 0.0, 1.0],
            ],
            extrinsics: [
                [1.0, 0.0, 0.0, 0.0],
                [0.0, 1.0, 0.0, 0.0],
                [0.0, 0.0, 1.0, 0.0],
            ],
        }
    }

    /// An isotropic Gaussian on the optical axis draws a round blob at the image centre whose
    /// peak opacity is the Gaussian's and whose width is its projected scale (plus the 0.3 px^2
    /// dilation); its colour is the DC term times C0 plus 0.5; its depth is its distance.
    #[test]
    fn a_gaussian_projects_where_and_as_wide_as_expected() {
        let (w, h) = (64, 48);
        // sigma = 0.1 at depth 2 with f = 40: 2 px.
        let g = one_gaussian([0.0, 0.0, 2.0], 0.1, [1.0, 0.0, -1.0], 0.8);
        let r = render(&g, &camera(40.0, w, h), w, h, 2);
        let at = |x: usize, y: usize| r.alpha[y * w + x];
        // The centre lies between pixels 31 and 32 (and 23 and 24): symmetric.
        let peak = at(31, 23);
        assert!((at(32, 24) - peak).abs() < 1e-6);
        let sigma2: f64 = 4.0 + 0.3;
        let expected = 0.8 * (-0.5 * (0.25 + 0.25) / sigma2).exp();
        assert!(
            (peak as f64 - expected).abs() < 1e-6,
            "{peak} vs {expected}"
        );
        let two_off = 0.8 * (-0.5 * (2.5f64.powi(2) + 0.25) / sigma2).exp();
        assert!((at(34, 23) as f64 - two_off).abs() < 1e-6);
        assert_eq!(at(0, 0), 0.0);
        let p = 23 * w + 31;
        let c0 = 0.282_094_791_773_878_14;
        let expected_rgb = [c0 + 0.5, 0.5, (0.5f64 - c0).max(0.0)];
        for (k, e) in expected_rgb.iter().enumerate() {
            assert!((r.rgb[3 * p + k] as f64 - peak as f64 * e).abs() < 1e-6);
        }
        assert!((r.depth[p] - 2.0).abs() < 1e-6);
        // Behind the camera: nothing.
        let behind = one_gaussian([0.0, 0.0, -2.0], 0.1, [1.0, 0.0, 0.0], 0.8);
        assert!(render(&behind, &camera(40.0, w, h), w, h, 1)
            .alpha
            .iter()
            .all(|&a| a == 0.0));
    }

    /// The nearer of two overlapping Gaussians covers the farther, whatever their order, and
    /// the bands of rows give the same image on any number of threads.
    #[test]
    fn nearer_gaussians_cover_farther_ones() {
        let (w, h) = (32, 32);
        let near = one_gaussian([0.0, 0.0, 1.0], 0.2, [2.0, -2.0, -2.0], 0.99);
        let far = one_gaussian([0.0, 0.0, 3.0], 0.6, [0.0, 0.0, 2.0], 0.99);
        let mut both = near.clone();
        both.means.extend(&far.means);
        both.scales.extend(&far.scales);
        both.rotations.extend(&far.rotations);
        both.harmonics.extend(&far.harmonics);
        both.opacities.extend(&far.opacities);
        let r1 = render(&both, &camera(20.0, w, h), w, h, 1);
        let r3 = render(&both, &camera(20.0, w, h), w, h, 3);
        assert_eq!(r1, r3);
        let p = 15 * w + 15;
        assert!(
            r1.rgb[3 * p] > 0.9 && r1.rgb[3 * p + 2] < 0.05,
            "{:?}",
            &r1.rgb[3 * p..3 * p + 3]
        );
        assert!(r1.depth[p] < 1.05);
    }

    /// Gaussians placed on the rays through pixel centres (every fourth pixel, half a pixel
    /// wide) render at exactly those pixels, at full opacity and in their colours: the
    /// renderer samples pixel centres as the adapter places them.
    #[test]
    fn gaussians_on_pixel_rays_land_on_those_pixels() {
        let (w, h) = (24, 16);
        let f = 20.0f32;
        let cam = camera(f, w, h);
        let c0 = 0.282_094_8_f32;
        let colour = |x: usize, y: usize| [x as f32 / w as f32, y as f32 / h as f32, 0.25];
        let mut g = Gaussians {
            views: 1,
            width: w,
            height: h,
            sh_coefficients: 1,
            ..Gaussians::default()
        };
        let depth = 3.0f32;
        let on = |x: usize, y: usize| x % 4 == 1 && y % 4 == 1;
        for y in 0..h {
            for x in (0..w).filter(|&x| on(x, y)) {
                let (u, v) = (
                    x as f32 + 0.5 - w as f32 / 2.0,
                    y as f32 + 0.5 - h as f32 / 2.0,
                );
                g.means.push([u / f * depth, v / f * depth, depth]);
                g.scales.push([0.5 * depth / f; 3]);
                g.rotations.push([1.0, 0.0, 0.0, 0.0]);
                g.harmonics.extend(colour(x, y).map(|c| (c - 0.5) / c0));
                g.opacities.push(0.99);
            }
        }
        let r = render(&g, &cam, w, h, 2);
        for y in 0..h {
            for x in (0..w).filter(|&x| on(x, y)) {
                let p = y * w + x;
                // Its neighbours 4 pixels away add exp(-0.5 x 16 / 0.55) of theirs: nothing.
                assert!((r.alpha[p] - 0.99).abs() < 1e-5, "{}", r.alpha[p]);
                assert!((r.depth[p] - depth).abs() < 1e-4);
                for (k, c) in colour(x, y).iter().enumerate() {
                    assert!((r.rgb[3 * p + k] / 0.99 - c).abs() < 1e-4);
                }
                // Half a pixel off the centre on each side: symmetric.
                assert!((r.alpha[p - 1] - r.alpha[p + 1]).abs() < 1e-5);
            }
        }
    }
}
