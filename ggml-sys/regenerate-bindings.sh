#!/usr/bin/env bash
# Regenerates the committed bindings from the pinned headers (needs libclang).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -p da3-ggml-sys --features bindgen --message-format=json \
  | grep -o '"out_dir":"[^"]*ggml-sys[^"]*"' | tail -1 | cut -d'"' -f4 > /tmp/ggml-sys-out-dir
cp "$(cat /tmp/ggml-sys-out-dir)/bindings.rs" ggml-sys/src/bindings.rs
echo "ggml-sys/src/bindings.rs regenerated"
