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

/// One mesh of one primitive for [`GlbBuilder::mesh`]; absent attributes are left out.
#[derive(Default)]
struct Part<'a> {
    name: &'a str,
    /// 0 points, 1 lines, 3 line strip, 4 triangles, 5 triangle strip.
    mode: u32,
    positions: &'a [[f32; 3]],
    colors: Option<&'a [[u8; 4]]>,
    normals: Option<&'a [[f32; 3]]>,
    indices: Option<&'a [u32]>,
    /// The node's transform fields (`translation`, `scale`, ...).
    transform: Option<Value>,
}

/// A glb built by hand from the glTF 2.0 spec (JSON chunk, BIN chunk), so the reader is
/// checked against the format rather than against the writer it shares a library with.
#[derive(Default)]
struct GlbBuilder {
    bin: Vec<u8>,
    views: Vec<Value>,
    accessors: Vec<Value>,
    meshes: Vec<Value>,
    nodes: Vec<Value>,
}

impl GlbBuilder {
    /// An accessor over `bytes`: `count` elements of `kind` ("VEC3", "SCALAR", ...) made of
    /// `component` (5126 float, 5125 u32, 5123 u16, 5121 u8).
    fn accessor(&mut self, bytes: &[u8], count: usize, kind: &str, component: u32) -> usize {
        let offset = self.bin.len();
        self.bin.extend_from_slice(bytes);
        while !self.bin.len().is_multiple_of(4) {
            self.bin.push(0);
        }
        self.views.push(serde_json::json!({
            "buffer": 0, "byteOffset": offset, "byteLength": bytes.len()
        }));
        let mut accessor = serde_json::json!({
            "bufferView": self.views.len() - 1, "count": count, "type": kind,
            "componentType": component
        });
        if component == 5121 {
            accessor["normalized"] = true.into();
        }
        self.accessors.push(accessor);
        self.accessors.len() - 1
    }

    fn vec3(&mut self, values: &[[f32; 3]]) -> usize {
        let bytes: Vec<u8> = values
            .iter()
            .flatten()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let a = self.accessor(&bytes, values.len(), "VEC3", 5126);
        // The spec asks for bounds on POSITION accessors (and the `gltf` crate checks).
        let bound = |pick: fn(f32, f32) -> f32| {
            [0, 1, 2].map(|k| values.iter().map(|v| v[k]).fold(values[0][k], pick))
        };
        self.accessors[a]["min"] = bound(f32::min).to_vec().into();
        self.accessors[a]["max"] = bound(f32::max).to_vec().into();
        a
    }

    /// A mesh of one primitive on a node of its own.
    fn mesh(&mut self, part: Part<'_>) {
        let mut attributes = serde_json::json!({ "POSITION": self.vec3(part.positions) });
        if let Some(c) = part.colors {
            let bytes: Vec<u8> = c.iter().flatten().copied().collect();
            attributes["COLOR_0"] = self.accessor(&bytes, c.len(), "VEC4", 5121).into();
        }
        if let Some(n) = part.normals {
            attributes["NORMAL"] = self.vec3(n).into();
        }
        let mut primitive = serde_json::json!({ "attributes": attributes, "mode": part.mode });
        if let Some(i) = part.indices {
            let bytes: Vec<u8> = i.iter().flat_map(|v| v.to_le_bytes()).collect();
            primitive["indices"] = self.accessor(&bytes, i.len(), "SCALAR", 5125).into();
        }
        self.meshes
            .push(serde_json::json!({ "name": part.name, "primitives": [primitive] }));
        let mut node = part.transform.unwrap_or_else(|| serde_json::json!({}));
        node["mesh"] = (self.meshes.len() - 1).into();
        self.nodes.push(node);
    }

    fn write(self, path: &Path) {
        let document = serde_json::json!({
            "asset": { "version": "2.0" },
            "scene": 0,
            "scenes": [{ "nodes": (0..self.nodes.len()).collect::<Vec<_>>() }],
            "nodes": self.nodes,
            "meshes": self.meshes,
            "accessors": self.accessors,
            "bufferViews": self.views,
            "buffers": [{ "byteLength": self.bin.len() }],
        });
        let mut text = document.to_string().into_bytes();
        while !text.len().is_multiple_of(4) {
            text.push(b' ');
        }
        let total = 12 + 8 + text.len() + 8 + self.bin.len();
        let mut glb = Vec::with_capacity(total);
        glb.extend_from_slice(b"glTF");
        glb.extend_from_slice(&2u32.to_le_bytes());
        glb.extend_from_slice(&(total as u32).to_le_bytes());
        glb.extend_from_slice(&(text.len() as u32).to_le_bytes());
        glb.extend_from_slice(b"JSON");
        glb.extend_from_slice(&text);
        glb.extend_from_slice(&(self.bin.len() as u32).to_le_bytes());
        glb.extend_from_slice(b"BIN\0");
        glb.extend_from_slice(&self.bin);
        std::fs::write(path, glb).unwrap();
    }
}

/// The page's mesh as triangles of (position, colour, normal) corners, the normals decoded
/// from their 8-bit form (absent ones `None`).
type Corner = ([f32; 3], [u8; 3], Option<[i8; 3]>);

fn page_triangles(page: &Value) -> Vec<[Corner; 3]> {
    let positions = f32x3(&page["mesh_positions"]);
    let colors = b64(&page["mesh_colors"]);
    let normals = page.get("mesh_normals").map(b64);
    assert_eq!(
        page["mesh_vertices"].as_u64().unwrap() as usize,
        positions.len()
    );
    let corner = |i: usize| -> Corner {
        (
            positions[i],
            colors[3 * i..3 * i + 3].try_into().unwrap(),
            normals
                .as_ref()
                .map(|n| [0, 1, 2].map(|k| n[3 * i + k] as i8)),
        )
    };
    let indices: Vec<usize> = b64(&page["mesh_indices"])
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
        .collect();
    assert_eq!(
        indices.len(),
        3 * page["triangles"].as_u64().unwrap() as usize
    );
    indices
        .chunks_exact(3)
        .map(|t| [corner(t[0]), corner(t[1]), corner(t[2])])
        .collect()
}

/// A unit normal as the page stores it (x 127, rounded).
fn snorm(n: [f32; 3]) -> [i8; 3] {
    let l = n.iter().map(|v| v * v).sum::<f32>().sqrt();
    n.map(|v| (v / l * 127.0).round() as i8)
}

#[test]
fn a_glb_mesh_with_points_a_trajectory_and_a_camera_shows_all_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let glb = dir.path().join("fused.glb");
    let mut b = GlbBuilder::default();
    // A wall: indexed, coloured, with tilted normals, on a node that scales x by 2 and moves
    // it back by 2 (normals go through the inverse transpose: (1, 0, 1) becomes (1, 0, 2)).
    let wall = [
        [-1.0, -1.0, 0.0],
        [1.0, -1.0, 0.0],
        [1.0, 1.0, 0.0],
        [-1.0, 1.0, 0.0],
    ];
    let wall_colors = [
        [255, 0, 0, 255],
        [0, 255, 0, 255],
        [0, 0, 255, 255],
        [9, 9, 9, 255],
    ];
    b.mesh(Part {
        name: "wall",
        mode: 4,
        positions: &wall,
        colors: Some(&wall_colors),
        normals: Some(&[[1.0, 0.0, 1.0]; 4]),
        indices: Some(&[0, 1, 2, 0, 2, 3]),
        transform: Some(
            serde_json::json!({ "translation": [0.0, 0.0, -2.0], "scale": [2.0, 1.0, 1.0] }),
        ),
    });
    // A floor: not indexed, no colours, no normals (computed, since the wall has some).
    let floor = [
        [0.0, -1.0, 0.0],
        [1.0, -1.0, 0.0],
        [0.0, -1.0, -1.0],
        [1.0, -1.0, 0.0],
        [1.0, -1.0, -1.0],
        [0.0, -1.0, -1.0],
    ];
    b.mesh(Part {
        name: "floor",
        mode: 4,
        positions: &floor,
        ..Part::default()
    });
    // A strip of three triangles (the spec's order: the odd ones' last two corners swapped).
    let strip = [
        [5.0, 0.0, 0.0],
        [6.0, 0.0, 0.0],
        [5.0, 1.0, 0.0],
        [6.0, 1.0, 0.0],
        [5.0, 2.0, 0.0],
    ];
    b.mesh(Part {
        name: "strip",
        mode: 5,
        positions: &strip,
        ..Part::default()
    });
    let points = [[0.0, 0.0, 1.0], [0.5, 0.0, 1.0], [0.0, 0.5, 1.0]];
    b.mesh(Part {
        name: "points",
        mode: 0,
        positions: &points,
        colors: Some(&[[1, 2, 3, 255]; 3]),
        ..Part::default()
    });
    // A trajectory of 100 poses as a LINE_STRIP (99 segments), and one da3-named frustum.
    let path: Vec<[f32; 3]> = (0..100)
        .map(|i| [i as f32 * 0.1, 0.0, (i as f32 * 0.2).sin()])
        .collect();
    b.mesh(Part {
        name: "trajectory",
        mode: 3,
        positions: &path,
        ..Part::default()
    });
    b.mesh(Part {
        name: "camera 0 (a.png)",
        mode: 1,
        positions: &[[0.0; 3]; 16],
        ..Part::default()
    });
    b.write(&glb);

    let out = da3(&["view", glb.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("7 triangles") && said.contains("1 camera"),
        "{said}"
    );
    let page = embedded(&dir.path().join("fused.html"));
    assert_eq!(page["points"], 3);
    assert_eq!(page["triangles"], 7);
    assert_eq!(page["total_triangles"], 7);
    assert_eq!(page["mesh_vertices"], 4 + 6 + 5);
    assert_eq!(page["lines"], 99 + 8);
    assert_eq!(page["cameras"], 1);
    let segments = f32x3(&page["line_positions"]);
    assert!(
        segments
            .windows(2)
            .step_by(2)
            .any(|s| s == [path[41], path[42]]),
        "the path's segments"
    );

    let triangles = page_triangles(&page);
    let placed = |p: [f32; 3]| [2.0 * p[0], p[1], p[2] - 2.0];
    let tilted = Some(snorm([1.0, 0.0, 2.0]));
    let rgb = |c: [u8; 4]| [c[0], c[1], c[2]];
    let expected_wall =
        [[0, 1, 2], [0, 2, 3]].map(|t| t.map(|i| (placed(wall[i]), rgb(wall_colors[i]), tilted)));
    for t in &expected_wall {
        assert!(
            triangles.contains(t),
            "wall triangle {t:?} not in {triangles:?}"
        );
    }
    // The floor's computed normals point along y (up or down: both sides are lit).
    let grey = [200, 200, 200];
    let floor_triangle = triangles
        .iter()
        .find(|t| t[0].0 == floor[0] && t[1].0 == floor[1] && t[2].0 == floor[2])
        .expect("the floor's first triangle");
    assert_eq!(floor_triangle[0].1, grey);
    assert_eq!(floor_triangle[0].2.map(|n| n[1].abs()), Some(127));
    let strip_corners: Vec<[[f32; 3]; 3]> = triangles
        .iter()
        .map(|t| t.map(|c| c.0))
        .filter(|t| t[0][0] >= 5.0)
        .collect();
    assert_eq!(
        strip_corners,
        [
            [strip[0], strip[1], strip[2]],
            [strip[1], strip[3], strip[2]],
            [strip[2], strip[3], strip[4]]
        ]
    );

    // Capped: evenly strided triangles, said on the terminal.
    let capped = dir.path().join("capped.html");
    let out = da3(&[
        "view",
        glb.to_str().unwrap(),
        "-o",
        capped.to_str().unwrap(),
        "--max-triangles",
        "2",
    ]);
    assert!(out.status.success(), "{out:?}");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("2 of 7 triangles (evenly strided"), "{said}");
    let page = embedded(&capped);
    assert_eq!(
        (page["triangles"].as_u64(), page["total_triangles"].as_u64()),
        (Some(2), Some(7))
    );
    assert_eq!(page_triangles(&page).len(), 2);
}

#[test]
fn a_ply_with_faces_is_a_mesh_in_the_viewers_axes() {
    let dir = tempfile::tempdir().unwrap();
    // ASCII, with normals and a quad (two triangles by fan) and a triangle.
    let ply = dir.path().join("mesh.ply");
    std::fs::write(
        &ply,
        "ply\nformat ascii 1.0\nelement vertex 5\nproperty float x\nproperty float y\n\
         property float z\nproperty float nx\nproperty float ny\nproperty float nz\n\
         property uchar red\nproperty uchar green\nproperty uchar blue\n\
         element face 2\nproperty list uchar int vertex_indices\nend_header\n\
         0 0 2 0 0 -1 255 0 0\n1 0 2 0 0 -1 0 255 0\n1 1 2 0 1 -1 0 0 255\n\
         0 1 2 0 0 -1 10 20 30\n2 0 3 1 0 0 40 50 60\n4 0 1 2 3\n3 1 4 2\n",
    )
    .unwrap();
    let out = da3(&["-q", "view", ply.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page = embedded(&dir.path().join("mesh.html"));
    assert_eq!(page["points"], 0, "a PLY with faces is a mesh, not points");
    assert_eq!(page["triangles"], 3);
    assert_eq!(page["mesh_vertices"], 5);
    let flip = |p: [f32; 3]| [p[0], -p[1], -p[2]];
    assert_eq!(
        f32x3(&page["mesh_positions"]),
        [
            [0.0, 0.0, 2.0],
            [1.0, 0.0, 2.0],
            [1.0, 1.0, 2.0],
            [0.0, 1.0, 2.0],
            [2.0, 0.0, 3.0]
        ]
        .map(flip)
    );
    let triangles = page_triangles(&page);
    let indices: Vec<[[f32; 3]; 3]> = triangles.iter().map(|t| t.map(|c| c.0)).collect();
    let v = f32x3(&page["mesh_positions"]);
    assert_eq!(
        indices,
        [[v[0], v[1], v[2]], [v[0], v[2], v[3]], [v[1], v[4], v[2]]]
    );
    assert_eq!(triangles[0][0].2, Some(snorm(flip([0.0, 0.0, -1.0]))));
    assert_eq!(triangles[0][2].2, Some(snorm(flip([0.0, 1.0, -1.0]))));
    assert_eq!(triangles[2][1].1, [40, 50, 60]);

    // Binary, `vertex_index`, a pentagon (three triangles), no colours and no normals.
    let ply = dir.path().join("pentagon.ply");
    let mut bytes = b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty float x\n\
        property float y\nproperty float z\nelement face 1\n\
        property list uchar uint vertex_index\nend_header\n"
        .to_vec();
    for k in 0..5 {
        let angle = k as f32 * std::f32::consts::TAU / 5.0;
        for c in [angle.cos(), angle.sin(), 1.0f32] {
            bytes.extend_from_slice(&c.to_le_bytes());
        }
    }
    bytes.push(5);
    for i in 0u32..5 {
        bytes.extend_from_slice(&i.to_le_bytes());
    }
    std::fs::write(&ply, bytes).unwrap();
    let out = da3(&["-q", "view", ply.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let page = embedded(&dir.path().join("pentagon.html"));
    assert_eq!(page["triangles"], 3);
    assert!(page.get("mesh_normals").is_none(), "the page computes them");
    let triangles = page_triangles(&page);
    assert!(triangles
        .iter()
        .flatten()
        .all(|c| c.1 == [200, 200, 200] && c.0[2] == -1.0));
}

#[test]
fn bad_mesh_indices_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let glb = dir.path().join("broken.glb");
    let mut b = GlbBuilder::default();
    let square = [
        [0.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
        [1.0, 1.0, 0.0],
        [0.0, 1.0, 0.0],
    ];
    b.mesh(Part {
        name: "wall",
        mode: 4,
        positions: &square,
        indices: Some(&[0, 1, 2, 0, 2, 9]),
        ..Part::default()
    });
    b.write(&glb);
    let out = da3(&["view", glb.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.glb")
            && err.contains("\"wall\"")
            && err.contains("index 9 is out of range"),
        "{err}"
    );
    assert!(!dir.path().join("broken.html").exists());

    let ply = dir.path().join("broken.ply");
    std::fs::write(
        &ply,
        "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n\
         property float z\nelement face 2\nproperty list uchar int vertex_indices\nend_header\n\
         0 0 1\n1 0 1\n0 1 1\n3 0 1 2\n3 0 1 7\n",
    )
    .unwrap();
    let out = da3(&["view", ply.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.ply") && err.contains("face 1: vertex index 7 is out of range"),
        "{err}"
    );
    std::fs::write(
        &ply,
        "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\n\
         property float z\nelement face 1\nproperty list uchar int vertex_indices\nend_header\n\
         0 0 1\n1 0 1\n0 1 1\n2 0 1\n",
    )
    .unwrap();
    let out = da3(&["view", ply.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken.ply") && err.contains("face 0: 2 vertices"),
        "{err}"
    );
}
