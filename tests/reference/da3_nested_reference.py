#!/usr/bin/env python3
r"""Reference outputs of the official nested Depth Anything 3 network (NestedDepthAnything3Net).

The official class pairs an any-view model with a metric model and aligns the first to the
second (`_apply_metric_scaling`, `_apply_depth_alignment`, `_handle_sky_regions`). The
published pair is giant + metric-large; the class takes any two configs, so the reference pairs
da3-tiny (the any-view branch of the other fixtures) with `da3metric-tiny`: the official
da3metric-large config (plain ViT, DPT head with sky) at a tiny size (ViT 64/4/1, head
features 16, out channels 8-64: METRIC_VIT and `metric_tiny_config`). Weights: the formula
of da3_reference.py, filled per branch (keys as in a standalone model of that branch).

Scenes of 1, 2 and 3 views (made and preprocessed as in da3_reference.py, at 112) go through
one float32 forward each. Their pixels stay under the 100 000 above which the official code
samples its quantiles at random, so the outputs are deterministic. Recorded per scene: the
nested depth, depth_conf, extrinsics, intrinsics and scale factor; the metric branch's head
outputs (depth before its own sky fill, sky); the reference view.

With --peer-repo (a checkout of github.com/CloudEngineHub/depth-anything.cpp) and
--peer-metric-out, the metric branch is also written as a GGUF file by that project's own
nested converter (`convert_nested_to_gguf.write_metric_gguf`, the `m_vit.` / `m_head.` layout
of its `depth-anything-nested-metric.gguf`); it needs the `gguf` package.

Example (the committed fixture, from the repository root):
    PY=/path/to/venv/bin/python
    $PY tests/reference/da3_nested_reference.py --out tests/fixtures/da3-tiny-nested \
        --peer-repo /path/to/depth-anything.cpp \
        --peer-commit 54abd5c0abfd1f394e01cb3c38f2e3af4daedf85 \
        --peer-metric-out tests/fixtures/da3-tiny-nested/peer-metric-tiny-f32.gguf
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from unittest import mock

import torch
from omegaconf import OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parent))
import da3_reference as R  # noqa: E402

from depth_anything_3.cfg import load_config  # noqa: E402
from depth_anything_3.model.da3 import NestedDepthAnything3Net  # noqa: E402
from depth_anything_3.registry import MODEL_REGISTRY  # noqa: E402

# (name, view sizes (width, height), strategy): every view of a scene reaches one processed
# size at 112 (112 x 70 for 640 x 427; 112 x 42 for the 8:3 ones).
SCENES = [
    ("1v", [(640, 427)], "saddle_balanced"),
    ("2v", [(640, 240), (600, 225)], "saddle_balanced"),
    ("3v_saddle_balanced", [(600, 225), (680, 255), (640, 240)], "saddle_balanced"),
]


# The metric branch's ViT: as small as a DA3 ViT goes (head_dim 64, four out layers), so that
# the committed file written by depth-anything.cpp's converter stays small.
METRIC_VIT = {"embed_dim": 64, "depth": 4, "num_heads": 1, "mlp_ratio": 4}


def metric_tiny_config() -> dict:
    """The official da3metric-large config at a tiny size (the ViT of METRIC_VIT through
    R.custom_vit_size, out layers 0-3, head features 16 and out channels 8-64)."""
    cfg = OmegaConf.to_container(load_config(MODEL_REGISTRY["da3metric-large"]))
    cfg = copy.deepcopy(cfg)
    cfg["net"]["name"] = "vits"  # the custom size while custom_vit_size is active
    cfg["net"]["out_layers"] = [0, 1, 2, 3]
    cfg["head"]["dim_in"] = METRIC_VIT["embed_dim"]
    cfg["head"]["features"] = 16
    cfg["head"]["out_channels"] = [8, 16, 32, 64]
    return cfg


def build_nested() -> NestedDepthAnything3Net:
    # Each branch's DinoV2 looks its ViT size up when it is built.
    with R.custom_vit_size(**R.TINY_VIT):
        anyview = OmegaConf.create(R.TINY_CONFIG)
        net = NestedDepthAnything3Net(anyview, OmegaConf.create({"__object__": {
            "path": "torch.nn", "name": "Identity", "args": "as_params"}}))
    with R.custom_vit_size(**METRIC_VIT):
        from depth_anything_3.cfg import create_object

        net.da3_metric = create_object(OmegaConf.create(metric_tiny_config()))
    net = net.float().eval()
    R.fill_weights(net.da3)
    R.fill_weights(net.da3_metric)
    return net


def run_scene(net, x: torch.Tensor, strategy: str) -> dict:
    captured = {}

    def on_metric_head(_m, _args, out):
        captured["metric_depth_raw"] = out["depth"].detach().float().clone()
        captured["metric_sky"] = out["sky"].detach().float().clone()

    def on_anyview(_m, _args, out):
        captured["anyview_depth"] = out["depth"].detach().float().clone()

    hooks = [
        net.da3_metric.head.register_forward_hook(on_metric_head),
        net.da3.register_forward_hook(on_anyview),
    ]
    try:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            out = net(x, ref_view_strategy=strategy)
    finally:
        for h in hooks:
            h.remove()
    arrays = {
        "depth": out["depth"].float(),
        "depth_conf": out["depth_conf"].float(),
        "extrinsics": out["extrinsics"].float(),
        "intrinsics": out["intrinsics"].float(),
        **captured,
    }
    return {"arrays": arrays, "scale_factor": float(out["scale_factor"])}


def write_peer_metric(net, repo: Path, out: Path) -> None:
    """The metric branch through depth-anything.cpp's own nested converter."""
    sys.path.insert(0, str(repo))
    # The converter module imports e3nn (for the any-view branch's Gaussian head, not used by
    # write_metric_gguf) first thing; a stand-in is enough.
    sys.modules.setdefault("e3nn", mock.MagicMock())
    sys.modules.setdefault("e3nn.o3", mock.MagicMock())
    sys.modules.setdefault("scripts.da3_reference", mock.MagicMock())
    from scripts.convert_nested_to_gguf import write_metric_gguf

    write_metric_gguf(net.da3_metric, str(out), "DA3NESTED-TINY-metric")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True)
    p.add_argument("--process-res", type=int, default=112)
    p.add_argument("--peer-repo", type=Path)
    p.add_argument("--peer-metric-out", type=Path)
    p.add_argument("--peer-commit", help="the depth-anything.cpp commit of --peer-repo")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    torch.manual_seed(0)
    net = build_nested()
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
        pixels = x.shape[1] * x.shape[-2] * x.shape[-1]
        assert pixels <= 100_000, "the official code would sample its quantiles at random"
        result = run_scene(net, x, strategy)
        sky = result["arrays"]["metric_sky"]
        entry = {
            "name": name,
            "views": [{"width": w, "height": h} for w, h in sizes],
            "processed_width": int(x.shape[-1]),
            "processed_height": int(x.shape[-2]),
            "strategy": strategy,
            "scale_factor": result["scale_factor"],
            "sky_fraction": float((sky >= 0.3).float().mean()),
            "arrays": {},
        }
        for key, t in result["arrays"].items():
            entry["arrays"][key] = R.store(t[0].numpy(), "full", out_dir, f"{name}/{key}")
        scenes.append(entry)
        print(
            f"{name}: {len(sizes)} views at {x.shape[-1]}x{x.shape[-2]}, scale "
            f"{result['scale_factor']:.6g}, sky fraction {entry['sky_fraction']:.3f}",
            file=sys.stderr,
        )
    manifest = {
        "anyview_preset": "da3-tiny",
        "metric_config": metric_tiny_config(),
        "metric_vit": METRIC_VIT,
        "process_res": args.process_res,
        "generator": "tests/reference/da3_nested_reference.py",
        "official_package": "depth-anything-3==0.1.1",
        "official_class": "depth_anything_3.model.da3.NestedDepthAnything3Net",
        "torch": torch.__version__,
        "array_format": (
            "raw little-endian float32, row-major; shapes without the batch dim: depth, "
            "depth_conf, metric_* [S, H, W], extrinsics [S, 3, 4] world-to-camera, "
            "intrinsics [S, 3, 3]"
        ),
        "scenes": scenes,
    }
    if args.peer_repo and args.peer_metric_out:
        write_peer_metric(net, args.peer_repo, args.peer_metric_out)
        manifest["peer_metric_file"] = {
            "file": args.peer_metric_out.name,
            "writer": "depth-anything.cpp scripts/convert_nested_to_gguf.py write_metric_gguf",
            "commit": args.peer_commit,
        }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
