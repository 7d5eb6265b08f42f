#!/usr/bin/env bash
# Times `da3 bench` (one or several builds of it), the official PyTorch code and the same
# depth path exported to ONNX Runtime, on the same synthetic weights, image (640x427 ->
# 504x336) and thread count, back to back in one run, and prints each figure's ratio against
# the official depth path, for time and for peak RSS (MiB).
#
#   tests/reference/compare_speed.sh PYTHON [presets] [threads] [device]
#   e.g. tests/reference/compare_speed.sh /path/to/venv/bin/python "da3-small da3-base" 2 cpu
#
# PYTHON must import torch and depth_anything_3 (tests/reference/da3_reference.py's header says
# how to make such an environment), and onnx + onnxruntime for the ONNX rows (ONNX=0 skips
# them). Environment:
#   BUILDS="native=target/release/da3 default=target/portable/release/da3"  builds to time
#     (default: this checkout's release build, built here first);
#   WRITE_SYNTHETIC=path  the write_synthetic example (default: built here);
#   TYPES="f32 f16 q8_0"  weight types of our files; RUNS=10; ROUNDS=1 (rounds interleave all
#     engines, so that drift of the machine hits each alike; the table has every round's rows);
#   PIN="taskset -c 0,1"  a command prefix for every timed process.
# An AVX2 machine's figures on a CPU with AVX-512 (a proxy; BENCHMARKS.md, session 20): build
# tests/reference/avx2_only.c (its header says how) and set PIN=target/avx2-only: every engine
# then reads CPUID without AVX-512, AVX-VNNI or AMX and its own dispatch picks its AVX2 code
# (ggml's haswell variant and our avx2 kernels in a default build, PyTorch's AVX2 kernels,
# ONNX Runtime's AVX2 MLAS). Needs a CPU and kernel with CPUID faulting (`cpuid_fault`).
# Writes the JSON of every run in $OUT_DIR (default: target/speed).
set -euo pipefail
PY=${1:?usage: compare_speed.sh PYTHON [presets] [threads] [device]}
PRESETS=${2:-"da3-small da3-base"}
THREADS=${3:-2}
DEVICE=${4:-cpu}
# f16 files run the fast mode (bf16 products on CPUs with AVX512_BF16).
TYPES=${TYPES:-"f32 f16 q8_0"}
RUNS=${RUNS:-10}
ROUNDS=${ROUNDS:-1}
ONNX=${ONNX:-1}
PIN=${PIN:-}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${OUT_DIR:-$ROOT/target/speed}
mkdir -p "$OUT_DIR"
cd "$ROOT"
if [ -z "${BUILDS:-}" ] || [ -z "${WRITE_SYNTHETIC:-}" ]; then
  cargo build --release --quiet -p da3-cli -p da3 --bin da3 --example write_synthetic
fi
BUILDS=${BUILDS:-"ours=target/release/da3"}
WRITE_SYNTHETIC=${WRITE_SYNTHETIC:-target/release/examples/write_synthetic}
TORCH_DEVICE=$([ "$DEVICE" = cpu ] && echo cpu || echo cuda)

printf '%-5s %-10s %-16s %10s %12s %8s %10s %10s\n' round preset engine median_ms official_ms speedup rss_mib rss_ratio
for round in $(seq 1 "$ROUNDS"); do
  for preset in $PRESETS; do
    official="$OUT_DIR/official-$preset-r$round.json"
    $PIN "$PY" tests/reference/bench_official.py "$preset" --device "$TORCH_DEVICE" --threads "$THREADS" \
      --runs "$RUNS" --json "$official" > /dev/null 2>&1
    rows=()
    for build in $BUILDS; do
      name=${build%%=*}
      bin=${build#*=}
      for type in $TYPES; do
        model="$OUT_DIR/$preset-$type.gguf"
        [ -f "$model" ] || "$WRITE_SYNTHETIC" "$preset" "$model" "$type" > /dev/null
        json="$OUT_DIR/$name-$preset-$type-r$round.json"
        $PIN "$bin" bench --model "$model" --device "$DEVICE" --threads "$THREADS" --runs "$RUNS" \
          --json "$json" > /dev/null
        rows+=("$name $type $json")
      done
    done
    if [ "$ONNX" = 1 ] && [ "$DEVICE" = cpu ]; then
      onnx="$OUT_DIR/onnxruntime-$preset-r$round.json"
      $PIN "$PY" tests/reference/onnx_speed.py "$preset" --threads "$THREADS" --runs "$RUNS" \
        --json "$onnx" > /dev/null 2>&1
      rows+=("onnxruntime f32 $onnx" "onnxruntime int8 $onnx")
    fi
    for row in "${rows[@]}"; do
      # shellcheck disable=SC2086
      "$PY" - "$official" "$round" "$preset" $row <<'PYEOF'
import json, sys
off = json.load(open(sys.argv[1]))
rnd, preset, name, kind, path = sys.argv[2:7]
rec = json.load(open(path))
d, rd = off["depth_path"]["median_ms"], off["depth_path_peak_rss_mib"]
if name == "onnxruntime":
    o, ro = rec[kind]["median_ms"], float("nan")
    extra = f"  (corr with f32 {rec['int8_corr_vs_f32']:.5f})" if kind == "int8" else ""
else:
    # `da3 bench` writes null where /proc/self/status is unreadable (not Linux).
    o, rss = rec["median_ms"], rec.get("peak_rss_bytes")
    ro = rss / 2**20 if rss else float("nan")
    extra = f"  ({rec['cpu']})" if "cpu" in rec else ""
print(f"{rnd:<5} {preset:<10} {name + ' ' + kind:<16} {o:10.1f} {d:12.1f} {d / o:7.2f}x"
      f" {ro:10.1f} {rd / ro:9.2f}x{extra}")
PYEOF
    done
  done
done
