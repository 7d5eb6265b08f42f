//! The one compute entry point: pass, decision, allocation, compute.

use super::pass::{self, Issue, PassResult};
use super::report::{Decision, Report};
use super::{Error, Policy, Strategy};
use crate::ggml::{
    Allocation, Backend, BufferUsage, Context, Element, Gallocr, Graph, NodeKernel, Sched,
    SchedAllocation, Tensor, TensorRef, TensorView,
};
use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

/// Computes graphs on one device, deciding per graph (and caching the decision) whether the
/// gallocr fast path is safe.
pub struct Executor {
    device: Backend,
    cpu: Backend,
    policy: Policy,
    gallocr: Gallocr,
    sched: Option<Sched>,
    sched_size: usize,
    /// Decisions by graph fingerprint (topology and where each operand lives).
    plans: HashMap<u64, Report>,
    /// Graphs whose decision was logged.
    logged: HashSet<u64>,
    /// Device copies of non-resident operands, by (tensor, data pointer), reused across graphs.
    mirrors: HashMap<(usize, usize), Tensor>,
    /// Kernels of our own for some nodes (the execution plan's choice), used where the
    /// graph runs on the device alone (the allocator's paths, not the scheduler's).
    node_kernel: Option<Box<dyn NodeKernel>>,
    log: bool,
}

impl Executor {
    /// An executor for `device`; `cpu` is the fallback backend the scheduler needs (the same
    /// backend when the device is the CPU).
    pub fn new(device: Backend, cpu: Backend, policy: Policy) -> Result<Executor, Error> {
        let gallocr = Gallocr::for_backend(&device)?;
        Ok(Executor {
            device,
            cpu,
            policy,
            gallocr,
            sched: None,
            sched_size: 0,
            plans: HashMap::new(),
            logged: HashSet::new(),
            mirrors: HashMap::new(),
            node_kernel: None,
            log: true,
        })
    }
    /// Computes the nodes `kernel` takes with it instead of the device's backend (each run
    /// checks first that every operand of those nodes is in the device's memory).
    pub fn with_node_kernel(mut self, kernel: Box<dyn NodeKernel>) -> Self {
        self.node_kernel = Some(kernel);
        self
    }
    /// The kernels of our own this executor computes some nodes with.
    pub fn node_kernel(&self) -> Option<&dyn NodeKernel> {
        self.node_kernel.as_deref()
    }
    /// Frees the compute buffers (the graph allocator's and the scheduler's); the next run
    /// allocates them again. Decisions and device copies of operands are kept.
    ///
    /// # Errors
    /// When a new allocator cannot be made for the device.
    pub fn release_buffers(&mut self) -> Result<(), Error> {
        self.gallocr = Gallocr::for_backend(&self.device)?;
        self.sched = None;
        self.sched_size = 0;
        Ok(())
    }
    /// Stops logging the one-line decision (`log::debug!`, once per graph).
    pub fn quiet(mut self) -> Self {
        self.log = false;
        self
    }
    /// The backend graphs compute on.
    pub fn device(&self) -> &Backend {
        &self.device
    }
    /// The policy for non-resident operands.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The decision for `graph` (running the pass and preparing the graph the first time).
    pub fn plan(&mut self, graph: &Graph) -> Result<Report, Error> {
        let key = fingerprint(graph, &self.device);
        if let Some(report) = self.plans.get(&key) {
            return Ok(report.clone());
        }
        let pass = pass::check(graph, &self.device);
        let decision = self.decide(graph, &pass)?;
        let report = Report {
            device: self.device.name(),
            policy: self.policy,
            pass,
            decision,
        };
        if report.decision == Decision::Refused {
            return Err(Error::Refused(Box::new(report)));
        }
        // Cache under the fingerprint of the graph as prepared (preparing changes where
        // operands live), never under the unprepared one: a graph rebuilt at the same
        // addresses hashes like the unprepared original and must be prepared again (the
        // mirror cache makes that cheap). `key` would hand it the plan without the preparation.
        self.plans
            .insert(fingerprint(graph, &self.device), report.clone());
        Ok(report)
    }

    fn decide(&mut self, graph: &Graph, pass: &PassResult) -> Result<Decision, Error> {
        Ok(match super::choose(self.policy, pass) {
            Strategy::FastPath => Decision::Gallocr,
            Strategy::Unchecked => Decision::Unchecked,
            Strategy::Refuse => Decision::Refused,
            Strategy::MirrorAll { then_sched } => {
                let uploaded = self.mirror(graph, |_| true)?;
                if then_sched {
                    Decision::Sched {
                        wrapped: 0,
                        mirrored: uploaded,
                        splits: None,
                    }
                } else {
                    Decision::Mirror { uploaded }
                }
            }
            Strategy::Route => {
                // Memory that neither the device nor the CPU can read cannot be scheduled:
                // copy it once. Host memory is wrapped and left to the scheduler.
                let mirrored = self.mirror(graph, |issue| {
                    matches!(
                        issue,
                        Issue::ForeignBuffer {
                            host_readable: false,
                            ..
                        }
                    )
                })?;
                let wrapped = graph.wrap_host_memory(BufferUsage::Any)?;
                Decision::Sched {
                    wrapped,
                    mirrored,
                    splits: None,
                }
            }
        })
    }

    /// Uploads every non-resident leaf operand whose issue `select` picks, and points its
    /// consumers at the copy. Returns how many distinct tensors were uploaded.
    fn mirror(&mut self, graph: &Graph, select: impl Fn(&Issue) -> bool) -> Result<usize, Error> {
        let mut targets: Vec<(TensorRef<'_>, usize, TensorRef<'_>)> = Vec::new();
        for node in graph.nodes() {
            for (slot, src) in node.sources_with_slots() {
                let residency = pass::classify(&src, &self.device);
                let issue = match residency {
                    pass::Residency::NoBuffer
                        if !pass::Target::reads_host_pointers(&self.device) =>
                    {
                        Issue::NoBuffer
                    }
                    pass::Residency::ForeignBuffer {
                        buffer_type,
                        host_readable,
                    } => Issue::ForeignBuffer {
                        buffer_type,
                        host_readable,
                    },
                    _ => continue,
                };
                if select(&issue) {
                    targets.push((node, slot, src));
                }
            }
        }
        let fresh: Vec<TensorRef<'_>> = {
            let mut seen = HashSet::new();
            targets
                .iter()
                .map(|(_, _, src)| *src)
                .filter(|s| !self.mirrors.contains_key(&mirror_key(s)) && seen.insert(s.id()))
                .collect()
        };
        if !fresh.is_empty() {
            let ctx = Context::metadata_with_graph(fresh.len(), 1)?;
            let copies = ctx.upload_copies(
                &fresh,
                self.device.default_buffer_type(),
                BufferUsage::Weights,
            )?;
            for (src, copy) in fresh.iter().zip(copies) {
                self.mirrors.insert(mirror_key(src), copy);
            }
        }
        let mut uploaded = HashSet::new();
        for (node, slot, src) in &targets {
            let copy = &self.mirrors[&mirror_key(src)];
            graph.replace_source(node, *slot, copy)?;
            // Count tensors, not the views of them that were copied alongside.
            uploaded.insert(src.view_source().unwrap_or(*src).id());
        }
        Ok(uploaded.len())
    }

    /// Plans (cached), allocates and returns the run through which inputs are written, the
    /// graph computed and outputs read.
    pub fn run<'a>(&'a mut self, graph: &'a Graph) -> Result<Run<'a>, Error> {
        let mut report = self.plan(graph)?;
        let inner = match report.decision {
            Decision::Gallocr | Decision::Mirror { .. } | Decision::Unchecked => {
                let allocation = self.gallocr.alloc(graph)?;
                RunInner::Gallocr {
                    allocation,
                    backend: &self.device,
                    kernel: self.node_kernel.as_deref(),
                }
            }
            Decision::Sched { .. } => {
                let needed = graph.n_nodes() + graph.n_leafs();
                let size_ok = self
                    .sched
                    .as_ref()
                    .is_some_and(|_| self.sched_size >= needed);
                if !size_ok {
                    let backends: Vec<Backend> = if self.device.is_cpu() {
                        vec![self.cpu.clone()]
                    } else {
                        vec![self.device.clone(), self.cpu.clone()]
                    };
                    self.sched_size = needed.max(crate::ggml::Context::GRAPH_SIZE);
                    self.sched = Some(Sched::new(&backends, self.sched_size, false)?);
                }
                let sched = self.sched.as_mut().expect("created above");
                let allocation = sched.alloc(graph, &[])?;
                if let Decision::Sched { splits, .. } = &mut report.decision {
                    *splits = Some(allocation.n_splits());
                }
                RunInner::Sched(allocation)
            }
            Decision::Refused => unreachable!("plan returns refusals as errors"),
        };
        // Once per graph and decision: a fingerprint of the graph would change after the
        // scheduler's first run (it places the intermediate results), logging every run.
        let summary = report.summary();
        let key = {
            let mut h = DefaultHasher::new();
            (graph.as_ptr() as usize).hash(&mut h);
            summary.hash(&mut h);
            h.finish()
        };
        if self.log && self.logged.insert(key) {
            log::debug!("{summary}");
        }
        Ok(Run { inner, report })
    }
}

fn mirror_key(src: &TensorRef<'_>) -> (usize, usize) {
    let owner = src.view_source().unwrap_or(*src);
    (owner.id(), src.id())
}

/// Hash of the graph's topology and of where each operand lives (buffer identity), so a
/// cached decision is reused only for the same situation.
fn fingerprint(graph: &Graph, device: &Backend) -> u64 {
    let mut h = DefaultHasher::new();
    device.name().hash(&mut h);
    graph.n_nodes().hash(&mut h);
    for node in graph.nodes() {
        node.id().hash(&mut h);
        for src in node.sources() {
            src.id().hash(&mut h);
            let owner = src.view_source().unwrap_or(src);
            // Memory an allocator placed (intermediate results, inputs) is the allocator's
            // doing, not a situation to plan for: hashing it would miss the cache on the run
            // after the first, and on every run of the scheduler, which places them anew.
            let placed = match owner.buffer() {
                Some(b) => b.usage() == BufferUsage::Compute,
                None => !owner.has_data(),
            };
            if !placed {
                owner.buffer().map(|b| b.id()).hash(&mut h);
                owner.has_data().hash(&mut h);
            }
        }
    }
    h.finish()
}

enum RunInner<'a> {
    Gallocr {
        allocation: Allocation<'a>,
        backend: &'a Backend,
        kernel: Option<&'a dyn NodeKernel>,
    },
    Sched(SchedAllocation<'a>),
}

/// One allocated graph, ready for inputs.
pub struct Run<'a> {
    inner: RunInner<'a>,
    report: Report,
}

impl Run<'_> {
    /// The decision this run follows.
    pub fn report(&self) -> &Report {
        &self.report
    }
    /// Writes an input of the graph (type, length and membership checked).
    pub fn write<T: Element>(&self, tensor: &Tensor, data: &[T]) -> Result<(), Error> {
        match &self.inner {
            RunInner::Gallocr { allocation, .. } => allocation.write(tensor, data)?,
            RunInner::Sched(allocation) => allocation.write(tensor, data)?,
        }
        Ok(())
    }
    /// Reads a tensor of the graph (mark outputs so that their memory is not reused).
    pub fn read<T: Element>(&self, tensor: &Tensor) -> Result<Vec<T>, Error> {
        Ok(match &self.inner {
            RunInner::Gallocr { allocation, .. } => allocation.read(tensor)?,
            RunInner::Sched(allocation) => allocation.read(tensor)?,
        })
    }
    /// Computes the graph one node at a time and times each ([`Allocation::profile`]),
    /// `repeats` times per node; on the allocator's paths only (a scheduled graph is an
    /// error). Nodes a kernel of our own takes are timed as ggml computes them.
    pub fn profile(&self, repeats: usize) -> Result<Vec<crate::ggml::NodeTime>, Error> {
        match &self.inner {
            RunInner::Gallocr {
                allocation,
                backend,
                ..
            } => Ok(allocation.profile(backend, repeats)?),
            RunInner::Sched(_) => Err(crate::ggml::Error::InvalidArgument {
                op: "profile",
                reason: "the graph is split by the scheduler (an operand is not on the device); \
                         profile a graph whose operands all are"
                    .into(),
            }
            .into()),
        }
    }
    /// Computes the graph as the decision says. Where kernels of our own take some nodes,
    /// every operand of those nodes is checked to be in the device's memory first (under
    /// every policy, `unchecked` included): they are never handed memory they cannot address.
    pub fn compute(&self) -> Result<(), Error> {
        match &self.inner {
            // Under `unchecked` this is where a non-resident operand faults on a GPU.
            RunInner::Gallocr {
                allocation,
                backend,
                kernel: None,
            } => allocation.compute(backend)?,
            RunInner::Gallocr {
                allocation,
                backend,
                kernel: Some(kernel),
            } => {
                let findings = pass::check_kernel_operands(allocation.graph(), *backend, *kernel);
                if !findings.is_empty() {
                    return Err(Error::KernelOperands {
                        kernel: kernel.name(),
                        findings,
                    });
                }
                allocation.compute_with(backend, *kernel)?
            }
            RunInner::Sched(allocation) => allocation.compute()?,
        }
        Ok(())
    }
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("device", &self.device)
            .field("cpu", &self.cpu)
            .field("policy", &self.policy)
            .field("plans", &self.plans.len())
            .field("mirrors", &self.mirrors.len())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Run<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Run")
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}
