#!/usr/bin/env bash
# Makes the README's pictures: the depth colormap of the test photo, a headless-Chromium
# screenshot of `da3 view`'s page for the photo's point cloud, and one of a streamed mesh.
#
#   tools/viewer-screenshot.sh [OUT_DIR]      (default docs/)
#
# Needs a built `da3` (target/release/da3, or $DA3), Debian's `chromium`, curl and python3.
# The model is the peer GGUF fixture (depth-anything.cpp's converter, seeded weights): the
# depth is the right shape, not a trained model's. The point cloud comes from `da3 serve`
# (outputs=glb) on a loopback port, so the script needs nothing beyond this branch.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs}
da3=${DA3:-target/release/da3}
model=tests/fixtures/peer/peer-tiny-seed0-f32.gguf
photo=tests/fixtures/peer/test-640x480.png
chromium=$(command -v chromium || command -v chromium-browser || true)
[ -n "$chromium" ] || { echo "chromium not found: apt-get install chromium" >&2; exit 1; }
[ -x "$da3" ] || { echo "$da3 not found: cargo build --release -p da3-cli" >&2; exit 1; }
mkdir -p "$out"
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT

cp "$photo" "$out/input-640x480.png"
"$da3" -q depth --model "$model" --input "$photo" --png "$out/depth-640x480.png"

"$da3" -q serve --model "$model" --addr 127.0.0.1:0 > "$work/serve.out" &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$work/serve.out")
[ -n "$url" ] || { echo "da3 serve did not start" >&2; exit 1; }
curl -sf -F "image=@$photo" -F outputs=glb "$url/v1/depth" -o "$work/answer.json"
kill "$server"; wait "$server" || true; server=
python3 -c 'import base64, json, sys
answer = json.load(open(sys.argv[1]))
open(sys.argv[2], "wb").write(base64.b64decode(answer["images"][0]["outputs"]["glb"]))' \
  "$work/answer.json" "$work/scene.glb"
"$da3" view "$work/scene.glb" --output "$work/scene.html"

# SwiftShader (software WebGL); the page's hash sets the orbit angles.
"$chromium" --headless --no-sandbox --disable-dev-shm-usage --use-angle=swiftshader \
  --enable-unsafe-swiftshader --hide-scrollbars --window-size=720,450 \
  --virtual-time-budget=5000 --screenshot="$work/viewer.png" \
  "file://$(realpath "$work/scene.html")#yaw=-0.6&pitch=0.2" 2>/dev/null
cp "$work/viewer.png" "$out/viewer.png"

# The streamed room (examples/stream_room.rs: the stream tests' synthetic room, drifting
# windows, one loop closed, fused) in `da3 view`.
cargo run --release --quiet --example stream_room -- "$work/room"
"$da3" view "$work/room"
"$chromium" --headless --no-sandbox --disable-dev-shm-usage --use-angle=swiftshader \
  --enable-unsafe-swiftshader --hide-scrollbars --window-size=720,450 \
  --virtual-time-budget=8000 --screenshot="$out/stream-room.png" \
  "file://$(realpath "$work/room/view.html")#yaw=0.8&pitch=0.9" 2>/dev/null
ls -l "$out/input-640x480.png" "$out/depth-640x480.png" "$out/viewer.png" "$out/stream-room.png"
