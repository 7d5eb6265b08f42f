"""Writes tests/fixtures/official_sim3.json: seeded inputs and the outputs of the official
DA3-Streaming alignment functions on them, for tests/geometry_official.rs.

The functions run are the official ones, imported from a checkout of the official repository:
`weighted_align_point_maps` (numpy path, align_method 'sim3'), `weighted_estimate_sim3`,
`robust_weighted_estimate_sim3`, `accumulate_sim3_transforms` and `compute_sim3_ab` from
da3_streaming/loop_utils/sim3utils.py.

    git -C <official repo> archive HEAD da3_streaming | tar -x -C /tmp/da3src
    python -m venv /tmp/sim3venv && /tmp/sim3venv/bin/pip install numpy numba scikit-learn trimesh
    /tmp/sim3venv/bin/python tests/reference/official_sim3.py /tmp/da3src

sim3utils.py imports its GPU variants (loop_utils.alignment_torch, which needs torch, and
loop_utils.alignment_triton, which needs triton) at the top. The numpy path compared here calls
neither, so when torch or triton is missing this script puts small stand-in modules for those
two imports into sys.modules; a stand-in raises if it is ever called. The same is done for
numba, scikit-learn and trimesh when they are not installed (numba's `njit` becomes a
pass-through decorator; the numpy functions compared do not use any of them). The fixture
records which stand-ins were used.

Inputs are rounded before the official code sees them (points to 1e-6, confidences and weights
to multiples of 1/64, exact in float32) so that the JSON holds them exactly and stays small.
"""
import argparse
import contextlib
import importlib
import io
import json
import pathlib
import sys
import types

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def install_stand_ins():
    """Puts stand-in modules into sys.modules for the imports the numpy path does not use."""
    used = []

    def refuse(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"{name} is a stand-in in this script and must not be called")

        return call

    def have(module):
        try:
            importlib.import_module(module)
            return True
        except ImportError:
            return False

    if not have("torch"):
        stand_in = types.ModuleType("loop_utils.alignment_torch")
        stand_in.robust_weighted_estimate_sim3_torch = refuse("robust_weighted_estimate_sim3_torch")
        sys.modules["loop_utils.alignment_torch"] = stand_in
        used.append("loop_utils.alignment_torch")
    if not have("triton") or not have("torch"):
        stand_in = types.ModuleType("loop_utils.alignment_triton")
        stand_in.robust_weighted_estimate_sim3_triton = refuse("robust_weighted_estimate_sim3_triton")
        sys.modules["loop_utils.alignment_triton"] = stand_in
        used.append("loop_utils.alignment_triton")
    if not have("numba"):
        stand_in = types.ModuleType("numba")
        stand_in.njit = lambda *args, **kwargs: (lambda function: function)
        sys.modules["numba"] = stand_in
        used.append("numba")
    if not have("sklearn.linear_model"):
        sklearn = types.ModuleType("sklearn")
        linear_model = types.ModuleType("sklearn.linear_model")
        linear_model.LinearRegression = refuse("LinearRegression")
        linear_model.RANSACRegressor = refuse("RANSACRegressor")
        sklearn.linear_model = linear_model
        sys.modules["sklearn"] = sklearn
        sys.modules["sklearn.linear_model"] = linear_model
        used.append("sklearn")
    if not have("trimesh"):
        sys.modules["trimesh"] = types.ModuleType("trimesh")
        used.append("trimesh")
    return used


def rotation_from_vector(v):
    """Rodrigues' formula: the rotation by |v| radians about v."""
    angle = np.linalg.norm(v)
    if angle == 0.0:
        return np.eye(3)
    k = v / angle
    cross = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + np.sin(angle) * cross + (1.0 - np.cos(angle)) * cross @ cross


def confidences(rng, shape, low_fraction):
    """DA3-like confidences (>= 1, a long tail), with some near zero; multiples of 1/64."""
    conf = 1.0 + rng.gamma(2.0, 2.0, size=shape)
    conf[rng.random(shape) < low_fraction] = rng.random() * 0.2
    return np.round(conf * 64.0) / 64.0


def point_map_case(sim3utils, seed, frames, height, width, irls):
    """Two windows' point maps of the same frames: target = truth(source) + noise, with gross
    outliers, aligned by the official weighted_align_point_maps."""
    rng = np.random.default_rng(seed)
    # A scene in front of the camera: a wavy surface per frame, a little apart.
    rows, columns = np.meshgrid(np.arange(height), np.arange(width), indexing="ij")
    source = np.empty((frames, height, width, 3))
    for f in range(frames):
        x = (columns - width / 2) * 0.15 + 0.3 * f
        y = (rows - height / 2) * 0.15
        z = 4.0 + 0.4 * np.sin(0.7 * x + f) * np.cos(0.5 * y) + 0.2 * rng.standard_normal((height, width))
        source[f] = np.stack([x * z / 4.0, y * z / 4.0, z], axis=-1)
    scale = float(rng.uniform(0.5, 2.0))
    rotation = rotation_from_vector(rng.normal(0.0, 0.4, 3))
    translation = rng.normal(0.0, 1.0, 3)
    target = scale * source @ rotation.T + translation
    target += rng.normal(0.0, 0.01, target.shape)
    outliers = rng.random((frames, height, width)) < 0.15
    target[outliers] += rng.normal(0.0, 1.5, (outliers.sum(), 3))
    source = np.round(source, 6)
    target = np.round(target, 6)
    target_conf = confidences(rng, (frames, height, width), 0.1)
    source_conf = confidences(rng, (frames, height, width), 0.1)
    # The official align_2pcds threshold (DA3_Streaming.align_2pcds in da3_streaming.py, a
    # method of the pipeline class that cannot be called without a model): its one line is
    # restated here.
    conf_threshold = min(np.median(target_conf), np.median(source_conf)) * 0.1
    config = {
        "Model": {
            "align_lib": "numpy",
            "align_method": "sim3",
            "IRLS": {"delta": irls["delta"], "max_iters": irls["max_iters"], "tol": irls["tol"]},
        }
    }
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        s, R, t = sim3utils.weighted_align_point_maps(
            target.copy(), target_conf, source.copy(), source_conf, conf_threshold, config
        )
    rounds = sum(line.startswith("Residuals:") for line in printed.getvalue().splitlines())
    kept = int(((target_conf > conf_threshold) & (source_conf > conf_threshold)).sum())
    return {
        "frames": frames,
        "height": height,
        "width": width,
        "target": target.reshape(-1, 3).tolist(),
        "target_conf": target_conf.reshape(-1).tolist(),
        "source": source.reshape(-1, 3).tolist(),
        "source_conf": source_conf.reshape(-1).tolist(),
        "irls": irls,
        "truth": {"scale": scale, "rotation": rotation.tolist(), "translation": translation.tolist()},
        "official": {
            "conf_threshold": float(conf_threshold),
            "kept_points": kept,
            "scale": float(s),
            "rotation": np.asarray(R).tolist(),
            "translation": np.asarray(t).tolist(),
            "irls_rounds": rounds,
        },
    }


def estimator_case(sim3utils, seed, count, delta, max_iters, tol):
    """weighted_estimate_sim3 and robust_weighted_estimate_sim3 on one set of correspondences."""
    rng = np.random.default_rng(seed)
    source = np.round(rng.normal(0.0, 1.0, (count, 3)) * [2.0, 1.0, 0.5] + [0.0, 0.0, 3.0], 6)
    scale = float(rng.uniform(0.5, 2.0))
    rotation = rotation_from_vector(rng.normal(0.0, 0.6, 3))
    translation = rng.normal(0.0, 1.0, 3)
    target = scale * source @ rotation.T + translation + rng.normal(0.0, 0.02, (count, 3))
    outliers = rng.random(count) < 0.2
    target[outliers] += rng.normal(0.0, 1.0, (outliers.sum(), 3)) + [1.0, 0.5, 0.0]
    target = np.round(target, 6)
    weights = np.round((0.2 + rng.random(count)) * 64.0) / 64.0
    s0, R0, t0 = sim3utils.weighted_estimate_sim3(source, target, weights)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        s, R, t = sim3utils.robust_weighted_estimate_sim3(
            source, target, weights, delta=delta, max_iters=max_iters, tol=tol, align_method="sim3"
        )
    rounds = sum(line.startswith("Residuals:") for line in printed.getvalue().splitlines())
    return {
        "source": source.tolist(),
        "target": target.tolist(),
        "weights": weights.tolist(),
        "delta": delta,
        "max_iters": max_iters,
        "tol": tol,
        "official_weighted": {"scale": float(s0), "rotation": R0.tolist(), "translation": t0.tolist()},
        "official_robust": {
            "scale": float(s),
            "rotation": R.tolist(),
            "translation": t.tolist(),
            "irls_rounds": rounds,
        },
    }


def transform_case(sim3utils, seed):
    """accumulate_sim3_transforms on a few relative transforms, and compute_sim3_ab."""
    rng = np.random.default_rng(seed)

    def random_sim3():
        return (
            float(np.round(rng.uniform(0.5, 1.5), 6)),
            rotation_from_vector(rng.normal(0.0, 0.5, 3)),
            np.round(rng.normal(0.0, 2.0, 3), 6),
        )

    def as_json(transform):
        s, R, t = transform
        return {"scale": float(s), "rotation": np.asarray(R).tolist(), "translation": np.asarray(t).tolist()}

    relative = [random_sim3() for _ in range(5)]
    accumulated = sim3utils.accumulate_sim3_transforms(relative)
    a, b = random_sim3(), random_sim3()
    return {
        "relative": [as_json(x) for x in relative],
        "official_accumulated": [as_json(x) for x in accumulated],
        "common_to_a": as_json(a),
        "common_to_b": as_json(b),
        "official_ab": as_json(sim3utils.compute_sim3_ab(a, b)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkout", type=pathlib.Path, help="a directory holding da3_streaming/")
    parser.add_argument(
        "--output", type=pathlib.Path, default=ROOT / "tests" / "fixtures" / "official_sim3.json"
    )
    arguments = parser.parse_args()
    streaming = arguments.checkout / "da3_streaming"
    if not (streaming / "loop_utils" / "sim3utils.py").is_file():
        sys.exit(f"{streaming}/loop_utils/sim3utils.py not found")
    stand_ins = install_stand_ins()
    sys.path.insert(0, str(streaming))
    sim3utils = importlib.import_module("loop_utils.sim3utils")

    fixture = {
        "generator": "tests/reference/official_sim3.py",
        "numpy": np.__version__,
        "stand_ins": stand_ins,
        "point_maps": [
            point_map_case(sim3utils, 1, 2, 12, 16, {"delta": 0.1, "max_iters": 5, "tol": "1e-9"}),
            point_map_case(sim3utils, 2, 3, 12, 16, {"delta": 0.05, "max_iters": 20, "tol": "1e-9"}),
        ],
        "estimators": [
            estimator_case(sim3utils, 3, 60, 0.1, 5, 1e-9),
            estimator_case(sim3utils, 4, 80, 0.05, 50, 1e-6),
        ],
        "transforms": transform_case(sim3utils, 5),
    }
    arguments.output.write_text(json.dumps(fixture) + "\n")
    print(f"wrote {arguments.output} ({arguments.output.stat().st_size} bytes); stand-ins: {stand_ins}")


if __name__ == "__main__":
    main()
