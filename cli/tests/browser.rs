//! The pages in a real browser: headless Chromium, driven through chromedriver's WebDriver
//! HTTP API (loopback only).
//!
//! - `da3 serve`'s page: uploads the test photo, waits for the colourised depth and the 3D
//!   view, checks that the canvas shows points (not a blank background) and saves a screenshot
//!   (`serve-page.png` in Cargo's target tmp folder).
//! - `da3 view`'s page for a coloured mesh: the mesh's colour, lit, fills the middle of the
//!   canvas and the background shows around it (`view-mesh.png`).
//! - `da3 view`'s page for 3D Gaussians: their colour, splatted, fills the middle
//!   (`view-gaussians.png`).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them); without them the
//! tests fail, naming what to install.

use base64::Engine as _;
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IMAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/peer/test-640x480.png"
);

/// A child process killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn on_path(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Driver {
    agent: ureq::Agent,
    base: String,
}

impl Driver {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}{path}", self.base);
        let mut response = match (method, body) {
            ("GET", _) => self.agent.get(&url).call(),
            ("DELETE", _) => self.agent.delete(&url).call(),
            (_, body) => self
                .agent
                .post(&url)
                .header("Content-Type", "application/json")
                .send(body.unwrap_or(json!({})).to_string()),
        }
        .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .unwrap();
        let value: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(status, 200, "WebDriver {method} {path}: {value}");
        value["value"].clone()
    }
}

/// A headless Chromium session (chromedriver killed on drop).
struct Browser {
    driver: Driver,
    id: String,
    _chromedriver: Killed,
}

impl Browser {
    fn start() -> Browser {
        let chromium = on_path("chromium")
            .or_else(|| on_path("chromium-browser"))
            .expect("chromium is not installed: apt-get install chromium chromium-driver");
        let chromedriver = on_path("chromedriver")
            .expect("chromedriver is not installed: apt-get install chromium-driver");
        let port = free_port();
        let chromedriver = Killed(
            Command::new(&chromedriver)
                .args([format!("--port={port}"), "--allowed-ips=127.0.0.1".into()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let d = Driver {
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .timeout_global(Some(Duration::from_secs(120)))
                .build()
                .new_agent(),
            base: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = d
                .agent
                .get(format!("{}/status", d.base))
                .call()
                .ok()
                .and_then(|mut r| r.body_mut().read_to_string().ok())
                .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                .is_some_and(|v| v["value"]["ready"] == true);
            if ready {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let session = d.call(
            "POST",
            "/session",
            Some(json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                             "--use-angle=swiftshader", "--enable-unsafe-swiftshader",
                             "--window-size=1100,1300", "--force-device-scale-factor=1"]
                }
            }}})),
        );
        let id = session["sessionId"].as_str().expect("a session").to_owned();
        Browser {
            driver: d,
            id,
            _chromedriver: chromedriver,
        }
    }

    fn call(&self, method: &str, rest: &str, body: Option<Value>) -> Value {
        self.driver
            .call(method, &format!("/session/{}{rest}", self.id), body)
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    fn run(&self, script: &str) -> Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
    }

    /// A screenshot of the window, also saved as `name` in Cargo's target tmp folder.
    /// Opens a `da3 view` page looking straight down its -z axis (yaw and pitch 0) and waits
    /// (up to 30 s) for its first frame or an error; returns what the page reports: frames
    /// drawn, triangles and Gaussians, the error and count lines, the canvas's rectangle.
    fn view_head_on(&self, page: &Path) -> Value {
        self.open(&format!("file://{}#yaw=0&pitch=0", page.display()));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let facts = self.run(
                "const canvas = document.getElementById('view'); const r = canvas.getBoundingClientRect(); \
                 return {drawn: Number(canvas.dataset.drawn || 0), \
                         triangles: Number(canvas.dataset.triangles || 0), \
                         gaussians: Number(canvas.dataset.gaussians || 0), \
                         error: document.getElementById('error').textContent, \
                         count: document.getElementById('count').textContent, \
                         rect: [r.left, r.top, r.width, r.height]};",
            );
            if facts["drawn"].as_u64() >= Some(1) || facts["error"] != "" {
                return facts;
            }
            assert!(
                Instant::now() < deadline,
                "the page drew nothing in 30 s: {facts}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn screenshot(&self, name: &str) -> (image::RgbImage, PathBuf) {
        let png = base64::engine::general_purpose::STANDARD
            .decode(self.call("GET", "/screenshot", None).as_str().unwrap())
            .unwrap();
        let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&shot, &png).unwrap();
        eprintln!("screenshot: {}", shot.display());
        (image::load_from_memory(&png).unwrap().to_rgb8(), shot)
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ends Chromium; a failure here would only hide the test's own message.
        let _ = self
            .driver
            .agent
            .delete(format!("{}/session/{}", self.driver.base, self.id))
            .call();
    }
}

/// The viewer's clear colour (0.09, 0.1, 0.12) in 8 bits.
const BACKGROUND: [i32; 3] = [23, 25, 31];

/// The canvas's rectangle in the screenshot, clipped to it: x0, y0, x1, y1.
fn canvas_box(rect: &Value, image: &image::RgbImage) -> (u32, u32, u32, u32) {
    let rect: Vec<u32> = rect
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap().max(0.0) as u32)
        .collect();
    let (x0, y0) = (rect[0], rect[1]);
    let (x1, y1) = (
        (x0 + rect[2]).min(image.width()),
        (y0 + rect[3]).min(image.height()),
    );
    assert!(
        x1 > x0 + 100 && y1 > y0 + 100,
        "canvas {rect:?} off the screenshot"
    );
    (x0, y0, x1, y1)
}

#[test]
fn page_uploads_a_photo_and_shows_depth_and_the_point_cloud() {
    // The server, on a free loopback port, with the built-in model.
    let mut server = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["-q", "serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _server = Killed(server);
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let browser = Browser::start();
    let run = |script: &str| browser.run(script);
    browser.open(&addr);
    // The file input is hidden behind the drop zone: show it, then type the photo's path.
    run("document.getElementById('file').hidden = false;");
    let input = browser.call(
        "POST",
        "/element",
        Some(json!({"using": "css selector", "value": "#file"})),
    );
    let element = input
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .expect("the file input")
        .to_owned();
    let photo = std::fs::canonicalize(IMAGE).unwrap();
    browser.call(
        "POST",
        &format!("/element/{element}/value"),
        Some(json!({"text": photo.to_str().unwrap()})),
    );

    let deadline = Instant::now() + Duration::from_secs(90);
    let state = loop {
        let state = run("const c = document.querySelector('.result'); \
             return c ? [c.dataset.state, c.querySelector('.status').textContent] : null;");
        if state[0] == "done" || state[0] == "error" {
            break state;
        }
        assert!(Instant::now() < deadline, "no result within 90 s: {state}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(state[0], "done", "the page shows an error: {state}");
    // Let the first frame draw.
    std::thread::sleep(Duration::from_millis(300));
    let facts = run(
        "const c = document.querySelector('.result'); const canvas = c.querySelector('canvas'); \
         const r = canvas.getBoundingClientRect(); \
         return {depth: c.querySelector('.depth').naturalWidth, points: Number(canvas.dataset.points), \
                 drawn: Number(canvas.dataset.drawn || 0), \
                 rect: [r.left, r.top, r.width, r.height], \
                 links: Array.from(c.querySelectorAll('.links a')).map(a => a.download)};",
    );
    assert!(facts["depth"].as_u64().unwrap() > 0, "{facts}");
    assert!(facts["points"].as_u64().unwrap() > 1000, "{facts}");
    assert!(facts["drawn"].as_u64().unwrap() >= 1, "{facts}");
    let links: Vec<&str> = facts["links"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for name in [
        "test-640x480.depth.png",
        "test-640x480.ply",
        "test-640x480.glb",
    ] {
        assert!(links.contains(&name), "no download {name}: {links:?}");
    }

    let (image, shot) = browser.screenshot("serve-page.png");
    drop(browser);

    // The canvas area of the screenshot: many pixels away from its dark background.
    let (x0, y0, x1, y1) = canvas_box(&facts["rect"], &image);
    let mut lit = 0;
    for y in y0..y1 {
        for x in x0..x1 {
            let p = image.get_pixel(x, y).0;
            let far = (0..3).any(|k| (p[k] as i32 - BACKGROUND[k]).abs() > 40);
            lit += far as usize;
        }
    }
    assert!(
        lit > 2000,
        "the 3D view looks blank: {lit} lit pixels in the canvas ({})",
        shot.display()
    );
}

/// A PLY grid of `side` x `side` vertices over [-1, 1]^2 on the plane z = `depth` (OpenCV
/// axes: in front of a camera at the origin), every vertex `color`, two triangles per cell.
fn grid_ply(side: u32, depth: f32, color: [u8; 3]) -> Vec<u8> {
    let cells = (side - 1) * (side - 1);
    let mut ply = format!(
        "ply\nformat binary_little_endian 1.0\nelement vertex {}\nproperty float x\n\
         property float y\nproperty float z\nproperty uchar red\nproperty uchar green\n\
         property uchar blue\nelement face {}\nproperty list uchar int vertex_indices\n\
         end_header\n",
        side * side,
        2 * cells
    )
    .into_bytes();
    let at = |i: u32| -1.0 + 2.0 * i as f32 / (side - 1) as f32;
    for row in 0..side {
        for col in 0..side {
            for v in [at(col), at(row), depth] {
                ply.extend_from_slice(&v.to_le_bytes());
            }
            ply.extend_from_slice(&color);
        }
    }
    for row in 0..side - 1 {
        for col in 0..side - 1 {
            let i = row * side + col;
            for t in [[i, i + 1, i + side + 1], [i, i + side + 1, i + side]] {
                ply.push(3);
                for v in t {
                    ply.extend_from_slice(&(v as i32).to_le_bytes());
                }
            }
        }
    }
    ply
}

#[test]
fn view_page_draws_a_lit_coloured_mesh() {
    let dir = tempfile::tempdir().unwrap();
    let ply = dir.path().join("wall.ply");
    let orange = [230u8, 120, 20];
    std::fs::write(&ply, grid_ply(21, 3.0, orange)).unwrap();
    let page = dir.path().join("wall.html");
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["-q", "view", ply.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let browser = Browser::start();
    // Looking straight at the wall (yaw and pitch 0), so it fills the middle of the canvas.
    let facts = browser.view_head_on(&page);
    assert_eq!(facts["error"], "", "{facts}");
    assert_eq!(facts["triangles"], 800, "{facts}");
    assert!(
        facts["count"].as_str().unwrap().contains("800 triangles"),
        "{facts}"
    );
    let (image, shot) = browser.screenshot("view-mesh.png");
    drop(browser);

    let pixel = canvas_pixel(&image, &facts["rect"]);
    // Inside the wall: its colour, shaded by one factor for all three channels, so the hue is
    // the mesh's; and lit: darker than the flat colour, brighter than ambient light alone.
    for (fx, fy) in [
        (0.5, 0.5),
        (0.35, 0.35),
        (0.65, 0.35),
        (0.35, 0.65),
        (0.65, 0.65),
    ] {
        let p = pixel(fx, fy);
        let shade = p[0] as f32 / orange[0] as f32;
        assert!(
            (0.4..=0.98).contains(&shade),
            "pixel at ({fx}, {fy}) is {p:?}, not the lit mesh colour {orange:?} ({})",
            shot.display()
        );
        for k in 1..3 {
            let expected = orange[k] as f32 * shade;
            assert!(
                (p[k] as f32 - expected).abs() <= 8.0,
                "pixel at ({fx}, {fy}) is {p:?}, not a shade of {orange:?} ({})",
                shot.display()
            );
        }
    }
    // Around it (the corners, clear of the text at the top left): the background.
    assert_background_corners(&pixel, &shot);
}

/// The colour at a fraction `(fx, fy)` of the page's canvas (its rectangle `rect`, CSS
/// pixels, as the page reported it) in a screenshot.
fn canvas_pixel<'a>(
    image: &'a image::RgbImage,
    rect: &Value,
) -> impl Fn(f32, f32) -> [i32; 3] + 'a {
    let (x0, y0, x1, y1) = canvas_box(rect, image);
    let (w, h) = (x1 - x0, y1 - y0);
    move |fx, fy| {
        image
            .get_pixel(x0 + (fx * w as f32) as u32, y0 + (fy * h as f32) as u32)
            .0
            .map(i32::from)
    }
}

/// The canvas's corners (clear of the text at the top left) show the page's background.
fn assert_background_corners(pixel: &impl Fn(f32, f32) -> [i32; 3], shot: &Path) {
    for (fx, fy) in [(0.97, 0.03), (0.03, 0.97), (0.97, 0.97)] {
        let p = pixel(fx, fy);
        assert!(
            (0..3).all(|k| (p[k] - BACKGROUND[k]).abs() <= 3),
            "pixel at ({fx}, {fy}) is {p:?}, not the background {BACKGROUND:?} ({})",
            shot.display()
        );
    }
}

/// `da3 view`'s page for a 3DGS PLY file: a wall of overlapping, nearly opaque Gaussians
/// (written by the library's 3DGS writer) splatted head-on shows their colour (0.5 + C0 x
/// f_dc) in the middle of the canvas and the background around it (`view-gaussians.png`).
#[test]
fn view_page_splats_gaussians() {
    let dir = tempfile::tempdir().unwrap();
    let ply = dir.path().join("splats.ply");
    let colour = [0.2f32, 0.8, 0.4];
    let c0 = 0.282_094_8_f32;
    let side = 21;
    let mut g = da3::Gaussians {
        views: 1,
        width: side,
        height: side,
        sh_coefficients: 1,
        ..Default::default()
    };
    for y in 0..side {
        for x in 0..side {
            let at = |i: usize| (i as f32 - (side - 1) as f32 / 2.0) * 0.1;
            g.means.push([at(x), at(y), 3.0]);
            g.scales.push([0.08, 0.08, 0.02]);
            g.rotations.push([1.0, 0.0, 0.0, 0.0]);
            g.harmonics.extend(colour.map(|c| (c - 0.5) / c0));
            g.opacities.push(0.99);
        }
    }
    let depth = vec![3.0f32; side * side];
    let all = da3::export::GaussianPlyOptions {
        prune_border: false,
        max_depth_quantile: None,
        views_interval: 1,
    };
    da3::export::write_gaussian_ply(&ply, &g, &[&depth], &all).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(["-q", "view", ply.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let browser = Browser::start();
    let facts = browser.view_head_on(&dir.path().join("splats.html"));
    assert_eq!(facts["error"], "", "{facts}");
    assert_eq!(facts["gaussians"], (side * side) as u64, "{facts}");
    let (image, shot) = browser.screenshot("view-gaussians.png");
    drop(browser);
    let pixel = canvas_pixel(&image, &facts["rect"]);
    let expected = colour.map(|c| (c * 255.0).round() as i32);
    for (fx, fy) in [(0.5, 0.5), (0.45, 0.45), (0.55, 0.55)] {
        let p = pixel(fx, fy);
        assert!(
            (0..3).all(|k| (p[k] - expected[k]).abs() <= 10),
            "pixel at ({fx}, {fy}) is {p:?}, not the Gaussians' colour {expected:?} ({})",
            shot.display()
        );
    }
    assert_background_corners(&pixel, &shot);
}
