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
        bail!(
            "ffmpeg could not decode {} ({}): {}",
            video.display(),
            output.status,
            stderr_tail(&output.stderr)
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

/// The last three lines of ffmpeg's standard error, joined: what it says about a failure.
fn stderr_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let tail: Vec<&str> = text.lines().rev().take(3).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

/// Frames per second of the videos `da3` writes (the official novel-view videos' rate).
pub const VIDEO_FPS: u32 = 24;

/// Fails unless the `ffmpeg` program runs: checked before computing anything a video would
/// be made of. `flag` names the option that needs it.
pub fn check_ffmpeg(flag: &str) -> anyhow::Result<()> {
    match Command::new("ffmpeg")
        .arg("-version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => bail!("{flag}: `ffmpeg -version` failed ({status})"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "{flag}: encoding a video needs the `ffmpeg` program, which is not on PATH \
             (install it, e.g. `apt-get install ffmpeg` or `brew install ffmpeg`)"
        ),
        Err(e) => Err(e).context("starting ffmpeg"),
    }
}

/// Encodes `frames` (RGB8, `width x height` each, made one at a time) as an H.264 MP4 at
/// [`VIDEO_FPS`] into `path`: ffmpeg writes into a temporary folder (removed on Ctrl-C), and
/// the finished file is written into place atomically, so `path` is never half-written.
pub fn encode_mp4(
    path: &Path,
    width: usize,
    height: usize,
    frames: impl Iterator<Item = anyhow::Result<Vec<u8>>>,
) -> anyhow::Result<usize> {
    use std::io::Write as _;
    let scratch = da3::atomic_file::TemporaryDir::new("da3-video-")
        .context("creating a temporary folder for the video")?;
    let encoded = scratch.path().join("video.mp4");
    let mut child = Command::new("ffmpeg")
        .args([
            "-hide_banner",
            "-loglevel",
            "error",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
        ])
        .args([
            "-s",
            &format!("{width}x{height}"),
            "-r",
            &VIDEO_FPS.to_string(),
            "-i",
            "-",
        ])
        // yuv420p (what players take) needs even sides.
        .args([
            "-vf",
            "pad=ceil(iw/2)*2:ceil(ih/2)*2",
            "-c:v",
            "libx264",
            "-pix_fmt",
        ])
        .args(["yuv420p", "-crf", "18", "-movflags", "+faststart"])
        .arg(&encoded)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting ffmpeg")?;
    let mut stdin = child.stdin.take().expect("piped");
    let mut count = 0;
    let mut failure = None;
    for frame in frames {
        let written = frame.and_then(|f| {
            if f.len() != width * height * 3 {
                bail!("a frame of {} bytes for {width}x{height}", f.len());
            }
            stdin.write_all(&f).context("sending a frame to ffmpeg")
        });
        if let Err(e) = written {
            failure = Some(e);
            break;
        }
        count += 1;
    }
    drop(stdin);
    let output = child.wait_with_output().context("waiting for ffmpeg")?;
    if let Some(e) = failure {
        if output.status.success() {
            return Err(e);
        }
    }
    if !output.status.success() {
        bail!(
            "ffmpeg could not encode {} ({}): {}",
            path.display(),
            output.status,
            stderr_tail(&output.stderr)
        );
    }
    let mut source = std::fs::File::open(&encoded).context("reading ffmpeg's output")?;
    da3::atomic_file::write(path, |w| std::io::copy(&mut source, w).map(|_| ()))?;
    Ok(count)
}
