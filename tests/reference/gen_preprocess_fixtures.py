#!/usr/bin/env python3
"""Generate the reference fixtures for the DA3 preprocessing tests (src/da3/preprocess.rs).

Every reference value comes from the real official stack, never from the Rust code:
  * OpenCV (cv2.resize INTER_CUBIC / INTER_AREA) for the resize tests,
  * the official depth-anything-3 0.1.1 InputProcessor for preprocess(),
  * the official DinoVisionTransformer.interpolate_pos_encoding (PyTorch bicubic) for the
    position-embedding resample,
  * the official create_uv_grid + position_grid_to_embed for the UV embedding.

Requirements: numpy==1.26.4, opencv-python-headless==4.11.0.86, pillow, torch, torchvision and
the official package (`pip install --no-deps depth-anything-3==0.1.1` plus einops, addict,
omegaconf, safetensors); set DA3_SRC to an unpacked source tree instead if it is not installed.

Usage: python gen_preprocess_fixtures.py [OUTPUT_DIR]   (default: tests/fixtures/preprocess)

Near-ties: the x86-64 OpenCV wheels run 8-bit INTER_CUBIC through Intel IPP (for sources of at
least 4x4), which evaluates the filter in floating point; where the exact filter output lies
within TIE_BAND of a half-integer, IPP's rounding error decides the uint8 value, so the Rust
code may legitimately differ by one level there. The generator lists those positions, found
with an exact float64 evaluation of the cubic filter (`cubic_exact`), so the tests can accept
a one-level difference at them and demand exact equality everywhere else. The listed values are
still the real OpenCV output.

All files are little-endian binary (u32 = uint32, u64 = uint64, f32/f64 = IEEE floats). Input
images are not stored: both sides generate them with `pattern()` and the fixtures carry an
FNV-1a 64 digest of each input so that a formula mismatch is reported as such.

resize.bin      u32 count, then per case:
                u32 kind (0 = INTER_CUBIC, 1 = INTER_AREA), u32 src_w, src_h, dst_w, dst_h,
                u64 fnv(input), u8 output[dst_h][dst_w][3], u32 k, k x u32 near-tie index
preprocess.bin  u32 count, then per case:
                u32 src_w, src_h, process_res, out_w, out_h, u64 fnv(input),
                u64 fnv(processed uint8 image), u32 has_full,
                [u8 processed[out_h][out_w][3] if has_full], u32 k,
                k x (u32 near-tie index into the H x W x 3 image, u32 official value), u32 n,
                n x (u32 index into the 3 x H x W tensor, f32 official value)
normalize.bin   f32[3][256]: the official normalisation of a 256x1 image with pixel x = (x, x, x)
pos_embed.bin   u32 dim, src_h, src_w, f32 grid[src_h * src_w][dim], u32 count, then per case:
                u32 dst_h, dst_w, f64 interpolate_offset, f32 out[dst_h * dst_w][dim]
uv.bin          u32 count, then per case: u32 map_w, map_h, channels, image_w, image_h, u32 n;
                n == 0: f32 out[channels][map_h][map_w]; else n x (u32 index, f32 value)
tiny.png        pattern(7, 5) as PNG (written by PIL)
corrupt.png     a PNG signature followed by garbage
"""

from __future__ import annotations

import io
import os
import struct
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np
from PIL import Image

warnings.filterwarnings("ignore")
if os.environ.get("DA3_SRC"):
    sys.path.insert(0, os.environ["DA3_SRC"])

import torch  # noqa: E402
from depth_anything_3.model.dinov2.vision_transformer import DinoVisionTransformer  # noqa: E402
from depth_anything_3.model.utils.head_utils import (  # noqa: E402
    create_uv_grid,
    position_grid_to_embed,
)
from depth_anything_3.utils.io.input_processor import InputProcessor  # noqa: E402

SEED = 20250603


def pattern(w: int, h: int) -> np.ndarray:
    """The deterministic test image shared with the main project's parity tests (H x W x 3)."""
    y, x, c = np.meshgrid(
        np.arange(h, dtype=np.float64),
        np.arange(w, dtype=np.float64),
        np.arange(3, dtype=np.float64),
        indexing="ij",
    )
    v = 128 + 100 * np.sin(0.043 * x + 0.7 * c) * np.cos(0.031 * y - 0.4 * c) + 20 * np.sin(
        0.5 * (x + y)
    )
    return np.clip(np.round(v), 0, 255).astype(np.uint8)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def u32(*vals: int) -> bytes:
    return struct.pack(f"<{len(vals)}I", *vals)


def f32s(a) -> bytes:
    return np.ascontiguousarray(a, dtype="<f4").tobytes()


def samples(values: np.ndarray, n: int, rng: np.random.Generator) -> bytes:
    """n (index, value) pairs, always including the first and last element."""
    flat = values.reshape(-1)
    idx = rng.choice(flat.size, size=min(n, flat.size), replace=False)
    idx = np.unique(np.concatenate([idx, [0, flat.size - 1]]))
    out = u32(len(idx))
    for i in idx:
        out += u32(int(i)) + f32s([flat[i]])
    return out


# ---------------------------------------------------------------------------------------------
RESIZE_CASES = [
    # (kind, src_w, src_h, dst_w, dst_h); kind 0 = INTER_CUBIC, 1 = INTER_AREA
    (0, 37, 23, 61, 41),  # enlarge, non-integer
    (0, 20, 15, 40, 30),  # enlarge x2
    (0, 64, 48, 37, 29),  # shrink with cubic
    (0, 30, 20, 30, 27),  # one axis unchanged
    (0, 1, 7, 5, 13),  # from 1xN (fixed-point path)
    (0, 2, 2, 9, 7),  # from 2x2 (fixed-point path)
    (0, 13, 9, 1, 1),  # to 1x1
    (0, 17, 11, 1, 5),  # to 1xN
    (0, 21, 33, 8, 2),
    (0, 5, 3, 48, 41),  # source below 4x4: OpenCV's own fixed-point path, not IPP
    (1, 64, 48, 32, 24),  # integer 2x2 (dedicated kernel)
    (1, 60, 45, 20, 15),  # integer 3x3
    (1, 64, 48, 16, 24),  # integer 4x2
    (1, 80, 60, 80, 30),  # integer 1x2
    (1, 98, 10, 2, 10),  # factor 49 misses OpenCV's integer test: general path
    (1, 61, 47, 23, 19),  # non-integer
    (1, 100, 80, 37, 29),
    (1, 45, 33, 44, 32),  # slight shrink
    (1, 101, 60, 98, 60),  # one axis unchanged (like 504x101 -> 504x98)
    (1, 7, 5, 1, 1),  # to 1x1
    (1, 2, 2, 1, 1),  # 2x2 -> 1x1
    (1, 9, 1, 2, 1),  # from height 1
    (1, 1, 9, 1, 4),  # from width 1
    (1, 30, 20, 45, 35),  # enlarge with INTER_AREA (bilinear emulation)
    (1, 30, 20, 45, 14),  # mixed: x grows, y shrinks
    (1, 3, 2, 17, 9),  # tiny enlarge
]


TIE_BAND = 1e-4
IPP_CUBIC_MIN_SIDE = 4


def keys(t: np.ndarray) -> list[np.ndarray]:
    a = -0.75

    def near(x):
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def cubic_exact(img: np.ndarray, dw: int, dh: int) -> np.ndarray:
    """Real-valued Keys cubic (a = -0.75, pixel centres, replicated border), float64."""

    def taps(src: int, dst: int):
        pos = (np.arange(dst) + 0.5) * (src / dst) - 0.5
        first = np.floor(pos)
        idx = [np.clip(first.astype(np.int64) - 1 + j, 0, src - 1) for j in range(4)]
        return idx, keys(pos - first)

    sh, sw = img.shape[:2]
    xi, xw = taps(sw, dw)
    yi, yw = taps(sh, dh)
    f = img.astype(np.float64)
    rows = sum(w[None, :, None] * f[:, i, :] for i, w in zip(xi, xw))
    return sum(w[:, None, None] * rows[i] for i, w in zip(yi, yw))


def near_ties(img: np.ndarray, dw: int, dh: int) -> np.ndarray:
    """Flat H x W x 3 indices where IPP's float rounding may go either way."""
    if min(img.shape[:2]) < IPP_CUBIC_MIN_SIDE:
        return np.zeros(0, dtype=np.int64)
    exact = cubic_exact(img, dw, dh).reshape(-1)
    frac = exact - np.floor(exact)
    return np.nonzero(np.abs(frac - 0.5) < TIE_BAND)[0]


def gen_resize() -> bytes:
    out = u32(len(RESIZE_CASES))
    for kind, sw, sh, dw, dh in RESIZE_CASES:
        img = pattern(sw, sh)
        interp = cv2.INTER_CUBIC if kind == 0 else cv2.INTER_AREA
        res = cv2.resize(img, (dw, dh), interpolation=interp)
        res = res.reshape(dh, dw, 3)
        out += u32(kind, sw, sh, dw, dh) + struct.pack("<Q", fnv1a(img.tobytes()))
        out += np.ascontiguousarray(res, dtype=np.uint8).tobytes()
        ties = near_ties(img, dw, dh) if kind == 0 else np.zeros(0, dtype=np.int64)
        out += u32(len(ties), *map(int, ties))
        if kind == 0 and min(sw, sh) >= IPP_CUBIC_MIN_SIDE:
            exact = np.clip(np.rint(cubic_exact(img, dw, dh)), 0, 255).reshape(-1)
            off = np.nonzero(exact != res.reshape(-1))[0]
            print(f"  cubic {sw}x{sh}->{dw}x{dh}: {len(ties)} near-ties, cv2 != exact at {len(off)}")
            assert set(off) <= set(ties), "OpenCV differs from the exact cubic away from a tie"
    return out


# ---------------------------------------------------------------------------------------------
PREPROCESS_CASES = [
    (640, 427, 504),
    (427, 640, 504),
    (500, 500, 504),
    (1000, 200, 504),
    (20, 10, 504),
    (504, 300, 504),  # no first resize, area second resize
    (640, 427, 112),
    (1000, 200, 112),  # cubic second resize (22 -> 28 rows, width unchanged)
    (20, 10, 112),
]
FULL_LIMIT = 24_000  # store the whole uint8 image when it is at most this many bytes


def official_uint8(proc: InputProcessor, img: np.ndarray, res: int):
    """The official uint8 image (the steps of InputProcessor._process_one), plus the positions
    of the final image where a cubic resize hit a near-tie."""
    pil = proc._load_image(img)
    steps = [np.asarray(pil)]
    pil = proc._resize_image(pil, res, "upper_bound_resize")
    steps.append(np.asarray(pil))
    pil = proc._make_divisible_by_resize(pil, proc.PATCH_SIZE)
    steps.append(np.asarray(pil))
    ties = np.zeros(0, dtype=np.int64)
    for k, (a, b) in enumerate(zip(steps, steps[1:])):
        (ah, aw), (bh, bw) = a.shape[:2], b.shape[:2]
        # Interpolation choice as in the official code: cubic when the first resize enlarges
        # or when the second one grows either side.
        cubic = (bw * bh > aw * ah) if k == 0 else (bw > aw or bh > ah)
        if (ah, aw) == (bh, bw) or not cubic:
            continue
        t = near_ties(a, bw, bh)
        exact = np.clip(np.rint(cubic_exact(a, bw, bh)), 0, 255).reshape(-1)
        assert set(np.nonzero(exact != b.reshape(-1))[0]) <= set(t)
        if k == 0 and steps[2].shape != b.shape:
            assert len(t) == 0, "near-tie in a cubic first step that is resized again"
        else:
            ties = t
    return steps[-1], ties


def gen_preprocess(rng: np.random.Generator) -> bytes:
    proc = InputProcessor()
    out = u32(len(PREPROCESS_CASES))
    for sw, sh, res in PREPROCESS_CASES:
        img = pattern(sw, sh)
        tensor, _, _ = proc(image=[img], process_res=res, num_workers=1, print_progress=False)
        chw = tensor.reshape(3, *tensor.shape[-2:]).numpy()
        oh, ow = chw.shape[1:]
        u8, ties = official_uint8(proc, img, res)
        assert u8.shape == (oh, ow, 3), (u8.shape, chw.shape)
        # The uint8 image must be exactly what the official path normalised.
        renorm = proc._normalize_image(Image.fromarray(u8)).numpy()
        assert np.array_equal(renorm, chw)
        out += u32(sw, sh, res, ow, oh)
        out += struct.pack("<QQ", fnv1a(img.tobytes()), fnv1a(u8.tobytes()))
        if u8.nbytes <= FULL_LIMIT:
            out += u32(1) + u8.tobytes()
        else:
            out += u32(0)
        flat = u8.reshape(-1)
        out += u32(len(ties)) + b"".join(u32(int(i), int(flat[i])) for i in ties)
        out += samples(chw, 256, rng)
        print(f"  preprocess {sw}x{sh} @ {res} -> {ow}x{oh} ({len(ties)} near-ties)")
    return out


def gen_normalize() -> bytes:
    proc = InputProcessor()
    levels = np.arange(256, dtype=np.uint8)
    img = np.stack([levels] * 3, axis=-1).reshape(1, 256, 3)
    return f32s(proc._normalize_image(Image.fromarray(img)).numpy())


# ---------------------------------------------------------------------------------------------
POS_DIM = 4
POS_GRID = 37
POS_CASES = [(36, 24, 0.1), (24, 36, 0.1), (36, 36, 0.1), (72, 14, 0.1), (36, 24, 0.0)]


def official_pos_embed(pos_embed: torch.Tensor, gh: int, gw: int, offset: float) -> torch.Tensor:
    """Calls the official DinoVisionTransformer.interpolate_pos_encoding on a minimal object."""
    fake = SimpleNamespace(
        pos_embed=pos_embed,
        patch_size=14,
        interpolate_offset=offset,
        interpolate_antialias=False,
    )
    x = torch.zeros(1, 1 + gh * gw, pos_embed.shape[-1])
    # The official prepare_tokens_with_masks unpacks (B, S, C, H, W) as (..., w, h), so its
    # "w" is the image height and its "h" the image width.
    res = DinoVisionTransformer.interpolate_pos_encoding(fake, x, gh * 14, gw * 14)
    return res[0, 1:]


def gen_pos_embed(rng: np.random.Generator) -> bytes:
    n = POS_GRID * POS_GRID
    full = rng.standard_normal((1, 1 + n, POS_DIM)).astype(np.float32)
    pos_embed = torch.from_numpy(full)
    out = u32(POS_DIM, POS_GRID, POS_GRID) + f32s(full[0, 1:])
    out += u32(len(POS_CASES))
    for gh, gw, offset in POS_CASES:
        res = official_pos_embed(pos_embed, gh, gw, offset)
        assert res.shape == (gh * gw, POS_DIM)
        out += u32(gh, gw) + struct.pack("<d", offset) + f32s(res.numpy())
    # The official code skips the resample for a square image with 37x37 patches.
    same = official_pos_embed(pos_embed, POS_GRID, POS_GRID, 0.1)
    assert np.array_equal(same.numpy(), full[0, 1:])
    return out


# ---------------------------------------------------------------------------------------------
UV_CASES = [
    # (map_w, map_h, channels, image_w, image_h, samples; 0 = store all)
    (36, 24, 4, 504, 336, 0),
    (36, 24, 48, 504, 336, 256),
    (36, 24, 384, 504, 336, 256),
    (36, 24, 1024, 504, 336, 256),
    (24, 36, 256, 336, 504, 256),
    (144, 96, 96, 504, 336, 256),
    (504, 336, 32, 504, 336, 512),  # full resolution (out1 output of the small model)
    (504, 336, 128, 504, 336, 256),
    (37, 37, 64, 518, 518, 256),
    (7, 1, 8, 98, 14, 0),
    (1, 5, 8, 14, 70, 0),
    (36, 7, 16, 504, 98, 0),
]


def gen_uv(rng: np.random.Generator) -> bytes:
    out = u32(len(UV_CASES))
    for mw, mh, ch, iw, ih, n in UV_CASES:
        pe = create_uv_grid(mw, mh, aspect_ratio=iw / ih, dtype=torch.float32)
        emb = position_grid_to_embed(pe, ch).permute(2, 0, 1).contiguous().numpy()
        assert emb.shape == (ch, mh, mw)
        out += u32(mw, mh, ch, iw, ih)
        if n == 0:
            out += u32(0) + f32s(emb)
        else:
            out += samples(emb, n, rng)
    return out


# ---------------------------------------------------------------------------------------------
def main() -> None:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "tests/fixtures/preprocess"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"cv2 {cv2.__version__}, numpy {np.__version__}, torch {torch.__version__}")
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    files = {
        "resize.bin": gen_resize(),
        "preprocess.bin": gen_preprocess(rng),
        "normalize.bin": gen_normalize(),
        "pos_embed.bin": gen_pos_embed(rng),
        "uv.bin": gen_uv(rng),
    }
    png = io.BytesIO()
    Image.fromarray(pattern(7, 5)).save(png, format="PNG")
    files["tiny.png"] = png.getvalue()
    files["corrupt.png"] = b"\x89PNG\r\n\x1a\n" + bytes(range(7, 247, 3))
    total = 0
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
        total += len(data)
        print(f"  {name}: {len(data)} bytes")
    print(f"total {total} bytes in {out_dir}")


if __name__ == "__main__":
    main()
