#![allow(dead_code)] // Each test binary uses a part of the scene.
//! A synthetic scene for the stream tests, and a predictor that "predicts" it exactly: a box
//! room with a sphere in it, ray-cast from cameras on a circle looking along it. Each window
//! comes back in its own frame (its first camera's) and scale, as a model's windows do; a
//! bend (a rotation growing across the window's views) makes consecutive windows disagree on
//! their shared frames, so that alignment drifts as it does with a real model.

use da3::geometry::sim3::Sim3;
use da3::{DepthUnit, Image, Output, Pose, Prediction, Predictor, RefViewStrategy, Request};

pub const WIDTH: usize = 64;
pub const HEIGHT: usize = 48;
pub const FOCAL: f64 = 48.0;
/// Frames per turn of the circle.
pub const FRAMES_PER_TURN: usize = 72;
const RADIUS: f64 = 1.5;
const ROOM: [f64; 3] = [6.0, 3.0, 6.0];
const SPHERE_CENTRE: [f64; 3] = [0.0, 0.5, 0.0];
const SPHERE_RADIUS: f64 = 0.8;

pub fn intrinsics() -> [[f64; 3]; 3] {
    [
        [FOCAL, 0.0, WIDTH as f64 / 2.0],
        [0.0, FOCAL, HEIGHT as f64 / 2.0],
        [0.0, 0.0, 1.0],
    ]
}

fn rot_y(angle: f64) -> [[f64; 3]; 3] {
    let (s, c) = angle.sin_cos();
    [[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]]
}

/// The true camera-to-world of frame `f` (OpenCV axes: x right, y down, z forward).
pub fn camera(f: usize) -> Sim3 {
    let angle = f as f64 * std::f64::consts::TAU / FRAMES_PER_TURN as f64;
    let centre = [
        RADIUS * angle.cos(),
        0.2 * (angle * 3.0).sin(),
        RADIUS * angle.sin(),
    ];
    // Looking along the circle's tangent, outward a little, so that walls fill the view.
    let heading = angle + std::f64::consts::FRAC_PI_2 + 0.35;
    let forward = [heading.cos(), 0.0, heading.sin()];
    let down = [0.0, 1.0, 0.0];
    let right = [
        down[1] * forward[2] - down[2] * forward[1],
        down[2] * forward[0] - down[0] * forward[2],
        down[0] * forward[1] - down[1] * forward[0],
    ];
    let rotation = [0, 1, 2].map(|i| [right[i], down[i], forward[i]]);
    Sim3::from_rigid(rotation, centre)
}

/// Depth (z) and colour of the ray through pixel `(x, y)` of a camera.
fn cast(camera: &Sim3, x: usize, y: usize) -> (f64, [u8; 3]) {
    let k = intrinsics();
    let dir_cam = [
        (x as f64 - k[0][2]) / k[0][0],
        (y as f64 - k[1][2]) / k[1][1],
        1.0,
    ];
    let r = camera.rotation;
    let dir = [0, 1, 2].map(|i| (0..3).map(|j| r[i][j] * dir_cam[j]).sum::<f64>());
    let o = camera.translation;
    // Sphere first (it is inside the room).
    let oc = [0, 1, 2].map(|i| o[i] - SPHERE_CENTRE[i]);
    let a: f64 = dir.iter().map(|v| v * v).sum();
    let b: f64 = 2.0 * (0..3).map(|i| oc[i] * dir[i]).sum::<f64>();
    let c: f64 = oc.iter().map(|v| v * v).sum::<f64>() - SPHERE_RADIUS * SPHERE_RADIUS;
    let disc = b * b - 4.0 * a * c;
    let mut t_hit = f64::INFINITY;
    let mut colour = [0u8; 3];
    if disc > 0.0 {
        let t = (-b - disc.sqrt()) / (2.0 * a);
        if t > 1e-6 {
            t_hit = t;
            let p = [0, 1, 2].map(|i| o[i] + t * dir[i]);
            colour = [200, (120.0 + 100.0 * p[1].sin()) as u8, 60];
        }
    }
    // The room's walls: the nearest exit of the box.
    for axis in 0..3 {
        if dir[axis].abs() < 1e-12 {
            continue;
        }
        let wall = ROOM[axis] * dir[axis].signum();
        let t = (wall - o[axis]) / dir[axis];
        if t > 1e-6 && t < t_hit {
            let p = [0, 1, 2].map(|i| o[i] + t * dir[i]);
            let inside = (0..3).all(|i| i == axis || p[i].abs() <= ROOM[i] + 1e-9);
            if inside {
                t_hit = t;
                // Smooth, direction-dependent colours with broad stripes: distinct places look
                // distinct at 32 x 24, and nearby views look alike.
                let u = p[(axis + 1) % 3];
                let v = p[(axis + 2) % 3];
                let stripe = if ((u * 0.8).floor() as i64 + (v * 0.8).floor() as i64) % 2 == 0 {
                    40.0
                } else {
                    0.0
                };
                colour = [
                    (80.0 + 60.0 * (u * 0.5 + axis as f64).sin() + stripe) as u8,
                    (80.0 + 60.0 * (v * 0.7 + wall).cos() + stripe) as u8,
                    (90.0 + 50.0 * (axis as f64 * 2.0 + wall * 0.3).sin()) as u8,
                ];
            }
        }
    }
    // The ray's direction has z = 1 in the camera frame: its parameter is the depth.
    (t_hit, colour)
}

/// The image of frame `f`.
pub fn image(f: usize) -> Image {
    let c = camera(f);
    let mut data = Vec::with_capacity(WIDTH * HEIGHT * 3);
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            data.extend_from_slice(&cast(&c, x, y).1);
        }
    }
    Image::new(WIDTH, HEIGHT, data).unwrap()
}

fn depth_map(camera: &Sim3) -> Vec<f32> {
    let mut depth = Vec::with_capacity(WIDTH * HEIGHT);
    for y in 0..HEIGHT {
        for x in 0..WIDTH {
            depth.push(cast(camera, x, y).0 as f32);
        }
    }
    depth
}

/// A predictor that returns the true scene of each request's frames (named `frameN`), in the
/// frame of the request's first view scaled by a per-request factor, with an optional bend
/// and depth noise.
pub struct ScenePredictor {
    /// Rotation (radians, about the vertical) added per view index within a request.
    pub bend: f64,
    /// Relative depth noise (deterministic, pseudo-random per pixel and request).
    pub depth_noise: f64,
    /// Requests seen.
    pub requests: usize,
    /// The largest request (views).
    pub largest: usize,
    /// As the nested pair does: every request in metres (the true scale, depth unit metres,
    /// the per-request factor reported as the metric scale it took out).
    pub metric: bool,
}

impl ScenePredictor {
    pub fn exact() -> ScenePredictor {
        ScenePredictor {
            bend: 0.0,
            depth_noise: 0.0,
            requests: 0,
            largest: 0,
            metric: false,
        }
    }

    /// The frame a request of `views` views starting at `first_frame` comes back in: its
    /// first camera's, scaled by a factor from 0.5 to 2 that depends on the request.
    pub fn world_to_window(first_frame: usize, views: usize) -> Sim3 {
        let scale = request_scale(first_frame, views);
        let w = camera(first_frame).inverse();
        Sim3::new(scale, w.rotation, w.translation.map(|t| t * scale))
    }
}

/// Distance of a point from the scene's surfaces (the room's walls, the sphere).
pub fn distance_to_surface(p: [f64; 3]) -> f64 {
    let to_sphere = ((0..3)
        .map(|i| (p[i] - SPHERE_CENTRE[i]).powi(2))
        .sum::<f64>()
        .sqrt()
        - SPHERE_RADIUS)
        .abs();
    let inside = (0..3).all(|i| p[i].abs() <= ROOM[i]);
    let to_walls = if inside {
        (0..3)
            .map(|i| ROOM[i] - p[i].abs())
            .fold(f64::INFINITY, f64::min)
    } else {
        (0..3)
            .map(|i| (p[i].abs() - ROOM[i]).max(0.0).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    to_sphere.min(to_walls)
}

fn frame_of(name: &str) -> usize {
    name.strip_prefix("frame")
        .and_then(|n| n.parse().ok())
        .expect("frames are named frameN")
}

/// A deterministic scale per request, from 0.5 to 2.
fn request_scale(first_frame: usize, views: usize) -> f64 {
    let h = (first_frame * 2654435761 + views * 40503) % 1000;
    0.5 + 1.5 * h as f64 / 1000.0
}

fn noise(seed: u64) -> f64 {
    let mut x = seed.wrapping_mul(0x9E3779B97F4A7C15) ^ 0xD1B54A32D192ED03;
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58476D1CE4E5B9);
    x ^= x >> 29;
    (x % 2_000_001) as f64 / 1_000_000.0 - 1.0
}

impl Predictor for ScenePredictor {
    fn run(&mut self, request: &Request<'_>) -> Result<Output, da3::Error> {
        let views = request.images().len();
        self.requests += 1;
        self.largest = self.largest.max(views);
        let frames: Vec<usize> = (0..views).map(|v| frame_of(&request.name(v))).collect();
        let mut world_to_window = ScenePredictor::world_to_window(frames[0], views);
        let relative_scale = world_to_window.scale;
        if self.metric {
            world_to_window = camera(frames[0]).inverse();
        }
        let scale = world_to_window.scale;
        let mut out = Vec::with_capacity(views);
        for (v, &f) in frames.iter().enumerate() {
            let truth = camera(f);
            let mut depth = depth_map(&truth);
            for (i, d) in depth.iter_mut().enumerate() {
                let n = noise((f * 1_000_003 + i) as u64 ^ (self.requests as u64) << 40);
                *d = (f64::from(*d) * scale * (1.0 + self.depth_noise * n)) as f32;
            }
            let bent = Sim3::from_rigid(rot_y(self.bend * v as f64), [0.0; 3]);
            let in_window = bent.compose(&world_to_window).compose(&truth);
            // Rigid camera-to-window: the scale is in the translation (and the depth).
            let c2w = Sim3::from_rigid(in_window.rotation, in_window.translation);
            let w2c = c2w.inverse().to_matrix();
            out.push(Prediction {
                width: WIDTH,
                height: HEIGHT,
                depth,
                confidence: Some(vec![2.0; WIDTH * HEIGHT]),
                pose: Some(Pose {
                    intrinsics: intrinsics().map(|r| r.map(|x| x as f32)),
                    extrinsics: [0, 1, 2].map(|i| w2c[i].map(|x| x as f32)),
                }),
                image: request.images()[v].clone(),
                input_size: (WIDTH, HEIGHT),
                name: request.name(v),
                depth_unit: if self.metric {
                    DepthUnit::Metres
                } else {
                    DepthUnit::Relative
                },
                ..Prediction::default()
            });
        }
        Ok(Output {
            views: out,
            reference: 0,
            strategy: RefViewStrategy::First,
            pose_scale: None,
            metric_scale: self.metric.then_some(1.0 / relative_scale),
            timings: Default::default(),
            gaussians: None,
        })
    }

    fn device_name(&self) -> String {
        "scene".into()
    }
}
