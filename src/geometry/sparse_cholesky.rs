//! A sparse Cholesky solver for symmetric positive definite matrices made of 7×7 blocks, one
//! block row per pose-graph node: the normal equations of Levenberg–Marquardt on Sim(3).
//!
//! The elimination order is chosen by minimum degree on the block graph, which for a chain of
//! windows with loop closures eliminates the chain's interior first and keeps the factor close
//! to the graph's own size. The pattern (order and the factor's block structure) is computed
//! once per graph; each iteration only refactors the numbers. Storage is one block per
//! diagonal entry and per non-zero block of the factor: O(nodes + edges + fill).

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use nalgebra::{SMatrix, SVector};

/// One 7×7 block.
pub(crate) type Block = SMatrix<f64, 7, 7>;
/// One 7-vector (a node's share of a right-hand side or solution).
pub(crate) type BlockVector = SVector<f64, 7>;

/// The elimination order and the block pattern of the factor `L`.
pub(crate) struct BlockPattern {
    /// `position[variable]`: where the variable is eliminated.
    position: Vec<usize>,
    /// `below[p]`: the positions `q > p` of the non-zero blocks `L[q][p]`, ascending.
    below: Vec<Vec<usize>>,
}

impl BlockPattern {
    /// The pattern for `count` block variables coupled by `couplings` (pairs of distinct
    /// variables; repeats are fine).
    pub(crate) fn new(
        count: usize,
        couplings: impl IntoIterator<Item = (usize, usize)>,
    ) -> BlockPattern {
        let mut neighbours: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); count];
        for (a, b) in couplings {
            if a != b {
                neighbours[a].insert(b);
                neighbours[b].insert(a);
            }
        }
        // Minimum degree: repeatedly eliminate the variable with the fewest uneliminated
        // neighbours; its neighbours become a clique (the fill), which is exactly column
        // pattern of L. Stale heap entries (degree changed since pushed) are skipped.
        let mut heap: BinaryHeap<Reverse<(usize, usize)>> = (0..count)
            .map(|v| Reverse((neighbours[v].len(), v)))
            .collect();
        let mut eliminated = vec![false; count];
        let mut order = Vec::with_capacity(count);
        let mut column_variables: Vec<Vec<usize>> = vec![Vec::new(); count];
        while let Some(Reverse((degree, variable))) = heap.pop() {
            if eliminated[variable] || degree != neighbours[variable].len() {
                continue;
            }
            eliminated[variable] = true;
            order.push(variable);
            let clique: Vec<usize> = std::mem::take(&mut neighbours[variable])
                .into_iter()
                .collect();
            for &a in &clique {
                neighbours[a].remove(&variable);
                for &b in &clique {
                    if a != b {
                        neighbours[a].insert(b);
                    }
                }
            }
            for &a in &clique {
                heap.push(Reverse((neighbours[a].len(), a)));
            }
            column_variables[variable] = clique;
        }
        let mut position = vec![0; count];
        for (p, &variable) in order.iter().enumerate() {
            position[variable] = p;
        }
        let below = order
            .iter()
            .map(|&variable| {
                let mut rows: Vec<usize> = column_variables[variable]
                    .iter()
                    .map(|&v| position[v])
                    .collect();
                rows.sort_unstable();
                rows
            })
            .collect();
        BlockPattern { position, below }
    }

    /// Number of block variables.
    pub(crate) fn len(&self) -> usize {
        self.position.len()
    }

    /// Number of stored off-diagonal blocks of the factor.
    pub(crate) fn factor_blocks(&self) -> usize {
        self.below.iter().map(Vec::len).sum()
    }

    /// A zero matrix with this pattern, to be filled with [`BlockSystem::add_diagonal`] and
    /// [`BlockSystem::add_coupling`].
    pub(crate) fn zero_system(&self) -> BlockSystem<'_> {
        BlockSystem {
            pattern: self,
            diagonal: vec![Block::zeros(); self.len()],
            below: self
                .below
                .iter()
                .map(|rows| vec![Block::zeros(); rows.len()])
                .collect(),
        }
    }

    /// Index of `row` in column `column`'s list, if the block `L[row][column]` is stored.
    fn slot(&self, row: usize, column: usize) -> Option<usize> {
        self.below[column].binary_search(&row).ok()
    }
}

/// A symmetric block matrix with a [`BlockPattern`]'s structure (its lower triangle, in
/// elimination positions), factored in place.
pub(crate) struct BlockSystem<'a> {
    pattern: &'a BlockPattern,
    diagonal: Vec<Block>,
    below: Vec<Vec<Block>>,
}

/// The factorisation met a pivot block that is not positive definite.
#[derive(Debug)]
pub(crate) struct NotPositiveDefinite;

impl<'a> BlockSystem<'a> {
    /// Adds `block` to the diagonal block of `variable`.
    pub(crate) fn add_diagonal(&mut self, variable: usize, block: &Block) {
        self.diagonal[self.pattern.position[variable]] += block;
    }

    /// Adds `block` to `A[a][b]` (rows of `a`, columns of `b`) and its transpose to `A[b][a]`.
    /// The pair must have been among the pattern's couplings.
    pub(crate) fn add_coupling(&mut self, a: usize, b: usize, block: &Block) {
        let (pa, pb) = (self.pattern.position[a], self.pattern.position[b]);
        let (row, column, lower) = if pa > pb {
            (pa, pb, *block)
        } else {
            (pb, pa, block.transpose())
        };
        let slot = self
            .pattern
            .slot(row, column)
            .expect("a coupling outside the pattern it was built with");
        self.below[column][slot] += lower;
    }

    /// Factors the matrix in place into `L Lᵀ` (right-looking: each pivot's column is scaled,
    /// then its outer product is subtracted from the blocks it touches, all of which the
    /// pattern holds because eliminating a variable joins its neighbours).
    pub(crate) fn factor(mut self) -> Result<BlockFactor<'a>, NotPositiveDefinite> {
        let pattern = self.pattern;
        for p in 0..pattern.len() {
            let pivot = self.diagonal[p].cholesky().ok_or(NotPositiveDefinite)?.l();
            let (done, later) = self.below.split_at_mut(p + 1);
            let column = &mut done[p];
            for block in column.iter_mut() {
                // L[q][p] = A[q][p] L[p][p]⁻ᵀ, i.e. L[p][p] L[q][p]ᵀ = A[q][p]ᵀ.
                let transposed = pivot
                    .solve_lower_triangular(&block.transpose())
                    .ok_or(NotPositiveDefinite)?;
                *block = transposed.transpose();
            }
            let rows = &pattern.below[p];
            for (a, &row) in rows.iter().enumerate() {
                let l_row = column[a];
                self.diagonal[row] -= l_row * l_row.transpose();
                for (b, &other) in rows.iter().enumerate().take(a) {
                    // other < row: the block L[row][other] lives in column `other`.
                    let slot = pattern
                        .slot(row, other)
                        .expect("the fill of a clique is in the pattern");
                    later[other - p - 1][slot] -= l_row * column[b].transpose();
                }
            }
            self.diagonal[p] = pivot;
        }
        Ok(BlockFactor {
            pattern,
            diagonal: self.diagonal,
            below: self.below,
        })
    }
}

/// The factor `L` of a [`BlockSystem`].
pub(crate) struct BlockFactor<'a> {
    pattern: &'a BlockPattern,
    diagonal: Vec<Block>,
    below: Vec<Vec<Block>>,
}

impl BlockFactor<'_> {
    /// Solves `A x = rhs`, one 7-vector per variable.
    pub(crate) fn solve(&self, rhs: &[BlockVector]) -> Vec<BlockVector> {
        let pattern = self.pattern;
        let mut work = vec![BlockVector::zeros(); pattern.len()];
        for (variable, value) in rhs.iter().enumerate() {
            work[pattern.position[variable]] = *value;
        }
        // L y = rhs
        for p in 0..pattern.len() {
            let y = self.diagonal[p]
                .solve_lower_triangular(&work[p])
                .unwrap_or_else(BlockVector::zeros);
            work[p] = y;
            for (block, &row) in self.below[p].iter().zip(&pattern.below[p]) {
                work[row] -= block * y;
            }
        }
        // Lᵀ x = y
        for p in (0..pattern.len()).rev() {
            let mut value = work[p];
            for (block, &row) in self.below[p].iter().zip(&pattern.below[p]) {
                value -= block.transpose() * work[row];
            }
            work[p] = self.diagonal[p]
                .transpose()
                .solve_upper_triangular(&value)
                .unwrap_or_else(BlockVector::zeros);
        }
        (0..pattern.len())
            .map(|variable| work[pattern.position[variable]])
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nalgebra::DMatrix;

    fn pseudo_random_block(seed: &mut u64) -> Block {
        Block::from_fn(|_, _| {
            *seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((*seed >> 11) as f64 / (1u64 << 53) as f64) - 0.5
        })
    }

    /// Builds a random SPD block matrix on the given couplings, solves it sparsely and densely.
    fn check(count: usize, couplings: &[(usize, usize)]) -> usize {
        let mut seed = 99;
        let pattern = BlockPattern::new(count, couplings.iter().copied());
        let mut system = pattern.zero_system();
        let mut dense = DMatrix::<f64>::zeros(7 * count, 7 * count);
        for &(a, b) in couplings {
            let block = pseudo_random_block(&mut seed);
            system.add_coupling(a, b, &block);
            let mut view = dense.view_mut((7 * a, 7 * b), (7, 7));
            view += block;
            let mut view = dense.view_mut((7 * b, 7 * a), (7, 7));
            view += block.transpose();
        }
        // Diagonal dominance makes it positive definite.
        for v in 0..count {
            let random = pseudo_random_block(&mut seed);
            let block = random * random.transpose()
                + Block::identity() * 8.0 * (1 + couplings.len()) as f64;
            system.add_diagonal(v, &block);
            let mut view = dense.view_mut((7 * v, 7 * v), (7, 7));
            view += block;
        }
        let rhs: Vec<BlockVector> = (0..count)
            .map(|v| BlockVector::from_fn(|k, _| (v * 7 + k) as f64 * 0.1 - 1.0))
            .collect();
        let factor = system.factor().unwrap();
        let solution = factor.solve(&rhs);
        let dense_rhs =
            nalgebra::DVector::from_iterator(7 * count, rhs.iter().flat_map(|v| v.iter().copied()));
        let expected = dense.cholesky().unwrap().solve(&dense_rhs);
        for v in 0..count {
            for k in 0..7 {
                assert!(
                    (solution[v][k] - expected[7 * v + k]).abs() < 1e-12,
                    "variable {v} entry {k}"
                );
            }
        }
        pattern.factor_blocks()
    }

    #[test]
    fn solves_like_a_dense_cholesky() {
        // A chain with two loop closures.
        let mut couplings: Vec<(usize, usize)> = (0..29).map(|i| (i, i + 1)).collect();
        couplings.push((0, 29));
        couplings.push((5, 20));
        couplings.push((20, 5));
        let fill = check(30, &couplings);
        // A ring eliminated by minimum degree has one fill block per pivot at most.
        assert!(fill <= 2 * 31 + 10, "{fill} factor blocks");
        // A star: every leaf coupled to the hub; minimum degree eliminates leaves first.
        let star: Vec<(usize, usize)> = (1..40).map(|i| (0, i)).collect();
        assert_eq!(check(40, &star), 39);
        // No couplings at all, and a single variable.
        check(5, &[]);
        check(1, &[]);
        // A dense little clique.
        let clique: Vec<(usize, usize)> =
            (0..6).flat_map(|a| (0..a).map(move |b| (a, b))).collect();
        check(6, &clique);
    }

    #[test]
    fn indefinite_matrices_are_reported() {
        let pattern = BlockPattern::new(2, [(0, 1)]);
        let mut system = pattern.zero_system();
        system.add_diagonal(0, &Block::identity());
        system.add_diagonal(1, &Block::identity());
        system.add_coupling(0, 1, &(Block::identity() * 2.0));
        assert!(system.factor().is_err());
    }
}
