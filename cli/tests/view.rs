//! `da3 view`: the page written for a PLY and a glb of one real prediction (the built-in
//! model on the test photo) embeds exactly that point cloud. The PLY is read back here by a
//! parser of its own (the 15-byte records the PLY header declares), the glb scene compared
//! with the library's viewer scene of the same cloud.

use base64::Engine as _;
use da3::export::{point_cloud, write_glb, write_ply, CloudOptions, GlbOptions, View, ViewerScene};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const IMAGE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/peer/test-640x480.png"
);

fn da3(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_da3"))
        .args(args)
        .env("GGML_NO_BACKTRACE", "1")
        .output()
        .expect("da3 runs")
}

/// The scene JSON of a written page.
fn embedded(path: &Path) -> Value {
    let html = std::fs::read_to_string(path).unwrap();
    let tag = r#"<script type="application/json" id="da3-scene">"#;
    let start = html.find(tag).expect("the scene element") + tag.len();
    let end = start + html[start..].find("</script>").unwrap();
    assert!(
        html.contains("function da3Viewer("),
        "the viewer code is inline"
    );
    assert!(
        !html.contains("<script src"),
        "a self-contained page loads no script"
    );
    serde_json::from_str(&html[start..end]).unwrap()
}

fn b64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().expect("base64"))
        .unwrap()
}

fn f32x3(v: &Value) -> Vec<[f32; 3]> {
    b64(v)
        .chunks_exact(12)
        .map(|c| [0, 1, 2].map(|k| f32::from_le_bytes(c[4 * k..4 * k + 4].try_into().unwrap())))
        .collect()
}

/// Our own reading of a binary little-endian PLY with x, y, z float and r, g, b uchar.
fn read_ply(bytes: &[u8]) -> Vec<([f32; 3], [u8; 3])> {
    let end = bytes
        .windows(11)
        .position(|w| w == b"end_header\n")
        .unwrap()
        + 11;
    let header = std::str::from_utf8(&bytes[..end]).unwrap();
    assert!(header.contains("format binary_little_endian 1.0"));
    let n: usize = header
        .lines()
        .find_map(|l| l.strip_prefix("element vertex "))
        .unwrap()
        .parse()
        .unwrap();
    let body = &bytes[end..];
    assert_eq!(body.len(), n * 15);
    body.chunks_exact(15)
        .map(|r| {
            let p = [0, 1, 2].map(|k| f32::from_le_bytes(r[4 * k..4 * k + 4].try_into().unwrap()));
            (p, [r[12], r[13], r[14]])
        })
        .collect()
}

#[test]
fn pages_embed_the_ply_and_glb_clouds() {
    let file = da3::convert::builtin_model_file().unwrap();
    let model = da3::Model::from_gguf(&file, &da3::LoadOptions::default()).unwrap();
    let mut session = model.session().unwrap();
    let image = da3::preprocess::load_image(Path::new(IMAGE)).unwrap();
    let res = 280;
    let prediction = session
        .run(&da3::Request::image(&image).process_res(res))
        .unwrap()
        .into_single()
        .unwrap();
    let processed = da3::preprocess::preprocess(&image, res).unwrap();
    let pose = prediction
        .pose
        .unwrap_or_else(|| da3::export::assumed_pose(prediction.width, prediction.height, 60.0));
    let views = [View::with_pose(&prediction, &processed.rgb8, pose).unwrap()];
    let cloud = point_cloud(&views, &CloudOptions::default()).unwrap();
    assert!(cloud.len() > 1000, "{} points", cloud.len());

    let dir = tempfile::tempdir().unwrap();
    let ply = dir.path().join("cloud.ply");
    let glb = dir.path().join("scene.glb");
    write_ply(&ply, &cloud).unwrap();
    write_glb(&glb, &cloud, &views, &GlbOptions::default()).unwrap();

    // PLY: every point, in the viewer's axes (y and z flipped), colours as written.
    let out = da3(&["-q", "view", ply.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page = embedded(&dir.path().join("cloud.html"));
    let records = read_ply(&std::fs::read(&ply).unwrap());
    assert_eq!(records.len(), cloud.len());
    assert_eq!(page["points"].as_u64().unwrap() as usize, records.len());
    assert_eq!(page["cameras"], 0);
    let positions = f32x3(&page["positions"]);
    let colors = b64(&page["colors"]);
    assert_eq!(positions.len(), records.len());
    for (i, ((p, c), q)) in records.iter().zip(&positions).enumerate() {
        assert_eq!(*q, [p[0], -p[1], -p[2]], "point {i}");
        assert_eq!(&colors[3 * i..3 * i + 3], c, "colour {i}");
    }

    // glb, capped: evenly strided points of the glb's scene, and the camera's 8 segments.
    let page_path = dir.path().join("page.html");
    let cap = 1000;
    let out = da3(&[
        "-q",
        "view",
        glb.to_str().unwrap(),
        "--output",
        page_path.to_str().unwrap(),
        "--max-points",
        &cap.to_string(),
    ]);
    assert!(out.status.success(), "{out:?}");
    let page = embedded(&page_path);
    let scene = ViewerScene::new(&cloud, &views, &GlbOptions::default()).unwrap();
    assert_eq!(page["points"], cap);
    assert_eq!(page["total_points"].as_u64().unwrap() as usize, cloud.len());
    assert_eq!(page["cameras"], 1);
    assert_eq!(page["lines"], 8);
    let positions = f32x3(&page["positions"]);
    let n = cloud.len();
    for (j, q) in positions.iter().enumerate() {
        assert_eq!(*q, scene.positions[j * n / cap], "point {j}");
    }
    assert_eq!(f32x3(&page["line_positions"]), scene.line_positions);
    let colors = b64(&page["line_colors"]);
    assert_eq!(colors.len(), 16 * 3);
}

#[test]
fn bad_inputs_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.ply");
    std::fs::write(&junk, b"not a ply at all").unwrap();
    let out = da3(&["view", junk.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("junk.ply") && err.contains("PLY"), "{err}");
    assert!(
        !dir.path().join("junk.html").exists(),
        "no page for a bad input"
    );

    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, b"hello").unwrap();
    let out = da3(&["view", txt.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a .ply or .glb"), "{err}");

    let out = da3(&[
        "view",
        junk.to_str().unwrap(),
        "--output",
        junk.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("that is the input"));

    let out = da3(&["view", junk.to_str().unwrap(), "--max-points", "0"]);
    assert_eq!(out.status.code(), Some(2));
}
