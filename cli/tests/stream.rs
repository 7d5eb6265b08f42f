//! `da3 stream` on the built-in model (synthetic weights: the geometry means nothing, the
//! pipeline and its files are real): a folder, a video, the files in the official layout,
//! bad input, and Ctrl-C finishing with whole files.

mod common;

use common::{assert_clean_failure, da3_in, entries};
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

/// `count` frames of a camera panning over a gradient with a moving square.
fn write_frames(dir: &Path, count: usize) {
    std::fs::create_dir_all(dir).unwrap();
    for f in 0..count {
        let img = image::RgbImage::from_fn(84, 56, |x, y| {
            let shifted = x + 3 * f as u32;
            let square = (shifted / 12 + y / 12).is_multiple_of(2);
            image::Rgb([
                (shifted * 3) as u8,
                (y * 4) as u8,
                if square { 200 } else { 40 },
            ])
        });
        img.save(dir.join(format!("frame{f:03}.png"))).unwrap();
    }
}

/// What a `--mesh` run leaves in --out-dir, and nothing else (no temporary file).
const MESH_RUN_FILES: [&str; 6] = [
    "camera_poses.txt",
    "intrinsic.txt",
    "mesh.glb",
    "mesh.ply",
    "pcd",
    "poses.json",
];

fn numbers(line: &str) -> Vec<f64> {
    line.split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect()
}

#[test]
fn a_folder_streams_to_the_official_layout_and_a_mesh() {
    let tmp = tempfile::tempdir().unwrap();
    write_frames(&tmp.path().join("frames"), 10);
    let run = da3_in(
        tmp.path(),
        &[
            "stream",
            "frames",
            "--out-dir",
            "out",
            "--window",
            "4",
            "--overlap",
            "2",
            "--process-res",
            "56",
            "--mesh",
            "--loop-closure",
            "--icp",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(
        run.stdout.contains("10 frames in 4 windows"),
        "{}",
        run.context()
    );
    let out = tmp.path().join("out");
    let poses = std::fs::read_to_string(out.join("camera_poses.txt")).unwrap();
    assert_eq!(poses.lines().count(), 10);
    for line in poses.lines() {
        let m = numbers(line);
        assert_eq!(m.len(), 16);
        assert_eq!(&m[12..], &[0.0, 0.0, 0.0, 1.0]);
        assert!(m.iter().all(|v| v.is_finite()));
    }
    // The first frame is the world's origin.
    let first = numbers(poses.lines().next().unwrap());
    for (i, v) in first.iter().enumerate() {
        let identity = if i % 5 == 0 { 1.0 } else { 0.0 };
        assert!((v - identity).abs() < 1e-4, "{first:?}");
    }
    let intrinsics = std::fs::read_to_string(out.join("intrinsic.txt")).unwrap();
    assert_eq!(intrinsics.lines().count(), 10);
    assert!(intrinsics.lines().all(|l| numbers(l).len() == 4));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("poses.json")).unwrap()).unwrap();
    assert_eq!(json["views"].as_array().unwrap().len(), 10);
    assert_eq!(json["views"][3]["name"], "frame003.png");
    assert_eq!(json["windows"].as_array().unwrap().len(), 4);
    assert!(json["windows"][1]["seam"]["icp"].is_object());
    let ply = std::fs::read(out.join("pcd").join("combined_pcd.ply")).unwrap();
    assert!(ply.starts_with(b"ply\n"));
    assert!(std::fs::read(out.join("mesh.glb"))
        .unwrap()
        .starts_with(b"glTF"));
    assert!(std::fs::read(out.join("mesh.ply"))
        .unwrap()
        .starts_with(b"ply\n"));
    // Nothing else: no temporary file left.
    assert_eq!(entries(&out), MESH_RUN_FILES);
}

#[test]
fn a_video_streams_through_ffmpeg_and_leaves_no_frames() {
    let tmp = tempfile::tempdir().unwrap();
    write_frames(&tmp.path().join("frames"), 6);
    let made = Command::new("ffmpeg")
        .args([
            "-nostdin",
            "-loglevel",
            "error",
            "-framerate",
            "6",
            "-i",
            "frames/frame%03d.png",
        ])
        .args(["-pix_fmt", "yuv420p", "-c:v", "libx264", "clip.mp4"])
        .current_dir(tmp.path())
        .status()
        .expect("ffmpeg is installed for the tests (see README)");
    assert!(made.success());
    let temp_before = da3_temporaries();
    let run = da3_in(
        tmp.path(),
        &[
            "stream",
            "clip.mp4",
            "--fps",
            "6",
            "--out-dir",
            "out",
            "--window",
            "3",
            "--overlap",
            "1",
            "--process-res",
            "56",
            "--max-points",
            "0",
        ],
    );
    assert_eq!(run.code, Some(0), "{}", run.context());
    let poses = std::fs::read_to_string(tmp.path().join("out/camera_poses.txt")).unwrap();
    assert_eq!(poses.lines().count(), 6);
    assert!(!tmp.path().join("out/pcd/combined_pcd.ply").exists());
    assert_eq!(
        da3_temporaries(),
        temp_before,
        "the decoded frames are removed"
    );
}

/// The `da3-frames.*` folders in the temporary directory.
fn da3_temporaries() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("da3-frames."))
        .collect();
    names.sort();
    names
}

#[test]
fn bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    write_frames(&tmp.path().join("frames"), 2);
    std::fs::create_dir(tmp.path().join("empty")).unwrap();
    // A portrait frame among landscape ones.
    write_frames(&tmp.path().join("mixed"), 2);
    image::RgbImage::new(56, 84)
        .save(tmp.path().join("mixed/frame002.png"))
        .unwrap();
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["stream", "frames/frame000.png", "--out-dir", "o"],
            &["one image is not a stream"],
        ),
        (
            &["stream", "nowhere", "--out-dir", "o"],
            &["nowhere", "no such file"],
        ),
        (
            &["stream", "empty", "--out-dir", "o"],
            &["empty", "no frames"],
        ),
        (
            &[
                "stream",
                "frames",
                "--out-dir",
                "o",
                "--window",
                "4",
                "--overlap",
                "4",
            ],
            &["--overlap 4", "--window 4"],
        ),
        (
            &[
                "stream",
                "frames",
                "--out-dir",
                "o",
                "--mesh",
                "--voxel-size",
                "0",
            ],
            &["--voxel-size 0"],
        ),
        (
            &[
                "stream",
                "frames",
                "--out-dir",
                "o",
                "--process-res",
                "5000",
            ],
            &["--process-res 5000"],
        ),
        (&["stream", "clip.mp4", "--out-dir", "o"], &["clip.mp4"]),
        (
            &[
                "stream",
                "mixed",
                "--out-dir",
                "o",
                "--window",
                "3",
                "--overlap",
                "1",
                "--process-res",
                "56",
            ],
            &["frame002.png"],
        ),
    ];
    for (args, parts) in cases {
        let run = da3_in(tmp.path(), args);
        assert_clean_failure(&run, parts);
    }
}

#[test]
fn the_first_ctrl_c_finishes_with_whole_files() {
    let tmp = tempfile::tempdir().unwrap();
    write_frames(&tmp.path().join("frames"), 400);
    let mut child = Command::new(env!("CARGO_BIN_EXE_da3"))
        .args([
            "-v",
            "stream",
            "frames",
            "--out-dir",
            "out",
            "--window",
            "4",
            "--overlap",
            "2",
        ])
        .args(["--process-res", "56", "--mesh"])
        .current_dir(tmp.path())
        .env("GGML_NO_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until two windows are placed, then interrupt once.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    while stderr.read_line(&mut line).unwrap() > 0 {
        seen.push_str(&line);
        if line.contains("window 1 placed") {
            break;
        }
        line.clear();
    }
    assert!(seen.contains("window 1 placed"), "{seen}");
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen}{rest}");
    assert!(rest.contains("interrupted: finishing"), "{rest}");
    let out = tmp.path().join("out");
    let poses = std::fs::read_to_string(out.join("camera_poses.txt")).unwrap();
    let frames = poses.lines().count();
    assert!((6..400).contains(&frames), "{frames} frames written");
    assert!(poses.lines().all(|l| numbers(l).len() == 16));
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("poses.json")).unwrap()).unwrap();
    assert_eq!(json["views"].as_array().unwrap().len(), frames);
    assert_eq!(entries(&out), MESH_RUN_FILES);
}
