//! What the planner found and decided, in one line for logs and in full for `da3 repro`.

use super::pass::{Finding, Issue, PassResult};
use super::Policy;
use std::fmt;

/// How a graph is computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Every operand resident: ggml's single-backend allocator on the device.
    Gallocr,
    /// Non-resident operands uploaded once to the device; then the gallocr path.
    Mirror {
        /// Distinct tensors copied to the device.
        uploaded: usize,
    },
    /// ggml's scheduler over {device, CPU}; host memory wrapped in a CPU buffer first.
    Sched {
        /// Host tensors given a CPU buffer wrapping their memory.
        wrapped: usize,
        /// Tensors uploaded once to the device (what neither device nor CPU can read).
        mirrored: usize,
        /// Pieces the scheduler cut the graph into (known once allocated).
        splits: Option<usize>,
    },
    /// Refused (`strict`).
    Refused,
    /// Gallocr on the device regardless of hazards (`unchecked`, for reproducing the bug).
    Unchecked,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Gallocr => write!(f, "gallocr"),
            Decision::Mirror { uploaded } => {
                write!(f, "mirror ({uploaded} uploaded once), gallocr")
            }
            Decision::Sched {
                wrapped,
                mirrored,
                splits,
            } => {
                write!(f, "sched")?;
                if let Some(splits) = splits {
                    write!(f, ", {splits} split{}", if *splits == 1 { "" } else { "s" })?;
                }
                if *wrapped > 0 {
                    write!(f, ", {wrapped} host tensors given a CPU buffer")?;
                }
                if *mirrored > 0 {
                    write!(f, ", {mirrored} uploaded")?;
                }
                Ok(())
            }
            Decision::Refused => write!(f, "refused (strict)"),
            Decision::Unchecked => write!(f, "gallocr UNCHECKED"),
        }
    }
}

/// The pass's findings with the decision taken.
#[derive(Debug, Clone)]
pub struct Report {
    /// The device's name.
    pub device: String,
    /// The policy the decision followed.
    pub policy: Policy,
    /// What the residency pass found.
    pub pass: PassResult,
    /// How the graph is computed.
    pub decision: Decision,
}

impl Report {
    /// One line: `residency: 2 tensors not on CUDA0 (vit.norm.weight, vit.norm.bias: no buffer) -> sched, 3 splits`.
    pub fn summary(&self) -> String {
        let non_resident = self.pass.non_resident();
        let unsupported = self.pass.unsupported_ops();
        let mut line = format!(
            "residency: {} nodes checked on {}",
            self.pass.nodes, self.device
        );
        if !non_resident.is_empty() {
            let plural = if non_resident.len() == 1 { "" } else { "s" };
            line = format!(
                "residency: {} tensor{plural} not on {} ({})",
                non_resident.len(),
                self.device,
                group(&non_resident)
            );
        }
        if !unsupported.is_empty() {
            // Which ops, so that the log says what to implement or avoid.
            let mut by_op: Vec<(&str, usize)> = Vec::new();
            for f in &unsupported {
                match by_op.iter_mut().find(|(op, _)| *op == f.consumer_op) {
                    Some((_, n)) => *n += 1,
                    None => by_op.push((&f.consumer_op, 1)),
                }
            }
            let ops: Vec<String> = by_op.iter().map(|(op, n)| format!("{op} x{n}")).collect();
            line.push_str(&format!(
                ", {} ops unsupported ({})",
                unsupported.len(),
                ops.join(", ")
            ));
        }
        format!("{line} -> {}", self.decision)
    }
}

/// "a, b: no buffer; c: in RPC0[...]", names grouped by issue, at most 6 shown.
fn group(findings: &[&Finding]) -> String {
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for f in findings {
        let issue = f.issue.to_string();
        match groups.iter_mut().find(|(i, _)| *i == issue) {
            Some((_, names)) => names.push(&f.tensor),
            None => groups.push((issue, vec![&f.tensor])),
        }
    }
    groups
        .into_iter()
        .map(|(issue, names)| {
            let shown: Vec<&str> = names.iter().take(6).copied().collect();
            let more = if names.len() > 6 {
                format!(" and {} more", names.len() - 6)
            } else {
                String::new()
            };
            format!("{}{more}: {issue}", shown.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

impl fmt::Display for Report {
    /// The full report: the summary, then each finding with its consumer.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.summary())?;
        writeln!(
            f,
            "  policy {:?}; {} nodes, {} operands checked against {}",
            self.policy, self.pass.nodes, self.pass.sources_checked, self.device
        )?;
        for finding in &self.pass.findings {
            match &finding.issue {
                Issue::UnsupportedOp => writeln!(
                    f,
                    "  - node `{}` ({}): op not supported",
                    finding.consumer, finding.consumer_op
                )?,
                issue => writeln!(
                    f,
                    "  - `{}` read by `{}` ({}): {issue}",
                    finding.tensor, finding.consumer, finding.consumer_op
                )?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsupported(node: &str, op: &str) -> Finding {
        Finding {
            tensor: node.to_owned(),
            consumer: node.to_owned(),
            consumer_op: op.to_owned(),
            issue: Issue::UnsupportedOp,
            input: false,
        }
    }

    /// The one-line summary names the ops a device refused, counted by op, so that a log of
    /// a scheduled graph says what made it so.
    #[test]
    fn the_summary_counts_unsupported_ops_by_op() {
        let report = Report {
            device: "CUDA0".to_owned(),
            policy: Policy::Auto,
            pass: PassResult {
                findings: vec![
                    unsupported("a", "IM2COL"),
                    unsupported("b", "CONV_TRANSPOSE_2D"),
                    unsupported("c", "IM2COL"),
                ],
                nodes: 10,
                sources_checked: 20,
            },
            decision: Decision::Sched {
                wrapped: 0,
                mirrored: 0,
                splits: Some(7),
            },
        };
        assert_eq!(
            report.summary(),
            "residency: 10 nodes checked on CUDA0, 3 ops unsupported \
             (IM2COL x2, CONV_TRANSPOSE_2D x1) -> sched, 7 splits"
        );
    }
}
