#!/usr/bin/env python3
r"""3D Gaussians of the official Depth Anything 3 network (`infer_gs=True`) on seeded weights.

The network is da3-tiny (da3_reference.py) with the official 3DGS head and adapter added as
DA3-GIANT's config declares them (`GSDPT`, `output_dim` 38; `GaussianAdapter`, SH degree 2,
depth and xy offsets, scales in [1e-5, 30]), at da3-tiny's head widths: "da3-tiny-gs". Weights:
the formula of seeded.py, keyed by the state-dict names (`gs_head.*` included).

Recorded per scene (float32 CPU forward, B = 1, S views, the official forward's own poses):
the shape of the GS head's raw output (`raw_gs` [S, h, w, 37]), depth, extrinsics,
intrinsics and the world-space Gaussians (means, scales, rotations, harmonics
[N, 3, 9], opacities), and for one scene the PLY the official `export_to_gs_ply` writes
(border and depth-percentile pruning, DC only, opacity as a logit, log scales).

Needs, beyond the official package: `e3nn` (the official SH rotation) and `plyfile`.

Examples (the committed fixtures, from the repository root):
    PY=/path/to/venv/bin/python
    $PY tests/reference/da3_gs_reference.py --out tests/fixtures/da3-tiny-gs
    $PY tests/reference/da3_gs_reference.py --preset da3-giant-4 --out tests/fixtures/da3-giant-4-gs
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import da3_reference as R  # noqa: E402

from depth_anything_3.cfg import create_object  # noqa: E402
from depth_anything_3.utils.gsply_helpers import save_gaussian_ply  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

# The fixtures: "da3-tiny-gs" (da3-tiny with the giant's head at da3-tiny's widths, three
# scenes and the PLY), "da3-giant-4" (DA3-GIANT at full width, its official config and heads,
# with 4 blocks: out layers 0-3, the DA3 additions from block 2; one small scene).
PRESETS = ["da3-tiny-gs", "da3-giant-4"]

# The official giant's `gs_head` / `gs_adapter` entries at da3-tiny's head widths.
GS_CONFIG = {
    "gs_head": {
        "__object__": {
            "path": "depth_anything_3.model.gsdpt",
            "name": "GSDPT",
            "args": "as_params",
        },
        "dim_in": 256,
        "output_dim": 38,
        "features": 32,
        "out_channels": [16, 32, 64, 128],
    },
    "gs_adapter": {
        "__object__": {
            "path": "depth_anything_3.model.gs_adapter",
            "name": "GaussianAdapter",
            "args": "as_params",
        },
        "sh_degree": 2,
        "pred_color": False,
        "pred_offset_depth": True,
        "pred_offset_xy": True,
        "gaussian_scale_min": 1e-5,
        "gaussian_scale_max": 30.0,
    },
}

# (name, view sizes (width, height), reference-view strategy, process_res): aspect 8:3, so
# every view is processed to 112 x 42 at 112 and to 70 x 28 at 70 (the scenes are smaller to
# keep the fixture small). Three views with saddle_balanced select by the tokens.
SCENES = [
    ("1v", [(640, 240)], "saddle_balanced", 112),
    ("2v", [(640, 240), (600, 225)], "saddle_balanced", 70),
    ("3v_saddle_balanced", [(600, 225), (680, 255), (640, 240)], "saddle_balanced", 70),
]
# The raw head output is captured for the record (shape checks) but not stored: the tests
# compare the Gaussians, which are made of it.
STORED = ("depth", "extrinsics", "intrinsics", "means", "scales", "rotations", "harmonics",
          "opacities")
# The PLY is written for a scene of at least 32 pixels a side: the official border trim of
# int(8 / 256 x side) pixels is 0 below that, and its `mask[:, 0:-0]` then keeps nothing.
PLY_SCENE = "1v"


GIANT_BLOCKS = 4


def build_net(preset: str) -> torch.nn.Module:
    if preset == "da3-giant-4":
        config = R.load_config(R.MODEL_REGISTRY["da3-giant"])
        config.net.out_layers = list(range(GIANT_BLOCKS))
        config.net.alt_start = config.net.qknorm_start = config.net.rope_start = 2
        original = R.official_dinov2.vit_giant2
        # The official giant factory with fewer blocks (DinoV2 looks it up when it builds).
        R.official_dinov2.vit_giant2 = lambda **kw: original(depth=GIANT_BLOCKS, **kw)
        try:
            net = create_object(config)
        finally:
            R.official_dinov2.vit_giant2 = original
        return net.float().eval()
    config = copy.deepcopy(R.TINY_CONFIG)
    config.update(GS_CONFIG)
    with R.custom_vit_size(**R.TINY_VIT):
        net = create_object(OmegaConf.create(config))
    return net.float().eval()


def preset_config(preset: str) -> dict:
    if preset == "da3-giant-4":
        return {"yaml": "configs/da3-giant.yaml", "blocks": GIANT_BLOCKS, "out_layers":
                list(range(GIANT_BLOCKS)), "alt_qknorm_rope_start": 2}
    return {"yaml": {**R.TINY_CONFIG, **GS_CONFIG}, "vit": R.TINY_VIT}


def run_scene(net, x: torch.Tensor, strategy: str) -> dict:
    captured = {}
    hook = net.gs_head.register_forward_hook(
        lambda m, a, o: captured.update(
            raw_gs=o["raw_gs"].detach().float().clone(),
            raw_gs_conf=o["raw_gs_conf"].detach().float().clone(),
        )
    )
    try:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            out = net(x, infer_gs=True, ref_view_strategy=strategy)
    finally:
        hook.remove()
    g = out["gaussians"]
    return {
        "raw_gs": captured["raw_gs"],
        "raw_gs_conf": captured["raw_gs_conf"],
        "depth": out["depth"].float(),
        "extrinsics": out["extrinsics"].float(),
        "intrinsics": out["intrinsics"].float(),
        "means": g.means.float(),
        "scales": g.scales.float(),
        "rotations": g.rotations.float(),
        "harmonics": g.harmonics.float(),
        "opacities": g.opacities.float(),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True)
    p.add_argument("--preset", default="da3-tiny-gs", choices=PRESETS)
    args = p.parse_args()

    torch.set_grad_enabled(False)
    net = build_net(args.preset)
    tied = R.fill_weights(net)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.rglob("*.f32")) + list(out_dir.rglob("*.ply")):
        old.unlink()
    scenes = []
    scenes_of_preset = SCENES if args.preset == "da3-tiny-gs" else [SCENES[1]]
    for name, sizes, strategy, process_res in scenes_of_preset:
        xs = []
        for w, h in sizes:
            _, x = R.preprocess(R.make_image(w, h), process_res, "upper_bound_resize")
            xs.append(x)
        x = torch.cat(xs, dim=1)  # [1, S, 3, H, W]
        arrays = run_scene(net, x, strategy)
        entry = {
            "name": name,
            "views": [{"width": w, "height": h} for w, h in sizes],
            "processed_width": int(x.shape[-1]),
            "processed_height": int(x.shape[-2]),
            "process_res": process_res,
            "strategy": strategy,
            "arrays": {
                key: R.store(t[0].numpy(), "full", out_dir, f"{name}/{key}")
                for key, t in arrays.items()
                if key in STORED
            },
            "raw_gs_shape": list(arrays["raw_gs"].shape[1:]),
        }
        if name == PLY_SCENE:
            # What the official export_to_gs_ply writes for this prediction.
            ply = out_dir / name / "gs.ply"
            save_gaussian_ply(
                gaussians=net_gaussians(arrays),
                save_path=str(ply),
                ctx_depth=arrays["depth"][0].unsqueeze(-1),
                shift_and_scale=False,
                save_sh_dc_only=True,
                gs_views_interval=1,
                inv_opacity=True,
                prune_by_depth_percent=0.9,
                prune_border_gs=True,
                match_3dgs_mcmc_dev=False,
            )
            entry["ply"] = f"{name}/gs.ply"
        scenes.append(entry)
        m = arrays["means"]
        print(
            f"{name}: {len(sizes)} views at {x.shape[-1]}x{x.shape[-2]}, {m.shape[1]} gaussians, "
            f"means [{m.min():.4g}, {m.max():.4g}]",
            file=sys.stderr,
        )
    manifest = {
        "preset": args.preset,
        "generator": "tests/reference/da3_gs_reference.py",
        "official_package": "depth-anything-3==0.1.1",
        "torch": torch.__version__,
        "config": preset_config(args.preset),
        "tied": tied,
        "scenes": scenes,
    }
    (out_dir / "manifest.json").write_text(R.dump_json(manifest))


def net_gaussians(arrays: dict):
    from depth_anything_3.specs import Gaussians

    return Gaussians(
        means=arrays["means"],
        scales=arrays["scales"],
        rotations=arrays["rotations"],
        harmonics=arrays["harmonics"],
        opacities=arrays["opacities"],
    )


if __name__ == "__main__":
    main()
