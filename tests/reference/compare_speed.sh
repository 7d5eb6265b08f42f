#!/usr/bin/env bash
# Times `da3 bench` and the official PyTorch code on the same synthetic weights, image
# (640x427 -> 504x336) and thread count, back to back in one run, and prints the ratios, for
# time and for peak RSS (MiB), both against the official depth path alone.
#
#   tests/reference/compare_speed.sh PYTHON [presets] [threads] [device]
#   e.g. tests/reference/compare_speed.sh /path/to/venv/bin/python "da3-small da3-base" 2 cpu
#
# PYTHON must import torch and depth_anything_3 (tests/reference/da3_reference.py's header says
# how to make such an environment). Writes JSON next to the printed table in $OUT_DIR
# (default: target/speed).
set -euo pipefail
PY=${1:?usage: compare_speed.sh PYTHON [presets] [threads] [device]}
PRESETS=${2:-"da3-small da3-base"}
THREADS=${3:-2}
DEVICE=${4:-cpu}
# f16 files run the fast mode (bf16 products on CPUs with AVX512_BF16).
TYPES=${TYPES:-"f32 f16 q8_0"}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${OUT_DIR:-$ROOT/target/speed}
mkdir -p "$OUT_DIR"
cd "$ROOT"
cargo build --release --quiet --bin da3 --example write_synthetic
TORCH_DEVICE=$([ "$DEVICE" = cpu ] && echo cpu || echo cuda)
printf '%-10s %-6s %12s %12s %12s %8s %12s %16s %22s %9s\n' preset type ours_ms official_ms official_depth_ms ratio \
  ours_rss_mib official_rss_mib official_depth_rss_mib rss_ratio
for preset in $PRESETS; do
  for type in $TYPES; do
    model="$OUT_DIR/$preset-$type.gguf"
    [ -f "$model" ] || target/release/examples/write_synthetic "$preset" "$model" "$type" > /dev/null
    target/release/da3 bench --model "$model" --device "$DEVICE" --threads "$THREADS" --runs 10 --json "$OUT_DIR/ours-$preset-$type.json" > /dev/null
  done
  "$PY" tests/reference/bench_official.py "$preset" --device "$TORCH_DEVICE" --threads "$THREADS" --runs 10 --json "$OUT_DIR/official-$preset.json" > /dev/null 2>&1
  for type in $TYPES; do
    "$PY" - "$OUT_DIR/ours-$preset-$type.json" "$OUT_DIR/official-$preset.json" "$preset" "$type" <<'PYEOF'
import json, sys
ours, off = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
o, f, d = ours["median_ms"], off["forward"]["median_ms"], off["depth_path"]["median_ms"]
# `da3 bench` writes null where /proc/self/status is unreadable (not Linux).
rss = ours.get("peak_rss_bytes")
ro = rss / 2**20 if rss else float("nan")
rf, rd = off["peak_rss_mib"], off["depth_path_peak_rss_mib"]
print(f"{sys.argv[3]:<10} {sys.argv[4]:<6} {o:12.1f} {f:12.1f} {d:12.1f} {d / o:7.2f}x"
      f" {ro:12.1f} {rf:16.1f} {rd:22.1f} {rd / ro:8.2f}x")
PYEOF
  done
done
