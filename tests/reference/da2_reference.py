#!/usr/bin/env python3
r"""Reference outputs of the official Depth Anything V2 network for the Rust port's tests.

The official network (github.com/DepthAnything/Depth-Anything-V2, `depth_anything_v2/dpt.py`
for relative depth, `metric_depth/depth_anything_v2/dpt.py` for metric depth) is imported
unmodified from a checkout given by --official, built with the official model_configs (run.py),
filled with the deterministic pseudo-random weights of da3_reference.py (same formula, keyed by
the official state_dict key, so no checkpoint has to be committed), and run in float32 on the
CPU on the synthetic images of da3_reference.py through the official preprocessing
(`image2tensor`) and post-processing (`infer_image`). Outputs go to a directory as a
manifest.json plus raw little-endian float32 files, in the format of da3_reference.py (readable
by tests/common/mod.rs `Fixture::load`; `process_res` there is the official `input_size`).

The weight formula (fnv1a64, uniform_pm1, weight_rule, weight_values), make_image and the
fixture storage come from seeded.py, which da3_reference.py uses too.

xFormers is optional in the official DINOv2 layers; this script makes sure the plain PyTorch
attention path runs (attention.XFORMERS_AVAILABLE is False, forced if xformers is present).

Environment: a virtualenv made by the project's official-da3-venv.sh (torch, numpy,
opencv-python-headless, safetensors); the official code at commit a561b849 (2026-03-24) of
github.com/DepthAnything/Depth-Anything-V2, exported e.g. to /work/da2-official (only the
Python files are needed), with an optional file COMMIT there holding the commit hash that
the manifest records:
    git --git-dir=REPO.git show HEAD:PATH > /work/da2-official/PATH   # per *.py file
    git --git-dir=REPO.git rev-parse HEAD > /work/da2-official/COMMIT
Committed fixtures store `input` (relative vits, 640x427 only) and `depth_preact` in full
(the relative depth is relu(depth_preact); the metric fixture stores `depth` in full),
everything else as 32x32 grid samples plus statistics; intermediates only for 640x427.

Commands that produced the committed fixtures (from the repository root):
    PY=/path/to/venv/bin/python; R=tests/reference/da2_reference.py; F=tests/fixtures
    O=--official=/work/da2-official
    $PY $R $O vits --input-size 196 --compact --full-keys 640x427/input depth_preact --detail \
        --keys-file /work/da2-vits-keys.txt --out $F/da2-vits
    $PY $R $O vitb --input-size 196 --compact --full-keys depth_preact --detail \
        --out $F/da2-vitb
    $PY $R $O vits --metric --max-depth 20 --input-size 196 --compact --full-keys depth \
        --detail --out $F/da2-vits-metric
    $PY $R $O vits --tiny --input-size 196 --compact --full-keys depth_preact 640x427/depth \
        --detail --out $F/da2-tiny
--tiny (TINY below) is the official vits network with a 64-wide, 4-block, 1-head DINOv2
(intermediate_layer_idx [0, 1, 2, 3]) and a 16-feature head (out_channels [8, 16, 32, 64]),
made by patching the official code in memory (patch_tiny), seeded with the same formula; its
fixture stores depth in full for 640x427 only (427x640's depth is relu(depth_preact)).
Other uses:
    $PY $R $O vits --save-checkpoint /tmp/da2-vits-seeded  # depth_anything_v2_vits.pth +
                                                           # model.safetensors
    $PY $R $O vits --check   # copies == da3_reference.py, finite outputs, zero fraction
    $PY $R $O vits --tiny --save-checkpoint /tmp/da2-tiny-seeded  # depth_anything_v2_tiny.pth,
        # input of tests/reference/peer_da2_tiny.py (depth-anything.cpp's converter -> GGUF)
    $PY $R $O vits --timing $F/official_da2_timings.json   # also vitb; --threads 2 --runs 5
        # CPU wall-clock time of the official forward and of infer_image (see `timing`),
        # merged into the JSON under "da2-{encoder}[-metric|-tiny]-{input_size}"
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seeded import (  # noqa: E402  (beside this script)
    FULL_LIMIT,
    fnv1a64_array,
    uniform_pm1,
    uniform_pm1_scalar,
    weight_rule,
    weight_values,
    make_image,
    store,
    safe_name,
    dump_json,
)


# The official README / run.py / metric_depth/run.py model_configs.
MODEL_CONFIGS = {
    "vits": {"encoder": "vits", "features": 64, "out_channels": [48, 96, 192, 384]},
    "vitb": {"encoder": "vitb", "features": 128, "out_channels": [96, 192, 384, 768]},
    "vitl": {"encoder": "vitl", "features": 256, "out_channels": [256, 512, 1024, 1024]},
    "vitg": {"encoder": "vitg", "features": 384, "out_channels": [1536, 1536, 1536, 1536]},
}

# --tiny: the official vits network with a smaller DINOv2 and DPT head, for fast tests. The
# official files are not edited: `patch_tiny` swaps depth_anything_v2.dinov2.vit_small (which the
# official DINOv2("vits") factory calls, keeping its other arguments: img_size 518 -> 37x37
# pos_embed grid, patch 14, init_values 1.0, mlp ffn, no registers, interpolate_offset 0.1) for a
# DinoVisionTransformer with these sizes, and the DepthAnythingV2 is built with the head sizes
# below; intermediate_layer_idx["vits"] is then set on the built network (forward reads it).
TINY = {
    "base_encoder": "vits",
    "embed_dim": 64,
    "depth": 4,
    "num_heads": 1,
    "mlp_ratio": 4,
    "intermediate_layer_idx": [0, 1, 2, 3],
    "features": 16,
    "out_channels": [8, 16, 32, 64],
}


@contextlib.contextmanager
def patch_tiny(dinov2_module):
    """While active, the official DINOv2("vits") builds the tiny DinoVisionTransformer (same
    block_fn / attention class as the official vit_small, sizes from TINY)."""
    from functools import partial

    original = dinov2_module.vit_small

    def vit_tiny(patch_size=16, num_register_tokens=0, **kwargs):
        return dinov2_module.DinoVisionTransformer(
            patch_size=patch_size,
            embed_dim=TINY["embed_dim"],
            depth=TINY["depth"],
            num_heads=TINY["num_heads"],
            mlp_ratio=TINY["mlp_ratio"],
            block_fn=partial(dinov2_module.Block, attn_class=dinov2_module.MemEffAttention),
            num_register_tokens=num_register_tokens,
            **kwargs,
        )

    dinov2_module.vit_small = vit_tiny
    try:
        yield
    finally:
        dinov2_module.vit_small = original


def check_tiny(net) -> None:
    vit = net.pretrained
    assert vit.embed_dim == TINY["embed_dim"] and len(vit.blocks) == TINY["depth"]
    assert vit.num_heads == TINY["num_heads"] and vit.pos_embed.shape == (1, 1370, 64)
    assert vit.blocks[0].mlp.fc1.out_features == TINY["mlp_ratio"] * TINY["embed_dim"]
    assert net.depth_head.scratch.layer1_rn.out_channels == TINY["features"]
    assert [m.out_channels for m in net.depth_head.projects] == TINY["out_channels"]
    assert net.intermediate_layer_idx[net.encoder] == TINY["intermediate_layer_idx"]


def net_config(encoder: str, tiny: bool) -> dict:
    """The DepthAnythingV2 constructor arguments (encoder, features, out_channels)."""
    if not tiny:
        return dict(MODEL_CONFIGS[encoder])
    return {"encoder": TINY["base_encoder"], "features": TINY["features"],
            "out_channels": list(TINY["out_channels"])}


# Values the official classes use by default (DINOv2(...) in dinov2.py, DinoVisionTransformer,
# Block, DPTHead), recorded so the manifest is self-contained.
IMPLIED = {
    "vit": {
        "img_size": 518,
        "patch_size": 14,
        "pos_embed_grid": 37,
        "num_register_tokens": 0,
        "qkv_bias": True,
        "proj_bias": True,
        "ffn_bias": True,
        "ffn_type": "mlp (vitg: swiglufused)",
        "mlp_ratio": 4,
        "act": "GELU (exact erf)",
        "init_values": 1.0,
        "ln_eps": 1e-6,
        "intermediate_norm": "the final pretrained.norm (eps 1e-6) on each taken block output",
        "interpolate_offset": 0.1,
        "interpolate_antialias": False,
        "pos_embed_interpolation": (
            "bicubic (A = -0.75), align_corners False, scale_factor = ((h/14 + 0.1) / 37, "
            "(w/14 + 0.1) / 37) passed as scale_factor (not size), skipped when the grid is "
            "37x37"
        ),
    },
    "head": {
        "use_bn": False,
        "use_clstoken": False,
        "head_features_2": 32,
        "fusion_interpolation": "bilinear, align_corners True (size = next level; x2 for 1)",
        "output_interpolation": "bilinear, align_corners True to (14 * patch_h, 14 * patch_w)",
        "unused": "scratch.refinenet4.resConfUnit1 (refinenet4 gets one input)",
    },
    "preprocess": (
        "image2tensor: BGR uint8 -> cv2 BGR2RGB -> / 255.0 (float64) -> cv2.resize "
        "INTER_CUBIC (float64) to lower_bound / keep_aspect / multiple of 14 -> "
        "(x - mean) / std in float64 -> float32 CHW"
    ),
    "postprocess": "infer_image: bilinear, align_corners True, to the original (h, w)",
}

# The synthetic test images, (width, height): landscape and portrait.
IMAGE_SIZES = [(640, 427), (427, 640)]


# --------------------------------------------------------------------------------------------
# Deterministic weights (the formula is seeded.py's)
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------


def fill_weights(net: torch.nn.Module) -> None:
    """Overwrite every state_dict entry (parameters and buffers) with the formula.

    The DA2 networks have neither tied entries nor non-float buffers (BatchNorm is off,
    use_bn=False); both are checked."""
    seen = set()
    with torch.no_grad():
        for key, tensor in net.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point():
                raise RuntimeError(f"unexpected non-float entry {key}: {tensor.dtype}")
            if tensor.data_ptr() in seen:
                raise RuntimeError(f"unexpected tied entry {key}")
            seen.add(tensor.data_ptr())
            tensor.copy_(torch.from_numpy(weight_values(key, tuple(tensor.shape))))


def weight_known_answers(keys_shapes: list[tuple[str, tuple]]) -> list[dict]:
    """A few values per rule, for testing a formula implementation without the network."""
    seen, out = set(), []
    for key, shape in keys_shapes:
        rule = weight_rule(key, shape)[0]
        if rule in seen:
            continue
        seen.add(rule)
        n = math.prod(shape)
        vals = weight_values(key, shape).reshape(-1)
        for i in sorted({0, 1, n // 2, n - 1}):
            assert abs(uniform_pm1_scalar(key, i) - uniform_pm1(key, i + 1)[i]) == 0.0
            out.append(
                {
                    "key": key,
                    "shape": list(shape),
                    "rule": rule,
                    "index": i,
                    "value": float(vals[i]),
                    "bits": f"0x{int(vals[i:i + 1].view(np.uint32)[0]):08x}",
                }
            )
    return out


# --------------------------------------------------------------------------------------------
# Official network
# --------------------------------------------------------------------------------------------


def import_official(official: Path, metric: bool):
    """The official `depth_anything_v2.dpt` module (relative or metric_depth's copy) and its
    attention module. Both trees name their package depth_anything_v2, so one per process."""
    root = official / "metric_depth" if metric else official
    if not (root / "depth_anything_v2" / "dpt.py").is_file():
        raise SystemExit(f"{root}/depth_anything_v2/dpt.py not found (--official)")
    sys.path.insert(0, str(root))
    import depth_anything_v2.dpt as dpt
    from depth_anything_v2.dinov2_layers import attention, block

    assert Path(dpt.__file__).resolve() == (root / "depth_anything_v2" / "dpt.py").resolve()
    # Plain PyTorch attention (MemEffAttention falls back to Attention.forward).
    attention.XFORMERS_AVAILABLE = False
    block.XFORMERS_AVAILABLE = False
    return dpt


def build_net(dpt, encoder: str, metric: bool, max_depth: float, tiny: bool = False):
    kwargs = net_config(encoder, tiny)
    if metric:
        kwargs["max_depth"] = max_depth
    if not tiny:
        return dpt.DepthAnythingV2(**kwargs).float().eval()
    dinov2 = sys.modules[dpt.__package__ + ".dinov2"]
    assert dpt.DINOv2 is dinov2.DINOv2
    with patch_tiny(dinov2):
        net = dpt.DepthAnythingV2(**kwargs).float().eval()
    net.intermediate_layer_idx[net.encoder] = list(TINY["intermediate_layer_idx"])
    check_tiny(net)
    return net


def checkpoint_name(encoder: str, metric: bool, tiny: bool = False) -> str:
    if tiny:
        encoder = "tiny"
    # run.py: checkpoints/depth_anything_v2_{encoder}.pth; metric_depth/run.py:
    # checkpoints/depth_anything_v2_metric_hypersim_{encoder}.pth (max_depth 20, indoor).
    if metric:
        return f"depth_anything_v2_metric_hypersim_{encoder}.pth"
    return f"depth_anything_v2_{encoder}.pth"


def save_checkpoint(net, encoder: str, metric: bool, directory: Path, tiny: bool = False) -> None:
    """The state dict as the official .pth (torch.save of the plain state dict, as loaded by
    run.py's load_state_dict) and as model.safetensors (same keys, no prefix)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    torch.save(sd, directory / checkpoint_name(encoder, metric, tiny))
    save_file(sd, str(directory / "model.safetensors"))
    # Round trip: the official loading code accepts the .pth.
    loaded = torch.load(directory / checkpoint_name(encoder, metric, tiny), map_location="cpu")
    net.load_state_dict(loaded, strict=True)


# --------------------------------------------------------------------------------------------
# Forward with captured intermediates
# --------------------------------------------------------------------------------------------


def head_capture_points(net) -> list[tuple[str, bool]]:
    """(module name, capture its input instead of its output) for the head stages worth
    comparing (output_conv2's output is DPTHead's, captured as depth_head)."""
    names = []
    for s in range(4):
        names += [(f"depth_head.projects.{s}", False)]
        if s != 2:  # resize_layers.2 is an Identity
            names += [(f"depth_head.resize_layers.{s}", False)]
    for k in range(1, 5):
        names.append((f"depth_head.scratch.layer{k}_rn", False))
    for k in (4, 3, 2, 1):
        names.append((f"depth_head.scratch.refinenet{k}", False))
    names += [
        ("depth_head.scratch.output_conv1", False),
        ("depth_head.scratch.output_conv2", True),
    ]
    return names


# Names of the refinenet outputs in the official DPTHead.forward.
PATH_NAMES = {f"depth_head.scratch.refinenet{k}": f"path_{k}" for k in range(1, 5)}


def run_network(net, raw_bgr: np.ndarray, input_size: int, detail: bool) -> dict:
    """image2tensor + forward + infer_image's resize, all official, float32 on the CPU.

    Arrays: input [1, 3, H, W] (image2tensor's tensor), depth [1, H, W] (forward's output:
    relative: relu(head); metric: head * max_depth; what infer_image resizes), depth_preact
    [1, 1, H, W] (the head's last conv before its activations), depth_original [h, w]
    (infer_image's result). With `detail` also: pos_embed (the interpolated position
    embedding, [1, 1 + N, C]), tokens_in (input of block 0), feat{k} / cls{k} (the normed
    patch / class tokens of intermediate layer k, what the head gets), the head stages
    (path_4..path_1 are the refinenet outputs) and depth_head ("X:in" is module X's input).
    """
    captured: dict[str, torch.Tensor] = {}
    handles = []
    modules = dict(net.named_modules())
    vit = net.pretrained

    def keep(name, t):
        assert name not in captured, name
        captured[name] = t.detach().float().clone()

    x, (h, w) = net.image2tensor(raw_bgr, input_size)
    assert x.dtype == torch.float32 and x.device.type == "cpu"

    # The final 1x1 conv's output, before the activations (relative: two ReLUs, metric:
    # sigmoid * max_depth): the relative depth is exactly relu(depth_preact), and most of it is
    # zero with seeded weights, so depth_preact carries the signal.
    final_conv = net.depth_head.scratch.output_conv2[2]
    assert isinstance(final_conv, torch.nn.Conv2d) and final_conv.out_channels == 1
    handles.append(final_conv.register_forward_hook(lambda m, a, o: keep("depth_preact", o)))

    original_gil = vit.get_intermediate_layers
    original_pos = vit.interpolate_pos_encoding
    if detail:

        def gil(*a, **k):
            out = original_gil(*a, **k)
            for i, (feat, cls) in enumerate(out):
                keep(f"feat{i}", feat)
                keep(f"cls{i}", cls)
            return out

        def pos(*a, **k):
            out = original_pos(*a, **k)
            keep("pos_embed", out)
            return out

        vit.get_intermediate_layers = gil
        vit.interpolate_pos_encoding = pos
        handles.append(
            vit.blocks[0].register_forward_pre_hook(lambda m, a: keep("tokens_in", a[0]))
        )
        handles.append(net.depth_head.register_forward_hook(lambda m, a, o: keep("depth_head", o)))
        for name, with_input in head_capture_points(net):

            def hook(m, a, o, name=name, with_input=with_input):
                if with_input:
                    keep(name + ":in", a[0])
                else:
                    keep(PATH_NAMES.get(name, name), o)

            handles.append(modules[name].register_forward_hook(hook))
    try:
        with torch.inference_mode():
            depth = net.forward(x)
    finally:
        for hnd in handles:
            hnd.remove()
        vit.get_intermediate_layers = original_gil
        vit.interpolate_pos_encoding = original_pos

    # infer_image == image2tensor + forward + this resize; checked against the public call.
    with torch.inference_mode():
        final = F.interpolate(depth[:, None], (h, w), mode="bilinear", align_corners=True)[0, 0]
    public = net.infer_image(raw_bgr, input_size)
    assert np.array_equal(public, final.numpy()), "infer_image differs from its steps"

    result = {
        "input": x,
        "depth": depth.float(),
        "depth_preact": captured.pop("depth_preact"),
        "depth_original": final.float(),
    }
    result.update(captured)
    return result


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def generate(args, net) -> None:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.rglob("*.f32"):
        old.unlink()
    keys_shapes = [(k, tuple(v.shape)) for k, v in net.state_dict().items()]
    detail_images = args.detail_images
    if detail_images is None:
        detail_images = ["640x427"] if args.compact else [f"{w}x{h}" for w, h in args.images]
    images = []
    for w, h in args.images:
        name = f"{w}x{h}"
        rgb = make_image(w, h)
        raw_bgr = np.ascontiguousarray(rgb[:, :, ::-1])  # what cv2.imread would give
        detail = args.detail and name in detail_images
        arrays = run_network(net, raw_bgr, args.input_size, detail)
        x = arrays["input"]
        entry = {
            "name": name,
            "width": w,
            "height": h,
            "processed_width": int(x.shape[-1]),
            "processed_height": int(x.shape[-2]),
            "image_fnv1a64": f"0x{fnv1a64_array(rgb):016x}",
            "image_sha256": hashlib.sha256(rgb.tobytes()).hexdigest(),
            "detail": detail,
            "arrays": {},
        }
        for key, t in arrays.items():
            if key in args.full_keys or f"{name}/{key}" in args.full_keys or not args.compact:
                mode = "full"
            else:
                mode = "samples"
            entry["arrays"][key] = store(t.numpy(), mode, out_dir, f"{name}/{safe_name(key)}")
        images.append(entry)
        d = arrays["depth"]
        zero = float((d == 0).double().mean())
        print(
            f"{name}: processed {x.shape[-1]}x{x.shape[-2]}, depth [{d.min():.4g}, {d.max():.4g}]"
            f" mean {d.mean():.4g}, zero fraction {zero:.3g}",
            file=sys.stderr,
        )

    config = net_config(args.encoder, args.tiny)
    manifest = {
        "model": "depth-anything-v2",
        "encoder": args.encoder,
        **({"variant": "tiny"} if args.tiny else {}),
        "metric": bool(args.metric),
        "max_depth": args.max_depth if args.metric else None,
        "input_size": args.input_size,
        "process_res": args.input_size,  # the name tests/common/mod.rs reads
        "generator": "tests/reference/da2_reference.py",
        "official_code": "github.com/DepthAnything/Depth-Anything-V2 "
        + ("metric_depth/depth_anything_v2/dpt.py" if args.metric else "depth_anything_v2/dpt.py"),
        "official_commit": args.official_commit,
        "torch": torch.__version__,
        "compact": bool(args.compact),
        "config": {
            **config,
            "intermediate_layer_idx": net.intermediate_layer_idx[args.encoder],
            "embed_dim": net.pretrained.embed_dim,
            "depth": len(net.pretrained.blocks),
            "num_heads": net.pretrained.num_heads,
            **({"tiny": TINY, "mlp_hidden": net.pretrained.blocks[0].mlp.fc1.out_features}
               if args.tiny else {}),
            "implied": IMPLIED,
        },
        "weights": {
            "formula": "see tests/reference/seeded.py uniform_pm1 / weight_rule, keyed by "
            "the official state_dict key",
            "tied": [],
            "known_answers": weight_known_answers(keys_shapes),
            "state_dict_entries": len(keys_shapes),
            "parameters": int(sum(math.prod(s) for _, s in keys_shapes)),
        },
        "image_formula": (
            "uint8 [H, W, 3] RGB; v = (128 + (100 * sin(0.043 * x + 0.7 * c)) * cos(0.031 * y - "
            "0.4 * c)) + 20 * sin(0.5 * (x + y)) in float64, round half to even, clamp 0..255; "
            "passed to image2tensor as BGR (channels reversed), as cv2.imread gives"
        ),
        "array_format": {
            "file": "raw little-endian float32, row-major, PyTorch shape",
            "samples": (
                "array viewed as a matrix [prod(shape[:-1]), shape[-1]] (1-D: [1, n]); "
                "values at rows x cols (row-major) of that matrix; each index list is "
                "i_r = ((2r + 1) * n) // (2m), r < m = min(32, n)"
            ),
            "stats": "min, max, mean, population std, over all elements, in float64",
            "full_limit": f"arrays with <= {FULL_LIMIT} elements are stored in full",
            "names": (
                "input: image2tensor's tensor; depth: DepthAnythingV2.forward at the processed "
                "size (relative: relu(head), metric: head * max_depth); depth_original: "
                "infer_image's result at the original size; depth_preact: the output of "
                "depth_head.scratch.output_conv2.2 (last conv) before the activations (relative: "
                "depth == relu(depth_preact) exactly; metric: depth = sigmoid(.) * max_depth); "
                "depth_head: DPTHead's raw output; "
                "feat{k}/cls{k}: normed patch/class tokens of intermediate_layer_idx[k]; "
                "pos_embed: interpolated position embedding; tokens_in: input of block 0; "
                "path_k: refinenet{k} output; 'X:in' is the input of module X"
            ),
        },
        "images": images,
    }
    (out_dir / "manifest.json").write_text(dump_json(manifest))


def write_keys(net, path: str) -> None:
    lines = [f"{k} {list(v.shape)}".replace(", ", ",") for k, v in net.state_dict().items()]
    Path(path).write_text("\n".join(lines) + "\n")


def check(args, net) -> None:
    """The plain attention path runs; outputs are finite and not all zero."""
    for name, m in net.named_modules():
        if name.endswith(".attn"):
            assert type(m).__name__ == "MemEffAttention"
    for w, h in args.images:
        rgb = make_image(w, h)
        a = run_network(net, np.ascontiguousarray(rgb[:, :, ::-1]), args.input_size, True)
        for k in ("depth", "depth_head", "path_1", "feat3"):
            t = a[k]
            print(
                f"{w}x{h} {k} {list(t.shape)}: finite={bool(torch.isfinite(t).all())} "
                f"min={t.min():.6g} max={t.max():.6g} mean={t.mean():.6g} "
                f"zero={float((t == 0).double().mean()):.3g}"
            )


def machine_description() -> dict:
    """As da3_reference.py's (CPU model and flags from /proc/cpuinfo, versions)."""
    cpu = ""
    flags = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu:
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


def timing(args, net) -> None:
    """Median wall time of (1) DepthAnythingV2.forward on image2tensor's tensor (the network
    alone) and (2) the official end-to-end infer_image(raw_bgr, input_size) (image2tensor +
    forward + the bilinear resize back), on make_image at the first --images size (default
    640x427). Each run times one forward then one infer_image, so both see the same load;
    --warmup runs are discarded."""
    import cv2

    torch.set_num_threads(args.threads)
    cv2.setNumThreads(args.threads)  # image2tensor's cvtColor / resize
    w, h = args.images[0]
    raw_bgr = np.ascontiguousarray(make_image(w, h)[:, :, ::-1])
    x, _ = net.image2tensor(raw_bgr, args.input_size)
    assert x.dtype == torch.float32 and x.device.type == "cpu"
    runs = []
    load_before = os.getloadavg()
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        for i in range(args.warmup + args.runs):
            c0, t0 = time.process_time(), time.perf_counter()
            net.forward(x)
            t1, c1 = time.perf_counter(), time.process_time()
            out = net.infer_image(raw_bgr, args.input_size)
            t2, c2 = time.perf_counter(), time.process_time()
            assert out.shape == (h, w)
            if i >= args.warmup:
                runs.append(
                    {
                        "forward_s": t1 - t0,
                        "forward_cpu_s": c1 - c0,
                        "infer_image_s": t2 - t1,
                        "infer_image_cpu_s": c2 - c1,
                    }
                )
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    name = "da2-" + ("tiny" if args.tiny else args.encoder)
    name += ("-metric" if args.metric else "") + f"-{args.input_size}"
    record = {
        "model": "depth-anything-v2",
        "encoder": args.encoder,
        **({"variant": "tiny"} if args.tiny else {}),
        "metric": bool(args.metric),
        "input_size": args.input_size,
        "image": f"{w}x{h}",
        "processed": f"{x.shape[-1]}x{x.shape[-2]}",
        "parameters": int(sum(t.numel() for t in net.state_dict().values())),
        "threads": args.threads,
        "runs": args.runs,
        "warmup": args.warmup,
        "median": med,
        "min_forward_s": min(r["forward_s"] for r in runs),
        "min_infer_image_s": min(r["infer_image_s"] for r in runs),
        "runs_forward_s": [r["forward_s"] for r in runs],
        "runs_infer_image_s": [r["infer_image_s"] for r in runs],
        # Other work on the machine inflates the times; the load average shows how much.
        "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
    }
    path = Path(args.timing)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["machine"] = machine_description()
    data["method"] = (
        "official Depth-Anything-V2 DepthAnythingV2 (depth_anything_v2/dpt.py; metric_depth's "
        "for -metric), seeded weights, float32, autocast off, torch.inference_mode, "
        "torch.set_num_threads(threads) and cv2.setNumThreads(threads), plain PyTorch "
        "attention (no xFormers), CPU, wall-clock seconds (perf_counter); forward_s: "
        "net.forward on image2tensor's [1, 3, H, W] tensor (the network alone); "
        "infer_image_s: the official net.infer_image(raw_bgr, input_size) end to end "
        "(image2tensor preprocessing + forward + bilinear resize to the original size); "
        "*_cpu_s: process CPU time (all threads); each run times forward then infer_image; "
        "warmup runs discarded; medians over runs"
    )
    data.setdefault("results", {})[name] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_json(data))
    print(
        f"{name} {w}x{h} -> {record['processed']}, {args.threads} threads, {args.runs} runs: "
        f"forward median {med['forward_s'] * 1e3:.1f} ms (min {record['min_forward_s'] * 1e3:.1f})"
    )
    print(
        f"{name} {w}x{h} -> {record['processed']}, {args.threads} threads, {args.runs} runs: "
        f"infer_image median {med['infer_image_s'] * 1e3:.1f} ms "
        f"(min {record['min_infer_image_s'] * 1e3:.1f})"
    )


def parse_size(text: str) -> tuple[int, int]:
    w, h = text.lower().split("x")
    return int(w), int(h)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("encoder", choices=list(MODEL_CONFIGS))
    p.add_argument("--official", required=True, help="checkout of Depth-Anything-V2")
    p.add_argument("--metric", action="store_true", help="metric_depth's network")
    p.add_argument(
        "--tiny",
        action="store_true",
        help="the vits network shrunk to TINY's sizes (encoder must be vits)",
    )
    p.add_argument("--max-depth", type=float, default=20.0)
    p.add_argument("--input-size", type=int, default=518)
    p.add_argument("--out", help="write manifest.json and arrays here")
    p.add_argument(
        "--compact",
        action="store_true",
        help="store grid samples + statistics (except --full-keys)",
    )
    p.add_argument(
        "--full-keys",
        nargs="*",
        default=[],
        help="arrays (KEY, or WxH/KEY for one image) stored in full even with --compact",
    )
    p.add_argument("--detail", action="store_true", help="also store intermediates")
    p.add_argument(
        "--detail-images",
        nargs="*",
        help="images (WxH names) whose intermediates are stored "
        "(default: all; with --compact: 640x427)",
    )
    p.add_argument(
        "--images", type=parse_size, nargs="+", default=list(IMAGE_SIZES), help="image sizes WxH"
    )
    p.add_argument("--keys-file", help="write 'key shape' lines of the state dict here")
    p.add_argument(
        "--save-checkpoint",
        metavar="DIR",
        help="save the seeded state dict as the official .pth and as model.safetensors",
    )
    p.add_argument(
        "--timing",
        metavar="JSON",
        help="time forward and infer_image on the first --images size, merge into JSON",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--runs", type=int, default=5, help="timed runs (--timing)")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (--timing)")
    p.add_argument("--check", action="store_true", help="print sanity checks")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    official = Path(args.official).resolve()
    args.official_commit = None
    with contextlib.suppress(OSError):
        args.official_commit = (official / "COMMIT").read_text().strip() or None
    if args.tiny and args.encoder != TINY["base_encoder"]:
        p.error("--tiny patches the vits network: give encoder vits")
    dpt = import_official(official, args.metric)
    net = build_net(dpt, args.encoder, args.metric, args.max_depth, args.tiny)
    fill_weights(net)
    if args.keys_file:
        write_keys(net, args.keys_file)
    if args.save_checkpoint:
        save_checkpoint(net, args.encoder, args.metric, Path(args.save_checkpoint), args.tiny)
    if args.check:
        check(args, net)
    if args.out:
        generate(args, net)
    if args.timing:
        timing(args, net)


if __name__ == "__main__":
    main()
