//! The answers' encoding, shared by `/v1/depth` and `/v1/scene`: one view's maps (base64) and
//! the 3D outputs of one view or of a whole scene.

use super::form::Output;
use super::ApiError;
use axum::http::StatusCode;
use base64::Engine as _;
use da3::export::{ExportOptions, ViewerScene};
use da3::{Colormap, Prediction};
use serde_json::{json, Value};
use std::path::Path;

pub fn f32_base64(values: &[f32]) -> String {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Horizontal field of view assumed for the 3D outputs of a model that predicts no camera.
const ASSUMED_FOV_DEGREES: f32 = 60.0;

/// Most points in a `points` output (the page's 3D view).
const POINTS_OUTPUT_CAP: usize = 200_000;

/// What the 3D outputs are made of: one view (`/v1/depth`) or a whole scene (`/v1/scene`),
/// which the library exports alike.
pub trait Cloud {
    fn viewer_scene(&self, options: &ExportOptions) -> Result<ViewerScene, da3::Error>;
    fn save_ply(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error>;
    fn save_glb(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error>;
}

impl Cloud for Prediction {
    fn viewer_scene(&self, options: &ExportOptions) -> Result<ViewerScene, da3::Error> {
        Prediction::viewer_scene(self, options)
    }
    fn save_ply(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error> {
        Prediction::save_ply(self, path, options)
    }
    fn save_glb(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error> {
        Prediction::save_glb(self, path, options)
    }
}

impl Cloud for da3::Output {
    fn viewer_scene(&self, options: &ExportOptions) -> Result<ViewerScene, da3::Error> {
        da3::Output::viewer_scene(self, options)
    }
    fn save_ply(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error> {
        da3::Output::save_ply(self, path, options)
    }
    fn save_glb(&self, path: &Path, options: &ExportOptions) -> Result<(), da3::Error> {
        da3::Output::save_glb(self, path, options)
    }
}

/// The 3D outputs of one prediction or scene: its point cloud (the official glb export's
/// filtering) as the page's viewer draws it, or a PLY or glb file.
pub fn cloud_outputs(
    cloud: &impl Cloud,
    outputs: &[Output],
    encoded: &mut serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    let options = ExportOptions {
        assumed_fov: Some(ASSUMED_FOV_DEGREES),
        ..ExportOptions::default()
    };
    let dir = tempfile::tempdir().map_err(internal)?;
    let file = |name: &str, save: &dyn Fn(&Path) -> Result<(), da3::Error>| {
        let path = dir.path().join(name);
        save(&path).map_err(internal)?;
        let bytes = std::fs::read(&path).map_err(internal)?;
        Ok::<_, ApiError>(Value::String(
            base64::engine::general_purpose::STANDARD.encode(bytes),
        ))
    };
    for output in outputs {
        let value = match output {
            Output::Points => cloud
                .viewer_scene(&options)
                .map_err(internal)?
                .to_json(POINTS_OUTPUT_CAP),
            Output::Ply => file("points.ply", &|path| cloud.save_ply(path, &options))?,
            Output::Glb => file("scene.glb", &|path| cloud.save_glb(path, &options))?,
            _ => continue,
        };
        encoded.insert(output.name().to_owned(), value);
    }
    Ok(())
}

/// The maps of one view that `outputs` asks for (depth PNG, float32 depth, confidence, sky),
/// base64, into `encoded`.
pub fn map_outputs(
    p: &Prediction,
    outputs: &[Output],
    encoded: &mut serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    for output in outputs {
        let value = match output {
            Output::DepthPng => {
                let dir = tempfile::tempdir().map_err(internal)?;
                let path = dir.path().join("depth.png");
                p.save_png(&path, Colormap::Turbo).map_err(internal)?;
                let png = std::fs::read(&path).map_err(internal)?;
                base64::engine::general_purpose::STANDARD.encode(png)
            }
            Output::DepthF32 => f32_base64(&p.depth),
            Output::ConfidenceF32 => match &p.confidence {
                Some(c) => f32_base64(c),
                None => continue,
            },
            Output::SkyF32 => match &p.sky {
                Some(s) => f32_base64(s),
                None => continue,
            },
            Output::Pose => continue, // always in `pose` when the model has one
            Output::Points | Output::Ply | Output::Glb => continue, // cloud_outputs
        };
        encoded.insert(output.name().to_owned(), Value::String(value));
    }
    Ok(())
}

pub fn encode(p: &Prediction, name: Option<&str>, outputs: &[Output]) -> Result<Value, ApiError> {
    let (lo, hi) = p.depth_range();
    let (input_width, input_height) = p.input_size;
    let mut encoded = serde_json::Map::new();
    if outputs.iter().any(|o| o.is_3d()) {
        cloud_outputs(p, outputs, &mut encoded)?;
    }
    map_outputs(p, outputs, &mut encoded)?;
    Ok(json!({
        "filename": name,
        "input_width": input_width,
        "input_height": input_height,
        "width": p.width,
        "height": p.height,
        "depth_min": lo,
        "depth_max": hi,
        // The keys of the CLI's poses.json (`extrinsics` is kept for clients of earlier
        // releases).
        "pose": p.pose.as_ref().map(|pose| json!({
            "intrinsics": pose.intrinsics,
            "extrinsics_world_to_camera": pose.extrinsics,
            "extrinsics": pose.extrinsics,
        })),
        "outputs": encoded,
    }))
}

pub fn internal(e: impl std::fmt::Display) -> ApiError {
    log::error!("encoding a result: {e}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("encoding the result: {e}"),
    )
}
