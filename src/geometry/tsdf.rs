//! Fusion of depth maps into a truncated signed distance field (TSDF) over sparse voxel
//! blocks, and its surface as a mesh.
//!
//! The volume is a lattice of voxels of side `voxel_size`: voxel `i` (three integers) sits at
//! the world point `i * voxel_size`. Voxels are stored in blocks of 8 x 8 x 8, allocated where
//! depth maps put a surface, up to a budget of blocks. Each voxel holds the weighted mean of
//! the truncated signed distances measured for it, `tsdf` in `[-1, 1]` (units of the
//! truncation distance; positive in front of the surface, in the observed free space), the
//! sum of the weights, and a weighted mean colour.
//!
//! # Integrating a frame
//!
//! Every pixel with a depth (and a positive weight) is lifted to its world point, and the
//! blocks within the truncation distance of that point are allocated. Every voxel of those
//! blocks is then projected into the frame (integer pixel coordinates at pixel centres, as in
//! the rest of da3) and measured against the depth there, interpolated between the four
//! pixels around the projection when they lie on one surface:
//!
//! - its signed distance is `s (d - z) c |r|`: `d - z` the depth difference along the
//!   camera's axis, `s` the camera-to-world scale (a window's depth is in its own units; the
//!   world's are `s` times them), `c` the cosine of the angle between the pixel's ray and the
//!   surface normal (estimated from the neighbouring pixels, at least 0.3) and `|r|` the length
//!   of the ray at unit depth. That is the distance to the surface's tangent plane rather
//!   than along the ray, so that a surface seen obliquely gets a band of measured voxels
//!   behind it as deep as one seen face-on (else a ground seen from a walking camera would be
//!   full of holes), and views at different angles average distances of the same slope;
//! - the weight is the pixel's times `c²` (oblique measurements are the least precise);
//! - behind the surface, the weight falls from full at one voxel to 0 at the truncation
//!   distance, beyond which voxels are left alone (they may be hidden, or outside the object);
//!   behind a pixel on an occluding contour (a neighbour unmeasured or further away) only the
//!   first voxel is measured: beyond an object's edge lies free space as much as object;
//! - in front of the surface by more than the truncation distance (free space the ray
//!   crossed), a voxel gets `+1` with a tenth of the weight: enough to decide voxels that no
//!   surface measurement reached and to carve away what measurements behind edges wrongly
//!   filled, not enough to pull a surface that another view measured and this ray passed by;
//! - the colour is taken only from pixels whose surface is within the truncation distance.
//!
//! Blocks already allocated are updated in parallel (each independently: the result does not
//! depend on the threads).
//!
//! # Memory
//!
//! Memory is bounded by the block budget: a block is 512 voxels of 12 bytes, and a block that
//! a frame would need beyond the budget is not allocated (its measurements are dropped and
//! counted). [`TsdfOptions::memory_bound_bytes`] gives the bound. While a frame is integrated,
//! 16 bytes per pixel and the set of blocks it touches come on top.

use super::mesh::{CornerSample, Mesh, SurfaceBuilder};
use super::sim3::Sim3;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Voxels along each edge of a block.
pub const BLOCK_SIDE: usize = 8;
const BLOCK_VOXELS: usize = BLOCK_SIDE * BLOCK_SIDE * BLOCK_SIDE;

/// The block budget of [`TsdfOptions::new`]: 32,768 blocks, 16.8 million voxels, about 203 MB
/// ([`TsdfOptions::memory_bound_bytes`]).
pub const DEFAULT_MAX_BLOCKS: usize = 1 << 15;

/// The largest block budget accepted: 2^21 blocks (about 13 GB). It keeps a mesh's vertex
/// indices within `u32` (at most three vertices per voxel).
pub const MAX_BLOCKS_LIMIT: usize = 1 << 21;

/// The truncation distance of [`TsdfOptions::new`], in voxels.
const TRUNCATION_VOXELS: f64 = 4.0;

/// [`TsdfOptions::for_scene`]'s voxels per typical depth.
const VOXELS_PER_TYPICAL_DEPTH: f64 = 128.0;

/// Block coordinates beyond this magnitude are not allocated (a world point a billion blocks
/// away is a broken measurement); it keeps voxel indices far from overflowing.
const MAX_BLOCK_COORDINATE: f64 = (1u64 << 30) as f64;

/// Frames are narrower and lower than this many pixels (and have at most 2^32 pixels).
const MAX_SIDE: usize = 1 << 24;

/// How far a rotation may be from orthonormal (largest entry of `R Rᵀ - I`).
const ROTATION_TOLERANCE: f64 = 1e-4;

/// How a [`TsdfVolume`] samples space.
#[derive(Debug, Clone)]
pub struct TsdfOptions {
    /// The side of a voxel, in world units; positive and finite.
    pub voxel_size: f64,
    /// The truncation distance in world units, at least one voxel: signed distances are
    /// clamped to it in front of the surface, and voxels further behind are not updated.
    /// Thin structures closer than it to another surface merge into it.
    pub truncation: f64,
    /// The most blocks (8 x 8 x 8 voxels) the volume allocates; from 1 to [`MAX_BLOCKS_LIMIT`].
    pub max_blocks: usize,
}

impl TsdfOptions {
    /// Voxels of `voxel_size`, a truncation of 4 voxels and [`DEFAULT_MAX_BLOCKS`] blocks
    /// (about 203 MB at most, whatever the voxel size).
    pub fn new(voxel_size: f64) -> TsdfOptions {
        TsdfOptions {
            voxel_size,
            truncation: TRUNCATION_VOXELS * voxel_size,
            max_blocks: DEFAULT_MAX_BLOCKS,
        }
    }

    /// Voxels sized from the scene's scale: `typical_depth / 128` (a 60-degree view 500 pixels
    /// wide then has about 3.4 pixels per voxel at that depth, so voxels are not sampled more
    /// finely than the depth maps resolve them), a truncation of 4 voxels, and `max_blocks`
    /// blocks. `typical_depth` is a depth in world units, e.g. the median depth of the first
    /// window; a non-positive or non-finite one is refused by [`TsdfVolume::new`].
    pub fn for_scene(typical_depth: f64, max_blocks: usize) -> TsdfOptions {
        TsdfOptions {
            max_blocks,
            ..TsdfOptions::new(typical_depth / VOXELS_PER_TYPICAL_DEPTH)
        }
    }

    /// The most bytes a volume with these options holds: `max_blocks` blocks of 6,144 bytes
    /// of voxels plus an 8-byte pointer each, and the block index (at most
    /// `2.3 max_blocks` hash slots of 17 bytes). The memory that one [`TsdfVolume::integrate`]
    /// uses while it runs (the set of blocks the frame touches) and a mesh extraction's output
    /// come on top.
    pub fn memory_bound_bytes(&self) -> usize {
        let slots = hash_slots(self.max_blocks);
        std::mem::size_of::<TsdfVolume>()
            + self.max_blocks * (BLOCK_BYTES + std::mem::size_of::<Block>())
            + slots * INDEX_SLOT_BYTES
    }

    fn validate(&self) -> Result<(), FusionError> {
        let voxel = self.voxel_size;
        if !(voxel.is_finite() && voxel > 0.0) {
            return Err(FusionError::Options(format!(
                "the voxel size must be positive and finite, not {voxel}"
            )));
        }
        if !(self.truncation.is_finite() && self.truncation >= voxel) {
            return Err(FusionError::Options(format!(
                "the truncation distance must be finite and at least one voxel ({voxel}), \
                 not {}",
                self.truncation
            )));
        }
        if !(1..=MAX_BLOCKS_LIMIT).contains(&self.max_blocks) {
            return Err(FusionError::Options(format!(
                "the block budget must be from 1 to {MAX_BLOCKS_LIMIT}, not {}",
                self.max_blocks
            )));
        }
        Ok(())
    }
}

/// One depth map to integrate, with its camera.
#[derive(Debug, Clone)]
pub struct DepthFrame<'a> {
    /// Columns of the depth map.
    pub width: usize,
    /// Rows of the depth map.
    pub height: usize,
    /// Depth (z in the camera frame, in the camera's units), row-major, `width * height`;
    /// zero, negative or non-finite: no measurement.
    pub depth: &'a [f32],
    /// Per-pixel confidence, `width * height`, the weight of the pixel's measurements; a
    /// pixel whose weight is not positive and finite is skipped. `None`: every pixel weighs 1.
    pub weights: Option<&'a [f32]>,
    /// RGB per pixel, `width * height`. `None`: the frame leaves colours as they are
    /// (mid-grey where no coloured frame has been).
    pub colors: Option<&'a [[u8; 3]]>,
    /// Pinhole intrinsics in pixels of this depth map: `[[fx, skew, cx], [0, fy, cy],
    /// [0, 0, 1]]`, pixel `(u, v)` (integers at pixel centres) seeing camera point
    /// `(x, y, z)` at `u = (fx x + skew y) / z + cx`, `v = fy y / z + cy`.
    pub intrinsics: [[f64; 3]; 3],
    /// Camera to world: `world = s R x_cam + t` (each window of a stream has its own scale).
    pub camera_to_world: Sim3,
}

/// Why a volume could not be made or a frame could not be integrated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FusionError {
    /// Options that cannot sample space (non-positive or non-finite voxel size, truncation
    /// under a voxel, a block budget of 0 or over [`MAX_BLOCKS_LIMIT`]).
    #[error("TSDF options: {0}")]
    Options(String),
    /// A frame of no pixels, or more than memory can index.
    #[error("depth frame: a size of {width} x {height} pixels cannot be integrated")]
    Size {
        /// Columns given.
        width: usize,
        /// Rows given.
        height: usize,
    },
    /// A per-pixel array whose length is not `width * height`.
    #[error("depth frame: {what} has {actual} values, {expected} expected")]
    Length {
        /// Which array: `depth`, `weights` or `colors`.
        what: &'static str,
        /// `width * height`.
        expected: usize,
        /// Its length.
        actual: usize,
    },
    /// Intrinsics that are not a pinhole camera matrix.
    #[error("depth frame: intrinsics {0}")]
    Intrinsics(String),
    /// A camera-to-world transform that is not a similarity.
    #[error("depth frame: camera-to-world transform {0}")]
    Pose(String),
}

/// What one [`TsdfVolume::integrate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IntegrationStats {
    /// Pixels with a depth and a positive weight.
    pub pixels_used: usize,
    /// Blocks this frame allocated.
    pub blocks_allocated: usize,
    /// Blocks this frame had measurements for but could not allocate (the budget was spent);
    /// those measurements are lost.
    pub blocks_dropped: usize,
}

/// One voxel: the weighted mean truncated distance, the sum of weights, the mean colour
/// (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Voxel {
    tsdf: f32,
    weight: f32,
    color: [u8; 3],
    /// Whether a colour was measured (the first one is taken whole).
    colored: bool,
}

impl Voxel {
    const UNSEEN: Voxel = Voxel {
        tsdf: 1.0,
        weight: 0.0,
        color: [128; 3],
        colored: false,
    };
}

type Block = Box<[Voxel; BLOCK_VOXELS]>;
const BLOCK_BYTES: usize = BLOCK_VOXELS * std::mem::size_of::<Voxel>();
/// A slot of the block index: key, block number and the table's control byte.
const INDEX_SLOT_BYTES: usize = std::mem::size_of::<([i32; 3], u32)>() + 1;

/// The slots of a standard hash table holding `capacity` entries (a power of two, 7/8 usable).
fn hash_slots(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        1..=3 => 4,
        4..=7 => 8,
        _ => (capacity * 8).div_ceil(7).next_power_of_two(),
    }
}

fn empty_block() -> Block {
    Box::new([Voxel::UNSEEN; BLOCK_VOXELS])
}

/// A frame's camera, checked, as the integration uses it.
struct Camera {
    width: usize,
    height: usize,
    scale: f64,
    /// `(s R)⁻¹ = Rᵀ / s`, row-major, and `-Rᵀ t / s`: world to camera.
    world_to_camera: [[f64; 3]; 3],
    world_to_camera_offset: [f64; 3],
    camera_to_world: Sim3,
    fx: f64,
    skew: f64,
    cx: f64,
    fy: f64,
    cy: f64,
}

impl Camera {
    fn new(frame: &DepthFrame) -> Result<Camera, FusionError> {
        let (width, height) = (frame.width, frame.height);
        let pixels = width
            .checked_mul(height)
            .filter(|&n| n > 0 && n <= u32::MAX as usize)
            .filter(|_| width < MAX_SIDE && height < MAX_SIDE)
            .ok_or(FusionError::Size { width, height })?;
        let check_length = |what, actual| {
            if actual == pixels {
                Ok(())
            } else {
                Err(FusionError::Length {
                    what,
                    expected: pixels,
                    actual,
                })
            }
        };
        check_length("depth", frame.depth.len())?;
        if let Some(weights) = frame.weights {
            check_length("weights", weights.len())?;
        }
        if let Some(colors) = frame.colors {
            check_length("colors", colors.len())?;
        }

        let k = &frame.intrinsics;
        if !k.iter().flatten().all(|v| v.is_finite()) {
            return Err(FusionError::Intrinsics(format!("{k:?} are not finite")));
        }
        if k[1][0] != 0.0 || k[2] != [0.0, 0.0, 1.0] {
            return Err(FusionError::Intrinsics(format!(
                "{k:?} are not upper triangular with a last row (0, 0, 1)"
            )));
        }
        if !(k[0][0] > 0.0 && k[1][1] > 0.0) {
            return Err(FusionError::Intrinsics(format!(
                "{k:?} need positive focal lengths"
            )));
        }

        let pose = frame.camera_to_world;
        let scale = pose.scale;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(FusionError::Pose(format!(
                "has scale {scale}, not positive and finite"
            )));
        }
        let r = &pose.rotation;
        if !(r.iter().flatten().chain(&pose.translation)).all(|v| v.is_finite()) {
            return Err(FusionError::Pose(format!("{pose:?} is not finite")));
        }
        let mut off_orthonormal: f64 = 0.0;
        for i in 0..3 {
            for j in 0..3 {
                let product: f64 = (0..3).map(|c| r[i][c] * r[j][c]).sum();
                let identity = if i == j { 1.0 } else { 0.0 };
                off_orthonormal = off_orthonormal.max((product - identity).abs());
            }
        }
        let determinant = r[0][0] * (r[1][1] * r[2][2] - r[1][2] * r[2][1])
            - r[0][1] * (r[1][0] * r[2][2] - r[1][2] * r[2][0])
            + r[0][2] * (r[1][0] * r[2][1] - r[1][1] * r[2][0]);
        if off_orthonormal > ROTATION_TOLERANCE || determinant <= 0.0 {
            return Err(FusionError::Pose(format!(
                "has a rotation {r:?} that is not one (R Rᵀ - I up to {off_orthonormal:e}, \
                 determinant {determinant})"
            )));
        }
        let world_to_camera = [0, 1, 2].map(|i| [0, 1, 2].map(|j| r[j][i] / scale));
        let t = pose.translation;
        let world_to_camera_offset = [0, 1, 2].map(|i| {
            -(world_to_camera[i][0] * t[0]
                + world_to_camera[i][1] * t[1]
                + world_to_camera[i][2] * t[2])
        });
        Ok(Camera {
            width,
            height,
            scale,
            world_to_camera,
            world_to_camera_offset,
            camera_to_world: pose,
            fx: k[0][0],
            skew: k[0][1],
            cx: k[0][2],
            fy: k[1][1],
            cy: k[1][2],
        })
    }

    /// The ray of pixel `(u, v)` in the camera frame, scaled to `z = 1`.
    fn ray(&self, u: usize, v: usize) -> [f64; 3] {
        let y = (v as f64 - self.cy) / self.fy;
        let x = (u as f64 - self.cx - self.skew * y) / self.fx;
        [x, y, 1.0]
    }

    /// The world point seen at pixel `(u, v)` at depth `depth`.
    fn lift(&self, u: usize, v: usize, depth: f64) -> [f64; 3] {
        let p = self.ray(u, v).map(|c| c * depth);
        let (s, r, t) = (
            self.camera_to_world.scale,
            &self.camera_to_world.rotation,
            &self.camera_to_world.translation,
        );
        [0, 1, 2].map(|i| s * (r[i][0] * p[0] + r[i][1] * p[1] + r[i][2] * p[2]) + t[i])
    }

    /// `world_to_camera` applied to `p`.
    fn to_camera(&self, p: [f64; 3]) -> [f64; 3] {
        let m = &self.world_to_camera;
        [0, 1, 2].map(|i| {
            m[i][0] * p[0] + m[i][1] * p[1] + m[i][2] * p[2] + self.world_to_camera_offset[i]
        })
    }

    /// Where camera point `p` projects, in pixels, if it is in front of the camera and its
    /// nearest pixel is inside the image.
    fn project(&self, p: [f64; 3]) -> Option<[f64; 2]> {
        if p[2] <= 0.0 {
            return None;
        }
        let inverse_z = 1.0 / p[2];
        let u = (self.fx * p[0] + self.skew * p[1]) * inverse_z + self.cx;
        let v = self.fy * p[1] * inverse_z + self.cy;
        let (w, h) = (self.width as f64 - 0.5, self.height as f64 - 0.5);
        (u >= -0.5 && v >= -0.5 && u < w && v < h).then_some([u, v])
    }
}

/// Neighbouring depths further apart than this (relative) lie on different surfaces, across a
/// depth edge. (A surface at 86 degrees from the view spreads 10% over a pixel at a focal
/// length of 140 pixels; more at longer focal lengths.)
const DEPTH_EDGE: f32 = 0.1;

/// The least cosine of the viewing angle a measurement counts with: surfaces seen more
/// obliquely than about 72 degrees (or whose normal is unreliable, as at a silhouette) count as
/// seen at 72 degrees.
const MIN_VIEW_COSINE: f64 = 0.3;

/// The weight of free-space evidence relative to a measurement near a surface: what a voxel
/// more than the truncation distance in front of a pixel's surface gets (`+1`, "empty"). It
/// decides voxels that no surface measurement reached and carves away what measurements
/// behind occluding edges wrongly filled, but barely moves a voxel near another surface that
/// the ray passed by (its distance to that surface is not the distance to the pixel's).
const FREE_SPACE_WEIGHT: f32 = 0.1;

/// One pixel of a frame being integrated, as the voxels use it.
#[derive(Debug, Clone, Copy, Default)]
struct Pixel {
    /// `1 / depth`, or 0 for a pixel without a measurement (no depth, or no weight).
    inverse_depth: f32,
    /// The pixel's weight times `c²`, `c` the cosine of the angle between the ray and the
    /// surface normal (at least [`MIN_VIEW_COSINE`]): oblique views weigh less.
    weight: f32,
    /// Turns a depth difference (camera units, along z) into a distance to the surface:
    /// `c |r|`, `r` the pixel's ray scaled to `z = 1`.
    distance_factor: f32,
    /// Whether the pixel is on an occluding contour: a neighbour is unmeasured or on a surface
    /// further away. Behind such a pixel's surface lies as much free space as object.
    contour: bool,
}

/// A frame's pixels, prepared for the voxels to sample.
///
/// The signed distance of a voxel is its depth difference to the pixel's surface taken
/// perpendicular to that surface (as far as the surface is a plane), not along the ray.
/// Measured along the ray, the band of voxels updated behind a surface seen at angle `a` would
/// be only `truncation x cos a` deep: at 65 degrees, with a truncation of 4 voxels, less than
/// the diagonal of a cell, so cells there would lack a measured corner and the mesh would have
/// holes, as it would on any ground seen from a walking camera; and views at different angles
/// would average distances of different slopes. Oblique measurements weigh less (`cos² a`):
/// near silhouettes and sharp edges the plane approximation fails, and they are the least
/// precise.
///
/// The normal comes from the pixel's neighbours lifted to the camera frame; along each image
/// axis the neighbour whose depth is closer is taken, so that a depth edge does not bend it.
/// A pixel without a measured neighbour along both axes counts as facing the camera.
struct PixelTable {
    width: usize,
    height: usize,
    pixels: Vec<Pixel>,
}

impl PixelTable {
    fn new(frame: &DepthFrame, camera: &Camera) -> PixelTable {
        let (width, height) = (frame.width, frame.height);
        // First the measurements alone, which the normals and contours look up around each
        // pixel.
        let mut pixels: Vec<Pixel> = (0..width * height)
            .map(|pixel| {
                let depth = frame.depth[pixel];
                let weight = frame.weights.map_or(1.0, |w| w[pixel]);
                let measured =
                    depth.is_finite() && depth > 0.0 && weight.is_finite() && weight > 0.0;
                Pixel {
                    inverse_depth: if measured { 1.0 / depth } else { 0.0 },
                    weight: if measured { weight } else { 0.0 },
                    ..Pixel::default()
                }
            })
            .collect();
        let depth_at = |pixels: &[Pixel], u: usize, v: usize| {
            let inverse = pixels[v * width + u].inverse_depth;
            (inverse > 0.0).then(|| 1.0 / inverse as f64)
        };
        let lift = |u: usize, v: usize, depth: f64| {
            let r = camera.ray(u, v);
            [r[0] * depth, r[1] * depth, depth]
        };
        for v in 0..height {
            for u in 0..width {
                let Some(depth) = depth_at(&pixels, u, v) else {
                    continue;
                };
                let left_right = [
                    u.checked_sub(1).map(|nu| (nu, v)),
                    (u + 1 < width).then_some((u + 1, v)),
                ];
                let up_down = [
                    v.checked_sub(1).map(|nv| (u, nv)),
                    (v + 1 < height).then_some((u, v + 1)),
                ];
                let mut contour = false;
                // Along an axis, the measured neighbour closest in depth, as a tangent vector
                // (its sign does not matter: only |n . r| is used).
                let mut tangent = |neighbours: [Option<(usize, usize)>; 2]| {
                    let mut closest: Option<(usize, usize, f64)> = None;
                    for (nu, nv) in neighbours.into_iter().flatten() {
                        match depth_at(&pixels, nu, nv) {
                            None => contour = true,
                            Some(d) => {
                                contour |= d > depth * (1.0 + DEPTH_EDGE as f64);
                                if closest.is_none_or(|c| (d - depth).abs() < (c.2 - depth).abs()) {
                                    closest = Some((nu, nv, d));
                                }
                            }
                        }
                    }
                    closest.map(|(nu, nv, d)| {
                        let (p, q) = (lift(nu, nv, d), lift(u, v, depth));
                        [p[0] - q[0], p[1] - q[1], p[2] - q[2]]
                    })
                };
                let tangents = (tangent(left_right), tangent(up_down));
                let ray = camera.ray(u, v);
                let ray_length = (ray[0] * ray[0] + ray[1] * ray[1] + 1.0).sqrt();
                let cosine = match tangents {
                    (Some(a), Some(b)) => {
                        let n = [
                            a[1] * b[2] - a[2] * b[1],
                            a[2] * b[0] - a[0] * b[2],
                            a[0] * b[1] - a[1] * b[0],
                        ];
                        let dot = n[0] * ray[0] + n[1] * ray[1] + n[2] * ray[2];
                        let norms = (n[0] * n[0] + n[1] * n[1] + n[2] * n[2]).sqrt() * ray_length;
                        let cosine = dot.abs() / norms;
                        // Coincident neighbours (a zero normal) tell nothing.
                        if cosine.is_finite() {
                            cosine.max(MIN_VIEW_COSINE)
                        } else {
                            1.0
                        }
                    }
                    _ => 1.0,
                };
                let pixel = &mut pixels[v * width + u];
                pixel.weight *= (cosine * cosine) as f32;
                pixel.distance_factor = (cosine * ray_length) as f32;
                pixel.contour = contour;
            }
        }
        PixelTable {
            width,
            height,
            pixels,
        }
    }

    /// The measurement at image point `(u, v)`, inside the image: the nearest pixel (its index
    /// and everything else) with the depth interpolated bilinearly, in inverse depth (exact for
    /// a plane), from the four pixels around the point when all four are measured and on one
    /// surface. (The nearest pixel's depth alone would be off by up to half a pixel's worth of
    /// depth slope: more than a voxel on an oblique surface, and ripples in the mesh.)
    fn sample(&self, [u, v]: [f64; 2]) -> Option<(usize, f64)> {
        // Image sizes are below 2^24 (checked), so the casts are exact; casts round towards
        // zero, which is down for the non-negative `u + 0.5`, `v + 0.5`.
        let nearest = (v + 0.5) as i32 as usize * self.width + (u + 0.5) as i32 as usize;
        let nearest_inverse = self.pixels[nearest].inverse_depth;
        if nearest_inverse == 0.0 {
            return None;
        }
        let nearest_only = Some((nearest, 1.0 / nearest_inverse as f64));
        if u < 0.0 || v < 0.0 {
            return nearest_only;
        }
        let (u0, v0) = (u as i32 as usize, v as i32 as usize);
        if u0 + 1 >= self.width || v0 + 1 >= self.height {
            return nearest_only;
        }
        let corner = v0 * self.width + u0;
        let inverse = [
            corner,
            corner + 1,
            corner + self.width,
            corner + self.width + 1,
        ]
        .map(|p| self.pixels[p].inverse_depth);
        let (lowest, highest) = inverse
            .iter()
            .fold((f32::INFINITY, 0.0f32), |(lo, hi), &i| {
                (lo.min(i), hi.max(i))
            });
        // A missing neighbour (0), or neighbours on different surfaces.
        if lowest == 0.0 || highest > lowest * (1.0 + DEPTH_EDGE) {
            return nearest_only;
        }
        let inverse = inverse.map(f64::from);
        let (fu, fv) = (u - u0 as f64, v - v0 as f64);
        let top = inverse[0] + (inverse[1] - inverse[0]) * fu;
        let bottom = inverse[2] + (inverse[3] - inverse[2]) * fu;
        Some((nearest, 1.0 / (top + (bottom - top) * fv)))
    }
}

/// A TSDF over sparse blocks of voxels (see the [module documentation](self)), with a budget of
/// blocks.
#[derive(Debug, Clone)]
pub struct TsdfVolume {
    options: TsdfOptions,
    /// The allocated blocks, in allocation order (never more than `max_blocks`).
    blocks: Vec<Block>,
    /// Block coordinates (voxel index divided by 8, rounded down) to position in `blocks`.
    index: HashMap<[i32; 3], u32>,
    dropped: usize,
}

impl TsdfVolume {
    /// An empty volume.
    ///
    /// # Errors
    /// [`FusionError::Options`] when the options cannot sample space.
    pub fn new(options: TsdfOptions) -> Result<TsdfVolume, FusionError> {
        options.validate()?;
        Ok(TsdfVolume {
            options,
            blocks: Vec::new(),
            index: HashMap::new(),
            dropped: 0,
        })
    }

    /// The options the volume was made with.
    pub fn options(&self) -> &TsdfOptions {
        &self.options
    }

    /// Integrates one depth map (see the [module documentation](self)). Pixels without a
    /// measurement are skipped; a frame that measures nothing changes nothing.
    ///
    /// # Errors
    /// [`FusionError::Size`], [`FusionError::Length`], [`FusionError::Intrinsics`] or
    /// [`FusionError::Pose`] for a frame that does not describe a depth map and a camera; the
    /// volume is then unchanged.
    pub fn integrate(&mut self, frame: &DepthFrame) -> Result<IntegrationStats, FusionError> {
        let camera = Camera::new(frame)?;
        let table = PixelTable::new(frame, &camera);
        let (pixels_used, touched) = self.touched_blocks(&table, &camera);
        let mut stats = IntegrationStats {
            pixels_used,
            ..IntegrationStats::default()
        };
        let lattice = Lattice {
            voxel_size: self.options.voxel_size,
            truncation: self.options.truncation,
        };
        let update = |voxels: &mut [Voxel; BLOCK_VOXELS], key| {
            lattice.update_block(voxels, key, &camera, &table, frame.colors)
        };
        // The blocks already allocated, updated in parallel (each is independent of the
        // others, so the result does not depend on the threads); then the new ones, in key
        // order, while the budget lasts.
        let (existing, new): (Vec<[i32; 3]>, Vec<[i32; 3]>) = touched
            .into_iter()
            .partition(|key| self.index.contains_key(key));
        let mut positions: Vec<(u32, [i32; 3])> =
            existing.iter().map(|key| (self.index[key], *key)).collect();
        positions.sort_unstable();
        let mut wanted = positions.iter().peekable();
        let mut targets = Vec::with_capacity(positions.len());
        for (position, block) in self.blocks.iter_mut().enumerate() {
            if let Some(&&(p, key)) = wanted.peek() {
                if p as usize == position {
                    targets.push((block, key));
                    wanted.next();
                }
            }
        }
        for_each_in_parallel(&mut targets, |(block, key)| {
            update(block, *key);
        });
        let mut scratch = empty_block();
        for key in new {
            if !update(&mut scratch, key) {
                continue;
            }
            if self.blocks.len() < self.options.max_blocks {
                self.reserve_block();
                self.index.insert(key, self.blocks.len() as u32);
                self.blocks
                    .push(std::mem::replace(&mut scratch, empty_block()));
                stats.blocks_allocated += 1;
            } else {
                *scratch = [Voxel::UNSEEN; BLOCK_VOXELS];
                stats.blocks_dropped += 1;
            }
        }
        self.dropped += stats.blocks_dropped;
        Ok(stats)
    }

    /// The pixels with a measurement, and the blocks within the truncation distance of their
    /// world points, sorted (so that the blocks a spent budget drops do not depend on hashing).
    fn touched_blocks(&self, table: &PixelTable, camera: &Camera) -> (usize, Vec<[i32; 3]>) {
        let block_size = self.options.voxel_size * BLOCK_SIDE as f64;
        let reach = self.options.truncation;
        let mut touched = HashSet::new();
        let mut pixels_used = 0;
        // Neighbouring pixels mostly touch the same blocks: skip repeats of the last range.
        let mut last_range = None;
        for v in 0..table.height {
            for u in 0..table.width {
                let inverse_depth = table.pixels[v * table.width + u].inverse_depth;
                if inverse_depth == 0.0 {
                    continue;
                }
                pixels_used += 1;
                let point = camera.lift(u, v, 1.0 / inverse_depth as f64);
                let low = point.map(|c| ((c - reach) / block_size).floor());
                let high = point.map(|c| ((c + reach) / block_size).floor());
                let in_range = |c: &f64| c.abs() < MAX_BLOCK_COORDINATE;
                if !(low.iter().all(in_range) && high.iter().all(in_range)) {
                    continue;
                }
                let range = (low.map(|c| c as i32), high.map(|c| c as i32));
                if last_range == Some(range) {
                    continue;
                }
                last_range = Some(range);
                let (low, high) = range;
                for z in low[2]..=high[2] {
                    for y in low[1]..=high[1] {
                        for x in low[0]..=high[0] {
                            touched.insert([x, y, z]);
                        }
                    }
                }
            }
        }
        let mut touched: Vec<[i32; 3]> = touched.into_iter().collect();
        touched.sort_unstable();
        (pixels_used, touched)
    }

    /// Grows the block list by doubling, but never past the budget.
    fn reserve_block(&mut self) {
        if self.blocks.len() == self.blocks.capacity() {
            let wanted = (self.blocks.capacity() * 2)
                .max(16)
                .min(self.options.max_blocks);
            self.blocks
                .reserve_exact(wanted.saturating_sub(self.blocks.len()).max(1));
        }
    }

    /// The surface (the TSDF's zero level) as a mesh in world coordinates: marching cubes
    /// over every cell whose eight voxels have been measured, across block borders. Vertices
    /// shared by neighbouring cells are welded; colours are interpolated along the edges;
    /// triangles face the observed side (see [`Mesh`]). Blocks are visited in coordinate
    /// order, so the same volume gives the same mesh.
    pub fn extract_mesh(&self) -> Mesh {
        let mut keys: Vec<([i32; 3], u32)> = self.index.iter().map(|(k, v)| (*k, *v)).collect();
        keys.sort_unstable();
        let mut builder = SurfaceBuilder::new(self.options.voxel_size);
        for (key, position) in keys {
            // The block and its neighbours on the +x, +y, +z sides (bit 0, 1, 2 of the index),
            // which hold the far corners of the block's last cells.
            let blocks: [Option<&Block>; 8] = std::array::from_fn(|n| {
                if n == 0 {
                    return Some(&self.blocks[position as usize]);
                }
                let neighbour = [0, 1, 2].map(|i| key[i] + ((n >> i) & 1) as i32);
                self.index
                    .get(&neighbour)
                    .map(|&p| &self.blocks[p as usize])
            });
            let origin = key.map(|k| k as i64 * BLOCK_SIDE as i64);
            for z in 0..BLOCK_SIDE {
                for y in 0..BLOCK_SIDE {
                    for x in 0..BLOCK_SIDE {
                        if let Some(corners) = cell_corners(&blocks, [x, y, z]) {
                            let cell = [0, 1, 2].map(|i| origin[i] + [x, y, z][i] as i64);
                            builder.add_cell(cell, &corners);
                        }
                    }
                }
            }
        }
        builder.finish()
    }

    /// Blocks allocated.
    pub fn allocated_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that frames had measurements for but the budget refused, summed over frames (a
    /// block refused by two frames counts twice).
    pub fn dropped_blocks(&self) -> usize {
        self.dropped
    }

    /// The bytes the volume holds (blocks, block list and index), at most
    /// [`TsdfOptions::memory_bound_bytes`].
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.blocks.capacity() * std::mem::size_of::<Block>()
            + self.blocks.len() * BLOCK_BYTES
            + hash_slots(self.index.capacity()) * INDEX_SLOT_BYTES
    }
}

/// Blocks a thread takes at a time (a block takes some tens of microseconds).
const BLOCKS_PER_TASK: usize = 64;

/// Runs `work` on every item, on as many threads as the machine has cores (and the items are
/// worth). Threads take parts of the items as they become free; the calling thread works too,
/// so that everything is done even where no thread can be started.
fn for_each_in_parallel<T: Send>(items: &mut [T], work: impl Fn(&mut T) + Sync) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(items.len().div_ceil(BLOCKS_PER_TASK));
    if threads <= 1 {
        items.iter_mut().for_each(work);
        return;
    }
    let parts: Vec<Mutex<&mut [T]>> = items.chunks_mut(BLOCKS_PER_TASK).map(Mutex::new).collect();
    let next = AtomicUsize::new(0);
    let drain = || {
        while let Some(part) = parts.get(next.fetch_add(1, Ordering::Relaxed)) {
            let mut part = part.lock().unwrap_or_else(PoisonError::into_inner);
            part.iter_mut().for_each(&work);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            if std::thread::Builder::new()
                .spawn_scoped(scope, drain)
                .is_err()
            {
                break;
            }
        }
        drain();
    });
}

/// The spacing and truncation of a volume, for updating its blocks.
struct Lattice {
    voxel_size: f64,
    truncation: f64,
}

impl Lattice {
    /// What `pixel` says of a voxel `distance` in front of its surface (negative: behind), if
    /// anything: the truncated distance and its weight.
    fn observation(&self, distance: f64, pixel: &Pixel) -> Option<(f32, f32)> {
        let (voxel_size, truncation) = (self.voxel_size, self.truncation);
        if distance < -truncation || (pixel.contour && distance < -voxel_size) {
            return None;
        }
        let mut weight = pixel.weight;
        if distance < -voxel_size {
            // Further behind the surface, what the ray says is less sure (the voxel may be
            // outside a thin or convex object seen from the other side): the weight falls to
            // 0 at the truncation distance.
            weight *= ((truncation + distance) / (truncation - voxel_size)) as f32;
        } else if distance >= truncation {
            weight *= FREE_SPACE_WEIGHT;
        }
        let tsdf = (distance / truncation).min(1.0) as f32;
        (weight > 0.0).then_some((tsdf, weight))
    }

    /// Updates the voxels of block `key` that the frame measures; whether any was.
    fn update_block(
        &self,
        voxels: &mut [Voxel; BLOCK_VOXELS],
        key: [i32; 3],
        camera: &Camera,
        table: &PixelTable,
        colors: Option<&[[u8; 3]]>,
    ) -> bool {
        let (voxel_size, truncation) = (self.voxel_size, self.truncation);
        let origin = camera.to_camera(key.map(|k| k as f64 * (BLOCK_SIDE as f64) * voxel_size));
        // One voxel along world axis `a` moves the camera point by column `a` of the
        // world-to-camera matrix, times the voxel size.
        let step = [0, 1, 2].map(|a| [0, 1, 2].map(|i| camera.world_to_camera[i][a] * voxel_size));
        let mut updated = false;
        for (index, voxel) in voxels.iter_mut().enumerate() {
            let (x, y, z) = (
                index % BLOCK_SIDE,
                index / BLOCK_SIDE % BLOCK_SIDE,
                index / 64,
            );
            let (x, y, z) = (x as f64, y as f64, z as f64);
            let point = [
                origin[0] + step[0][0] * x + step[1][0] * y + step[2][0] * z,
                origin[1] + step[0][1] * x + step[1][1] * y + step[2][1] * z,
                origin[2] + step[0][2] * x + step[1][2] * y + step[2][2] * z,
            ];
            let Some((pixel, depth)) = camera.project(point).and_then(|p| table.sample(p)) else {
                continue;
            };
            let seen = table.pixels[pixel];
            let distance = (depth - point[2]) * camera.scale * seen.distance_factor as f64;
            let Some((tsdf, weight)) = self.observation(distance, &seen) else {
                continue;
            };
            let total = voxel.weight + weight;
            voxel.tsdf = (voxel.tsdf * voxel.weight + tsdf * weight) / total;
            // Colour only from the surface the pixel sees: a voxel far in front of it (free
            // space the ray crosses) would take the colour of what is behind.
            if let Some(colors) = colors.filter(|_| distance < truncation) {
                let share = if voxel.colored { weight / total } else { 1.0 };
                for (stored, &seen) in voxel.color.iter_mut().zip(&colors[pixel]) {
                    let mixed = *stored as f32 + (seen as f32 - *stored as f32) * share;
                    // Rounded (the mix is within 0..=255).
                    *stored = (mixed + 0.5) as u8;
                }
                voxel.colored = true;
            }
            voxel.weight = total;
            updated = true;
        }
        updated
    }
}

/// The eight corners of the cell at `local` (voxel coordinates in the first of `blocks`), if
/// all of them have been measured.
fn cell_corners(blocks: &[Option<&Block>; 8], local: [usize; 3]) -> Option<[CornerSample; 8]> {
    let mut corners = [CornerSample {
        value: 0.0,
        color: [0; 3],
    }; 8];
    for (c, corner) in corners.iter_mut().enumerate() {
        let p = [0, 1, 2].map(|i| local[i] + ((c >> i) & 1));
        let block = p
            .iter()
            .enumerate()
            .fold(0, |n, (i, &v)| n | ((v / BLOCK_SIDE) << i));
        let [x, y, z] = p.map(|v| v % BLOCK_SIDE);
        let voxel = blocks[block]?[x + BLOCK_SIDE * (y + BLOCK_SIDE * z)];
        if voxel.weight <= 0.0 {
            return None;
        }
        *corner = CornerSample {
            value: voxel.tsdf,
            color: voxel.color,
        };
    }
    Some(corners)
}

#[cfg(test)]
mod tests;
