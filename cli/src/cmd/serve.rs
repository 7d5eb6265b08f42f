//! `da3 serve`: an HTTP service for depth (axum on tokio): `/v1/depth` computes each uploaded
//! image on its own, `/v1/scene` the uploaded images as the views of one scene (`serve/scene.rs`).
//!
//! The model is loaded once; `--workers` OS threads each own a [`da3::Session`] (sessions are
//! `!Send`, so each is made inside its thread) and take jobs from one bounded queue
//! (`--queue`). A full queue answers 503 with `Retry-After`; a job not answered within
//! `--timeout` answers 504. SIGINT/SIGTERM stop accepting, finish what is in flight, exit 0.
//! Every error is JSON `{"error": "...", "code": N}`. Slow clients are bounded by
//! `--header-timeout`, `--body-timeout` and `--max-connections` (see `serve/connections.rs`).

use super::common::{DeviceArgs, ModelArgs};
use anyhow::Context as _;
use axum::extract::multipart::MultipartRejection;
use axum::extract::{DefaultBodyLimit, Multipart, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use da3::da3::architecture::CAMERA_ENCODER_PROBE;
use da3::preprocess::PreprocessError;
use da3::{decode_image, Image as RgbImage8};
use da3::{Config, LoadOptions, Model, Prediction};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

mod api;
mod connections;
mod encode;
mod form;
mod scene;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    device: DeviceArgs,
    /// Address to listen on, `HOST:PORT` with an IP or a host name such as `localhost`
    /// (port 0: any free port; the bound address is printed).
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = listen_address)]
    addr: SocketAddr,
    /// Allow a non-loopback `--addr` (there is no authentication).
    #[arg(long)]
    allow_remote: bool,
    /// Inference threads, each with its own session.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    workers: u16,
    /// Requests waiting for a worker before new ones get 503.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    queue: u32,
    /// Seconds a request may wait and compute before it gets 504 (decimals allowed).
    #[arg(long, default_value = "120", value_parser = parse_timeout)]
    timeout: Duration,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = 32 << 20)]
    max_upload_bytes: usize,
    /// Most images in one request: /v1/depth's images, /v1/scene's views. A scene's views are
    /// computed together in one graph, so its memory grows with their number (about 155 MiB a
    /// view for da3-base at 504, per worker).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    max_views: u16,
    /// Load the camera encoder, which /v1/scene requests with known `poses` need (DualDPT
    /// models; about a fifth more weights, so off by default). The metric model takes known
    /// poses for their focal lengths without it.
    #[arg(long)]
    camera_encoder: bool,
    /// Seconds a client has to send a request head, from its first byte or, on a kept-alive
    /// connection, from the previous answer (so also the idle timeout); then the connection is
    /// closed.
    #[arg(long, default_value = "10", value_parser = parse_timeout)]
    header_timeout: Duration,
    /// Longest pause, in seconds, while receiving a request body; then 408.
    #[arg(long, default_value = "30", value_parser = parse_timeout)]
    body_timeout: Duration,
    /// Most connections open at once (lowered to fit the open-files limit). When reached, the
    /// connection that has waited longest on its client is closed to make room for the new one.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
}

/// One request's work, for one worker.
enum Job {
    Images(ImagesJob),
    Scene(scene::SceneJob),
}

impl Job {
    /// Whether the request gave up waiting (timed out), so that nobody reads the answer.
    fn abandoned(&self) -> bool {
        match self {
            Job::Images(job) => job.reply.is_closed(),
            Job::Scene(job) => job.reply.is_closed(),
        }
    }
}

/// `/v1/depth`'s images, each computed on its own.
struct ImagesJob {
    images: Arc<Vec<RgbImage8>>,
    process_res: Option<usize>,
    reply: oneshot::Sender<Result<Vec<Prediction>, ApiError>>,
}

/// An error answer: `{"error": message, "code": status}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(json!({"error": self.message, "code": self.status.as_u16()})),
        )
            .into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// Latency histogram bucket bounds, seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Bucket counts (not cumulative), sum of seconds, count.
type Histogram = ([u64; BUCKETS.len()], f64, u64);

#[derive(Default)]
struct Metrics {
    /// (path, status) -> count.
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    /// Per path: bucket counts (cumulative at render time), sum, count.
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
    queue_depth: AtomicU64,
    jobs_in_flight: AtomicU64,
    http_in_flight: AtomicU64,
    connections_open: AtomicU64,
    /// Connections closed to make room for new ones (at `--max-connections`, or out of files).
    connections_shed: AtomicU64,
}

struct Shared {
    queue: SyncSender<Job>,
    metrics: Arc<Metrics>,
    model_name: String,
    preset: String,
    device: String,
    has_pose: bool,
    has_sky: bool,
    has_confidence: bool,
    timeout: Duration,
    max_upload_bytes: usize,
    max_views: usize,
    /// Why a scene with known poses is refused (`None`: they are taken).
    known_poses_refusal: Option<String>,
}

type AppState = Arc<Shared>;

/// `--addr`: an address, or a host name resolved to its first address (a loopback one where
/// the name has one, so `localhost` stays loopback whatever the resolver's order).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let addrs: Vec<SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| format!("{text}: not HOST:PORT that resolves ({e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.ip().is_loopback())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("{text}: the name resolves to no address"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !args.addr.ip().is_loopback() {
        if !args.allow_remote {
            anyhow::bail!(
                "--addr {}: not a loopback address; the server has no authentication, pass \
                 --allow-remote to listen there anyway",
                args.addr
            );
        }
        eprintln!(
            "WARNING: listening on {} (not loopback) with no authentication: anyone who can \
             reach it can use this machine's compute",
            args.addr
        );
    }
    let options = LoadOptions {
        camera_encoder: args.camera_encoder,
        ..args.device.options()?
    };
    let model = args.model.load_for_results(&options)?;
    let config = model.config();
    let known_poses_refusal = known_poses_refusal(&args, config)?;
    let model_name = match &args.model.model {
        Some(path) => path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into(),
        ),
        None => "builtin".to_owned(),
    };
    let (queue, jobs) = sync_channel::<Job>(args.queue as usize);
    let metrics = Arc::new(Metrics::default());
    let workers = start_workers(&model, args.workers as usize, jobs, &metrics)?;
    let max_connections = connections::connection_cap(args.max_connections as usize);
    let shared = Arc::new(Shared {
        queue,
        metrics: Arc::clone(&metrics),
        model_name,
        preset: config.name.clone(),
        device: model.device().name(),
        has_pose: config.cam_dim.is_some(),
        has_sky: config.head.sky,
        has_confidence: config.head.kind == da3::da3::HeadKind::DualDpt,
        timeout: args.timeout,
        max_upload_bytes: args.max_upload_bytes,
        max_views: args.max_views as usize,
        known_poses_refusal,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("listening on {}", args.addr))?;
        let bound = listener.local_addr()?;
        outln!("listening on http://{bound}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        let app = router(shared, args.body_timeout);
        let limits = connections::Limits {
            header_timeout: args.header_timeout,
            max_connections,
        };
        connections::serve(listener, app, limits, metrics, shutdown_signal()).await;
        anyhow::Ok(())
    })?;
    // Ends the tasks of connections that are done but not yet dropped, so that every copy of
    // the router (and with it the queue's sender) is gone: workers finish and return.
    drop(runtime);
    for worker in workers {
        let _ = worker.join();
    }
    log::info!("shut down cleanly");
    Ok(ExitCode::SUCCESS)
}

/// Why this server will refuse known poses (`None`: it takes them); an error for
/// `--camera-encoder` with a model that cannot use it.
fn known_poses_refusal(args: &Args, config: &Config) -> anyhow::Result<Option<String>> {
    // The metric model takes known poses for their intrinsics (its metres' focal length).
    if config.is_metric() {
        return Ok(None);
    }
    if config.cam_dim.is_none() {
        let reason = format!(
            "model {} takes no known poses: it has no camera decoder (DualDPT models and the \
             metric model do)",
            config.name
        );
        if args.camera_encoder {
            anyhow::bail!("--camera-encoder: {reason}");
        }
        return Ok(Some(reason));
    }
    if !args.camera_encoder {
        return Ok(Some(
            "known poses need the model's camera encoder, which this server did not load: \
             start it with --camera-encoder"
                .to_owned(),
        ));
    }
    // The built-in model has one; a file converted by an older release may not.
    if let Some(path) = &args.model.model {
        let file = da3::gguf::GgufFile::open(path)
            .map_err(da3::Error::from)
            .with_context(|| format!("loading model {}", path.display()))?;
        if file.tensor(CAMERA_ENCODER_PROBE).is_none() {
            anyhow::bail!(
                "--camera-encoder: {} has no camera encoder (`cam_enc.*` tensors); convert the \
                 checkpoint again with `da3 convert`",
                path.display()
            );
        }
    }
    Ok(None)
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(0.001..=86400.0).contains(&seconds) {
        return Err(format!("{seconds} s: must be from 0.001 to 86400"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            log::warn!("cannot watch for SIGTERM ({e})");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    log::info!("signal received: finishing requests in flight");
}

/// Starts `n` workers, each making its own session; returns once every one is ready (or the
/// first error).
fn start_workers(
    model: &Model,
    n: usize,
    jobs: Receiver<Job>,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let jobs = Arc::new(Mutex::new(jobs));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
    let mut handles = Vec::new();
    for i in 0..n {
        let model = model.clone();
        let jobs = Arc::clone(&jobs);
        let ready = ready_tx.clone();
        let metrics = Arc::clone(metrics);
        let handle = std::thread::Builder::new()
            .name(format!("da3-worker-{i}"))
            .spawn(move || worker(model, jobs, &metrics, ready))
            .context("starting a worker thread")?;
        handles.push(handle);
    }
    drop(ready_tx);
    for _ in 0..n {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("creating a session: {e}"),
            Err(_) => anyhow::bail!("a worker thread died while creating its session"),
        }
    }
    Ok(handles)
}

fn worker(
    model: Model,
    jobs: Arc<Mutex<Receiver<Job>>>,
    metrics: &Metrics,
    ready: std::sync::mpsc::Sender<Result<(), String>>,
) {
    let mut session = match model.session() {
        Ok(s) => {
            let _ = ready.send(Ok(()));
            s
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return;
        }
    };
    drop(ready);
    loop {
        let job = {
            let Ok(jobs) = jobs.lock() else { return };
            match jobs.recv() {
                Ok(job) => job,
                Err(_) => return, // the server is gone
            }
        };
        metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        if job.abandoned() {
            continue; // timed out while waiting
        }
        metrics.jobs_in_flight.fetch_add(1, Ordering::Relaxed);
        // Out of flight before the answer goes, so that a client reading /metrics after its
        // answer sees the job done.
        match job {
            Job::Images(job) => {
                let result = compute_images(&model, &mut session, &job);
                metrics.jobs_in_flight.fetch_sub(1, Ordering::Relaxed);
                let _ = job.reply.send(result);
            }
            Job::Scene(job) => {
                let result = scene::compute(&model, &mut session, &job);
                metrics.jobs_in_flight.fetch_sub(1, Ordering::Relaxed);
                let _ = job.reply.send(result);
            }
        }
    }
}

/// A computation that panicked: the session it ran on was replaced.
struct Panicked;

/// Runs `request` on the worker's session. A panic inside is caught (the server goes on) and
/// the session replaced, since its state is then unknown.
fn run_guarded(
    model: &Model,
    session: &mut da3::Session,
    request: &da3::Request<'_>,
) -> Result<Result<da3::Output, da3::Error>, Panicked> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| session.run(request)));
    outcome.map_err(|_| {
        log::error!("inference panicked; replacing the worker's session");
        if let Ok(fresh) = model.session() {
            *session = fresh;
        }
        Panicked
    })
}

/// `/v1/depth`: every image on its own, in order; the first failure ends the job.
fn compute_images(
    model: &Model,
    session: &mut da3::Session,
    job: &ImagesJob,
) -> Result<Vec<Prediction>, ApiError> {
    let mut predictions = Vec::with_capacity(job.images.len());
    for (i, image) in job.images.iter().enumerate() {
        // The name the glb gives the camera (as before the request API: not the upload's).
        let request = da3::Request::image(image).names(["image.png"]);
        let request = match job.process_res {
            Some(res) => request.process_res(res),
            None => request,
        };
        match run_guarded(model, session, &request) {
            Ok(Ok(output)) => {
                let prediction = output.into_single().map_err(|e| {
                    ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("image {}: {e}", i + 1),
                    )
                })?;
                predictions.push(prediction);
            }
            Ok(Err(e)) => {
                let status = match e {
                    da3::Error::Preprocess(_) => StatusCode::UNPROCESSABLE_ENTITY,
                    _ => StatusCode::INTERNAL_SERVER_ERROR,
                };
                return Err(ApiError::new(status, format!("image {}: {e}", i + 1)));
            }
            Err(Panicked) => {
                return Err(ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("image {}: internal error during inference", i + 1),
                ))
            }
        }
    }
    Ok(predictions)
}

fn router(shared: AppState, body_timeout: Duration) -> Router {
    let limit = shared.max_upload_bytes;
    Router::new()
        .route("/", get(index))
        .route("/viewer.js", get(viewer_js))
        .route("/healthz", get(healthz))
        .route("/v1/models", get(models))
        .route("/v1/depth", post(depth))
        .route("/v1/scene", post(scene::scene))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            body_timeout,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            record,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
            },
        ))
        .with_state(shared)
}

/// The metrics' name for a request path (a fixed set: unknown paths are `other`).
fn path_label(path: &str) -> &'static str {
    match path {
        "/" => "/",
        "/healthz" => "/healthz",
        "/v1/models" => "/v1/models",
        "/v1/depth" => "/v1/depth",
        "/v1/scene" => "/v1/scene",
        "/metrics" => "/metrics",
        "/openapi.json" => "/openapi.json",
        "/viewer.js" => "/viewer.js",
        _ => "other",
    }
}

async fn record(State(shared): State<AppState>, request: Request, next: Next) -> Response {
    let label = path_label(request.uri().path());
    let start = Instant::now();
    let m = &shared.metrics;
    m.http_in_flight.fetch_add(1, Ordering::Relaxed);
    let response = next.run(request).await;
    m.http_in_flight.fetch_sub(1, Ordering::Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    *m.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry((label, response.status().as_u16()))
        .or_default() += 1;
    let mut latency = m.latency.lock().unwrap_or_else(|e| e.into_inner());
    let entry = latency.entry(label).or_default();
    if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
        entry.0[i] += 1;
    }
    entry.1 += seconds;
    entry.2 += 1;
    response
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such endpoint (see /openapi.json)",
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this endpoint (see /openapi.json)",
    )
}

async fn index() -> Html<&'static str> {
    Html(include_str!("serve/index.html"))
}

async fn viewer_js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        da3::export::VIEWER_JS,
    )
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(shared): State<AppState>) -> Json<Value> {
    Json(json!({"models": [{
        "name": shared.model_name,
        "preset": shared.preset,
        "device": shared.device,
        "pose": shared.has_pose,
        "sky": shared.has_sky,
        "confidence": shared.has_confidence,
        "known_poses": shared.known_poses_refusal.is_none(),
    }]}))
}

async fn openapi() -> Json<Value> {
    Json(api::openapi())
}

async fn metrics(State(shared): State<AppState>) -> impl IntoResponse {
    use std::fmt::Write as _;
    let m = &shared.metrics;
    let mut out = String::new();
    out.push_str("# HELP da3_http_requests_total HTTP requests answered, by path and status.\n");
    out.push_str("# TYPE da3_http_requests_total counter\n");
    for ((path, status), n) in m.requests.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        let _ = writeln!(
            out,
            "da3_http_requests_total{{path=\"{path}\",status=\"{status}\"}} {n}"
        );
    }
    out.push_str("# HELP da3_http_request_duration_seconds Time to answer, by path.\n");
    out.push_str("# TYPE da3_http_request_duration_seconds histogram\n");
    for (path, (buckets, sum, count)) in m.latency.lock().unwrap_or_else(|e| e.into_inner()).iter()
    {
        let mut cumulative = 0;
        for (bound, n) in BUCKETS.iter().zip(buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "da3_http_request_duration_seconds_bucket{{path=\"{path}\",le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "da3_http_request_duration_seconds_bucket{{path=\"{path}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "da3_http_request_duration_seconds_sum{{path=\"{path}\"}} {sum}"
        );
        let _ = writeln!(
            out,
            "da3_http_request_duration_seconds_count{{path=\"{path}\"}} {count}"
        );
    }
    for (name, help, value) in [
        (
            "da3_queue_depth",
            "Depth requests waiting for a worker.",
            &m.queue_depth,
        ),
        (
            "da3_jobs_in_flight",
            "Depth requests being computed.",
            &m.jobs_in_flight,
        ),
        (
            "da3_http_requests_in_flight",
            "HTTP requests being answered.",
            &m.http_in_flight,
        ),
        (
            "da3_http_connections_open",
            "Client connections open.",
            &m.connections_open,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
            value.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP da3_http_connections_shed_total Connections closed to make room for new ones.\n\
         # TYPE da3_http_connections_shed_total counter\n\
         da3_http_connections_shed_total {}",
        m.connections_shed.load(Ordering::Relaxed)
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}

impl From<form::FormError> for ApiError {
    fn from(e: form::FormError) -> ApiError {
        ApiError::new(e.status, e.message)
    }
}

/// 413 for a request whose declared length is over the limit, before its body is read.
fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(form::too_large(limit).into());
    }
    Ok(())
}

/// What the server allows and its model answers, for reading a form.
fn form_rules(shared: &Shared) -> form::Rules<'_> {
    form::Rules {
        max_upload_bytes: shared.max_upload_bytes,
        max_views: shared.max_views,
        preset: &shared.preset,
        has_pose: shared.has_pose,
        has_sky: shared.has_sky,
        has_confidence: shared.has_confidence,
    }
}

/// Decodes the uploads (CPU work: off the async threads), each checked as [`decode`] does;
/// `labels[i]` names upload `i` in errors.
async fn decode_all(
    files: Vec<(Option<String>, axum::body::Bytes)>,
    labels: Vec<String>,
    process_res: Option<usize>,
) -> Result<Vec<RgbImage8>, ApiError> {
    tokio::task::spawn_blocking(move || {
        files
            .iter()
            .zip(&labels)
            .map(|((_, bytes), label)| decode(label, bytes, process_res))
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error decoding"))?
}

/// How errors name upload `index` (from 0): `image N`, with its file name when it has one.
fn upload_label(index: usize, file_name: Option<&str>) -> String {
    match file_name {
        Some(name) => format!("image {} ({name:?})", index + 1),
        None => format!("image {}", index + 1),
    }
}

/// Queues `job` for a worker and waits for the answer that comes through `answer`: 503 with
/// `Retry-After` when the queue is full, 504 past `--timeout`.
async fn submit<T>(
    shared: &Shared,
    job: Job,
    answer: oneshot::Receiver<Result<T, ApiError>>,
) -> Result<T, ApiError> {
    shared.metrics.queue_depth.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = shared.queue.try_send(job) {
        shared.metrics.queue_depth.fetch_sub(1, Ordering::Relaxed);
        let message = match e {
            TrySendError::Full(_) => "the server is busy (queue full); retry later",
            TrySendError::Disconnected(_) => "the server is shutting down",
        };
        return Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        });
    }
    match tokio::time::timeout(shared.timeout, answer).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the worker stopped before answering",
        )),
        Err(_) => Err(ApiError::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "no result within the limit of {} s",
                shared.timeout.as_secs_f64()
            ),
        )),
    }
}

async fn depth(
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
        ..
    } = form::read(multipart.map_err(form::rejected)?, &form_rules(&shared)).await?;
    // The whole body is in: from here the client only waits for the answer.
    let _busy = connection.map(|Extension(c)| c.busy());
    let names: Vec<Option<String>> = files.iter().map(|(n, _)| n.clone()).collect();
    let labels = (names.iter().enumerate())
        .map(|(i, name)| upload_label(i, name.as_deref()))
        .collect();
    let images = Arc::new(decode_all(files, labels, process_res).await?);

    let (reply, answer) = oneshot::channel();
    let job = Job::Images(ImagesJob {
        images: Arc::clone(&images),
        process_res,
        reply,
    });
    let predictions = submit(&shared, job, answer).await?;
    let model = shared.model_name.clone();
    let body = tokio::task::spawn_blocking(move || {
        let images = predictions
            .iter()
            .zip(&names)
            .map(|(p, name)| encode::encode(p, name.as_deref(), &outputs))
            .collect::<Result<Vec<_>, ApiError>>()?;
        Ok::<_, ApiError>(json!({"model": model, "images": images}))
    })
    .await
    .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal error encoding"))??;
    Ok(Json(body))
}

/// Decodes one upload and checks that it can be processed at `process_res`; errors name it
/// by `label`.
fn decode(label: &str, bytes: &[u8], process_res: Option<usize>) -> Result<RgbImage8, ApiError> {
    let image = decode_image(bytes).map_err(|e| {
        let status = match e {
            PreprocessError::ImageTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, format!("{label}: {e}"))
    })?;
    let res = process_res.unwrap_or(da3::DEFAULT_PROCESS_RES);
    da3::Request::image(&image)
        .processed_plans(res)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("{label}: {e}")))?;
    Ok(image)
}
