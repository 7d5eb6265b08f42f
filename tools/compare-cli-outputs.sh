#!/usr/bin/env bash
# Byte-for-byte comparison of every file two `da3` binaries write for the same inputs: one
# image (every map and export), a scene of two views, known cameras (poses.json read back),
# the nested metric pair, and `batch`. For restructurings that must not change outputs: build
# the old commit's binary, then
#   tools/compare-cli-outputs.sh OLD/da3 NEW/da3
# prints one line per file and exits 1 when any differs. Runs on the repository's fixtures
# (the peer file written by depth-anything.cpp's converter and its metric partner).
set -euo pipefail
old=$1
new=$2
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/tests/fixtures/peer/peer-tiny-seed0-f32.gguf
metric=$root/tests/fixtures/da3-tiny-nested/peer-metric-tiny-f32.gguf
photo=$root/tests/fixtures/peer/test-640x480.png
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$photo" "$work/a.png"
# A second view: the same photo mirrored (with ffmpeg where there is one).
ffmpeg -loglevel error -i "$work/a.png" -vf hflip "$work/b.png" 2>/dev/null || cp "$photo" "$work/b.png"

run() { # NAME ARGS...: runs both binaries with ARGS, outputs under $work/{old,new}/NAME
  local name=$1
  shift
  for side in old new; do
    local bin=$old
    [ $side = new ] && bin=$new
    local dir=$work/$side/$name
    mkdir -p "$dir"
    (cd "$dir" && "$bin" -q "$@" --device cpu --threads 2 >stdout.txt 2>stderr.txt) || {
      echo "$side $name failed:"
      cat "$dir/stderr.txt"
      exit 1
    }
    rm -f "$dir/stderr.txt"
  done
}

one="--model $model --input $work/a.png"
run depth depth $one --pfm d.pfm --png d.png --png16 d16.png --conf c.pfm --pose p.json \
  --ply d.ply --glb d.glb --npz d.npz --colmap sparse
run depth-resized depth $one --resize-to-input --pfm d.pfm --png16 d16.png --conf c.pfm
run depth-res depth $one --process-res 280 --pfm d.pfm --ply d.ply
mkdir -p "$work/old/scene/out" "$work/new/scene/out"
run scene depth --model $model --input $work/a.png --input $work/b.png --out-dir out \
  --view-maps pfm,png,png16,conf --ply s.ply --glb s.glb --npz s.npz --colmap sparse
for side in old new; do
  cp "$work/old/scene/out/poses.json" "$work/$side-poses.json"
  mkdir -p "$work/$side/posed/out"
done
# The peer file has no camera encoder; the built-in model has one.
run posed depth --input $work/a.png --input $work/b.png --out-dir out \
  --poses "$work/old-poses.json" --ply s.ply
mkdir -p "$work/old/nested/out" "$work/new/nested/out"
run nested depth --model $model --metric-model $metric --input $work/a.png --input $work/b.png \
  --out-dir out --ply s.ply
run batch batch --model $model $work/a.png $work/b.png --out-dir out \
  --outputs pfm,png,png16,conf,pose,ply,glb,npz,colmap

status=0
while IFS= read -r file; do
  rel=${file#"$work/old/"}
  case $rel in
    */stdout.txt | */summary.json) continue ;; # timings and paths differ by nature
  esac
  if cmp -s "$file" "$work/new/$rel"; then
    echo "identical  $rel"
  else
    echo "DIFFERENT  $rel"
    status=1
  fi
done < <(find "$work/old" -type f | sort)
# Nothing new may appear either.
(cd "$work/old" && find . -type f | sort) >"$work/old.list"
(cd "$work/new" && find . -type f | sort) >"$work/new.list"
if ! diff -q "$work/old.list" "$work/new.list" >/dev/null; then
  echo "the two binaries wrote different sets of files:"
  diff "$work/old.list" "$work/new.list" || true
  status=1
fi
exit $status
