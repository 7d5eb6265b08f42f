//! A streamed reconstruction of the synthetic room of the stream tests (a box room with a
//! sphere, ray-cast from cameras going round it one and a half times), predicted exactly by
//! the tests' stand-in predictor with a bend that makes the windows drift, then loop-closed
//! and fused: what the README's picture of `da3 view` on a streamed mesh shows, since no
//! trained weights can be downloaded here.
//!
//! ```sh
//! cargo run --release --example stream_room -- OUT_DIR && da3 view OUT_DIR
//! ```

#[path = "../tests/stream/scene.rs"]
mod scene;

use da3::stream::{LoopOptions, MeshOptions, Stream, StreamOptions};

fn main() -> Result<(), da3::Error> {
    let out = std::path::PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "room".into()));
    std::fs::create_dir_all(out.join("pcd"))
        .map_err(|e| da3::Error::Input(format!("{}: {e}", out.display())))?;
    let options = StreamOptions {
        loop_closure: Some(LoopOptions::default()),
        mesh: Some(MeshOptions::default()),
        store_stride: 1,
        ..StreamOptions::default()
    };
    let predictor = scene::ScenePredictor {
        bend: 0.003,
        ..scene::ScenePredictor::exact()
    };
    let mut stream = Stream::new(predictor, options)?;
    for f in 0..108 {
        stream.push(scene::image(f), format!("frame{f}"))?;
    }
    let reconstruction = stream.finish()?;
    reconstruction.save_camera_poses_txt(out.join("camera_poses.txt"))?;
    reconstruction.save_intrinsics_txt(out.join("intrinsic.txt"))?;
    reconstruction.save_poses_json(out.join("poses.json"))?;
    reconstruction.save_cloud_ply(out.join("pcd").join("combined_pcd.ply"))?;
    reconstruction.save_mesh_glb(out.join("mesh.glb"))?;
    let accepted = reconstruction.loops.iter().filter(|l| l.accepted).count();
    let mesh = reconstruction
        .mesh
        .as_ref()
        .map_or(0, |m| m.triangles.len());
    println!(
        "{} frames, {} windows, {accepted} loop(s) closed, {mesh} triangles in {}",
        reconstruction.frames.len(),
        reconstruction.windows.len(),
        out.display()
    );
    Ok(())
}
