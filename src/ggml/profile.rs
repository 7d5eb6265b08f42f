//! Node times ([`NodeTime`], from [`super::Allocation::profile`]) summed by class of op, with
//! the multiply-adds of the products (matrix products, attention, convolutions) counted so that
//! each class's rate can be set against the hardware's: what `da3 bench --profile` and the
//! `profile_model` example print.

use super::{NodeTime, LINEAR_PANEL, LINEAR_Q8_RECORD};

/// The time of one class of ops over a graph.
#[derive(Debug, Clone, PartialEq)]
pub struct OpClassTime {
    /// The class: ggml's op name, or ours for custom nodes (`linear_panels`, `attention`,
    /// `conv_2d`, ...), or a product class such as `attention (ggml)`.
    pub class: String,
    /// Seconds, summed over its nodes.
    pub seconds: f64,
    /// How many nodes.
    pub nodes: usize,
    /// Floating-point operations counted (2 x multiply-adds; 0 for classes not counted).
    pub flops: f64,
}

/// A node's class and its floating-point operations (2 x multiply-adds) where it is a product.
/// Custom nodes carry the name of the op they compute; packed linear layers are the custom
/// nodes whose weight is a panel packing (f32 or bf16) or an int8 record.
pub fn classify(t: &NodeTime) -> (String, f64) {
    let [out, a, b] = t.shapes.map(|s| s.map(|d| d as f64));
    let panel = LINEAR_PANEL as f64;
    let packed = a[0] == panel && a[2] * a[0] == out[0];
    let packed_int8 = a[0] as usize == LINEAR_Q8_RECORD && a[2] * panel == out[0];
    match (t.op, t.name.as_str()) {
        ("MUL_MAT", _) => (
            "linear (ggml)".into(),
            2.0 * a[0] * out[0] * out[1] * out[2] * out[3],
        ),
        // Ours: out [Dv, H, Tq], q [D, Tq, H], k [D, Tk, H].
        ("CUSTOM", "attention") => {
            let (d, tq, heads, tk) = (a[0], a[1], a[2], b[1]);
            ("attention".into(), 2.0 * (d + out[0]) * tq * tk * heads)
        }
        // ggml's fused attention: out [Dv, H, Tq, B], q [D, Tq, H, B], k [D, Tk, H, B].
        ("FLASH_ATTN_EXT", _) => {
            let (d, tq, heads, tk) = (a[0], a[1], a[2], b[1]);
            (
                "attention (ggml)".into(),
                2.0 * (d + out[0]) * tq * tk * heads * a[3],
            )
        }
        // ggml's direct convolution: out [OW, OH, OC, N], kernel [KW, KH, IC, OC].
        ("CONV_2D", _) => (
            "conv_2d (ggml direct)".into(),
            2.0 * out[0] * out[1] * out[2] * out[3] * a[0] * a[1] * a[2],
        ),
        // Ours: out [W, H, OC], kernel [KW, KH, IC, OC]; Winograd's counted as the direct
        // convolution it replaces.
        ("CUSTOM", name @ ("conv_2d" | "conv_2d_winograd")) => (
            name.into(),
            2.0 * out[0] * out[1] * out[2] * a[0] * a[1] * a[2],
        ),
        ("CUSTOM", _) if packed => ("linear_panels".into(), 2.0 * b[0] * out[0] * out[1]),
        ("CUSTOM", _) if packed_int8 => ("linear_panels int8".into(), 2.0 * b[0] * out[0] * out[1]),
        // A convolution node the model renamed (a head's stage): a square odd kernel
        // [K, K, IC, OC] whose output has OC channels.
        ("CUSTOM", _) if a[0] == a[1] && a[0] as i64 % 2 == 1 && a[0] <= 7.0 && out[2] == a[3] => (
            "conv_2d".into(),
            2.0 * out[0] * out[1] * out[2] * a[0] * a[1] * a[2],
        ),
        ("CUSTOM", name) => (name.to_owned(), 0.0),
        (op, _) => (op.to_owned(), 0.0),
    }
}

/// `times` summed by [`classify`]'s class, slowest class first.
pub fn op_classes(times: &[NodeTime]) -> Vec<OpClassTime> {
    let mut classes: Vec<OpClassTime> = Vec::new();
    for t in times {
        let (class, flops) = classify(t);
        match classes.iter_mut().find(|c| c.class == class) {
            Some(c) => {
                c.seconds += t.seconds;
                c.nodes += 1;
                c.flops += flops;
            }
            None => classes.push(OpClassTime {
                class,
                seconds: t.seconds,
                nodes: 1,
                flops,
            }),
        }
    }
    classes.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    classes
}

/// The classes as a table: a total line, then one line per class (at most `rows`): time,
/// share, nodes and, for the products, GFLOP and GFLOP/s.
pub fn op_class_table(classes: &[OpClassTime], rows: usize) -> String {
    let total: f64 = classes.iter().map(|c| c.seconds).sum();
    let flops: f64 = classes.iter().map(|c| c.flops).sum();
    let nodes: usize = classes.iter().map(|c| c.nodes).sum();
    let mut out = format!(
        "total {:.1} ms over {nodes} nodes; {:.1} GFLOP counted, {:.1} GFLOP/s over the whole graph\n",
        total * 1e3,
        flops / 1e9,
        flops / total.max(1e-12) / 1e9
    );
    for c in classes.iter().take(rows) {
        let rate = if c.flops > 0.0 {
            format!(
                "  {:>6.2} GFLOP {:>7.1} GFLOP/s",
                c.flops / 1e9,
                c.flops / c.seconds.max(1e-12) / 1e9
            )
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{:<22} {:>8.2} ms {:>5.1}% ({} nodes){rate}\n",
            c.class,
            c.seconds * 1e3,
            100.0 * c.seconds / total.max(1e-12),
            c.nodes
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(op: &'static str, name: &str, shapes: [[i64; 4]; 3], seconds: f64) -> NodeTime {
        NodeTime {
            name: name.into(),
            op,
            shapes,
            seconds,
        }
    }

    /// Products are counted as 2 x multiply-adds and summed by class, slowest first.
    #[test]
    fn classes_sum_times_and_count_products() {
        let times = [
            // [out = 16 x 8] = W [32 -> 16] x in [32 x 8]: 2 * 32 * 16 * 8 FLOP.
            node(
                "MUL_MAT",
                "fc",
                [[16, 8, 1, 1], [32, 16, 1, 1], [32, 8, 1, 1]],
                0.002,
            ),
            node(
                "MUL_MAT",
                "fc2",
                [[16, 8, 1, 1], [32, 16, 1, 1], [32, 8, 1, 1]],
                0.001,
            ),
            node(
                "ADD",
                "bias",
                [[16, 8, 1, 1], [16, 8, 1, 1], [16, 1, 1, 1]],
                0.004,
            ),
            // ggml attention: D 64, Tq 10, H 2, Tk 12, B 1 -> 2 * (64 + 64) * 10 * 12 * 2.
            node(
                "FLASH_ATTN_EXT",
                "attn",
                [[64, 2, 10, 1], [64, 10, 2, 1], [64, 12, 2, 1]],
                0.0005,
            ),
        ];
        let classes = op_classes(&times);
        assert_eq!(classes[0].class, "ADD");
        assert_eq!(classes[1].class, "linear (ggml)");
        assert_eq!(classes[1].nodes, 2);
        assert!((classes[1].seconds - 0.003).abs() < 1e-12);
        assert_eq!(classes[1].flops, 2.0 * 2.0 * 32.0 * 16.0 * 8.0);
        assert_eq!(classes[2].flops, 2.0 * 128.0 * 10.0 * 12.0 * 2.0);
        let table = op_class_table(&classes, 10);
        assert!(table.starts_with("total 7.5 ms over 4 nodes"), "{table}");
        assert!(table.contains("ADD"), "{table}");
    }
}
