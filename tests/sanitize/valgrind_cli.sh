#!/usr/bin/env bash
# Runs the CLI's main paths under valgrind's memcheck on the release binary and fails on the
# first invalid read or write, use of uninitialised memory, or definite leak.
#
#   tests/sanitize/valgrind_cli.sh [path/to/da3]     (default: target/portable/release/da3)
#
# Use a baseline build (RUSTFLAGS="-C target-cpu=x86-64" CARGO_TARGET_DIR=target/portable
# cargo build --release -p da3-cli): a `target-cpu=native` binary can hold instructions
# valgrind cannot decode (crc32fast's VPCLMULQDQ path, compiled in when the CPU has it). The
# baseline binary still runs the AVX2 kernels, chosen at run time.
#
# Small inputs keep it to a few minutes: the built-in model at a low processing resolution,
# the peer-written GGUF, a two-view scene, a file conversion, and error paths (corrupt GGUF,
# truncated PNG). Each run's log is kept in $LOG_DIR (default target/valgrind).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DA3=${1:-$ROOT/target/portable/release/da3}
LOG_DIR=${LOG_DIR:-$ROOT/target/valgrind}
PEER=$ROOT/tests/fixtures/peer
mkdir -p "$LOG_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=0
# memcheck NAME EXPECTED_EXIT ARGS...
memcheck() {
  local name=$1 expected=$2
  shift 2
  local log="$LOG_DIR/$name.log" status=0
  valgrind --tool=memcheck --error-exitcode=99 --leak-check=full \
    --errors-for-leak-kinds=definite --show-leak-kinds=definite --track-origins=yes \
    --log-file="$log" "$DA3" -q "$@" > "$LOG_DIR/$name.out" 2>&1 || status=$?
  local summary
  summary=$(grep -E "ERROR SUMMARY" "$log" | tail -1 | sed 's/^==[0-9]*== //')
  if [ "$status" = 99 ] || [ "$status" != "$expected" ]; then
    echo "FAIL $name: exit $status (expected $expected); $summary; log $log"
    failed=1
  else
    echo "ok   $name: exit $status; $summary"
  fi
}

head -c 100000 "$PEER/peer-tiny-seed0-f32.gguf" > "$work/truncated.gguf"
head -c 3000 "$PEER/test-640x480.png" > "$work/truncated.png"
cp "$PEER/test-640x480.png" "$work/a.png"
mkdir "$work/scene"

memcheck info-builtin 0 info --device cpu --threads 2
memcheck depth-builtin 0 depth --device cpu --threads 2 --process-res 140 \
  --pfm "$work/d.pfm" --png "$work/d.png" --pose "$work/pose.json"
memcheck depth-peer 0 depth --device cpu --threads 2 --process-res 140 \
  --model "$PEER/peer-tiny-seed0-f32.gguf" --input "$PEER/test-640x480.png" --pfm "$work/p.pfm"
memcheck scene-two-views 0 depth --device cpu --threads 2 --process-res 140 \
  --model "$PEER/peer-tiny-seed0-f32.gguf" --input "$PEER/test-640x480.png" --input "$work/a.png" \
  --out-dir "$work/scene"
memcheck info-peer 0 info --device cpu --model "$PEER/peer-tiny-seed0-f32.gguf"
memcheck error-truncated-gguf 1 depth --device cpu --model "$work/truncated.gguf" --pfm "$work/x.pfm"
memcheck error-truncated-png 1 depth --device cpu --process-res 140 --input "$work/truncated.png" \
  --pfm "$work/y.pfm"
memcheck error-bad-process-res 1 depth --process-res 100000
exit $failed
