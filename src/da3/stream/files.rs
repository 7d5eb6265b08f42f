//! The files of a reconstruction: the official DA3-Streaming layout (`camera_poses.txt`,
//! `intrinsic.txt`, a combined PLY cloud) and da3's own (`poses.json`, which reads back as
//! known poses, and the mesh as PLY and glb). Every file is written atomically.

use super::Reconstruction;
use crate::atomic_file;
use crate::da3::export;
use crate::da3::Error;
use std::path::Path;

fn missing(what: &str, option: &str) -> Error {
    Error::Input(format!(
        "this reconstruction has no {what}: the stream ran without {option}"
    ))
}

impl Reconstruction {
    /// Writes one line per frame, its rigid camera-to-world 4x4 matrix flattened row by row
    /// (16 numbers): the official `camera_poses.txt`.
    pub fn save_camera_poses_txt(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        Ok(atomic_file::write(path.as_ref(), |out| {
            for frame in &self.frames {
                let m = frame.camera_to_world_matrix();
                let numbers: Vec<String> = m.iter().flatten().map(|v| format!("{v}")).collect();
                writeln!(out, "{}", numbers.join(" "))?;
            }
            Ok(())
        })?)
    }

    /// Writes one line per frame, `fx fy cx cy` in pixels of the processed image: the
    /// official `intrinsic.txt`.
    pub fn save_intrinsics_txt(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        Ok(atomic_file::write(path.as_ref(), |out| {
            for frame in &self.frames {
                let k = frame.intrinsics;
                writeln!(out, "{} {} {} {}", k[0][0], k[1][1], k[0][2], k[1][2])?;
            }
            Ok(())
        })?)
    }

    /// Writes the cameras as the CLI's `poses.json` (`views`: `index`, `name`, `width`,
    /// `height`, `intrinsics`, `extrinsics_world_to_camera`, `reference`; it reads back as
    /// known poses), with each frame's `window` and `depth_scale`, the windows' placements
    /// and seams, and the loop closures.
    pub fn save_poses_json(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let views: Vec<serde_json::Value> = self
            .frames
            .iter()
            .map(|f| {
                let pose = f.pose();
                serde_json::json!({
                    "index": f.index,
                    "name": f.name,
                    "width": f.width,
                    "height": f.height,
                    "reference": f.index == 0,
                    "intrinsics": pose.intrinsics,
                    "extrinsics_world_to_camera": pose.extrinsics,
                    "window": f.window,
                    "depth_scale": f.depth_scale(),
                })
            })
            .collect();
        let windows: Vec<serde_json::Value> = self
            .windows
            .iter()
            .map(|w| {
                let mut entry = serde_json::json!({
                    "index": w.index,
                    "first_frame": w.first_frame,
                    "frames": w.frames,
                    "to_world": w.to_world.to_matrix(),
                });
                if let Some(seam) = &w.seam {
                    entry["seam"] = serde_json::json!({
                        "shared_frames": seam.shared_frames,
                        "points": seam.points,
                        "inlier_fraction": seam.inlier_fraction,
                        "relative_rms": seam.relative_rms,
                        "scale": seam.scale,
                    });
                    if let Some((inliers, rms)) = seam.icp {
                        entry["seam"]["icp"] =
                            serde_json::json!({ "inlier_fraction": inliers, "relative_rms": rms });
                    }
                }
                entry
            })
            .collect();
        let loops: Vec<serde_json::Value> = self
            .loops
            .iter()
            .map(|l| {
                serde_json::json!({
                    "windows": [l.windows.0, l.windows.1],
                    "frames": [l.frames.0, l.frames.1],
                    "similarity": l.similarity,
                    "inlier_fractions": [l.inlier_fractions.0, l.inlier_fractions.1],
                    "accepted": l.accepted,
                    "correction": l.correction.map(|(t, r)| serde_json::json!({
                        "relative_translation": t, "rotation_degrees": r })),
                })
            })
            .collect();
        let mut json = serde_json::json!({
            "reference": 0,
            "ref_view_strategy": "first",
            "depth_unit": self.depth_unit.name(),
            "views": views,
            "windows": windows,
            "loop_closures": loops,
        });
        if let Some(report) = &self.optimization {
            json["pose_graph"] = serde_json::json!({
                "initial_cost": report.initial_cost,
                "final_cost": report.final_cost,
                "iterations": report.iterations,
                "converged": report.converged,
            });
        }
        Ok(atomic_file::write(path.as_ref(), |out| {
            serde_json::to_writer_pretty(&mut *out, &json).map_err(std::io::Error::other)?;
            out.write_all(b"\n")
        })?)
    }

    /// Writes the fused cloud as a binary PLY (the official `pcd/combined_pcd.ply`).
    pub fn save_cloud_ply(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let cloud = self
            .cloud
            .as_ref()
            .ok_or_else(|| missing("cloud", "a point budget"))?;
        export::write_ply(path.as_ref(), cloud)
    }

    /// Writes the fused mesh as a binary PLY with vertex colours and normals.
    pub fn save_mesh_ply(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let mesh = self
            .mesh
            .as_ref()
            .ok_or_else(|| missing("mesh", "mesh options"))?;
        export::write_mesh_ply(path.as_ref(), mesh)
    }

    /// Writes the fused mesh as glb (one triangle primitive with colours and normals).
    pub fn save_mesh_glb(&self, path: impl AsRef<Path>) -> Result<(), Error> {
        let mesh = self
            .mesh
            .as_ref()
            .ok_or_else(|| missing("mesh", "mesh options"))?;
        export::write_mesh_glb(path.as_ref(), mesh)
    }
}
