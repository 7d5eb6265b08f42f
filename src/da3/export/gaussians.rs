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

#[cfg(test)]
mod tests {
    use super::*;

    fn gaussians(views: usize, width: usize, height: usize) -> Gaussians {
        let n = views * width * height;
        Gaussians {
            views,
            width,
            height,
            means: vec![[0.0; 3]; n],
            scales: vec![[1.0; 3]; n],
            rotations: vec![[1.0, 0.0, 0.0, 0.0]; n],
            harmonics: vec![0.0; n * 3],
            sh_coefficients: 1,
            opacities: vec![0.5; n],
        }
    }

    /// The official pruning: a border of int(8/256 x side) (none below 32 pixels) and the
    /// pixels deeper than the view's 90th depth percentile; every other view with an interval
    /// of 2.
    #[test]
    fn pruning_keeps_the_inner_nearer_pixels() {
        let g = gaussians(2, 64, 32);
        let depth: Vec<f32> = (0..64 * 32).map(|i| i as f32).collect();
        let kept = kept_gaussians(&g, &[&depth, &depth], &GaussianPlyOptions::default()).unwrap();
        // Rows 1..31 and columns 2..62; depth (row-major index) at most the 90th percentile.
        let limit = quantile(depth.clone(), 0.9);
        let one_view: Vec<usize> = (1..31)
            .flat_map(|y| (2..62).map(move |x| y * 64 + x))
            .filter(|&p| depth[p] <= limit)
            .collect();
        assert_eq!(kept.len(), 2 * one_view.len());
        assert_eq!(&kept[..one_view.len()], &one_view[..]);
        let every_other = GaussianPlyOptions {
            views_interval: 2,
            ..Default::default()
        };
        assert_eq!(
            kept_gaussians(&g, &[&depth, &depth], &every_other).unwrap(),
            one_view
        );
        // Under 32 pixels a side nothing is trimmed for the border.
        let small = gaussians(1, 16, 8);
        let all = GaussianPlyOptions {
            max_depth_quantile: None,
            ..Default::default()
        };
        assert_eq!(
            kept_gaussians(&small, &[&[1.0; 128]], &all).unwrap().len(),
            128
        );
    }

    /// Depth maps that do not fit the Gaussians, and an interval of 0, are errors; the file is
    /// not written.
    #[test]
    fn mismatches_are_errors_and_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gs.ply");
        let g = gaussians(2, 4, 4);
        let d = [0.5f32; 16];
        let options = GaussianPlyOptions::default();
        for depth in [vec![&d[..]], vec![&d[..], &d[..8]]] {
            let err = write_gaussian_ply(&path, &g, &depth, &options).unwrap_err();
            assert!(err.to_string().contains("32 Gaussians"), "{err}");
        }
        let zero = GaussianPlyOptions {
            views_interval: 0,
            ..options
        };
        let err = write_gaussian_ply(&path, &g, &[&d, &d], &zero).unwrap_err();
        assert!(err.to_string().contains("interval of 0"), "{err}");
        assert!(!path.exists());
    }
}
