//! Kernels of our own that take graph nodes (our CUDA attention) are never handed memory they
//! cannot address: the executor checks every operand of every node they take, after the
//! allocation and before anything is computed, under every residency policy. Run on the CPU,
//! whose memory is host memory: a device kernel must refuse all of it.

use da3::ggml::{Backend, Context, DType, NodeKernel, TensorRef, TensorView};
use da3::residency::{Error, Executor, Issue, Policy};
use std::cell::Cell;

/// Takes every fused-attention node, as our CUDA attention does, and records whether it was
/// ever asked to compute one.
#[derive(Default)]
struct RecordingAttention {
    computed: std::rc::Rc<Cell<usize>>,
}

impl NodeKernel for RecordingAttention {
    fn name(&self) -> String {
        "recording attention".into()
    }
    fn takes(&self, node: &TensorRef<'_>) -> bool {
        node.op_name() == "FLASH_ATTN_EXT"
    }
    fn compute(&self, _node: &TensorRef<'_>) -> da3::ggml::Result<()> {
        self.computed.set(self.computed.get() + 1);
        Ok(())
    }
}

/// DA3's attention as the CUDA graph has it: q, k and v strided views of one QKV product's
/// result, permuted per head, into ggml's fused attention. `weight_host_ctx` places the QKV
/// weight in plain host memory (no buffer) instead of a graph input.
fn attention_graph(ctx: &Context, weight_ctx: &Context) -> (da3::ggml::Graph, da3::ggml::Tensor) {
    let (d, heads, tokens) = (8i64, 2i64, 6i64);
    let e = d * heads;
    let x = ctx.new_tensor(DType::F32, &[e, tokens]).unwrap().named("x");
    x.mark_input();
    let w = weight_ctx
        .new_tensor(DType::F32, &[e, 3 * e])
        .unwrap()
        .named("qkv.weight");
    let qkv = ctx.mul_mat(&w, &x).unwrap().named("qkv");
    let row = qkv.nb()[1];
    let split = |i: i64| {
        let view = ctx
            .view(
                &qkv,
                &[d, heads, tokens],
                &[d as usize * 4, row],
                (i * e) as usize * 4,
            )
            .unwrap();
        ctx.permute(&view, [0, 2, 1, 3]).unwrap()
    };
    let out = ctx
        .flash_attn_ext(&split(0), &split(1), &split(2), None, 0.125)
        .unwrap()
        .named("attention");
    out.mark_output();
    let graph = ctx.new_graph(64).unwrap();
    graph.expand(&out).unwrap();
    (graph, x)
}

fn cpu() -> Backend {
    Backend::cpu(1).unwrap()
}

#[test]
fn a_device_kernel_is_never_handed_host_memory_under_any_policy() {
    for policy in [Policy::Auto, Policy::Mirror, Policy::Unchecked] {
        let ctx = Context::metadata_with_graph(32, 64).unwrap();
        let weights = Context::host(64 * 1024).unwrap();
        let (graph, x) = attention_graph(&ctx, &weights);
        let kernel = RecordingAttention::default();
        let computed = kernel.computed.clone();
        let mut executor = Executor::new(cpu(), cpu(), policy)
            .unwrap()
            .quiet()
            .with_node_kernel(Box::new(kernel));
        let run = executor.run(&graph).unwrap();
        run.write(&x, &[0.5f32; 16 * 6]).unwrap();
        let err = run.compute().unwrap_err();
        assert_eq!(computed.get(), 0, "{policy:?}: the kernel was called");
        let Error::KernelOperands { kernel, findings } = &err else {
            panic!("{policy:?}: expected a refusal of the kernel's operands, got {err}");
        };
        assert_eq!(kernel, "recording attention");
        // The node itself and the QKV result its three views read: the CPU's compute buffer,
        // host memory.
        let named: Vec<&str> = findings.iter().map(|f| f.tensor.as_str()).collect();
        assert!(
            named.contains(&"attention") && named.contains(&"qkv"),
            "{named:?}"
        );
        assert!(findings.iter().all(|f| f.consumer == "attention"));
        assert!(
            findings.iter().all(|f| matches!(
                f.issue,
                Issue::ForeignBuffer {
                    host_readable: true,
                    ..
                }
            )),
            "{findings:?}"
        );
        let message = err.to_string();
        assert!(
            message.contains("recording attention would be handed memory it cannot address")
                && message.contains("`qkv` of node `attention`"),
            "{message}"
        );
    }
}

#[test]
fn nodes_the_kernel_does_not_take_compute_on_the_backend_as_before() {
    /// Takes nothing: the graph computes exactly as without it.
    struct TakesNothing;
    impl NodeKernel for TakesNothing {
        fn name(&self) -> String {
            "takes nothing".into()
        }
        fn takes(&self, _node: &TensorRef<'_>) -> bool {
            false
        }
        fn compute(&self, _node: &TensorRef<'_>) -> da3::ggml::Result<()> {
            unreachable!("takes no node")
        }
    }
    let input: Vec<f32> = (0..16 * 6).map(|i| (i as f32 * 0.37).sin()).collect();
    let weights = Context::host(64 * 1024).unwrap();
    let outputs: Vec<Vec<f32>> = [false, true]
        .into_iter()
        .map(|with_kernel| {
            let ctx = Context::metadata_with_graph(32, 64).unwrap();
            let (graph, x) = attention_graph(&ctx, &weights);
            let mut executor = Executor::new(cpu(), cpu(), Policy::Auto).unwrap().quiet();
            if with_kernel {
                executor = executor.with_node_kernel(Box::new(TakesNothing));
            }
            let out = graph.nodes().last().unwrap().name();
            let run = executor.run(&graph).unwrap();
            run.write(&x, &input).unwrap();
            run.compute().unwrap();
            let out = ctx.tensor(&out).unwrap();
            run.read::<f32>(&out).unwrap()
        })
        .collect();
    assert_eq!(outputs[0], outputs[1]);
}

/// DA3's attention (three strided views of one QKV result) is what our CUDA attention takes,
/// with its layout read off the node; a mask, an odd head size or an offset view is not.
#[test]
fn our_cuda_attention_takes_da3s_attention_nodes_only() {
    use da3::ggml::{fused_attention, FusedAttention};
    let ctx = Context::metadata_with_graph(64, 64).unwrap();
    let weights = Context::host(64 * 1024).unwrap();
    let (graph, _) = attention_graph(&ctx, &weights);
    let taken: Vec<_> = graph
        .nodes()
        .filter_map(|n| fused_attention(&n).map(|a| (n.name(), a)))
        .collect();
    // q, k and v: [d 8, t 6, h 2] views of the [48, 6] QKV result (rows of 48 f32).
    assert_eq!(
        taken,
        vec![(
            "attention".to_owned(),
            FusedAttention {
                d: 8,
                tq: 6,
                tkv: 6,
                heads: 2,
                batch: 1,
                strides: [[48, 8, 288]; 3],
                scale: 0.125,
            }
        )]
    );

    let q = ctx.new_tensor(DType::F32, &[8, 6, 2, 1]).unwrap();
    let k = ctx.new_tensor(DType::F32, &[8, 6, 2, 1]).unwrap();
    let mask = ctx.new_tensor(DType::F16, &[6, 6, 1, 1]).unwrap();
    let masked = ctx.flash_attn_ext(&q, &k, &k, Some(&mask), 1.0).unwrap();
    assert_eq!(fused_attention(&masked.as_ref()), None, "a mask");
    let odd = ctx.new_tensor(DType::F32, &[12, 6, 2, 1]).unwrap();
    let odd_heads = ctx.flash_attn_ext(&odd, &odd, &odd, None, 1.0).unwrap();
    assert_eq!(fused_attention(&odd_heads.as_ref()), None, "head size 12");
    let flat = ctx.new_tensor(DType::F32, &[8 * 6 * 2 + 1]).unwrap();
    let shifted = ctx.view(&flat, &[8, 6, 2], &[32, 192], 4).unwrap();
    let offset = ctx.flash_attn_ext(&shifted, &k, &k, None, 1.0).unwrap();
    assert_eq!(
        fused_attention(&offset.as_ref()),
        None,
        "q starts 4 bytes in"
    );
    let plain = ctx.flash_attn_ext(&q, &k, &k, None, 0.5).unwrap();
    assert_eq!(
        fused_attention(&plain.as_ref()).map(|a| (a.batch, a.strides[0], a.scale)),
        Some((1, [8, 48, 96], 0.5))
    );
}
