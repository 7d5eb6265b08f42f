//! The residency pass: for every source of every node, can the target device read it?

use crate::ggml::{Backend, BufferType, Graph, NodeKernel, TensorRef, TensorView};

/// What the pass needs to know about the device a graph will run on. [`Backend`] implements
/// it; tests implement it to play a device with separate memory on a machine without one.
pub trait Target {
    /// The device's name, for reports.
    fn name(&self) -> String;
    /// Whether the device's kernels can read memory of this buffer type.
    fn reads_buffer_type(&self, buffer_type: BufferType) -> bool;
    /// Whether the device's kernels dereference plain host pointers (only the CPU does).
    fn reads_host_pointers(&self) -> bool;
    /// Whether the device can run the op that computes `node`.
    fn supports_op(&self, node: &TensorRef<'_>) -> bool;
}

impl Target for Backend {
    fn name(&self) -> String {
        Backend::name(self)
    }
    fn reads_buffer_type(&self, buffer_type: BufferType) -> bool {
        self.supports_buffer_type(buffer_type)
    }
    fn reads_host_pointers(&self) -> bool {
        self.default_buffer_type().is_host() && self.is_cpu()
    }
    fn supports_op(&self, node: &TensorRef<'_>) -> bool {
        Backend::supports_op(self, node)
    }
}

/// Where one operand lives, seen from the target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Residency {
    /// In a buffer the target reads.
    Resident,
    /// No memory yet: the graph allocator will place it on the target.
    ToBeAllocated,
    /// Data in plain host memory with no buffer (`buffer == NULL`): the M4 crash.
    NoBuffer,
    /// In a buffer of a type the target cannot read.
    ForeignBuffer {
        /// Name of the buffer type holding the data.
        buffer_type: String,
        /// Whether that buffer is host memory (the CPU could read it).
        host_readable: bool,
    },
}

impl Residency {
    /// Whether computing on the target with this operand would fault.
    pub fn is_hazard(&self, target_reads_host_pointers: bool) -> bool {
        match self {
            Residency::Resident | Residency::ToBeAllocated => false,
            Residency::NoBuffer => !target_reads_host_pointers,
            Residency::ForeignBuffer { .. } => true,
        }
    }
}

/// An operand the target cannot use as it is, or a node it cannot run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The operand's name (the node's own for an unsupported op).
    pub tensor: String,
    /// The node that reads it.
    pub consumer: String,
    /// ggml's name of the consumer's op.
    pub consumer_op: String,
    /// What is wrong.
    pub issue: Issue,
    /// The operand is a graph input, written before each compute: a copy made once would go
    /// stale, so it must be read where it lives on every compute (routed).
    pub input: bool,
}

/// Why an operand or node cannot be used as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issue {
    /// Plain host memory with no buffer (see [`Residency::NoBuffer`]).
    NoBuffer,
    /// In a buffer the device cannot read (see [`Residency::ForeignBuffer`]).
    ForeignBuffer {
        /// Name of the buffer type holding the data.
        buffer_type: String,
        /// Whether that buffer is host memory (the CPU could read it).
        host_readable: bool,
    },
    /// The device cannot run the node's op.
    UnsupportedOp,
}

impl std::fmt::Display for Issue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Issue::NoBuffer => write!(f, "no buffer"),
            Issue::ForeignBuffer { buffer_type, .. } => write!(f, "in {buffer_type}"),
            Issue::UnsupportedOp => write!(f, "op not supported"),
        }
    }
}

/// Where `tensor` lives for `target`, looking through views to the tensor that owns memory.
pub fn classify(tensor: &TensorRef<'_>, target: &dyn Target) -> Residency {
    let owner = tensor.view_source().unwrap_or(*tensor);
    match owner.buffer() {
        Some(buffer) => {
            let buffer_type = buffer.buffer_type();
            if target.reads_buffer_type(buffer_type) {
                Residency::Resident
            } else {
                Residency::ForeignBuffer {
                    buffer_type: buffer_type.name(),
                    host_readable: buffer.is_host(),
                }
            }
        }
        None if owner.has_data() || tensor.has_data() => Residency::NoBuffer,
        None => Residency::ToBeAllocated,
    }
}

/// What the pass saw.
#[derive(Debug, Clone, Default)]
pub struct PassResult {
    /// Every problem, one per (operand, consumer) pair, in graph order.
    pub findings: Vec<Finding>,
    /// Nodes checked.
    pub nodes: usize,
    /// Node sources (operand slots) checked.
    pub sources_checked: usize,
}

impl PassResult {
    /// Distinct tensors with a residency problem, in first-seen order.
    pub fn non_resident(&self) -> Vec<&Finding> {
        let mut seen = std::collections::HashSet::new();
        self.findings
            .iter()
            .filter(|f| f.issue != Issue::UnsupportedOp && seen.insert(f.tensor.clone()))
            .collect()
    }
    /// The nodes whose op the device cannot run.
    pub fn unsupported_ops(&self) -> Vec<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.issue == Issue::UnsupportedOp)
            .collect()
    }
    /// Whether nothing was found: the gallocr fast path is safe.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Checks every source of every node of `graph` against `target`.
pub fn check(graph: &Graph, target: &dyn Target) -> PassResult {
    let host_ok = target.reads_host_pointers();
    let mut result = PassResult::default();
    for node in graph.nodes() {
        result.nodes += 1;
        if !target.supports_op(&node) {
            result.findings.push(Finding {
                tensor: node.name(),
                consumer: node.name(),
                consumer_op: node.op_name().to_owned(),
                issue: Issue::UnsupportedOp,
                input: false,
            });
        }
        for src in node.sources() {
            result.sources_checked += 1;
            let residency = classify(&src, target);
            if !residency.is_hazard(host_ok) {
                continue;
            }
            let issue = match residency {
                Residency::NoBuffer => Issue::NoBuffer,
                Residency::ForeignBuffer {
                    buffer_type,
                    host_readable,
                } => Issue::ForeignBuffer {
                    buffer_type,
                    host_readable,
                },
                Residency::Resident | Residency::ToBeAllocated => unreachable!("not a hazard"),
            };
            // Name the tensor that owns the memory: a view of a host weight is that weight.
            let owner = src.view_source().unwrap_or(src);
            result.findings.push(Finding {
                tensor: owner.name(),
                consumer: node.name(),
                consumer_op: node.op_name().to_owned(),
                issue,
                input: owner.flags().input || src.flags().input,
            });
        }
    }
    result
}

/// Checks the nodes that `kernel` takes, and every operand of each, after allocation: a kernel
/// of our own reads and writes the device's memory directly (it is handed device pointers),
/// so each must be in a buffer of the device that is not host memory. Plain host pointers,
/// host buffers (even ones the backend could read) and memory of another device are findings;
/// a tensor not yet allocated is one too (the kernel would be handed NULL).
pub fn check_kernel_operands(
    graph: &Graph,
    target: &dyn Target,
    kernel: &dyn NodeKernel,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    for node in graph.nodes().filter(|n| kernel.takes(n)) {
        let operands = std::iter::once(node).chain(node.sources());
        for tensor in operands {
            let owner = tensor.view_source().unwrap_or(tensor);
            let issue = match classify(&tensor, target) {
                Residency::Resident => match owner.buffer() {
                    Some(buffer) if buffer.is_host() => Issue::ForeignBuffer {
                        buffer_type: buffer.buffer_type().name(),
                        host_readable: true,
                    },
                    _ => continue,
                },
                Residency::ToBeAllocated | Residency::NoBuffer => Issue::NoBuffer,
                Residency::ForeignBuffer {
                    buffer_type,
                    host_readable,
                } => Issue::ForeignBuffer {
                    buffer_type,
                    host_readable,
                },
            };
            findings.push(Finding {
                tensor: owner.name(),
                consumer: node.name(),
                consumer_op: node.op_name().to_owned(),
                issue,
                input: owner.flags().input,
            });
        }
    }
    findings
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml::{BufferUsage, Context, DType, Graph, Tensor};

    /// A device described by the test: the buffer types its kernels read, whether they
    /// dereference plain host pointers, and the ops it cannot run.
    struct FakeTarget {
        reads: Vec<&'static str>,
        host_pointers: bool,
        rejects: Vec<&'static str>,
    }

    impl FakeTarget {
        /// A GPU-like device with its own memory: reads none of this process's buffers.
        fn separate_memory() -> Self {
            FakeTarget {
                reads: Vec::new(),
                host_pointers: false,
                rejects: Vec::new(),
            }
        }
        fn reading(mut self, buffer_type: &'static str) -> Self {
            self.reads.push(buffer_type);
            self
        }
        fn reading_host_pointers(mut self) -> Self {
            self.host_pointers = true;
            self
        }
        fn rejecting(mut self, op: &'static str) -> Self {
            self.rejects.push(op);
            self
        }
    }

    impl Target for FakeTarget {
        fn name(&self) -> String {
            "FAKE0".to_owned()
        }
        fn reads_buffer_type(&self, buffer_type: BufferType) -> bool {
            self.reads.contains(&buffer_type.name().as_str())
        }
        fn reads_host_pointers(&self) -> bool {
            self.host_pointers
        }
        fn supports_op(&self, node: &TensorRef<'_>) -> bool {
            !self.rejects.contains(&node.op_name())
        }
    }

    const N: i64 = 8;

    fn ramp(n: i64) -> Vec<f32> {
        (0..n).map(|i| i as f32 * 0.25).collect()
    }

    /// A weight in a host context: data in the context's pool, `buffer == NULL`.
    fn host_weight(name: &str) -> Tensor {
        let ctx = Context::host(64 * 1024).unwrap();
        let t = ctx.new_tensor(DType::F32, &[N]).unwrap().named(name);
        ctx.write(&t, &ramp(N)).unwrap();
        t
    }

    /// A weight in a real CPU backend buffer.
    fn cpu_buffer_weight(name: &str) -> Tensor {
        let ctx = Context::metadata(4).unwrap();
        let t = ctx.new_tensor(DType::F32, &[N]).unwrap().named(name);
        ctx.allocate_on(&Backend::cpu(1).unwrap(), BufferUsage::Weights)
            .unwrap();
        ctx.write(&t, &ramp(N)).unwrap();
        t
    }

    /// The graph's own context (metadata only) with an input `x` of [N, 2] and no memory.
    fn graph_ctx_with_input() -> (Context, Tensor) {
        let ctx = Context::metadata(64).unwrap();
        let x = ctx.new_tensor(DType::F32, &[N, 2]).unwrap().named("x");
        x.mark_input();
        (ctx, x)
    }

    fn graph_of(ctx: &Context, out: &Tensor) -> Graph {
        let graph = ctx.new_graph(64).unwrap();
        graph.expand(out).unwrap();
        graph
    }

    /// The crash's shape: `y = add(mul(x, w), b)`, named `xw` and `y`.
    fn scale_shift(w: &Tensor, b: &Tensor) -> (Graph, Tensor) {
        let (ctx, x) = graph_ctx_with_input();
        let xw = ctx.mul(&x, w).unwrap().named("xw");
        let y = ctx.add(&xw, b).unwrap().named("y");
        (graph_of(&ctx, &y), y)
    }

    /// The node of `graph` named `name`, as the pass sees it.
    fn node<'g>(graph: &'g Graph, name: &str) -> TensorRef<'g> {
        graph
            .nodes()
            .find(|n| n.name() == name)
            .unwrap_or_else(|| panic!("no node `{name}`"))
    }

    fn finding(tensor: &str, consumer: &str, op: &str, issue: Issue) -> Finding {
        Finding {
            tensor: tensor.into(),
            consumer: consumer.into(),
            consumer_op: op.into(),
            issue,
            input: false,
        }
    }

    #[test]
    fn host_tensor_without_buffer_is_no_buffer() {
        let w = host_weight("w");
        assert!(w.buffer().is_none() && w.has_data());
        assert_eq!(
            classify(&w.as_ref(), &FakeTarget::separate_memory()),
            Residency::NoBuffer
        );
    }

    #[test]
    fn cpu_buffer_is_foreign_but_host_readable_for_a_device_that_does_not_read_cpu() {
        let w = cpu_buffer_weight("w");
        assert_eq!(
            classify(&w.as_ref(), &FakeTarget::separate_memory()),
            Residency::ForeignBuffer {
                buffer_type: "CPU".into(),
                host_readable: true
            }
        );
    }

    #[test]
    fn view_of_a_host_tensor_is_no_buffer_like_its_source() {
        let w = host_weight("w");
        // The view lives in another (metadata-only) context, as a model's graph views weights.
        let ctx = Context::metadata(4).unwrap();
        let half = ctx
            .view(&w, &[N / 2], &[], 4 * std::mem::size_of::<f32>())
            .unwrap()
            .named("w.half");
        assert!(half.view_source().is_some() && half.buffer().is_none());
        assert_eq!(
            classify(&half.as_ref(), &FakeTarget::separate_memory()),
            Residency::NoBuffer
        );
    }

    #[test]
    fn view_of_a_host_tensor_is_reported_under_the_owners_name() {
        let w = host_weight("w");
        let (ctx, x) = graph_ctx_with_input();
        let half = ctx.view(&w, &[N / 2], &[], 0).unwrap().named("w.half");
        let x_half = ctx
            .view(&x, &[N / 2, 2], &[N as usize * 4], 0)
            .unwrap()
            .named("x.half");
        let y = ctx.mul(&x_half, &half).unwrap().named("y");
        let pass = check(&graph_of(&ctx, &y), &FakeTarget::separate_memory());
        // Both the VIEW node and the MUL reading the view read `w`'s memory.
        assert_eq!(
            pass.findings,
            vec![
                finding("w", "w.half", "VIEW", Issue::NoBuffer),
                finding("w", "y", "MUL", Issue::NoBuffer)
            ]
        );
        let names: Vec<&str> = pass
            .non_resident()
            .iter()
            .map(|f| f.tensor.as_str())
            .collect();
        assert_eq!(names, ["w"]);
    }

    #[test]
    fn buffer_of_a_type_the_device_reads_is_resident() {
        let w = cpu_buffer_weight("w");
        assert_eq!(
            classify(&w.as_ref(), &FakeTarget::separate_memory().reading("CPU")),
            Residency::Resident
        );
    }

    #[test]
    fn intermediate_node_and_unallocated_input_are_to_be_allocated() {
        let (graph, _) = scale_shift(&cpu_buffer_weight("w"), &cpu_buffer_weight("b"));
        let target = FakeTarget::separate_memory().reading("CPU");
        let y = node(&graph, "y");
        let sources = y.sources();
        assert_eq!(sources[0].name(), "xw");
        assert_eq!(classify(&sources[0], &target), Residency::ToBeAllocated);
        let x = node(&graph, "xw").sources()[0];
        assert_eq!(x.name(), "x");
        assert_eq!(classify(&x, &target), Residency::ToBeAllocated);
        assert!(check(&graph, &target).is_clean());
    }

    #[test]
    fn unsupported_op_is_reported_against_the_node() {
        let (graph, _) = scale_shift(&cpu_buffer_weight("w"), &cpu_buffer_weight("b"));
        let pass = check(
            &graph,
            &FakeTarget::separate_memory()
                .reading("CPU")
                .rejecting("MUL"),
        );
        assert_eq!(
            pass.findings,
            vec![finding("xw", "xw", "MUL", Issue::UnsupportedOp)]
        );
        assert_eq!(pass.unsupported_ops().len(), 1);
        assert!(pass.non_resident().is_empty());
        assert!(!pass.is_clean());
    }

    #[test]
    fn findings_name_tensor_consumer_and_op() {
        let (graph, _) = scale_shift(&host_weight("w"), &cpu_buffer_weight("b"));
        let pass = check(&graph, &FakeTarget::separate_memory());
        assert_eq!(
            pass.findings,
            vec![
                finding("w", "xw", "MUL", Issue::NoBuffer),
                finding(
                    "b",
                    "y",
                    "ADD",
                    Issue::ForeignBuffer {
                        buffer_type: "CPU".into(),
                        host_readable: true
                    }
                ),
            ]
        );
        assert_eq!((pass.nodes, pass.sources_checked), (2, 4));
    }

    #[test]
    fn non_resident_lists_a_tensor_read_by_several_nodes_once() {
        let w = host_weight("w");
        let (ctx, x) = graph_ctx_with_input();
        let xw = ctx.mul(&x, &w).unwrap().named("xw");
        let y = ctx.add(&xw, &w).unwrap().named("y");
        let pass = check(&graph_of(&ctx, &y), &FakeTarget::separate_memory());
        assert_eq!(pass.findings.len(), 2);
        let names: Vec<&str> = pass
            .non_resident()
            .iter()
            .map(|f| f.tensor.as_str())
            .collect();
        assert_eq!(names, ["w"]);
    }

    #[test]
    fn no_buffer_is_a_hazard_only_for_devices_that_cannot_read_host_pointers() {
        let (graph, _) = scale_shift(&host_weight("w"), &host_weight("b"));
        assert_eq!(
            check(&graph, &FakeTarget::separate_memory())
                .non_resident()
                .len(),
            2
        );
        assert!(check(
            &graph,
            &FakeTarget::separate_memory().reading_host_pointers()
        )
        .is_clean());
        assert!(!Residency::NoBuffer.is_hazard(true) && Residency::NoBuffer.is_hazard(false));
        let foreign = Residency::ForeignBuffer {
            buffer_type: "CPU".into(),
            host_readable: true,
        };
        assert!(foreign.is_hazard(true) && foreign.is_hazard(false));
    }

    #[test]
    fn real_cpu_backend_reads_host_memory_so_no_buffer_is_not_a_hazard() {
        let cpu = Backend::cpu(1).unwrap();
        assert!(Target::reads_host_pointers(&cpu));
        let w = host_weight("w");
        assert_eq!(classify(&w.as_ref(), &cpu), Residency::NoBuffer);
        let (graph, _) = scale_shift(&w, &host_weight("b"));
        let pass = check(&graph, &cpu);
        assert!(pass.is_clean(), "{:?}", pass.findings);
    }
}
