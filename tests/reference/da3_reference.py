#!/usr/bin/env python3
r"""Reference outputs of the official Depth Anything 3 network for the Rust port's tests.

The official network (PyPI package depth-anything-3==0.1.1) is built from the package's own
yaml configs, filled with deterministic pseudo-random weights (a formula that the Rust tests
implement too, so no checkpoint has to be committed), and run in float32 on the CPU on
synthetic images. Outputs and intermediates go to a directory as a manifest.json plus raw
little-endian float32 files; see `generate` for the format.

Environment: a virtualenv made by the project's official-da3-venv.sh (torch, torchvision,
depth-anything-3 without its optional dependencies).

Examples (the committed fixtures, from the repository root):
    PY=/path/to/venv/bin/python; R=tests/reference/da3_reference.py; F=tests/fixtures
    $PY $R da3-tiny --process-res 112 --out $F/da3-tiny --detail-images 640x427 \
        --max-full-elems 0 --full-keys tokens_in --store-processed --keys-file $F/da3-tiny/keys.txt
    $PY $R da3-small --compact --out $F/da3-small
    $PY $R da3-base --compact --out $F/da3-base
    $PY $R da3mono-large --compact --images 640x427 --out $F/da3mono-large
    $PY $R da3-small --images 640x427 --timing $F/official_timings.json   # also da3-base
    $PY $R da3-base --save-checkpoint /tmp/da3-base-seeded   # config.json + model.safetensors
    $PY $R da3-small --check   # finite outputs, attention entropy, fused vs unfused attention
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from PIL import Image

from depth_anything_3.cfg import create_object, load_config
from depth_anything_3.model.dinov2 import dinov2 as official_dinov2
from depth_anything_3.model.dinov2.vision_transformer import DinoVisionTransformer
from depth_anything_3.registry import MODEL_REGISTRY
from depth_anything_3.utils.io.input_processor import InputProcessor

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


OFFICIAL_PRESETS = [
    "da3-small",
    "da3-base",
    "da3-large",
    "da3-giant",
    "da3mono-large",
    "da3metric-large",
]
PRESETS = OFFICIAL_PRESETS + ["da3-tiny"]

# The synthetic test images, (width, height): landscape, portrait, square (enlarged at 504, so
# the cubic path runs) and extreme (a second, shrinking resize to a multiple of 14 runs).
IMAGE_SIZES = [(640, 427), (427, 640), (500, 500), (1000, 200)]

# Extra (width, height, process_res) cases for the preprocessing table: every resize branch
# of the official InputProcessor (no-op when the longest side already equals process_res,
# cubic enlarge, area shrink, a second resize up or down to a multiple of 14, tiny images).
PREPROCESS_CASES = [(w, h, r) for r in (504, 112) for (w, h) in IMAGE_SIZES] + [
    (504, 336, 504),
    (300, 200, 504),
    (333, 221, 504),
    (1920, 1080, 504),
    (1080, 1920, 504),
    (17, 900, 504),
    (13, 13, 504),
    (1001, 999, 518),
    (640, 480, 504),
    (640, 480, 280),
    (800, 600, 1008),
]

# da3-tiny: a small network of the DualDPT family, for committed full fixtures. It mirrors
# the official yaml configs (same schema, same classes); only the ViT size is custom (see
# `custom_vit_size`). Hyper-parameters that are class defaults in the official code are
# listed under "implied" so the Rust side can build the same model from this file alone.
TINY_CONFIG = {
    "__object__": {
        "path": "depth_anything_3.model.da3",
        "name": "DepthAnything3Net",
        "args": "as_params",
    },
    "net": {
        "__object__": {
            "path": "depth_anything_3.model.dinov2.dinov2",
            "name": "DinoV2",
            "args": "as_params",
        },
        "name": "vits",  # stands for the custom size while custom_vit_size is active
        "out_layers": [0, 1, 2, 3],
        "alt_start": 2,
        "qknorm_start": 2,
        "rope_start": 2,
        "cat_token": True,
    },
    "head": {
        "__object__": {
            "path": "depth_anything_3.model.dualdpt",
            "name": "DualDPT",
            "args": "as_params",
        },
        "dim_in": 256,
        "output_dim": 2,
        "features": 32,
        "out_channels": [16, 32, 64, 128],
    },
    "cam_enc": {
        "__object__": {
            "path": "depth_anything_3.model.cam_enc",
            "name": "CameraEnc",
            "args": "as_params",
        },
        "dim_out": 128,
    },
    "cam_dec": {
        "__object__": {
            "path": "depth_anything_3.model.cam_dec",
            "name": "CameraDec",
            "args": "as_params",
        },
        "dim_in": 256,
    },
}
TINY_VIT = {"embed_dim": 128, "depth": 4, "num_heads": 2, "mlp_ratio": 4}

# Values the official classes use by default (DinoV2 / DinoVisionTransformer / Block /
# DualDPT / CameraEnc), recorded for da3-tiny so the manifest is self-contained.
TINY_IMPLIED = {
    "vit": {
        "img_size": 518,
        "patch_size": 14,
        "pos_embed_grid": 37,
        "head_dim": 64,
        "mlp_hidden": 512,
        "ffn_type": "mlp",
        "num_register_tokens": 0,
        "qkv_bias": True,
        "proj_bias": True,
        "ffn_bias": True,
        "init_values": 1.0,
        "block_ln_eps": 1e-6,
        "qk_norm_eps": 1e-5,
        "final_norm_eps": 1e-5,
        "rope_freq": 100,
        "interpolate_offset": 0.1,
        "interpolate_antialias": False,
        "camera_token_shape": [1, 2, 128],
    },
    "head": {
        "patch_size": 14,
        "activation": "exp",
        "conf_activation": "expp1",
        "pos_embed": True,
        "down_ratio": 1,
        "aux_pyramid_levels": 4,
        "aux_out1_conv_num": 5,
        "head_names": ["depth", "ray"],
        "head_features_2": 32,
        "norm_eps": 1e-5,
    },
    "cam_enc": {"dim_in": 9, "trunk_depth": 4, "num_heads": 16, "mlp_ratio": 4},
}


# --------------------------------------------------------------------------------------------
# Deterministic weights (the formula is seeded.py's)
# --------------------------------------------------------------------------------------------


def fill_weights(net: torch.nn.Module) -> list[list[str]]:
    """Overwrite every floating-point state_dict entry with the formula.

    Entries that share storage (the ray branch's LayerNorm is one module used by all four
    levels of `head.scratch.output_conv2_aux`) are filled once, from the first key in
    state_dict order; the other keys are returned as tied groups. Non-float buffers would keep
    their defaults, but the DA3 networks have none (checked below).
    """
    first_key_of: dict[tuple[int, tuple], str] = {}
    tied: dict[str, list[str]] = {}
    with torch.no_grad():
        for key, tensor in net.state_dict(keep_vars=True).items():
            if not tensor.is_floating_point():
                raise RuntimeError(f"unexpected non-float entry {key}: {tensor.dtype}")
            ident = (tensor.data_ptr(), tuple(tensor.shape))
            if ident in first_key_of:
                tied.setdefault(first_key_of[ident], []).append(key)
                continue
            first_key_of[ident] = key
            values = weight_values(key, tuple(tensor.shape))
            tensor.copy_(torch.from_numpy(values))
    return [[k] + v for k, v in tied.items()]


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
# Network construction
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def custom_vit_size(embed_dim: int, depth: int, num_heads: int, mlp_ratio: float):
    """Let the official DinoV2 build a ViT of a custom size.

    DinoV2 only accepts the names vits/vitb/vitl/vitg and looks the factory functions up in its
    module's globals when it is constructed, so for the duration of the construction the
    `vit_small` name there is pointed at a factory with the custom size. Everything else
    (DinoV2's own arguments, DinoVisionTransformer's defaults) stays official.
    """

    def factory(patch_size=16, num_register_tokens=0, **kwargs):
        return DinoVisionTransformer(
            patch_size=patch_size,
            embed_dim=embed_dim,
            depth=depth,
            num_heads=num_heads,
            mlp_ratio=mlp_ratio,
            num_register_tokens=num_register_tokens,
            **kwargs,
        )

    original = official_dinov2.vit_small
    official_dinov2.vit_small = factory
    try:
        yield
    finally:
        official_dinov2.vit_small = original


def build_net(preset: str) -> torch.nn.Module:
    if preset == "da3-tiny":
        with custom_vit_size(**TINY_VIT):
            net = create_object(OmegaConf.create(TINY_CONFIG))
    else:
        net = create_object(load_config(MODEL_REGISTRY[preset]))
    return net.float().eval()


def preset_config(preset: str) -> dict:
    if preset == "da3-tiny":
        return {"yaml": TINY_CONFIG, "vit": TINY_VIT, "implied": TINY_IMPLIED}
    return {"yaml": OmegaConf.to_container(load_config(MODEL_REGISTRY[preset]))}


def save_checkpoint(net: torch.nn.Module, preset: str, directory: Path) -> None:
    """Save as the official DepthAnything3 wrapper does (PyTorchModelHubMixin): config.json
    holds the init arguments, model.safetensors the wrapper's state_dict (network under
    `model.`), written by safetensors' save_model, which stores tied tensors once under
    their lexicographically smallest name."""
    from safetensors.torch import save_model

    class Wrapper(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(
        json.dumps({"model_name": preset}, indent=2, sort_keys=True) + "\n"
    )
    save_model(Wrapper(net), str(directory / "model.safetensors"))


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def preprocess(image: np.ndarray, process_res: int, method: str):
    """Official preprocessing. Returns (processed uint8 [H, W, 3], input tensor [1, 1, 3, H, W]).

    The uint8 image comes from the processor's own resize steps (the public call only returns
    the normalised tensor); the assert ties it to the public call's result.
    """
    proc = InputProcessor()
    tensor, _, _ = proc([image], None, None, process_res, method, num_workers=1)
    pil = proc._resize_image(Image.fromarray(image).convert("RGB"), process_res, method)
    if method.endswith("resize"):
        pil = proc._make_divisible_by_resize(pil, proc.PATCH_SIZE)
    else:
        pil = proc._make_divisible_by_crop(pil, proc.PATCH_SIZE)
    processed = np.asarray(pil).copy()
    assert torch.equal(proc._normalize_image(pil), tensor[0])
    return processed, tensor[None].float()


# --------------------------------------------------------------------------------------------
# Forward with captured intermediates
# --------------------------------------------------------------------------------------------


def head_capture_points(net) -> list[tuple[str, bool]]:
    """(module name, also capture its input) for the head stages worth comparing."""
    names = []
    for s in range(4):
        # resize_layers.2 is an Identity: its input is its output.
        names += [(f"head.projects.{s}", False), (f"head.resize_layers.{s}", s != 2)]
    for k in range(1, 5):
        names.append((f"head.scratch.layer{k}_rn", False))
    for k in (4, 3, 2, 1):
        names.append((f"head.scratch.refinenet{k}", False))
    names += [("head.scratch.output_conv1", False), ("head.scratch.output_conv2", True)]
    names += [("head.scratch.sky_output_conv2", False)]
    # The ray branch (DualDPT's aux chain) only feeds the returned ray / ray_conf, which
    # single-image depth discards; those two outputs are captured, its stages are not.
    modules = dict(net.named_modules())
    return [(n, i) for n, i in names if n in modules]


def run_network(net, x: torch.Tensor, detail: bool) -> dict[str, torch.Tensor]:
    """One float32 forward of DepthAnything3Net (no autocast) -> named arrays.

    Outputs: depth (before mono sky post-processing), depth_conf, sky, extrinsics,
    intrinsics, pose_enc, ray, ray_conf and, for mono/metric, depth_sky_postprocessed.
    With `detail` also: tokens_in (input of block 0), backbone.blocks.i (block outputs),
    feat{k} / cam_token{k} (what the head and the camera decoder receive per out layer) and
    the head stages; "name:in" is a module's input. Repeated calls get "[n]" suffixes.
    """
    captured: dict[str, torch.Tensor] = {}
    handles = []
    modules = dict(net.named_modules())

    calls: dict[str, int] = {}

    def keep(name, t):
        n = calls.get(name, 0)
        calls[name] = n + 1
        if n == 1:
            captured[name + "[0]"] = captured.pop(name)
        key = name if n == 0 else f"{name}[{n}]"
        captured[key] = t.detach().float().clone()

    def on_head(_m, _args, out):
        for k, v in out.items():
            keep(f"head_out.{k}", v)

    handles.append(net.head.register_forward_hook(on_head))
    if net.cam_dec is not None:
        handles.append(net.cam_dec.register_forward_hook(lambda m, a, o: keep("pose_enc", o)))
    if detail:
        vit = net.backbone.pretrained
        handles.append(
            vit.blocks[0].register_forward_pre_hook(lambda m, a: keep("tokens_in", a[0]))
        )
        for i, blk in enumerate(vit.blocks):
            handles.append(
                blk.register_forward_hook(lambda m, a, o, i=i: keep(f"backbone.blocks.{i}", o))
            )

        def on_backbone(_m, _args, out):
            feats, _aux = out
            for k, (feat, cam_token) in enumerate(feats):
                keep(f"feat{k}", feat)
                keep(f"cam_token{k}", cam_token)

        handles.append(net.backbone.register_forward_hook(on_backbone))
        # head.norm runs once per stage; DPT (mono/metric) has an Identity there instead.
        if isinstance(modules["head.norm"], torch.nn.LayerNorm):
            handles.append(
                modules["head.norm"].register_forward_hook(lambda m, a, o: keep("head.norm", o))
            )
        for name, with_input in head_capture_points(net):

            def hook(m, a, o, name=name, with_input=with_input):
                if with_input:
                    keep(name + ":in", a[0])
                keep(name, o)

            handles.append(modules[name].register_forward_hook(hook))

    try:
        with torch.inference_mode(), torch.autocast("cpu", enabled=False):
            torch.manual_seed(0)  # mono sky post-processing samples pixels at random
            out = net(x)
    finally:
        for h in handles:
            h.remove()

    result = {"input": x.detach().clone()}
    head_out = {k[len("head_out.") :]: v for k, v in captured.items() if k.startswith("head_out.")}
    result["depth"] = head_out["depth"]
    for k in ("depth_conf", "sky"):
        if k in head_out:
            result[k] = head_out[k]
    if "sky" in head_out:
        result["depth_sky_postprocessed"] = out["depth"].float()
    for k in ("extrinsics", "intrinsics"):
        if k in out:
            result[k] = out[k].float()
    for k in ("ray", "ray_conf"):
        if k in head_out:
            result[k] = head_out[k]
    for k, v in captured.items():
        if not k.startswith("head_out."):
            result[k] = v
    return result


OUTPUT_KEYS = {
    "depth",
    "depth_conf",
    "sky",
    "depth_sky_postprocessed",
    "extrinsics",
    "intrinsics",
    "pose_enc",
}
ALWAYS_FULL = {"extrinsics", "intrinsics", "pose_enc"}
# Compact mode keeps grid samples of these intermediates and only statistics of
# the others, to stay small enough to commit.
COMPACT_SAMPLED = {
    "input",
    "tokens_in",
    "feat0",
    "feat1",
    "feat2",
    "feat3",
    "head.scratch.output_conv2",
}


# --------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------


def generate(args, net, tied) -> None:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in list(out_dir.rglob("*.f32")) + list(out_dir.rglob("*.u8")):
        old.unlink()
    keys_shapes = [(k, tuple(v.shape)) for k, v in net.state_dict().items()]
    detail_images = args.detail_images
    if detail_images is None:
        detail_images = ["640x427"] if args.compact else [f"{w}x{h}" for w, h in IMAGE_SIZES]

    # The camera decoder's input is small and decides the pose: always in full.
    full_keys = set(args.full_keys)
    if net.cam_dec is not None:
        full_keys.add(f"cam_token{len(net.backbone.out_layers) - 1}")
    images = []
    for w, h in args.images:
        name = f"{w}x{h}"
        image = make_image(w, h)
        processed, x = preprocess(image, args.process_res, args.resize_method)
        detail = name in detail_images
        arrays = run_network(net, x, detail=True)
        entry = {
            "name": name,
            "width": w,
            "height": h,
            "processed_width": int(x.shape[-1]),
            "processed_height": int(x.shape[-2]),
            "image_fnv1a64": f"0x{fnv1a64_array(image):016x}",
            "processed_fnv1a64": f"0x{fnv1a64_array(processed):016x}",
            "processed_sha256": hashlib.sha256(processed.tobytes()).hexdigest(),
            "detail": detail,
            "arrays": {},
        }
        if not args.compact and detail and args.store_processed:
            (out_dir / name).mkdir(parents=True, exist_ok=True)
            processed.tofile(out_dir / name / "processed.u8")
            entry["processed_file"] = f"{name}/processed.u8"
        for key, t in arrays.items():
            is_output = key in OUTPUT_KEYS
            if not (is_output or detail):
                continue
            if key in ALWAYS_FULL or (detail and key in full_keys):
                mode = "full"
            elif args.compact:
                mode = "samples" if is_output or key in COMPACT_SAMPLED else "stats"
            elif is_output or t.numel() <= args.max_full_elems:
                mode = "full"
            else:
                mode = "samples"
            entry["arrays"][key] = store(t.numpy(), mode, out_dir, f"{name}/{safe_name(key)}")
        images.append(entry)
        d = arrays["depth"]
        print(
            f"{name}: processed {x.shape[-1]}x{x.shape[-2]}, depth [{d.min():.4g}, {d.max():.4g}]",
            file=sys.stderr,
        )

    manifest = {
        "preset": args.preset,
        "process_res": args.process_res,
        "process_res_method": args.resize_method,
        "generator": "tests/reference/da3_reference.py",
        "official_package": "depth-anything-3==0.1.1",
        "torch": torch.__version__,
        "compact": bool(args.compact),
        "config": preset_config(args.preset),
        "out_layers": list(net.backbone.out_layers),
        "weights": {
            "formula": "see tests/reference/da3_reference.py uniform_pm1 / weight_rule",
            "tied": tied,
            "known_answers": weight_known_answers(keys_shapes),
            "state_dict_entries": len(keys_shapes),
            "parameters": int(sum(math.prod(s) for k, s in keys_shapes if not _is_tied(k, tied))),
        },
        "image_formula": (
            "uint8 [H, W, 3]; v = (128 + (100 * sin(0.043 * x + 0.7 * c)) * cos(0.031 * y - "
            "0.4 * c)) + 20 * sin(0.5 * (x + y)) in float64, round half to even, clamp 0..255"
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
                "depth is the head's depth before any sky post-processing; 'X:in' is the "
                "input of module X; 'X[n]' the n-th call; feat{k}/cam_token{k}: what the "
                "head / camera decoder get from out layer k (out_layers[k])"
            ),
        },
        "images": images,
    }
    if args.preset == "da3-tiny" or args.preprocess_table:
        manifest["preprocess_cases"] = preprocess_table(args.resize_method)
    (out_dir / "manifest.json").write_text(dump_json(manifest))
    if args.keys_file:
        tied_to = {k: group[0] for group in tied for k in group[1:]}
        lines = ["# key\tshape\tweight rule\t(tied: same tensor as)"]
        lines += [
            f"{k}\t{list(s)}\t{weight_rule(k, s)[0]}"
            + (f"\ttied:{tied_to[k]}" if k in tied_to else "")
            for k, s in keys_shapes
        ]
        Path(args.keys_file).write_text("\n".join(lines) + "\n")


def _is_tied(key: str, tied: list[list[str]]) -> bool:
    return any(key in group[1:] for group in tied)


def preprocess_table(method: str) -> list[dict]:
    rows = []
    for w, h, res in PREPROCESS_CASES:
        processed, _ = preprocess(make_image(w, h), res, method)
        first = InputProcessor()._resize_image(Image.new("RGB", (w, h)), res, method).size
        rows.append(
            {
                "width": w,
                "height": h,
                "process_res": res,
                "first_resize": list(first),
                "processed_width": int(processed.shape[1]),
                "processed_height": int(processed.shape[0]),
                "processed_fnv1a64": f"0x{fnv1a64_array(processed):016x}",
            }
        )
    return rows


def machine_description() -> dict:
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
    """Median forward time; the ray branch (DualDPT aux chain) is timed with hooks on its
    modules, so depth_path = forward - ray branch."""
    torch.set_num_threads(args.threads)
    w, h = args.images[0]
    _, x = preprocess(make_image(w, h), args.process_res, args.resize_method)
    modules = dict(net.named_modules())
    # The aux chain: refinenet{1..4}_aux and the members of the output_conv{1,2}_aux lists
    # (the ModuleLists themselves are never called, so their hooks would not fire).
    aux_names = [
        n
        for n in modules
        if re.fullmatch(r"head\.scratch\.(refinenet\d_aux|output_conv[12]_aux\.\d)", n)
    ]
    parts = {
        "backbone": ["backbone"],
        "head": ["head"],
        "ray_branch": aux_names,
        "cam_dec": ["cam_dec"] if net.cam_dec is not None else [],
    }
    acc = {k: 0.0 for k in parts}
    start = {}
    handles = []
    for part, names in parts.items():
        for n in names:
            m = modules[n]
            handles.append(
                m.register_forward_pre_hook(
                    lambda m, a, n=n: start.__setitem__(n, time.perf_counter())
                )
            )
            handles.append(
                m.register_forward_hook(
                    lambda m, a, o, n=n, part=part: acc.__setitem__(
                        part, acc[part] + time.perf_counter() - start[n]
                    )
                )
            )
    runs = []
    load_before = os.getloadavg()
    with torch.inference_mode(), torch.autocast("cpu", enabled=False):
        for i in range(args.warmup + args.repeats):
            for k in acc:
                acc[k] = 0.0
            c0, t0 = time.process_time(), time.perf_counter()
            net(x)
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            if i >= args.warmup:
                runs.append(
                    {"forward_s": total, "cpu_s": cpu, **{f"{k}_s": v for k, v in acc.items()}}
                )
    for hnd in handles:
        hnd.remove()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    med["depth_path_s"] = statistics.median(r["forward_s"] - r["ray_branch_s"] for r in runs)
    record = {
        "preset": args.preset,
        "image": f"{w}x{h}",
        "processed": f"{x.shape[-1]}x{x.shape[-2]}",
        "ray_branch_modules": aux_names,
        "threads": args.threads,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "median": med,
        "min_forward_s": min(r["forward_s"] for r in runs),
        "runs_forward_s": [r["forward_s"] for r in runs],
        # Other work on the machine inflates the times; the load average shows how much.
        "loadavg_1m_before_after": [load_before[0], os.getloadavg()[0]],
    }
    path = Path(args.timing)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["machine"] = machine_description()
    data["method"] = (
        "official DepthAnything3Net.forward, float32, autocast off, torch.inference_mode, "
        "torch.set_num_threads(threads), seeded weights, wall-clock seconds; cpu_s is the "
        "process CPU time of a forward (all threads; less sensitive to other load than "
        "wall time); backbone/head/ray_branch/cam_dec are wall time inside those modules "
        "via forward hooks, ray_branch summing the DualDPT aux chain (ray_branch_modules); "
        "depth_path_s = forward_s - ray_branch_s per run"
    )
    data.setdefault("results", {})[args.preset] = record
    path.write_text(dump_json(data))
    print(json.dumps(record, indent=1))


def check(args, net) -> None:
    """Sanity of the seeded network: finite outputs, non-uniform attention."""
    w, h = args.images[0]
    _, x = preprocess(make_image(w, h), args.process_res, args.resize_method)
    fused = run_network(net, x, detail=False)
    probs = {}
    hooks = []
    for name, m in net.named_modules():
        if name.endswith(".attn") and hasattr(m, "fused_attn"):
            m.fused_attn = False  # the unfused path exposes the softmax to attn_drop
            hooks.append(
                m.attn_drop.register_forward_hook(
                    lambda mod, a, o, name=name: probs.__setitem__(name, o.detach().clone())
                )
            )
    unfused = run_network(net, x, detail=False)
    for hk in hooks:
        hk.remove()
    for name, m in net.named_modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = True
    for k in ("depth", "depth_conf", "sky"):
        if k in fused:
            a = fused[k]
            print(
                f"{k}: finite={bool(torch.isfinite(a).all())} min={a.min():.6g} "
                f"max={a.max():.6g} mean={a.mean():.6g}"
            )
    for k in ("extrinsics", "intrinsics"):
        if k in fused:
            print(k, fused[k].reshape(-1).tolist())
    d = (fused["depth"] - unfused["depth"]).abs().max() / fused["depth"].abs().max()
    print(f"fused vs unfused attention: depth max rel diff {float(d):.3g}")
    for name, p in probs.items():
        n = p.shape[-1]
        ent = -(p.clamp_min(1e-30) * p.clamp_min(1e-30).log()).sum(-1) / math.log(n)
        print(
            f"{name}: tokens {n}, max prob mean {p.max(-1).values.mean():.4f} "
            f"(uniform {1 / n:.4f}), entropy/log(n) mean {ent.mean():.4f} min {ent.min():.4f}"
        )


def parse_size(text: str) -> tuple[int, int]:
    w, h = text.lower().split("x")
    return int(w), int(h)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("preset", choices=PRESETS)
    p.add_argument("--out", help="write manifest.json and arrays here")
    p.add_argument(
        "--compact",
        action="store_true",
        help="store grid samples + statistics instead of full arrays",
    )
    p.add_argument("--process-res", type=int, default=504)
    p.add_argument(
        "--resize-method",
        default="upper_bound_resize",
        choices=[
            "upper_bound_resize",
            "upper_bound_crop",
            "lower_bound_resize",
            "lower_bound_crop",
        ],
    )
    p.add_argument(
        "--images", type=parse_size, nargs="+", default=list(IMAGE_SIZES), help="image sizes WxH"
    )
    p.add_argument(
        "--detail-images",
        nargs="*",
        help="images (WxH names) whose intermediates are stored "
        "(default: all; with --compact: 640x427)",
    )
    p.add_argument(
        "--max-full-elems",
        type=int,
        default=1 << 62,
        help="full mode: intermediates bigger than this are stored as samples",
    )
    p.add_argument(
        "--full-keys",
        nargs="*",
        default=[],
        help="intermediates always stored in full for detail images",
    )
    p.add_argument(
        "--store-processed",
        action="store_true",
        help="full mode: also write the processed uint8 image of detail images",
    )
    p.add_argument(
        "--preprocess-table",
        action="store_true",
        help="add the preprocessing case table to the manifest",
    )
    p.add_argument("--keys-file", help="write state_dict keys, shapes and weight rules here")
    p.add_argument(
        "--save-checkpoint",
        metavar="DIR",
        help="save config.json + model.safetensors as the official wrapper does",
    )
    p.add_argument("--timing", metavar="JSON", help="measure forward time, merge into JSON")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--check", action="store_true", help="print sanity checks")
    args = p.parse_args()

    torch.set_grad_enabled(False)
    net = build_net(args.preset)
    tied = fill_weights(net)
    if args.save_checkpoint:
        save_checkpoint(net, args.preset, Path(args.save_checkpoint))
    if args.check:
        check(args, net)
    if args.out:
        generate(args, net, tied)
    if args.timing:
        timing(args, net)


if __name__ == "__main__":
    main()
