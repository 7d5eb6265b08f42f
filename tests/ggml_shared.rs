//! Frozen (shared) weights: what freezing requires, and that nothing can write or rename a
//! shared tensor while other threads may read it.

use da3::ggml::{
    Backend, BufferType, BufferUsage, Context, DType, Error, Gallocr, SharedContext, TensorView,
};

/// A weights context with `w` (2x2, values 1..4) in a CPU buffer, frozen.
fn frozen_weights() -> SharedContext {
    let ctx = Context::metadata(4).unwrap();
    let w = ctx.new_tensor(DType::F32, &[2, 2]).unwrap().named("w");
    ctx.allocate_in(BufferType::cpu(), BufferUsage::Weights)
        .unwrap();
    ctx.write(&w, &[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    drop(w);
    ctx.freeze().unwrap()
}

#[test]
fn freeze_needs_the_context_alone() {
    let ctx = Context::metadata(4).unwrap();
    let w = ctx.new_tensor(DType::F32, &[2]).unwrap().named("w");
    ctx.allocate_in(BufferType::cpu(), BufferUsage::Weights)
        .unwrap();
    let err = ctx.freeze().unwrap_err();
    assert!(err.to_string().contains("still alive"), "{err}");
    drop(w);
}

#[test]
fn freeze_refuses_tensors_without_a_buffer_and_ops() {
    let ctx = Context::metadata(4).unwrap();
    let _ = ctx.new_tensor(DType::F32, &[2]).unwrap();
    let err = ctx.freeze().unwrap_err();
    assert!(err.to_string().contains("not a leaf with data"), "{err}");

    let ctx = Context::metadata(8).unwrap();
    let a = ctx.new_tensor(DType::F32, &[2]).unwrap();
    let _ = ctx.scale(&a, 2.0).unwrap();
    drop(a);
    ctx.allocate_in(BufferType::cpu(), BufferUsage::Weights)
        .unwrap();
    let err = ctx.freeze().unwrap_err();
    assert!(err.to_string().contains("not a leaf"), "{err}");
}

#[test]
fn imported_weights_compute_and_cannot_be_written_or_renamed() {
    let shared = frozen_weights();
    assert_eq!(shared.tensor_names(), vec!["w".to_owned()]);
    let ctx = Context::metadata(8).unwrap();
    assert!(ctx.import(&shared, "missing").is_none());
    let w = ctx.import(&shared, "w").unwrap();
    let y = ctx.scale(&w, 10.0).unwrap().named("y");
    y.mark_output();
    let view = ctx.reshape(&w, &[4]).unwrap();
    let graph = ctx.new_graph(8).unwrap();
    graph.expand(&y).unwrap();
    graph.expand(&view).unwrap();
    let backend = Backend::cpu(1).unwrap();
    let mut gallocr = Gallocr::for_backend(&backend).unwrap();
    let run = gallocr.alloc(&graph).unwrap();
    run.compute(&backend).unwrap();
    assert_eq!(run.read::<f32>(&y).unwrap(), vec![10.0, 20.0, 30.0, 40.0]);

    // The weight, and a view of it, are graph members, but their memory is shared.
    for t in [&w, &view] {
        match run.write(t, &[0.0f32; 4]) {
            Err(Error::SharedWeights { .. }) => {}
            other => panic!("write to shared weights: {other:?}"),
        }
    }
    // Names and flags of a shared tensor stay as they are.
    w.set_name("renamed");
    w.mark_input();
    assert_eq!(w.name(), "w");
    assert!(!w.flags().input);
    assert_eq!(run.read::<f32>(&w).unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
}

/// Graphs on several threads read the same frozen weights at the same time.
#[test]
fn threads_compute_with_one_frozen_context() {
    let shared = frozen_weights();
    std::thread::scope(|scope| {
        for k in 1..=4 {
            let shared = shared.clone();
            scope.spawn(move || {
                let ctx = Context::metadata(8).unwrap();
                let w = ctx.import(&shared, "w").unwrap();
                let y = ctx.scale(&w, k as f32).unwrap();
                y.mark_output();
                let graph = ctx.new_graph(8).unwrap();
                graph.expand(&y).unwrap();
                let backend = Backend::cpu(1).unwrap();
                let mut gallocr = Gallocr::for_backend(&backend).unwrap();
                for _ in 0..50 {
                    let run = gallocr.alloc(&graph).unwrap();
                    run.compute(&backend).unwrap();
                    let expected: Vec<f32> = [1.0, 2.0, 3.0, 4.0].map(|v| v * k as f32).to_vec();
                    assert_eq!(run.read::<f32>(&y).unwrap(), expected);
                }
            });
        }
    });
}
