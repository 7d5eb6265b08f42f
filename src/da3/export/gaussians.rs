//! 3D Gaussians as a 3DGS PLY file: the layout of the original 3D Gaussian Splatting code
//! (`x y z nx ny nz f_dc_0..2 [f_rest_*] opacity scale_0..2 rot_0..3`, all `float`, binary
//! little-endian), which 3DGS viewers and tools read: opacity as a logit, scales as logarithms,
//! the quaternion w first, only the colour's DC band, the normals zero.
//!
//! Which Gaussians are written follows the official `export_to_gs_ply`
//! (`depth_anything_3/utils/export/gs.py`, `save_gaussian_ply` of `depth-anything-3==0.1.1`):
//! a border of `int(8 / 256 x side)` pixels of every view is dropped, and pixels deeper than
//! the 90th percentile of their view's depth. One deliberate difference: where the border rounds
//! to 0 pixels (sides under 32 pixels) nothing is dropped for it, where the official slice
//! `[0:-0]` drops every Gaussian.

use super::super::gaussians::Gaussians;
use super::super::outputs::quantile;
use super::super::Error;
use crate::atomic_file;
use std::path::Path;

/// Which Gaussians [`write_gaussian_ply`] keeps (the defaults are the official export's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GaussianPlyOptions {
    /// Drop a border of `int(8 / 256 x side)` pixels of every view (lower quality there).
    pub prune_border: bool,
    /// Keep pixels no deeper than this quantile of their view's depth (`None`: every depth).
    pub max_depth_quantile: Option<f64>,
    /// Every how many views Gaussians are written (1: every view).
    pub views_interval: usize,
}

impl Default for GaussianPlyOptions {
    fn default() -> Self {
        GaussianPlyOptions {
            prune_border: true,
            max_depth_quantile: Some(0.9),
            views_interval: 1,
        }
    }
}

/// The 17 properties of each vertex, in order.
const PROPERTIES: [&str; 17] = [
    "x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2", "opacity", "scale_0", "scale_1",
    "scale_2", "rot_0", "rot_1", "rot_2", "rot_3",
];

/// Writes `gaussians` as a 3DGS PLY file (atomically), pruned by `options` with `depth`, each
/// view's depth map (`width x height`, the map the Gaussians stand on). Returns how many
/// Gaussians were written.
pub fn write_gaussian_ply(
    path: &Path,
    gaussians: &Gaussians,
    depth: &[&[f32]],
    options: &GaussianPlyOptions,
) -> Result<usize, Error> {
    let kept = kept_gaussians(gaussians, depth, options)?;
    let d_sh = gaussians.sh_coefficients;
    atomic_file::write(path, |w| {
        write!(
            w,
            "ply\nformat binary_little_endian 1.0\ncomment 3D Gaussians written by da3 (Depth \
             Anything 3)\nelement vertex {}\n",
            kept.len()
        )?;
        for p in PROPERTIES {
            writeln!(w, "property float {p}")?;
        }
        w.write_all(b"end_header\n")?;
        let mut record = [0u8; 4 * PROPERTIES.len()];
        for &i in &kept {
            let sh = gaussians.harmonics_of(i);
            let p = gaussians.opacities[i] as f64;
            let values: [f32; 17] = [
                gaussians.means[i][0],
                gaussians.means[i][1],
                gaussians.means[i][2],
                0.0,
                0.0,
                0.0,
                sh[0],
                sh[d_sh],
                sh[2 * d_sh],
                (p / (1.0 - p)).ln() as f32,
                gaussians.scales[i][0].ln(),
                gaussians.scales[i][1].ln(),
                gaussians.scales[i][2].ln(),
                gaussians.rotations[i][0],
                gaussians.rotations[i][1],
                gaussians.rotations[i][2],
                gaussians.rotations[i][3],
            ];
            for (k, v) in values.iter().enumerate() {
                record[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
            }
            w.write_all(&record)?;
        }
        Ok(())
    })?;
    Ok(kept.len())
}

/// The indices of the Gaussians `options` keeps, in order.
fn kept_gaussians(
    g: &Gaussians,
    depth: &[&[f32]],
    options: &GaussianPlyOptions,
) -> Result<Vec<usize>, Error> {
    let (w, h) = (g.width, g.height);
    let plane = w * h;
    if depth.len() != g.views
        || depth.iter().any(|d| d.len() != plane)
        || g.len() != plane * g.views
    {
        return Err(Error::Input(format!(
            "{} Gaussians and {} depth map(s) for {} view(s) of {w}x{h}",
            g.len(),
            depth.len(),
            g.views
        )));
    }
    if options.views_interval == 0 {
        return Err(Error::Input("a views interval of 0".to_owned()));
    }
    let (trim_y, trim_x) = match options.prune_border {
        true => (8 * h / 256, 8 * w / 256),
        false => (0, 0),
    };
    let mut kept = Vec::new();
    for v in (0..g.views).step_by(options.views_interval) {
        let limit = options
            .max_depth_quantile
            .map(|q| quantile(depth[v].to_vec(), q));
        for y in trim_y..h - trim_y {
            for x in trim_x..w - trim_x {
                let p = y * w + x;
                if limit.is_none_or(|limit| depth[v][p] <= limit) {
                    kept.push(v * plane + p);
                }
            }
        }
    }
    Ok(kept)
}
