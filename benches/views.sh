#!/usr/bin/env bash
# Time a multi-view scene against the number of views: `da3 depth` with N inputs (one forward
# of all N views together; model load included, about 0.1 s for da3-small), median of RUNS,
# and its peak RSS (/usr/bin/time). Inputs: the peer test photo, shifted copies made here.
#
#   benches/views.sh [preset] [process_res] [threads]      (default: da3-small 504 2)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PRESET=${1:-da3-small}
RES=${2:-504}
THREADS=${3:-2}
RUNS=${RUNS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$ROOT"
cargo build --release --quiet -p da3-cli -p da3 --bin da3 --example write_synthetic
target/release/examples/write_synthetic "$PRESET" "$work/model.gguf" f32 > /dev/null
for i in 0 1 2 3 4; do
  ffmpeg -loglevel error -y -i tests/fixtures/peer/test-640x480.png \
    -vf "crop=600:450:$((i * 8)):$((i * 6)),scale=640:480" "$work/v$i.png"
done
grep -m1 "model name" /proc/cpuinfo
printf '%-6s %12s %12s %12s\n' views median_ms per_view_ms peak_rss_mib
for n in 1 2 3 5; do
  inputs=()
  for i in $(seq 0 $((n - 1))); do inputs+=(--input "$work/v$i.png"); done
  times=()
  rss=0
  for r in $(seq 1 "$RUNS"); do
    rm -rf "$work/out" && mkdir "$work/out"
    start=$(date +%s%N)
    /usr/bin/time -f "%M" -o "$work/rss" target/release/da3 -q depth --model "$work/model.gguf" \
      "${inputs[@]}" --out-dir "$work/out" --device cpu --threads "$THREADS" --process-res "$RES" > /dev/null
    times+=($(( ($(date +%s%N) - start) / 1000000 )))
    rss=$(( $(cat "$work/rss") > rss ? $(cat "$work/rss") : rss ))
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (RUNS + 1) / 2 ))p")
  printf '%-6s %12s %12s %12s\n' "$n" "$median" "$((median / n))" "$((rss / 1024))"
done
