"""The seeded weights, synthetic images and fixture storage shared by the reference scripts
(da3_reference.py, da2_reference.py): the formula `da3::synthetic` implements in Rust, so no
checkpoint has to be committed, and the manifest + raw little-endian float32 layout the Rust
tests read (tests/common/mod.rs)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

GRID = 32  # samples per axis in compact storage
FULL_LIMIT = 1024  # arrays with at most this many elements are always stored in full
U64 = np.uint64
GOLDEN = U64(0x9E3779B97F4A7C15)
MIX1 = U64(0xBF58476D1CE4E5B9)
MIX2 = U64(0x94D049BB133111EB)
MASK64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def fnv1a64_array(data: np.ndarray) -> int:
    """FNV-1a 64 of an array's bytes in memory order (uint8 images: row-major HWC)."""
    return fnv1a64(np.ascontiguousarray(data).tobytes())


def uniform_pm1(key: str, n: int) -> np.ndarray:
    """u in [-1, 1) for flat indices 0..n of the tensor named `key` (float64).

    numpy's uint64 arithmetic wraps, which is exactly the u64 wrapping the formula needs;
    every constant is a np.uint64 so that nothing is promoted to float64 on the way.
    """
    h = U64(fnv1a64(key.encode("utf-8")))
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (h ^ (i * GOLDEN)) + GOLDEN
        z = (x ^ (x >> U64(30))) * MIX1
        z = (z ^ (z >> U64(27))) * MIX2
        z = z ^ (z >> U64(31))
    return (z >> U64(11)).astype(np.float64) * (2.0**-53) * 2.0 - 1.0


def uniform_pm1_scalar(key: str, i: int) -> float:
    """Plain-integer version of `uniform_pm1`, used to cross-check the vectorised one."""
    x = (fnv1a64(key.encode("utf-8")) ^ ((i * 0x9E3779B97F4A7C15) & MASK64)) & MASK64
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return float(z >> 11) * 2.0**-53 * 2.0 - 1.0
LAYERSCALE_SUFFIXES = ("ls1.gamma", "ls2.gamma")
TOKEN_SUFFIXES = ("cls_token", "camera_token", "pos_embed", "mask_token", "register_tokens")


def weight_rule(key: str, shape: tuple[int, ...]) -> tuple[str, float, float]:
    """(rule name, center, scale) for one state_dict entry; first matching rule wins."""
    numel = math.prod(shape)
    if key.endswith(LAYERSCALE_SUFFIXES):
        return "layerscale", 0.5, 0.4
    if len(shape) == 1 and key.endswith(".weight") and "norm" in key:
        return "norm_weight", 1.0, 0.25
    if key.endswith(".bias"):
        return "bias", 0.0, 0.1
    if len(shape) < 2 or key.endswith(TOKEN_SUFFIXES):
        return "token_or_1d", 0.0, 0.5
    fan_in = numel // shape[0]
    return "fan_in", 0.0, math.sqrt(3.0 / fan_in)


def weight_values(key: str, shape: tuple[int, ...]) -> np.ndarray:
    _, center, scale = weight_rule(key, shape)
    u = uniform_pm1(key, math.prod(shape))
    return (center + scale * u).astype(np.float32).reshape(shape)


def make_image(width: int, height: int) -> np.ndarray:
    """Synthetic RGB image, uint8 [height, width, 3].

    v = 128 + 100 * sin(0.043 x + 0.7 c) * cos(0.031 y - 0.4 c) + 20 * sin(0.5 (x + y)),
    evaluated in float64 left to right ((128 + (100 * s) * c) + 20 * t), rounded half to even,
    clamped to [0, 255]. Smooth enough that area and cubic resizing matter. The sines and
    cosines come from the C library (math.sin) so another language's libm-based sin gives
    the same bits; numpy's own SIMD sin may differ in the last place.
    """
    xs, ys = range(width), range(height)
    out = np.empty((height, width, 3), dtype=np.float64)
    t = np.array([[math.sin(0.5 * (x + y)) for x in xs] for y in ys])
    for c in range(3):
        s = np.array([math.sin(0.043 * x + 0.7 * c) for x in xs])
        k = np.array([math.cos(0.031 * y - 0.4 * c) for y in ys])
        out[:, :, c] = (128.0 + (100.0 * s)[None, :] * k[:, None]) + 20.0 * t
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def sample_indices(n: int) -> list[int]:
    """min(GRID, n) positions: floor((r + 0.5) * n / m) = ((2r + 1) n) // (2m), r < m.

    This is round((r + 0.5) * n / m - 0.5) with ties rounded up."""
    m = min(GRID, n)
    return [((2 * r + 1) * n) // (2 * m) for r in range(m)]


def stats(a: np.ndarray) -> dict:
    d = a.astype(np.float64)
    return {
        "min": float(d.min()),
        "max": float(d.max()),
        "mean": float(d.mean()),
        "std": float(d.std()),
        "finite": bool(np.isfinite(d).all()),
    }


def store(a: np.ndarray, mode: str, out_dir: Path, rel: str) -> dict:
    """mode "full": the raw array; "samples": grid samples (small arrays are stored in full
    anyway); "stats": no file. Statistics are recorded in every case."""
    a = np.ascontiguousarray(a, dtype="<f4")
    entry = {"shape": list(a.shape), "stats": stats(a)}
    if mode == "stats":
        return entry
    if mode == "full" or a.size <= FULL_LIMIT:
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        a.tofile(out_dir / (rel + ".f32"))
        entry["file"] = rel + ".f32"
    else:
        m2 = a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(1, -1)
        rows, cols = sample_indices(m2.shape[0]), sample_indices(m2.shape[1])
        (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        np.ascontiguousarray(m2[np.ix_(rows, cols)]).tofile(out_dir / (rel + ".samples.f32"))
        entry["samples"] = {"file": rel + ".samples.f32", "rows": rows, "cols": cols}
    return entry


def safe_name(key: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in key)


def dump_json(data) -> str:
    """Indented JSON with lists of numbers kept on one line (the sample index lists)."""
    text = json.dumps(data, indent=1)
    return (
        re.sub(
            r"\[\s*([-+0-9.eE,\s]+?)\s*\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text
        )
        + "\n"
    )
