//! `da3 view`: a self-contained HTML page (our own WebGL, nothing fetched) for a PLY or glb
//! point cloud or mesh, written next to it.
//!
//! glb (read with the `gltf` crate), every primitive of the default scene, with the nodes'
//! transforms applied: POINTS (positions, COLOR_0) as points; LINES, LINE_STRIP and LINE_LOOP
//! as segments (camera frustums, trajectories); TRIANGLES, TRIANGLE_STRIP and TRIANGLE_FAN as
//! the mesh (indexed or not, COLOR_0 and NORMAL when present). A LINES primitive counts as a
//! camera when its mesh is named as da3's glb writer names frustums (`camera <index> ...`).
//!
//! A folder written by `da3 stream`: its mesh (`mesh.glb`, else `mesh.ply`), its cloud
//! (`pcd/combined_pcd.ply`) and the camera path of `camera_poses.txt`, as one page
//! (`view.html` in the folder).
//!
//! PLY (read with `ply-rs-bw`; ASCII or binary): the `vertex` element's x, y, z, red, green,
//! blue and nx, ny, nz. Without a `face` element the vertices are points; with one (its
//! `vertex_indices` or `vertex_index` lists, polygons split into a fan of triangles) they are
//! the mesh. Positions and normals are flipped from OpenCV axes (y down, z forward, as da3's
//! PLY files are) to the viewer's glTF axes (y up, z backward); a PLY holds no cameras.

use anyhow::{bail, Context as _};
use da3::export::{
    write_viewer, ViewerCaps, ViewerScene, DEFAULT_VIEWER_POINTS, DEFAULT_VIEWER_TRIANGLES,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A point cloud or mesh: FILE.glb (points, triangles, camera frustums and paths) or FILE.ply
    /// (points, or a mesh when it has faces); or the --out-dir of `da3 stream` (its mesh, cloud
    /// and camera path).
    #[arg(value_name = "FILE.ply|FILE.glb|DIR")]
    input: PathBuf,
    /// The page to write. Default: the input's name with `.html`, next to it (for a folder,
    /// `view.html` in it).
    #[arg(short, long, value_name = "FILE.html")]
    output: Option<PathBuf>,
    /// Most points the page embeds (evenly strided above it; about 20 bytes each).
    #[arg(long, default_value_t = DEFAULT_VIEWER_POINTS, value_parser = parse_point_cap)]
    max_points: usize,
    /// Most triangles the page embeds (evenly strided above it: every k-th; about 28 bytes
    /// each with their vertices).
    #[arg(long, default_value_t = DEFAULT_VIEWER_TRIANGLES, value_parser = parse_triangle_cap)]
    max_triangles: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let folder = args.input.is_dir();
    let output = args.output.clone().unwrap_or_else(|| {
        if folder {
            args.input.join("view.html")
        } else {
            args.input.with_extension("html")
        }
    });
    if output == args.input {
        bail!(
            "--output {}: that is the input; name another file",
            output.display()
        );
    }
    // Before reading anything big: the page can be written.
    da3::atomic_file::check_writable(&output)
        .with_context(|| format!("--output {}", output.display()))?;
    let scene = if folder {
        read_reconstruction(&args.input)?
    } else {
        read_file(&args.input)?
    };
    if scene.positions.is_empty()
        && scene.line_positions.is_empty()
        && scene.triangles.is_empty()
        && scene.gaussian_positions.is_empty()
    {
        bail!(
            "{}: holds no points, no triangles, no lines and no Gaussians",
            args.input.display()
        );
    }
    let title = args
        .input
        .file_name()
        .map_or_else(|| "da3".into(), |n| n.to_string_lossy().into_owned());
    let caps = ViewerCaps {
        max_points: args.max_points,
        max_triangles: args.max_triangles,
    };
    write_viewer(&output, &scene, &title, &caps)
        .with_context(|| format!("writing {} for {}", output.display(), args.input.display()))?;
    outln!("wrote {} ({})", output.display(), summary(&scene, &caps));
    Ok(ExitCode::SUCCESS)
}

/// The scene of a PLY or glb file.
fn read_file(path: &Path) -> anyhow::Result<ViewerScene> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let ext = path
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    match ext.as_deref() {
        Some("glb") | Some("gltf") => read_glb(&bytes),
        Some("ply") => read_ply(&bytes),
        _ if bytes.starts_with(b"glTF") => read_glb(&bytes),
        _ if bytes.starts_with(b"ply") => read_ply(&bytes),
        _ => bail!(
            "{}: not a .ply or .glb file (by name or content)",
            path.display()
        ),
    }
    .with_context(|| format!("reading {}", path.display()))
}

/// Colour of the camera path in a stream's page.
const PATH_COLOUR: [u8; 3] = [255, 80, 40];

/// The page of a `da3 stream` output folder: the mesh, the cloud and the camera path.
fn read_reconstruction(dir: &Path) -> anyhow::Result<ViewerScene> {
    let poses = dir.join("camera_poses.txt");
    if !poses.is_file() {
        bail!(
            "{}: a folder, but not one `da3 stream` wrote (no camera_poses.txt); give a .ply or \
             .glb file",
            dir.display()
        );
    }
    let mut scene = ViewerScene::default();
    let cloud = dir.join("pcd").join("combined_pcd.ply");
    if cloud.is_file() {
        let points = read_file(&cloud)?;
        scene.positions = points.positions;
        scene.colors = points.colors;
    }
    let mesh = [dir.join("mesh.glb"), dir.join("mesh.ply")]
        .into_iter()
        .find(|p| p.is_file());
    if let Some(path) = mesh {
        let m = read_file(&path)?;
        let normals = (!m.mesh_normals.is_empty()).then_some(m.mesh_normals.as_slice());
        scene
            .add_mesh(&m.mesh_positions, &m.mesh_colors, normals, &m.triangles)
            .with_context(|| format!("reading {}", path.display()))?;
    }
    let text =
        std::fs::read_to_string(&poses).with_context(|| format!("reading {}", poses.display()))?;
    let mut path = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let m: Vec<f32> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()
            .filter(|m: &Vec<f32>| m.len() == 16 && m.iter().all(|v| v.is_finite()))
            .with_context(|| {
                format!(
                    "{} line {}: not 16 numbers (a 4x4 camera-to-world matrix)",
                    poses.display(),
                    n + 1
                )
            })?;
        // The camera centre, from OpenCV axes to the page's glTF axes.
        path.push([m[3], -m[7], -m[11]]);
    }
    scene.add_polyline(&path, PATH_COLOUR);
    Ok(scene)
}

/// What the page shows, e.g. `300000 of 512000 points, 1 camera, 8 line segments`.
fn summary(scene: &ViewerScene, caps: &ViewerCaps) -> String {
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    let mut parts = Vec::new();
    let points = scene.positions.len();
    if points > 0 {
        parts.push(format!(
            "{} of {}",
            points.min(caps.max_points),
            plural(points, "point")
        ));
    }
    let triangles = scene.triangles.len();
    if triangles > caps.max_triangles {
        parts.push(format!(
            "{} of {} (evenly strided, 1 in {:.1}: the surface shows holes; --max-triangles \
             raises the cap)",
            caps.max_triangles,
            plural(triangles, "triangle"),
            triangles as f64 / caps.max_triangles as f64
        ));
    } else if triangles > 0 {
        parts.push(plural(triangles, "triangle"));
    }
    parts.push(plural(scene.cameras, "camera"));
    if !scene.line_positions.is_empty() {
        parts.push(plural(scene.line_positions.len() / 2, "line segment"));
    }
    parts.join(", ")
}

fn parse_cap(text: &str, most: usize) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: a whole number from 1 to {most}")),
    }
}

fn parse_point_cap(text: &str) -> Result<usize, String> {
    parse_cap(text, 20_000_000)
}

/// Ten million triangles make a page of about 260 MB (sharing vertices as a fused mesh does),
/// half of the longest string V8 holds (2^29 characters); past that the page cannot be read.
fn parse_triangle_cap(text: &str) -> Result<usize, String> {
    parse_cap(text, 10_000_000)
}

type Mat4 = [[f32; 4]; 4];

fn mul(a: &Mat4, b: &Mat4) -> Mat4 {
    // Column-major (gltf's `Transform::matrix`): out[c][r] = sum_k a[k][r] * b[c][k].
    let mut o = [[0.0; 4]; 4];
    for (c, col) in o.iter_mut().enumerate() {
        for (r, v) in col.iter_mut().enumerate() {
            *v = (0..4).map(|k| a[k][r] * b[c][k]).sum();
        }
    }
    o
}

fn apply(m: &Mat4, p: [f32; 3]) -> [f32; 3] {
    [0, 1, 2].map(|r| m[0][r] * p[0] + m[1][r] * p[1] + m[2][r] * p[2] + m[3][r])
}

/// The matrix that carries normals through `m`: the cofactor matrix of its upper 3x3 (the
/// inverse transpose times the determinant, so it exists for any matrix), with the
/// determinant's sign so that a mirroring node keeps normals on their side. Lengths are not
/// kept: the page normalises.
fn normal_matrix(m: &Mat4) -> [[f32; 3]; 3] {
    // a[r][c]: row r, column c of the upper 3x3 (m is column-major).
    let a = |r: usize, c: usize| m[c][r];
    let cof = |r: usize, c: usize| {
        let (r1, r2) = ((r + 1) % 3, (r + 2) % 3);
        let (c1, c2) = ((c + 1) % 3, (c + 2) % 3);
        a(r1, c1) * a(r2, c2) - a(r1, c2) * a(r2, c1)
    };
    let det: f32 = (0..3).map(|c| a(0, c) * cof(0, c)).sum();
    let sign = if det < 0.0 { -1.0 } else { 1.0 };
    [0, 1, 2].map(|r| [0, 1, 2].map(|c| sign * cof(r, c)))
}

/// da3's glb writer names each frustum's mesh `camera <index> (<image>)`.
fn is_da3_frustum(mesh_name: Option<&str>) -> bool {
    mesh_name
        .and_then(|n| n.strip_prefix("camera "))
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

fn read_glb(bytes: &[u8]) -> anyhow::Result<ViewerScene> {
    use gltf::mesh::Mode;
    let gltf = gltf::Gltf::from_slice(bytes).context("not a valid glTF/glb file")?;
    let blob = gltf.blob.as_deref();
    let scene = gltf
        .default_scene()
        .or_else(|| gltf.scenes().next())
        .context("the file has no scene")?;
    let mut out = ViewerScene::default();
    let identity: Mat4 = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, 1.0, 0.0, 0.0],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ];
    let mut stack: Vec<(gltf::Node, Mat4, usize)> =
        scene.nodes().map(|n| (n, identity, 0)).collect();
    while let Some((node, parent, depth)) = stack.pop() {
        if depth > 64 {
            bail!("the node hierarchy is deeper than 64 (a cycle?)");
        }
        let m = mul(&parent, &node.transform().matrix());
        for child in node.children() {
            stack.push((child, m, depth + 1));
        }
        let Some(mesh) = node.mesh() else { continue };
        let name = mesh.name();
        for (p, primitive) in mesh.primitives().enumerate() {
            let what = || format!("mesh {:?} primitive {p}", name.unwrap_or(""));
            let mode = primitive.mode();
            let reader = primitive.reader(|buffer| match buffer.source() {
                gltf::buffer::Source::Bin => blob,
                gltf::buffer::Source::Uri(_) => None,
            });
            let Some(positions) = reader.read_positions() else {
                bail!(
                    "{}: no positions in the file's binary chunk (external buffers are not \
                     read)",
                    what()
                );
            };
            let positions: Vec<[f32; 3]> = positions.map(|p| apply(&m, p)).collect();
            let n = positions.len();
            let colors: Vec<[u8; 3]> = match reader.read_colors(0) {
                Some(c) => c.into_rgb_u8().take(n).collect::<Vec<_>>(),
                None => vec![[200, 200, 200]; n],
            };
            if colors.len() != n {
                bail!("{}: {n} positions but {} colours", what(), colors.len());
            }
            if mode == Mode::Points {
                out.positions.extend(positions);
                out.colors.extend(colors);
                continue;
            }
            // Lines and triangles go through the indices (or the vertices in order).
            let order: Vec<u32> = match reader.read_indices() {
                Some(indices) => indices.into_u32().collect(),
                None => (0..u32::try_from(n).context("too many vertices")?).collect(),
            };
            if let Some(bad) = order.iter().find(|&&i| i as usize >= n) {
                bail!("{}: index {bad} is out of range ({n} vertices)", what());
            }
            let segments: Vec<[u32; 2]> = match mode {
                Mode::Lines => order.chunks_exact(2).map(|s| [s[0], s[1]]).collect(),
                Mode::LineStrip => order.windows(2).map(|s| [s[0], s[1]]).collect(),
                Mode::LineLoop => {
                    let mut s: Vec<[u32; 2]> = order.windows(2).map(|s| [s[0], s[1]]).collect();
                    if let (Some(&first), Some(&last)) = (order.first(), order.last()) {
                        if order.len() > 2 {
                            s.push([last, first]);
                        }
                    }
                    s
                }
                _ => Vec::new(),
            };
            if !segments.is_empty() {
                for i in segments.into_iter().flatten() {
                    out.line_positions.push(positions[i as usize]);
                    out.line_colors.push(colors[i as usize]);
                }
                if is_da3_frustum(name) {
                    out.cameras += 1;
                }
                continue;
            }
            let triangles: Vec<[u32; 3]> = match mode {
                Mode::Triangles => order.chunks_exact(3).map(|t| [t[0], t[1], t[2]]).collect(),
                // As the spec orders them: odd triangles swap their last two corners, so every
                // triangle of the strip winds the same way.
                Mode::TriangleStrip => order
                    .windows(3)
                    .enumerate()
                    .map(|(k, t)| {
                        if k % 2 == 0 {
                            [t[0], t[1], t[2]]
                        } else {
                            [t[0], t[2], t[1]]
                        }
                    })
                    .collect(),
                Mode::TriangleFan => order
                    .get(1..)
                    .unwrap_or_default()
                    .windows(2)
                    .map(|t| [order[0], t[0], t[1]])
                    .collect(),
                _ => continue,
            };
            let normals: Option<Vec<[f32; 3]>> = match reader.read_normals() {
                Some(normals) => {
                    let turn = normal_matrix(&m);
                    let normals: Vec<[f32; 3]> = normals
                        .map(|v| turn.map(|row| row[0] * v[0] + row[1] * v[1] + row[2] * v[2]))
                        .collect();
                    if normals.len() != n {
                        bail!("{}: {n} positions but {} normals", what(), normals.len());
                    }
                    Some(normals)
                }
                None => None,
            };
            out.add_mesh(&positions, &colors, normals.as_deref(), &triangles)
                .with_context(what)?;
        }
    }
    Ok(out)
}

/// One PLY element (a vertex, a face) with only what the viewer uses, instead of
/// `ply-rs-bw`'s map of every property per element: a million faces as maps take several
/// times the memory.
#[derive(Default)]
struct PlyRecord {
    position: [Option<f64>; 3],
    normal: [Option<f64>; 3],
    /// None: no colour or one of a type other than uchar or float (drawn grey).
    color: [Option<u8>; 3],
    /// A face's `vertex_indices` (or `vertex_index`).
    indices: Option<Vec<i64>>,
    /// A 3D Gaussian's (3DGS's PLY layout): `f_dc_0..2`, `opacity` (a logit), `scale_0..2`
    /// (logarithms), `rot_0..3` (w first).
    dc: [Option<f64>; 3],
    opacity: Option<f64>,
    scale: [Option<f64>; 3],
    rotation: [Option<f64>; 4],
}

impl ply_rs_bw::ply::PropertyAccess for PlyRecord {
    fn new() -> Self {
        PlyRecord::default()
    }

    fn set_property(
        &mut self,
        name: &str,
        property: ply_rs_bw::ply::Property,
    ) -> ply_rs_bw::ply::PropertyAccessResult {
        use ply_rs_bw::ply::{Property as P, PropertyAccessResult};
        let number = match property {
            P::Float(v) => Some(v as f64),
            P::Double(v) => Some(v),
            P::Char(v) => Some(v as f64),
            P::UChar(v) => Some(v as f64),
            P::Short(v) => Some(v as f64),
            P::UShort(v) => Some(v as f64),
            P::Int(v) => Some(v as f64),
            P::UInt(v) => Some(v as f64),
            _ => None,
        };
        match name {
            "x" => self.position[0] = number,
            "y" => self.position[1] = number,
            "z" => self.position[2] = number,
            "nx" => self.normal[0] = number,
            "ny" => self.normal[1] = number,
            "nz" => self.normal[2] = number,
            "f_dc_0" | "f_dc_1" | "f_dc_2" => {
                self.dc[(name.as_bytes()[5] - b'0') as usize] = number
            }
            "opacity" => self.opacity = number,
            "scale_0" | "scale_1" | "scale_2" => {
                self.scale[(name.as_bytes()[6] - b'0') as usize] = number
            }
            "rot_0" | "rot_1" | "rot_2" | "rot_3" => {
                self.rotation[(name.as_bytes()[4] - b'0') as usize] = number
            }
            "red" | "green" | "blue" => {
                let k = ["red", "green", "blue"].iter().position(|c| *c == name);
                self.color[k.unwrap_or(0)] = match property {
                    P::UChar(c) => Some(c),
                    // Float colours are 0..1.
                    P::Float(c) => Some((c.clamp(0.0, 1.0) * 255.0).round() as u8),
                    _ => None,
                };
            }
            "vertex_indices" | "vertex_index" => {
                self.indices = match property {
                    P::ListInt(v) => Some(widen(v)),
                    P::ListUInt(v) => Some(widen(v)),
                    P::ListShort(v) => Some(widen(v)),
                    P::ListUShort(v) => Some(widen(v)),
                    P::ListChar(v) => Some(widen(v)),
                    P::ListUChar(v) => Some(widen(v)),
                    _ => None,
                };
            }
            _ => return PropertyAccessResult::Ignored,
        }
        PropertyAccessResult::Set
    }
}

fn widen<T: Into<i64>>(values: Vec<T>) -> Vec<i64> {
    values.into_iter().map(Into::into).collect()
}

impl PlyRecord {
    /// Whether the vertex is a 3D Gaussian (it has every 3DGS property).
    fn is_gaussian(&self) -> bool {
        self.dc
            .iter()
            .chain(&self.scale)
            .chain(&self.rotation)
            .all(Option::is_some)
            && self.opacity.is_some()
    }
}

/// The vertices of a 3DGS PLY (`positions` already in glTF axes) as the scene's Gaussians:
/// opacity through a sigmoid, scales exponentiated, the rotation turned into glTF axes (a
/// half turn about x: the quaternion's y and z negated).
fn read_gaussians(vertices: &[PlyRecord], positions: &[[f32; 3]]) -> anyhow::Result<ViewerScene> {
    let (mut centres, mut dc, mut opacities, mut scales, mut rotations) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, (v, p)) in vertices.iter().zip(positions).enumerate() {
        if !v.is_gaussian() {
            bail!("vertex {i}: not every 3D Gaussian property (f_dc_*, opacity, scale_*, rot_*)");
        }
        let get = |o: Option<f64>| o.unwrap_or(0.0) as f32;
        let scale = v.scale.map(|s| get(s).exp());
        let [w, x, y, z] = v.rotation.map(get);
        let values_finite = p
            .iter()
            .chain(&scale)
            .chain(&[w, x, y, z])
            .all(|c| c.is_finite());
        if !values_finite || get(v.opacity).is_nan() {
            continue;
        }
        centres.push(*p);
        dc.push(v.dc.map(get));
        opacities.push(1.0 / (1.0 + (-get(v.opacity)).exp()));
        scales.push(scale);
        // R' = F R F with F = diag(1, -1, -1): the quaternion (w, x, -y, -z).
        rotations.push([w, x, -y, -z]);
    }
    let mut out = ViewerScene::default();
    out.add_gaussians(&centres, &dc, &opacities, &scales, &rotations)?;
    Ok(out)
}

fn read_ply(bytes: &[u8]) -> anyhow::Result<ViewerScene> {
    let parser = ply_rs_bw::parser::Parser::<PlyRecord>::new();
    let ply = parser
        .read_ply(&mut std::io::Cursor::new(bytes))
        .context("not a valid PLY file")?;
    let Some(vertices) = ply.payload.get("vertex") else {
        bail!("no `vertex` element");
    };
    // OpenCV axes to glTF's: a half turn about x (y and z negated; a rotation, so triangle
    // winding is kept).
    let flip = |[x, y, z]: [f64; 3]| [x as f32, -y as f32, -z as f32];
    let mut positions = Vec::with_capacity(vertices.len());
    let mut colors = Vec::with_capacity(vertices.len());
    let mut normals = Vec::new();
    // The header declares properties per element: if vertex 0 has normals, all have.
    let has_normals = vertices
        .first()
        .is_some_and(|v| v.normal.iter().all(Option::is_some));
    for (i, v) in vertices.iter().enumerate() {
        let [Some(x), Some(y), Some(z)] = v.position else {
            bail!("vertex {i}: no numeric x, y and z");
        };
        positions.push(flip([x, y, z]));
        colors.push(v.color.map(|c| c.unwrap_or(200)));
        if has_normals {
            normals.push(flip(v.normal.map(|c| c.unwrap_or(0.0))));
        }
    }
    let finite = |p: &[f32; 3]| p.iter().all(|c| c.is_finite());
    let mut out = ViewerScene::default();
    if vertices.first().is_some_and(PlyRecord::is_gaussian) {
        return read_gaussians(vertices, &positions);
    }
    let Some(faces) = ply.payload.get("face") else {
        // A point cloud: points without a finite position (da3 writes none) are left out.
        for (p, c) in positions.iter().zip(&colors) {
            if finite(p) {
                out.positions.push(*p);
                out.colors.push(*c);
            }
        }
        return Ok(out);
    };
    let n = positions.len();
    let mut triangles = Vec::with_capacity(faces.len());
    for (f, face) in faces.iter().enumerate() {
        let Some(indices) = &face.indices else {
            bail!("face {f}: no integer list `vertex_indices` (or `vertex_index`)");
        };
        if indices.len() < 3 {
            bail!(
                "face {f}: {} vertices (a face needs 3 or more)",
                indices.len()
            );
        }
        if let Some(bad) = indices.iter().find(|&&i| i < 0 || i as usize >= n) {
            bail!("face {f}: vertex index {bad} is out of range (the file has {n} vertices)");
        }
        // In range, so they fit u32 (the scene refuses more vertices than that).
        let corner = |k: usize| indices[k] as u32;
        // A polygon as a fan of triangles around its first vertex (right for convex ones,
        // which is what meshes hold).
        for k in 1..indices.len() - 1 {
            triangles.push([corner(0), corner(k), corner(k + 1)]);
        }
    }
    // Triangles touching a vertex without a finite position are dropped (the rest keep their
    // shape); the scene would refuse them.
    if !positions.iter().all(finite) {
        triangles.retain(|t| t.iter().all(|&i| finite(&positions[i as usize])));
        for p in positions.iter_mut().filter(|p| !finite(p)) {
            *p = [0.0; 3];
        }
    }
    // A normal that is not finite is no direction: zero, which the page lights as ambient.
    for n in normals.iter_mut().filter(|n| !finite(n)) {
        *n = [0.0; 3];
    }
    let normals = has_normals.then_some(normals);
    out.add_mesh(&positions, &colors, normals.as_deref(), &triangles)?;
    Ok(out)
}
