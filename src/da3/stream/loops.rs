//! Loop closure: revisits found by the key frames' appearance, verified by predicting the two
//! key frames' neighbourhoods as one scene and aligning it to both windows, and closed by
//! optimising the windows' Sim(3) graph.
//!
//! The descriptor is the key frame itself, small: grey levels on a 32 x 24 grid (area
//! averages), less their mean, unit length, compared by cosine similarity. It needs no
//! weights (the official DA3-Streaming uses SALAD, a learnt retrieval network whose weights
//! are a separate download) and is cheap, but it is viewpoint-sensitive: it finds returns
//! to a place seen from about the same direction, which is what a video revisiting its path
//! gives. Geometry decides: a candidate is accepted only when both sides align.

use super::spill::FrameStore;
use super::{
    align_normalised, back_project, LoopOptions, StreamOptions, StreamTimings, WindowMaps,
    WindowState,
};
use crate::da3::preprocess::RgbImage8;
use crate::da3::request::{Predictor, Request};
use crate::da3::Error;
use crate::geometry::pose_graph::{OptimizeReport, PoseGraph};
use std::time::Instant;

const DESCRIPTOR_WIDTH: usize = 32;
const DESCRIPTOR_HEIGHT: usize = 24;

/// A loop candidate that was verified.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopClosure {
    /// The earlier and the later window.
    pub windows: (usize, usize),
    /// Their key frames.
    pub frames: (usize, usize),
    /// Cosine similarity of the key frames' descriptors.
    pub similarity: f32,
    /// Inlier fraction of the candidate scene's alignment to each window.
    pub inlier_fractions: (f64, f64),
    /// Whether it became an edge of the pose graph.
    pub accepted: bool,
    /// The correction it implied: the later window moved relative to the earlier by this
    /// transform's translation (relative to the scene scale) and rotation (degrees).
    pub correction: Option<(f64, f64)>,
}

/// The appearance descriptor of an image (see the module docs).
pub(crate) fn descriptor(image: &RgbImage8) -> Vec<f32> {
    let (w, h) = (image.width.max(1), image.height.max(1));
    let mut sums = vec![0.0f64; DESCRIPTOR_WIDTH * DESCRIPTOR_HEIGHT];
    let mut counts = vec![0u32; DESCRIPTOR_WIDTH * DESCRIPTOR_HEIGHT];
    for y in 0..image.height {
        let gy = y * DESCRIPTOR_HEIGHT / h;
        for x in 0..image.width {
            let gx = x * DESCRIPTOR_WIDTH / w;
            let p = &image.data[(y * image.width + x) * 3..][..3];
            let grey = 0.299 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.114 * f64::from(p[2]);
            sums[gy * DESCRIPTOR_WIDTH + gx] += grey;
            counts[gy * DESCRIPTOR_WIDTH + gx] += 1;
        }
    }
    let cells: Vec<f64> = sums
        .iter()
        .zip(&counts)
        .map(|(s, &c)| if c > 0 { s / f64::from(c) } else { 0.0 })
        .collect();
    let mean = cells.iter().sum::<f64>() / cells.len() as f64;
    let norm = cells.iter().map(|v| (v - mean).powi(2)).sum::<f64>().sqrt();
    if norm < 1e-9 {
        return vec![0.0; cells.len()];
    }
    cells.iter().map(|v| ((v - mean) / norm) as f32).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Candidate pairs `(earlier, later, similarity)`, the most similar first: windows at least
/// `min_window_gap` apart above the similarity threshold, at most one per later window (its
/// best match) and no two within `min_window_gap` of each other on both sides.
pub(crate) fn candidates(
    windows: &[WindowState],
    options: &LoopOptions,
) -> Vec<(usize, usize, f32)> {
    let mut best: Vec<(usize, usize, f32)> = Vec::new();
    for later in 0..windows.len() {
        let mut top: Option<(usize, f32)> = None;
        for earlier in 0..later.saturating_sub(options.min_window_gap - 1) {
            if later - earlier < options.min_window_gap {
                continue;
            }
            let (a, b) = (&windows[earlier].descriptor, &windows[later].descriptor);
            if a.is_empty() || b.is_empty() {
                continue;
            }
            let s = cosine(a, b);
            if s >= options.min_similarity && top.is_none_or(|(_, t)| s > t) {
                top = Some((earlier, s));
            }
        }
        if let Some((earlier, s)) = top {
            best.push((earlier, later, s));
        }
    }
    best.sort_by(|a, b| b.2.total_cmp(&a.2));
    // Non-maximum suppression: a revisit spans several consecutive windows; one edge each
    // few windows is enough, and the strongest is kept.
    let mut kept: Vec<(usize, usize, f32)> = Vec::new();
    for c in best {
        let near = kept.iter().any(|k| {
            k.0.abs_diff(c.0) < options.min_window_gap && k.1.abs_diff(c.1) < options.min_window_gap
        });
        if !near {
            kept.push(c);
        }
        if kept.len() == options.max_candidates {
            break;
        }
    }
    kept
}

/// The stored points (world frame, through the windows' current placements) and confidence
/// of `frames`, and the same pixels of those frames in a candidate scene.
fn side_points(
    store: &mut FrameStore,
    windows: &[WindowState],
    frames: &[usize],
) -> Result<(Vec<[f64; 3]>, Vec<f32>), Error> {
    let mut points = Vec::new();
    let mut confidence = Vec::new();
    for &frame in frames {
        let position = store
            .position(frame)
            .ok_or_else(|| Error::Input(format!("loop closure: frame {frame} was not stored")))?;
        let record = store.records()[position].clone();
        let maps = store.maps(position)?;
        let to_world = windows[record.window]
            .summary
            .to_world
            .compose(&record.camera_to_window);
        points.extend(back_project(
            &maps.depth,
            maps.width,
            maps.height,
            1,
            &maps.intrinsics,
            &to_world,
        ));
        confidence.extend_from_slice(&maps.confidence);
    }
    Ok((points, confidence))
}

/// Finds, verifies and closes loops; updates the windows' placements. Returns every verified
/// candidate and the optimisation, if a loop was accepted.
pub(crate) fn close_loops<P: Predictor>(
    predictor: &mut P,
    store: &mut FrameStore,
    windows: &mut [WindowState],
    stream: &StreamOptions,
    options: &LoopOptions,
    timings: &mut StreamTimings,
) -> Result<(Vec<LoopClosure>, Option<OptimizeReport>), Error> {
    let stride = store.stride();
    let mut closures = Vec::new();
    let mut edges = Vec::new();
    for (earlier, later, similarity) in candidates(windows, options) {
        let a_frames = windows[earlier].key_frames.clone();
        let b_frames = windows[later].key_frames.clone();
        let mut images = Vec::new();
        let mut names = Vec::new();
        for &frame in a_frames.iter().chain(&b_frames) {
            let image = store.image(frame)?.ok_or_else(|| {
                Error::Input(format!(
                    "loop closure: the image of frame {frame} was not kept"
                ))
            })?;
            images.push(image);
            names.push(format!("frame{frame}"));
        }
        let mut request = Request::new(&images)
            .names(names)
            .reference(stream.reference);
        if let Some(p) = stream.process_res {
            request = request.process_res(p);
        }
        let started = Instant::now();
        let output = predictor.run(&request)?;
        timings.model += started.elapsed();
        timings.predicted_views += images.len();
        let scene = WindowMaps::new(&output, 0)?;
        let (w, h) = scene.size;
        // The scene's pixels on the stored maps' grid.
        let scene_side = |views: std::ops::Range<usize>| -> (Vec<[f64; 3]>, Vec<f32>) {
            let mut points = Vec::new();
            let mut confidence = Vec::new();
            for v in views {
                points.extend(back_project(
                    &scene.view(v).depth,
                    w,
                    h,
                    stride,
                    &scene.intrinsics[v],
                    &scene.camera_to_window[v],
                ));
                let conf = scene.confidence(v);
                for y in (0..h).step_by(stride) {
                    for x in (0..w).step_by(stride) {
                        confidence.push(conf[y * w + x]);
                    }
                }
            }
            (points, confidence)
        };
        let (scene_a, scene_a_conf) = scene_side(0..a_frames.len());
        let (scene_b, scene_b_conf) = scene_side(a_frames.len()..a_frames.len() + b_frames.len());
        let (world_a, world_a_conf) = side_points(store, windows, &a_frames)?;
        let (world_b, world_b_conf) = side_points(store, windows, &b_frames)?;
        if world_a.len() != scene_a.len() || world_b.len() != scene_b.len() {
            // Processed at another size than the windows: not comparable pixel for pixel.
            continue;
        }
        let side_a = align_normalised(
            &world_a,
            &world_a_conf,
            &scene_a,
            &scene_a_conf,
            &stream.alignment,
        );
        let side_b = align_normalised(
            &world_b,
            &world_b_conf,
            &scene_b,
            &scene_b_conf,
            &stream.alignment,
        );
        let (Ok((scene_to_a, fit_a, scale)), Ok((scene_to_b, fit_b, _))) = (side_a, side_b) else {
            closures.push(LoopClosure {
                windows: (earlier, later),
                frames: (a_frames[0], b_frames[0]),
                similarity,
                inlier_fractions: (0.0, 0.0),
                accepted: false,
                correction: None,
            });
            continue;
        };
        let accepted = fit_a.inlier_fraction >= options.min_inlier_fraction
            && fit_b.inlier_fraction >= options.min_inlier_fraction;
        // World as seen through window `later`'s placement -> world as seen through
        // `earlier`'s: the drift the loop reveals.
        let correction = scene_to_a.compose(&scene_to_b.inverse());
        let moved = correction
            .translation
            .iter()
            .map(|v| v * v)
            .sum::<f64>()
            .sqrt()
            / scale;
        let trace = (0..3).map(|i| correction.rotation[i][i]).sum::<f64>();
        let degrees = ((trace - 1.0) / 2.0).clamp(-1.0, 1.0).acos().to_degrees();
        closures.push(LoopClosure {
            windows: (earlier, later),
            frames: (a_frames[0], b_frames[0]),
            similarity,
            inlier_fractions: (fit_a.inlier_fraction, fit_b.inlier_fraction),
            accepted,
            correction: Some((moved, degrees)),
        });
        if accepted {
            // The edge in the graph's terms: W_earlier^-1 W_later ~ M, with the later window's
            // placement corrected by the loop.
            let w_a = windows[earlier].summary.to_world;
            let w_b = windows[later].summary.to_world;
            let measurement = w_a.inverse().compose(&correction).compose(&w_b);
            edges.push((earlier, later, measurement));
        }
    }
    if edges.is_empty() {
        return Ok((closures, None));
    }
    let mut graph = PoseGraph::new();
    for w in windows.iter() {
        graph.add_node(w.summary.to_world);
    }
    let graph_error =
        |e: crate::geometry::align::AlignError| Error::Input(format!("pose graph: {e}"));
    for k in 1..windows.len() {
        let measurement = windows[k - 1]
            .summary
            .to_world
            .inverse()
            .compose(&windows[k].summary.to_world);
        graph
            .add_edge(k - 1, k, measurement, 1.0)
            .map_err(graph_error)?;
    }
    for (a, b, measurement) in edges {
        graph
            .add_edge(a, b, measurement, options.weight)
            .map_err(graph_error)?;
    }
    let report = graph.optimize(&options.optimizer).map_err(graph_error)?;
    for (w, node) in windows.iter_mut().zip(graph.nodes()) {
        w.summary.to_world = *node;
    }
    Ok((closures, Some(report)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(f: impl Fn(usize, usize) -> u8) -> RgbImage8 {
        let (w, h) = (64, 48);
        let mut data = Vec::with_capacity(w * h * 3);
        for y in 0..h {
            for x in 0..w {
                let v = f(x, y);
                data.extend_from_slice(&[v, v, v]);
            }
        }
        RgbImage8::new(w, h, data).unwrap()
    }

    #[test]
    fn descriptors_match_the_same_place_and_not_another() {
        let a = descriptor(&image(|x, _| (x * 4) as u8));
        let brighter = descriptor(&image(|x, _| (x * 3 + 20) as u8));
        let other = descriptor(&image(|_, y| (y * 5) as u8));
        assert!(cosine(&a, &brighter) > 0.99, "exposure changes little");
        assert!(cosine(&a, &other).abs() < 0.2, "{}", cosine(&a, &other));
        let flat = descriptor(&image(|_, _| 7));
        assert!(flat.iter().all(|&v| v == 0.0));
    }
}
