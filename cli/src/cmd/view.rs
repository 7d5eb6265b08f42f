//! `da3 view`: a self-contained HTML page (our own WebGL, nothing fetched) for a PLY or glb
//! point cloud, written next to it.
//!
//! glb: every POINTS primitive (positions, COLOR_0) and every LINES primitive (the camera
//! frustums da3's glb holds) of the default scene, with the nodes' transforms applied, read
//! with the `gltf` crate. PLY: the `vertex` element's x, y, z and red, green, blue (read with
//! `ply-rs-bw`; ASCII or binary), flipped from OpenCV axes (y down, z forward, as da3's PLY
//! files are) to the viewer's glTF axes (y up, z backward); a PLY holds no cameras.

use anyhow::{bail, Context as _};
use da3::export::{write_viewer, ViewerCaps, ViewerScene, DEFAULT_VIEWER_POINTS};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A point cloud: FILE.glb (points and camera frustums) or FILE.ply (points).
    #[arg(value_name = "FILE.ply|FILE.glb")]
    input: PathBuf,
    /// The page to write. Default: the input's name with `.html`, next to it.
    #[arg(short, long, value_name = "FILE.html")]
    output: Option<PathBuf>,
    /// Most points the page embeds (evenly strided above it; about 20 bytes each).
    #[arg(long, default_value_t = DEFAULT_VIEWER_POINTS, value_parser = parse_cap)]
    max_points: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| args.input.with_extension("html"));
    if output == args.input {
        bail!(
            "--output {}: that is the input; name another file",
            output.display()
        );
    }
    // Before reading anything big: the page can be written.
    da3::atomic_file::check_writable(&output)
        .with_context(|| format!("--output {}", output.display()))?;
    let bytes =
        std::fs::read(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    let ext = args
        .input
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase());
    let scene = match ext.as_deref() {
        Some("glb") | Some("gltf") => read_glb(&bytes),
        Some("ply") => read_ply(&bytes),
        _ if bytes.starts_with(b"glTF") => read_glb(&bytes),
        _ if bytes.starts_with(b"ply") => read_ply(&bytes),
        _ => bail!(
            "{}: not a .ply or .glb file (by name or content)",
            args.input.display()
        ),
    }
    .with_context(|| format!("reading {}", args.input.display()))?;
    if scene.positions.is_empty() && scene.line_positions.is_empty() {
        bail!("{}: holds no points and no lines", args.input.display());
    }
    let title = args
        .input
        .file_name()
        .map_or_else(|| "da3".into(), |n| n.to_string_lossy().into_owned());
    let caps = ViewerCaps {
        max_points: args.max_points,
        ..ViewerCaps::default()
    };
    write_viewer(&output, &scene, &title, &caps)?;
    let shown = scene.positions.len().min(args.max_points);
    outln!(
        "wrote {} ({shown} of {} points, {} camera{})",
        output.display(),
        scene.positions.len(),
        scene.cameras,
        if scene.cameras == 1 { "" } else { "s" }
    );
    Ok(ExitCode::SUCCESS)
}

fn parse_cap(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=20_000_000).contains(&n) => Ok(n),
        _ => Err(format!("{text:?}: a whole number from 1 to 20000000")),
    }
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

fn read_glb(bytes: &[u8]) -> anyhow::Result<ViewerScene> {
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
        for primitive in mesh.primitives() {
            let mode = primitive.mode();
            if !matches!(mode, gltf::mesh::Mode::Points | gltf::mesh::Mode::Lines) {
                continue;
            }
            let reader = primitive.reader(|buffer| match buffer.source() {
                gltf::buffer::Source::Bin => blob,
                gltf::buffer::Source::Uri(_) => None,
            });
            let Some(positions) = reader.read_positions() else {
                bail!(
                    "mesh {:?}: no positions in the file's binary chunk (external buffers are \
                     not read)",
                    mesh.name().unwrap_or("")
                );
            };
            let positions: Vec<[f32; 3]> = positions.map(|p| apply(&m, p)).collect();
            let colors: Vec<[u8; 3]> = match reader.read_colors(0) {
                Some(c) => c.into_rgb_u8().take(positions.len()).collect::<Vec<_>>(),
                None => vec![[200, 200, 200]; positions.len()],
            };
            if colors.len() != positions.len() {
                bail!(
                    "mesh {:?}: {} positions but {} colours",
                    mesh.name().unwrap_or(""),
                    positions.len(),
                    colors.len()
                );
            }
            if mode == gltf::mesh::Mode::Points {
                out.positions.extend(positions);
                out.colors.extend(colors);
            } else {
                let even = positions.len() / 2 * 2;
                out.line_positions.extend(&positions[..even]);
                out.line_colors.extend(&colors[..even]);
                out.cameras += 1;
            }
        }
    }
    Ok(out)
}

fn read_ply(bytes: &[u8]) -> anyhow::Result<ViewerScene> {
    use ply_rs_bw::ply::Property;
    let parser = ply_rs_bw::parser::Parser::<ply_rs_bw::ply::DefaultElement>::new();
    let ply = parser
        .read_ply(&mut std::io::Cursor::new(bytes))
        .context("not a valid PLY file")?;
    let Some(vertices) = ply.payload.get("vertex") else {
        bail!("no `vertex` element");
    };
    let number = |p: Option<&Property>| -> Option<f64> {
        Some(match p? {
            Property::Float(v) => *v as f64,
            Property::Double(v) => *v,
            Property::Char(v) => *v as f64,
            Property::UChar(v) => *v as f64,
            Property::Short(v) => *v as f64,
            Property::UShort(v) => *v as f64,
            Property::Int(v) => *v as f64,
            Property::UInt(v) => *v as f64,
            _ => return None,
        })
    };
    let mut out = ViewerScene::default();
    for (i, v) in vertices.iter().enumerate() {
        let xyz = ["x", "y", "z"].map(|k| number(v.get(k)));
        let [Some(x), Some(y), Some(z)] = xyz else {
            bail!("vertex {i}: no numeric x, y and z");
        };
        let p = [x as f32, -y as f32, -z as f32];
        if !p.iter().all(|c| c.is_finite()) {
            continue;
        }
        let colour = |k: &str| match v.get(k) {
            Some(Property::UChar(c)) => *c,
            // Float colours are 0..1.
            Some(Property::Float(c)) => (c.clamp(0.0, 1.0) * 255.0).round() as u8,
            _ => 200,
        };
        out.positions.push(p);
        out.colors
            .push([colour("red"), colour("green"), colour("blue")]);
    }
    Ok(out)
}
