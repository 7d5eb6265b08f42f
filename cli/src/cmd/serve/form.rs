//! The `/v1/depth` form (multipart fields `image` (repeated), `process_res` and `outputs`) and
//! the `/v1/scene` form (the same, two images or more, and `poses` and `ref_view`), read and
//! checked here. Self-contained (axum, tower-http and the library's limits only) so that
//! `fuzz/fuzz_targets/serve_form.rs` can include this file and drive [`parse`] with bytes,
//! without a socket.

use axum::body::{Body, Bytes};
use axum::extract::multipart::{MultipartError, MultipartRejection};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{header, StatusCode};

/// What a request may ask for besides the JSON summary.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Output {
    DepthPng,
    DepthF32,
    ConfidenceF32,
    SkyF32,
    Pose,
    Points,
    Ply,
    Glb,
}

impl Output {
    pub const ALL: [(&'static str, Output); 8] = [
        ("depth_png", Output::DepthPng),
        ("depth_f32", Output::DepthF32),
        ("confidence_f32", Output::ConfidenceF32),
        ("sky_f32", Output::SkyF32),
        ("pose", Output::Pose),
        ("points", Output::Points),
        ("ply", Output::Ply),
        ("glb", Output::Glb),
    ];
    /// Needs the point cloud (and the processed colours).
    pub fn is_3d(self) -> bool {
        matches!(self, Output::Points | Output::Ply | Output::Glb)
    }
    pub fn name(self) -> &'static str {
        Output::ALL.iter().find(|(_, o)| *o == self).unwrap().0
    }
}

/// What the server allows and what its model can answer.
pub struct Rules<'a> {
    pub max_upload_bytes: usize,
    pub max_views: usize,
    /// The model's preset name, for error messages.
    pub preset: &'a str,
    pub has_pose: bool,
    pub has_sky: bool,
    pub has_confidence: bool,
}

/// Which endpoint's form is read.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    /// `/v1/depth`: each image on its own.
    Depth,
    /// `/v1/scene`: the images are the views of one scene; also `poses` and `ref_view`.
    Scene,
}

/// Fewest images a scene takes: one image is `/v1/depth`'s job, and what a scene adds (a
/// reference view, cameras relative to it, known cameras aligned by their centres) needs two.
pub const MIN_SCENE_VIEWS: usize = 2;

/// A checked form.
#[derive(Debug)]
pub struct Form {
    /// `(file name, bytes)` per `image` field, in order; never empty, at most `max_views`
    /// (for a scene, at least [`MIN_SCENE_VIEWS`]).
    pub files: Vec<(Option<String>, Bytes)>,
    /// Within `PATCH_SIZE..=MAX_PROCESS_RES` when given.
    pub process_res: Option<usize>,
    /// Each at most once, in the order first asked for.
    pub outputs: Vec<Output>,
    /// A scene's known cameras: the `poses` field's JSON text as sent (parsed by the library's
    /// reader once the images' names and sizes are known).
    pub poses: Option<String>,
    /// A scene's reference-view strategy, when the form names one.
    pub ref_view: Option<da3::RefViewStrategy>,
}

/// Why a form was refused: always a 4xx status.
#[derive(Debug)]
pub struct FormError {
    pub status: StatusCode,
    pub message: String,
}

impl FormError {
    fn new(status: StatusCode, message: impl Into<String>) -> FormError {
        FormError {
            status,
            message: message.into(),
        }
    }
    fn bad_request(message: impl Into<String>) -> FormError {
        FormError::new(StatusCode::BAD_REQUEST, message)
    }
}

/// The answer to a body that is not a multipart upload at all (wrong or missing content type).
pub fn rejected(e: MultipartRejection) -> FormError {
    FormError::new(
        e.status(),
        format!(
            "expected a multipart/form-data upload with `image` fields: {}",
            e.body_text()
        ),
    )
}

/// The form of a whole body already in memory (the fuzz target's entry; the server streams
/// through [`read`]).
#[allow(dead_code)] // called by the fuzz target and this file's tests, not by the server
pub async fn parse(content_type: &str, body: Bytes, rules: &Rules<'_>) -> Result<Form, FormError> {
    let mut request = Request::new(Body::from(body));
    if let Ok(value) = header::HeaderValue::from_str(content_type) {
        request.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    let multipart = Multipart::from_request(request, &())
        .await
        .map_err(rejected)?;
    read(multipart, rules).await
}

/// Reads every field of a `/v1/depth` form, refusing the form at the first one out of bounds.
pub async fn read(multipart: Multipart, rules: &Rules<'_>) -> Result<Form, FormError> {
    read_form(multipart, rules, Endpoint::Depth).await
}

/// Reads every field of `endpoint`'s form, refusing the form at the first one out of bounds.
pub async fn read_form(
    mut multipart: Multipart,
    rules: &Rules<'_>,
    endpoint: Endpoint,
) -> Result<Form, FormError> {
    let limit = rules.max_upload_bytes;
    let mut files: Vec<(Option<String>, Bytes)> = Vec::new();
    let mut process_res = None;
    let mut outputs: Vec<Output> = Vec::new();
    let mut poses = None;
    let mut ref_view = None;
    while let Some(field) = multipart
        .next_field()
        .await
        .map_err(|e| multipart_error(e, limit))?
    {
        let name = field.name().unwrap_or("").to_owned();
        match name.as_str() {
            "image" => {
                if files.len() == rules.max_views {
                    return Err(FormError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!(
                            "more than {} images in one request (the limit)",
                            rules.max_views
                        ),
                    ));
                }
                let file_name = field.file_name().map(str::to_owned);
                let bytes = field.bytes().await.map_err(|e| multipart_error(e, limit))?;
                files.push((file_name, bytes));
            }
            "process_res" => {
                let text = field.text().await.map_err(|e| multipart_error(e, limit))?;
                let value = text.trim().parse::<usize>().map_err(|_| {
                    FormError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!("process_res {text:?}: not a whole number"),
                    )
                })?;
                if !(da3::preprocess::PATCH_SIZE..=da3::preprocess::MAX_PROCESS_RES)
                    .contains(&value)
                {
                    return Err(FormError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        format!(
                            "process_res {value}: must be from {} to {}",
                            da3::preprocess::PATCH_SIZE,
                            da3::preprocess::MAX_PROCESS_RES
                        ),
                    ));
                }
                process_res = Some(value);
            }
            "outputs" => {
                let text = field.text().await.map_err(|e| multipart_error(e, limit))?;
                for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    let Some((_, output)) = Output::ALL.iter().find(|(n, _)| *n == item) else {
                        return Err(FormError::bad_request(format!(
                            "outputs: unknown output {item:?} (known: depth_png, depth_f32, \
                             confidence_f32, sky_f32, pose, points, ply, glb)"
                        )));
                    };
                    let missing = match output {
                        Output::Pose => !rules.has_pose,
                        Output::SkyF32 => !rules.has_sky,
                        Output::ConfidenceF32 => !rules.has_confidence,
                        _ => false,
                    };
                    if missing {
                        return Err(FormError::new(
                            StatusCode::UNPROCESSABLE_ENTITY,
                            format!("outputs: model {} has no {item}", rules.preset),
                        ));
                    }
                    if !outputs.contains(output) {
                        outputs.push(*output);
                    }
                }
            }
            "poses" if endpoint == Endpoint::Scene => {
                if poses.is_some() {
                    return Err(FormError::bad_request(
                        "poses: given twice (one JSON document holds every view's camera)",
                    ));
                }
                let text = field.text().await.map_err(|e| multipart_error(e, limit))?;
                poses = Some(text);
            }
            "ref_view" if endpoint == Endpoint::Scene => {
                if ref_view.is_some() {
                    return Err(FormError::bad_request("ref_view: given twice"));
                }
                let text = field.text().await.map_err(|e| multipart_error(e, limit))?;
                let strategy = text.trim().parse::<da3::RefViewStrategy>().map_err(|e| {
                    FormError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("ref_view: {e}"))
                })?;
                ref_view = Some(strategy);
            }
            other => {
                let expected = match endpoint {
                    Endpoint::Depth => "image, process_res, outputs",
                    Endpoint::Scene => "image, poses, ref_view, process_res, outputs",
                };
                return Err(FormError::bad_request(format!(
                    "unknown form field {other:?} (expected {expected})"
                )));
            }
        }
    }
    match endpoint {
        Endpoint::Depth if files.is_empty() => {
            return Err(FormError::bad_request(
                "no `image` field: upload one or more images as multipart fields named `image`",
            ));
        }
        Endpoint::Scene if files.len() < MIN_SCENE_VIEWS => {
            return Err(FormError::bad_request(format!(
                "a scene needs {MIN_SCENE_VIEWS} or more images (multipart fields named \
                 `image`), got {}; for one image use /v1/depth",
                files.len()
            )));
        }
        _ => {}
    }
    Ok(Form {
        files,
        process_res,
        outputs,
        poses,
        ref_view,
    })
}

fn multipart_error(e: MultipartError, limit: usize) -> FormError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(limit);
    }
    if stalled(&e) {
        return FormError::new(
            StatusCode::REQUEST_TIMEOUT,
            "the upload stalled: no data within the server's body timeout",
        );
    }
    FormError::bad_request(format!("malformed multipart upload: {}", e.body_text()))
}

/// Whether the body read failed because the client sent nothing for the body timeout
/// (`tower_http`'s `RequestBodyTimeoutLayer`, somewhere down the error's sources).
fn stalled(e: &MultipartError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(error) = source {
        if error.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        source = error.source();
    }
    false
}

pub fn too_large(limit: usize) -> FormError {
    FormError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the upload is larger than the limit of {limit} bytes"),
    )
}
