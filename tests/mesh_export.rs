//! Fused meshes written as PLY and glb, read back with independent readers (`ply-rs-bw`,
//! `gltf`): the same counts and values, in the documented layouts and axes; bad meshes and
//! unwritable paths are errors that leave no file behind.

use da3::export::{write_mesh_glb, write_mesh_ply};
use da3::geometry::sim3::Sim3;
use da3::geometry::{DepthFrame, Mesh, TsdfOptions, TsdfVolume};
use std::path::Path;

/// A mesh from the fusion itself: a wall at depth 2 seen by an identity camera, its depth
/// tilted a little so that normals and colours vary.
fn fused_mesh() -> Mesh {
    let (width, height) = (48, 36);
    let k = [[40.0, 0.0, 23.5], [0.0, 40.0, 17.5], [0.0, 0.0, 1.0]];
    let depth: Vec<f32> = (0..width * height)
        .map(|i| 2.0 + 0.004 * (i % width) as f32)
        .collect();
    let colors: Vec<[u8; 3]> = (0..width * height)
        .map(|i| [(i % width * 5) as u8, (i / width * 7) as u8, 90])
        .collect();
    let mut volume = TsdfVolume::new(TsdfOptions::new(0.05)).unwrap();
    volume
        .integrate(&DepthFrame {
            width,
            height,
            depth: &depth,
            weights: None,
            colors: Some(&colors),
            intrinsics: k,
            camera_to_world: Sim3::IDENTITY,
        })
        .unwrap();
    let mesh = volume.extract_mesh();
    assert!(mesh.triangles.len() > 100, "{}", mesh.triangles.len());
    mesh
}

/// A tetrahedron, small enough to check by eye.
fn tetrahedron() -> Mesh {
    Mesh {
        vertices: vec![
            [0.0, 0.0, 0.0],
            [1.0, 0.0, 0.0],
            [0.0, 1.0, 0.0],
            [0.0, 0.0, 1.0],
        ],
        normals: vec![
            [-0.577, -0.577, -0.577],
            [1.0, 0.0, 0.0],
            [0.0, 1.0, 0.0],
            [0.0, 0.0, 1.0],
        ],
        colors: vec![[255, 0, 0], [0, 255, 0], [0, 0, 255], [10, 20, 30]],
        triangles: vec![[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]],
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read_ply(path: &Path) -> ply_rs_bw::ply::Ply<ply_rs_bw::ply::DefaultElement> {
    let parser = ply_rs_bw::parser::Parser::<ply_rs_bw::ply::DefaultElement>::new();
    parser
        .read_ply(&mut std::fs::File::open(path).unwrap())
        .unwrap()
}

#[test]
fn ply_reads_back_with_ply_rs() {
    use ply_rs_bw::ply::Property;
    let dir = tempfile::tempdir().unwrap();
    for (name, mesh) in [("tetrahedron", tetrahedron()), ("fused", fused_mesh())] {
        let path = dir.path().join(format!("{name}.ply"));
        write_mesh_ply(&path, &mesh).unwrap();
        let ply = read_ply(&path);
        assert_eq!(
            ply.header.encoding,
            ply_rs_bw::ply::Encoding::BinaryLittleEndian
        );
        let vertices = &ply.payload["vertex"];
        let faces = &ply.payload["face"];
        assert_eq!(vertices.len(), mesh.vertices.len());
        assert_eq!(faces.len(), mesh.triangles.len());
        for (i, v) in vertices.iter().enumerate() {
            let f = |k: &str| match v[k] {
                Property::Float(x) => x,
                ref other => panic!("{k}: {other:?}"),
            };
            let b = |k: &str| match v[k] {
                Property::UChar(x) => x,
                ref other => panic!("{k}: {other:?}"),
            };
            assert_eq!([f("x"), f("y"), f("z")], mesh.vertices[i]);
            assert_eq!([f("nx"), f("ny"), f("nz")], mesh.normals[i]);
            assert_eq!([b("red"), b("green"), b("blue")], mesh.colors[i]);
        }
        for (face, t) in faces.iter().zip(&mesh.triangles) {
            match &face["vertex_indices"] {
                Property::ListUInt(indices) => assert_eq!(indices[..], t[..]),
                other => panic!("vertex_indices: {other:?}"),
            }
        }
        // The layout is the documented one: header, 27 bytes a vertex, 13 a face.
        let bytes = std::fs::read(&path).unwrap();
        let header = bytes
            .windows(11)
            .position(|w| w == b"end_header\n")
            .unwrap()
            + 11;
        let expected = header + 27 * mesh.vertices.len() + 13 * mesh.triangles.len();
        assert_eq!(bytes.len(), expected);
    }
}

/// The glb's binary chunk and its accessors read by hand, from the offsets `gltf` parsed.
struct Glb {
    gltf: gltf::Gltf,
}

impl Glb {
    fn read(path: &Path) -> Glb {
        let bytes = std::fs::read(path).unwrap();
        // `from_slice` validates the document against the glTF 2.0 schema's rules.
        Glb {
            gltf: gltf::Gltf::from_slice(&bytes).unwrap(),
        }
    }

    fn bytes<'a>(&'a self, accessor: &gltf::Accessor, element: usize) -> Vec<&'a [u8]> {
        let blob = self.gltf.blob.as_ref().unwrap();
        let view = accessor.view().unwrap();
        let start = view.offset() + accessor.offset();
        (0..accessor.count())
            .map(|i| &blob[start + i * element..start + (i + 1) * element])
            .collect()
    }

    fn vec3(&self, accessor: &gltf::Accessor) -> Vec<[f32; 3]> {
        assert_eq!(accessor.data_type(), gltf::accessor::DataType::F32);
        assert_eq!(accessor.dimensions(), gltf::accessor::Dimensions::Vec3);
        self.bytes(accessor, 12)
            .iter()
            .map(|b| [0, 1, 2].map(|k| f32::from_le_bytes(b[4 * k..4 * k + 4].try_into().unwrap())))
            .collect()
    }
}

#[test]
fn glb_reads_back_with_gltf() {
    let dir = tempfile::tempdir().unwrap();
    for (name, mesh) in [("tetrahedron", tetrahedron()), ("fused", fused_mesh())] {
        let path = dir.path().join(format!("{name}.glb"));
        write_mesh_glb(&path, &mesh).unwrap();
        let glb = Glb::read(&path);
        let meshes: Vec<_> = glb.gltf.meshes().collect();
        assert_eq!(meshes.len(), 1);
        let primitives: Vec<_> = meshes[0].primitives().collect();
        assert_eq!(primitives.len(), 1);
        let primitive = &primitives[0];
        assert_eq!(primitive.mode(), gltf::mesh::Mode::Triangles);

        // glTF axes: y and z negated.
        let flip = |v: &[f32; 3]| [v[0], -v[1], -v[2]];
        let positions = glb.vec3(&primitive.get(&gltf::Semantic::Positions).unwrap());
        let normals = glb.vec3(&primitive.get(&gltf::Semantic::Normals).unwrap());
        let expected: Vec<[f32; 3]> = mesh.vertices.iter().map(flip).collect();
        assert_eq!(positions, expected);
        let expected: Vec<[f32; 3]> = mesh.normals.iter().map(flip).collect();
        assert_eq!(normals, expected);
        let bounds = primitive.bounding_box();
        for k in 0..3 {
            let along = positions.iter().map(|p| p[k]);
            assert_eq!(bounds.min[k], along.clone().fold(f32::INFINITY, f32::min));
            assert_eq!(bounds.max[k], along.fold(f32::NEG_INFINITY, f32::max));
        }

        let colors = primitive.get(&gltf::Semantic::Colors(0)).unwrap();
        assert_eq!(colors.data_type(), gltf::accessor::DataType::U8);
        assert_eq!(colors.dimensions(), gltf::accessor::Dimensions::Vec4);
        assert!(colors.normalized());
        let rgba: Vec<[u8; 4]> = glb
            .bytes(&colors, 4)
            .iter()
            .map(|b| b[..4].try_into().unwrap())
            .collect();
        let expected: Vec<[u8; 4]> = mesh
            .colors
            .iter()
            .map(|&[r, g, b]| [r, g, b, 255])
            .collect();
        assert_eq!(rgba, expected);

        let indices = primitive.indices().unwrap();
        assert_eq!(indices.data_type(), gltf::accessor::DataType::U32);
        assert_eq!(indices.dimensions(), gltf::accessor::Dimensions::Scalar);
        let indices: Vec<u32> = glb
            .bytes(&indices, 4)
            .iter()
            .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
            .collect();
        let expected: Vec<u32> = mesh.triangles.iter().flatten().copied().collect();
        assert_eq!(indices, expected);

        let material = primitive.material();
        let pbr = material.pbr_metallic_roughness();
        assert_eq!((pbr.metallic_factor(), pbr.roughness_factor()), (0.0, 1.0));
        assert_eq!(glb.gltf.scenes().next().unwrap().nodes().count(), 1);
    }
}

#[test]
fn an_empty_mesh_writes_empty_files() {
    let dir = tempfile::tempdir().unwrap();
    let ply = dir.path().join("empty.ply");
    write_mesh_ply(&ply, &Mesh::default()).unwrap();
    let read = read_ply(&ply);
    assert!(read.payload["vertex"].is_empty() && read.payload["face"].is_empty());
    let glb = dir.path().join("empty.glb");
    write_mesh_glb(&glb, &Mesh::default()).unwrap();
    let read = Glb::read(&glb);
    assert_eq!(read.gltf.meshes().count(), 0);
    assert_eq!(read.gltf.scenes().count(), 0);
}

#[test]
fn bad_meshes_and_paths_are_errors_that_leave_no_file() {
    let dir = tempfile::tempdir().unwrap();
    type Writer = fn(&Path, &Mesh) -> Result<(), da3::Error>;
    let writers: [(&str, Writer); 2] = [("ply", write_mesh_ply), ("glb", write_mesh_glb)];
    for (extension, write) in writers {
        // A folder that does not exist: an output error naming the file, nothing created.
        let missing = dir
            .path()
            .join("no such folder")
            .join(format!("mesh.{extension}"));
        let err = write(&missing, &tetrahedron()).unwrap_err();
        assert!(
            matches!(err, da3::Error::Output { ref path, .. } if *path == missing),
            "{err}"
        );
        assert!(err.to_string().contains("mesh."), "{err}");

        let mut out_of_range = tetrahedron();
        out_of_range.triangles.push([0, 1, 4]);
        let mut short_normals = tetrahedron();
        short_normals.normals.pop();
        let mut short_colors = tetrahedron();
        short_colors.colors.pop();
        let mut not_finite = tetrahedron();
        not_finite.vertices[2][1] = f32::NAN;
        let mut bad_normal = tetrahedron();
        bad_normal.normals[3][0] = f32::INFINITY;
        for (mesh, says) in [
            (out_of_range, "triangle 4"),
            (short_normals, "3 normals"),
            (short_colors, "3 colours"),
            (not_finite, "vertex 2"),
            (bad_normal, "normal 3"),
        ] {
            let path = dir.path().join(format!("bad.{extension}"));
            let err = write(&path, &mesh).unwrap_err();
            assert!(matches!(err, da3::Error::Input(_)), "{err}");
            assert!(err.to_string().contains(says), "{err} lacks {says:?}");
        }
    }
    assert!(
        names_in(dir.path()).is_empty(),
        "{:?}",
        names_in(dir.path())
    );
}
