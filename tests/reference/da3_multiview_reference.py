#!/usr/bin/env python3
r"""Multi-view reference outputs of the official Depth Anything 3 network.

Scenes of several synthetic views (each made and preprocessed exactly as in da3_reference.py,
all reaching the same processed size) go through one float32 forward of the official
DepthAnything3Net, (B = 1, S views), with a reference-view strategy. Recorded per scene:
depth, depth_conf, extrinsics, intrinsics, the camera decoder's input, the reference view the
official backbone chose and the token 0 of every view it chose from. Also: the official
`select_reference_view` on seeded random tokens, for every strategy.

Weights: the formula of da3_reference.py (no checkpoint is committed).

Posed scenes (`posed_scenes` in the manifest): known cameras through the official API's steps
(InputProcessor, `_normalize_extrinsics`, the forward with `cam_enc`, OutputProcessor,
`_align_to_input_extrinsics_intrinsics`); the alignment needs the `evo` and `scipy`
packages, and `huggingface_hub` to import the API module (its export-only imports are
stood in for when missing). Every scene also records the DualDPT ray branch (`ray`,
`ray_conf`).

Example (the committed fixture, from the repository root):
    PY=/path/to/venv/bin/python
    $PY tests/reference/da3_multiview_reference.py --out tests/fixtures/da3-tiny-multiview
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import da3_reference as R  # noqa: E402

from depth_anything_3.model import reference_view_selector  # noqa: E402
from depth_anything_3.model.dinov2 import vision_transformer  # noqa: E402

# (name, view sizes (width, height), strategy). The sizes share the aspect 8:3, so at 112 every
# view is processed to 112 x 42 (8 x 3 patches), at 504 to 504 x 196. Two views never select
# (the reference is view 0); with three, "first" keeps view 0 and "saddle_balanced" (the
# official default) picks by the tokens; five views run every other strategy.
FIVE_VIEWS = [(600, 225), (680, 255), (640, 240), (560, 210), (720, 270)]
SCENES = [
    ("2v", [(640, 240), (600, 225)], "saddle_balanced"),
    ("3v_first", [(640, 240), (600, 225), (680, 255)], "first"),
    ("3v_saddle_balanced", [(600, 225), (680, 255), (640, 240)], "saddle_balanced"),
    ("5v_middle", FIVE_VIEWS, "middle"),
    ("5v_saddle_balanced", FIVE_VIEWS, "saddle_balanced"),
    ("5v_saddle_sim_range", FIVE_VIEWS, "saddle_sim_range"),
]
STRATEGIES = ["first", "middle", "saddle_balanced", "saddle_sim_range"]

# Scenes with known cameras: (name, view sizes, per view (yaw, pitch, roll in degrees,
# camera centre in world units, focal length in pixels of the original image)). "forward"
# records the network forward with the poses normalised as the official API does (two views:
# the official API cannot align their scale, see `run_posed`); "inference" also runs the
# official alignment of the predicted scale to the input poses (Umeyama, via evo).
POSED_SCENES = [
    (
        "2v_posed",
        "forward",
        [(640, 240), (600, 225)],
        [(0.0, 0.0, 0.0, (0.0, 0.0, 0.0), 520.0), (8.0, -3.0, 1.5, (0.6, 0.05, -0.1), 470.0)],
    ),
    (
        "3v_posed",
        "inference",
        [(640, 240), (600, 225), (680, 255)],
        [
            (2.0, 1.0, 0.0, (0.2, -0.1, 0.3), 500.0),
            (-6.0, 2.0, -1.0, (1.5, 0.2, 0.1), 480.0),
            (5.0, -4.0, 2.0, (0.4, 0.9, -0.6), 560.0),
        ],
    ),
]


def camera(width: int, height: int, yaw, pitch, roll, centre, focal):
    """World-to-camera 4x4 and pixel intrinsics 3x3 (float64) of one synthetic view: R from
    Z(roll) @ X(pitch) @ Y(yaw), t = -R @ centre; principal point near the image centre."""
    import numpy as np

    a, b, c = (np.deg2rad(v) for v in (yaw, pitch, roll))
    ry = np.array([[np.cos(a), 0, np.sin(a)], [0, 1, 0], [-np.sin(a), 0, np.cos(a)]])
    rx = np.array([[1, 0, 0], [0, np.cos(b), -np.sin(b)], [0, np.sin(b), np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    r = rz @ rx @ ry
    ext = np.eye(4)
    ext[:3, :3] = r
    ext[:3, 3] = -r @ np.asarray(centre, dtype=np.float64)
    k = np.array(
        [[focal, 0.0, width / 2 + 3.5], [0.0, focal * 1.02, height / 2 - 2.25], [0.0, 0.0, 1.0]]
    )
    return ext, k


def official_api():
    """`depth_anything_3.api.DepthAnything3`, importing with stand-ins for the export-only
    packages it pulls in (moviepy, plyfile, matplotlib, pycolmap, trimesh: not used by the
    steps called here) when they are not installed. The alignment needs evo and scipy."""
    from unittest import mock

    for _ in range(16):
        try:
            from depth_anything_3.api import DepthAnything3

            return DepthAnything3
        except ModuleNotFoundError as e:
            if e.name.startswith(("depth_anything_3", "evo", "scipy", "torch", "numpy")):
                raise
            sys.modules[e.name] = mock.MagicMock()
            for k in [k for k in sys.modules if k.startswith("depth_anything_3.api")]:
                del sys.modules[k]
            for k in [k for k in sys.modules if k.startswith("depth_anything_3.utils.export")]:
                del sys.modules[k]
    raise RuntimeError("could not import depth_anything_3.api")


def run_posed(net, images, extrinsics, intrinsics, process_res: int, mode: str) -> dict:
    """The official API's steps for known poses (api.py `inference`): InputProcessor with the
    cameras, `_normalize_extrinsics`, the network forward with them, OutputProcessor and (mode
    "inference") `_align_to_input_extrinsics_intrinsics`. Its Umeyama alignment needs three
    views not on one line: with two, evo raises "Degenerate covariance rank"."""
    import numpy as np

    DepthAnything3 = official_api()
    from depth_anything_3.utils.io.input_processor import InputProcessor
    from depth_anything_3.utils.io.output_processor import OutputProcessor

    imgs, ex, ix = InputProcessor()(
        images, extrinsics.copy(), intrinsics.copy(), process_res, "upper_bound_resize",
        num_workers=1,
    )
    ex_t, in_t = ex[None].float(), ix[None].float()
    ex_norm = DepthAnything3._normalize_extrinsics(None, ex_t.clone())
    captured = {}
    hooks = [
        net.cam_enc.register_forward_hook(
            lambda m, a, o: captured.update(pose_tokens=o.detach().float().clone())
        ),
        net.cam_dec.register_forward_hook(
            lambda m, a, o: captured.update(cam_input=a[0].detach().float().clone())
        ),
    ]
    try:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            out = net(imgs[None].float(), ex_norm, in_t)
    finally:
        for h in hooks:
            h.remove()
    arrays = {
        "processed_intrinsics": ix.float(),
        "normalized_extrinsics": ex_norm[0].float(),
        "pose_tokens": captured["pose_tokens"][0],
        "cam_token": captured["cam_input"][0],
        "net_depth": out["depth"][0].float(),
        "net_depth_conf": out["depth_conf"][0].float(),
        "net_extrinsics": out["extrinsics"][0].float(),
        "net_intrinsics": out["intrinsics"][0].float(),
    }
    result = {"arrays": arrays, "width": int(imgs.shape[-1]), "height": int(imgs.shape[-2])}
    if mode == "inference":
        pred = OutputProcessor()(out)
        pred = DepthAnything3._align_to_input_extrinsics_intrinsics(None, ex, ix, pred)
        from depth_anything_3.utils.pose_align import align_poses_umeyama

        _, _, scale = align_poses_umeyama(out["extrinsics"][0].numpy(), ex.numpy())
        arrays["depth"] = torch.from_numpy(np.asarray(pred.depth)).float()
        arrays["extrinsics"] = torch.from_numpy(np.asarray(pred.extrinsics)).float()
        arrays["intrinsics"] = torch.from_numpy(np.asarray(pred.intrinsics)).float()
        result["scale"] = float(scale)
    return result


def run_scene(net, x: torch.Tensor, strategy: str) -> dict:
    """One forward; the selection the backbone made (if any) is recorded from inside."""
    chosen = {}
    original = vision_transformer.select_reference_view

    def recording(tokens, strategy="saddle_balanced"):
        b_idx = original(tokens, strategy=strategy)
        chosen["token0"] = tokens[:, :, 0].detach().float().clone()
        chosen["b_idx"] = int(b_idx[0])
        return b_idx

    captured = {}
    handle = net.cam_dec.register_forward_hook(
        lambda m, a, o: captured.update(cam_input=a[0].detach().float().clone())
    )
    head_hook = net.head.register_forward_hook(
        lambda m, a, o: captured.update(
            ray=o["ray"].detach().float().clone(), ray_conf=o["ray_conf"].detach().float().clone()
        )
    )
    vision_transformer.select_reference_view = recording
    try:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            out = net(x, ref_view_strategy=strategy)
    finally:
        vision_transformer.select_reference_view = original
        handle.remove()
        head_hook.remove()
    arrays = {
        "depth": out["depth"].float(),
        "depth_conf": out["depth_conf"].float(),
        "extrinsics": out["extrinsics"].float(),
        "intrinsics": out["intrinsics"].float(),
        "cam_token": captured["cam_input"],
        # The DualDPT auxiliary outputs (the official forward drops them when it decodes
        # poses with the camera decoder): ray [S, h, w, 6], ray_conf [S, h, w].
        "ray": captured["ray"],
        "ray_conf": captured["ray_conf"],
    }
    if "token0" in chosen:
        arrays["selection_token0"] = chosen["token0"]
    return {"arrays": arrays, "reference": chosen.get("b_idx", 0), "selected": "b_idx" in chosen}


def selector_cases() -> list[dict]:
    """The official selection on seeded normal tokens (B = 1, N = 1), for every strategy."""
    cases = []
    for seed, (views, dim) in enumerate([(3, 8), (4, 8), (5, 16), (6, 16), (7, 8), (3, 4)]):
        g = torch.Generator().manual_seed(seed)
        tokens = torch.randn(1, views, 1, dim, generator=g)
        if seed % 2 == 1:
            tokens = tokens + 0.5 * torch.arange(views).view(1, views, 1, 1)  # norms differ
        picks = {
            s: int(reference_view_selector.select_reference_view(tokens, strategy=s)[0])
            for s in STRATEGIES
        }
        cases.append(
            {
                "views": views,
                "dim": dim,
                "tokens": [float(v) for v in tokens.reshape(-1).tolist()],
                "picks": picks,
            }
        )
    return cases


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="da3-tiny", choices=R.PRESETS)
    p.add_argument("--process-res", type=int, default=112)
    args = p.parse_args()

    torch.set_grad_enabled(False)
    net = R.build_net(args.preset)
    R.fill_weights(net)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.rglob("*.f32"):
        old.unlink()
    scenes = []
    for name, sizes, strategy in SCENES:
        xs = []
        for w, h in sizes:
            _, x = R.preprocess(R.make_image(w, h), args.process_res, "upper_bound_resize")
            xs.append(x)
        shapes = {tuple(x.shape[-2:]) for x in xs}
        assert len(shapes) == 1, f"{name}: views reach different sizes {shapes}"
        x = torch.cat(xs, dim=1)  # [1, S, 3, H, W]
        result = run_scene(net, x, strategy)
        entry = {
            "name": name,
            "views": [{"width": w, "height": h} for w, h in sizes],
            "processed_width": int(x.shape[-1]),
            "processed_height": int(x.shape[-2]),
            "strategy": strategy,
            "reference": result["reference"],
            "selected": result["selected"],
            "arrays": {},
        }
        for key, t in result["arrays"].items():
            entry["arrays"][key] = R.store(t[0].numpy(), "full", out_dir, f"{name}/{key}")
        if result["selected"]:
            tok = result["arrays"]["selection_token0"]
            entry["official_picks_on_token0"] = {
                s: int(reference_view_selector.select_reference_view(tok[:, :, None], s)[0])
                for s in STRATEGIES
            }
        scenes.append(entry)
        d = result["arrays"]["depth"]
        print(
            f"{name}: {len(sizes)} views at {x.shape[-1]}x{x.shape[-2]}, {strategy} -> "
            f"reference {result['reference']}, depth [{d.min():.4g}, {d.max():.4g}]",
            file=sys.stderr,
        )
    posed = []
    for name, mode, sizes, cams in POSED_SCENES:
        import numpy as np

        images = [R.make_image(w, h) for w, h in sizes]
        pairs = [camera(w, h, *c) for (w, h), c in zip(sizes, cams)]
        extrinsics = np.stack([e for e, _ in pairs])
        intrinsics = np.stack([k for _, k in pairs])
        result = run_posed(net, images, extrinsics, intrinsics, args.process_res, mode)
        entry = {
            "name": name,
            "mode": mode,
            "views": [
                {
                    "width": w,
                    "height": h,
                    "extrinsics": e.tolist(),
                    "intrinsics": k.tolist(),
                }
                for (w, h), (e, k) in zip(sizes, pairs)
            ],
            "processed_width": result["width"],
            "processed_height": result["height"],
            "arrays": {},
        }
        if "scale" in result:
            entry["scale"] = result["scale"]
        for key, t in result["arrays"].items():
            entry["arrays"][key] = R.store(t.numpy(), "full", out_dir, f"{name}/{key}")
        posed.append(entry)
        print(f"{name}: {len(sizes)} views, {mode}, scale {result.get('scale')}", file=sys.stderr)
    manifest = {
        "preset": args.preset,
        "process_res": args.process_res,
        "generator": "tests/reference/da3_multiview_reference.py",
        "official_package": "depth-anything-3==0.1.1",
        "torch": torch.__version__,
        "array_format": (
            "raw little-endian float32, row-major; shapes without the batch dim: depth and "
            "depth_conf [S, H, W], extrinsics [S, 3, 4] (world-to-camera), intrinsics "
            "[S, 3, 3], cam_token [S, 2 * embed] (camera decoder input), ray [S, h, w, 6] and "
            "ray_conf [S, h, w] (the DualDPT auxiliary head at 8/14 of the processed size), "
            "selection_token0 "
            "[S, embed] (token 0 of every view before block alt_start - 1, in input order); "
            "posed scenes: processed_intrinsics [S, 3, 3] (the InputProcessor's), "
            "normalized_extrinsics [S, 4, 4] (the network's camera input), pose_tokens "
            "[S, embed] (camera encoder output), net_* (network outputs before alignment), "
            "depth, depth_conf, extrinsics, intrinsics (after the official alignment)"
        ),
        "scenes": scenes,
        "posed_scenes": posed,
        "selector_cases": selector_cases(),
    }
    (out_dir / "manifest.json").write_text(R.dump_json(manifest))


if __name__ == "__main__":
    main()
