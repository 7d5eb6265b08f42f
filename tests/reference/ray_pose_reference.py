#!/usr/bin/env python3
r"""Reference outputs of the official ray-based pose (`use_ray_pose=True`).

The official solver (`utils/ray_utils.py`) draws its RANSAC samples with an unseeded
`torch.randperm`; here `get_params_for_ransac` is replaced by one that returns samples drawn
from a seeded NumPy generator, and the samples are recorded, so the Rust solver can be run on
the same ones.

Recorded (`manifest.json`, numbers inline):
- `scenes`: the multi-view scenes of da3_multiview_reference.py (same synthetic weights and
  images) through the official forward with `use_ray_pose=True`: extrinsics [S, 3, 4]
  (world-to-camera) and intrinsics [S, 3, 3] at the processed size, and the samples.
- `cameras`: ray maps of pinhole cameras with outliers (built here, inputs recorded) through
  `get_extrinsic_from_camray` alone, and the same conversion to extrinsics and intrinsics as
  the forward does.

Example (the committed fixture, from the repository root):
    PY=/path/to/venv/bin/python
    $PY tests/reference/ray_pose_reference.py --out tests/fixtures/ray-pose
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import da3_multiview_reference as MV  # noqa: E402
import da3_reference as R  # noqa: E402

from depth_anything_3.utils import ray_utils  # noqa: E402
from depth_anything_3.utils.geometry import affine_inverse  # noqa: E402

SAMPLES_SEED = 20261201


def seeded_params(recorded: list):
    """A stand-in for `get_params_for_ransac` with seeded samples (same counts)."""
    rng = np.random.default_rng(SAMPLES_SEED)

    def params(n, device):
        n_iter, num_sample, sample_ratio = 100, 8, 0.3
        n_sample = max(num_sample, int(n * sample_ratio))
        idx = np.stack([rng.permutation(n_sample)[:num_sample] for _ in range(n_iter)])
        recorded.append(idx.tolist())
        return n_iter, num_sample, n_sample, torch.from_numpy(idx).to(device)

    return params


def pose_outputs(ray: torch.Tensor, conf: torch.Tensor, width: int, height: int):
    """The forward's `_process_ray_pose_estimation` on ray [B, S, h, w, 6], conf [B, S, h, w]."""
    ext, focal, pp = ray_utils.get_extrinsic_from_camray(ray, conf[..., None], ray.shape[-3], ray.shape[-2])
    ext = affine_inverse(ext)[:, :, :3, :]
    k = torch.eye(3)[None, None].repeat(ext.shape[0], ext.shape[1], 1, 1)
    k[:, :, 0, 0] = focal[:, :, 0] / 2 * width
    k[:, :, 1, 1] = focal[:, :, 1] / 2 * height
    k[:, :, 0, 2] = pp[:, :, 0] * width * 0.5
    k[:, :, 1, 2] = pp[:, :, 1] * height * 0.5
    return ext, k


def pinhole_rays(rot, centre, k, image, shape, outlier_every, rng):
    """Ray map [h, w, 6] of a pinhole camera (camera-to-world `rot`, `centre`, intrinsics
    fx, fy, cx, cy in pixels of `image`), ray pixel centres, with outliers; confidence [h, w]."""
    h, w = shape
    ys, xs = np.mgrid[0:h, 0:w].astype(np.float64)
    px = (xs + 0.5) / w * image[0]
    py = (ys + 0.5) / h * image[1]
    cam = np.stack([(px - k[2]) / k[0], (py - k[3]) / k[1], np.ones_like(px)], -1)
    dirs = cam @ np.asarray(rot).T
    rays = np.concatenate([dirs, np.broadcast_to(centre, dirs.shape)], -1)
    rays = rays + rng.normal(0, 1e-3, rays.shape)
    conf = 1.0 + rng.random((h, w))
    flat = rays.reshape(-1, 6)
    bad = np.arange(0, h * w, outlier_every)
    flat[bad, :3] = rng.normal(0, 1, (len(bad), 3))
    conf.reshape(-1)[bad] = 0.5 + rng.random(len(bad))
    return rays.astype(np.float32), conf.astype(np.float32)


def rotation(yaw, pitch, roll):
    a, b, c = (np.deg2rad(v) for v in (yaw, pitch, roll))
    ry = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ rx @ ry


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--process-res", type=int, default=112)
    args = p.parse_args()
    torch.set_grad_enabled(False)
    recorded: list = []
    ray_utils.get_params_for_ransac = seeded_params(recorded)

    net = R.build_net("da3-tiny")
    R.fill_weights(net)
    scenes = []
    for name, sizes, strategy in MV.SCENES:
        xs = [R.preprocess(R.make_image(w, h), args.process_res, "upper_bound_resize")[1] for w, h in sizes]
        x = torch.cat(xs, dim=1)
        before = len(recorded)
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            out = net(x, ref_view_strategy=strategy, use_ray_pose=True)
        assert len(recorded) == before + 1, "one RANSAC draw per forward"
        scenes.append(
            {
                "name": name,
                "views": [{"width": w, "height": h} for w, h in sizes],
                "strategy": strategy,
                "processed_width": int(x.shape[-1]),
                "processed_height": int(x.shape[-2]),
                "samples": recorded[-1],
                "extrinsics": out["extrinsics"][0].float().tolist(),
                "intrinsics": out["intrinsics"][0].float().tolist(),
            }
        )
        print(f"{name}: {len(sizes)} views, ray pose", file=sys.stderr)

    rng = np.random.default_rng(7)
    cameras = []
    for i, (angles, centre, k, shape, every) in enumerate(
        [
            ((10.0, -5.0, 2.0), (0.5, -1.0, 2.0), (300.0, 280.0, 252.0, 168.0), (24, 36), 10),
            ((-20.0, 8.0, -3.0), (-2.0, 0.3, 0.1), (420.0, 430.0, 240.0, 190.0), (30, 40), 4),
        ]
    ):
        image = (504, 336)
        rays, conf = pinhole_rays(rotation(*angles), np.asarray(centre), k, image, shape, every, rng)
        ext, kk = pose_outputs(torch.from_numpy(rays)[None, None], torch.from_numpy(conf)[None, None], *image)
        cameras.append(
            {
                "name": f"pinhole{i}",
                "image": list(image),
                "shape": list(shape),
                "rays": rays.reshape(-1).tolist(),
                "confidence": conf.reshape(-1).tolist(),
                "samples": recorded[-1],
                "extrinsics": ext[0, 0].tolist(),
                "intrinsics": kk[0, 0].tolist(),
            }
        )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "generator": "tests/reference/ray_pose_reference.py",
        "official_package": "depth-anything-3==0.1.1",
        "torch": torch.__version__,
        "process_res": args.process_res,
        "layout": "rays [h, w, 6] row-major (direction xyz, origin xyz), confidence [h, w]; samples [100, 8] index the rays sorted by confidence, most confident first",
        "scenes": scenes,
        "cameras": cameras,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest))
    print(f"wrote {out_dir / 'manifest.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
