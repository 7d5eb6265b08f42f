//! The residency-aware planner: before every compute, check that the device can read every
//! operand of every node, and pick how to compute accordingly.
//!
//! ggml's single-backend allocator (`gallocr`) assumes every operand it did not allocate
//! already lives where the backend can read it. A weight left in plain host memory (tensor
//! `buffer == NULL`) breaks that: Metal dereferences the NULL buffer (the reported M4 crash),
//! CUDA aborts, an RPC server computes on NULL. [`Executor`] is the one entry point every graph
//! in this crate computes through: it runs the [`pass`], decides by [`Policy`], allocates, and
//! computes, caching the decision per graph and device.

mod executor;
pub mod pass;
mod report;

pub use executor::{Executor, Run};
pub use pass::{
    check, check_kernel_operands, classify, Finding, Issue, PassResult, Residency, Target,
};
pub use report::{Decision, Report};

/// What to do when an operand is not resident on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// `mirror` when every non-resident operand is constant (weights: not a graph input),
    /// otherwise `route`. Measured on an H200 with DA3-large's three host-side weights:
    /// mirror 21.0 ms per image, route 24.2 ms (the scheduler's per-compute split and copies),
    /// every weight resident 20.9 ms. Inputs are never mirrored: a copy made once would go
    /// stale when the input is written again.
    #[default]
    Auto,
    /// Send the graph to ggml's scheduler over {device, CPU}, after giving host memory a real
    /// CPU buffer so the scheduler sees it and copies it (per compute).
    Route,
    /// Upload each non-resident operand once to the device, keep the copy, stay on gallocr.
    Mirror,
    /// Refuse, returning the report as the error.
    Strict,
    /// Compute on gallocr regardless. Exists only to reproduce the crash (in a child
    /// process); with a non-resident operand on a GPU it aborts or segfaults the process.
    Unchecked,
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Policy::Auto),
            "route" => Ok(Policy::Route),
            "mirror" => Ok(Policy::Mirror),
            "strict" => Ok(Policy::Strict),
            "unchecked" => Ok(Policy::Unchecked),
            other => Err(format!(
                "unknown residency policy `{other}` (auto, route, mirror, strict, unchecked)"
            )),
        }
    }
}

/// What to do about a pass's findings, before anything is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Nothing to do: the gallocr fast path.
    FastPath,
    /// Upload every non-resident operand once; scheduler only if some op is unsupported.
    MirrorAll {
        /// Some op is unsupported on the device: compute through the scheduler after uploading.
        then_sched: bool,
    },
    /// Upload what neither device nor CPU can read, wrap host memory, schedule.
    Route,
    /// Refuse to compute (`strict`).
    Refuse,
    /// Compute on gallocr regardless (`unchecked`).
    Unchecked,
}

/// The decision rule, separate from its side effects so it can be tested on its own.
pub fn choose(policy: Policy, pass: &PassResult) -> Strategy {
    if pass.is_clean() {
        return Strategy::FastPath;
    }
    match policy {
        Policy::Unchecked => Strategy::Unchecked,
        Policy::Strict => Strategy::Refuse,
        Policy::Mirror => Strategy::MirrorAll {
            then_sched: !pass.unsupported_ops().is_empty(),
        },
        Policy::Route => Strategy::Route,
        Policy::Auto if pass.non_resident().iter().any(|f| f.input) => Strategy::Route,
        Policy::Auto => Strategy::MirrorAll {
            then_sched: !pass.unsupported_ops().is_empty(),
        },
    }
}

/// Errors of the planner.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `strict` found operands the device cannot read.
    #[error("{0}")]
    Refused(Box<Report>),
    /// A node that a kernel of our own takes has an operand outside the device's memory
    /// (checked before anything of the graph is computed; the kernel is never called).
    #[error(
        "{kernel} would be handed memory it cannot address: {}",
        findings
            .iter()
            .map(|f| format!("`{}` of node `{}` ({})", f.tensor, f.consumer, f.issue))
            .collect::<Vec<_>>()
            .join(", ")
    )]
    KernelOperands {
        /// The kernel ([`crate::ggml::NodeKernel::name`]).
        kernel: String,
        /// Each operand (or node) outside the device's memory.
        findings: Vec<Finding>,
    },
    /// An error of the safe ggml layer (allocation, upload, compute).
    #[error(transparent)]
    Ggml(Box<crate::ggml::Error>),
}

impl From<crate::ggml::Error> for Error {
    fn from(e: crate::ggml::Error) -> Self {
        Error::Ggml(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass_with(issues: &[Issue]) -> PassResult {
        let findings = issues
            .iter()
            .enumerate()
            .map(|(i, issue)| Finding {
                tensor: format!("t{i}"),
                consumer: "y".into(),
                consumer_op: "MUL".into(),
                issue: issue.clone(),
                input: false,
            })
            .collect();
        PassResult {
            findings,
            nodes: 2,
            sources_checked: 4,
        }
    }

    fn clean() -> PassResult {
        pass_with(&[])
    }
    fn hazards() -> PassResult {
        pass_with(&[
            Issue::NoBuffer,
            Issue::ForeignBuffer {
                buffer_type: "CPU".into(),
                host_readable: true,
            },
        ])
    }
    fn hazards_and_unsupported_op() -> PassResult {
        pass_with(&[Issue::NoBuffer, Issue::UnsupportedOp])
    }
    fn unsupported_op_only() -> PassResult {
        pass_with(&[Issue::UnsupportedOp])
    }

    const POLICIES: [Policy; 5] = [
        Policy::Auto,
        Policy::Route,
        Policy::Mirror,
        Policy::Strict,
        Policy::Unchecked,
    ];

    #[test]
    fn clean_pass_takes_the_fast_path_under_every_policy() {
        for policy in POLICIES {
            assert_eq!(choose(policy, &clean()), Strategy::FastPath, "{policy:?}");
        }
    }

    #[test]
    fn hazards_are_handled_as_each_policy_says() {
        let expected = [
            (Policy::Auto, Strategy::MirrorAll { then_sched: false }),
            (Policy::Route, Strategy::Route),
            (Policy::Mirror, Strategy::MirrorAll { then_sched: false }),
            (Policy::Strict, Strategy::Refuse),
            (Policy::Unchecked, Strategy::Unchecked),
        ];
        for (policy, strategy) in expected {
            assert_eq!(choose(policy, &hazards()), strategy, "{policy:?}");
        }
    }

    /// An unsupported op sends `mirror` on to the scheduler, with or without residency
    /// hazards; an unsupported op alone is not clean either, so `strict` refuses it and
    /// `unchecked` leaves it to the compute-time op check.
    #[test]
    fn unsupported_op_sends_mirror_on_to_the_scheduler() {
        let expected = [
            (Policy::Auto, Strategy::MirrorAll { then_sched: true }),
            (Policy::Route, Strategy::Route),
            (Policy::Mirror, Strategy::MirrorAll { then_sched: true }),
            (Policy::Strict, Strategy::Refuse),
            (Policy::Unchecked, Strategy::Unchecked),
        ];
        for pass in [hazards_and_unsupported_op(), unsupported_op_only()] {
            for (policy, strategy) in expected {
                assert_eq!(choose(policy, &pass), strategy, "{policy:?} {pass:?}");
            }
        }
    }

    #[test]
    fn auto_routes_a_non_resident_input_and_mirrors_only_constants() {
        let mut pass = hazards();
        assert_eq!(
            choose(Policy::Auto, &pass),
            Strategy::MirrorAll { then_sched: false }
        );
        pass.findings[1].input = true;
        assert_eq!(choose(Policy::Auto, &pass), Strategy::Route);
    }

    #[test]
    fn policy_parses_from_its_cli_name() {
        for (name, policy) in [
            ("auto", Policy::Auto),
            ("route", Policy::Route),
            ("mirror", Policy::Mirror),
            ("strict", Policy::Strict),
            ("unchecked", Policy::Unchecked),
        ] {
            assert_eq!(name.parse::<Policy>(), Ok(policy));
        }
        assert!("gallocr"
            .parse::<Policy>()
            .unwrap_err()
            .contains("auto, route, mirror, strict, unchecked"));
        assert_eq!(Policy::default(), Policy::Auto);
    }
}
