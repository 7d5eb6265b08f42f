//! A pose graph over Sim(3): window-to-world transforms as nodes, measured relative transforms
//! as edges, optimised by Levenberg–Marquardt on the sim(3) tangent space with a sparse
//! solver, so that loop closures spread the drift of a long chain of alignments.

use nalgebra::{SMatrix, SVector};

use super::error::AlignError;
use super::sim3::Sim3;
use super::sparse_cholesky::{Block, BlockPattern, BlockVector};

/// A measured relative transform between two nodes: `W_from⁻¹ ∘ W_to ≈ measurement`, i.e. the
/// measurement maps window-`to` coordinates into window-`from` coordinates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Edge {
    /// The node whose coordinates the measurement maps into.
    pub from: usize,
    /// The node whose coordinates the measurement maps from.
    pub to: usize,
    /// The measured transform from window `to` to window `from`.
    pub measurement: Sim3,
    /// How much the edge counts: its squared residual is multiplied by this.
    pub weight: f64,
}

/// Window-to-world transforms `W_i` (nodes) and measurements of their relative transforms
/// (edges), with the cost `Σ weight · |r|²` over edges, where
/// `r = log(M⁻¹ ∘ W_from⁻¹ ∘ W_to) ∈ R⁷` ([`Sim3::log`] order).
///
/// The sequential alignment of window `k + 1` to window `k` is the edge `(k, k + 1, S_k)`;
/// [`chain`](super::sim3::chain) of those measurements gives the initial nodes. A loop
/// closure measured as the official code does (`compute_sim3_ab`, here
/// [`relative_through_common`](super::sim3::relative_through_common)), which maps window-A
/// coordinates into window-B coordinates, is the edge `(b, a, measurement)`.
#[derive(Debug, Clone, Default)]
pub struct PoseGraph {
    nodes: Vec<Sim3>,
    edges: Vec<Edge>,
}

/// Options of [`PoseGraph::optimize`].
#[derive(Debug, Clone)]
pub struct LmOptions {
    /// The most Levenberg–Marquardt iterations (each solves one damped system; rejected steps
    /// count).
    pub max_iterations: usize,
    /// The starting damping `λ`: the system solved is `(H + λ diag(H)) δ = −g`.
    pub initial_lambda: f64,
    /// Converged when an accepted step lowers the cost by less than this fraction, or when a
    /// rejected step was predicted to lower it by less than this fraction. (A step below
    /// 1e-12 in every tangent coordinate also ends the optimisation as converged.)
    pub tolerance: f64,
}

impl Default for LmOptions {
    /// The official DA3-Streaming loop optimiser's settings (`SIM3_Optimizer`): 30 iterations,
    /// `λ` starting at 1e-6; tolerance 1e-10.
    fn default() -> LmOptions {
        LmOptions {
            max_iterations: 30,
            initial_lambda: 1e-6,
            tolerance: 1e-10,
        }
    }
}

/// What [`PoseGraph::optimize`] did.
#[derive(Debug, Clone)]
pub struct OptimizeReport {
    /// The cost before optimising.
    pub initial_cost: f64,
    /// The cost of the nodes now in the graph.
    pub final_cost: f64,
    /// Iterations run (accepted and rejected steps).
    pub iterations: usize,
    /// Whether a convergence test was met (rather than the iteration limit).
    pub converged: bool,
}

/// A step whose every tangent coordinate is below this changes no node by more than rounding
/// would (1e-12 of a radian, of the log-scale, of a window unit): the optimum is reached.
const NEGLIGIBLE_STEP: f64 = 1e-12;

/// Central-difference step for the residual's derivatives; about the cube root of the machine
/// epsilon, which balances truncation (∝ h²) against rounding (∝ ε / h).
const DIFFERENCE_STEP: f64 = 1e-5;

type Jacobian = SMatrix<f64, 7, 7>;
type Tangent = SVector<f64, 7>;

impl PoseGraph {
    /// An empty graph.
    pub fn new() -> PoseGraph {
        PoseGraph::default()
    }

    /// Adds a node with its initial window-to-world transform; returns its index. A transform
    /// that is not valid ([`Sim3::is_valid`]) makes [`PoseGraph::optimize`] fail.
    pub fn add_node(&mut self, initial: Sim3) -> usize {
        self.nodes.push(initial);
        self.nodes.len() - 1
    }

    /// Adds the measurement `W_from⁻¹ ∘ W_to ≈ measurement` with `weight`. Errors on an unknown
    /// node, an edge from a node to itself, a measurement that is not a valid similarity, and
    /// a weight that is not positive and finite.
    pub fn add_edge(
        &mut self,
        from: usize,
        to: usize,
        measurement: Sim3,
        weight: f64,
    ) -> Result<(), AlignError> {
        for node in [from, to] {
            if node >= self.nodes.len() {
                return Err(AlignError::UnknownNode {
                    node,
                    nodes: self.nodes.len(),
                });
            }
        }
        if from == to {
            return Err(AlignError::Degenerate {
                reason: format!("an edge from node {from} to itself constrains nothing"),
            });
        }
        check_transform("measurement of edge", self.edges.len(), &measurement)?;
        if !(weight.is_finite() && weight > 0.0) {
            return Err(AlignError::InvalidWeight {
                what: "edge weight",
                index: self.edges.len(),
                value: weight,
            });
        }
        self.edges.push(Edge {
            from,
            to,
            measurement,
            weight,
        });
        Ok(())
    }

    /// The nodes' current transforms.
    pub fn nodes(&self) -> &[Sim3] {
        &self.nodes
    }

    /// The edges, in the order added.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// `Σ weight · |log(M⁻¹ ∘ W_from⁻¹ ∘ W_to)|²` over the edges.
    pub fn cost(&self) -> f64 {
        total_cost(&self.nodes, &self.edges)
    }

    /// Minimises [`PoseGraph::cost`] over the nodes by Levenberg–Marquardt, with updates
    /// `W_i ← W_i ∘ exp(δ_i)` in each node's own tangent space.
    ///
    /// Node 0 is held fixed (the gauge: the whole graph could otherwise move as one). Each
    /// group of nodes that no edge connects to node 0 has its own gauge: its lowest-numbered
    /// node is held fixed. Each iteration linearises the residuals (the Jacobian with respect
    /// to `W_to` by central differences of the logarithm, the one with respect to `W_from`
    /// from it through the adjoint), solves the damped normal equations with a sparse block
    /// Cholesky factorisation, and accepts the step if it lowers the cost (damping adapts as
    /// in Nielsen's rule). Errors on invalid options or nodes; the nodes are then unchanged.
    pub fn optimize(&mut self, options: &LmOptions) -> Result<OptimizeReport, AlignError> {
        check_options(options)?;
        for (index, node) in self.nodes.iter().enumerate() {
            check_transform("node", index, node)?;
        }
        let initial_cost = self.cost();
        let mut report = OptimizeReport {
            initial_cost,
            final_cost: initial_cost,
            iterations: 0,
            converged: true,
        };
        let variables = free_variables(self.nodes.len(), &self.edges);
        let free_count = variables.iter().flatten().count();
        if free_count == 0 || initial_cost == 0.0 {
            return Ok(report);
        }
        let pattern = BlockPattern::new(
            free_count,
            self.edges
                .iter()
                .filter_map(|edge| Some((variables[edge.from]?, variables[edge.to]?))),
        );
        log::debug!(
            "pose graph: {} nodes ({free_count} free), {} edges, {} factor blocks",
            self.nodes.len(),
            self.edges.len(),
            pattern.factor_blocks()
        );

        let mut cost = initial_cost;
        let mut lambda = options.initial_lambda;
        let mut growth = 2.0;
        let mut linear = Linearisation::new(&self.nodes, &self.edges, &variables, free_count);
        report.converged = false;
        while report.iterations < options.max_iterations {
            report.iterations += 1;
            let damping = linear.damping(lambda);
            let Some(step) = linear.solve(&pattern, &damping) else {
                // Not positive definite at this damping: damp more.
                lambda *= growth;
                growth *= 2.0;
                continue;
            };
            if step.iter().all(|delta| delta.amax() <= NEGLIGIBLE_STEP) {
                report.converged = true;
                break;
            }
            // The decrease the linear model predicts: −gᵀδ + λ δᵀDδ (both terms ≥ 0).
            let predicted: f64 = step
                .iter()
                .zip(&linear.gradient)
                .zip(&damping)
                .map(|((delta, gradient), scale)| {
                    -gradient.dot(delta) + delta.component_mul(scale).dot(delta)
                })
                .sum();
            let candidate: Vec<Sim3> = self
                .nodes
                .iter()
                .zip(&variables)
                .map(|(node, variable)| match variable {
                    Some(v) => node.compose(&Sim3::exp(&step[*v].into())),
                    None => *node,
                })
                .collect();
            let candidate_cost = total_cost(&candidate, &self.edges);
            if candidate_cost < cost {
                let decrease = cost - candidate_cost;
                let gain_ratio = decrease / predicted;
                lambda *= (1.0f64 / 3.0).max(1.0 - (2.0 * gain_ratio - 1.0).powi(3));
                growth = 2.0;
                self.nodes = candidate;
                cost = candidate_cost;
                if decrease <= options.tolerance * (cost + decrease) || cost == 0.0 {
                    report.converged = true;
                    break;
                }
                linear = Linearisation::new(&self.nodes, &self.edges, &variables, free_count);
            } else {
                if predicted <= options.tolerance * cost {
                    // Even the model sees nothing left to gain: the rejection is rounding.
                    report.converged = true;
                    break;
                }
                lambda *= growth;
                growth *= 2.0;
            }
        }
        report.final_cost = cost;
        Ok(report)
    }
}

fn check_transform(what: &'static str, index: usize, transform: &Sim3) -> Result<(), AlignError> {
    let finite = transform.scale.is_finite()
        && transform.translation.iter().all(|x| x.is_finite())
        && transform.rotation.iter().flatten().all(|x| x.is_finite());
    if !finite {
        return Err(AlignError::NonFinite { what, index });
    }
    if !transform.is_valid() {
        return Err(AlignError::InvalidOption {
            reason: format!(
                "{what} {index} is not a similarity (scale must be positive, rotation orthonormal with determinant +1): {transform:?}"
            ),
        });
    }
    Ok(())
}

fn check_options(options: &LmOptions) -> Result<(), AlignError> {
    super::error::check_positive("initial_lambda", options.initial_lambda)?;
    super::error::check_non_negative("tolerance", options.tolerance)
}

fn edge_residual(nodes: &[Sim3], edge: &Edge) -> Sim3 {
    edge.measurement
        .inverse()
        .compose(&nodes[edge.from].inverse())
        .compose(&nodes[edge.to])
}

fn total_cost(nodes: &[Sim3], edges: &[Edge]) -> f64 {
    edges
        .iter()
        .map(|edge| {
            let r = edge_residual(nodes, edge).log();
            edge.weight * r.iter().map(|x| x * x).sum::<f64>()
        })
        .sum()
}

/// For each node, its variable index, or `None` when it is held fixed: the lowest-numbered
/// node of every connected component (so node 0 in its own).
fn free_variables(node_count: usize, edges: &[Edge]) -> Vec<Option<usize>> {
    // Union–find with the smallest index as each set's representative.
    let mut parent: Vec<usize> = (0..node_count).collect();
    fn root(parent: &mut [usize], mut node: usize) -> usize {
        while parent[node] != node {
            parent[node] = parent[parent[node]];
            node = parent[node];
        }
        node
    }
    for edge in edges {
        let (a, b) = (root(&mut parent, edge.from), root(&mut parent, edge.to));
        let (low, high) = (a.min(b), a.max(b));
        parent[high] = low;
    }
    let mut next = 0;
    (0..node_count)
        .map(|node| {
            if root(&mut parent, node) == node {
                None
            } else {
                next += 1;
                Some(next - 1)
            }
        })
        .collect()
}

/// The normal equations `H = Σ w Jᵀ J`, `g = Σ w Jᵀ r` at the current nodes, kept per block.
struct Linearisation {
    diagonal: Vec<Block>,
    couplings: Vec<(usize, usize, Block)>,
    gradient: Vec<BlockVector>,
}

impl Linearisation {
    fn new(
        nodes: &[Sim3],
        edges: &[Edge],
        variables: &[Option<usize>],
        free_count: usize,
    ) -> Linearisation {
        let mut linear = Linearisation {
            diagonal: vec![Block::zeros(); free_count],
            couplings: Vec::new(),
            gradient: vec![BlockVector::zeros(); free_count],
        };
        let probes = tangent_probes();
        for edge in edges {
            let (from, to) = (variables[edge.from], variables[edge.to]);
            if from.is_none() && to.is_none() {
                continue;
            }
            let error = edge_residual(nodes, edge);
            let residual = Tangent::from(error.log());
            // r(δ_to) = log(E ∘ exp(δ_to)): J_to = ∂ log(E ∘ exp(δ)) / ∂δ at 0.
            let mut jacobian_to = Jacobian::zeros();
            for (k, (plus, minus)) in probes.iter().enumerate() {
                let forward = Tangent::from(error.compose(plus).log());
                let backward = Tangent::from(error.compose(minus).log());
                jacobian_to.set_column(k, &((forward - backward) / (2.0 * DIFFERENCE_STEP)));
            }
            // r(δ_from) = log(M⁻¹ exp(−δ) W_from⁻¹ W_to) = log(E ∘ exp(−Ad(W_to⁻¹ W_from) δ)).
            let jacobian_from = -jacobian_to
                * nodes[edge.to]
                    .inverse()
                    .compose(&nodes[edge.from])
                    .adjoint();
            let w = edge.weight;
            if let Some(v) = from {
                linear.diagonal[v] += w * jacobian_from.transpose() * jacobian_from;
                linear.gradient[v] += w * jacobian_from.transpose() * residual;
            }
            if let Some(v) = to {
                linear.diagonal[v] += w * jacobian_to.transpose() * jacobian_to;
                linear.gradient[v] += w * jacobian_to.transpose() * residual;
            }
            if let (Some(a), Some(b)) = (from, to) {
                linear
                    .couplings
                    .push((a, b, w * jacobian_from.transpose() * jacobian_to));
            }
        }
        linear
    }

    /// Marquardt's damping `λ diag(H)`, with a floor so that a direction with no curvature is
    /// still damped.
    fn damping(&self, lambda: f64) -> Vec<BlockVector> {
        let largest = self
            .diagonal
            .iter()
            .map(|block| block.diagonal().amax())
            .fold(0.0, f64::max);
        let floor = 1e-9 * largest.max(f64::MIN_POSITIVE);
        self.diagonal
            .iter()
            .map(|block| block.diagonal().map(|d| lambda * d.max(floor)))
            .collect()
    }

    /// Solves `(H + damping) δ = −g`; `None` when the damped system is not positive definite.
    fn solve(&self, pattern: &BlockPattern, damping: &[BlockVector]) -> Option<Vec<BlockVector>> {
        let mut system = pattern.zero_system();
        for (variable, (block, extra)) in self.diagonal.iter().zip(damping).enumerate() {
            system.add_diagonal(variable, &(block + Block::from_diagonal(extra)));
        }
        for (a, b, block) in &self.couplings {
            system.add_coupling(*a, *b, block);
        }
        let factor = system.factor().ok()?;
        let negative_gradient: Vec<BlockVector> = self.gradient.iter().map(|g| -g).collect();
        let step = factor.solve(&negative_gradient);
        step.iter()
            .all(|s| s.iter().all(|x| x.is_finite()))
            .then_some(step)
    }
}

/// `exp(±h e_k)` for the seven tangent directions, shared by every edge.
fn tangent_probes() -> [(Sim3, Sim3); 7] {
    std::array::from_fn(|k| {
        let mut v = [0.0; 7];
        v[k] = DIFFERENCE_STEP;
        let plus = Sim3::exp(&v);
        v[k] = -DIFFERENCE_STEP;
        (plus, Sim3::exp(&v))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::sim3::{chain, relative_through_common};

    fn rotation(v: [f64; 3]) -> [[f64; 3]; 3] {
        Sim3::exp(&[0.0, 0.0, 0.0, v[0], v[1], v[2], 0.0]).rotation
    }

    /// Ground-truth window-to-world transforms on a circle of radius 10, facing along it, with a
    /// slowly varying scale.
    fn circle(count: usize) -> Vec<Sim3> {
        (0..count)
            .map(|k| {
                let angle = std::f64::consts::TAU * k as f64 / count as f64;
                Sim3::new(
                    1.0 + 0.2 * (angle).sin(),
                    rotation([0.0, 0.0, angle]),
                    [
                        10.0 * angle.cos() - 10.0,
                        10.0 * angle.sin(),
                        0.5 * (2.0 * angle).sin(),
                    ],
                )
            })
            .collect()
    }

    fn mean_position_error(nodes: &[Sim3], truth: &[Sim3]) -> f64 {
        nodes
            .iter()
            .zip(truth)
            .map(|(a, b)| (a.translation_vector() - b.translation_vector()).norm())
            .sum::<f64>()
            / nodes.len() as f64
    }

    /// The chain of `truth` as dead reckoning measures it: every sequential measurement carries
    /// `drift`, and the nodes start where the drifting measurements put them.
    fn drifting_chain(truth: &[Sim3], drift: &Sim3) -> PoseGraph {
        let sequential: Vec<Sim3> = (0..truth.len() - 1)
            .map(|k| truth[k].inverse().compose(&truth[k + 1]).compose(drift))
            .collect();
        let mut graph = PoseGraph::new();
        for node in chain(&sequential) {
            graph.add_node(node);
        }
        for (k, measurement) in sequential.iter().enumerate() {
            graph.add_edge(k, k + 1, *measurement, 1.0).unwrap();
        }
        graph
    }

    #[test]
    fn closes_a_loop_with_drift() {
        let count = 24;
        let truth = circle(count);
        // Every sequential measurement carries the same small error (0.6° of yaw, 0.3° of
        // roll, 1% of scale, 5 cm): dead reckoning drifts far from the circle.
        let drift = Sim3::new(1.01, rotation([0.005, 0.0, 0.01]), [0.05, 0.0, 0.02]);
        let mut graph = drifting_chain(&truth, &drift);
        // One exact loop closure, measured as the official code does: a common prediction
        // aligned to both ends.
        let common = Sim3::new(0.7, rotation([0.1, 0.2, 0.3]), [1.0, 2.0, 3.0]);
        let common_to_first = truth[0].inverse().compose(&common);
        let common_to_last = truth[count - 1].inverse().compose(&common);
        let first_to_last = relative_through_common(&common_to_first, &common_to_last);
        graph.add_edge(count - 1, 0, first_to_last, 1.0).unwrap();

        let before = mean_position_error(graph.nodes(), &truth);
        let report = graph.optimize(&LmOptions::default()).unwrap();
        let after = mean_position_error(graph.nodes(), &truth);
        println!(
            "loop of {count}: mean position error {before:.4} -> {after:.4} ({:.1}%), cost {:.3e} -> {:.3e} in {} iterations, converged {}",
            100.0 * after / before,
            report.initial_cost,
            report.final_cost,
            report.iterations,
            report.converged
        );
        assert!(report.converged);
        assert!(report.final_cost < report.initial_cost);
        // The drift is the same on every edge, so spreading the loop's inconsistency cannot
        // undo all of it; a quarter of the dead-reckoning error is the bound (it reaches ~18%).
        assert!(after < 0.25 * before, "error {before} -> {after}");
        assert_eq!(graph.nodes()[0], truth[0], "node 0 is the gauge");
    }

    #[test]
    fn consistent_measurements_are_recovered_exactly() {
        // Exact relative measurements (a chain and three loop closures) from perturbed
        // initial nodes: the optimum is the truth, cost zero.
        let count = 30;
        let truth = circle(count);
        let mut graph = PoseGraph::new();
        for (k, node) in truth.iter().enumerate() {
            let nudge = if k == 0 {
                Sim3::IDENTITY
            } else {
                let s = 0.01 * k as f64;
                Sim3::exp(&[0.3 * s, -0.2 * s, 0.1, 0.02, -0.01 * s, 0.03, 0.02 * s])
            };
            graph.add_node(node.compose(&nudge));
        }
        let mut pairs: Vec<(usize, usize)> = (0..count - 1).map(|k| (k, k + 1)).collect();
        pairs.extend([(0, count - 1), (5, 20), (12, 27)]);
        for (a, b) in pairs {
            graph
                .add_edge(a, b, truth[a].inverse().compose(&truth[b]), 2.0)
                .unwrap();
        }
        let report = graph.optimize(&LmOptions::default()).unwrap();
        println!(
            "exact graph: cost {:.3e} -> {:.3e} in {} iterations",
            report.initial_cost, report.final_cost, report.iterations
        );
        assert!(report.final_cost < 1e-20, "{report:?}");
        for (node, expected) in graph.nodes().iter().zip(&truth) {
            assert!((node.translation_vector() - expected.translation_vector()).norm() < 1e-9);
            assert!((node.scale - expected.scale).abs() < 1e-10);
        }
    }

    #[test]
    fn cost_and_residual_follow_the_edge_convention() {
        let a = Sim3::new(1.5, rotation([0.1, 0.0, 0.2]), [1.0, 0.0, 0.0]);
        let b = Sim3::new(0.8, rotation([0.0, 0.3, 0.0]), [0.0, 2.0, 1.0]);
        let mut graph = PoseGraph::new();
        graph.add_node(a);
        graph.add_node(b);
        // W_0⁻¹ ∘ W_1 maps window-1 coordinates into window-0 coordinates.
        graph.add_edge(0, 1, a.inverse().compose(&b), 3.0).unwrap();
        assert!(graph.cost() < 1e-24);
        graph.add_edge(1, 0, b.inverse().compose(&a), 1.0).unwrap();
        assert!(graph.cost() < 1e-24);
        let report = graph.optimize(&LmOptions::default()).unwrap();
        assert!(report.converged && report.iterations <= 1, "{report:?}");
        assert_eq!(graph.nodes()[0], a);
        assert!((graph.nodes()[1].translation_vector() - b.translation_vector()).norm() < 1e-14);
    }

    #[test]
    fn separate_components_each_keep_a_gauge() {
        let truth = circle(6);
        let mut graph = PoseGraph::new();
        for node in &truth {
            graph.add_node(node.compose(&Sim3::exp(&[0.1, 0.0, 0.0, 0.0, 0.05, 0.0, 0.01])));
        }
        // Nodes 0–2 and 3–5 are connected within, not across.
        for (a, b) in [(0, 1), (1, 2), (3, 4), (4, 5), (5, 3)] {
            graph
                .add_edge(a, b, truth[a].inverse().compose(&truth[b]), 1.0)
                .unwrap();
        }
        let held: Vec<Sim3> = graph.nodes().to_vec();
        let report = graph.optimize(&LmOptions::default()).unwrap();
        assert!(report.final_cost < 1e-20, "{report:?}");
        assert_eq!(graph.nodes()[0], held[0]);
        assert_eq!(graph.nodes()[3], held[3]);
    }

    #[test]
    fn long_chain_with_loops_stays_sparse() {
        // 600 nodes: a dense system would be 4200², the sparse factor stays near the graph's
        // size.
        let count = 600;
        let truth = circle(count);
        let drift = Sim3::new(1.001, rotation([0.0005, 0.0, 0.001]), [0.005, 0.0, 0.0]);
        let mut graph = drifting_chain(&truth, &drift);
        let mut pairs = vec![(count - 1, 0)];
        pairs.extend((1..6).map(|j| (j * 100 + 50, j * 20)));
        for &(a, b) in &pairs {
            graph
                .add_edge(a, b, truth[a].inverse().compose(&truth[b]), 10.0)
                .unwrap();
        }
        let variables = free_variables(count, graph.edges());
        let pattern = BlockPattern::new(
            count - 1,
            graph
                .edges()
                .iter()
                .filter_map(|e| Some((variables[e.from]?, variables[e.to]?))),
        );
        assert!(
            pattern.factor_blocks() < 4 * count,
            "{} factor blocks",
            pattern.factor_blocks()
        );
        let before = mean_position_error(graph.nodes(), &truth);
        let report = graph.optimize(&LmOptions::default()).unwrap();
        let after = mean_position_error(graph.nodes(), &truth);
        println!("chain of {count} with {} loops: error {before:.3} -> {after:.3}, {} factor blocks, {report:?}", pairs.len(), pattern.factor_blocks());
        assert!(after < 0.2 * before);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let mut graph = PoseGraph::new();
        graph.add_node(Sim3::IDENTITY);
        graph.add_node(Sim3::IDENTITY);
        let cases = [
            ("unknown", graph.clone().add_edge(0, 2, Sim3::IDENTITY, 1.0)),
            ("self", graph.clone().add_edge(1, 1, Sim3::IDENTITY, 1.0)),
            (
                "zero weight",
                graph.clone().add_edge(0, 1, Sim3::IDENTITY, 0.0),
            ),
            (
                "negative weight",
                graph.clone().add_edge(0, 1, Sim3::IDENTITY, -1.0),
            ),
            (
                "nan weight",
                graph.clone().add_edge(0, 1, Sim3::IDENTITY, f64::NAN),
            ),
            (
                "nan measurement",
                graph.clone().add_edge(
                    0,
                    1,
                    Sim3::new(f64::NAN, Sim3::IDENTITY.rotation, [0.0; 3]),
                    1.0,
                ),
            ),
            (
                "zero scale",
                graph.clone().add_edge(
                    0,
                    1,
                    Sim3::new(0.0, Sim3::IDENTITY.rotation, [0.0; 3]),
                    1.0,
                ),
            ),
            (
                "optimize lambda",
                graph
                    .clone()
                    .optimize(&LmOptions {
                        initial_lambda: 0.0,
                        ..LmOptions::default()
                    })
                    .map(|_| ()),
            ),
            (
                "optimize tolerance",
                graph
                    .clone()
                    .optimize(&LmOptions {
                        tolerance: f64::INFINITY,
                        ..LmOptions::default()
                    })
                    .map(|_| ()),
            ),
        ];
        for (name, result) in cases {
            match result {
                Err(error) => println!("{name}: {error}"),
                Ok(()) => panic!("{name} was accepted"),
            }
        }
        assert!(graph.edges().is_empty());
        let mut invalid = graph.clone();
        invalid.add_node(Sim3::new(1.0, [[f64::NAN; 3]; 3], [0.0; 3]));
        invalid.add_edge(0, 2, Sim3::IDENTITY, 1.0).unwrap();
        let error = invalid.optimize(&LmOptions::default()).unwrap_err();
        println!("invalid node: {error}");
        // An empty graph and a graph without edges optimise to themselves.
        assert_eq!(
            PoseGraph::new()
                .optimize(&LmOptions::default())
                .unwrap()
                .iterations,
            0
        );
        assert_eq!(
            graph.optimize(&LmOptions::default()).unwrap().final_cost,
            0.0
        );
    }
}
