//! The stream's memory does not grow with the length of the video: the peak of live heap
//! bytes over 1,000 frames is within 10 % of that over 100 (counted by dhat's allocator; one
//! test, so that nothing else allocates meanwhile).

#[path = "stream/scene.rs"]
mod scene;

use da3::stream::{MeshOptions, Stream, StreamOptions};
use scene::ScenePredictor;

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Runs a stream of `frames` frames that circles the room again and again (so that the fused
/// volume covers the same surfaces) and returns the peak of live heap bytes so far.
fn run_and_peak(frames: usize, images: &[da3::Image]) -> usize {
    let options = StreamOptions {
        window: 12,
        overlap: 4,
        mesh: Some(MeshOptions {
            voxel_size: None,
            max_blocks: 4_000,
        }),
        max_points: 20_000,
        ..StreamOptions::default()
    };
    let mut stream = Stream::new(ScenePredictor::exact(), options).unwrap();
    for f in 0..frames {
        let image = images[f % scene::FRAMES_PER_TURN].clone();
        stream.push(image, format!("frame{f}")).unwrap();
    }
    let reconstruction = stream.finish().unwrap();
    assert_eq!(reconstruction.frames.len(), frames);
    drop(reconstruction);
    dhat::HeapStats::get().max_bytes
}

#[test]
fn memory_is_flat_over_the_length_of_the_stream() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let images: Vec<da3::Image> = (0..scene::FRAMES_PER_TURN).map(scene::image).collect();
    // dhat's peak is over the whole run: after the short stream it is the short one's; after
    // the long one it is the larger of the two, which must stay within 10 % of the short.
    let short = run_and_peak(100, &images);
    let long = run_and_peak(1000, &images);
    eprintln!("peak heap: {short} bytes over 100 frames, {long} over 1,000");
    assert!(
        (long as f64) <= 1.10 * short as f64,
        "{long} bytes over 1,000 frames, {short} over 100"
    );
}
