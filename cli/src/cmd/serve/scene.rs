//! `POST /v1/scene`: the uploaded images as the views of one scene, computed together (what
//! `da3 depth --input a.jpg --input b.jpg --out-dir DIR` does), optionally with the views'
//! known cameras (`--poses`).
//!
//! The answer holds the keys of that command's poses.json, written by the same library call
//! ([`da3::Output::save_poses_json`]) so that the two cannot drift, and therefore reads back as
//! a `poses` field; each view's entry adds its input size, depth range and the maps asked for,
//! and the scene adds its 3D outputs (one cloud of every view).

use super::encode::{cloud_outputs, internal, map_outputs};
use super::form::{self, Endpoint};
use super::{
    check_declared_length, connections, decode_all, form_rules, run_guarded, submit, upload_label,
    ApiError, AppState, Job, Panicked,
};
use axum::extract::multipart::MultipartRejection;
use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use da3::poses::{match_views, parse_poses_json};
use da3::{Image as RgbImage8, KnownPose, Model, RefViewStrategy};
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::oneshot;

/// One scene, for one worker.
pub struct SceneJob {
    images: Vec<RgbImage8>,
    /// One per image: the upload's file name, or `imageN.png` (the library's default name).
    names: Vec<String>,
    process_res: Option<usize>,
    reference: RefViewStrategy,
    /// One per image, in image order.
    poses: Option<Vec<KnownPose>>,
    pub(super) reply: oneshot::Sender<Result<da3::Output, ApiError>>,
}

/// Computes `job`'s scene on the worker's session.
pub(super) fn compute(
    model: &Model,
    session: &mut da3::Session,
    job: &SceneJob,
) -> Result<da3::Output, ApiError> {
    let mut request = da3::Request::new(&job.images)
        .names(job.names.iter().cloned())
        .reference(job.reference);
    if let Some(res) = job.process_res {
        request = request.process_res(res);
    }
    if let Some(poses) = &job.poses {
        request = request.poses(poses);
    }
    match run_guarded(model, session, &request) {
        Ok(Ok(scene)) => Ok(scene),
        Ok(Err(e)) => {
            // The library refuses what the client sent (cameras it cannot align, ...) as input.
            let status = match e {
                da3::Error::Input(_) | da3::Error::Preprocess(_) => {
                    StatusCode::UNPROCESSABLE_ENTITY
                }
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            Err(ApiError::new(status, format!("the scene: {}", message(&e))))
        }
        Err(Panicked) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the scene: internal error during inference",
        )),
    }
}

/// A library error's text without the `input: ` its input errors start with (the answer's
/// status already says whose fault it is).
fn message(e: &da3::Error) -> String {
    match e {
        da3::Error::Input(text) => text.clone(),
        other => other.to_string(),
    }
}

fn unprocessable(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, message)
}

pub(super) async fn scene(
    State(shared): State<AppState>,
    connection: Option<Extension<Arc<connections::Connection>>>,
    headers: HeaderMap,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<Value>, ApiError> {
    check_declared_length(&headers, shared.max_upload_bytes)?;
    let form::Form {
        files,
        process_res,
        outputs,
        poses,
        ref_view,
    } = form::read_form(
        multipart.map_err(form::rejected)?,
        &form_rules(&shared),
        Endpoint::Scene,
    )
    .await?;
    // The whole body is in: from here the client only waits for the answer.
    let _busy = connection.map(|Extension(c)| c.busy());
    let views = files.len();
    if poses.is_some() {
        if let Some(reason) = &shared.known_poses_refusal {
            return Err(unprocessable(format!("poses: {reason}")));
        }
        if ref_view.is_some() {
            return Err(unprocessable(
                "ref_view: with known poses view 0 is the reference (the given cameras fix \
                 the world frame); leave ref_view out",
            ));
        }
    }
    if let Some(RefViewStrategy::View(v)) = ref_view {
        if v >= views {
            return Err(unprocessable(format!(
                "ref_view {v}: the scene has {views} views (the first is 0)"
            )));
        }
    }
    let names: Vec<String> = (files.iter().enumerate())
        .map(|(i, (name, _))| name.clone().unwrap_or_else(|| format!("image{i}.png")))
        .collect();
    let labels = (files.iter().enumerate())
        .map(|(i, (name, _))| upload_label(i, name.as_deref()))
        .collect();
    let images = decode_all(files, labels, process_res).await?;
    // Every view must reach one processed size: refused here, before the queue.
    da3::Request::new(&images)
        .names(names.iter().cloned())
        .processed_plans(process_res.unwrap_or(da3::DEFAULT_PROCESS_RES))
        .map_err(|e| unprocessable(message(&e)))?;
    let poses = match &poses {
        Some(text) => Some(known_poses(text, &names, &images)?),
        None => None,
    };

    let (reply, answer) = oneshot::channel();
    let job = Job::Scene(SceneJob {
        images,
        names,
        process_res,
        reference: ref_view.unwrap_or_default(),
        poses,
        reply,
    });
    let scene = submit(&shared, job, answer).await?;
    let model = shared.model_name.clone();
    let body = tokio::task::spawn_blocking(move || encode_scene(&model, &scene, &outputs))
        .await
        .map_err(|_| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error encoding")
        })??;
    Ok(Json(body))
}

/// The `poses` field's cameras, one per view in upload order: read by the library's
/// poses.json reader and matched to the views as `da3 depth --poses` matches them (by name
/// where every camera has one, else in order; intrinsics given for another `width` x `height`
/// rescaled to the upload's size).
fn known_poses(
    text: &str,
    names: &[String],
    images: &[RgbImage8],
) -> Result<Vec<KnownPose>, ApiError> {
    let cameras = parse_poses_json(text, "poses").map_err(|e| unprocessable(message(&e)))?;
    // By name, two uploads of one name would both take the same camera.
    if cameras.iter().all(|c| c.name.is_some()) {
        for (later, name) in names.iter().enumerate() {
            if let Some(earlier) = names[..later].iter().position(|n| n == name) {
                return Err(unprocessable(format!(
                    "poses: views {earlier} and {later} are both named {name:?}, so cameras \
                     cannot be matched by name: give the uploads distinct file names, or leave \
                     `name` out of the poses to match them in order"
                )));
            }
        }
    }
    let sizes: Vec<(usize, usize)> = images.iter().map(|im| (im.width, im.height)).collect();
    match_views(&cameras, names, &sizes)
        .map_err(|e| unprocessable(format!("poses: {}", message(&e))))
}

/// The answer to a scene: poses.json's keys (`reference`, `ref_view_strategy`, `depth_unit`,
/// `views`, and with known poses `known_poses` and `pose_scale`), each view's entry with its
/// input size, depth range and maps; the model's name and the scene's 3D outputs.
fn encode_scene(
    model: &str,
    scene: &da3::Output,
    outputs: &[form::Output],
) -> Result<Value, ApiError> {
    let mut body = match scene.views.first().and_then(|v| v.camera()) {
        Some(_) => poses_json(scene)?,
        None => cameraless_json(scene),
    };
    let Some(object) = body.as_object_mut() else {
        return Err(internal("poses.json is not a JSON object"));
    };
    let Some(entries) = object.get_mut("views").and_then(Value::as_array_mut) else {
        return Err(internal("poses.json has no `views` list"));
    };
    for (entry, view) in entries.iter_mut().zip(&scene.views) {
        let Some(entry) = entry.as_object_mut() else {
            return Err(internal("a poses.json view is not a JSON object"));
        };
        let (lo, hi) = view.depth_range();
        let mut maps = Map::new();
        map_outputs(view, outputs, &mut maps)?;
        entry.insert("input_width".into(), json!(view.input_size.0));
        entry.insert("input_height".into(), json!(view.input_size.1));
        entry.insert("depth_min".into(), json!(lo));
        entry.insert("depth_max".into(), json!(hi));
        entry.insert("outputs".into(), Value::Object(maps));
    }
    let mut scene_outputs = Map::new();
    if outputs.iter().any(|o| o.is_3d()) {
        cloud_outputs(scene, outputs, &mut scene_outputs)?;
    }
    object.insert("model".into(), json!(model));
    object.insert("outputs".into(), Value::Object(scene_outputs));
    Ok(body)
}

/// The scene's poses.json exactly as `da3 depth` writes it (through a temporary file: the
/// library writes it only to a path).
fn poses_json(scene: &da3::Output) -> Result<Value, ApiError> {
    let dir = tempfile::tempdir().map_err(internal)?;
    let path = dir.path().join("poses.json");
    scene.save_poses_json(&path).map_err(internal)?;
    let text = std::fs::read(&path).map_err(internal)?;
    serde_json::from_slice(&text).map_err(internal)
}

/// poses.json's keys that a model without cameras has (`da3 depth` writes no poses.json for
/// it): the reference view, the strategy, the depth unit, each view's name and size.
fn cameraless_json(scene: &da3::Output) -> Value {
    let views: Vec<Value> = (scene.views.iter().enumerate())
        .map(|(i, view)| {
            json!({
                "index": i,
                "name": view.name,
                "width": view.width,
                "height": view.height,
                "reference": i == scene.reference,
            })
        })
        .collect();
    let unit = scene
        .views
        .first()
        .map(|v| v.depth_unit)
        .unwrap_or_default();
    json!({
        "reference": scene.reference,
        "ref_view_strategy": scene.strategy.name(),
        "depth_unit": unit.name(),
        "views": views,
    })
}
