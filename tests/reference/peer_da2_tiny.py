#!/usr/bin/env python3
r"""A GGUF of the tiny seeded Depth Anything V2 network (da2_reference.py --tiny), written by
depth-anything.cpp's own, unmodified DA2 converter (scripts/convert_da2_to_gguf.py), as a peer
file for the Rust loader's tests (tests/fixtures/peer/peer-da2-tiny-seed0-f32.gguf).

The converter only knows the official encoders (vits/vitb/vitl/vitg). This wrapper runs its
main() with --encoder vits after patching, in memory only:
  * scripts.da2_reference.DA2_CONFIGS["vits"] -> features 16, out_channels [8, 16, 32, 64]
    (the DepthAnythingV2 constructor arguments, da2_reference.net_config("vits", tiny=True));
  * the official depth_anything_v2.dinov2.vit_small -> the tiny DinoVisionTransformer
    (da2_reference.patch_tiny: embed 64, depth 4, 1 head, mlp_ratio 4), so the official
    DINOv2("vits") factory builds it with its usual arguments (img_size 518, patch 14,
    init_values 1.0, mlp ffn, interpolate_offset 0.1);
  * convert_da2_to_gguf.INTERMEDIATE_IDX["vits"] -> [0, 1, 2, 3] (written as vit.out_layers).
Everything else (the strict load_state_dict of the .pth, the metadata, the tensor names from
scripts/gguf_keys.py, the f32 tensors) is the converter's own code.

With --list FILE it then reads the GGUF back with the gguf package, writes its metadata and
tensor table to FILE, checks every tensor against the seeded formula (da2_reference.weight_values
keyed by the official state-dict key, through the converter's own name mapping; the converter
stores PyTorch arrays as they are, no transposition) and names the tensors that the official
forward does not use (parameters that get no gradient from a forward pass).

depth-anything.cpp: github.com/CloudEngineHub/depth-anything.cpp commit
54abd5c0abfd1f394e01cb3c38f2e3af4daedf85 (2026-08-12), exported outside this repository:
    G=<bare git dir of depth-anything.cpp>; D=/work/dacpp
    for f in $(git --git-dir=$G ls-tree -r --name-only HEAD scripts/); do
        mkdir -p $D/$(dirname $f); git --git-dir=$G show HEAD:$f > $D/$f; done
    $PY -m pip install gguf   # 0.19.0; the converter also needs torch and numpy
Commands (from the repository root; PY = the da2_reference.py venv's python):
    $PY tests/reference/da2_reference.py --official=/work/da2-official vits --tiny \
        --save-checkpoint /tmp/da2-tiny-seeded    # depth_anything_v2_tiny.pth
    $PY tests/reference/peer_da2_tiny.py --dacpp /work/dacpp --official /work/da2-official \
        --ckpt /tmp/da2-tiny-seeded/depth_anything_v2_tiny.pth \
        --output tests/fixtures/peer/peer-da2-tiny-seed0-f32.gguf \
        --list /work/peer-da2-tiny-listing.txt
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import da2_reference as ref  # noqa: E402  (this repository's, not depth-anything.cpp's)


def convert(args) -> None:
    os.environ["DA2_SRC"] = str(Path(args.official).resolve())  # read at import time
    sys.path.insert(0, str(Path(args.dacpp).resolve()))
    import scripts.convert_da2_to_gguf as conv
    import scripts.da2_reference as dacpp_ref

    assert conv.DA2_CONFIGS is dacpp_ref.DA2_CONFIGS
    # The converter's load_da2_model imports depth_anything_v2.dpt from DA2_SRC; import the
    # same package first to patch its dinov2 module.
    sys.path.insert(0, dacpp_ref.DA2_SRC)
    import depth_anything_v2.dinov2 as dinov2
    import depth_anything_v2.dpt as dpt

    assert Path(dpt.__file__).resolve().parent.parent == Path(dacpp_ref.DA2_SRC)
    dacpp_ref.DA2_CONFIGS["vits"] = ref.net_config("vits", tiny=True)
    conv.INTERMEDIATE_IDX["vits"] = list(ref.TINY["intermediate_layer_idx"])
    argv = ["convert_da2_to_gguf.py", "--encoder", "vits", "--ckpt", args.ckpt,
            "--output", args.output]
    saved, sys.argv = sys.argv, argv
    try:
        with ref.patch_tiny(dinov2):
            conv.main()
    finally:
        sys.argv = saved
    return conv


def unused_parameters(net) -> list[str]:
    """Parameters of the official network that a forward pass leaves without a gradient."""
    net.zero_grad(set_to_none=True)
    with torch.enable_grad():
        x = torch.from_numpy(np.linspace(-1, 1, 3 * 196 * 196, dtype=np.float32))
        net(x.reshape(1, 3, 196, 196)).sum().backward()
    return [k for k, p in net.named_parameters() if p.grad is None]


def listing(args, conv) -> None:
    import gguf

    import scripts.gguf_keys as K

    reader = gguf.GGUFReader(args.output)
    lines = [f"file {args.output} ({Path(args.output).stat().st_size} bytes)",
             f"metadata ({len(reader.fields)} fields):"]
    for name, field in reader.fields.items():
        types = [t.name for t in field.types]
        value = field.contents()
        lines.append(f"  {name} [{'/'.join(types)}] = {value!r}")
    lines.append(f"tensors ({len(reader.tensors)}): name, ggml shape (ne), numpy shape, type")
    tensors = {}
    for t in reader.tensors:
        tensors[t.name] = t
        lines.append(f"  {t.name} ne={[int(v) for v in t.shape]} np={list(t.data.shape)} "
                     f"{t.tensor_type.name} {int(t.n_bytes)}B")

    # Every GGUF tensor against the seeded formula, through the converter's own mapping.
    dpt = ref.import_official(Path(args.official).resolve(), metric=False)
    net = ref.build_net(dpt, "vits", False, 0.0, tiny=True)
    ref.fill_weights(net)
    mapped, max_err = {}, 0.0
    for key, p in net.named_parameters():
        if key.startswith("pretrained."):
            g = K.rename_backbone(key[len("pretrained."):])
        else:
            g = K.rename_head(key[len("depth_head."):])
        if g is None:
            continue
        mapped[g] = key
        want = ref.weight_values(key, tuple(p.shape))
        got = np.asarray(tensors[g].data)
        assert got.dtype == np.float32 and got.shape == want.shape, (g, got.shape, want.shape)
        assert np.array_equal(got, want), g
        max_err = max(max_err, float(np.abs(got - want).max()))
    extra = sorted(set(tensors) - set(mapped))
    not_written = sorted(k for k, _ in net.named_parameters()
                         if k not in mapped.values())
    unused = unused_parameters(net)
    unused_in_file = sorted(g for g, k in mapped.items() if k in unused)
    lines += [
        f"check: {len(mapped)} tensors equal the seeded weights bit for bit "
        f"(max |diff| {max_err}); GGUF tensors without an official parameter: {extra}",
        f"official parameters not written: {not_written}",
        f"official parameters unused by forward: {unused}",
        f"GGUF tensors unused by the official forward: {unused_in_file}",
    ]
    assert not extra
    Path(args.list).write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dacpp", required=True, help="export of depth-anything.cpp (scripts/)")
    p.add_argument("--official", required=True, help="checkout of Depth-Anything-V2")
    p.add_argument("--ckpt", required=True, help="da2_reference.py --tiny --save-checkpoint .pth")
    p.add_argument("--output", required=True)
    p.add_argument("--list", help="write the GGUF's metadata / tensor listing here and check it")
    args = p.parse_args()
    torch.set_num_threads(2)
    conv = convert(args)
    if args.list:
        listing(args, conv)


if __name__ == "__main__":
    main()
