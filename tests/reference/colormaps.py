"""Writes src/da3/colormaps.rs (matplotlib's viridis and inferno 8-bit lookup tables, the
`bytes=True` output of the colormap for each of its 256 entries) and
tests/fixtures/colormaps.json (the colormaps' `bytes=True` colours at 1001 evenly spaced
values in [0, 1], for tests/colormaps.rs).

    python -m venv /tmp/mplvenv && /tmp/mplvenv/bin/pip install matplotlib
    /tmp/mplvenv/bin/python tests/reference/colormaps.py   # matplotlib 3.11.2
"""
import json
import pathlib

import matplotlib
import numpy as np
from matplotlib import colormaps

root = pathlib.Path(__file__).resolve().parent.parent.parent
names = ["viridis", "inferno"]
xs = np.linspace(0.0, 1.0, 1001)
fixture = {"matplotlib": matplotlib.__version__, "x": xs.tolist()}
rust = [
    "//! matplotlib's viridis and inferno colour maps (van der Walt and Smith, CC0) as 8-bit",
    f"//! lookup tables: written by tests/reference/colormaps.py from matplotlib {matplotlib.__version__}",
    "//! (the colormap's `bytes=True` output for each of its 256 entries).",
    "",
]
for name in names:
    cmap = colormaps[name]
    lut = cmap(np.arange(256), bytes=True)[:, :3]
    fixture[name] = cmap(xs, bytes=True)[:, :3].tolist()
    rows = []
    for i in range(0, 256, 8):
        rows.append("    " + " ".join(f"[{r}, {g}, {b}]," for r, g, b in lut[i : i + 8]))
    rust += ["#[rustfmt::skip]", f"pub(crate) const {name.upper()}: [[u8; 3]; 256] = ["] + rows + ["];", ""]
(root / "src" / "da3" / "colormaps.rs").write_text("\n".join(rust))
(root / "tests" / "fixtures" / "colormaps.json").write_text(json.dumps(fixture) + "\n")
print("wrote src/da3/colormaps.rs and tests/fixtures/colormaps.json")
