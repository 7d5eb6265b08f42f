//! The official `mini_npz` archive (`export_to_mini_npz`): a compressed NumPy `.npz` with
//! `depth` (N, H, W) float32 rounded to 8 decimals, and when predicted `conf` (N, H, W)
//! rounded to 2 decimals, `extrinsics` (N, 3, 4) world-to-camera and `intrinsics` (N, 3, 3),
//! all float32. One addition the official archive lacks: `sky` (N, H, W) for mono/metric
//! models. Rounding is NumPy's `round` in float32 (scale, round half to even, unscale).

use super::super::outputs::Prediction;
use super::super::Error;
use crate::atomic_file;
use ndarray::{Array, Array3};
use std::path::Path;

fn round(values: &[f32], decimals: i32) -> Vec<f32> {
    let scale = 10f32.powi(decimals);
    values
        .iter()
        .map(|&v| (v * scale).round_ties_even() / scale)
        .collect()
}

/// Writes `predictions` (views of one size) as a `mini_npz` archive (atomically).
///
/// # Errors
/// [`Error::Input`] when there is no prediction, sizes differ, or only some views carry a
/// confidence, sky map or pose.
pub fn write_mini_npz(path: &Path, predictions: &[&Prediction]) -> Result<(), Error> {
    let first = predictions
        .first()
        .ok_or_else(|| Error::Input("an npz export needs at least one prediction".into()))?;
    let (w, h, n) = (first.width, first.height, predictions.len());
    for p in predictions {
        if (p.width, p.height) != (w, h) || p.depth.len() != w * h {
            return Err(Error::Input(format!(
                "every view of an npz must be {w}x{h}; one is {}x{} with {} depth values",
                p.width,
                p.height,
                p.depth.len()
            )));
        }
        if p.confidence.is_some() != first.confidence.is_some()
            || p.sky.is_some() != first.sky.is_some()
            || p.pose.is_some() != first.pose.is_some()
        {
            return Err(Error::Input(
                "views of an npz must all have, or all lack, confidence, sky and pose".into(),
            ));
        }
        for (what, map) in [("confidence", &p.confidence), ("sky", &p.sky)] {
            if map.as_ref().is_some_and(|m| m.len() != w * h) {
                return Err(Error::Input(format!("{what} map is not {w}x{h}")));
            }
        }
    }
    let stack = |f: &dyn Fn(&Prediction) -> Vec<f32>| -> Result<Array3<f32>, Error> {
        let data: Vec<f32> = predictions.iter().flat_map(|p| f(p)).collect();
        Array::from_shape_vec((n, h, w), data).map_err(|e| Error::Input(e.to_string()))
    };
    let io = |e: ndarray_npy::WriteNpzError| Error::Output {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    };
    let mut npz = ndarray_npy::NpzWriter::new_compressed(std::io::Cursor::new(Vec::new()));
    npz.add_array("depth", &stack(&|p| round(&p.depth, 8))?)
        .map_err(io)?;
    if first.confidence.is_some() {
        let conf = stack(&|p| round(p.confidence.as_deref().unwrap_or_default(), 2))?;
        npz.add_array("conf", &conf).map_err(io)?;
    }
    if first.pose.is_some() {
        let poses: Vec<_> = predictions.iter().filter_map(|p| p.pose).collect();
        let ext: Vec<f32> = poses.iter().flat_map(|p| p.extrinsics.concat()).collect();
        let int: Vec<f32> = poses.iter().flat_map(|p| p.intrinsics.concat()).collect();
        let shape_err = |e: ndarray::ShapeError| Error::Input(e.to_string());
        npz.add_array(
            "extrinsics",
            &Array::from_shape_vec((n, 3, 4), ext).map_err(shape_err)?,
        )
        .map_err(io)?;
        npz.add_array(
            "intrinsics",
            &Array::from_shape_vec((n, 3, 3), int).map_err(shape_err)?,
        )
        .map_err(io)?;
    }
    if first.sky.is_some() {
        let sky = stack(&|p| p.sky.clone().unwrap_or_default())?;
        npz.add_array("sky", &sky).map_err(io)?;
    }
    let bytes = npz.finish().map_err(io)?.into_inner();
    Ok(atomic_file::write(path, |out| out.write_all(&bytes))?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn rounding_is_numpys() {
        // np.round(np.float32([0.125, 0.135, 1.005, -2.5]), 2)
        //   -> [0.12, 0.14, 1., -2.5] (0.135f32 is 0.13500000536...)
        assert_eq!(
            super::round(&[0.125, 0.135, 1.005, -2.5], 2),
            vec![0.12, 0.14, 1.0, -2.5]
        );
    }
}
