//! PLY point clouds.
//!
//! Layout (the PLY 1.0 format, binary little-endian): an ASCII header
//! `ply`, `format binary_little_endian 1.0`, a comment, `element vertex N`, the properties
//! `float x`, `float y`, `float z`, `uchar red`, `uchar green`, `uchar blue`, `end_header`
//! and a newline; then N records of 15 bytes (three little-endian f32, three u8), no padding.
//! Coordinates are the world frame of the prediction (OpenCV convention: x right, y down,
//! z forward for an identity camera).

use super::super::Error;
use super::PointCloud;
use crate::atomic_file;
use std::path::Path;

/// Writes `cloud` as a binary little-endian PLY file (atomically).
pub fn write_ply(path: &Path, cloud: &PointCloud) -> Result<(), Error> {
    if cloud.colors.len() != cloud.positions.len() {
        return Err(Error::Input(format!(
            "point cloud has {} positions but {} colours",
            cloud.positions.len(),
            cloud.colors.len()
        )));
    }
    Ok(atomic_file::write(path, |w| {
        write!(
            w,
            "ply\nformat binary_little_endian 1.0\ncomment written by da3 (Depth Anything 3)\n\
             element vertex {}\nproperty float x\nproperty float y\nproperty float z\n\
             property uchar red\nproperty uchar green\nproperty uchar blue\nend_header\n",
            cloud.len()
        )?;
        let mut record = [0u8; 15];
        for (p, c) in cloud.positions.iter().zip(&cloud.colors) {
            for (k, v) in p.iter().enumerate() {
                record[k * 4..k * 4 + 4].copy_from_slice(&v.to_le_bytes());
            }
            record[12..].copy_from_slice(c);
            w.write_all(&record)?;
        }
        Ok(())
    })?)
}
