//! The final pass over the stored frames: TSDF fusion into a mesh, and the fused cloud,
//! through the windows' final placements.
//!
//! Pixels count when their confidence is at least 0.75 of their frame's mean (the official
//! DA3-Streaming keeps points above 0.75 of the chunk's mean); fusion weights them by it.

use super::spill::FrameStore;
use super::{StreamOptions, WindowState};
use crate::da3::export::PointCloud;
use crate::da3::outputs::quantile;
use crate::da3::Error;
use crate::geometry::mesh::Mesh;
use crate::geometry::points::PointAccumulator;
use crate::geometry::tsdf::{DepthFrame, TsdfOptions, TsdfVolume};

/// Below this fraction of its frame's mean confidence a pixel is not fused.
const CONFIDENCE_FRACTION: f32 = 0.75;

pub(crate) struct Fused {
    pub mesh: Option<Mesh>,
    pub cloud: Option<PointCloud>,
    pub voxel_size: Option<f64>,
}

/// The median depth of the stored frames in world units (the scene's scale).
fn typical_depth(store: &FrameStore, windows: &[WindowState]) -> f64 {
    let depths: Vec<f32> = store
        .records()
        .iter()
        .map(|r| (f64::from(r.median_depth) * windows[r.window].summary.to_world.scale) as f32)
        .filter(|d| d.is_finite() && *d > 0.0)
        .collect();
    if depths.is_empty() {
        1.0
    } else {
        f64::from(quantile(depths, 0.5))
    }
}

pub(crate) fn fuse(
    store: &mut FrameStore,
    windows: &[WindowState],
    options: &StreamOptions,
) -> Result<Fused, Error> {
    let depth = typical_depth(store, windows);
    let fusion_error = |e: crate::geometry::tsdf::FusionError| Error::Input(format!("fusion: {e}"));
    let tsdf_options = options.mesh.as_ref().map(|mesh| match mesh.voxel_size {
        Some(v) => TsdfOptions {
            max_blocks: mesh.max_blocks,
            ..TsdfOptions::new(v)
        },
        None => TsdfOptions::for_scene(depth, mesh.max_blocks),
    });
    let voxel_size = tsdf_options.as_ref().map(|o| o.voxel_size);
    let mut volume = tsdf_options
        .map(TsdfVolume::new)
        .transpose()
        .map_err(fusion_error)?;
    // The cloud's cells start at a quarter of the TSDF's voxel (or depth / 512) and grow
    // when the budget is reached.
    let mut cloud = (options.max_points > 0).then(|| {
        let cell = voxel_size.map_or(depth / 512.0, |v| v / 4.0);
        PointAccumulator::new(cell, options.max_points)
    });
    if volume.is_none() && cloud.is_none() {
        return Ok(Fused {
            mesh: None,
            cloud: None,
            voxel_size: None,
        });
    }
    for position in 0..store.records().len() {
        let record = store.records()[position].clone();
        let maps = store.maps(position)?;
        let camera_to_world = windows[record.window]
            .summary
            .to_world
            .compose(&record.camera_to_window);
        let threshold = record.mean_confidence * CONFIDENCE_FRACTION;
        let weights: Vec<f32> = maps
            .confidence
            .iter()
            .map(|&c| {
                if c.is_finite() && c >= threshold {
                    c
                } else {
                    0.0
                }
            })
            .collect();
        if let Some(volume) = volume.as_mut() {
            volume
                .integrate(&DepthFrame {
                    width: maps.width,
                    height: maps.height,
                    depth: &maps.depth,
                    weights: Some(&weights),
                    colors: Some(&maps.colors),
                    intrinsics: maps.intrinsics,
                    camera_to_world,
                })
                .map_err(|e| Error::Input(format!("fusing frame {}: {e}", record.name)))?;
        }
        if let Some(cloud) = cloud.as_mut() {
            let points = super::back_project(
                &maps.depth,
                maps.width,
                maps.height,
                1,
                &maps.intrinsics,
                &camera_to_world,
            );
            for ((p, &w), &c) in points.iter().zip(&weights).zip(&maps.colors) {
                if w > 0.0 && p.iter().all(|v| v.is_finite()) {
                    cloud.add(*p, c, w);
                }
            }
        }
    }
    let mesh = volume.map(|v| {
        if v.dropped_blocks() > 0 {
            log::warn!(
                "the TSDF volume reached its budget of {} blocks and dropped {}: give a larger \
                 voxel or budget for the whole scene",
                v.allocated_blocks(),
                v.dropped_blocks()
            );
        }
        let mesh = v.extract_mesh();
        if mesh.triangles.is_empty() {
            log::warn!(
                "the fused volume holds no surface: the frames' depth never agreed within the \
                 truncation band ({} blocks): an untrained model's depth does not; a larger voxel \
                 size may help",
                v.allocated_blocks()
            );
        }
        mesh
    });
    let cloud = cloud.map(|c| {
        let (positions, colors) = c.points();
        PointCloud {
            positions,
            colors,
            sources: Vec::new(),
            confidence_threshold: None,
        }
    });
    Ok(Fused {
        mesh,
        cloud,
        voxel_size,
    })
}
