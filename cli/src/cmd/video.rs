//! Video input: frames decoded by the `ffmpeg` program (a child process), as PNG files.

use anyhow::{bail, Context as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// File extensions taken for videos.
pub const VIDEO_EXTENSIONS: &[&str] = &["mp4", "mov", "mkv", "webm", "avi", "m4v"];

pub fn is_video(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| VIDEO_EXTENSIONS.contains(&e.to_string_lossy().to_lowercase().as_str()))
}

/// Decodes `video` at `fps` frames per second into PNG files in `dir` (created), in order.
///
/// # Errors
/// When `ffmpeg` is not on `PATH` (the error says so and how to install it), when it fails
/// (its last lines of stderr quoted), or when it yields no frame.
pub fn extract_frames(video: &Path, fps: f64, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !video.is_file() {
        bail!("{}: no such video file", video.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let output = Command::new("ffmpeg")
        .args(["-nostdin", "-hide_banner", "-loglevel", "error", "-i"])
        .arg(video)
        .args(["-vf", &format!("fps={fps}"), "-f", "image2", "-c:v", "png"])
        .arg(dir.join("%06d.png"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let output = match output {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} is a video: decoding it needs the `ffmpeg` program, which is not on PATH \
             (install it, e.g. `apt-get install ffmpeg` or `brew install ffmpeg`)",
            video.display()
        ),
        Err(e) => return Err(e).context("starting ffmpeg"),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "ffmpeg could not decode {} ({}): {}",
            video.display(),
            output.status,
            tail.join(" / ")
        );
    }
    let mut frames: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    frames.sort();
    if frames.is_empty() {
        bail!("ffmpeg decoded no frame from {}", video.display());
    }
    Ok(frames)
}
