//! COLMAP sparse models: `cameras`, `images` and `points3D`, as text (`.txt`) or binary
//! (`.bin`), in the layout COLMAP's own `read_write_model.py` documents.
//!
//! As the official COLMAP export (`export_to_colmap`): one PINHOLE camera per view at the
//! original image size (intrinsics scaled by original / processed size on each axis), images
//! with the world-to-camera pose (`cam_from_world`, quaternion `w x y z`), and every point with
//! a one-element track: the pixel it came from, also scaled to the original size. Camera and
//! image ids start at 1, in view order; point ids start at 1, in cloud order.
//!
//! Binary layout (little-endian): `cameras.bin`: u64 count, then per camera i32 id, i32 model
//! (1 = PINHOLE), u64 width, u64 height, f64 fx fy cx cy. `images.bin`: u64 count, then per
//! image i32 id, f64 qw qx qy qz, f64 tx ty tz, i32 camera id, the name and a NUL byte, u64
//! number of 2D points, per point f64 x, f64 y, i64 3D point id. `points3D.bin`: u64 count,
//! then per point u64 id, f64 x y z, u8 r g b, f64 error, u64 track length, per element i32
//! image id, i32 2D point index.

use super::super::Error;
use super::{PointCloud, View};
use crate::atomic_file;
use crate::geometry::rotation::wxyz_of_matrix;
use std::path::Path;

/// Which of COLMAP's two encodings to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColmapFormat {
    Text,
    Binary,
}

struct Camera {
    width: usize,
    height: usize,
    params: [f64; 4],
}

struct Image {
    qvec: [f64; 4],
    tvec: [f64; 3],
    name: String,
    /// (x, y, 1-based point id)
    points: Vec<(f64, f64, u64)>,
}

fn model(cloud: &PointCloud, views: &[View<'_>]) -> Result<(Vec<Camera>, Vec<Image>), Error> {
    let mut cameras = Vec::new();
    let mut images = Vec::new();
    for v in views {
        v.validate()?;
        if v.name.is_empty() || v.name.contains(['\n', '\0']) {
            return Err(Error::Input(format!(
                "COLMAP image name {:?} is empty or has a newline or NUL",
                v.name
            )));
        }
        let (ow, oh) = v.original_size;
        let (sx, sy) = (ow as f64 / v.width as f64, oh as f64 / v.height as f64);
        let k = v.pose.intrinsics.map(|r| r.map(f64::from));
        cameras.push(Camera {
            width: ow,
            height: oh,
            params: [k[0][0] * sx, k[1][1] * sy, k[0][2] * sx, k[1][2] * sy],
        });
        let e = v.pose.extrinsics.map(|r| r.map(f64::from));
        let rot = [
            [e[0][0], e[0][1], e[0][2]],
            [e[1][0], e[1][1], e[1][2]],
            [e[2][0], e[2][1], e[2][2]],
        ];
        images.push(Image {
            qvec: wxyz_of_matrix(&rot),
            tvec: [e[0][3], e[1][3], e[2][3]],
            name: v.name.clone(),
            points: Vec::new(),
        });
    }
    if cloud.sources.len() != cloud.positions.len() || cloud.colors.len() != cloud.positions.len() {
        return Err(Error::Input(
            "point cloud sources, colours and positions differ in length".into(),
        ));
    }
    for (id, &(vi, pixel)) in cloud.sources.iter().enumerate() {
        let v = views.get(vi as usize).ok_or_else(|| {
            Error::Input(format!(
                "point {id} comes from view {vi}, beyond the {} given",
                views.len()
            ))
        })?;
        let (u, row) = (pixel as usize % v.width, pixel as usize / v.width);
        let (ow, oh) = v.original_size;
        let x = u as f64 * ow as f64 / v.width as f64;
        let y = row as f64 * oh as f64 / v.height as f64;
        images[vi as usize].points.push((x, y, id as u64 + 1));
    }
    Ok((cameras, images))
}

/// Writes the sparse model of `cloud` (from [`super::point_cloud`] over `views`) into the
/// existing folder `dir`, each file atomically.
///
/// # Errors
/// [`Error::Input`] for invalid views or a cloud that does not belong to them,
/// [`Error::Output`] when `dir` is not a folder or a file cannot be written.
pub fn write_colmap(
    dir: &Path,
    cloud: &PointCloud,
    views: &[View<'_>],
    format: ColmapFormat,
) -> Result<(), Error> {
    if !dir.is_dir() {
        return Err(Error::Output {
            path: dir.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "not an existing folder"),
        });
    }
    let (cameras, images) = model(cloud, views)?;
    // The 2D index of each point in its image's list (its track element).
    let mut point2d = vec![0u32; cloud.len()];
    for image in &images {
        for (idx, &(_, _, id)) in image.points.iter().enumerate() {
            point2d[id as usize - 1] = idx as u32;
        }
    }
    match format {
        ColmapFormat::Text => {
            atomic_file::write(&dir.join("cameras.txt"), |w| {
                writeln!(w, "# Camera list with one line of data per camera:")?;
                writeln!(w, "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]")?;
                writeln!(w, "# Number of cameras: {}", cameras.len())?;
                for (i, c) in cameras.iter().enumerate() {
                    let [fx, fy, cx, cy] = c.params;
                    writeln!(
                        w,
                        "{} PINHOLE {} {} {fx} {fy} {cx} {cy}",
                        i + 1,
                        c.width,
                        c.height
                    )?;
                }
                Ok(())
            })?;
            atomic_file::write(&dir.join("images.txt"), |w| {
                let total: usize = images.iter().map(|i| i.points.len()).sum();
                writeln!(w, "# Image list with two lines of data per image:")?;
                writeln!(
                    w,
                    "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME"
                )?;
                writeln!(w, "#   POINTS2D[] as (X, Y, POINT3D_ID)")?;
                writeln!(
                    w,
                    "# Number of images: {}, mean observations per image: {}",
                    images.len(),
                    total as f64 / images.len().max(1) as f64
                )?;
                for (i, im) in images.iter().enumerate() {
                    let [qw, qx, qy, qz] = im.qvec;
                    let [tx, ty, tz] = im.tvec;
                    writeln!(
                        w,
                        "{} {qw} {qx} {qy} {qz} {tx} {ty} {tz} {} {}",
                        i + 1,
                        i + 1,
                        im.name
                    )?;
                    let mut line = String::new();
                    for (k, (x, y, id)) in im.points.iter().enumerate() {
                        if k > 0 {
                            line.push(' ');
                        }
                        line.push_str(&format!("{x} {y} {id}"));
                    }
                    writeln!(w, "{line}")?;
                }
                Ok(())
            })?;
            atomic_file::write(&dir.join("points3D.txt"), |w| {
                writeln!(w, "# 3D point list with one line of data per point:")?;
                writeln!(
                    w,
                    "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)"
                )?;
                writeln!(
                    w,
                    "# Number of points: {}, mean track length: 1",
                    cloud.len()
                )?;
                for (id, ((p, c), s)) in cloud
                    .positions
                    .iter()
                    .zip(&cloud.colors)
                    .zip(&cloud.sources)
                    .enumerate()
                {
                    writeln!(
                        w,
                        "{} {} {} {} {} {} {} 0 {} {}",
                        id + 1,
                        p[0],
                        p[1],
                        p[2],
                        c[0],
                        c[1],
                        c[2],
                        s.0 + 1,
                        point2d[id]
                    )?;
                }
                Ok(())
            })?;
        }
        ColmapFormat::Binary => {
            atomic_file::write(&dir.join("cameras.bin"), |w| {
                w.write_all(&(cameras.len() as u64).to_le_bytes())?;
                for (i, c) in cameras.iter().enumerate() {
                    w.write_all(&(i as i32 + 1).to_le_bytes())?;
                    w.write_all(&1i32.to_le_bytes())?; // PINHOLE
                    w.write_all(&(c.width as u64).to_le_bytes())?;
                    w.write_all(&(c.height as u64).to_le_bytes())?;
                    for p in c.params {
                        w.write_all(&p.to_le_bytes())?;
                    }
                }
                Ok(())
            })?;
            atomic_file::write(&dir.join("images.bin"), |w| {
                w.write_all(&(images.len() as u64).to_le_bytes())?;
                for (i, im) in images.iter().enumerate() {
                    w.write_all(&(i as i32 + 1).to_le_bytes())?;
                    for v in im.qvec.iter().chain(&im.tvec) {
                        w.write_all(&v.to_le_bytes())?;
                    }
                    w.write_all(&(i as i32 + 1).to_le_bytes())?;
                    w.write_all(im.name.as_bytes())?;
                    w.write_all(&[0])?;
                    w.write_all(&(im.points.len() as u64).to_le_bytes())?;
                    for &(x, y, id) in &im.points {
                        w.write_all(&x.to_le_bytes())?;
                        w.write_all(&y.to_le_bytes())?;
                        w.write_all(&(id as i64).to_le_bytes())?;
                    }
                }
                Ok(())
            })?;
            atomic_file::write(&dir.join("points3D.bin"), |w| {
                w.write_all(&(cloud.len() as u64).to_le_bytes())?;
                for (id, ((p, c), s)) in cloud
                    .positions
                    .iter()
                    .zip(&cloud.colors)
                    .zip(&cloud.sources)
                    .enumerate()
                {
                    w.write_all(&(id as u64 + 1).to_le_bytes())?;
                    for v in p {
                        w.write_all(&f64::from(*v).to_le_bytes())?;
                    }
                    w.write_all(c)?;
                    w.write_all(&0f64.to_le_bytes())?;
                    w.write_all(&1u64.to_le_bytes())?;
                    w.write_all(&(s.0 as i32 + 1).to_le_bytes())?;
                    w.write_all(&(point2d[id] as i32).to_le_bytes())?;
                }
                Ok(())
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quaternions_of_known_rotations() {
        let id = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
        assert_eq!(wxyz_of_matrix(&id), [1.0, 0.0, 0.0, 0.0]);
        // 180 degrees about x: (0, 1, 0, 0).
        let q = wxyz_of_matrix(&[[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]]);
        assert!((q[1] - 1.0).abs() < 1e-12 && q[0].abs() < 1e-12);
        // 90 degrees about z: (cos 45, 0, 0, sin 45).
        let q = wxyz_of_matrix(&[[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]);
        let h = std::f64::consts::FRAC_1_SQRT_2;
        assert!((q[0] - h).abs() < 1e-12 && (q[3] - h).abs() < 1e-12);
    }
}
