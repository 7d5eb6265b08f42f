//! The error type shared by the geometry estimators and optimisers, and the input checks that
//! produce it.

/// Why an estimation or optimisation could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AlignError {
    /// Fewer usable points than the estimate needs.
    #[error("too few points: {found} {what}, at least {required} needed")]
    TooFewPoints {
        /// Which points were counted.
        what: &'static str,
        /// How many there were.
        found: usize,
        /// How many are needed.
        required: usize,
    },
    /// Two inputs that must correspond entry by entry have different lengths.
    #[error("length mismatch: {what} has {found} entries, {expected} expected")]
    LengthMismatch {
        /// The input whose length is wrong.
        what: &'static str,
        /// The length it should have.
        expected: usize,
        /// The length it has.
        found: usize,
    },
    /// The input does not determine a unique transform (points that coincide or lie on a
    /// line, zero total weight, a graph that is not positive definite).
    #[error("degenerate input: {reason}")]
    Degenerate {
        /// What is degenerate, with the counts involved.
        reason: String,
    },
    /// An input number is NaN or infinite.
    #[error("non-finite input: {what} entry {index} is not finite")]
    NonFinite {
        /// The input that holds it.
        what: &'static str,
        /// Its index in that input.
        index: usize,
    },
    /// A weight is negative or not finite, or an edge weight is not positive.
    #[error("invalid weight: {what} entry {index} is {value}")]
    InvalidWeight {
        /// The input that holds it.
        what: &'static str,
        /// Its index in that input.
        index: usize,
        /// The offending value.
        value: f64,
    },
    /// An option is out of its range.
    #[error("invalid option: {reason}")]
    InvalidOption {
        /// Which option and why.
        reason: String,
    },
    /// A pose-graph edge names a node that does not exist.
    #[error("unknown node {node}: the graph has {nodes} nodes")]
    UnknownNode {
        /// The index given.
        node: usize,
        /// How many nodes the graph has.
        nodes: usize,
    },
    /// ICP found no target point within the correspondence distance of any source point.
    #[error("no correspondences: none of the {points} source points has a target point within {distance}")]
    NoCorrespondences {
        /// How many source points were tried.
        points: usize,
        /// The maximum correspondence distance.
        distance: f64,
    },
}

pub(crate) fn check_length(
    what: &'static str,
    expected: usize,
    found: usize,
) -> Result<(), AlignError> {
    if expected == found {
        Ok(())
    } else {
        Err(AlignError::LengthMismatch {
            what,
            expected,
            found,
        })
    }
}

pub(crate) fn check_finite_points(
    what: &'static str,
    points: &[[f64; 3]],
) -> Result<(), AlignError> {
    match points.iter().position(|p| !p.iter().all(|x| x.is_finite())) {
        Some(index) => Err(AlignError::NonFinite { what, index }),
        None => Ok(()),
    }
}

pub(crate) fn degenerate(reason: String) -> AlignError {
    AlignError::Degenerate { reason }
}

/// An option that must be positive and finite (a threshold, a damping, a distance).
pub(crate) fn check_positive(name: &str, value: f64) -> Result<(), AlignError> {
    if value.is_finite() && value > 0.0 {
        return Ok(());
    }
    Err(AlignError::InvalidOption {
        reason: format!("{name} is {value}, must be positive and finite"),
    })
}

/// An option that must be non-negative and finite (a convergence tolerance).
pub(crate) fn check_non_negative(name: &str, value: f64) -> Result<(), AlignError> {
    if value.is_finite() && value >= 0.0 {
        return Ok(());
    }
    Err(AlignError::InvalidOption {
        reason: format!("{name} is {value}, must be non-negative and finite"),
    })
}
