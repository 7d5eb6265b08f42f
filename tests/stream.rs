//! The stream end to end with a predictor that returns a synthetic scene exactly (see
//! `stream/scene.rs`): the trajectory, the mesh, noise, drift and loop closure, errors.

#[path = "stream/scene.rs"]
mod scene;

use da3::geometry::sim3::Sim3;
use da3::stream::{LoopOptions, MeshOptions, Reconstruction, Stream, StreamOptions};
use scene::ScenePredictor;

fn options(window: usize, overlap: usize) -> StreamOptions {
    StreamOptions {
        window,
        overlap,
        max_points: 50_000,
        ..StreamOptions::default()
    }
}

/// The stream's world is window 0's frame: the first camera's, at window 0's scale.
fn world_of_stream(window: usize) -> Sim3 {
    ScenePredictor::world_to_window(0, window)
}

fn run(
    predictor: ScenePredictor,
    frames: usize,
    options: StreamOptions,
) -> (Reconstruction, Vec<usize>) {
    let mut stream = Stream::new(predictor, options).unwrap();
    let mut placed_after_push = Vec::new();
    for f in 0..frames {
        let placed = stream.push(scene::image(f), format!("frame{f}")).unwrap();
        for p in &placed {
            assert!(
                p.index <= f,
                "frame {} placed before it was pushed",
                p.index
            );
        }
        placed_after_push.push(stream.frames_placed());
    }
    (stream.finish().unwrap(), placed_after_push)
}

/// Largest camera-centre error relative to the circle's radius in stream units, and largest
/// rotation error (radians).
fn trajectory_error(reconstruction: &Reconstruction, window: usize) -> (f64, f64) {
    let world = world_of_stream(window);
    let radius = 1.5 * world.scale;
    let mut worst = (0.0f64, 0.0f64);
    for frame in &reconstruction.frames {
        let truth = world.compose(&scene::camera(frame.index));
        let ours = frame.camera_to_world;
        let d = (0..3)
            .map(|i| (ours.translation[i] - truth.translation[i]).powi(2))
            .sum::<f64>()
            .sqrt();
        // Angle of R_ours^T R_truth.
        let trace: f64 = (0..3)
            .map(|i| {
                (0..3)
                    .map(|k| ours.rotation[k][i] * truth.rotation[k][i])
                    .sum::<f64>()
            })
            .sum();
        let angle = ((trace - 1.0) / 2.0).clamp(-1.0, 1.0).acos();
        worst = (worst.0.max(d / radius), worst.1.max(angle));
    }
    worst
}

#[test]
fn an_exact_scene_gives_the_true_trajectory_and_poses_as_windows_align() {
    let (reconstruction, placed) = run(ScenePredictor::exact(), 42, options(12, 4));
    assert_eq!(reconstruction.frames.len(), 42);
    assert!(reconstruction
        .frames
        .iter()
        .enumerate()
        .all(|(i, f)| f.index == i));
    // Windows of 12 sharing 4: frames 0-11, 8-19, 16-27, 24-35, then 32-41 at finish. A
    // window's frames are out when its last frame is pushed.
    assert_eq!(placed[10], 0);
    assert_eq!(placed[11], 12);
    assert_eq!(placed[19], 20);
    assert_eq!(placed[35], 36);
    assert_eq!(placed[41], 36);
    assert_eq!(reconstruction.windows.len(), 5);
    assert_eq!(reconstruction.windows[4].first_frame, 32);
    assert_eq!(reconstruction.timings.predicted_views, 12 * 4 + 10);
    let (position, rotation) = trajectory_error(&reconstruction, 12);
    assert!(position < 1e-3, "centre error {position} of the radius");
    assert!(rotation < 1e-3, "rotation error {rotation} rad");
    // Each frame's depth scale brings its window's depth to the stream's units.
    let world = world_of_stream(12);
    for frame in &reconstruction.frames {
        let window_scale = ScenePredictor::world_to_window(
            reconstruction.windows[frame.window].first_frame,
            reconstruction.windows[frame.window].frames,
        )
        .scale;
        let expected = world.scale / window_scale;
        assert!(
            (frame.depth_scale() / expected - 1.0).abs() < 1e-3,
            "frame {}: {} vs {expected}",
            frame.index,
            frame.depth_scale()
        );
    }
    for window in &reconstruction.windows[1..] {
        let seam = window.seam.as_ref().unwrap();
        assert_eq!(seam.shared_frames, 4);
        assert!(seam.inlier_fraction > 0.99, "{seam:?}");
    }
}

#[test]
fn the_fused_mesh_lies_on_the_true_surface() {
    let mut o = options(12, 4);
    o.mesh = Some(MeshOptions::default());
    o.store_stride = 1;
    // A budget the cloud stays under, so that its cells keep their first size.
    o.max_points = 1_000_000;
    let (reconstruction, _) = run(ScenePredictor::exact(), 36, o);
    let mesh = reconstruction.mesh.as_ref().unwrap();
    let voxel = reconstruction.voxel_size.unwrap();
    assert!(
        mesh.triangles.len() > 1000,
        "{} triangles",
        mesh.triangles.len()
    );
    let to_scene = world_of_stream(12).inverse();
    let voxel_in_scene = voxel * to_scene.scale;
    let mut distances: Vec<f64> = mesh
        .vertices
        .iter()
        .map(|v| scene::distance_to_surface(to_scene.apply(v.map(f64::from))) / voxel_in_scene)
        .collect();
    distances.sort_by(f64::total_cmp);
    let at = |q: f64| distances[((distances.len() - 1) as f64 * q) as usize];
    eprintln!(
        "vertex distance in voxels: median {:.3}, 99% {:.3}, 99.9% {:.3}, max {:.3}",
        at(0.5),
        at(0.99),
        at(0.999),
        at(1.0)
    );
    // Within a voxel but where two walls meet: at the room's concave edges the projective
    // distances of the two walls overlap within the truncation band, and the zero crossing
    // rounds the corner off (by up to about a third of a voxel more).
    assert!(
        at(0.999) <= 1.0,
        "0.1 % of vertices {} voxels from the surface",
        at(0.999)
    );
    assert!(
        at(1.0) <= 1.5,
        "a vertex {} voxels from the surface",
        at(1.0)
    );
    let cloud = reconstruction.cloud.as_ref().unwrap();
    assert!(!cloud.is_empty() && cloud.len() <= 1_000_000);
    // The cloud averages the points of each cell (a quarter of a voxel): within a cell of
    // the surface (where walls meet, the average of both).
    let cell = voxel_in_scene / 4.0;
    for p in &cloud.positions {
        let d = scene::distance_to_surface(to_scene.apply(p.map(f64::from)));
        assert!(d <= cell, "a cloud point {d} from the surface, cell {cell}");
    }
}

/// Windows in metres (the nested pair's metric scale per window, here a stand-in that
/// returns the true scale): the stream is in metres at the true scale, not at window 0's, and
/// its files say so.
#[test]
fn a_metric_stream_is_in_metres_at_the_true_scale() {
    let predictor = ScenePredictor {
        metric: true,
        ..ScenePredictor::exact()
    };
    let (reconstruction, _) = run(predictor, 30, options(12, 4));
    assert_eq!(reconstruction.depth_unit, da3::DepthUnit::Metres);
    let world = scene::camera(0).inverse();
    assert!((world.scale - 1.0).abs() < 1e-12);
    for frame in &reconstruction.frames {
        let truth = world.compose(&scene::camera(frame.index));
        let ours = frame.camera_to_world;
        let error = (0..3)
            .map(|i| (ours.translation[i] - truth.translation[i]).powi(2))
            .sum::<f64>()
            .sqrt();
        // The room's camera circle has a radius of 1.5 m.
        assert!(error < 1.5e-3, "frame {}: {error} m off", frame.index);
    }
    let dir = tempfile::tempdir().unwrap();
    let poses = dir.path().join("poses.json");
    reconstruction.save_poses_json(&poses).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&poses).unwrap()).unwrap();
    assert_eq!(json["depth_unit"], "metres");
}

#[test]
fn depth_noise_stays_within_a_stated_bound() {
    let predictor = ScenePredictor {
        depth_noise: 0.01,
        ..ScenePredictor::exact()
    };
    let (reconstruction, _) = run(predictor, 42, options(12, 4));
    let (position, rotation) = trajectory_error(&reconstruction, 12);
    // 1 % independent noise per pixel over thousands of shared pixels averages out: the
    // bound is 1 % of the radius and 0.5 degree over five windows.
    assert!(position < 1e-2, "centre error {position}");
    assert!(rotation < 0.5f64.to_radians(), "rotation error {rotation}");
}

/// Root-mean-square camera-centre error after the best similarity alignment to the truth
/// (absolute trajectory error), relative to the circle's radius.
fn absolute_trajectory_error(reconstruction: &Reconstruction) -> f64 {
    let ours: Vec<[f64; 3]> = reconstruction
        .frames
        .iter()
        .map(|f| f.camera_to_world.translation)
        .collect();
    let truth: Vec<[f64; 3]> = reconstruction
        .frames
        .iter()
        .map(|f| scene::camera(f.index).translation)
        .collect();
    let fit =
        da3::geometry::align::weighted_umeyama(&ours, &truth, &vec![1.0; ours.len()]).unwrap();
    let squared: f64 = ours
        .iter()
        .zip(&truth)
        .map(|(o, t)| {
            let p = fit.apply(*o);
            (0..3).map(|i| (p[i] - t[i]).powi(2)).sum::<f64>()
        })
        .sum();
    (squared / ours.len() as f64).sqrt() / 1.5
}

/// Distance between the cameras of frames `a` and `b` (the same place one turn apart),
/// relative to the circle's radius in the reconstruction's units.
fn loop_gap(reconstruction: &Reconstruction, a: usize, b: usize) -> f64 {
    let radius = 1.5 * world_of_stream(12).scale;
    let (p, q) = (
        reconstruction.frames[a].camera_to_world.translation,
        reconstruction.frames[b].camera_to_world.translation,
    );
    (0..3).map(|i| (p[i] - q[i]).powi(2)).sum::<f64>().sqrt() / radius
}

#[test]
fn loop_closure_closes_the_loop_and_halves_the_drift() {
    let frames = 100;
    let bent = || ScenePredictor {
        bend: 0.003,
        ..ScenePredictor::exact()
    };
    let (open, _) = run(bent(), frames, options(12, 4));
    let mut o = options(12, 4);
    o.loop_closure = Some(LoopOptions::default());
    let (closed, _) = run(bent(), frames, o);
    assert!(open.loops.is_empty());
    let accepted: Vec<_> = closed.loops.iter().filter(|l| l.accepted).collect();
    assert!(!accepted.is_empty(), "no loop accepted: {:?}", closed.loops);
    // The revisit: a key frame and the one a turn later (the same camera).
    let revisit = accepted
        .iter()
        .find(|l| l.frames.1 - l.frames.0 == scene::FRAMES_PER_TURN)
        .expect("the revisit one turn later is found");
    let (a, b) = revisit.frames;
    let report = closed.optimization.as_ref().unwrap();
    assert!(report.final_cost < report.initial_cost);
    let gap = (loop_gap(&open, a, b), loop_gap(&closed, a, b));
    let ate = (
        absolute_trajectory_error(&open),
        absolute_trajectory_error(&closed),
    );
    eprintln!(
        "frames {a} and {b}: gap {:.4} -> {:.4} of the radius; trajectory error {:.4} -> {:.4}",
        gap.0, gap.1, ate.0, ate.1
    );
    // The bend drifts (a gap of a fifth of the radius or more); the closed loop brings the two
    // visits of the place together and the whole trajectory nearer the truth.
    assert!(gap.0 > 0.2, "the bend should drift: {gap:?}");
    assert!(gap.1 < 0.1 * gap.0, "gap {gap:?}");
    assert!(ate.1 < 0.5 * ate.0, "trajectory error {ate:?}");
}

#[test]
fn exact_loops_change_nothing() {
    let mut o = options(12, 4);
    o.loop_closure = Some(LoopOptions::default());
    let (reconstruction, _) = run(ScenePredictor::exact(), 100, o);
    assert!(reconstruction.loops.iter().any(|l| l.accepted));
    let (position, rotation) = trajectory_error(&reconstruction, 12);
    assert!(position < 1e-3 && rotation < 1e-3, "{position} {rotation}");
}

#[test]
fn a_short_stream_is_one_window() {
    let (reconstruction, placed) = run(ScenePredictor::exact(), 5, options(12, 4));
    assert_eq!(placed, vec![0; 5]);
    assert_eq!(reconstruction.windows.len(), 1);
    assert_eq!(reconstruction.frames.len(), 5);
    let (position, _) = trajectory_error(&reconstruction, 5);
    assert!(position < 1e-6);
}

#[test]
fn an_empty_stream_and_bad_options_are_errors() {
    let stream = Stream::new(ScenePredictor::exact(), options(12, 4)).unwrap();
    let e = stream.finish().unwrap_err().to_string();
    assert!(e.contains("before its first frame"), "{e}");
    let e = Stream::new(ScenePredictor::exact(), options(4, 4))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("overlap of 4"), "{e}");
}

/// A predictor without cameras: the stream says what it needs.
struct NoCameras;

impl da3::Predictor for NoCameras {
    fn run(&mut self, request: &da3::Request<'_>) -> Result<da3::Output, da3::Error> {
        let mut output = ScenePredictor::exact().run(request)?;
        for view in &mut output.views {
            view.pose = None;
        }
        Ok(output)
    }
    fn device_name(&self) -> String {
        "none".into()
    }
}

#[test]
fn a_model_without_cameras_is_refused_by_name() {
    let mut stream = Stream::new(NoCameras, options(2, 1)).unwrap();
    stream.push(scene::image(0), "frame0").unwrap();
    let e = stream
        .push(scene::image(1), "frame1")
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs a model that predicts cameras"), "{e}");
}

#[test]
fn files_in_the_official_layout_read_back() {
    let mut o = options(12, 4);
    o.mesh = Some(MeshOptions::default());
    let (reconstruction, _) = run(ScenePredictor::exact(), 20, o);
    let dir = tempfile::tempdir().unwrap();
    reconstruction
        .save_camera_poses_txt(dir.path().join("camera_poses.txt"))
        .unwrap();
    reconstruction
        .save_intrinsics_txt(dir.path().join("intrinsic.txt"))
        .unwrap();
    reconstruction
        .save_poses_json(dir.path().join("poses.json"))
        .unwrap();
    reconstruction
        .save_cloud_ply(dir.path().join("cloud.ply"))
        .unwrap();
    reconstruction
        .save_mesh_ply(dir.path().join("mesh.ply"))
        .unwrap();
    reconstruction
        .save_mesh_glb(dir.path().join("mesh.glb"))
        .unwrap();
    let poses = std::fs::read_to_string(dir.path().join("camera_poses.txt")).unwrap();
    let lines: Vec<&str> = poses.lines().collect();
    assert_eq!(lines.len(), 20);
    let m: Vec<f64> = lines[7].split(' ').map(|v| v.parse().unwrap()).collect();
    assert_eq!(m.len(), 16);
    let truth = world_of_stream(12).compose(&scene::camera(7));
    for i in 0..3 {
        assert!((m[i * 4 + 3] - truth.translation[i]).abs() < 1e-3);
        for j in 0..3 {
            assert!((m[i * 4 + j] - truth.rotation[i][j]).abs() < 1e-3);
        }
    }
    assert_eq!(&m[12..], &[0.0, 0.0, 0.0, 1.0]);
    let k = std::fs::read_to_string(dir.path().join("intrinsic.txt")).unwrap();
    assert_eq!(k.lines().next().unwrap(), "48 48 32 24");
    // poses.json reads back as known poses, one per frame, by name.
    let known = da3::poses::read_poses_json(&dir.path().join("poses.json")).unwrap();
    assert_eq!(known.len(), 20);
    assert_eq!(known[3].name.as_deref(), Some("frame3"));
}

/// The scene with its top rows as sky: depth there is garbage, the sky probability 1.
struct WithSky;

impl da3::Predictor for WithSky {
    fn run(&mut self, request: &da3::Request<'_>) -> Result<da3::Output, da3::Error> {
        let mut output = ScenePredictor::exact().run(request)?;
        for view in &mut output.views {
            let rows = 10 * view.width;
            view.depth[..rows].fill(1000.0);
            let mut sky = vec![0.0; view.depth.len()];
            sky[..rows].fill(1.0);
            view.sky = Some(sky);
        }
        Ok(output)
    }
    fn device_name(&self) -> String {
        "sky".into()
    }
}

#[test]
fn sky_is_neither_aligned_nor_fused() {
    let mut o = options(12, 4);
    o.max_points = 1_000_000;
    o.store_stride = 1;
    let mut stream = Stream::new(WithSky, o).unwrap();
    for f in 0..30 {
        stream.push(scene::image(f), format!("frame{f}")).unwrap();
    }
    let reconstruction = stream.finish().unwrap();
    let (position, rotation) = trajectory_error(&reconstruction, 12);
    assert!(position < 1e-3 && rotation < 1e-3, "{position} {rotation}");
    let to_scene = world_of_stream(12).inverse();
    for p in &reconstruction.cloud.as_ref().unwrap().positions {
        let d = scene::distance_to_surface(to_scene.apply(p.map(f64::from)));
        assert!(d < 0.05, "a sky point {d} from the surface");
    }
}
