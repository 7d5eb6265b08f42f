//! Hostile and malformed input to the `da3` binary: every case must end with exit code 1 and
//! one clean `Error:` message (no panic, abort or signal), leave nothing in the output folder,
//! and leave device nodes and inputs untouched.

use std::path::{Path, PathBuf};

mod common;

use common::{assert_clean_failure, da3_in, entries, Run};

/// A working folder with an empty `out/` for outputs.
struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("out")).unwrap();
        Case { dir }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn run(&self, args: &[&str]) -> Run {
        da3_in(self.dir.path(), args)
    }
    /// `da3 ARGS` fails cleanly naming `parts`, and `out/` stays empty.
    fn assert_fails(&self, args: &[&str], parts: &[&str]) -> Run {
        let run = self.run(args);
        assert_clean_failure(&run, parts);
        assert_eq!(
            entries(&self.path("out")),
            Vec::<String>::new(),
            "{}",
            run.context()
        );
        run
    }
}

/// `da3 depth` on the built-in model at a small size, with `extra` arguments.
fn depth_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["depth", "--device", "cpu", "--process-res", "112"];
    args.extend_from_slice(extra);
    args
}

// --- outputs -----------------------------------------------------------------------------------

/// Outputs that would surprise: none at all (a run that computes and writes nothing), `-`
/// (not standard output) and a name of another format; all refused before computing.
#[test]
fn no_output_a_dash_and_a_misleading_extension_are_refused() {
    let case = Case::new();
    for (args, parts) in [
        (vec![], vec!["no output asked for", "--png"]),
        (vec!["--png", "-"], vec!["--png -", "standard output"]),
        (
            vec!["--ply", "out/x.glb"],
            vec!["--ply out/x.glb", ".glb name for a ply file"],
        ),
        (
            vec!["--pfm", "out/d.png"],
            vec!["--pfm", ".png name for a pfm file"],
        ),
    ] {
        let run = case.assert_fails(&depth_args(&args), &parts);
        assert!(!run.stdout.contains("depth"), "{}", run.context());
    }
    assert!(!case.path("-").exists());
    case.assert_fails(
        &depth_args(&["--out-dir", "missing/scene"]),
        &["--out-dir missing/scene", "cannot create"],
    );
    // Names of the user's own choosing stay theirs.
    let run = case.run(&depth_args(&["--pfm", "out/depth.float"]));
    assert_eq!(run.code, Some(0), "{}", run.context());
    // A scene's --out-dir is created (its parent must exist).
    let run = case.run(&depth_args(&["--out-dir", "out/scene"]));
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(case.path("out/scene/view0.pfm").is_file());
}

#[cfg(unix)]
#[test]
fn device_nodes_are_refused_and_untouched() {
    use std::os::unix::fs::MetadataExt;
    let case = Case::new();
    for (device, flag, other) in [
        ("/dev/null", "--pfm", ["--png", "out/d.png"]),
        ("/dev/full", "--png", ["--pfm", "out/d.pfm"]),
    ] {
        let Ok(before) = std::fs::metadata(device) else {
            panic!("{device} is missing on this machine");
        };
        let run = case.assert_fails(
            &depth_args(&[other[0], other[1], flag, device]),
            &[flag, device, "character device", "not a regular file"],
        );
        assert!(
            !run.stdout.contains("depth"),
            "refused before computing\n{}",
            run.context()
        );
        let after = std::fs::metadata(device).unwrap();
        assert!(
            after.file_type() == before.file_type() && after.rdev() == before.rdev(),
            "{device} is still the same device node"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_fifo_a_directory_and_a_path_under_a_file_are_refused() {
    let case = Case::new();
    let fifo = case.path("fifo");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo runs");
    assert!(status.success());
    case.assert_fails(&depth_args(&["--pfm", "fifo"]), &["--pfm", "a FIFO"]);
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(
        &std::fs::metadata(&fifo).unwrap().file_type()
    ));
    case.assert_fails(&depth_args(&["--png", "out"]), &["--png", "a directory"]);
    std::fs::write(case.path("notes.txt"), "a file").unwrap();
    case.assert_fails(
        &depth_args(&["--pfm", "notes.txt/d.pfm"]),
        &["notes.txt/d.pfm", "not a folder"],
    );
    case.assert_fails(
        &depth_args(&["--pfm", "out/d.pfm", "--png", "no-such-folder/d.png"]),
        &["--png", "no-such-folder", "does not exist"],
    );
    assert_eq!(entries(case.dir.path()), ["fifo", "notes.txt", "out"]);
}

#[cfg(unix)]
#[test]
fn a_symbolic_link_is_not_followed_or_replaced() {
    let case = Case::new();
    std::fs::write(case.path("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink(case.path("precious"), case.path("out/d.pfm")).unwrap();
    let run = case.run(&depth_args(&["--pfm", "out/d.pfm"]));
    assert_clean_failure(&run, &["out/d.pfm", "symbolic link"]);
    assert_eq!(std::fs::read(case.path("precious")).unwrap(), b"keep me");
    assert!(std::fs::symlink_metadata(case.path("out/d.pfm"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(entries(&case.path("out")), ["d.pfm"]);
}

#[test]
fn the_model_or_the_image_is_never_an_output() {
    let case = Case::new();
    let model = case.path("tiny.gguf");
    da3::convert::write_synthetic(
        &model,
        &da3::Config::preset("da3-tiny").unwrap(),
        da3::convert::WeightType::F32,
    )
    .unwrap();
    let model_bytes = std::fs::read(&model).unwrap();
    // Through another spelling of the same path, and through a hard link.
    std::fs::hard_link(&model, case.path("out/link.gguf")).unwrap();
    let run = case.run(&depth_args(&[
        "--model",
        "tiny.gguf",
        "--pfm",
        "./out/../tiny.gguf",
    ]));
    assert_clean_failure(
        &run,
        &["--pfm", "the model", "refusing to overwrite an input"],
    );
    let run = case.run(&depth_args(&[
        "--model",
        "tiny.gguf",
        "--png",
        "out/link.gguf",
    ]));
    assert_clean_failure(&run, &["--png", "the model"]);
    assert_eq!(std::fs::read(&model).unwrap(), model_bytes);

    let image = case.path("photo.png");
    image::RgbImage::from_pixel(64, 48, image::Rgb([10, 200, 30]))
        .save(&image)
        .unwrap();
    let image_bytes = std::fs::read(&image).unwrap();
    let run = case.run(&depth_args(&["--input", "photo.png", "--png", "photo.png"]));
    assert_clean_failure(&run, &["--png", "the input image"]);
    assert_eq!(std::fs::read(&image).unwrap(), image_bytes);

    let run = case.run(&depth_args(&["--pfm", "out/a", "--png", "out/a"]));
    assert_clean_failure(&run, &["--png out/a", "the same file as --pfm"]);
    assert_eq!(entries(&case.path("out")), ["link.gguf"]);
}

#[cfg(unix)]
#[test]
fn replacing_an_output_keeps_its_permissions() {
    use std::os::unix::fs::PermissionsExt;
    let case = Case::new();
    let out = case.path("out/d.pfm");
    std::fs::write(&out, "old").unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o600)).unwrap();
    let run = case.run(&depth_args(&["--pfm", "out/d.pfm"]));
    assert_eq!(run.code, Some(0), "{}", run.context());
    assert!(std::fs::read(&out).unwrap().starts_with(b"Pf\n"));
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(entries(&case.path("out")), ["d.pfm"], "no temporary left");
}

/// An interrupted run dies of its signal (not a panic) and leaves no file behind. The signal
/// goes once the run has logged its residency plan, i.e. with the graph built and the compute
/// of a 2048-px image (over a second on any machine) ahead: a fixed delay raced the run on
/// fast CPUs, which finished da3-tiny at 1400 px in 1.1 s.
#[cfg(unix)]
#[test]
fn sigint_during_a_run_leaves_no_file() {
    use std::io::BufRead;
    let case = Case::new();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_da3"))
        .args([
            "-v", // the residency plan is a debug line
            "depth",
            "--device",
            "cpu",
            "--process-res",
            "2048",
            "--pfm",
            "out/d.pfm",
            "--png",
            "out/d.png",
        ])
        .current_dir(case.dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (planned, plan_logged) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if line.contains("residency:") {
                let _ = planned.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    plan_logged
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the run logs its residency plan before computing");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    let stderr = reader.join().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(exit.signal(), Some(2), "died of SIGINT: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(entries(&case.path("out")), Vec::<String>::new());
}

#[test]
fn no_model_path_is_written_over_by_convert() {
    let case = Case::new();
    let ckpt = case.path("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::fs::write(ckpt.join("config.json"), r#"{"model_name": "da3-small"}"#).unwrap();
    std::fs::write(ckpt.join("model.safetensors"), "weights").unwrap();
    case.assert_fails(
        &["convert", "ckpt", "-o", "ckpt/model.safetensors"],
        &["--output", "the checkpoint's weights"],
    );
    assert_eq!(
        std::fs::read(ckpt.join("model.safetensors")).unwrap(),
        b"weights"
    );
    case.assert_fails(
        &["convert", "ckpt", "-o", "/dev/null"],
        &["--output", "/dev/null", "character device"],
    );
}

// --- images ------------------------------------------------------------------------------------

/// CRC-32 (IEEE), as PNG chunks carry it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8], crc: Option<u32>) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend_from_slice(&body);
    out.extend_from_slice(&crc.unwrap_or_else(|| crc32(&body)).to_be_bytes());
}

/// A PNG whose IHDR declares `width` x `height` (RGB8), with a wrong IHDR CRC if asked; the
/// pixel data is a tiny valid zlib stream, far too short for a large image.
fn png_with_header(width: u32, height: u32, bad_crc: bool) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    png_chunk(&mut png, b"IHDR", &ihdr, bad_crc.then_some(0x1234_5678));
    // zlib: stored block of one zero byte.
    png_chunk(
        &mut png,
        b"IDAT",
        &[
            0x78, 0x01, 0x01, 0x01, 0x00, 0xFE, 0xFF, 0x00, 0x00, 0x01, 0x00, 0x01,
        ],
        None,
    );
    png_chunk(&mut png, b"IEND", &[], None);
    png
}

fn encoded(format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(96, 64, |x, y| {
        image::Rgb([(x * 2) as u8, (y * 3) as u8, ((x + y) % 256) as u8])
    });
    let mut bytes = std::io::Cursor::new(Vec::new());
    img.write_to(&mut bytes, format).unwrap();
    bytes.into_inner()
}

/// `da3 depth --input NAME` (the file made from `bytes`) fails with a one-line error naming
/// the file and `parts`.
fn assert_image_refused(name: &str, bytes: &[u8], parts: &[&str]) {
    let case = Case::new();
    std::fs::write(case.path(name), bytes).unwrap();
    let run = case.assert_fails(&depth_args(&["--input", name, "--pfm", "out/d.pfm"]), parts);
    assert!(run.stderr.contains(name), "{}", run.context());
    assert_eq!(
        run.stderr.trim_end().lines().count(),
        1,
        "one line\n{}",
        run.context()
    );
    assert!(
        !run.stderr.contains(" { "),
        "no debug structs\n{}",
        run.context()
    );
}

#[test]
fn a_png_with_a_bad_crc_is_one_clean_line() {
    assert_image_refused(
        "bad-crc.png",
        &png_with_header(16, 16, true),
        &["cannot decode image", "PNG: CRC error", "IHDR chunk"],
    );
}

#[test]
fn truncated_pngs_and_jpegs_are_errors() {
    let png = encoded(image::ImageFormat::Png);
    assert_image_refused("cut.png", &png[..png.len() / 2], &["PNG", "end of file"]);
    let jpeg = encoded(image::ImageFormat::Jpeg);
    // The whole JPEG decodes; cut anywhere in the image data, it does not.
    let case = Case::new();
    std::fs::write(case.path("whole.jpg"), &jpeg).unwrap();
    let run = case.run(&depth_args(&["--input", "whole.jpg", "--pfm", "out/d.pfm"]));
    assert_eq!(run.code, Some(0), "{}", run.context());
    for cut in [jpeg.len() - 2, jpeg.len() - 100, jpeg.len() / 2] {
        assert_image_refused(
            "cut.jpg",
            &jpeg[..cut],
            &["JPEG", "no end-of-image marker", "truncated"],
        );
    }
}

#[test]
fn images_over_the_limits_are_refused_from_their_header() {
    assert_image_refused(
        "huge.png",
        &png_with_header(20_000, 20_000, false),
        &["too large", "20000x20000", "limit of 50000000"],
    );
    assert_image_refused(
        "wide.png",
        &png_with_header(100_000, 10, false),
        &["too large", "limit of 32768 px"],
    );
}

#[test]
fn a_directory_or_a_text_file_is_not_an_image() {
    let case = Case::new();
    std::fs::create_dir(case.path("photos")).unwrap();
    let run = case.assert_fails(
        &depth_args(&["--input", "photos", "--pfm", "out/d.pfm"]),
        &["photos", "is a directory"],
    );
    assert_eq!(
        run.stderr.trim_end().lines().count(),
        1,
        "{}",
        run.context()
    );
    assert_image_refused("notes.png", b"hello\n", &["notes.png"]);
}

// --- bounds ------------------------------------------------------------------------------------

#[test]
fn process_res_and_threads_have_limits() {
    let case = Case::new();
    for res in ["100000", "2049"] {
        let started = std::time::Instant::now();
        case.assert_fails(
            &[
                "depth",
                "--device",
                "cpu",
                "--process-res",
                res,
                "--pfm",
                "out/d.pfm",
            ],
            &["--process-res", res, "limit of 2048"],
        );
        assert!(started.elapsed().as_secs() < 10, "refused before any work");
    }
    case.assert_fails(
        &depth_args(&["--threads", "100000", "--pfm", "out/d.pfm"]),
        &["--threads 100000", "at most"],
    );
    case.assert_fails(
        &[
            "bench",
            "--device",
            "cpu",
            "--process-res",
            "5000",
            "--runs",
            "1",
        ],
        &["--process-res 5000", "limit of 2048"],
    );
    // batch checks it before reading any input or loading the model.
    std::fs::write(case.path("in.png"), b"not read").unwrap();
    for (res, why) in [
        ("5000", "limit of 2048"),
        ("7", "smaller than the patch size"),
    ] {
        case.assert_fails(
            &[
                "batch",
                "in.png",
                "--out-dir",
                "out",
                "--device",
                "cpu",
                "--process-res",
                res,
            ],
            &["--process-res", res, why],
        );
    }
}

// --- model files -------------------------------------------------------------------------------

fn tiny_model(path: &Path) {
    da3::convert::write_synthetic(
        path,
        &da3::Config::preset("da3-tiny").unwrap(),
        da3::convert::WeightType::F32,
    )
    .unwrap();
}

fn cpu_options() -> da3::LoadOptions {
    da3::LoadOptions {
        device: da3::Device::Cpu,
        threads: 2,
        ..Default::default()
    }
}

/// A model file cut short after it was opened (another process truncating it while `da3
/// depth` loads) is an error naming the file and a tensor; it used to be SIGBUS, which would
/// kill this test process.
#[test]
fn a_model_truncated_while_loading_is_an_error_not_sigbus() {
    use da3::Model;
    let case = Case::new();
    let path = case.path("tiny.gguf");
    tiny_model(&path);
    let file = da3::gguf::GgufFile::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let err = Model::from_gguf(&file, &cpu_options()).expect_err("a truncated file cannot load");
    let text = err.to_string();
    assert!(
        text.contains("tiny.gguf") && text.contains("changed while in use"),
        "{text}"
    );
    assert!(
        text.contains("tensor '") && text.contains("truncated"),
        "{text}"
    );
}

/// A file rewritten in place (same size, new bytes) while it loads is noticed at the end.
#[test]
fn a_model_rewritten_in_place_while_loading_is_an_error() {
    use da3::Model;
    let case = Case::new();
    let path = case.path("tiny.gguf");
    tiny_model(&path);
    let file = da3::gguf::GgufFile::open(&path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    // Same size, a new modification time (set explicitly: timestamps can be coarse).
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
        .unwrap();
    let err = Model::from_gguf(&file, &cpu_options()).expect_err("a rewritten file is refused");
    assert!(
        err.to_string().contains("modified while it was being read"),
        "{err}"
    );
}

/// Once loaded, a model no longer reads its file: truncating it changes nothing.
#[test]
fn a_model_truncated_after_loading_still_computes_the_same_depth() {
    use da3::{synthetic, Model};
    let case = Case::new();
    let path = case.path("tiny.gguf");
    tiny_model(&path);
    let file = da3::gguf::GgufFile::open(&path).unwrap();
    let mut model = Model::from_gguf(&file, &cpu_options())
        .unwrap()
        .session()
        .unwrap();
    let image = synthetic::image(160, 120);
    let before = model
        .run(&da3::Request::image(&image).process_res(112))
        .unwrap()
        .into_single()
        .unwrap()
        .depth;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    model.clear_graphs();
    let after = model
        .run(&da3::Request::image(&image).process_res(112))
        .unwrap()
        .into_single()
        .unwrap()
        .depth;
    assert_eq!(before, after);
    assert!(before.iter().all(|d| d.is_finite()));
    drop(file);
}

#[test]
fn a_directory_as_the_model_is_named_as_one() {
    let case = Case::new();
    std::fs::create_dir(case.path("models")).unwrap();
    case.assert_fails(
        &depth_args(&["--model", "models", "--pfm", "out/d.pfm"]),
        &["models", "is a directory"],
    );
    let run = case.assert_fails(
        &["info", "--model", "models", "--device", "cpu"],
        &["is a directory"],
    );
    assert!(!run.stderr.contains("No such device"), "{}", run.context());
}

/// A copy of the built-in model (stored as `weight_type`) with tensor `name`'s data replaced
/// by `edit` of its bytes, written to `dest`.
fn poisoned_model(
    dest: &Path,
    weight_type: da3::convert::WeightType,
    name: &str,
    edit: impl Fn(&mut Vec<u8>),
    metadata: &[(&str, da3::gguf::Value)],
) {
    use da3::gguf::{GgufFile, GgufWriter};
    let source = dest.with_extension("source.gguf");
    da3::convert::write_synthetic(
        &source,
        &da3::Config::preset("da3-tiny").unwrap(),
        weight_type,
    )
    .unwrap();
    let file = GgufFile::from_bytes(std::fs::read(&source).unwrap()).unwrap();
    std::fs::remove_file(&source).unwrap();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.set(key, value.clone());
    }
    for (key, value) in metadata {
        w.set(*key, value.clone());
    }
    let mut found = false;
    for t in file.tensors() {
        let mut data = file.tensor_data(t).unwrap().to_vec();
        if t.name == name {
            edit(&mut data);
            found = true;
        }
        w.add_tensor(t.name.clone(), t.dtype, t.shape(), data)
            .unwrap();
    }
    assert!(found || name.is_empty(), "no tensor {name}");
    w.write_to(dest).unwrap();
}

fn model_case(
    weight_type: da3::convert::WeightType,
    name: &str,
    edit: impl Fn(&mut Vec<u8>),
    metadata: &[(&str, da3::gguf::Value)],
) -> Case {
    let case = Case::new();
    poisoned_model(&case.path("model.gguf"), weight_type, name, edit, metadata);
    case
}

fn depth_with_model(case: &Case, parts: &[&str]) -> Run {
    case.assert_fails(
        &depth_args(&[
            "--model",
            "model.gguf",
            "--pfm",
            "out/d.pfm",
            "--png",
            "out/d.png",
        ]),
        parts,
    )
}

#[test]
fn nan_and_infinity_in_weights_are_named_at_load() {
    use da3::convert::WeightType;
    // f32: a NaN in a LayerNorm weight; f16: an infinity in a matrix weight (kept in f16 or
    // packed to bf16) and a NaN in a converted-to-f32 tensor.
    let nan_f32 = |d: &mut Vec<u8>| d[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    let case = model_case(WeightType::F32, "vit.blk.1.norm1.weight", nan_f32, &[]);
    depth_with_model(
        &case,
        &["`vit.blk.1.norm1.weight`", "NaN or infinity", "element 2"],
    );
    let inf_f16 = |d: &mut Vec<u8>| d[2..4].copy_from_slice(&0x7C00u16.to_le_bytes());
    let case = model_case(WeightType::F16, "vit.blk.0.attn_qkv.weight", inf_f16, &[]);
    depth_with_model(&case, &["`vit.blk.0.attn_qkv.weight`", "NaN or infinity"]);
    let case = model_case(WeightType::F32, "vit.pos_embed", nan_f32, &[]);
    depth_with_model(&case, &["`vit.pos_embed`", "NaN or infinity"]);
}

#[test]
fn weights_that_overflow_give_an_error_not_a_nan_picture() {
    use da3::convert::WeightType;
    let huge = |d: &mut Vec<u8>| {
        for v in d.chunks_exact_mut(4) {
            v.copy_from_slice(&1.0e30f32.to_le_bytes());
        }
    };
    let case = model_case(WeightType::F32, "head.scratch.out2b.bias", huge, &[]);
    // -q: the planner's info line would come first.
    case.assert_fails(
        &depth_args(&["-q", "--model", "model.gguf", "--pfm", "out/d.pfm"]),
        &[
            "model.gguf",
            "every depth value is NaN or infinite",
            "nothing written",
        ],
    );
}

#[test]
fn image_normalisation_keys_are_checked() {
    use da3::convert::WeightType;
    use da3::gguf::Value;
    let keep = |_: &mut Vec<u8>| {};
    let cases: [(&str, Value, &[&str]); 5] = [
        (
            "depthanything3.img.mean",
            vec![0.5f32, 0.5, 0.5].into(),
            &["img.mean", "differs from the ImageNet normalisation"],
        ),
        (
            "depthanything3.img.std",
            vec![0.229f32, 0.0, 0.225].into(),
            &["img.std", "finite and positive"],
        ),
        (
            "depthanything3.img.std",
            vec![f32::NAN, 0.224, 0.225].into(),
            &["img.std", "finite and positive"],
        ),
        (
            "depthanything3.img.mean",
            (0..1000).map(|i| i as f32).collect::<Vec<f32>>().into(),
            &[
                "img.mean",
                "must hold 3 values",
                "found 1000 values [0.0, 1.0",
            ],
        ),
        (
            "depthanything3.vit.out_layers",
            (0..1000).collect::<Vec<i32>>().into(),
            &["vit.out_layers", "found 1000 values"],
        ),
    ];
    for (key, value, parts) in cases {
        let case = model_case(WeightType::F32, "", keep, &[(key, value)]);
        let run = depth_with_model(&case, parts);
        assert!(
            run.stderr.len() < 600,
            "a short message, not every value\n{}",
            run.context()
        );
    }
    // The official values themselves load.
    let official: [(&str, Value); 2] = [
        (
            "depthanything3.img.mean",
            vec![0.485f32, 0.456, 0.406].into(),
        ),
        (
            "depthanything3.img.std",
            vec![0.229f32, 0.224, 0.225].into(),
        ),
    ];
    let case = model_case(WeightType::F32, "", keep, &official);
    let run = case.run(&depth_args(&[
        "--model",
        "model.gguf",
        "--pfm",
        "out/d.pfm",
    ]));
    assert_eq!(run.code, Some(0), "{}", run.context());
}

// --- messages ----------------------------------------------------------------------------------

#[test]
fn rpc_endpoints_without_a_port_say_so() {
    let case = Case::new();
    for (spec, why) in [
        ("rpc:localhost", "the port is missing"),
        ("rpc::50052", "the host is missing"),
        ("rpc:localhost:http", "`http` is not a port number"),
        ("rpc:localhost:70000", "`70000` is not a port number"),
    ] {
        // A malformed value is bad usage (exit 2), refused while parsing the arguments.
        let run = case.run(&["depth", "--device", spec, "--pfm", "out/d.pfm"]);
        assert_eq!(run.code, Some(2), "{}", run.context());
        for part in [spec, why, "rpc:HOST:PORT"] {
            assert!(run.stderr.contains(part), "`{part}`\n{}", run.context());
        }
        assert!(!run.stderr.contains("unreachable") && !run.stderr.contains("panicked"));
    }
}

/// Layers loaded with their norm or layer scale folded in (ggml's ops, as on every GPU) check
/// what they read as the unfolded ones do: a NaN in a folded LayerNorm weight is named at
/// load, and a layer scale that makes a folded f16 weight overflow is an error naming the
/// weight, not a model that computes infinities.
#[test]
fn folded_norms_and_layer_scales_are_checked_at_load() {
    use da3::convert::WeightType;
    let folding = da3::LoadOptions {
        ggml_ops_only: true,
        ..cpu_options()
    };
    let load_error = |case: &Case| {
        da3::Model::load(case.path("model.gguf"), &folding)
            .map(|m| m.folded_layers())
            .expect_err("a bad folded tensor must not load")
            .to_string()
    };
    let nan_f32 = |d: &mut Vec<u8>| d[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
    let case = model_case(WeightType::F32, "vit.blk.1.norm1.weight", nan_f32, &[]);
    let err = load_error(&case);
    assert!(
        err.contains("`vit.blk.1.norm1.weight`") && err.contains("NaN or infinity"),
        "{err}"
    );
    let huge = |d: &mut Vec<u8>| {
        for v in d.chunks_exact_mut(4) {
            v.copy_from_slice(&1.0e9f32.to_le_bytes());
        }
    };
    let case = model_case(WeightType::F16, "vit.blk.0.ls1", huge, &[]);
    let err = load_error(&case);
    assert!(
        err.contains("`vit.blk.0.attn_proj.weight`") && err.contains("range of f16"),
        "{err}"
    );
    // Unfolded (the CPU kernels), the same f16 file loads: the scale stays a tensor of its own.
    let model = da3::Model::load(case.path("model.gguf"), &cpu_options()).unwrap();
    assert_eq!(model.folded_layers(), 0);
}
