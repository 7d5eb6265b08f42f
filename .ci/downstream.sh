#!/usr/bin/env bash
# Builds a scratch crate OUTSIDE the repository that depends on the library by path, with the
# README's "From Rust" snippet as its main (model and image paths pointed at the peer-written
# fixture), runs it, and checks that it wrote a PNG. This is what a downstream user builds:
# no .cargo/config.toml of ours applies, and it has a target folder of its own.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cat > "$work/Cargo.toml" <<TOML
[package]
name = "da3-downstream"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
da3 = { path = "$repo" }

[profile.release]
debug = false
TOML
# The README's snippet, verbatim but for the two paths.
awk '/^```rust,no_run$/{on=1; next} /^```$/{if(on){exit}} on' "$repo/README.md" \
  | sed -e "s#\"depth-anything-small-f32.gguf\"#\"$repo/tests/fixtures/peer/peer-tiny-seed0-f32.gguf\"#" \
        -e "s#\"photo.jpg\"#\"$repo/tests/fixtures/peer/test-640x480.png\"#" \
  > "$work/src/main.rs"
grep -q 'peer-tiny-seed0-f32.gguf' "$work/src/main.rs" || { echo "README snippet not found"; exit 1; }
cp "$repo/Cargo.lock" "$work/Cargo.lock"
started=$(date +%s)
(cd "$work" && cargo build --release --quiet)
echo "downstream build (clean, default target, no target-cpu): $(( $(date +%s) - started )) s"
(cd "$work" && ./target/release/da3-downstream)
test -s "$work/depth.png" || { echo "the snippet wrote no depth.png"; exit 1; }
echo "downstream: the README snippet wrote depth.png ($(stat -c %s "$work/depth.png") bytes)"
