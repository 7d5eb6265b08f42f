//! Several views of one scene: the official reference-view strategies and what a multi-view
//! prediction holds.
//!
//! The official backbone (`vision_transformer.py`, `_get_intermediate_layers_not_chunked`)
//! picks a reference view when a scene has at least [`SELECTION_MIN_VIEWS`] views and no
//! camera poses are given, just before block `alt_start - 1`, from token 0 of every view at
//! that point. It then moves the reference view first (the others keep their order), gives it
//! camera token 0 at block `alt_start` (every other view camera token 1), and restores the
//! input order of the out-layer features. Local blocks attend within a view and global blocks
//! over every token of the scene with the same positions in every view, so the order of the
//! views changes nothing but the order of the sums in global attention: the graph keeps the
//! input order and gives each view its camera token by slot ([`camera_slots`]).

use super::Error;

/// Fewer views than this never select (the official `THRESH_FOR_REF_SELECTION`): view 0 is
/// the reference.
pub const SELECTION_MIN_VIEWS: usize = 3;

/// The official `RefViewStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefViewStrategy {
    /// View 0.
    First,
    /// View `S / 2`.
    Middle,
    /// The view whose token-0 similarity, norm and variance are all closest to the middle of
    /// their ranges over the views (the official default).
    #[default]
    SaddleBalanced,
    /// The view with the widest range of similarities to the views.
    SaddleSimRange,
    /// A given view (an index into the scene): not an official strategy; it pins the world
    /// frame to that view's camera, for any number of views.
    View(usize),
}

impl RefViewStrategy {
    /// The official names, in the order of the variants.
    pub const NAMES: [&'static str; 4] = ["first", "middle", "saddle_balanced", "saddle_sim_range"];

    /// The official name (`first`, `middle`, `saddle_balanced`, `saddle_sim_range`).
    pub fn name(self) -> &'static str {
        match self {
            RefViewStrategy::First => "first",
            RefViewStrategy::Middle => "middle",
            RefViewStrategy::SaddleBalanced => "saddle_balanced",
            RefViewStrategy::SaddleSimRange => "saddle_sim_range",
            RefViewStrategy::View(_) => "view",
        }
    }

    /// Whether the choice depends on the tokens (the graph must stop to select).
    pub fn reads_tokens(self) -> bool {
        matches!(
            self,
            RefViewStrategy::SaddleBalanced | RefViewStrategy::SaddleSimRange
        )
    }
}

impl std::str::FromStr for RefViewStrategy {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Ok(match s {
            "first" => RefViewStrategy::First,
            "middle" => RefViewStrategy::Middle,
            "saddle_balanced" => RefViewStrategy::SaddleBalanced,
            "saddle_sim_range" => RefViewStrategy::SaddleSimRange,
            _ => match s.parse::<usize>() {
                Ok(view) => RefViewStrategy::View(view),
                Err(_) => {
                    return Err(Error::Input(format!(
                        "unknown reference-view strategy `{s}` (one of {}, or a view index)",
                        Self::NAMES.join(", ")
                    )))
                }
            },
        })
    }
}

impl std::fmt::Display for RefViewStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefViewStrategy::View(v) => write!(f, "view {v}"),
            other => f.write_str(other.name()),
        }
    }
}

/// The reference view for `views` views by a strategy that reads no tokens, or `None` when
/// `strategy` needs them ([`select_reference_view`]).
pub fn positional_reference(views: usize, strategy: RefViewStrategy) -> Option<usize> {
    if let RefViewStrategy::View(view) = strategy {
        return Some(view);
    }
    if views < SELECTION_MIN_VIEWS {
        return Some(0);
    }
    match strategy {
        RefViewStrategy::First => Some(0),
        RefViewStrategy::Middle => Some(views / 2),
        RefViewStrategy::View(view) => Some(view),
        RefViewStrategy::SaddleBalanced | RefViewStrategy::SaddleSimRange => None,
    }
}

/// The official `select_reference_view` for one scene. `tokens`: token 0 of every view,
/// `views` rows of `dim` values. Below [`SELECTION_MIN_VIEWS`] views the official backbone
/// does not select, and this returns 0 too. Computed in f64 (the official code in f32);
/// scores within `SCORE_TIE` are ties, which go to the first view (see `first_extreme`):
/// only there can the official pick differ, by its rounding.
pub fn select_reference_view(tokens: &[f32], dim: usize, strategy: RefViewStrategy) -> usize {
    let s = tokens.len().checked_div(dim).unwrap_or(0);
    if let Some(r) = positional_reference(s, strategy) {
        return r;
    }
    let scores = reference_scores(tokens, dim, strategy).expect("a selecting strategy");
    match strategy {
        RefViewStrategy::SaddleBalanced => first_extreme(&scores, |x, best| x < best),
        _ => first_extreme(&scores, |x, best| x > best),
    }
}

/// The scores a selecting strategy ranks the views by (`saddle_balanced`: the lowest wins;
/// `saddle_sim_range`: the highest), in f64; `None` for the other strategies.
pub fn reference_scores(tokens: &[f32], dim: usize, strategy: RefViewStrategy) -> Option<Vec<f64>> {
    if !strategy.reads_tokens() || dim == 0 {
        return None;
    }
    let s = tokens.len() / dim;
    let rows: Vec<&[f32]> = tokens.chunks_exact(dim).collect();
    let norms: Vec<f64> = rows
        .iter()
        .map(|r| r.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt())
        .collect();
    let unit: Vec<Vec<f64>> = rows
        .iter()
        .zip(&norms)
        .map(|(r, &n)| r.iter().map(|&v| v as f64 / n).collect())
        .collect();
    // Similarities with the diagonal's 1 taken off (sim - eye), as the official code does:
    // the diagonal stays in the row as (about) zero.
    let sim: Vec<Vec<f64>> = (0..s)
        .map(|i| {
            (0..s)
                .map(|j| {
                    let dot: f64 = unit[i].iter().zip(&unit[j]).map(|(a, b)| a * b).sum();
                    if i == j {
                        dot - 1.0
                    } else {
                        dot
                    }
                })
                .collect()
        })
        .collect();
    match strategy {
        RefViewStrategy::SaddleBalanced => {
            let sim_score: Vec<f64> = sim
                .iter()
                .map(|row| row.iter().sum::<f64>() / (s - 1) as f64)
                .collect();
            // torch.var: the unbiased estimate.
            let variance: Vec<f64> = unit
                .iter()
                .map(|u| {
                    let mean = u.iter().sum::<f64>() / dim as f64;
                    u.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (dim as f64 - 1.0)
                })
                .collect();
            let scaled = |m: &[f64]| -> Vec<f64> {
                let lo = m.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = m.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                m.iter().map(|v| (v - lo) / (hi - lo + 1e-8)).collect()
            };
            let (a, b, c) = (scaled(&sim_score), scaled(&norms), scaled(&variance));
            let balance: Vec<f64> = (0..s)
                .map(|i| (a[i] - 0.5).abs() + (b[i] - 0.5).abs() + (c[i] - 0.5).abs())
                .collect();
            Some(balance)
        }
        RefViewStrategy::SaddleSimRange => {
            let range: Vec<f64> = sim
                .iter()
                .map(|row| {
                    let hi = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let lo = row.iter().copied().fold(f64::INFINITY, f64::min);
                    hi - lo
                })
                .collect();
            Some(range)
        }
        _ => None,
    }
}

/// Scores closer than this are a tie (the first view wins).
const SCORE_TIE: f64 = 1e-6;

/// Index of the first value that no later value beats by more than [`SCORE_TIE`]: torch's
/// argmin / argmax, which take the first of equal values. Ties are common: with views of one
/// scene every similarity is positive, so each row's minimum is its diagonal (`1 - 1`, about
/// 0) and `saddle_sim_range` scores the two views of the most similar pair the same; the
/// official f32 code then breaks the tie by the rounding of `|f|^2 - 1` (seen: 6e-8 apart),
/// here it goes to the first view, as it would without that rounding.
fn first_extreme(values: &[f64], beats: impl Fn(f64, f64) -> bool) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if beats(v, values[best]) && (v - values[best]).abs() > SCORE_TIE {
            best = i;
        }
    }
    best
}

/// The official `reorder_by_reference`: position `p` of the reordered scene holds view
/// `order[p]` (the reference first, the others in their order).
pub fn reference_order(views: usize, reference: usize) -> Vec<usize> {
    std::iter::once(reference)
        .chain((0..views).filter(|&v| v != reference))
        .collect()
}

/// The official `restore_original_order`: view `v` of the input is at position `restore[v]`
/// of the reordered scene.
pub fn restore_order(views: usize, reference: usize) -> Vec<usize> {
    let order = reference_order(views, reference);
    let mut restore = vec![0; views];
    for (p, &v) in order.iter().enumerate() {
        restore[v] = p;
    }
    restore
}

/// Which camera token each view takes at `alt_start`: 0 for the reference view, 1 for the
/// others (the official `camera_token[:, :1]` / `camera_token[:, 1:]` after reordering).
pub fn camera_slots(views: usize, reference: usize) -> Vec<i32> {
    (0..views).map(|v| i32::from(v != reference)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_match_the_official_docstrings() {
        // reorder_by_reference: b_idx = 2, S = 5 -> [2, 0, 1, 3, 4]; restore undoes it.
        assert_eq!(reference_order(5, 2), vec![2, 0, 1, 3, 4]);
        let order = reference_order(5, 2);
        let restore = restore_order(5, 2);
        for v in 0..5 {
            assert_eq!(order[restore[v]], v);
        }
        assert_eq!(reference_order(3, 0), vec![0, 1, 2]);
        assert_eq!(camera_slots(4, 2), vec![1, 1, 0, 1]);
    }

    #[test]
    fn positional_strategies_and_small_scenes() {
        let tokens = [1.0, 0.0, 0.0, 1.0];
        for strategy in [
            RefViewStrategy::First,
            RefViewStrategy::Middle,
            RefViewStrategy::SaddleBalanced,
            RefViewStrategy::SaddleSimRange,
        ] {
            // Two views never select.
            assert_eq!(select_reference_view(&tokens, 2, strategy), 0);
            assert_eq!(
                strategy.name().parse::<RefViewStrategy>().unwrap(),
                strategy
            );
        }
        assert_eq!(positional_reference(5, RefViewStrategy::Middle), Some(2));
        assert_eq!(positional_reference(4, RefViewStrategy::Middle), Some(2));
        assert_eq!(
            positional_reference(4, RefViewStrategy::SaddleBalanced),
            None
        );
        assert!("auto".parse::<RefViewStrategy>().is_err());
    }

    /// Values from the official `select_reference_view` (depth-anything-3 0.1.1) on
    /// hand-written token-0 rows (B = 1); the fixture test in tests/da3_multiview.rs checks
    /// seeded random tokens too.
    #[test]
    fn saddle_strategies_match_the_official_picks() {
        // Four views of 3 values.
        let tokens = [
            1.0, 0.0, 0.0, //
            0.9, 0.1, 0.0, //
            0.0, 1.0, 0.5, //
            2.0, 2.0, 2.0,
        ];
        assert_eq!(
            select_reference_view(&tokens, 3, RefViewStrategy::SaddleBalanced),
            OFFICIAL_BALANCED
        );
        assert_eq!(
            select_reference_view(&tokens, 3, RefViewStrategy::SaddleSimRange),
            OFFICIAL_SIM_RANGE
        );
    }
    const OFFICIAL_BALANCED: usize = 2;
    const OFFICIAL_SIM_RANGE: usize = 0;

    /// Views of one scene: every similarity positive, so `saddle_sim_range` scores both views
    /// of the most similar pair alike (their shared similarity minus the diagonal's 0). The
    /// first of them is picked, whichever way round the pair comes.
    #[test]
    fn a_tied_pair_goes_to_its_first_view() {
        let near = [1.0, 0.25, 0.05];
        let a = [1.0, 0.2, 0.0];
        let far = [0.2, 1.0, 0.0];
        for (rows, expected) in [
            ([a, far, near], 0),
            ([far, near, a], 1),
            ([far, a, near], 1),
        ] {
            let tokens: Vec<f32> = rows.iter().flatten().copied().collect();
            assert_eq!(
                select_reference_view(&tokens, 3, RefViewStrategy::SaddleSimRange),
                expected,
                "{rows:?}"
            );
        }
    }
}
