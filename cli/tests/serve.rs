//! `da3 serve`: the binary started on a free loopback port with the built-in model, driven over
//! HTTP (ureq), stopped with SIGTERM (the harness: `common/serve.rs`).

mod common;

use base64::Engine as _;
use common::serve::{
    assert_error, assert_json_close, bits, f32s, multipart, pfm_top_down, Server, BOUNDARY,
};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IMAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/peer/test-640x480.png"
);

fn png() -> Vec<u8> {
    std::fs::read(IMAGE).unwrap()
}

fn library_model() -> da3::Model {
    let file = da3::convert::builtin_model_file().unwrap();
    da3::Model::from_gguf(&file, &da3::LoadOptions::default()).unwrap()
}

#[test]
fn service_endpoints() {
    let server = Server::start(&[]);
    let (status, ct, body) = server.get("/healthz");
    assert_eq!((status, ct.as_str()), (200, "application/json"));
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "ok"
    );

    let (status, _, body) = server.get("/v1/models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&body).unwrap();
    let model = &models["models"][0];
    assert_eq!(model["name"], "builtin");
    assert_eq!(model["preset"], "da3-tiny");
    assert!(!model["device"].as_str().unwrap().is_empty());
    // Started without --camera-encoder: /v1/scene takes no known poses.
    assert_eq!(model["known_poses"], false);

    let (status, _, body) = server.get("/openapi.json");
    assert_eq!(status, 200);
    let api: Value = serde_json::from_str(&body).unwrap();
    assert!(api["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/healthz",
        "/v1/models",
        "/v1/depth",
        "/v1/scene",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(api["paths"][path].is_object(), "openapi lacks {path}");
    }
    assert!(api["components"]["schemas"]["Error"].is_object());

    let (status, ct, body) = server.get("/");
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(body.contains("/v1/depth"));

    let (status, _, body) = server.get("/no/such/thing");
    assert_eq!(status, 404);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["code"], 404);

    // One depth request and one error, then the counters show them.
    let (status, _) = server.depth(&[("image", Some("a.png"), &png())]);
    assert_eq!(status, 200);
    let (status, _) = server.depth(&[("image", Some("a.txt"), b"hello")]);
    assert_eq!(status, 422);
    let (status, ct, text) = server.get("/metrics");
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/plain"), "{ct}");
    for line in [
        "da3_http_requests_total{path=\"/v1/depth\",status=\"200\"} 1",
        "da3_http_requests_total{path=\"/v1/depth\",status=\"422\"} 1",
        "da3_http_requests_total{path=\"/healthz\",status=\"200\"} 1",
        "da3_http_requests_total{path=\"other\",status=\"404\"} 1",
        "da3_http_request_duration_seconds_count{path=\"/v1/depth\"} 2",
        "da3_http_request_duration_seconds_bucket{path=\"/v1/depth\",le=\"+Inf\"} 2",
        "da3_queue_depth 0",
        "da3_jobs_in_flight 0",
        "da3_http_requests_in_flight 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "metrics lack {line:?}:\n{text}"
        );
    }
    server.stop();
}

#[test]
fn depth_equals_the_library_bit_for_bit() {
    let server = Server::start(&[]);
    let bytes = png();
    let (status, json) = server.depth(&[
        ("outputs", None, b"depth_f32,depth_png,confidence_f32,pose"),
        ("image", Some("test-640x480.png"), &bytes),
    ]);
    assert_eq!(status, 200, "{json}");

    let image = da3::preprocess::decode_image(&bytes).unwrap();
    let model = library_model();
    let mut session = model.session().unwrap();
    let expected = session.predict(&image).unwrap();

    let result = &json["images"][0];
    assert_eq!(json["images"].as_array().unwrap().len(), 1);
    assert_eq!(result["filename"], "test-640x480.png");
    assert_eq!(
        (
            result["input_width"].as_u64(),
            result["input_height"].as_u64()
        ),
        (Some(640), Some(480))
    );
    assert_eq!(result["width"].as_u64().unwrap() as usize, expected.width);
    assert_eq!(result["height"].as_u64().unwrap() as usize, expected.height);
    let depth = f32s(&result["outputs"]["depth_f32"]);
    assert_eq!(bits(&depth), bits(&expected.depth));
    let confidence = f32s(&result["outputs"]["confidence_f32"]);
    assert_eq!(
        bits(&confidence),
        bits(expected.confidence.as_ref().unwrap())
    );
    let (lo, hi) = expected.depth_range();
    assert_eq!(result["depth_min"].as_f64().unwrap() as f32, lo);
    assert_eq!(result["depth_max"].as_f64().unwrap() as f32, hi);
    let pose = expected
        .pose
        .as_ref()
        .expect("da3-tiny has a camera decoder");
    let k: Vec<Vec<f32>> = serde_json::from_value(result["pose"]["intrinsics"].clone()).unwrap();
    assert_eq!(k[0][0], pose.intrinsics[0][0]);
    assert_eq!(k[1][2], pose.intrinsics[1][2]);
    let e: Vec<Vec<f32>> = serde_json::from_value(result["pose"]["extrinsics"].clone()).unwrap();
    assert_eq!((e.len(), e[0].len()), (3, 4));
    assert_eq!(e[2][3], pose.extrinsics[2][3]);
    // The PNG is a PNG of the map's size.
    let png = base64::engine::general_purpose::STANDARD
        .decode(result["outputs"]["depth_png"].as_str().unwrap())
        .unwrap();
    let decoded = image::load_from_memory_with_format(&png, image::ImageFormat::Png).unwrap();
    assert_eq!(
        (decoded.width() as usize, decoded.height() as usize),
        (expected.width, expected.height)
    );

    // process_res, and two views in one request, in order.
    let (status, json) = server.depth(&[
        ("process_res", None, b"280"),
        ("outputs", None, b"depth_f32"),
        ("image", Some("one.png"), &bytes),
        ("image", Some("two.png"), &bytes),
    ]);
    assert_eq!(status, 200, "{json}");
    let expected = session
        .run(&da3::Request::image(&image).process_res(280))
        .unwrap()
        .into_single()
        .unwrap();
    let images = json["images"].as_array().unwrap();
    assert_eq!(images.len(), 2);
    assert_eq!(images[1]["filename"], "two.png");
    for result in images {
        assert_eq!(result["width"].as_u64().unwrap() as usize, expected.width);
        assert_eq!(
            bits(&f32s(&result["outputs"]["depth_f32"])),
            bits(&expected.depth)
        );
    }
    server.stop();
}

#[test]
fn bad_requests_get_json_errors() {
    let server = Server::start(&["--max-upload-bytes", "1000000", "--max-views", "2"]);
    let bytes = png();
    assert_error(
        server.depth(&[("image", Some("x.png"), b"not an image at all")]),
        422,
        "image 1",
    );
    assert_error(
        server.depth(&[("image", Some("x.png"), &bytes[..bytes.len() / 2])]),
        422,
        "cannot decode",
    );
    assert_error(
        server.depth(&[("outputs", None, b"depth_png")]),
        400,
        "no `image` field",
    );
    assert_error(server.depth(&[]), 400, "no `image` field");
    assert_error(
        server.depth(&[("photo", Some("x.png"), &bytes)]),
        400,
        "unknown form field \"photo\"",
    );
    assert_error(
        server.depth(&[
            ("image", None, &bytes),
            ("image", None, &bytes),
            ("image", None, &bytes),
        ]),
        413,
        "more than 2 images",
    );
    assert_error(
        server.depth(&[("image", None, &bytes), ("outputs", None, b"depth,normals")]),
        400,
        "unknown output \"depth\"",
    );
    assert_error(
        server.depth(&[("image", None, &bytes), ("outputs", None, b"sky_f32")]),
        422,
        "no sky_f32",
    );
    assert_error(
        server.depth(&[("image", None, &bytes), ("process_res", None, b"big")]),
        422,
        "process_res",
    );
    assert_error(
        server.depth(&[("image", None, &bytes), ("process_res", None, b"4096")]),
        422,
        "2048",
    );
    // Over the byte limit: a declared length over it is refused before the body is read.
    let (ct, _) = multipart(&[]);
    let answer = server.raw(&format!(
        "POST /v1/depth HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nContent-Length: 1000001\r\n\r\n"
    ).into_bytes());
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("\"code\":413") && answer.contains("limit of 1000000 bytes"),
        "{answer}"
    );
    // Without a declared length (chunked), the limit stops the reading.
    let mut chunked = format!(
        "POST /v1/depth HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).into_bytes();
    let (_, body) = multipart(&[("image", Some("x.png"), &vec![0u8; 1_000_100])]);
    write!(chunked, "{:x}\r\n", body.len()).unwrap();
    chunked.extend_from_slice(&body);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let answer = server.raw(&chunked);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("limit of 1000000 bytes"), "{answer}");
    // Multipart that is not: no boundary, a body without parts, a body cut off mid-file.
    assert_error(server.post("multipart/form-data", b"x"), 400, "multipart");
    assert_error(server.post("application/json", b"{}"), 400, "multipart");
    assert_error(
        server.post(
            &format!("multipart/form-data; boundary={BOUNDARY}"),
            b"garbage without parts",
        ),
        400,
        "malformed multipart",
    );
    let (ct, body) = multipart(&[("image", Some("x.png"), &bytes)]);
    assert_error(
        server.post(&ct, &body[..body.len() / 2]),
        400,
        "malformed multipart",
    );
    // A connection that ends before its declared length.
    let mut request = format!(
        "POST /v1/depth HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body[..body.len() / 2]);
    let answer = server.raw(&request);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("\"code\":400"), "{answer}");
    // Wrong method.
    let mut r = server.agent.get(server.url("/v1/depth")).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let json: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(json["code"], 405);
    // And after all that the server still answers.
    assert_eq!(server.depth(&[("image", None, &bytes)]).0, 200);
    server.stop();
}

#[test]
fn concurrent_requests_equal_sequential() {
    let server = Server::start(&["--workers", "2", "--queue", "16"]);
    let bytes = png();
    let request = |res: &str| {
        server.depth(&[
            ("outputs", None, b"depth_f32"),
            ("process_res", None, res.as_bytes()),
            ("image", None, &bytes),
        ])
    };
    let resolutions = ["140", "196", "252", "280", "140", "196", "252", "280"];
    let sequential: Vec<Vec<u32>> = resolutions
        .iter()
        .map(|r| {
            let (status, json) = request(r);
            assert_eq!(status, 200, "{json}");
            bits(&f32s(&json["images"][0]["outputs"]["depth_f32"]))
        })
        .collect();
    let concurrent: Vec<Vec<u32>> = std::thread::scope(|s| {
        let handles: Vec<_> = resolutions.iter().map(|r| s.spawn(|| request(r))).collect();
        handles
            .into_iter()
            .map(|h| {
                let (status, json) = h.join().unwrap();
                assert_eq!(status, 200, "{json}");
                bits(&f32s(&json["images"][0]["outputs"]["depth_f32"]))
            })
            .collect()
    });
    assert_eq!(concurrent, sequential);
    assert_ne!(sequential[0].len(), sequential[1].len());
    server.stop();
}

/// `--addr` takes a host name (`localhost` listens on loopback), and the answer's pose has the
/// keys of `da3 depth`'s poses.json.
#[test]
fn a_host_name_listens_and_poses_use_the_cli_keys() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["-q", "serve", "--addr", "localhost:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let addr: std::net::SocketAddr = line
        .trim()
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    assert!(addr.ip().is_loopback(), "{addr}");

    let server = Server::start(&[]);
    let (status, json) = server.depth(&[
        ("process_res", None, b"56"),
        ("image", Some("p.png"), &png()),
    ]);
    assert_eq!(status, 200, "{json}");
    let pose = &json["images"][0]["pose"];
    assert_eq!(
        pose["extrinsics_world_to_camera"], pose["extrinsics"],
        "{pose}"
    );
    assert_eq!(
        pose["extrinsics_world_to_camera"].as_array().unwrap().len(),
        3
    );
    server.stop();
}

#[test]
fn non_loopback_needs_allow_remote() {
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["serve", "--addr", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--allow-remote"), "{stderr}");
}

#[test]
fn full_queue_answers_503_with_retry_after() {
    // One worker, one waiting place: of 6 requests sent at once at most 2 are taken (one
    // computing, one queued) until the first finishes, which takes far longer than sending.
    let server = Server::start(&["--workers", "1", "--queue", "1"]);
    let bytes = png();
    let answers: Vec<(u16, Option<String>, Value)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    server
                        .depth_with_retry(&[("process_res", None, b"504"), ("image", None, &bytes)])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|a| a.0 == 200).count();
    let busy: Vec<_> = answers.iter().filter(|a| a.0 == 503).collect();
    assert_eq!(
        ok + busy.len(),
        answers.len(),
        "only 200 and 503: {answers:?}"
    );
    assert!(ok >= 1, "{answers:?}");
    assert!(
        !busy.is_empty(),
        "some request found the queue full: {answers:?}"
    );
    for (_, retry, json) in &busy {
        let seconds: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
        assert!(seconds >= 1);
        assert_error((503, json.clone()), 503, "queue full");
    }
    let (_, _, metrics) = server.get("/metrics");
    assert!(metrics.contains(&format!(
        "da3_http_requests_total{{path=\"/v1/depth\",status=\"503\"}} {}",
        busy.len()
    )));
    server.stop();
}

#[test]
fn slow_request_answers_504() {
    let server = Server::start(&["--timeout", "0.05"]);
    let bytes = png();
    let answer = server.depth(&[("process_res", None, b"504"), ("image", None, &bytes)]);
    assert_error(answer, 504, "no result within the limit of 0.05 s");
    // The server goes on: the worker finishes the abandoned job and takes the next.
    let (status, _, _) = server.get("/healthz");
    assert_eq!(status, 200);
    server.wait_for_metric("da3_jobs_in_flight 0");
    let (_, _, metrics) = server.get("/metrics");
    assert!(
        metrics.contains("da3_http_requests_total{path=\"/v1/depth\",status=\"504\"} 1"),
        "{metrics}"
    );
    server.stop();
}

#[test]
fn sigterm_finishes_the_request_in_flight() {
    let server = Server::start(&[]);
    let bytes = png();
    std::thread::scope(|s| {
        let request = s.spawn(|| {
            server.depth(&[
                ("outputs", None, b"depth_f32"),
                ("process_res", None, b"504"),
                ("image", None, &bytes),
            ])
        });
        server.wait_for_metric("da3_jobs_in_flight 1");
        // SIGTERM while the job computes: the answer still comes, then the server exits 0.
        let child = server.child.as_ref().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
        let (status, json) = request.join().unwrap();
        assert_eq!(status, 200, "{json}");
        let result = &json["images"][0];
        let n = (result["width"].as_u64().unwrap() * result["height"].as_u64().unwrap()) as usize;
        assert_eq!(f32s(&result["outputs"]["depth_f32"]).len(), n);
    });
    // Stopped: no new connections are taken.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut server = server;
    let mut child = server.child.take().unwrap();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "after SIGTERM: {status:?}");
            break;
        }
        assert!(Instant::now() < deadline, "did not exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(std::net::TcpStream::connect(&server.addr).is_err());
}

#[test]
fn point_cloud_outputs_equal_the_library_exports() {
    let server = Server::start(&[]);
    let bytes = png();
    let (status, json) = server.depth(&[
        ("outputs", None, b"points,ply,glb"),
        ("process_res", None, b"280"),
        ("image", Some("photo.png"), &bytes),
    ]);
    assert_eq!(status, 200, "{json}");
    let outputs = &json["images"][0]["outputs"];
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap())
            .unwrap()
    };

    // The library's cloud of the same prediction, written by the same writers.
    let image = da3::preprocess::decode_image(&bytes).unwrap();
    let model = library_model();
    let prediction = model
        .session()
        .unwrap()
        .run(&da3::Request::image(&image).process_res(280))
        .unwrap()
        .into_single()
        .unwrap();
    let processed = da3::preprocess::preprocess(&image, 280).unwrap();
    let pose = prediction.pose.expect("the built-in model predicts a pose");
    let views = [da3::export::View::with_pose(&prediction, &processed.rgb8, pose).unwrap()];
    let cloud = da3::export::point_cloud(&views, &da3::export::CloudOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ply = dir.path().join("c.ply");
    da3::export::write_ply(&ply, &cloud).unwrap();
    assert_eq!(b64(&outputs["ply"]), std::fs::read(&ply).unwrap());
    let glb = dir.path().join("c.glb");
    let glb_options = da3::export::GlbOptions::default();
    da3::export::write_glb(&glb, &cloud, &views, &glb_options).unwrap();
    assert_eq!(b64(&outputs["glb"]), std::fs::read(&glb).unwrap());

    let points = &outputs["points"];
    assert_eq!(points["format"], "da3-viewer-1");
    assert_eq!(points["points"].as_u64().unwrap() as usize, cloud.len());
    assert_eq!(points["cameras"], 1);
    let scene = da3::export::ViewerScene::new(&cloud, &views, &glb_options).unwrap();
    assert_eq!(*points, scene.to_json(200_000));

    // The page's viewer code is served.
    let (status, ct, js) = server.get("/viewer.js");
    assert_eq!(status, 200);
    assert!(ct.starts_with("text/javascript"), "{ct}");
    assert!(js.contains("function da3Viewer("));
    server.stop();
}

/// Opens a connection and sends a request head announcing a 100 kB upload and the start of its
/// first multipart field, then nothing more.
fn stalled_upload(addr: &str) -> std::net::TcpStream {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "POST /v1/depth HTTP/1.1\r\nHost: {addr}\r\n\
         Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\
         Content-Length: 100000\r\n\r\n\
         --{BOUNDARY}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"a.png\"\r\n\r\n"
    )
    .unwrap();
    stream
}

#[test]
fn stalled_uploads_beyond_the_open_files_limit_do_not_starve_others() {
    // More stalled uploads than the server may open files: without a connection cap, accept
    // fails (EMFILE) for everyone until they leave. The timeouts are long so that only the cap
    // (closing the connection that has waited longest on its client) can make room.
    const OPEN_FILES: u32 = 256;
    const STALLED: usize = 300;
    let server = Server::start_with_open_files(
        OPEN_FILES,
        &["--header-timeout", "60", "--body-timeout", "60"],
    );
    let stalled: Vec<_> = (0..STALLED).map(|_| stalled_upload(&server.addr)).collect();
    // Let the server take in the stalled connections from its listen queue first.
    std::thread::sleep(Duration::from_millis(500));

    let start = Instant::now();
    let (status, _, _) = server.get("/healthz");
    let healthz = start.elapsed();
    assert_eq!(status, 200);
    let start = Instant::now();
    let (status, json) = server.depth(&[("process_res", None, b"56"), ("image", None, &png())]);
    let depth = start.elapsed();
    assert_eq!(status, 200, "{json}");
    eprintln!(
        "with {STALLED} stalled uploads and {OPEN_FILES} open files: /healthz answered in \
         {healthz:?}, /v1/depth (process_res 56) in {depth:?}"
    );
    // Timed tests are flaky on shared machines: a generous bound (measured: well under 1 s).
    assert!(healthz < Duration::from_secs(5), "{healthz:?}");

    let (_, _, metrics) = server.get("/metrics");
    let value = |name: &str| -> u64 {
        let line = metrics.lines().find(|l| l.starts_with(name)).unwrap();
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let open = value("da3_http_connections_open ");
    let shed = value("da3_http_connections_shed_total ");
    eprintln!("connections open {open}, closed to make room {shed}");
    assert!(open < OPEN_FILES as u64, "{metrics}");
    assert!(shed as usize > STALLED - OPEN_FILES as usize, "{metrics}");
    drop(stalled);
    server.stop();
}

#[test]
fn stalled_upload_answers_408_after_the_body_timeout() {
    let server = Server::start(&["--body-timeout", "0.5"]);
    let mut stream = stalled_upload(&server.addr);
    let start = Instant::now();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let waited = start.elapsed();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"code\":408"), "{answer}");
    assert!(answer.contains("the upload stalled"), "{answer}");
    assert!(
        (Duration::from_millis(400)..Duration::from_secs(10)).contains(&waited),
        "{waited:?}"
    );
    server.stop();
}

#[test]
fn stalled_request_head_is_closed_after_the_header_timeout() {
    let server = Server::start(&["--header-timeout", "0.5"]);
    let mut stream = std::net::TcpStream::connect(&server.addr).unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let start = Instant::now();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let waited = start.elapsed();
    assert!(
        (Duration::from_millis(400)..Duration::from_secs(10)).contains(&waited),
        "{waited:?}"
    );
    // A complete request on a new connection is answered.
    let (status, _, _) = server.get("/healthz");
    assert_eq!(status, 200);
    server.stop();
}

/// The views of `cli/tests/scene.rs`'s scene: one processed size, and the official code picks
/// view 2 as the reference (saddle_balanced).
const SCENE_VIEWS: [(usize, usize); 3] = [(600, 225), (680, 255), (640, 240)];

/// Where and how both the server and `da3 depth` compute in the scene tests, so that their
/// numbers can be compared.
const SCENE_DEVICE: [&str; 4] = ["--device", "cpu", "--threads", "2"];

/// The scene's synthetic images written as `in0.png`, `in1.png`, ... in `dir`: (name, bytes).
fn scene_images(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    SCENE_VIEWS
        .iter()
        .enumerate()
        .map(|(i, &(w, h))| {
            let pixels = da3::synthetic::image(w, h);
            let name = format!("in{i}.png");
            let path = dir.join(&name);
            image::RgbImage::from_raw(w as u32, h as u32, pixels.data)
                .unwrap()
                .save(&path)
                .unwrap();
            (name, std::fs::read(&path).unwrap())
        })
        .collect()
}

/// The multipart parts of one `image` part per scene image, then `fields` (last: a field the
/// server refuses is then read after the whole upload has been sent, so the client does not
/// meet a closed connection while still sending).
fn scene_parts<'a>(
    fields: &[(&'a str, &'a [u8])],
    images: &'a [(String, Vec<u8>)],
) -> Vec<(&'a str, Option<&'a str>, &'a [u8])> {
    let mut parts: Vec<(&str, Option<&str>, &[u8])> = (images.iter())
        .map(|(name, bytes)| ("image", Some(name.as_str()), bytes.as_slice()))
        .collect();
    parts.extend(fields.iter().map(|&(name, value)| (name, None, value)));
    parts
}

/// `da3 depth` on the scene's images in `dir` at process resolution 112, into `dir/OUT` with
/// `extra` flags; its poses.json.
fn cli_scene(dir: &std::path::Path, out: &str, extra: &[&str]) -> Value {
    std::fs::create_dir(dir.join(out)).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_da3"));
    command
        .current_dir(dir)
        .env("GGML_NO_BACKTRACE", "1")
        .args(["-q", "depth", "--process-res", "112", "--out-dir", out]);
    for i in 0..SCENE_VIEWS.len() {
        command.args(["--input", &format!("in{i}.png")]);
    }
    let run = command.args(SCENE_DEVICE).args(extra).output().unwrap();
    assert!(
        run.status.success(),
        "da3 depth: {:?}\n{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    serde_json::from_slice(&std::fs::read(dir.join(out).join("poses.json")).unwrap()).unwrap()
}

#[test]
fn a_scene_answers_what_da3_depth_writes() {
    let dir = tempfile::tempdir().unwrap();
    let images = scene_images(dir.path());
    let written = cli_scene(
        dir.path(),
        "out",
        &["--ply", "scene.ply", "--glb", "scene.glb"],
    );
    let server = Server::start(&SCENE_DEVICE);
    let (status, json) = server.scene(&scene_parts(
        &[("process_res", b"112"), ("outputs", b"depth_f32,ply,glb")],
        &images,
    ));
    assert_eq!(status, 200, "{json}");

    // poses.json's keys and values, every view's camera and the reference among them.
    assert_json_close(&written, &json, "scene");
    assert_eq!(json["reference"], 2, "{json}");
    assert_eq!(json["ref_view_strategy"], "saddle_balanced");
    assert_eq!(json["model"], "builtin");
    let views = json["views"].as_array().unwrap();
    assert_eq!(views.len(), SCENE_VIEWS.len());
    for (i, view) in views.iter().enumerate() {
        assert_eq!(view["name"], format!("in{i}.png"));
        assert_eq!(view["reference"], i == 2);
        assert_eq!(view["input_width"], SCENE_VIEWS[i].0);
        assert_eq!(view["input_height"], SCENE_VIEWS[i].1);
        let e = view["extrinsics_world_to_camera"].as_array().unwrap();
        assert_eq!((e.len(), e[0].as_array().unwrap().len()), (3, 4));
        let k = view["intrinsics"].as_array().unwrap();
        assert_eq!(k.len(), 3);
        // The depth the CLI wrote, bit for bit, and its range.
        let depth = f32s(&view["outputs"]["depth_f32"]);
        let cli = pfm_top_down(&dir.path().join(format!("out/view{i}.pfm")));
        assert_eq!(bits(&depth), bits(&cli), "view {i}");
        let lo = depth.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = depth.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(view["depth_min"].as_f64().unwrap() as f32, lo, "view {i}");
        assert_eq!(view["depth_max"].as_f64().unwrap() as f32, hi, "view {i}");
    }
    // The scene's cloud: every view in one, as `da3 depth --ply/--glb` writes it.
    let b64 = |v: &Value| {
        base64::engine::general_purpose::STANDARD
            .decode(v.as_str().expect("a base64 string"))
            .unwrap()
    };
    let ply = std::fs::read(dir.path().join("scene.ply")).unwrap();
    assert_eq!(b64(&json["outputs"]["ply"]), ply);
    let glb = std::fs::read(dir.path().join("scene.glb")).unwrap();
    assert_eq!(b64(&json["outputs"]["glb"]), glb);

    // A reference-view strategy, as `--ref-view`.
    let written = cli_scene(dir.path(), "first", &["--ref-view", "first"]);
    let (status, json) = server.scene(&scene_parts(
        &[("process_res", b"112"), ("ref_view", b"first")],
        &images,
    ));
    assert_eq!(status, 200, "{json}");
    assert_json_close(&written, &json, "ref_view first");
    assert_eq!(json["reference"], 0);
    assert_eq!(json["ref_view_strategy"], "first");

    let (_, _, metrics) = server.get("/metrics");
    assert!(
        metrics.contains("da3_http_requests_total{path=\"/v1/scene\",status=\"200\"} 2"),
        "{metrics}"
    );
    server.stop();
}

/// A camera looking along +z from `centre`, turned by `yaw` degrees about y: world-to-camera
/// rows (as `cli/tests/scene.rs` makes them).
fn camera(yaw: f64, centre: [f64; 3]) -> [[f64; 4]; 3] {
    let a = yaw.to_radians();
    let r = [
        [a.cos(), 0.0, a.sin()],
        [0.0, 1.0, 0.0],
        [-a.sin(), 0.0, a.cos()],
    ];
    let mut e = [[0.0; 4]; 3];
    for i in 0..3 {
        e[i][..3].copy_from_slice(&r[i]);
        e[i][3] = -(0..3).map(|j| r[i][j] * centre[j]).sum::<f64>();
    }
    e
}

/// Asserts that every view of a scene answer has the given extrinsics (within 1e-5).
fn assert_given_cameras(json: &Value, given: &[[[f64; 4]; 3]]) {
    for (i, want) in given.iter().enumerate() {
        let e = &json["views"][i]["extrinsics_world_to_camera"];
        for r in 0..3 {
            for c in 0..4 {
                let got = e[r][c].as_f64().unwrap();
                assert!(
                    (got - want[r][c]).abs() < 1e-5,
                    "view {i} [{r}][{c}]: {got} vs {}",
                    want[r][c]
                );
            }
        }
    }
}

#[test]
fn a_scene_with_known_poses_keeps_them_as_da3_depth_does() {
    let dir = tempfile::tempdir().unwrap();
    let images = scene_images(dir.path());
    let cams = [
        (3.0, [0.1, 0.0, 0.2], 500.0),
        (-5.0, [1.2, 0.1, 0.0], 470.0),
        (7.0, [0.5, 0.8, -0.4], 540.0),
    ];
    let mut given = Vec::new();
    let mut intrinsics = Vec::new();
    let mut named = Vec::new();
    for (i, (&(w, h), &(yaw, centre, f))) in SCENE_VIEWS.iter().zip(&cams).enumerate() {
        let e = camera(yaw, centre);
        let k = [
            [f, 0.0, w as f64 / 2.0 + 1.5],
            [0.0, f, h as f64 / 2.0 - 0.5],
            [0.0, 0.0, 1.0],
        ];
        // Listed in reverse: matched by name.
        named.insert(
            0,
            serde_json::json!({"name": format!("in{i}.png"), "extrinsics": e, "intrinsics": k}),
        );
        given.push(e);
        intrinsics.push(k);
    }
    let poses = serde_json::json!({ "views": named }).to_string();
    std::fs::write(dir.path().join("poses-in.json"), &poses).unwrap();
    let written = cli_scene(dir.path(), "out", &["--poses", "poses-in.json"]);
    assert_eq!(written["known_poses"], true);

    let server = Server::start(&[&SCENE_DEVICE[..], &["--camera-encoder"]].concat());
    let (_, _, models) = server.get("/v1/models");
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["models"][0]["known_poses"], true);
    let (status, json) = server.scene(&scene_parts(
        &[("process_res", b"112"), ("poses", poses.as_bytes())],
        &images,
    ));
    assert_eq!(status, 200, "{json}");
    assert_json_close(&written, &json, "known poses");
    assert_eq!(json["known_poses"], true);
    assert_eq!(json["reference"], 0);
    assert!(json["pose_scale"].as_f64().unwrap() > 0.0, "{json}");
    assert_given_cameras(&json, &given);

    // The answer reads back as `poses` (poses.json's keys; intrinsics of the processed size).
    let again = json.to_string();
    let (status, json) = server.scene(&scene_parts(
        &[("process_res", b"112"), ("poses", again.as_bytes())],
        &images,
    ));
    assert_eq!(status, 200, "{json}");
    assert_given_cameras(&json, &given);

    // Poses that do not fit the images, or that are not cameras, are refused before computing.
    let positional = |n: usize| {
        let views: Vec<Value> = (0..n)
            .map(|i| serde_json::json!({"extrinsics": given[i], "intrinsics": intrinsics[i]}))
            .collect();
        serde_json::json!(views).to_string()
    };
    let unnamed_two = positional(2);
    let mut renamed = named.clone();
    renamed[0]["name"] = "elsewhere.png".into();
    let renamed = serde_json::json!(renamed).to_string();
    for (poses, status, needle) in [
        (unnamed_two.as_str(), 422, "2 camera(s) for 3 view(s)"),
        // `named[0]` is in2's camera.
        (renamed.as_str(), 422, "no camera for `in2.png`"),
        ("{\"views\": [", 422, "poses: not JSON"),
        ("{\"views\": [{}]}", 422, "no `extrinsics`"),
    ] {
        assert_error(
            server.scene(&scene_parts(&[("poses", poses.as_bytes())], &images)),
            status,
            needle,
        );
    }
    assert_error(
        server.scene(&scene_parts(
            &[("poses", positional(3).as_bytes()), ("ref_view", b"middle")],
            &images,
        )),
        422,
        "with known poses view 0 is the reference",
    );
    let twins = [
        images[0].clone(),
        (images[0].0.clone(), images[1].1.clone()),
    ];
    assert_error(
        server.scene(&scene_parts(&[("poses", poses.as_bytes())], &twins)),
        422,
        "both named \"in0.png\"",
    );
    // In order, without names, they are taken as listed.
    let (status, json) = server.scene(&scene_parts(
        &[("process_res", b"112"), ("poses", positional(3).as_bytes())],
        &images,
    ));
    assert_eq!(status, 200, "{json}");
    assert_given_cameras(&json, &given);
    server.stop();
}

#[test]
fn bad_scenes_get_json_errors() {
    let server = Server::start(&["--max-views", "3", "--max-upload-bytes", "3000000"]);
    let dir = tempfile::tempdir().unwrap();
    let images = scene_images(dir.path());
    let one = &images[..1];
    assert_error(
        server.scene(&scene_parts(&[], one)),
        400,
        "a scene needs 2 or more images",
    );
    assert_error(server.scene(&[]), 400, "a scene needs 2 or more images");
    // The fourth part is refused as it starts: a small one, so that the rest of the upload fits
    // the socket's buffers and the client is not cut off while sending it.
    let four = [&images[..], &[("d.png".to_owned(), b"tiny".to_vec())]].concat();
    assert_error(
        server.scene(&scene_parts(&[], &four)),
        413,
        "more than 3 images",
    );
    // An undecodable part is named by its file name.
    let broken = [
        images[0].clone(),
        ("broken.jpg".to_owned(), b"not an image".to_vec()),
    ];
    assert_error(
        server.scene(&scene_parts(&[], &broken)),
        422,
        "image 2 (\"broken.jpg\")",
    );
    // Views that reach different processed sizes cannot be one scene.
    let tall = [images[0].clone(), ("photo.png".to_owned(), png())];
    assert_error(
        server.scene(&scene_parts(&[("process_res", b"112")], &tall)),
        422,
        "one processed size",
    );
    // Known poses need the camera encoder, which this server did not load.
    assert_error(
        server.scene(&scene_parts(&[("poses", b"[]")], &images)),
        422,
        "--camera-encoder",
    );
    for (value, needle) in [
        (
            &b"sideways"[..],
            "unknown reference-view strategy `sideways`",
        ),
        (b"3", "ref_view 3: the scene has 3 views"),
    ] {
        assert_error(
            server.scene(&scene_parts(&[("ref_view", value)], &images)),
            422,
            needle,
        );
    }
    assert_error(
        server.scene(&scene_parts(&[("process_res", b"4096")], &images)),
        422,
        "2048",
    );
    assert_error(
        server.scene(&scene_parts(&[("cameras", b"{}")], &images)),
        400,
        "unknown form field \"cameras\" (expected image, poses, ref_view",
    );
    // /v1/depth takes no scene fields.
    assert_error(
        server.depth(&[("image", None, &png()), ("poses", None, b"[]")]),
        400,
        "unknown form field \"poses\"",
    );
    // The byte limit: refused from the declared length, before the body is read.
    let (ct, _) = multipart(&[]);
    let answer = server.raw(
        format!(
            "POST /v1/scene HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\nContent-Length: 3000001\r\n\r\n"
        )
        .as_bytes(),
    );
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("limit of 3000000 bytes"), "{answer}");
    let mut r = server.agent.get(server.url("/v1/scene")).call().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let json: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(json["code"], 405);
    server.stop();
}
