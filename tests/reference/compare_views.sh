#!/usr/bin/env bash
# Times one scene of N views (copies of the 640x427 synthetic image) through `da3 bench --views N`
# and through the official PyTorch forward (B = 1, S = N, `bench_official.py --views N`, its
# depth path: the ray branch, which the official forward computes and drops, skipped), on the
# same synthetic weights and thread count, back to back per N, and prints per-view times, the
# speedup against the official code and both peak RSS figures.
#
#   tests/reference/compare_views.sh PYTHON [preset] [threads] [device]
#   e.g. VIEWS="1 2 4 8" RUNS=3 tests/reference/compare_views.sh /path/to/venv/bin/python da3-base 2 cpu
#
# Environment: DA3=path of the da3 binary and WRITE_SYNTHETIC=path of the write_synthetic
# example (default: built here); VIEWS (default "1 2 4 8"); RUNS (default 3); TYPE (default
# f32); PIN (a command prefix for every timed process, e.g. "taskset -c 0,1"); OUT_DIR.
set -euo pipefail
PY=${1:?usage: compare_views.sh PYTHON [preset] [threads] [device]}
PRESET=${2:-da3-base}
THREADS=${3:-2}
DEVICE=${4:-cpu}
VIEWS=${VIEWS:-"1 2 4 8"}
RUNS=${RUNS:-3}
TYPE=${TYPE:-f32}
PIN=${PIN:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${OUT_DIR:-$ROOT/target/views}
mkdir -p "$OUT_DIR"
cd "$ROOT"
if [ -z "${DA3:-}" ] || [ -z "${WRITE_SYNTHETIC:-}" ]; then
  cargo build --release --quiet -p da3-cli -p da3 --bin da3 --example write_synthetic
fi
DA3=${DA3:-target/release/da3}
WRITE_SYNTHETIC=${WRITE_SYNTHETIC:-target/release/examples/write_synthetic}
TORCH_DEVICE=$([ "$DEVICE" = cpu ] && echo cpu || echo cuda)
model="$OUT_DIR/$PRESET-$TYPE.gguf"
[ -f "$model" ] || "$WRITE_SYNTHETIC" "$PRESET" "$model" "$TYPE" > /dev/null
field() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }
printf '%-6s %12s %12s %12s %12s %8s %9s %9s\n' views ours_ms ours_view official_ms official_view speedup ours_rss off_rss
for n in $VIEWS; do
  official="$OUT_DIR/official-$PRESET-v$n.json"
  ours="$OUT_DIR/ours-$PRESET-$TYPE-v$n.json"
  $PIN "$PY" tests/reference/bench_official.py "$PRESET" --device "$TORCH_DEVICE" --threads "$THREADS" \
    --runs "$RUNS" --warmup 1 --views "$n" --json "$official" > /dev/null 2>&1
  $PIN "$DA3" bench --model "$model" --device "$DEVICE" --threads "$THREADS" --runs "$RUNS" \
    --views "$n" --json "$ours" > /dev/null
  o=$(field "$ours" "d['median_ms']")
  r=$(field "$official" "d['depth_path']['median_ms']")
  orss=$(field "$ours" "round(d['peak_rss_bytes'] / 2**20) if d['peak_rss_bytes'] else '-'")
  rrss=$(field "$official" "round(d['depth_path_peak_rss_mib'])")
  printf '%-6s %12.1f %12.1f %12.1f %12.1f %7.2fx %9s %9s\n' "$n" "$o" "$(echo "$o / $n" | bc -l)" \
    "$r" "$(echo "$r / $n" | bc -l)" "$(echo "$r / $o" | bc -l)" "$orss" "$rrss"
done
