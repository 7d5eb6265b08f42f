//! `da3 serve`'s page in a real browser: headless Chromium, driven through chromedriver's
//! WebDriver HTTP API (loopback only), uploads the test photo, waits for the colourised depth
//! and the 3D view, checks that the canvas shows points (not a blank background) and saves a
//! screenshot (`serve-page.png` in Cargo's target tmp folder).
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them); without them the
//! test fails, naming what to install.

use base64::Engine as _;
use serde_json::{json, Value};
use std::io::BufRead;
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

#[test]
fn page_uploads_a_photo_and_shows_depth_and_the_point_cloud() {
    let chromium = on_path("chromium")
        .or_else(|| on_path("chromium-browser"))
        .expect("chromium is not installed: apt-get install chromium chromium-driver");
    let chromedriver = on_path("chromedriver")
        .expect("chromedriver is not installed: apt-get install chromium-driver");

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

    let port = free_port();
    let driver = Killed(
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
    let s = |rest: &str| format!("/session/{id}{rest}");
    let run = |script: &str| {
        d.call(
            "POST",
            &s("/execute/sync"),
            Some(json!({"script": script, "args": []})),
        )
    };

    d.call("POST", &s("/url"), Some(json!({"url": addr})));
    // The file input is hidden behind the drop zone: show it, then type the photo's path.
    run("document.getElementById('file').hidden = false;");
    let input = d.call(
        "POST",
        &s("/element"),
        Some(json!({"using": "css selector", "value": "#file"})),
    );
    let element = input
        .as_object()
        .and_then(|o| o.values().next())
        .and_then(Value::as_str)
        .expect("the file input")
        .to_owned();
    let photo = std::fs::canonicalize(IMAGE).unwrap();
    d.call(
        "POST",
        &s(&format!("/element/{element}/value")),
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

    let png = base64::engine::general_purpose::STANDARD
        .decode(d.call("GET", &s("/screenshot"), None).as_str().unwrap())
        .unwrap();
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-page.png");
    std::fs::write(&shot, &png).unwrap();
    eprintln!("screenshot: {}", shot.display());
    d.call("DELETE", &s(""), None);
    drop(driver);

    // The canvas area of the screenshot: many pixels away from its dark background.
    let image = image::load_from_memory(&png).unwrap().to_rgb8();
    let rect: Vec<u32> = facts["rect"]
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
    let background = [23i32, 25, 31]; // the viewer's clear colour (0.09, 0.1, 0.12)
    let mut lit = 0;
    for y in y0..y1 {
        for x in x0..x1 {
            let p = image.get_pixel(x, y).0;
            let far = (0..3).any(|k| (p[k] as i32 - background[k]).abs() > 40);
            lit += far as usize;
        }
    }
    assert!(
        lit > 2000,
        "the 3D view looks blank: {lit} lit pixels in the canvas ({})",
        shot.display()
    );
}
