//! Streaming reconstruction of long videos and big scenes: frames in as they arrive, windows
//! of frames predicted as multi-view scenes, each window aligned to the previous one on the
//! frames they share, loop closure over a Sim(3) pose graph, and a fused mesh and cloud.
//!
//! ```no_run
//! # fn main() -> Result<(), da3::Error> {
//! use da3::stream::{Stream, StreamOptions};
//! let model = da3::Model::open("da3-base.gguf")?;
//! let mut stream = Stream::new(model.session()?, StreamOptions::default())?;
//! for (i, path) in ["f0.png", "f1.png", "f2.png"].iter().enumerate() {
//!     for frame in stream.push(da3::load_image(path)?, format!("frame{i}"))? {
//!         println!("{}: centre {:?}", frame.name, frame.camera_to_world.translation);
//!     }
//! }
//! let reconstruction = stream.finish()?;
//! reconstruction.save_camera_poses_txt("camera_poses.txt")?;
//! # Ok(()) }
//! ```
//!
//! # How
//! Windows hold [`StreamOptions::window`] frames; consecutive windows share
//! [`StreamOptions::overlap`] frames (the official DA3-Streaming chunks them the same way,
//! 120 with 60 shared by default; depth-anything.cpp's `points_stream`, 12 with 3). The world
//! is the first frame's camera at the first window's scale. Each
//! window is one [`Request`] to the [`Predictor`]: depth, confidence and cameras in that
//! window's own frame and scale. The shared frames' pixels, back-projected by both windows,
//! are corresponding points: a confidence-weighted Sim(3) with Huber reweighting (the
//! official `weighted_align_point_maps`, [`crate::geometry::align::align_point_maps`])
//! maps the new window into the previous one, optionally refined by point-to-plane ICP.
//! Every frame's pose is out as soon as its window is aligned ([`Stream::push`]).
//!
//! [`Stream::finish`] predicts the last window, then (with [`LoopOptions`]) finds revisits
//! by comparing the windows' key frames, predicts each candidate pair of key frames together
//! as one small scene, verifies it geometrically (both sides must align with enough inliers)
//! and optimises the windows' Sim(3) graph by Levenberg-Marquardt, re-emitting every pose;
//! then fuses the stored depth into a TSDF volume and a mesh ([`MeshOptions`]) and a cloud
//! with a point budget.
//!
//! # Memory
//! Bounded independently of the video's length: the frames of one window and the shared
//! frames' point maps while predicting; then, with the predictor's compute buffers released
//! ([`Predictor::release_buffers`]), the TSDF's block budget ([`MeshOptions::max_blocks`]), the cloud's
//! point budget ([`StreamOptions::max_points`]), and about 250 bytes per frame and 4 KiB
//! per window of records. Every frame's depth, confidence and colours (every
//! [`StreamOptions::store_stride`]-th pixel) and the key frames' images go to an anonymous
//! temporary file, which grows with the video (about 11 bytes per stored pixel) and is gone
//! when the stream is dropped, or the process dies.

mod files;
mod fusion;
mod loops;
mod spill;

pub use loops::LoopClosure;

use super::metric::DepthUnit;
use super::multiview::RefViewStrategy;
use super::outputs::{quantile, Pose, Prediction};
use super::preprocess::RgbImage8;
use super::request::{Output, Predictor, Request};
use super::Error;
use crate::geometry::align::{align_point_maps, RobustOptions};
use crate::geometry::icp::{grid_normals, point_to_plane_icp, IcpOptions};
use crate::geometry::mesh::Mesh;
use crate::geometry::pose_graph::{LmOptions, OptimizeReport};
use crate::geometry::sim3::Sim3;
use crate::geometry::tsdf::DEFAULT_MAX_BLOCKS;
use spill::FrameStore;
use std::time::{Duration, Instant};

/// How a stream windows, aligns, closes loops and fuses.
#[derive(Debug, Clone)]
pub struct StreamOptions {
    /// Frames per window (each window is one multi-view prediction). Default 12.
    pub window: usize,
    /// Frames shared by consecutive windows, on which they are aligned (at least 1, less than
    /// `window`). Default 4.
    pub overlap: usize,
    /// Process resolution of every prediction (default: the model's).
    pub process_res: Option<usize>,
    /// The reference view of each window (any works: alignment absorbs the window's frame).
    pub reference: RefViewStrategy,
    /// The Huber reweighting of the seam alignment; `huber_delta` is relative to the median
    /// depth of the shared frames (so that it means the same in any window's units).
    pub alignment: RobustOptions,
    /// Refine each seam by point-to-plane ICP after the Sim(3) (`None`: off, the default).
    /// `max_correspondence_distance` is relative to the median depth of the shared frames.
    pub icp: Option<IcpOptions>,
    /// Loop closure at [`Stream::finish`] (`None`: off).
    pub loop_closure: Option<LoopOptions>,
    /// TSDF fusion and a mesh at [`Stream::finish`] (`None`: off, the default).
    pub mesh: Option<MeshOptions>,
    /// Most points of the fused cloud (0: no cloud). Default 2,000,000.
    pub max_points: usize,
    /// Every how many pixels (in x and y) of the processed maps are kept for fusion, the cloud
    /// and loop closure. Default 2.
    pub store_stride: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            window: 12,
            overlap: 4,
            process_res: None,
            reference: RefViewStrategy::default(),
            alignment: RobustOptions::default(),
            icp: None,
            loop_closure: None,
            mesh: None,
            max_points: 2_000_000,
            store_stride: 2,
        }
    }
}

/// TSDF fusion of the aligned depth and its mesh.
#[derive(Debug, Clone)]
pub struct MeshOptions {
    /// Edge of a voxel in world units (the first window's); `None`: the median depth of the
    /// frames / 128 (see [`crate::geometry::tsdf::TsdfOptions::for_scene`]).
    pub voxel_size: Option<f64>,
    /// Most voxel blocks of the volume (its memory bound: about 6 KiB a block; blocks beyond
    /// it are dropped with a warning). Default 32,768 (about 200 MB).
    pub max_blocks: usize,
}

impl Default for MeshOptions {
    fn default() -> Self {
        MeshOptions {
            voxel_size: None,
            max_blocks: DEFAULT_MAX_BLOCKS,
        }
    }
}

/// How revisits are found, verified and closed.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Windows at least this far apart are compared (nearer ones are already chained).
    pub min_window_gap: usize,
    /// Cosine similarity of the key frames' descriptors above which a pair is a candidate.
    pub min_similarity: f32,
    /// Both sides of a candidate must align with at least this fraction of inliers.
    pub min_inlier_fraction: f64,
    /// Frames of each window predicted in a candidate's scene (the key frame and the next).
    pub frames_per_side: usize,
    /// Most candidates verified (the most similar first).
    pub max_candidates: usize,
    /// Weight of a loop edge relative to a seam edge in the pose graph.
    pub weight: f64,
    /// The pose-graph optimiser.
    pub optimizer: LmOptions,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            min_window_gap: 3,
            min_similarity: 0.85,
            min_inlier_fraction: 0.5,
            frames_per_side: 2,
            max_candidates: 32,
            weight: 1.0,
            optimizer: LmOptions::default(),
        }
    }
}

impl StreamOptions {
    fn check(&self) -> Result<(), Error> {
        if self.window < 2 {
            return Err(Error::Input(format!(
                "a stream window of {} frame(s): give 2 or more",
                self.window
            )));
        }
        if self.overlap == 0 || self.overlap >= self.window {
            return Err(Error::Input(format!(
                "a window overlap of {} frame(s) with windows of {}: give 1 to {}",
                self.overlap,
                self.window,
                self.window - 1
            )));
        }
        if self.store_stride == 0 || self.store_stride > 16 {
            return Err(Error::Input(format!(
                "a stored-map stride of {}: give 1 to 16",
                self.store_stride
            )));
        }
        if let Some(p) = self.process_res {
            Request::check_process_res(p)?;
        }
        if let Some(mesh) = &self.mesh {
            if let Some(v) = mesh.voxel_size {
                if !(v.is_finite() && v > 0.0) {
                    return Err(Error::Input(format!(
                        "a voxel size of {v}: give a positive size"
                    )));
                }
            }
            if mesh.max_blocks == 0 {
                return Err(Error::Input(
                    "a TSDF budget of 0 blocks keeps nothing".into(),
                ));
            }
        }
        if let Some(l) = &self.loop_closure {
            if l.frames_per_side == 0 || l.min_window_gap < 2 {
                return Err(Error::Input(
                    "loop closure needs 1 or more frames per side and windows 2 or more apart"
                        .into(),
                ));
            }
        }
        Ok(())
    }
}

/// Sky probability from which a pixel is sky (as the official glb export keeps points below 0.3).
const SKY_THRESHOLD: f32 = 0.3;

/// One frame's camera in the stream's world (the first window's frame and scale).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamFrame {
    /// Position of the frame in the stream (0 for the first pushed).
    pub index: usize,
    /// Its name, as pushed.
    pub name: String,
    /// The window whose prediction gave its depth and camera.
    pub window: usize,
    /// Processed width (what the intrinsics refer to).
    pub width: usize,
    /// Processed height.
    pub height: usize,
    /// Pinhole intrinsics in pixels of the processed image.
    pub intrinsics: [[f64; 3]; 3],
    /// Camera to world as a similarity: `world = s R x + t` for a point `x` of the camera
    /// in the units of the window's predicted depth, so `s` is the factor that brings that
    /// depth to world units and `R`, `t` are the camera's rotation and centre.
    pub camera_to_world: Sim3,
}

impl StreamFrame {
    /// The rigid camera-to-world matrix (rotation without scale, the camera centre as
    /// translation): a line of the official `camera_poses.txt`.
    pub fn camera_to_world_matrix(&self) -> [[f64; 4]; 4] {
        Sim3::from_rigid(
            self.camera_to_world.rotation,
            self.camera_to_world.translation,
        )
        .to_matrix()
    }

    /// The factor from the predicted depth of this frame to world units.
    pub fn depth_scale(&self) -> f64 {
        self.camera_to_world.scale
    }

    /// The camera as the rest of the crate has it (world-to-camera extrinsics).
    pub fn pose(&self) -> Pose {
        let w2c = Sim3::from_rigid(
            self.camera_to_world.rotation,
            self.camera_to_world.translation,
        )
        .inverse()
        .to_matrix();
        Pose {
            intrinsics: self.intrinsics.map(|r| r.map(|v| v as f32)),
            extrinsics: [0, 1, 2].map(|i| w2c[i].map(|v| v as f32)),
        }
    }
}

/// How one window was placed in the world.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowSummary {
    /// Index of the window.
    pub index: usize,
    /// Its first frame.
    pub first_frame: usize,
    /// Its number of frames.
    pub frames: usize,
    /// Window to world (after loop closure, in a [`Reconstruction`]).
    pub to_world: Sim3,
    /// How it was aligned to the previous window (none for the first).
    pub seam: Option<SeamAlignment>,
}

/// The alignment of a window to the previous one on the frames they share.
#[derive(Debug, Clone, PartialEq)]
pub struct SeamAlignment {
    /// Frames shared.
    pub shared_frames: usize,
    /// Corresponding points used.
    pub points: usize,
    /// Weighted fraction of points within the Huber threshold.
    pub inlier_fraction: f64,
    /// Root-mean-square residual relative to the median depth of the shared frames.
    pub relative_rms: f64,
    /// The scale the new window was multiplied by.
    pub scale: f64,
    /// After ICP refinement, its inlier fraction and relative RMS.
    pub icp: Option<(f64, f64)>,
}

/// Time spent per stage, for the overhead the stream adds to the model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamTimings {
    /// In the predictor (windows and loop candidates).
    pub model: Duration,
    /// Back-projection, seam alignment and ICP.
    pub alignment: Duration,
    /// Loop detection, verification (less its predictions) and the pose graph.
    pub loop_closure: Duration,
    /// TSDF integration, meshing and the cloud.
    pub fusion: Duration,
    /// Frames predicted, counting shared frames once per window (the model's work).
    pub predicted_views: usize,
}

/// What a finished stream gives: every frame's final camera, the windows, the loops, the
/// fused mesh and cloud.
#[derive(Debug, Clone)]
pub struct Reconstruction {
    /// Every frame in stream order, with loop-corrected cameras.
    pub frames: Vec<StreamFrame>,
    /// Every window, with its final placement.
    pub windows: Vec<WindowSummary>,
    /// Loop candidates that were verified, accepted or not.
    pub loops: Vec<LoopClosure>,
    /// The pose-graph optimisation, when a loop was accepted.
    pub optimization: Option<OptimizeReport>,
    /// The fused mesh ([`StreamOptions::mesh`]).
    pub mesh: Option<Mesh>,
    /// The fused cloud ([`StreamOptions::max_points`] > 0).
    pub cloud: Option<crate::da3::export::PointCloud>,
    /// Voxel size of the TSDF, when fused.
    pub voxel_size: Option<f64>,
    /// Time per stage.
    pub timings: StreamTimings,
    /// Bytes the temporary frame store reached.
    pub stored_bytes: u64,
    /// What the depth (and so the world's units) measures: relative for an any-view
    /// model, metres for the nested pair.
    pub depth_unit: DepthUnit,
}

/// A window's frames: the images and names of the frames not yet predicted, after the
/// previous window's shared ones.
struct PendingWindow {
    first_frame: usize,
    images: Vec<RgbImage8>,
    names: Vec<String>,
}

/// The previous window's shared frames, as the next window's alignment needs them.
struct Seam {
    window: usize,
    /// Back-projected points of each shared frame in the previous window's frame.
    points: Vec<Vec<[f64; 3]>>,
    confidence: Vec<Vec<f32>>,
    size: (usize, usize),
}

/// A window placed in the world, and its key frame for loop closure.
pub(crate) struct WindowState {
    pub summary: WindowSummary,
    /// The key frames (frame indices) whose images were stored.
    pub key_frames: Vec<usize>,
    /// The first key frame's appearance descriptor.
    pub descriptor: Vec<f32>,
}

/// A reconstruction in progress (see the [module docs](self)).
pub struct Stream<P: Predictor> {
    predictor: P,
    options: StreamOptions,
    pending: PendingWindow,
    pushed: usize,
    seam: Option<Seam>,
    windows: Vec<WindowState>,
    store: FrameStore,
    timings: StreamTimings,
    depth_unit: DepthUnit,
}

impl<P: Predictor> Stream<P> {
    /// A stream over `predictor` (a [`crate::Session`], a [`crate::NestedSession`] for
    /// metres, or a stand-in).
    ///
    /// # Errors
    /// [`Error::Input`] for inconsistent options; an I/O error creating the frame store.
    pub fn new(predictor: P, options: StreamOptions) -> Result<Stream<P>, Error> {
        options.check()?;
        let store = FrameStore::new(options.store_stride)?;
        Ok(Stream {
            predictor,
            options,
            pending: PendingWindow {
                first_frame: 0,
                images: Vec::new(),
                names: Vec::new(),
            },
            pushed: 0,
            seam: None,
            windows: Vec::new(),
            store,
            timings: StreamTimings::default(),
            depth_unit: DepthUnit::default(),
        })
    }

    /// The options.
    pub fn options(&self) -> &StreamOptions {
        &self.options
    }

    /// The predictor (e.g. to read its device name).
    pub fn predictor(&self) -> &P {
        &self.predictor
    }

    /// Frames pushed so far.
    pub fn frames_pushed(&self) -> usize {
        self.pushed
    }

    /// Frames whose cameras are out so far.
    pub fn frames_placed(&self) -> usize {
        self.store.records().len()
    }

    /// Time per stage so far.
    pub fn timings(&self) -> StreamTimings {
        self.timings
    }

    /// Adds the next frame; when it completes a window, predicts and aligns that window and
    /// returns the cameras of the frames it placed (in world coordinates, before any loop
    /// correction), else nothing.
    ///
    /// # Errors
    /// A prediction that failed, a model without cameras or confidence, a window that cannot
    /// be aligned to the previous (too few confident shared pixels).
    pub fn push(
        &mut self,
        image: RgbImage8,
        name: impl Into<String>,
    ) -> Result<Vec<StreamFrame>, Error> {
        image.validate()?;
        self.pending.images.push(image);
        self.pending.names.push(name.into());
        self.pushed += 1;
        if self.pending.images.len() == self.options.window {
            self.predict_window()
        } else {
            Ok(Vec::new())
        }
    }

    /// Predicts the last window, closes loops, fuses, and returns the reconstruction.
    ///
    /// # Errors
    /// As [`Stream::push`]; [`Error::Input`] for a stream with no frame.
    pub fn finish(mut self) -> Result<Reconstruction, Error> {
        let shared = self.seam.as_ref().map_or(0, |s| s.points.len());
        if self.pending.images.len() > shared {
            self.predict_window()?;
        }
        if self.windows.is_empty() {
            return Err(Error::Input(
                "the stream ended before its first frame".into(),
            ));
        }
        let mut loops = Vec::new();
        let mut optimization = None;
        if let Some(options) = self.options.loop_closure.clone() {
            let started = Instant::now();
            let model_before = self.timings.model;
            let (found, report) = loops::close_loops(
                &mut self.predictor,
                &mut self.store,
                &mut self.windows,
                &self.options,
                &options,
                &mut self.timings,
            )?;
            loops = found;
            optimization = report;
            let model = self.timings.model - model_before;
            self.timings.loop_closure += started.elapsed().saturating_sub(model);
        }
        // Predicting is over: the model's compute buffers go before the volume and the cloud
        // take their budgets, so that the two never add up.
        self.predictor.release_buffers()?;
        let frames = self.frames();
        let started = Instant::now();
        let fused = fusion::fuse(&mut self.store, &self.windows, &self.options)?;
        self.timings.fusion += started.elapsed();
        Ok(Reconstruction {
            frames,
            windows: self.windows.into_iter().map(|w| w.summary).collect(),
            loops,
            optimization,
            mesh: fused.mesh,
            cloud: fused.cloud,
            voxel_size: fused.voxel_size,
            timings: self.timings,
            stored_bytes: self.store.file_bytes(),
            depth_unit: self.depth_unit,
        })
    }

    /// Every placed frame with its window's current placement.
    fn frames(&self) -> Vec<StreamFrame> {
        let records = self.store.records();
        records
            .iter()
            .map(|r| frame_in_world(r, &self.windows[r.window].summary.to_world))
            .collect()
    }

    fn predict_window(&mut self) -> Result<Vec<StreamFrame>, Error> {
        let index = self.windows.len();
        let first_frame = self.pending.first_frame;
        let views = self.pending.images.len();
        let mut request = Request::new(&self.pending.images)
            .names(self.pending.names.iter().cloned())
            .reference(self.options.reference);
        if let Some(p) = self.options.process_res {
            request = request.process_res(p);
        }
        let started = Instant::now();
        let output = self.predictor.run(&request)?;
        self.timings.model += started.elapsed();
        self.timings.predicted_views += views;
        let started = Instant::now();
        let window = WindowMaps::new(&output, first_frame)?;
        self.depth_unit = output.views[0].depth_unit;
        let shared = self.seam.as_ref().map_or(0, |s| s.points.len());
        let (to_world, seam) = match self.seam.take() {
            // The world is the first frame's camera (at the first window's scale), whichever
            // view the model took as the window's reference.
            None => (window.camera_to_window[0].inverse(), None),
            Some(previous) => {
                let (relative, seam) = align_seam(&previous, &window, &self.options)?;
                let previous_to_world = self.windows[previous.window].summary.to_world;
                (previous_to_world.compose(&relative), Some(seam))
            }
        };
        // The shared frames of the next window: this window's last `overlap` frames.
        let overlap = self.options.overlap.min(views - 1).max(1);
        let keep_from = views - overlap;
        self.seam = Some(Seam {
            window: index,
            points: (keep_from..views).map(|v| window.points(v)).collect(),
            confidence: (keep_from..views)
                .map(|v| window.confidence(v).to_vec())
                .collect(),
            size: window.size,
        });
        let mut placed = Vec::with_capacity(views - shared);
        let mut key_frames = Vec::new();
        for v in shared..views {
            let view = &output.views[v];
            let frame = first_frame + v;
            let confidence = window.confidence(v);
            let kept: Vec<f32> = view
                .depth
                .iter()
                .zip(confidence)
                .filter(|(d, &c)| d.is_finite() && **d > 0.0 && c > 0.0)
                .map(|(&d, _)| d)
                .collect();
            let median_depth = if kept.is_empty() {
                0.0
            } else {
                quantile(kept, 0.5)
            };
            // Over the pixels that count (not sky).
            let counted = confidence.iter().filter(|&&c| c > 0.0);
            let mean_confidence =
                counted.clone().map(|&c| f64::from(c)).sum::<f64>() / counted.count().max(1) as f64;
            let record = FrameStore::record(
                frame,
                self.pending.names[v].clone(),
                index,
                window.camera_to_window[v],
                window.intrinsics[v],
                window.size,
                median_depth,
                mean_confidence as f32,
            );
            placed.push(frame_in_world(&record, &to_world));
            self.store
                .push(record, &view.depth, confidence, &view.image.data)?;
            let wanted = self
                .options
                .loop_closure
                .as_ref()
                .map_or(0, |l| l.frames_per_side);
            if key_frames.len() < wanted {
                self.store.push_image(frame, &view.image)?;
                key_frames.push(frame);
            }
        }
        let descriptor = match key_frames.first() {
            Some(&frame) => loops::descriptor(&output.views[frame - first_frame].image),
            None => Vec::new(),
        };
        self.windows.push(WindowState {
            summary: WindowSummary {
                index,
                first_frame,
                frames: views,
                to_world,
                seam,
            },
            key_frames,
            descriptor,
        });
        self.timings.alignment += started.elapsed();
        log::debug!(
            "stream: window {index} placed (frames {first_frame} to {}, {} new)",
            first_frame + views - 1,
            placed.len()
        );
        // The next window starts with this one's shared frames.
        self.pending.first_frame = first_frame + keep_from;
        self.pending.images.drain(..keep_from);
        self.pending.names.drain(..keep_from);
        Ok(placed)
    }
}

fn frame_in_world(record: &spill::FrameRecord, window_to_world: &Sim3) -> StreamFrame {
    StreamFrame {
        index: record.index,
        name: record.name.clone(),
        window: record.window,
        width: record.processed_size.0,
        height: record.processed_size.1,
        intrinsics: record.intrinsics,
        camera_to_world: window_to_world.compose(&record.camera_to_window),
    }
}

/// What one window's prediction gives the alignment: cameras and confidence per view.
struct WindowMaps<'a> {
    output: &'a Output,
    size: (usize, usize),
    camera_to_window: Vec<Sim3>,
    intrinsics: Vec<[[f64; 3]; 3]>,
    /// Each view's confidence, 0 where the model sees sky (nested pair): sky has no depth to
    /// align or fuse.
    confidence: Vec<Vec<f32>>,
}

impl<'a> WindowMaps<'a> {
    fn new(output: &'a Output, first_frame: usize) -> Result<WindowMaps<'a>, Error> {
        let mut camera_to_window = Vec::with_capacity(output.views.len());
        let mut intrinsics = Vec::with_capacity(output.views.len());
        let mut confidence = Vec::with_capacity(output.views.len());
        let size = output
            .views
            .first()
            .map(|v| (v.width, v.height))
            .ok_or_else(|| Error::Input("the predictor returned no view".into()))?;
        for (v, view) in output.views.iter().enumerate() {
            let frame = first_frame + v;
            let camera = view
                .camera()
                .filter(|_| view.pose.is_some())
                .ok_or_else(|| {
                    Error::Input(
                        "streaming needs a model that predicts cameras (a DA3 any-view model: \
                     small, base, large or giant, or the nested pair); this one predicts none"
                            .into(),
                    )
                })?;
            if view.confidence.is_none() {
                return Err(Error::Input(
                    "streaming needs a model with a depth confidence output; this one has none"
                        .into(),
                ));
            }
            if (view.width, view.height) != size || view.depth.len() != size.0 * size.1 {
                return Err(Error::Input(format!(
                    "frame {frame} ({}) was processed at {}x{}, the window's first at {}x{}: \
                     a stream's frames must all have one size",
                    view.name, view.width, view.height, size.0, size.1
                )));
            }
            camera_to_window.push(rigid_inverse(&camera.extrinsics));
            intrinsics.push(camera.intrinsics.map(|r| r.map(f64::from)));
            let mut conf = view.confidence.clone().unwrap_or_default();
            if let Some(sky) = &view.sky {
                for (c, s) in conf.iter_mut().zip(sky) {
                    if *s >= SKY_THRESHOLD {
                        *c = 0.0;
                    }
                }
            }
            confidence.push(conf);
        }
        Ok(WindowMaps {
            output,
            size,
            camera_to_window,
            intrinsics,
            confidence,
        })
    }

    fn view(&self, v: usize) -> &Prediction {
        &self.output.views[v]
    }

    fn confidence(&self, v: usize) -> &[f32] {
        &self.confidence[v]
    }

    /// Every pixel of view `v` back-projected into the window's frame (non-finite or
    /// non-positive depth gives a point at infinity that the confidence mask drops).
    fn points(&self, v: usize) -> Vec<[f64; 3]> {
        back_project(
            &self.view(v).depth,
            self.size.0,
            self.size.1,
            1,
            &self.intrinsics[v],
            &self.camera_to_window[v],
        )
    }
}

/// The camera-to-world rigid transform of world-to-camera extrinsics `[R | t]`.
fn rigid_inverse(w2c: &[[f32; 4]; 3]) -> Sim3 {
    let rotation = [0, 1, 2].map(|i| [0, 1, 2].map(|j| f64::from(w2c[i][j])));
    let translation = [0, 1, 2].map(|i| f64::from(w2c[i][3]));
    Sim3::from_rigid(rotation, translation).inverse()
}

/// Pixels `(x, y)` of a `width` x `height` depth map, every `stride`-th in both directions,
/// to points through `camera_to_world` (pixel centres at integer coordinates).
pub(crate) fn back_project(
    depth: &[f32],
    width: usize,
    height: usize,
    stride: usize,
    k: &[[f64; 3]; 3],
    camera_to_world: &Sim3,
) -> Vec<[f64; 3]> {
    let (fx, fy, cx, cy) = (k[0][0], k[1][1], k[0][2], k[1][2]);
    let mut points = Vec::with_capacity(depth.len() / (stride * stride).max(1));
    for y in (0..height).step_by(stride) {
        for x in (0..width).step_by(stride) {
            let d = f64::from(depth[y * width + x]);
            let d = if d.is_finite() && d > 0.0 {
                d
            } else {
                f64::NAN
            };
            let camera = [(x as f64 - cx) / fx * d, (y as f64 - cy) / fy * d, d];
            points.push(camera_to_world.apply(camera));
        }
    }
    points
}

/// Confidence with the pixels whose points are not finite set to 0 (never kept).
fn usable_confidence(points: &[[f64; 3]], confidence: &[f32]) -> Vec<f32> {
    points
        .iter()
        .zip(confidence)
        .map(|(p, &c)| {
            if p.iter().all(|v| v.is_finite()) && c.is_finite() {
                c
            } else {
                0.0
            }
        })
        .collect()
}

/// The median distance of the confident points from the origin of their window... measured
/// as the median norm of the centred points: the scale the relative thresholds refer to.
fn point_scale(points: &[[f64; 3]], confidence: &[f32]) -> f64 {
    let kept: Vec<[f64; 3]> = points
        .iter()
        .zip(confidence)
        .filter(|(_, &c)| c > 0.0)
        .map(|(p, _)| *p)
        .collect();
    if kept.is_empty() {
        return 1.0;
    }
    let n = kept.len() as f64;
    let mean = [0, 1, 2].map(|i| kept.iter().map(|p| p[i]).sum::<f64>() / n);
    let distances: Vec<f32> = kept
        .iter()
        .map(|p| ((0..3).map(|i| (p[i] - mean[i]).powi(2)).sum::<f64>()).sqrt() as f32)
        .collect();
    let scale = f64::from(quantile(distances, 0.5));
    if scale.is_finite() && scale > 0.0 {
        scale
    } else {
        1.0
    }
}

/// Points divided by `scale` (so that relative thresholds become absolute ones).
fn scaled(points: &[[f64; 3]], scale: f64) -> Vec<[f64; 3]> {
    points.iter().map(|p| p.map(|v| v / scale)).collect()
}

/// Aligns `source` onto `target` with points normalised by the target's scale, and returns
/// the transform in the original units with the alignment's statistics.
pub(crate) fn align_normalised(
    target: &[[f64; 3]],
    target_conf: &[f32],
    source: &[[f64; 3]],
    source_conf: &[f32],
    options: &RobustOptions,
) -> Result<(Sim3, crate::geometry::align::Alignment, f64), Error> {
    let target_conf = usable_confidence(target, target_conf);
    let source_conf = usable_confidence(source, source_conf);
    let scale = point_scale(target, &target_conf);
    let median = |c: &[f32]| -> f64 {
        let kept: Vec<f32> = c.iter().copied().filter(|&v| v > 0.0).collect();
        if kept.is_empty() {
            0.0
        } else {
            f64::from(quantile(kept, 0.5))
        }
    };
    // The official threshold: a tenth of the smaller median confidence.
    let threshold = median(&target_conf).min(median(&source_conf)) * 0.1;
    let alignment = align_point_maps(
        &scaled(target, scale),
        &target_conf,
        &scaled(source, scale),
        &source_conf,
        threshold,
        options,
    )
    .map_err(|e| Error::Input(format!("aligning windows: {e}")))?;
    let t = alignment.transform;
    let transform = Sim3::new(t.scale, t.rotation, t.translation.map(|v| v * scale));
    Ok((transform, alignment, scale))
}

/// The transform from the new window's frame into the previous window's, on the frames they
/// share.
fn align_seam(
    previous: &Seam,
    window: &WindowMaps<'_>,
    options: &StreamOptions,
) -> Result<(Sim3, SeamAlignment), Error> {
    let shared = previous.points.len();
    if window.size != previous.size {
        return Err(Error::Input(format!(
            "window frames processed at {}x{}, the previous window's at {}x{}: a stream's \
             frames must all have one size",
            window.size.0, window.size.1, previous.size.0, previous.size.1
        )));
    }
    let mut target = Vec::new();
    let mut target_conf = Vec::new();
    let mut source = Vec::new();
    let mut source_conf = Vec::new();
    for s in 0..shared {
        target.extend_from_slice(&previous.points[s]);
        target_conf.extend_from_slice(&previous.confidence[s]);
        source.extend(window.points(s));
        source_conf.extend_from_slice(window.confidence(s));
    }
    let (mut transform, alignment, scale) = align_normalised(
        &target,
        &target_conf,
        &source,
        &source_conf,
        &options.alignment,
    )
    .map_err(|e| {
        Error::Input(format!(
            "window starting at frame {}: {e}",
            window.view(0).name
        ))
    })?;
    let mut icp = None;
    if let Some(icp_options) = &options.icp {
        let (w, h) = previous.size;
        let mut normals = Vec::with_capacity(target.len());
        for s in 0..shared {
            normals.extend(grid_normals(&previous.points[s], w, h));
        }
        // Confident, finite points only; every 4th, as ICP needs far fewer than the seam has.
        let keep = |points: &[[f64; 3]], conf: &[f32]| -> Vec<usize> {
            let conf = usable_confidence(points, conf);
            (0..points.len())
                .filter(|&i| conf[i] > 0.0)
                .step_by(4)
                .collect()
        };
        let t_keep = keep(&target, &target_conf);
        let s_keep = keep(&source, &source_conf);
        let pick = |points: &[[f64; 3]], idx: &[usize]| -> Vec<[f64; 3]> {
            idx.iter().map(|&i| points[i].map(|v| v / scale)).collect()
        };
        let t_normals: Vec<[f64; 3]> = t_keep.iter().map(|&i| normals[i]).collect();
        let initial = Sim3::new(
            transform.scale,
            transform.rotation,
            transform.translation.map(|v| v / scale),
        );
        // A refinement: where it cannot run (too few points near each other, as with an
        // untrained model's depth), the Sim(3) stands.
        match point_to_plane_icp(
            &pick(&source, &s_keep),
            &pick(&target, &t_keep),
            &t_normals,
            &initial,
            icp_options,
        ) {
            Ok(refined) => {
                let r = refined.transform;
                transform = Sim3::new(r.scale, r.rotation, r.translation.map(|v| v * scale));
                icp = Some((refined.inlier_fraction, refined.rms));
            }
            Err(e) => log::warn!(
                "ICP on the seam at frame {} did not run ({e}); keeping the Sim(3) alignment",
                window.view(0).name
            ),
        }
    }
    Ok((
        transform,
        SeamAlignment {
            shared_frames: shared,
            points: target.len(),
            inlier_fraction: alignment.inlier_fraction,
            relative_rms: alignment.rms,
            scale: transform.scale,
            icp,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let bad = |f: fn(&mut StreamOptions)| {
            let mut o = StreamOptions::default();
            f(&mut o);
            o.check().unwrap_err().to_string()
        };
        assert!(bad(|o| o.window = 1).contains("window of 1"));
        assert!(bad(|o| o.overlap = 0).contains("overlap of 0"));
        assert!(bad(|o| o.overlap = 12).contains("give 1 to 11"));
        assert!(bad(|o| o.store_stride = 0).contains("stride"));
        assert!(bad(|o| o.mesh = Some(MeshOptions {
            voxel_size: Some(-1.0),
            max_blocks: 1
        }))
        .contains("voxel size of -1"));
        StreamOptions::default().check().unwrap();
    }

    #[test]
    fn back_projection_follows_the_pinhole_model() {
        let k = [[10.0, 0.0, 2.0], [0.0, 20.0, 1.0], [0.0, 0.0, 1.0]];
        let depth = vec![2.0f32; 4 * 3];
        let points = back_project(&depth, 4, 3, 1, &k, &Sim3::IDENTITY);
        // Pixel (3, 2): x = (3 - 2) / 10 * 2, y = (2 - 1) / 20 * 2.
        let p = points[2 * 4 + 3];
        assert!((p[0] - 0.2).abs() < 1e-12 && (p[1] - 0.1).abs() < 1e-12 && p[2] == 2.0);
        let strided = back_project(&depth, 4, 3, 2, &k, &Sim3::IDENTITY);
        assert_eq!(strided.len(), 2 * 2);
        assert_eq!(strided[3], points[2 * 4 + 2]);
    }
}
