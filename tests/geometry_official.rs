//! The geometry module against the official DA3-Streaming alignment code on the same inputs:
//! tests/fixtures/official_sim3.json, written by tests/reference/official_sim3.py from the
//! official functions (`weighted_align_point_maps` numpy path, `weighted_estimate_sim3`,
//! `robust_weighted_estimate_sim3`, `accumulate_sim3_transforms`, `compute_sim3_ab`).
//!
//! Both sides compute in f64 on the same numbers, so the transforms agree to rounding (about
//! 2e-14 when this was written). The tolerance, 1e-11 on every entry of s, R and t, leaves room
//! for a different order of floating-point operations and SVD implementation, and is still far
//! below the effect of keeping or weighting a single point differently. A difference in when
//! the reweighting loop stops is caught by the number of rounds, which must match exactly.

use da3::geometry::align::{overlap_conf_threshold, spread_ratio_sim3};
use da3::geometry::{
    align_point_maps, chain, relative_through_common, robust_sim3, RobustOptions, Sim3,
};
use serde_json::Value;

/// Largest allowed difference of any entry of s, R or t.
const TOLERANCE: f64 = 1e-11;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/official_sim3.json"
    );
    let text = std::fs::read_to_string(path).expect("tests/fixtures/official_sim3.json");
    serde_json::from_str(&text).expect("valid JSON")
}

fn number(value: &Value) -> f64 {
    value.as_f64().expect("a number")
}

fn points(value: &Value) -> Vec<[f64; 3]> {
    value
        .as_array()
        .expect("an array of points")
        .iter()
        .map(|p| {
            let p = p.as_array().expect("a point");
            [number(&p[0]), number(&p[1]), number(&p[2])]
        })
        .collect()
}

fn numbers(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .expect("an array")
        .iter()
        .map(number)
        .collect()
}

fn confidences(value: &Value) -> Vec<f32> {
    // The script makes every confidence a multiple of 1/64, exact in f32.
    numbers(value).into_iter().map(|c| c as f32).collect()
}

fn transform(value: &Value) -> Sim3 {
    let rows = points(&value["rotation"]);
    let t = numbers(&value["translation"]);
    Sim3::new(
        number(&value["scale"]),
        [rows[0], rows[1], rows[2]],
        [t[0], t[1], t[2]],
    )
}

/// Largest difference over the entries of s, R and t.
fn difference(a: &Sim3, b: &Sim3) -> f64 {
    let mut worst = (a.scale - b.scale).abs();
    for row in 0..3 {
        worst = worst.max((a.translation[row] - b.translation[row]).abs());
        for column in 0..3 {
            worst = worst.max((a.rotation[row][column] - b.rotation[row][column]).abs());
        }
    }
    worst
}

fn irls_options(delta: f64, max_iterations: usize, tolerance: f64) -> RobustOptions {
    RobustOptions {
        huber_delta: delta,
        max_iterations,
        tolerance,
    }
}

#[test]
fn align_point_maps_matches_weighted_align_point_maps() {
    let fixture = fixture();
    for (index, case) in fixture["point_maps"].as_array().unwrap().iter().enumerate() {
        let target = points(&case["target"]);
        let source = points(&case["source"]);
        let target_conf = confidences(&case["target_conf"]);
        let source_conf = confidences(&case["source_conf"]);
        let official = &case["official"];

        let threshold = overlap_conf_threshold(&target_conf, &source_conf).unwrap();
        let official_threshold = number(&official["conf_threshold"]);
        assert!(
            (threshold - official_threshold).abs() < 1e-15,
            "case {index}: threshold {threshold} vs {official_threshold}"
        );
        let kept = target_conf
            .iter()
            .zip(&source_conf)
            .filter(|(&t, &s)| f64::from(t) > threshold && f64::from(s) > threshold)
            .count();
        assert_eq!(
            kept as u64,
            official["kept_points"].as_u64().unwrap(),
            "case {index}"
        );

        let irls = &case["irls"];
        let tolerance: f64 = irls["tol"].as_str().unwrap().parse().unwrap();
        let options = irls_options(
            number(&irls["delta"]),
            irls["max_iters"].as_u64().unwrap() as usize,
            tolerance,
        );
        let ours = align_point_maps(
            &target,
            &target_conf,
            &source,
            &source_conf,
            official_threshold,
            &options,
        )
        .unwrap();
        let expected = transform(official);
        let gap = difference(&ours.transform, &expected);
        let truth = transform(&case["truth"]);
        println!(
            "point maps case {index}: {kept} points kept, {} rounds, difference from official {gap:.2e} \
             (both {:.2e} from the generating transform), {:.1}% inliers",
            ours.iterations,
            difference(&expected, &truth),
            100.0 * ours.inlier_fraction
        );
        assert!(
            gap < TOLERANCE,
            "case {index}: {:?} vs {expected:?}",
            ours.transform
        );
        assert_eq!(
            ours.iterations as u64,
            official["irls_rounds"].as_u64().unwrap(),
            "case {index}"
        );
    }
}

#[test]
fn estimators_match_weighted_and_robust_estimate_sim3() {
    let fixture = fixture();
    for (index, case) in fixture["estimators"].as_array().unwrap().iter().enumerate() {
        let source = points(&case["source"]);
        let target = points(&case["target"]);
        let weights = numbers(&case["weights"]);

        let weighted = spread_ratio_sim3(&source, &target, &weights).unwrap();
        let gap = difference(&weighted, &transform(&case["official_weighted"]));
        assert!(
            gap < TOLERANCE,
            "case {index}: weighted_estimate_sim3 differs by {gap}"
        );

        let options = irls_options(
            number(&case["delta"]),
            case["max_iters"].as_u64().unwrap() as usize,
            number(&case["tol"]),
        );
        let robust = robust_sim3(&source, &target, &weights, &options).unwrap();
        let official = &case["official_robust"];
        let robust_gap = difference(&robust.transform, &transform(official));
        println!(
            "estimator case {index}: weighted differs by {gap:.2e}, robust by {robust_gap:.2e} after {} rounds",
            robust.iterations
        );
        assert!(
            robust_gap < TOLERANCE,
            "case {index}: robust_weighted_estimate_sim3 differs by {robust_gap}"
        );
        assert_eq!(
            robust.iterations as u64,
            official["irls_rounds"].as_u64().unwrap(),
            "case {index}"
        );
    }
}

#[test]
fn chain_and_relative_match_accumulate_and_compute_sim3_ab() {
    let fixture = fixture();
    let case = &fixture["transforms"];
    let relative: Vec<Sim3> = case["relative"]
        .as_array()
        .unwrap()
        .iter()
        .map(transform)
        .collect();
    let accumulated: Vec<Sim3> = case["official_accumulated"]
        .as_array()
        .unwrap()
        .iter()
        .map(transform)
        .collect();
    let world = chain(&relative);
    // The official list has no leading identity: its entry k is our entry k + 1.
    assert_eq!(world.len(), accumulated.len() + 1);
    assert_eq!(world[0], Sim3::IDENTITY);
    for (k, expected) in accumulated.iter().enumerate() {
        let gap = difference(&world[k + 1], expected);
        assert!(gap < TOLERANCE, "accumulated {k} differs by {gap}");
    }
    let ours = relative_through_common(
        &transform(&case["common_to_a"]),
        &transform(&case["common_to_b"]),
    );
    let gap = difference(&ours, &transform(&case["official_ab"]));
    assert!(gap < TOLERANCE, "compute_sim3_ab differs by {gap}");
}
