//! A coloured point cloud of bounded size, accumulated from any number of points.
//!
//! Points fall into the cells of a voxel grid anchored at the origin; each occupied cell keeps
//! one point, the weighted mean of the points that fell into it (position and colour). When a
//! new cell would take the cloud past its budget, the cell size doubles and the cells are
//! merged into the coarser grid (each new cell is exactly eight old ones, so a merged cell's
//! mean is still the mean of its points), as many times as it takes. Memory is thus bounded by
//! the budget whatever the number of points added, at the price of a coarser cloud.

use std::collections::HashMap;

/// Coordinates in cell units beyond this magnitude coarsen the grid first, so that cell keys
/// never saturate (a saturated key would put far points into a cell that does not hold them).
const MAX_KEY: f64 = (1u64 << 62) as f64;

/// The smallest budget that can always be met: cells `-1` and `0` of an axis never merge
/// (the grid is anchored at the origin), so the coarsest grid still has up to 8 cells.
const MIN_POINTS: usize = 8;

/// One occupied cell: sums of its points' weighted positions and colours.
#[derive(Debug, Clone)]
struct Cell {
    key: [i64; 3],
    position_sum: [f64; 3],
    color_sum: [f64; 3],
    weight: f64,
}

impl Cell {
    fn mean_position(&self) -> [f64; 3] {
        self.position_sum.map(|s| s / self.weight)
    }
}

/// A coloured point cloud with a point budget: voxel-grid downsampling (one weighted mean
/// point per occupied cell); when the budget is exceeded the cell size doubles and the cloud is
/// re-binned, so memory stays bounded by the budget.
///
/// Memory: at most `max_points + 1` cells of 80 bytes and an index of 33 bytes per slot (a
/// hash table holding up to `max_points + 1` keys has at most `2.3 (max_points + 1)` slots):
/// at most about 160 bytes a point, for instance 160 MB for a budget of a million points; see
/// [`PointAccumulator::memory_bytes`]. Re-binning merges cells in place and allocates nothing.
/// Each re-binning costs one pass over the cloud, and happens at most a few times per halving
/// of the number of cells.
#[derive(Debug, Clone)]
pub struct PointAccumulator {
    voxel_size: f64,
    max_points: usize,
    cells: Vec<Cell>,
    /// Cell key to index in `cells` (insertion order, so the output order is deterministic).
    index: HashMap<[i64; 3], usize>,
}

impl PointAccumulator {
    /// An empty cloud with cells of `voxel_size` (in world units) and at most `max_points`
    /// points.
    ///
    /// A budget below 8 is raised to 8 (the coarsest grid can keep up to 8 cells around the
    /// origin). A `voxel_size` that is not positive and finite is replaced by the smallest
    /// positive `f64`: points are then kept apart until the budget forces a grid.
    pub fn new(voxel_size: f64, max_points: usize) -> PointAccumulator {
        let voxel_size = if voxel_size.is_finite() && voxel_size > 0.0 {
            voxel_size
        } else {
            f64::MIN_POSITIVE
        };
        PointAccumulator {
            voxel_size,
            max_points: max_points.max(MIN_POINTS),
            cells: Vec::new(),
            index: HashMap::new(),
        }
    }

    /// Adds a point with its colour and weight (a confidence). A point with a non-finite
    /// coordinate, or a weight that is not positive and finite, is ignored.
    pub fn add(&mut self, point: [f64; 3], color: [u8; 3], weight: f32) {
        if !(point.iter().all(|v| v.is_finite()) && weight.is_finite() && weight > 0.0) {
            return;
        }
        while point
            .iter()
            .any(|&v| (v / self.voxel_size).abs() >= MAX_KEY)
        {
            self.coarsen_once();
        }
        let key = point.map(|v| (v / self.voxel_size).floor() as i64);
        let weight = weight as f64;
        let index = match self.index.get(&key) {
            Some(&index) => index,
            None => {
                self.reserve_one();
                self.cells.push(Cell {
                    key,
                    position_sum: [0.0; 3],
                    color_sum: [0.0; 3],
                    weight: 0.0,
                });
                self.index.insert(key, self.cells.len() - 1);
                self.cells.len() - 1
            }
        };
        let cell = &mut self.cells[index];
        for i in 0..3 {
            cell.position_sum[i] += point[i] * weight;
            cell.color_sum[i] += color[i] as f64 * weight;
        }
        cell.weight += weight;
        while self.cells.len() > self.max_points {
            self.coarsen_once();
        }
    }

    /// Room for one more cell, growing the storage by doubling but never past the budget
    /// (plus the one cell that triggers a re-binning).
    fn reserve_one(&mut self) {
        if self.cells.len() == self.cells.capacity() {
            let limit = self.max_points + 1;
            let wanted = (self.cells.capacity() * 2)
                .clamp(16, limit.max(16))
                .min(limit);
            self.cells
                .reserve_exact(wanted.saturating_sub(self.cells.len()).max(1));
        }
    }

    /// Doubles the cell size and merges the cells that now share one, in place.
    fn coarsen_once(&mut self) {
        self.voxel_size *= 2.0;
        self.index.clear();
        let mut kept = 0;
        for i in 0..self.cells.len() {
            // Cell k of the old grid lies in cell floor(k / 2) of the new one.
            let key = self.cells[i].key.map(|k| k.div_euclid(2));
            match self.index.get(&key) {
                Some(&into) => {
                    let merged = self.cells[i].clone();
                    let target = &mut self.cells[into];
                    for a in 0..3 {
                        target.position_sum[a] += merged.position_sum[a];
                        target.color_sum[a] += merged.color_sum[a];
                    }
                    target.weight += merged.weight;
                }
                None => {
                    self.cells.swap(kept, i);
                    self.cells[kept].key = key;
                    self.index.insert(key, kept);
                    kept += 1;
                }
            }
        }
        self.cells.truncate(kept);
    }

    /// The number of points (occupied cells).
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// Whether no point has been added (or every one was ignored).
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    /// The current cell size: the one given, doubled once per re-binning.
    pub fn voxel_size(&self) -> f64 {
        self.voxel_size
    }

    /// The budget (the `max_points` given, at least 8).
    pub fn max_points(&self) -> usize {
        self.max_points
    }

    /// The points (each cell's weighted mean position) and their colours (weighted means,
    /// rounded), in the order their cells were first occupied.
    pub fn points(&self) -> (Vec<[f32; 3]>, Vec<[u8; 3]>) {
        let positions = self
            .cells
            .iter()
            .map(|c| c.mean_position().map(|v| v as f32))
            .collect();
        let colors = self
            .cells
            .iter()
            .map(|c| {
                c.color_sum
                    .map(|s| (s / c.weight).round().clamp(0.0, 255.0) as u8)
            })
            .collect();
        (positions, colors)
    }

    /// The bytes the cloud holds: the cells' storage and the index's slots (estimated from
    /// its capacity as the standard hash table lays them out: a power of two of slots, 7/8
    /// of which are usable, each with a control byte).
    pub fn memory_bytes(&self) -> usize {
        let slots = if self.index.capacity() == 0 {
            0
        } else {
            (self.index.capacity() * 8 / 7).next_power_of_two()
        };
        let slot_bytes = std::mem::size_of::<([i64; 3], usize)>() + 1;
        std::mem::size_of::<Self>()
            + self.cells.capacity() * std::mem::size_of::<Cell>()
            + slots * slot_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic generator of uniform numbers in [0, 1).
    fn uniform(seed: u64) -> impl FnMut() -> f64 {
        let mut state = seed | 1;
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn nearby_points_average_into_one_cell() {
        let mut cloud = PointAccumulator::new(1.0, 100);
        cloud.add([0.2, 0.2, 0.2], [0, 0, 0], 1.0);
        cloud.add([0.8, 0.4, 0.6], [100, 200, 50], 3.0);
        cloud.add([1.5, 0.5, 0.5], [10, 10, 10], 1.0);
        assert_eq!(cloud.len(), 2);
        let (positions, colors) = cloud.points();
        let expected = [0.65, 0.35, 0.5];
        for a in 0..3 {
            assert!((positions[0][a] as f64 - expected[a]).abs() < 1e-6);
        }
        assert_eq!(colors[0], [75, 150, 38]);
        assert_eq!((positions[1], colors[1]), ([1.5, 0.5, 0.5], [10, 10, 10]));
    }

    #[test]
    fn ignored_points_change_nothing() {
        let mut cloud = PointAccumulator::new(0.1, 10);
        cloud.add([f64::NAN, 0.0, 0.0], [1, 2, 3], 1.0);
        cloud.add([0.0, f64::INFINITY, 0.0], [1, 2, 3], 1.0);
        cloud.add([0.0, 0.0, 0.0], [1, 2, 3], 0.0);
        cloud.add([0.0, 0.0, 0.0], [1, 2, 3], -1.0);
        cloud.add([0.0, 0.0, 0.0], [1, 2, 3], f32::NAN);
        assert!(cloud.is_empty());
        assert_eq!(cloud.points(), (vec![], vec![]));
    }

    /// A million points on a sphere shell of radius 3 with a budget of 20,000: the budget
    /// holds, every output point is exactly the weighted mean of the inputs of its final cell
    /// (so the mean position and colour are preserved within each voxel), and memory stays
    /// within the documented bound.
    #[test]
    fn a_million_points_stay_within_the_budget_and_keep_their_means() {
        let (n, budget) = (1_000_000, 20_000);
        let mut random = uniform(42);
        let mut inputs = Vec::with_capacity(n);
        for _ in 0..n {
            let (u, v) = (random() * 2.0 - 1.0, random() * std::f64::consts::TAU);
            let r = 3.0 + 0.01 * random();
            let s = (1.0 - u * u).sqrt();
            let p = [r * s * v.cos() + 0.5, r * s * v.sin() - 1.0, r * u + 2.0];
            let color = [(p[0] * 40.0 + 128.0) as u8, (random() * 255.0) as u8, 7];
            let weight = 0.5 + random() as f32;
            inputs.push((p, color, weight));
        }
        let mut cloud = PointAccumulator::new(0.001, budget);
        let mut peak_memory = 0;
        for (i, &(p, c, w)) in inputs.iter().enumerate() {
            cloud.add(p, c, w);
            assert!(cloud.len() <= budget);
            if i % 1000 == 0 {
                peak_memory = peak_memory.max(cloud.memory_bytes());
            }
        }
        peak_memory = peak_memory.max(cloud.memory_bytes());
        assert!(cloud.len() > budget / 8, "{} points left", cloud.len());
        assert!(peak_memory <= 160 * budget + 4096, "{peak_memory} bytes");

        // The exact weighted means of the final cells.
        let voxel = cloud.voxel_size();
        assert!(voxel > 0.001 && (voxel / 0.001).log2().fract() == 0.0);
        let mut sums: HashMap<[i64; 3], ([f64; 3], [f64; 3], f64)> = HashMap::new();
        for (p, c, w) in &inputs {
            let entry = sums
                .entry(p.map(|v| (v / voxel).floor() as i64))
                .or_insert(([0.0; 3], [0.0; 3], 0.0));
            for a in 0..3 {
                entry.0[a] += p[a] * *w as f64;
                entry.1[a] += c[a] as f64 * *w as f64;
            }
            entry.2 += *w as f64;
        }
        let (positions, colors) = cloud.points();
        assert_eq!(sums.len(), positions.len());
        let (mut total, mut total_weight) = ([0.0; 3], 0.0);
        for (p, c) in positions.iter().zip(&colors) {
            let key = p.map(|v| (v as f64 / voxel).floor() as i64);
            let (ps, cs, w) = sums[&key];
            for (a, sum) in total.iter_mut().enumerate() {
                assert!((p[a] as f64 - ps[a] / w).abs() < 1e-5, "{p:?}");
                assert!((c[a] as f64 - cs[a] / w).abs() <= 0.51, "{c:?}");
                *sum += p[a] as f64 * w;
            }
            total_weight += w;
        }
        // And the whole cloud's weighted mean is the inputs'.
        let input_weight: f64 = inputs.iter().map(|i| i.2 as f64).sum();
        for (a, sum) in total.iter().enumerate() {
            let input_mean: f64 =
                inputs.iter().map(|i| i.0[a] * i.2 as f64).sum::<f64>() / input_weight;
            assert!((sum / total_weight - input_mean).abs() < 1e-5);
        }
    }

    #[test]
    fn tiny_budgets_and_odd_voxel_sizes_terminate() {
        for voxel in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e-300, 1e300] {
            let mut cloud = PointAccumulator::new(voxel, 0);
            assert_eq!(cloud.max_points(), 8);
            let mut random = uniform(7);
            for _ in 0..1000 {
                let p = [0, 1, 2].map(|_| (random() - 0.5) * 1e6);
                cloud.add(p, [1, 2, 3], 1.0);
                assert!(cloud.len() <= 8);
            }
            cloud.add([1e300, -1e300, 0.0], [1, 2, 3], 1.0);
            assert!(cloud.len() <= 8 && !cloud.is_empty());
            let (positions, _) = cloud.points();
            assert!(positions.iter().flatten().all(|v| !v.is_nan()));
        }
    }
}
