//! 3D exports read back with independent readers: PLY through `ply-rs-bw`, glb through `gltf`,
//! npz through `zip` + `npyz`, COLMAP through a parser written here from COLMAP's documented
//! layout. Expected points come from the closed-form pinhole back-projection, not the library.

use da3::export::{
    point_cloud, write_colmap, write_glb, write_mini_npz, write_ply, CloudOptions, ColmapFormat,
    GlbOptions, View,
};
use da3::{Pose, Prediction};
use std::io::Read;

type Image2d = ([f64; 4], [f64; 3], String, Vec<(f64, f64, i64)>);
type Point3d = (u64, [f64; 3], [u8; 3], Vec<(i32, i32)>);

const W: usize = 8;
const H: usize = 6;

/// World-to-camera: 90 degrees about z, then t = (0.5, -1, 2).
fn pose() -> Pose {
    Pose {
        intrinsics: [[10.0, 0.0, 4.0], [0.0, 12.0, 3.0], [0.0, 0.0, 1.0]],
        extrinsics: [
            [0.0, -1.0, 0.0, 0.5],
            [1.0, 0.0, 0.0, -1.0],
            [0.0, 0.0, 1.0, 2.0],
        ],
    }
}

fn prediction() -> Prediction {
    let depth: Vec<f32> = (0..W * H).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
    let confidence: Vec<f32> = (0..W * H).map(|i| 1.0 + i as f32 * 0.1).collect();
    Prediction {
        width: W,
        height: H,
        depth,
        confidence: Some(confidence),
        sky: None,
        pose: Some(pose()),
        probes: Vec::new(),
        rays: None,
        image: colors(),
        input_size: (W, H),
        name: "image.png".into(),
        ..Prediction::default()
    }
}

fn colors() -> da3::da3::preprocess::RgbImage8 {
    let data = (0..W * H * 3).map(|i| (i * 5 % 256) as u8).collect();
    da3::da3::preprocess::RgbImage8::new(W, H, data).unwrap()
}

/// x_cam = d ((u - cx)/fx, (v - cy)/fy, 1); world = R^T (x_cam - t).
fn expected_world(u: usize, v: usize, d: f32) -> [f64; 3] {
    let p = pose();
    let k = p.intrinsics;
    let d = d as f64;
    let cam = [
        d * (u as f64 - k[0][2] as f64) / k[0][0] as f64,
        d * (v as f64 - k[1][2] as f64) / k[1][1] as f64,
        d,
    ];
    let e = p.extrinsics;
    let shifted = [0, 1, 2].map(|r| cam[r] - e[r][3] as f64);
    [0, 1, 2].map(|c| (0..3).map(|r| e[r][c] as f64 * shifted[r]).sum())
}

fn kept_pixels(pred: &Prediction) -> (f32, Vec<usize>) {
    // Official rule: clamp(1.05, P40, P90) of the confidences; P40 of 1.0..5.7 step 0.1.
    let conf = pred.confidence.as_ref().unwrap();
    let mut sorted = conf.clone();
    sorted.sort_by(f32::total_cmp);
    let pos = 0.4 * (sorted.len() - 1) as f32;
    let lo = sorted[pos.floor() as usize]
        + (sorted[pos.ceil() as usize] - sorted[pos.floor() as usize]) * pos.fract();
    let t = 1.05f32.max(lo);
    (t, (0..W * H).filter(|&i| conf[i] >= t).collect())
}

#[test]
fn point_cloud_matches_the_pinhole_back_projection() {
    let pred = prediction();
    let img = colors();
    let view = View::new(&pred, &img).unwrap();
    let cloud = point_cloud(&[view], &CloudOptions::default()).unwrap();
    let (t, kept) = kept_pixels(&pred);
    assert!((cloud.confidence_threshold.unwrap() - t).abs() < 1e-5);
    assert_eq!(cloud.len(), kept.len());
    for (k, &i) in kept.iter().enumerate() {
        let e = expected_world(i % W, i / W, pred.depth[i]);
        for (p, e) in cloud.positions[k].iter().zip(e) {
            assert!((*p as f64 - e).abs() < 1e-5, "{k}");
        }
        assert_eq!(
            cloud.colors[k],
            [img.data[i * 3], img.data[i * 3 + 1], img.data[i * 3 + 2]]
        );
    }
}

#[test]
fn sky_pixels_are_dropped_and_a_missing_pose_is_an_error() {
    let mut pred = prediction();
    pred.confidence = None;
    pred.sky = Some((0..W * H).map(|i| if i < W { 1.0 } else { 0.0 }).collect());
    let img = colors();
    let cloud = point_cloud(&[View::new(&pred, &img).unwrap()], &CloudOptions::default()).unwrap();
    assert_eq!(cloud.len(), W * H - W);
    assert!(cloud.sources.iter().all(|s| s.1 as usize >= W));
    pred.pose = None;
    let err = View::new(&pred, &img).unwrap_err().to_string();
    assert!(err.contains("camera"), "{err}");
}

#[test]
fn ply_reads_back_with_ply_rs() {
    use ply_rs_bw::ply::Property;
    let pred = prediction();
    let img = colors();
    let cloud = point_cloud(&[View::new(&pred, &img).unwrap()], &CloudOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cloud.ply");
    write_ply(&path, &cloud).unwrap();
    let parser = ply_rs_bw::parser::Parser::<ply_rs_bw::ply::DefaultElement>::new();
    let ply = parser
        .read_ply(&mut std::fs::File::open(&path).unwrap())
        .unwrap();
    assert_eq!(
        ply.header.encoding,
        ply_rs_bw::ply::Encoding::BinaryLittleEndian
    );
    let vertices = &ply.payload["vertex"];
    assert_eq!(vertices.len(), cloud.len());
    for (v, (p, c)) in vertices
        .iter()
        .zip(cloud.positions.iter().zip(&cloud.colors))
    {
        let f = |k: &str| match v[k] {
            Property::Float(x) => x,
            ref other => panic!("{k}: {other:?}"),
        };
        let b = |k: &str| match v[k] {
            Property::UChar(x) => x,
            ref other => panic!("{k}: {other:?}"),
        };
        assert_eq!([f("x"), f("y"), f("z")], *p);
        assert_eq!([b("red"), b("green"), b("blue")], *c);
    }
}

#[test]
fn glb_reads_back_with_gltf() {
    let pred = prediction();
    let img = colors();
    let views = [View::new(&pred, &img).unwrap()];
    let cloud = point_cloud(&views, &CloudOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("scene.glb");
    write_glb(&path, &cloud, &views, &GlbOptions::default()).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    let gltf = gltf::Gltf::from_slice(&bytes).unwrap();
    let blob = gltf.blob.as_ref().unwrap();
    let read_f32 = |acc: &gltf::Accessor| -> Vec<[f32; 3]> {
        let view = acc.view().unwrap();
        let start = view.offset() + acc.offset();
        (0..acc.count())
            .map(|i| {
                let o = start + i * 12;
                [0, 1, 2]
                    .map(|k| f32::from_le_bytes(blob[o + 4 * k..o + 4 * k + 4].try_into().unwrap()))
            })
            .collect()
    };
    let meshes: Vec<_> = gltf.meshes().collect();
    assert_eq!(meshes.len(), 2);
    let points = meshes[0].primitives().next().unwrap();
    assert_eq!(points.mode(), gltf::mesh::Mode::Points);
    let pos = read_f32(&points.get(&gltf::Semantic::Positions).unwrap());
    let col = points.get(&gltf::Semantic::Colors(0)).unwrap();
    assert_eq!(col.data_type(), gltf::accessor::DataType::U8);
    assert!(col.normalized());
    assert_eq!(pos.len(), cloud.len());
    // One view: the first camera's frame, y and z flipped, centred on the median.
    let (_, kept) = kept_pixels(&pred);
    let cam: Vec<[f64; 3]> = kept
        .iter()
        .map(|&i| {
            let k = pose().intrinsics;
            let d = pred.depth[i] as f64;
            let (u, v) = ((i % W) as f64, (i / W) as f64);
            [
                d * (u - k[0][2] as f64) / k[0][0] as f64,
                -d * (v - k[1][2] as f64) / k[1][1] as f64,
                -d,
            ]
        })
        .collect();
    let median = |a: usize| {
        let mut v: Vec<f64> = cam.iter().map(|p| p[a]).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let m = [median(0), median(1), median(2)];
    for (p, e) in pos.iter().zip(&cam) {
        for a in 0..3 {
            assert!((p[a] as f64 - (e[a] - m[a])).abs() < 1e-5);
        }
    }
    let lines = meshes[1].primitives().next().unwrap();
    assert_eq!(lines.mode(), gltf::mesh::Mode::Lines);
    let frustum = read_f32(&lines.get(&gltf::Semantic::Positions).unwrap());
    assert_eq!(frustum.len(), 16);
    // Segments 0..4 start at the camera centre (the origin of the aligned frame, minus the
    // median).
    for s in 0..4 {
        for a in 0..3 {
            assert!((frustum[2 * s][a] as f64 + m[a]).abs() < 1e-5);
        }
    }
}

fn read_npy(archive: &mut zip::ZipArchive<std::fs::File>, name: &str) -> (Vec<u64>, Vec<f32>) {
    let mut bytes = Vec::new();
    archive
        .by_name(&format!("{name}.npy"))
        .unwrap()
        .read_to_end(&mut bytes)
        .unwrap();
    let npy = npyz::NpyFile::new(&bytes[..]).unwrap();
    let shape = npy.shape().to_vec();
    (shape, npy.into_vec::<f32>().unwrap())
}

#[test]
fn mini_npz_reads_back_with_zip_and_npyz() {
    let pred = prediction();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("results.npz");
    write_mini_npz(&path, &[&pred, &pred]).unwrap();
    let mut archive = zip::ZipArchive::new(std::fs::File::open(&path).unwrap()).unwrap();
    let mut names: Vec<String> = archive.file_names().map(String::from).collect();
    names.sort();
    assert_eq!(
        names,
        ["conf.npy", "depth.npy", "extrinsics.npy", "intrinsics.npy"]
    );
    assert_eq!(
        archive.by_name("depth.npy").unwrap().compression(),
        zip::CompressionMethod::Deflated
    );
    let (shape, depth) = read_npy(&mut archive, "depth");
    assert_eq!(shape, [2, H as u64, W as u64]);
    assert_eq!(&depth[..W * H], &pred.depth[..]);
    let (shape, conf) = read_npy(&mut archive, "conf");
    assert_eq!(shape, [2, H as u64, W as u64]);
    let c = pred.confidence.as_ref().unwrap();
    assert!(conf
        .iter()
        .zip(c.iter().chain(c))
        .all(|(a, b)| (a - b).abs() <= 0.005 + 1e-6));
    let (shape, ext) = read_npy(&mut archive, "extrinsics");
    assert_eq!(shape, [2, 3, 4]);
    assert_eq!(&ext[..12], &pose().extrinsics.concat()[..]);
    let (shape, int) = read_npy(&mut archive, "intrinsics");
    assert_eq!(shape, [2, 3, 3]);
    assert_eq!(&int[9..], &pose().intrinsics.concat()[..]);
}

struct Colmap {
    camera: (u64, u64, [f64; 4]),
    image: Image2d,
    points: Vec<Point3d>,
}

fn colmap_text(dir: &std::path::Path) -> Colmap {
    let lines = |f: &str| -> Vec<String> {
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(String::from)
            .collect()
    };
    let cams = lines("cameras.txt");
    assert_eq!(cams.len(), 1);
    let c: Vec<&str> = cams[0].split(' ').collect();
    assert_eq!((c[0], c[1]), ("1", "PINHOLE"));
    let p = |s: &str| s.parse::<f64>().unwrap();
    let camera = (
        c[2].parse().unwrap(),
        c[3].parse().unwrap(),
        [p(c[4]), p(c[5]), p(c[6]), p(c[7])],
    );
    let ims = lines("images.txt");
    assert_eq!(ims.len(), 2);
    let i: Vec<&str> = ims[0].split(' ').collect();
    assert_eq!((i[0], i[8]), ("1", "1"));
    let pts2d: Vec<&str> = ims[1].split(' ').collect();
    let image = (
        [p(i[1]), p(i[2]), p(i[3]), p(i[4])],
        [p(i[5]), p(i[6]), p(i[7])],
        i[9].to_owned(),
        pts2d
            .chunks(3)
            .map(|t| (p(t[0]), p(t[1]), t[2].parse().unwrap()))
            .collect(),
    );
    let points = lines("points3D.txt")
        .iter()
        .map(|l| {
            let t: Vec<&str> = l.split(' ').collect();
            (
                t[0].parse().unwrap(),
                [p(t[1]), p(t[2]), p(t[3])],
                [
                    t[4].parse().unwrap(),
                    t[5].parse().unwrap(),
                    t[6].parse().unwrap(),
                ],
                t[8..]
                    .chunks(2)
                    .map(|e| (e[0].parse().unwrap(), e[1].parse().unwrap()))
                    .collect(),
            )
        })
        .collect();
    Colmap {
        camera,
        image,
        points,
    }
}

struct Reader(Vec<u8>, usize);
impl Reader {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let out = self.0[self.1..self.1 + N].try_into().unwrap();
        self.1 += N;
        out
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
    fn f64(&mut self) -> f64 {
        f64::from_le_bytes(self.take())
    }
    fn done(&self) -> bool {
        self.1 == self.0.len()
    }
}

fn colmap_binary(dir: &std::path::Path) -> Colmap {
    let open = |f: &str| Reader(std::fs::read(dir.join(f)).unwrap(), 0);
    let mut r = open("cameras.bin");
    assert_eq!(r.u64(), 1);
    assert_eq!((r.i32(), r.i32()), (1, 1));
    let camera = (r.u64(), r.u64(), [r.f64(), r.f64(), r.f64(), r.f64()]);
    assert!(r.done());
    let mut r = open("images.bin");
    assert_eq!((r.u64(), r.i32()), (1, 1));
    let q = [r.f64(), r.f64(), r.f64(), r.f64()];
    let t = [r.f64(), r.f64(), r.f64()];
    assert_eq!(r.i32(), 1);
    let mut name = Vec::new();
    loop {
        let [b] = r.take::<1>();
        if b == 0 {
            break;
        }
        name.push(b);
    }
    let n = r.u64();
    let pts = (0..n).map(|_| (r.f64(), r.f64(), r.i64())).collect();
    assert!(r.done());
    let mut r = open("points3D.bin");
    let n = r.u64();
    let points = (0..n)
        .map(|_| {
            let id = r.u64();
            let xyz = [r.f64(), r.f64(), r.f64()];
            let rgb = r.take::<3>();
            let _error = r.f64();
            let len = r.u64();
            (id, xyz, rgb, (0..len).map(|_| (r.i32(), r.i32())).collect())
        })
        .collect();
    assert!(r.done());
    Colmap {
        camera,
        image: (q, t, String::from_utf8(name).unwrap(), pts),
        points,
    }
}

#[test]
fn colmap_text_and_binary_describe_the_same_model() {
    let pred = prediction();
    let img = colors();
    // Original image 16x9: intrinsics scale by 2 in x and 1.5 in y.
    let views = [View::new(&pred, &img).unwrap().named("photo.jpg", (16, 9))];
    let cloud = point_cloud(&views, &CloudOptions::colmap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_colmap(dir.path(), &cloud, &views, ColmapFormat::Text).unwrap();
    write_colmap(dir.path(), &cloud, &views, ColmapFormat::Binary).unwrap();
    for model in [colmap_text(dir.path()), colmap_binary(dir.path())] {
        assert_eq!(model.camera, (16, 9, [20.0, 18.0, 8.0, 4.5]));
        let (q, t, name, pts2d) = &model.image;
        // 90 degrees about z: (cos 45, 0, 0, sin 45).
        let h = std::f64::consts::FRAC_1_SQRT_2;
        assert!((q[0] - h).abs() < 1e-9 && (q[3] - h).abs() < 1e-9 && q[1].abs() < 1e-9);
        assert_eq!(*t, [0.5, -1.0, 2.0]);
        assert_eq!(name, "photo.jpg");
        assert_eq!(pts2d.len(), cloud.len());
        assert_eq!(model.points.len(), cloud.len());
        for (k, (id, xyz, rgb, track)) in model.points.iter().enumerate() {
            assert_eq!(*id, k as u64 + 1);
            assert_eq!(track, &[(1, k as i32)]);
            let (x, y, pid) = pts2d[k];
            assert_eq!(pid, k as i64 + 1);
            // The 2D point is the source pixel scaled to the original size.
            let (u, v) = ((x / 2.0).round() as usize, (y / 1.5).round() as usize);
            let i = v * W + u;
            let e = expected_world(u, v, pred.depth[i]);
            for a in 0..3 {
                assert!((xyz[a] - e[a]).abs() < 1e-5);
            }
            assert_eq!(rgb, &img.data[i * 3..i * 3 + 3]);
        }
    }
}
