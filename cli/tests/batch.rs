//! `da3 batch` (folders, globs, corrupt inputs, Ctrl-C, video through ffmpeg, several
//! devices) and the map/export flags of `da3 depth`, end to end on the built-in model.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{da3_in, RpcServer};

fn png(path: &Path, w: u32, h: u32, seed: u8) {
    let img = image::RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            (x * 7) as u8 ^ seed,
            (y * 5) as u8,
            seed.wrapping_mul(31) ^ (x + y) as u8,
        ])
    });
    img.save(path).unwrap();
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn summary(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// A PFM's size and values (rows as stored, bottom to top).
fn read_pfm(path: &Path) -> (usize, usize, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let mut lines = bytes.splitn(4, |&b| b == b'\n');
    assert_eq!(lines.next().unwrap(), b"Pf");
    let size = std::str::from_utf8(lines.next().unwrap()).unwrap();
    let (w, h) = size.split_once(' ').unwrap();
    let (w, h): (usize, usize) = (w.parse().unwrap(), h.parse().unwrap());
    assert_eq!(lines.next().unwrap(), b"-1.0");
    let data = lines.next().unwrap();
    assert_eq!(data.len(), w * h * 4, "{}: truncated", path.display());
    let values = data
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    (w, h, values)
}

#[test]
fn a_corrupt_image_in_the_middle_is_reported_and_skipped_and_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    png(&inputs.join("a.png"), 60, 40, 1);
    // Garbage with an image extension, sorted between the good ones.
    std::fs::write(inputs.join("b.png"), b"\x89PNG\r\n\x1a\nnot really").unwrap();
    png(&inputs.join("c.png"), 40, 60, 2);
    std::fs::write(inputs.join("notes.txt"), b"not an image, not taken").unwrap();
    let out = dir.path().join("out");
    let run = da3_in(
        dir.path(),
        &[
            "batch",
            "in",
            "--out-dir",
            "out",
            "--outputs",
            "pfm,png,png16,conf,ply,npz",
            "--process-res",
            "56",
            "--device",
            "cpu",
        ],
    );
    assert_eq!(run.code, Some(1), "{}", run.context());
    assert!(run.stderr.contains("b.png"), "{}", run.context());
    assert!(!run.stderr.contains("panicked"), "{}", run.context());
    let mut expected: Vec<String> = ["a", "c"]
        .iter()
        .flat_map(|s| {
            [".pfm", ".png", ".depth16.png", ".conf.pfm", ".ply", ".npz"].map(|e| format!("{s}{e}"))
        })
        .collect();
    expected.push("summary.json".into());
    expected.sort();
    assert_eq!(names_in(&out), expected, "{}", run.context());
    let summary = summary(&out);
    assert_eq!(summary["ok"], 2);
    assert_eq!(summary["failed"], 1);
    let results = summary["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[1]["status"], "failed");
    assert!(results[1]["input"].as_str().unwrap().ends_with("b.png"));
    assert!(!results[1]["error"].as_str().unwrap().is_empty());
    for (i, name) in [(0, "a.png"), (2, "c.png")] {
        assert_eq!(results[i]["status"], "ok");
        assert!(results[i]["input"].as_str().unwrap().ends_with(name));
        assert_eq!(results[i]["outputs"].as_array().unwrap().len(), 6);
    }

    // One session reused over the batch gives what a fresh `da3 depth` run gives.
    let single = da3_in(
        dir.path(),
        &[
            "depth",
            "--input",
            "in/c.png",
            "--process-res",
            "56",
            "--device",
            "cpu",
            "--pfm",
            "c.pfm",
        ],
    );
    assert_eq!(single.code, Some(0), "{}", single.context());
    assert_eq!(
        std::fs::read(dir.path().join("c.pfm")).unwrap(),
        std::fs::read(out.join("c.pfm")).unwrap()
    );
}

/// A folder gives every image format da3 reads; its other files are named in a warning and in
/// the summary; the summary names the device `auto` resolved to.
#[test]
fn folders_give_every_readable_format_and_name_what_they_skip() {
    let dir = tempfile::tempdir().unwrap();
    let shots = dir.path().join("shots");
    std::fs::create_dir(&shots).unwrap();
    png(&shots.join("a.png"), 30, 20, 1);
    let webp = image::RgbImage::from_fn(30, 20, |x, y| image::Rgb([x as u8 * 8, y as u8 * 9, 7]));
    webp.save(shots.join("b.webp")).unwrap();
    webp.save(shots.join("c.bmp")).unwrap();
    std::fs::write(shots.join("notes.txt"), "not an image").unwrap();
    std::fs::write(shots.join("raw.cr2"), "a raw file").unwrap();
    let run = da3_in(
        dir.path(),
        &[
            "batch",
            "shots",
            "--out-dir",
            "o",
            "--process-res",
            "42",
            "--threads",
            "2",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(
        run.stderr.contains("notes.txt: not an image format"),
        "{}",
        run.context()
    );
    let s = summary(&dir.path().join("o"));
    assert_eq!(s["ok"], 3, "{s}");
    assert_eq!(
        s["skipped"],
        serde_json::json!(["shots/notes.txt", "shots/raw.cr2"]),
        "{s}"
    );
    assert_eq!(s["devices"], serde_json::json!(["CPU"]), "{s}");
    assert_eq!(s["results"][0]["device"], "CPU", "{s}");
}

#[test]
fn globs_files_and_duplicates_exit_0_with_outputs_named_after_inputs() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    png(&dir.path().join("x.png"), 30, 30, 3);
    png(&dir.path().join("y.png"), 30, 20, 4);
    png(&dir.path().join("sub/x.png"), 20, 30, 5);
    let run = da3_in(
        dir.path(),
        &[
            "batch",
            "*.png",
            "x.png",
            "sub/x.png",
            "--out-dir",
            "o",
            "--outputs",
            "png16,glb",
            "--process-res",
            "42",
            "--device",
            "cpu",
            "--colormap",
            "viridis",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        names_in(&dir.path().join("o")),
        [
            "summary.json",
            "x-2.depth16.png",
            "x-2.glb",
            "x.depth16.png",
            "x.glb",
            "y.depth16.png",
            "y.glb"
        ],
        "{}",
        run.context()
    );
    let results = summary(&dir.path().join("o"))["results"].clone();
    let inputs: Vec<&str> = results
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["input"].as_str().unwrap())
        .collect();
    assert_eq!(inputs, ["x.png", "y.png", "sub/x.png"]);
    let d16 = image::open(dir.path().join("o/y.depth16.png")).unwrap();
    assert_eq!(d16.color(), image::ColorType::L16);
}

#[test]
fn depth_writes_every_export_and_resizes_maps_to_the_input() {
    let dir = tempfile::tempdir().unwrap();
    png(&dir.path().join("p.png"), 70, 50, 5);
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--input",
            "p.png",
            "--process-res",
            "56",
            "--device",
            "cpu",
            "--pfm",
            "d.pfm",
            "--conf",
            "c.pfm",
            "--png16",
            "d16.png",
            "--resize-to-input",
            "--ply",
            "p.ply",
            "--glb",
            "p.glb",
            "--npz",
            "p.npz",
            "--colmap",
            "col",
            "--png",
            "d.png",
            "--colormap",
            "inferno",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let (w, h, resized) = read_pfm(&dir.path().join("d.pfm"));
    assert_eq!((w, h), (70, 50), "the PFM is at the input's size");
    let (cw, ch, _) = read_pfm(&dir.path().join("c.pfm"));
    assert_eq!((cw, ch), (70, 50));
    for f in ["d.png", "d16.png"] {
        let d = image::open(dir.path().join(f)).unwrap();
        assert_eq!((d.width(), d.height()), (70, 50), "{f}");
    }
    for f in [
        "p.ply",
        "p.glb",
        "p.npz",
        "col/cameras.txt",
        "col/points3D.bin",
    ] {
        assert!(dir.path().join(f).is_file(), "{f}");
    }
    // COLMAP cameras are at the input's size.
    let cams = std::fs::read_to_string(dir.path().join("col/cameras.txt")).unwrap();
    assert!(cams.contains("1 PINHOLE 70 50 "), "{cams}");

    // The resized map is the processed one (56x40) resampled bilinearly with pixel centres
    // aligned, computed here independently (PFM rows are bottom to top: flip both).
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--input",
            "p.png",
            "--process-res",
            "56",
            "--device",
            "cpu",
            "--pfm",
            "small.pfm",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let (sw, sh, small) = read_pfm(&dir.path().join("small.pfm"));
    let at = |x: usize, y: usize| small[(sh - 1 - y) * sw + x] as f64;
    let mut worst = 0f64;
    for y in 0..h {
        for x in 0..w {
            let sx = ((x as f64 + 0.5) * sw as f64 / w as f64 - 0.5).clamp(0.0, (sw - 1) as f64);
            let sy = ((y as f64 + 0.5) * sh as f64 / h as f64 - 0.5).clamp(0.0, (sh - 1) as f64);
            let (x0, y0) = (sx.floor() as usize, sy.floor() as usize);
            let (x1, y1) = ((x0 + 1).min(sw - 1), (y0 + 1).min(sh - 1));
            let (fx, fy) = (sx - x0 as f64, sy - y0 as f64);
            let want = at(x0, y0) * (1.0 - fx) * (1.0 - fy)
                + at(x1, y0) * fx * (1.0 - fy)
                + at(x0, y1) * (1.0 - fx) * fy
                + at(x1, y1) * fx * fy;
            let got = resized[(h - 1 - y) * w + x] as f64;
            worst = worst.max((got - want).abs() / want.abs().max(1e-6));
        }
    }
    assert!(worst < 1e-5, "bilinear resize off by {worst:e} (relative)");
}

#[test]
fn a_scene_writes_per_view_maps_and_one_cloud_of_every_view() {
    let dir = tempfile::tempdir().unwrap();
    png(&dir.path().join("a.png"), 60, 40, 6);
    png(&dir.path().join("b.png"), 60, 40, 7);
    std::fs::create_dir(dir.path().join("s")).unwrap();
    let run = da3_in(
        dir.path(),
        &[
            "depth",
            "--input",
            "a.png",
            "--input",
            "b.png",
            "--out-dir",
            "s",
            "--process-res",
            "56",
            "--device",
            "cpu",
            "--view-maps",
            "pfm,conf,png16",
            "--resize-to-input",
            "--ply",
            "s/scene.ply",
            "--npz",
            "s/scene.npz",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert_eq!(
        names_in(&dir.path().join("s")),
        [
            "poses.json",
            "scene.npz",
            "scene.ply",
            "view0.conf.pfm",
            "view0.depth16.png",
            "view0.pfm",
            "view1.conf.pfm",
            "view1.depth16.png",
            "view1.pfm"
        ],
        "{}",
        run.context()
    );
    assert_eq!(read_pfm(&dir.path().join("s/view1.pfm")).0, 60);
}

#[test]
fn an_interrupted_batch_leaves_no_partial_or_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    for i in 0..40u8 {
        png(&inputs.join(format!("{i:02}.png")), 96, 64, i);
    }
    let out = dir.path().join("out");
    let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args([
            "batch",
            "in",
            "--out-dir",
            "out",
            "--outputs",
            "pfm,png,ply,glb",
            "--process-res",
            "98",
            "--device",
            "cpu",
            "--threads",
            "1",
        ])
        .current_dir(dir.path())
        .env("GGML_NO_BACKTRACE", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.join("01.pfm").exists() {
        assert!(Instant::now() < deadline, "no output within 30 s");
        assert!(child.try_wait().unwrap().is_none(), "the batch ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill(2) on the child's pid, which has not been waited for (still alive).
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let status = child.wait().unwrap();
    assert!(!status.success(), "an interrupted batch is not a success");
    assert!(
        !names_in(&out).contains(&"39.pfm".to_owned()),
        "the batch was not interrupted"
    );
    only_complete_outputs_in(&out, "batch");
}

/// Every file an interrupted run left in `dir` is complete (PFM, PNG, glb, PLY, GGUF, JSON and
/// the stream's text files read back whole), and none is a temporary file.
fn only_complete_outputs_in(dir: &Path, what: &str) {
    let names = names_in(dir);
    assert!(
        names
            .iter()
            .all(|n| !n.starts_with('.') && !n.ends_with(".tmp")),
        "{what}: temporary files left: {names:?}"
    );
    for n in &names {
        let path = dir.join(n);
        if n.ends_with(".pfm") {
            read_pfm(&path);
        } else if n.ends_with(".png") {
            image::open(&path).unwrap_or_else(|e| panic!("{what}: {n}: {e}"));
        } else if n.ends_with(".glb") {
            gltf_ok(&path);
        } else if n.ends_with(".gguf") {
            da3::gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{what}: {n}: {e}"));
        } else if n.ends_with(".json") {
            let text = std::fs::read_to_string(&path).unwrap();
            serde_json::from_str::<serde_json::Value>(&text)
                .unwrap_or_else(|e| panic!("{what}: {n}: {e}"));
        } else if n.ends_with(".txt") {
            // camera_poses.txt and intrinsic.txt: rows of numbers, each row whole.
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.is_empty() || text.ends_with('\n'),
                "{what}: {n} ends mid-row"
            );
            for line in text.lines() {
                let values: Result<Vec<f64>, _> = line.split_whitespace().map(str::parse).collect();
                let values = values.unwrap_or_else(|e| panic!("{what}: {n}: `{line}`: {e}"));
                assert!(
                    matches!(values.len(), 4 | 9 | 12 | 16),
                    "{what}: {n}: `{line}`"
                );
            }
        } else if n.ends_with(".ply") {
            let mut file = std::fs::File::open(&path).unwrap();
            let parser = ply_rs_bw::parser::Parser::<ply_rs_bw::ply::DefaultElement>::new();
            parser
                .read_ply(&mut file)
                .unwrap_or_else(|e| panic!("{what}: {n}: {e}"));
        }
    }
}

/// SIGINT and SIGTERM at spread moments of `da3 batch` and `da3 depth` runs writing every
/// kind of output, and of `da3 quantize`, `da3 convert` and `da3 stream` (a mesh, a cloud,
/// the camera files), with both cores kept busy: whatever the moment, no
/// temporary or partial file is left (the window between creating a temporary file and
/// registering it for the cleanup is closed, and no write starts once the cleanup has run).
#[test]
fn interrupts_at_any_moment_leave_no_temporary_or_partial_file() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in");
    std::fs::create_dir(&inputs).unwrap();
    for i in 0..6u8 {
        png(&inputs.join(format!("{i:02}.png")), 96, 64, i);
    }
    let common = ["--process-res", "98", "--device", "cpu", "--threads", "1"];
    let batch: Vec<&str> = [
        "batch",
        "in",
        "--out-dir",
        "out",
        "--outputs",
        "pfm,png,ply,glb",
    ]
    .into_iter()
    .chain(common)
    .collect();
    let depth: Vec<&str> = [
        "depth",
        "--input",
        "in/00.png",
        "--pfm",
        "out/d.pfm",
        "--png",
        "out/d.png",
        "--png16",
        "out/d16.png",
        "--ply",
        "out/d.ply",
        "--glb",
        "out/d.glb",
        "--npz",
        "out/d.npz",
    ]
    .into_iter()
    .chain(common)
    .collect();
    da3::convert::write_synthetic(
        &dir.path().join("tiny.gguf"),
        &da3::Config::preset("da3-tiny").unwrap(),
        da3::convert::WeightType::F32,
    )
    .unwrap();
    let quantize = vec!["quantize", "tiny.gguf", "out/tiny-q4_k.gguf", "q4_k"];
    common::write_checkpoint(
        &dir.path().join("checkpoint"),
        Some(r#"{"model_name": "da3-tiny"}"#),
        &common::official_entries("da3-tiny", &[]),
        safetensors::Dtype::F32,
    );
    let convert = vec![
        "convert",
        "checkpoint",
        "-o",
        "out/converted.gguf",
        "--type",
        "q8_0",
    ];
    // The first SIGINT asks a stream to finish with the frames read: whole files, or none.
    let stream: Vec<&str> = [
        "stream",
        "in",
        "--out-dir",
        "out",
        "--window",
        "3",
        "--overlap",
        "1",
        "--mesh",
    ]
    .into_iter()
    .chain(common)
    .collect();
    let busy = Arc::new(AtomicBool::new(true));
    let loops: Vec<_> = (0..2)
        .map(|_| {
            let busy = busy.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while busy.load(Ordering::Relaxed) {
                    x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
                }
            })
        })
        .collect();
    let run = |args: &[&str]| {
        let out = dir.path().join("out");
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir(&out).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_da3"))
            .args(args)
            .current_dir(dir.path())
            .env("GGML_NO_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        (child, out)
    };
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for (name, args) in [
        ("batch", &batch),
        ("depth", &depth),
        ("quantize", &quantize),
        ("convert", &convert),
        ("stream", &stream),
    ] {
        // One whole run sets the span the interrupts are spread over.
        let started = Instant::now();
        let (mut child, out) = run(args);
        assert!(child.wait().unwrap().success(), "{name} without interrupts");
        let span = started.elapsed();
        assert!(!names_in(&out).is_empty(), "{name} wrote nothing");
        only_complete_outputs_in(&out, name);
        for i in 0..40u32 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = span.mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64);
            let signal = if i % 2 == 0 {
                libc::SIGINT
            } else {
                libc::SIGTERM
            };
            let (mut child, out) = run(args);
            std::thread::sleep(at);
            // SAFETY: kill(2) on the child's pid, which has not been waited for.
            unsafe { libc::kill(child.id() as i32, signal) };
            child.wait().unwrap();
            only_complete_outputs_in(&out, &format!("{name}, signal {signal} after {at:?}"));
        }
    }
    busy.store(false, Ordering::Relaxed);
    loops.into_iter().for_each(|l| l.join().unwrap());
}

/// A glb's header says its full length.
fn gltf_ok(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"glTF");
    let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    assert_eq!(len, bytes.len(), "{}: truncated", path.display());
}

/// A 1 s, 10 fps, 64x48 test-pattern clip made by ffmpeg (which CI installs: .ci/run).
fn clip(path: &Path) {
    let status = Command::new("ffmpeg")
        .args([
            "-nostdin",
            "-loglevel",
            "error",
            "-f",
            "lavfi",
            "-i",
            "testsrc=size=64x48:rate=10",
            "-t",
            "1",
            "-pix_fmt",
            "yuv420p",
        ])
        .arg(path)
        .status()
        .expect("ffmpeg must be installed for this test (.ci/run installs it)");
    assert!(status.success());
}

#[test]
fn a_video_goes_through_as_frames_at_the_asked_rate() {
    let dir = tempfile::tempdir().unwrap();
    clip(&dir.path().join("clip.mp4"));
    png(&dir.path().join("still.png"), 40, 30, 9);
    let run = da3_in(
        dir.path(),
        &[
            "batch",
            "--input",
            "clip.mp4",
            "--input",
            "still.png",
            "--fps",
            "4",
            "--out-dir",
            "o",
            "--outputs",
            "pfm",
            "--process-res",
            "42",
            "--device",
            "cpu",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let names = names_in(&dir.path().join("o"));
    assert_eq!(
        names,
        [
            "clip-000000.pfm",
            "clip-000001.pfm",
            "clip-000002.pfm",
            "clip-000003.pfm",
            "still.pfm",
            "summary.json"
        ],
        "{}",
        run.context()
    );
    let s = summary(&dir.path().join("o"));
    let results = s["results"].as_array().unwrap();
    assert_eq!(results[2]["frame"], 2);
    assert_eq!(results[2]["time"], 0.5);
    assert_eq!(results[4]["input"], "still.png");
    // 64x48 at 42 -> 42x28 (patch multiples).
    assert_eq!(read_pfm(&dir.path().join("o/clip-000003.pfm")).0, 42);
}

/// A batch interrupted while it computes a video's frames leaves no frames folder behind (the
/// folder is removed by the signal handler, as the temporary files of outputs are).
#[cfg(unix)]
#[test]
fn an_interrupted_video_batch_leaves_no_frames_folder() {
    let dir = tempfile::tempdir().unwrap();
    clip(&dir.path().join("clip.mp4"));
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    for signal in [libc::SIGINT, libc::SIGTERM] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
            .args(["batch", "clip.mp4", "--fps", "10", "--out-dir", "o"])
            .args(["--process-res", "504", "--device", "cpu", "--threads", "1"])
            .current_dir(dir.path())
            .env("TMPDIR", &tmp)
            .env("GGML_NO_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Wait for the frames: the folder exists and holds the first one.
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        let frames = loop {
            let found = std::fs::read_dir(&tmp)
                .unwrap()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.to_string_lossy().contains("da3-frames."));
            if let Some(dir) = found.filter(|d| names_in(d).iter().any(|n| !n.is_empty())) {
                break dir;
            }
            assert!(Instant::now() < deadline, "no frames folder within 60 s");
            assert!(child.try_wait().unwrap().is_none(), "the batch ended first");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        // SAFETY: kill(2) on the child's pid, which has not been waited for.
        unsafe { libc::kill(child.id() as i32, signal) };
        child.wait().unwrap();
        assert!(
            !frames.exists(),
            "signal {signal}: {} left",
            frames.display()
        );
        assert_eq!(names_in(&tmp), Vec::<String>::new(), "signal {signal}");
    }
}

#[test]
fn a_video_without_ffmpeg_is_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("clip.mp4"), b"any bytes").unwrap();
    png(&dir.path().join("still.png"), 40, 30, 9);
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args([
            "batch",
            "clip.mp4",
            "still.png",
            "--out-dir",
            "o",
            "--process-res",
            "42",
            "--device",
            "cpu",
        ])
        .current_dir(dir.path())
        .env("PATH", empty.path())
        .env("GGML_NO_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("clip.mp4") && stderr.contains("`ffmpeg` program, which is not on PATH"),
        "{stderr}"
    );
    // `da3 depth` points to `da3 batch` for videos.
    let depth = da3_in(
        dir.path(),
        &["depth", "--input", "clip.mp4", "--device", "cpu"],
    );
    assert_eq!(depth.code, Some(1), "{}", depth.context());
    assert!(
        depth.stderr.contains("da3 batch --input clip.mp4"),
        "{}",
        depth.context()
    );
    // The still image is computed all the same.
    assert!(dir.path().join("o/still.png").is_file(), "{stderr}");
    let s = summary(&dir.path().join("o"));
    assert_eq!(s["results"][0]["status"], "failed");
    assert!(s["results"][0]["error"]
        .as_str()
        .unwrap()
        .contains("ffmpeg"));
}

fn batch_on(dir: &Path, devices: &str, out: &str) -> (serde_json::Value, Vec<Vec<u8>>) {
    let run = da3_in(
        dir,
        &[
            "batch",
            "in",
            "--out-dir",
            out,
            "--outputs",
            "pfm",
            "--process-res",
            "42",
            "--device",
            devices,
            "--threads",
            "1",
        ],
    );
    assert_eq!(run.code, Some(0), "{devices}: {}", run.context());
    let s = summary(&dir.join(out));
    let pfms = (0..8)
        .map(|i| std::fs::read(dir.join(out).join(format!("{i}.pfm"))).unwrap())
        .collect();
    (s, pfms)
}

#[test]
fn several_devices_share_a_batch_and_give_the_single_device_results_in_order() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    for i in 0..8u8 {
        png(&dir.path().join(format!("in/{i}.png")), 42, 28, 10 + i);
    }
    let (a, b) = (RpcServer::start(), RpcServer::start());
    let (ra, rb) = (a.device(), b.device());
    let (one, one_pfm) = batch_on(dir.path(), &ra, "one");
    let (two, two_pfm) = batch_on(dir.path(), &format!("{ra},{rb}"), "two");
    // The same kernels (ggml's, in both servers): the same bytes.
    assert_eq!(one_pfm, two_pfm);
    let order = |s: &serde_json::Value| -> Vec<PathBuf> {
        s["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| PathBuf::from(r["input"].as_str().unwrap()))
            .collect()
    };
    let expected: Vec<PathBuf> = (0..8)
        .map(|i| PathBuf::from(format!("in/{i}.png")))
        .collect();
    assert_eq!(order(&one), expected);
    assert_eq!(order(&two), expected);
    let used: std::collections::HashSet<&str> = two["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect();
    assert_eq!(used.len(), 2, "both servers took images: {two}");
    assert_eq!(two["devices"], serde_json::json!([ra, rb]));

    // The local CPU (this crate's kernels) with both servers: equal to a CPU-only run to
    // float rounding, in input order.
    let (cpu, cpu_pfm) = batch_on(dir.path(), "cpu", "cpu");
    let (mixed, mixed_pfm) = batch_on(dir.path(), &format!("cpu,{ra},{rb}"), "mixed");
    assert_eq!(order(&cpu), expected);
    assert_eq!(order(&mixed), expected);
    for (x, y) in cpu_pfm.iter().zip(&mixed_pfm) {
        let (x, y) = (&x[x.len() - 42 * 28 * 4..], &y[y.len() - 42 * 28 * 4..]);
        for (p, q) in x.chunks(4).zip(y.chunks(4)) {
            let (p, q) = (
                f32::from_le_bytes(p.try_into().unwrap()),
                f32::from_le_bytes(q.try_into().unwrap()),
            );
            assert!((p - q).abs() <= 1e-4 * p.abs().max(1.0), "{p} vs {q}");
        }
    }
}
