//! glb (binary glTF 2.0): the point cloud as a POINTS primitive with COLOR_0, and one camera
//! frustum per view as a LINES primitive.
//!
//! As the official glb export (`export_to_glb`): the scene is expressed in the first camera's
//! frame converted to glTF axes (x right, y up, z backward: y and z flipped) and centred on the
//! per-axis median of the points; frustums are pyramids from the camera centre to the image
//! corners `(0, 0)`, `(W-1, 0)`, `(W-1, H-1)`, `(0, H-1)` on the plane at depth
//! `camera_size x scene scale` (scene scale: the length of the 5th-to-95th percentile box of
//! the points), coloured by view index around the HSV hue circle.
//!
//! Binary chunk layout: point positions (f32 x3), point colours (u8 RGBA, normalised), frustum
//! positions (f32 x3, 16 per view: 8 segments), frustum colours (u8 RGBA); every section starts
//! on a 4-byte boundary. The JSON is built with `gltf-json` and the container written by
//! `gltf`'s `Glb`.

use super::super::Error;
use super::{camera_to_world, invert3, mat3_vec, to_f64, PointCloud, View};
use crate::atomic_file;
use gltf_json as json;
use json::validation::Checked::Valid;
use json::validation::USize64;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::Path;

/// What a glb holds besides the points.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GlbOptions {
    /// Draw one frustum per view (official `show_cameras`, true).
    pub cameras: bool,
    /// Frustum depth as a fraction of the scene scale (official `camera_size`, 0.03).
    pub camera_size: f64,
}

impl Default for GlbOptions {
    fn default() -> Self {
        GlbOptions {
            cameras: true,
            camera_size: 0.03,
        }
    }
}

pub(super) type Mat4 = [[f64; 4]; 4];

fn mat4_mul(a: &Mat4, b: &Mat4) -> Mat4 {
    let mut out = [[0.0; 4]; 4];
    for (r, row) in out.iter_mut().enumerate() {
        for (c, v) in row.iter_mut().enumerate() {
            *v = (0..4).map(|k| a[r][k] * b[k][c]).sum();
        }
    }
    out
}

pub(super) fn transform(a: &Mat4, p: [f64; 3]) -> [f64; 3] {
    [0, 1, 2].map(|r| a[r][0] * p[0] + a[r][1] * p[1] + a[r][2] * p[2] + a[r][3])
}

/// Linear-interpolated percentile (numpy's default) of `values` (sorted in place).
fn percentile(values: &mut [f64], q: f64) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let pos = q / 100.0 * (values.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    values[lo] + (values[hi] - values[lo]) * (pos - lo as f64)
}

/// The official alignment: `A = T(-median) * diag(1, -1, -1, 1) * w2c_0`.
pub(super) fn alignment(first: &View<'_>, cloud: &PointCloud) -> Mat4 {
    let e = to_f64(&first.pose.extrinsics);
    let w2c0: Mat4 = [e[0], e[1], e[2], [0.0, 0.0, 0.0, 1.0]];
    let flip: Mat4 = [
        [1.0, 0.0, 0.0, 0.0],
        [0.0, -1.0, 0.0, 0.0],
        [0.0, 0.0, -1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ];
    let mut a = mat4_mul(&flip, &w2c0);
    if !cloud.is_empty() {
        let moved: Vec<[f64; 3]> = cloud
            .positions
            .iter()
            .map(|p| transform(&a, p.map(f64::from)))
            .collect();
        for axis in 0..3 {
            let mut v: Vec<f64> = moved.iter().map(|p| p[axis]).collect();
            a[axis][3] -= percentile(&mut v, 50.0);
        }
    }
    a
}

pub(super) fn scene_scale(points: &[[f64; 3]]) -> f64 {
    if points.len() < 2 {
        return 1.0;
    }
    let mut sq = 0.0;
    for axis in 0..3 {
        let mut v: Vec<f64> = points.iter().map(|p| p[axis]).collect();
        let lo = percentile(&mut v, 5.0);
        let hi = percentile(&mut v, 95.0);
        sq += (hi - lo) * (hi - lo);
    }
    let diag = sq.sqrt();
    if diag.is_finite() && diag > 0.0 {
        diag
    } else {
        1.0
    }
}

/// The 8 segments (16 endpoints) of a view's frustum in world coordinates.
pub(super) fn frustum(view: &View<'_>, scale: f64) -> [[f64; 3]; 16] {
    let (w, h) = ((view.width - 1) as f64, (view.height - 1) as f64);
    let k_inv = invert3(&to_f64(&view.pose.intrinsics)).expect("validated");
    let (rot, centre) = camera_to_world(&view.pose).expect("validated");
    let corners = [[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]].map(|[u, v]| {
        let ray = mat3_vec(&k_inv, [u, v, 1.0]);
        let z = if ray[2] == 0.0 { 1.0 } else { ray[2] };
        let cam = ray.map(|r| r / z * scale);
        let world = mat3_vec(&rot, cam);
        [0, 1, 2].map(|i| world[i] + centre[i])
    });
    let mut out = [[0.0; 3]; 16];
    for k in 0..4 {
        out[2 * k] = centre;
        out[2 * k + 1] = corners[k];
        out[8 + 2 * k] = corners[k];
        out[8 + 2 * k + 1] = corners[(k + 1) % 4];
    }
    out
}

/// The official `_index_color_rgb`: hue `(i + 0.5) / n`, saturation 0.85, value 0.95.
pub(super) fn index_color(i: usize, n: usize) -> [u8; 3] {
    let h = (i as f64 + 0.5) / n.max(1) as f64;
    let (s, v) = (0.85, 0.95);
    let sector = (h * 6.0) as i64;
    let f = h * 6.0 - sector as f64;
    let (p, q, t) = (v * (1.0 - s), v * (1.0 - f * s), v * (1.0 - (1.0 - f) * s));
    let (r, g, b) = match sector % 6 {
        0 => (v, t, p),
        1 => (q, v, p),
        2 => (p, v, t),
        3 => (p, q, v),
        4 => (t, p, v),
        _ => (v, p, q),
    };
    [r, g, b].map(|c| (c * 255.0) as u8)
}

struct Builder {
    root: json::Root,
    bin: Vec<u8>,
    buffer: json::Index<json::Buffer>,
}

impl Builder {
    fn section(&mut self, bytes: &[u8]) -> json::Index<json::buffer::View> {
        let offset = self.bin.len();
        self.bin.extend_from_slice(bytes);
        while !self.bin.len().is_multiple_of(4) {
            self.bin.push(0);
        }
        self.root.push(json::buffer::View {
            buffer: self.buffer,
            byte_length: USize64(bytes.len() as u64),
            byte_offset: Some(USize64(offset as u64)),
            byte_stride: None,
            name: None,
            target: Some(Valid(json::buffer::Target::ArrayBuffer)),
            extensions: None,
            extras: Default::default(),
        })
    }

    fn accessor(
        &mut self,
        view: json::Index<json::buffer::View>,
        byte_offset: usize,
        count: usize,
        positions: Option<&[[f32; 3]]>,
    ) -> json::Index<json::Accessor> {
        let (component, type_, normalized, min, max) = match positions {
            Some(p) => {
                let mut lo = [f32::INFINITY; 3];
                let mut hi = [f32::NEG_INFINITY; 3];
                for q in p {
                    for k in 0..3 {
                        lo[k] = lo[k].min(q[k]);
                        hi[k] = hi[k].max(q[k]);
                    }
                }
                (
                    json::accessor::ComponentType::F32,
                    json::accessor::Type::Vec3,
                    false,
                    Some(json::Value::from(lo.to_vec())),
                    Some(json::Value::from(hi.to_vec())),
                )
            }
            None => (
                json::accessor::ComponentType::U8,
                json::accessor::Type::Vec4,
                true,
                None,
                None,
            ),
        };
        self.root.push(json::Accessor {
            buffer_view: Some(view),
            byte_offset: Some(USize64(byte_offset as u64)),
            count: USize64(count as u64),
            component_type: Valid(json::accessor::GenericComponentType(component)),
            extensions: None,
            extras: Default::default(),
            type_: Valid(type_),
            min,
            max,
            name: None,
            normalized,
            sparse: None,
        })
    }

    fn mesh(
        &mut self,
        name: String,
        mode: json::mesh::Mode,
        positions: json::Index<json::Accessor>,
        colors: json::Index<json::Accessor>,
    ) -> json::Index<json::Node> {
        let attributes = BTreeMap::from([
            (Valid(json::mesh::Semantic::Positions), positions),
            (Valid(json::mesh::Semantic::Colors(0)), colors),
        ]);
        let mesh = self.root.push(json::Mesh {
            extensions: None,
            extras: Default::default(),
            name: Some(name.clone()),
            primitives: vec![json::mesh::Primitive {
                attributes,
                extensions: None,
                extras: Default::default(),
                indices: None,
                material: None,
                mode: Valid(mode),
                targets: None,
            }],
            weights: None,
        });
        self.root.push(json::Node {
            mesh: Some(mesh),
            name: Some(name),
            ..Default::default()
        })
    }
}

/// Little-endian bytes of 3-vectors, as glTF's float accessors read them.
pub(super) fn f32_bytes(points: &[[f32; 3]]) -> Vec<u8> {
    points
        .iter()
        .flatten()
        .flat_map(|v| v.to_le_bytes())
        .collect()
}

fn rgba_bytes(colors: impl Iterator<Item = [u8; 3]>) -> Vec<u8> {
    colors.flat_map(|[r, g, b]| [r, g, b, 255]).collect()
}

/// Writes `cloud` (world frame, from [`super::point_cloud`] over `views`) and the views'
/// frustums as a glb file (atomically).
///
/// The first view of a scene to draw, once every view is valid and the cloud's colours match
/// its positions; `what` names the export in the error.
pub(super) fn check_scene<'v, 'd>(
    cloud: &PointCloud,
    views: &'v [View<'d>],
    what: &str,
) -> Result<&'v View<'d>, Error> {
    let first = views
        .first()
        .ok_or_else(|| Error::Input(format!("{what} needs at least one view")))?;
    for v in views {
        v.validate()?;
    }
    if cloud.colors.len() != cloud.positions.len() {
        return Err(Error::Input(format!(
            "point cloud has {} positions but {} colours",
            cloud.positions.len(),
            cloud.colors.len()
        )));
    }
    Ok(first)
}

/// # Errors
/// [`Error::Input`] when `views` is empty or invalid, or the scene exceeds glb's 4 GiB.
pub fn write_glb(
    path: &Path,
    cloud: &PointCloud,
    views: &[View<'_>],
    options: &GlbOptions,
) -> Result<(), Error> {
    let first = check_scene(cloud, views, "a glb export")?;
    if !(options.camera_size.is_finite() && options.camera_size > 0.0) {
        return Err(Error::Input(format!(
            "camera size {} must be positive",
            options.camera_size
        )));
    }
    // 16 bytes per point plus frustums and JSON must stay under u32 lengths.
    if (cloud.len() as u64) * 16 + (views.len() as u64) * 16 * 16 > u32::MAX as u64 - (1 << 20) {
        return Err(Error::Input(format!(
            "{} points are too many for one glb file (4 GiB)",
            cloud.len()
        )));
    }
    let a = alignment(first, cloud);
    let moved: Vec<[f64; 3]> = cloud
        .positions
        .iter()
        .map(|p| transform(&a, p.map(f64::from)))
        .collect();
    let points: Vec<[f32; 3]> = moved.iter().map(|p| p.map(|v| v as f32)).collect();

    let mut root = json::Root::default();
    root.asset.generator = Some("da3 (Depth Anything 3 on ggml)".into());
    let buffer = root.push(json::Buffer {
        byte_length: USize64(0),
        name: None,
        uri: None,
        extensions: None,
        extras: Default::default(),
    });
    let mut b = Builder {
        root,
        bin: Vec::new(),
        buffer,
    };
    let mut nodes = Vec::new();
    if !points.is_empty() {
        let pv = b.section(&f32_bytes(&points));
        let cv = b.section(&rgba_bytes(cloud.colors.iter().copied()));
        let pa = b.accessor(pv, 0, points.len(), Some(&points));
        let ca = b.accessor(cv, 0, points.len(), None);
        nodes.push(b.mesh("points".into(), json::mesh::Mode::Points, pa, ca));
    }
    if options.cameras {
        let scale = scene_scale(&moved) * options.camera_size;
        let lines: Vec<Vec<[f32; 3]>> = views
            .iter()
            .map(|v| {
                frustum(v, scale)
                    .iter()
                    .map(|p| transform(&a, *p).map(|c| c as f32))
                    .collect()
            })
            .collect();
        let all: Vec<[f32; 3]> = lines.iter().flatten().copied().collect();
        let colors = (0..views.len()).flat_map(|i| [index_color(i, views.len()); 16]);
        let pv = b.section(&f32_bytes(&all));
        let cv = b.section(&rgba_bytes(colors));
        for (i, segs) in lines.iter().enumerate() {
            let pa = b.accessor(pv, i * 16 * 12, 16, Some(segs));
            let ca = b.accessor(cv, i * 16 * 4, 16, None);
            let name = format!("camera {i} ({})", views[i].name);
            nodes.push(b.mesh(name, json::mesh::Mode::Lines, pa, ca));
        }
    }
    let Builder {
        mut root, mut bin, ..
    } = b;
    root.buffers[0].byte_length = USize64(bin.len() as u64);
    let scene = root.push(json::Scene {
        extensions: None,
        extras: Default::default(),
        name: Some("da3".into()),
        nodes,
    });
    root.scene = Some(scene);
    if bin.is_empty() {
        // A buffer of length 0 is invalid glTF: keep one padded word.
        bin.extend_from_slice(&[0; 4]);
        root.buffers[0].byte_length = USize64(4);
    }
    write_glb_file(path, &root, bin)
}

/// Writes a glTF document and its binary chunk as one glb file (atomically): the container
/// every glb export of this module and [`super::write_mesh_glb`] share.
pub(super) fn write_glb_file(path: &Path, root: &json::Root, bin: Vec<u8>) -> Result<(), Error> {
    let json_bytes = root.to_vec().map_err(|e| Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    let glb = gltf::binary::Glb {
        header: gltf::binary::Header {
            magic: *b"glTF",
            version: 2,
            length: 0, // computed by `to_writer`
        },
        json: Cow::Owned(json_bytes),
        bin: Some(Cow::Owned(bin)),
    };
    Ok(atomic_file::write(path, |w| {
        glb.to_writer(w).map_err(|e| match e {
            gltf::Error::Io(io) => io,
            other => std::io::Error::other(other.to_string()),
        })
    })?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_colors_follow_the_hue_circle() {
        // h = 0.5 / 1 -> sector 3: (p, q, v) with f = 0.
        assert_eq!(index_color(0, 1), [36, 242, 242]);
        // h = 0.25 -> sector 1, f = 0.5: (q, v, p).
        assert_eq!(index_color(0, 2), [139, 242, 36]);
    }

    #[test]
    fn percentile_matches_numpy() {
        // np.percentile([1, 2, 3, 4], 50) == 2.5; np.percentile([0, 10], 5) == 0.5
        assert_eq!(percentile(&mut [4.0, 1.0, 3.0, 2.0], 50.0), 2.5);
        assert!((percentile(&mut [0.0, 10.0], 5.0) - 0.5).abs() < 1e-12);
    }
}
