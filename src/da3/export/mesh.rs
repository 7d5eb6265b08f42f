//! Triangle meshes (such as [`crate::geometry::TsdfVolume::extract_mesh`]'s) as PLY and glb.
//!
//! PLY (the PLY 1.0 format, binary little-endian): an ASCII header `ply`,
//! `format binary_little_endian 1.0`, a comment, `element vertex N` with the properties
//! `float x`, `float y`, `float z`, `float nx`, `float ny`, `float nz`, `uchar red`,
//! `uchar green`, `uchar blue`, then `element face M` with `property list uchar uint
//! vertex_indices`, `end_header` and a newline; then N vertex records of 27 bytes (six
//! little-endian f32, three u8) and M face records of 13 bytes (the count 3, three
//! little-endian u32), no padding. Coordinates are the mesh's own (for a reconstruction, the
//! world frame in OpenCV axes: x right, y down, z forward), as in da3's point-cloud PLYs.
//!
//! glb (binary glTF 2.0): one node with one mesh of one TRIANGLES primitive: POSITION and
//! NORMAL (f32 x3), COLOR_0 (u8 RGBA, normalised) and indices (u32), with a matte white
//! material (metallic 0, roughness 1) that the vertex colours tint. Positions and normals are
//! converted to glTF's axes (x right, y up, z backward) by negating y and z, as in da3's scene
//! glb; that is a half turn about x, so triangles keep their winding (counter-clockwise seen
//! from outside, glTF's front faces). Unlike the scene glb, the mesh is not re-centred: its
//! coordinates are the world's. Binary chunk: positions, normals, colours, indices, each
//! section starting on a 4-byte boundary. A mesh without triangles gives a glb without a
//! scene.
//!
//! Both are written atomically ([`crate::atomic_file`]): an error leaves no file behind.

use super::super::Error;
use crate::atomic_file;
use crate::geometry::Mesh;
use gltf_json as json;
use json::validation::Checked::Valid;
use json::validation::USize64;
use std::collections::BTreeMap;
use std::path::Path;

/// Checks that `mesh` has one normal and one colour per vertex, finite positions and normals,
/// and triangles whose indices are in range.
fn check(mesh: &Mesh) -> Result<(), Error> {
    let n = mesh.vertices.len();
    for (what, len) in [
        ("normals", mesh.normals.len()),
        ("colours", mesh.colors.len()),
    ] {
        if len != n {
            return Err(Error::Input(format!(
                "mesh has {n} vertices but {len} {what}"
            )));
        }
    }
    let not_finite = |v: &[f32; 3]| !v.iter().all(|c| c.is_finite());
    if let Some(i) = mesh.vertices.iter().position(not_finite) {
        return Err(Error::Input(format!(
            "mesh vertex {i} is not finite: {:?}",
            mesh.vertices[i]
        )));
    }
    if let Some(i) = mesh.normals.iter().position(not_finite) {
        return Err(Error::Input(format!(
            "mesh normal {i} is not finite: {:?}",
            mesh.normals[i]
        )));
    }
    let out_of_range = |t: &[u32; 3]| t.iter().any(|&i| i as usize >= n);
    if let Some(f) = mesh.triangles.iter().position(out_of_range) {
        return Err(Error::Input(format!(
            "mesh triangle {f} {:?} indexes past its {n} vertices",
            mesh.triangles[f]
        )));
    }
    Ok(())
}

/// Writes `mesh` as a binary little-endian PLY file (atomically).
///
/// # Errors
/// [`Error::Input`] when the mesh is inconsistent (normals or colours not one per vertex, a
/// non-finite position or normal, an index out of range); [`Error::Output`] when the file
/// cannot be written.
pub fn write_mesh_ply(path: &Path, mesh: &Mesh) -> Result<(), Error> {
    check(mesh)?;
    Ok(atomic_file::write(path, |w| {
        write!(
            w,
            "ply\nformat binary_little_endian 1.0\ncomment written by da3 (Depth Anything 3)\n\
             element vertex {}\nproperty float x\nproperty float y\nproperty float z\n\
             property float nx\nproperty float ny\nproperty float nz\n\
             property uchar red\nproperty uchar green\nproperty uchar blue\n\
             element face {}\nproperty list uchar uint vertex_indices\nend_header\n",
            mesh.vertices.len(),
            mesh.triangles.len()
        )?;
        let mut record = [0u8; 27];
        for ((p, n), c) in mesh.vertices.iter().zip(&mesh.normals).zip(&mesh.colors) {
            for (k, v) in p.iter().chain(n).enumerate() {
                record[k * 4..k * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            record[24..].copy_from_slice(c);
            w.write_all(&record)?;
        }
        let mut face = [3u8; 13];
        for t in &mesh.triangles {
            for (k, i) in t.iter().enumerate() {
                face[1 + k * 4..5 + k * 4].copy_from_slice(&i.to_le_bytes());
            }
            w.write_all(&face)?;
        }
        Ok(())
    })?)
}

/// OpenCV axes to glTF's: y and z negated.
fn to_gltf_axes(v: &[f32; 3]) -> [f32; 3] {
    [v[0], -v[1], -v[2]]
}

/// The glb's JSON and binary chunk under construction.
struct Builder {
    root: json::Root,
    bin: Vec<u8>,
    buffer: json::Index<json::Buffer>,
}

impl Builder {
    /// Appends `bytes` as a buffer view (starting on a 4-byte boundary) for `target`.
    fn section(
        &mut self,
        bytes: &[u8],
        target: json::buffer::Target,
    ) -> json::Index<json::buffer::View> {
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
            target: Some(Valid(target)),
            extensions: None,
            extras: Default::default(),
        })
    }

    /// An accessor over a whole view. `bounds`: the min and max glTF requires of POSITION.
    fn accessor(
        &mut self,
        view: json::Index<json::buffer::View>,
        count: usize,
        (component, type_, normalized): (json::accessor::ComponentType, json::accessor::Type, bool),
        bounds: Option<([f32; 3], [f32; 3])>,
    ) -> json::Index<json::Accessor> {
        let (min, max) = match bounds {
            Some((lo, hi)) => (
                Some(json::Value::from(lo.to_vec())),
                Some(json::Value::from(hi.to_vec())),
            ),
            None => (None, None),
        };
        self.root.push(json::Accessor {
            buffer_view: Some(view),
            byte_offset: Some(USize64(0)),
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
}

/// Writes `mesh` as a glb file (atomically), in glTF's axes.
///
/// # Errors
/// [`Error::Input`] when the mesh is inconsistent (as for [`write_mesh_ply`]) or too large for
/// one glb file (4 GiB); [`Error::Output`] when the file cannot be written.
pub fn write_mesh_glb(path: &Path, mesh: &Mesh) -> Result<(), Error> {
    use json::accessor::{ComponentType, Type};
    check(mesh)?;
    // 28 bytes a vertex and 12 a triangle, plus the JSON, must stay under u32 lengths.
    let bytes = mesh.vertices.len() as u64 * 28 + mesh.triangles.len() as u64 * 12;
    if bytes > u32::MAX as u64 - (1 << 20) {
        return Err(Error::Input(format!(
            "a mesh of {} vertices and {} triangles is too large for one glb file (4 GiB)",
            mesh.vertices.len(),
            mesh.triangles.len()
        )));
    }
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
    if !mesh.triangles.is_empty() {
        let positions: Vec<[f32; 3]> = mesh.vertices.iter().map(to_gltf_axes).collect();
        let normals: Vec<[f32; 3]> = mesh.normals.iter().map(to_gltf_axes).collect();
        let (mut lo, mut hi) = ([f32::INFINITY; 3], [f32::NEG_INFINITY; 3]);
        for p in &positions {
            for k in 0..3 {
                lo[k] = lo[k].min(p[k]);
                hi[k] = hi[k].max(p[k]);
            }
        }
        let colors: Vec<u8> = mesh
            .colors
            .iter()
            .flat_map(|&[r, g, b]| [r, g, b, 255])
            .collect();
        let indices: Vec<u8> = mesh
            .triangles
            .iter()
            .flatten()
            .flat_map(|i| i.to_le_bytes())
            .collect();
        let n = positions.len();
        let vec3 = (ComponentType::F32, Type::Vec3, false);
        let attribute = json::buffer::Target::ArrayBuffer;
        let view = b.section(&super::glb::f32_bytes(&positions), attribute);
        let position = b.accessor(view, n, vec3, Some((lo, hi)));
        let view = b.section(&super::glb::f32_bytes(&normals), attribute);
        let normal = b.accessor(view, n, vec3, None);
        let view = b.section(&colors, attribute);
        let color = b.accessor(view, n, (ComponentType::U8, Type::Vec4, true), None);
        let view = b.section(&indices, json::buffer::Target::ElementArrayBuffer);
        let scalar = (ComponentType::U32, Type::Scalar, false);
        let index = b.accessor(view, mesh.triangles.len() * 3, scalar, None);
        let material = b.root.push(json::Material {
            name: Some("vertex colours".into()),
            pbr_metallic_roughness: json::material::PbrMetallicRoughness {
                metallic_factor: json::material::StrengthFactor(0.0),
                roughness_factor: json::material::StrengthFactor(1.0),
                ..Default::default()
            },
            ..Default::default()
        });
        let attributes = BTreeMap::from([
            (Valid(json::mesh::Semantic::Positions), position),
            (Valid(json::mesh::Semantic::Normals), normal),
            (Valid(json::mesh::Semantic::Colors(0)), color),
        ]);
        let gltf_mesh = b.root.push(json::Mesh {
            extensions: None,
            extras: Default::default(),
            name: Some("mesh".into()),
            primitives: vec![json::mesh::Primitive {
                attributes,
                extensions: None,
                extras: Default::default(),
                indices: Some(index),
                material: Some(material),
                mode: Valid(json::mesh::Mode::Triangles),
                targets: None,
            }],
            weights: None,
        });
        nodes.push(b.root.push(json::Node {
            mesh: Some(gltf_mesh),
            name: Some("mesh".into()),
            ..Default::default()
        }));
    }
    let Builder {
        mut root, mut bin, ..
    } = b;
    if bin.is_empty() {
        // A buffer of length 0 is invalid glTF: keep one padded word.
        bin.extend_from_slice(&[0; 4]);
    }
    root.buffers[0].byte_length = USize64(bin.len() as u64);
    // A scene lists at least one node: an empty mesh gives a document with no scene (which
    // glTF allows, and readers such as `gltf` require).
    if !nodes.is_empty() {
        let scene = root.push(json::Scene {
            extensions: None,
            extras: Default::default(),
            name: Some("da3 mesh".into()),
            nodes,
        });
        root.scene = Some(scene);
    }
    super::glb::write_glb_file(path, &root, bin)
}
