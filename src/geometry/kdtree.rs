//! A static 3-D kd-tree for nearest-neighbour queries (ICP's correspondence search).
//!
//! Written here rather than taken from a crate: the query ICP needs (one nearest neighbour
//! within a radius, in `f64`) is a few dozen lines, while the maintained kd-tree crates bring
//! a thread pool, coroutines and fixed-point arithmetic along.

/// A balanced kd-tree stored implicitly: the points of a subtree occupy a contiguous range of
/// `points`, the median of that range is the subtree's root, and `axes` holds the axis that
/// root splits on.
pub(crate) struct KdTree {
    /// The points, permuted into tree order, each with its index in the caller's slice.
    points: Vec<([f64; 3], usize)>,
    /// The split axis of the node at the same position.
    axes: Vec<u8>,
}

impl KdTree {
    /// Builds the tree in O(n log n) by recursive median selection. The points must be finite.
    pub(crate) fn new(points: &[[f64; 3]]) -> KdTree {
        let mut tree = KdTree {
            points: points.iter().copied().zip(0..).collect(),
            axes: vec![0; points.len()],
        };
        tree.build(0, points.len());
        tree
    }

    fn build(&mut self, start: usize, end: usize) {
        if end - start <= 1 {
            return;
        }
        // Split on the axis of largest extent, which keeps cells close to cubes.
        let mut low = [f64::INFINITY; 3];
        let mut high = [f64::NEG_INFINITY; 3];
        for (point, _) in &self.points[start..end] {
            for axis in 0..3 {
                low[axis] = low[axis].min(point[axis]);
                high[axis] = high[axis].max(point[axis]);
            }
        }
        let axis = (0..3)
            .max_by(|&a, &b| (high[a] - low[a]).total_cmp(&(high[b] - low[b])))
            .unwrap_or(0);
        let middle = start + (end - start) / 2;
        self.points[start..end]
            .select_nth_unstable_by(middle - start, |a, b| a.0[axis].total_cmp(&b.0[axis]));
        self.axes[middle] = axis as u8;
        self.build(start, middle);
        self.build(middle + 1, end);
    }

    /// The index (in the slice the tree was built from) and squared distance of the point
    /// nearest to `query`, if one lies within `max_distance`.
    pub(crate) fn nearest_within(
        &self,
        query: [f64; 3],
        max_distance: f64,
    ) -> Option<(usize, f64)> {
        let mut best = (usize::MAX, max_distance * max_distance);
        self.search(0, self.points.len(), &query, &mut best);
        (best.0 != usize::MAX).then_some(best)
    }

    fn search(&self, start: usize, end: usize, query: &[f64; 3], best: &mut (usize, f64)) {
        if start >= end {
            return;
        }
        let middle = start + (end - start) / 2;
        let (point, index) = &self.points[middle];
        let squared: f64 = (0..3).map(|k| (point[k] - query[k]).powi(2)).sum();
        if squared <= best.1 {
            *best = (*index, squared);
        }
        let axis = usize::from(self.axes[middle]);
        let offset = query[axis] - point[axis];
        let (near, far) = if offset < 0.0 {
            ((start, middle), (middle + 1, end))
        } else {
            ((middle + 1, end), (start, middle))
        };
        self.search(near.0, near.1, query, best);
        // The far side can only hold a closer point if the splitting plane is closer.
        if offset * offset <= best.1 {
            self.search(far.0, far.1, query, best);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_matches_brute_force() {
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let points: Vec<[f64; 3]> = (0..500)
            .map(|_| [next() * 4.0, next(), next() * 2.0])
            .collect();
        let tree = KdTree::new(&points);
        for _ in 0..200 {
            let query = [next() * 4.4 - 0.2, next() * 1.2 - 0.1, next() * 2.2 - 0.1];
            for radius in [0.05, 0.2, 10.0] {
                let brute = points
                    .iter()
                    .enumerate()
                    .map(|(i, p)| (i, (0..3).map(|k| (p[k] - query[k]).powi(2)).sum::<f64>()))
                    .filter(|(_, d)| *d <= radius * radius)
                    .min_by(|a, b| a.1.total_cmp(&b.1));
                let found = tree.nearest_within(query, radius);
                assert_eq!(found.map(|f| f.1), brute.map(|b| b.1));
            }
        }
    }

    #[test]
    fn empty_and_duplicate_points() {
        assert!(KdTree::new(&[]).nearest_within([0.0; 3], 1.0).is_none());
        let tree = KdTree::new(&[[1.0, 1.0, 1.0]; 5]);
        assert_eq!(
            tree.nearest_within([1.0, 1.0, 1.5], 1.0).map(|f| f.1),
            Some(0.25)
        );
    }
}
