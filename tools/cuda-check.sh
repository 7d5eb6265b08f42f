#!/usr/bin/env bash
# On a CUDA machine without Rust: builds ggml (CUDA, shared) from ggml's source, then times,
# checks and profiles a `da3` binary built elsewhere against a shared CPU-only ggml of the same
# source (docs/gpu.md, "A shared ggml instead"; `--features cuda-kernels` for our kernels).
#
#   BIN=dir-with-da3-and-write_synthetic GGML_SRC=ggml-source-dir tools/cuda-check.sh
#
# Environment (defaults in brackets):
#   WHAT     what to run: any of bench, check, ncu, stream ["bench check"]
#   VIEWS    scene sizes for bench ["1 2 4 8 16"]; LARGE=1 adds da3-large f16 at one image [1]
#   PLANS    `--plan cuda-attention=` settings, alternated in one run ["off on off on"]
#   OUT      where logs and ncu tables go [./cuda-check-out]
#   BUILD    the CMake build folder, reused when it holds libggml-cuda [./.gpu-build]
#   GGML_SRC a folder whose CMakeLists.txt adds ggml (the registry package has no ggml.pc.in,
#            so wrap it: `add_subdirectory(ggml ggml)` in a parent CMakeLists.txt)
# cuDNN (for cuda-attention=on) is taken from PyTorch's wheel when one is installed.
# bench: `da3 bench --views N --runs 10` per plan setting, synthetic base f16 weights.
# check: depth of one image and of an 8-view scene on the GPU (f16 file) against the CPU's f32
#        result (the f32 file of the same weights): correlation.
# ncu:   kernel time of one 16-view base scene per kernel name (Nsight Compute).
# profile: `da3 bench --profile` of a 16-view base scene (each node alone, by class of op).
# stream: `da3 stream --mesh --loop-closure` on 100 and 1,000 synthetic frames (a camera
#         panning twice around an ellipse over the test photo), with peak RSS and GPU memory.
set -u
cd "$(dirname "$0")/.."
B=${BIN:?BIN: the folder with da3 and write_synthetic}
OUT=${OUT:-$PWD/cuda-check-out}
GB=${BUILD:-$PWD/.gpu-build}
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
mkdir -p "$OUT"
WHAT=${WHAT:-"bench check"}
VIEWS=${VIEWS:-"1 2 4 8 16"}
LARGE=${LARGE:-1}
PLANS=${PLANS:-"off on off on"}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ ! -f "$GB/ggml/src/ggml-cuda/libggml-cuda.so" ]; then
  gen=Ninja
  command -v ninja >/dev/null || gen="Unix Makefiles"
  t0=$(date +%s)
  cmake -G "$gen" -S "${GGML_SRC:?GGML_SRC: ggml source wrapper}" -B "$GB" -DBUILD_SHARED_LIBS=ON \
    -DGGML_RPC=ON -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DGGML_CUDA_GRAPHS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES:-90}" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON >"$OUT/cmake.log" 2>&1 &&
    cmake --build "$GB" -j"$(nproc)" >>"$OUT/cmake.log" 2>&1 || {
    tail -40 "$OUT/cmake.log"
    exit 1
  }
  echo "ggml (CUDA) built in $(($(date +%s) - t0)) s"
fi
cudnn=$(python3 -c 'import nvidia.cudnn as c; print(list(c.__path__)[0] + "/lib")' 2>/dev/null)
export LD_LIBRARY_PATH=$GB/ggml/src:$GB/ggml/src/ggml-cuda:$GB/ggml/src/ggml-rpc:${cudnn:+$cudnn:}$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
"$B/da3" devices || exit 1
synthetic() { # PRESET-TYPE: writes $W/PRESET-TYPE.gguf once
  [ -f "$W/$1.gguf" ] || "$B/write_synthetic" "${1%-*}" "$W/$1.gguf" "${1##*-}" >/dev/null
}
synthetic da3-base-f16 || exit 1
"$B/da3" info --model "$W/da3-base-f16.gguf" --device CUDA0 --plan cuda-attention=on 2>&1 | grep -i -A2 "attention" | head -8

if [[ $WHAT == *bench* ]]; then
  for n in $VIEWS; do
    for p in $PLANS; do
      echo "== base f16, $n view(s), cuda-attention=$p"
      "$B/da3" bench --model "$W/da3-base-f16.gguf" --device CUDA0 --views "$n" --runs 10 \
        --plan cuda-attention="$p" 2>&1 | grep -iE "median|error"
    done
  done
  if [ "$LARGE" = 1 ]; then
    synthetic da3-large-f16
    for p in $PLANS; do
      echo "== large f16, 1 image, cuda-attention=$p"
      "$B/da3" bench --model "$W/da3-large-f16.gguf" --device CUDA0 --runs 10 \
        --plan cuda-attention="$p" 2>&1 | grep -iE "median|error"
    done
  fi
fi

if [[ $WHAT == *check* ]]; then
  python3 - "$W" <<'PY'
import sys
from PIL import Image, ImageOps
w = sys.argv[1]
im = Image.open("tests/fixtures/peer/test-640x480.png").convert("RGB")
views = [im, ImageOps.mirror(im), ImageOps.flip(im), im.rotate(8),
         im.crop((40, 30, 600, 450)).resize((640, 480)), ImageOps.mirror(im.rotate(-6)),
         im.crop((0, 0, 560, 420)).resize((640, 480)), ImageOps.autocontrast(im)]
for i, v in enumerate(views):
    v.save(f"{w}/v{i}.png")
PY
  inputs=()
  for i in 0 1 2 3 4 5 6 7; do inputs+=(--input "$W/v$i.png"); done
  # The reference: the CPU's f32 result, from the f32 file of the same synthetic weights (an
  # f16 file on the CPU may multiply in bf16, which is the CPU's own approximation).
  synthetic da3-base-f32 || exit 1
  for run in cpu:off CUDA0:off CUDA0:on; do
    dev=${run%:*} p=${run#*:}
    model=$W/da3-base-f16.gguf
    [ "$dev" = cpu ] && model=$W/da3-base-f32.gguf
    mkdir -p "$W/o-$dev-$p"
    "$B/da3" -q depth --model "$model" --device "$dev" --plan cuda-attention="$p" \
      --pfm "$W/o-$dev-$p/one.pfm" >/dev/null || echo "one image failed on $dev ($p)"
    "$B/da3" -q depth --model "$model" --device "$dev" --plan cuda-attention="$p" \
      "${inputs[@]}" --out-dir "$W/o-$dev-$p/scene" --view-maps pfm >/dev/null ||
      echo "scene failed on $dev ($p)"
  done
  python3 - "$W" <<'PY'
import glob, os, sys
import numpy as np
w = sys.argv[1]
def pfm(path):
    with open(path, "rb") as f:
        f.readline()
        width, height = map(int, f.readline().split())
        scale = float(f.readline())
        return np.fromfile(f, "<f4" if scale < 0 else ">f4").reshape(height, width)
for p in ["off", "on"]:
    one = np.corrcoef(pfm(f"{w}/o-cpu-off/one.pfm").ravel(),
                      pfm(f"{w}/o-CUDA0-{p}/one.pfm").ravel())[0, 1]
    views = [np.corrcoef(pfm(r).ravel(), pfm(r.replace("o-cpu-off", f"o-CUDA0-{p}")).ravel())[0, 1]
             for r in sorted(glob.glob(f"{w}/o-cpu-off/scene/view*.pfm"))
             if os.path.basename(r).count(".") == 1]
    print(f"check cuda-attention={p}: one image {one:.6f}; 8-view scene min {min(views):.6f} "
          f"mean {np.mean(views):.6f}")
PY
fi

if [[ $WHAT == *profile* ]]; then
  for p in ${NCU_PLANS:-on}; do
    echo "== profile, base f16, 16 views, cuda-attention=$p"
    "$B/da3" bench --model "$W/da3-base-f16.gguf" --device CUDA0 --views 16 --runs 2 \
      --plan cuda-attention="$p" --profile 2>&1 | sed -n '/^profile/,$p' | head -30
  done
fi

if [[ $WHAT == *ncu* ]]; then
  for p in ${NCU_PLANS:-on}; do
    ncu --metrics gpu__time_duration.sum --csv --target-processes all \
      "$B/da3" bench --model "$W/da3-base-f16.gguf" --device CUDA0 --views 16 --runs 1 \
      --plan cuda-attention="$p" >"$OUT/ncu-$p.csv" 2>"$OUT/ncu-$p.err"
    python3 - "$OUT/ncu-$p.csv" <<'PY'
import collections, csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
head = rows[0]
name, value, unit = (head.index(k) for k in ("Kernel Name", "Metric Value", "Metric Unit"))
ms = collections.defaultdict(float)
count = collections.Counter()
for r in rows[1:]:
    v = float(r[value].replace(",", ""))
    v /= {"nsecond": 1e6, "ns": 1e6, "usecond": 1e3, "us": 1e3}.get(r[unit], 1.0)
    k = r[name].replace("<unnamed>::", "").split("(")[0].split("<")[0][:60]
    ms[k] += v
    count[k] += 1
total = sum(ms.values())
print(f"{sys.argv[1]}: {total:.2f} ms in {sum(count.values())} kernels (warm-up + 1 scene)")
for k, v in sorted(ms.items(), key=lambda x: -x[1])[:18]:
    print(f"  {v:8.2f} ms {100 * v / total:5.1f}% x{count[k]:4d} {k}")
PY
  done
fi

if [[ $WHAT == *stream* ]]; then
  python3 - "$W" <<'PY'
# A camera panning twice around an ellipse over the test photo mirrored into a 2x2 mosaic:
# 640x427 frames whose second lap revisits the first.
import math, os, sys
from PIL import Image, ImageOps
w = sys.argv[1]
im = Image.open("tests/fixtures/peer/test-640x480.png").convert("RGB")
mosaic = Image.new("RGB", (1280, 960))
for (x, y), tile in [((0, 0), im), ((640, 0), ImageOps.mirror(im)), ((0, 480), ImageOps.flip(im)),
                     ((640, 480), ImageOps.mirror(ImageOps.flip(im)))]:
    mosaic.paste(tile, (x, y))
big = mosaic.resize((1920, 1440))
for n in (100, 1000):
    os.makedirs(f"{w}/frames{n}", exist_ok=True)
for i in range(1000):
    a = 2 * math.pi * i / 500
    x, y = int(640 + 560 * math.cos(a)) - 320, int(506 + 440 * math.sin(a)) - 213
    frame = big.crop((x, y, x + 640, y + 427))
    frame.save(f"{w}/frames1000/f{i:04d}.jpg", quality=90)
    if i < 100:
        frame.save(f"{w}/frames100/f{i:04d}.jpg", quality=90)
PY
  for m in ${STREAM_MODELS:-da3-small-f16 da3-base-f16}; do
    synthetic "$m"
    "$B/da3" -q bench --model "$W/$m.gguf" --device CUDA0 --views 12 --runs 5 2>&1 | grep -i median
    for n in ${FRAMES:-100 1000}; do
      echo "== stream $m, $n frames"
      (while sleep 0.5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done) >"$W/gpumem.txt" &
      sampler=$!
      python3 -c 'import resource, subprocess, sys, time
t = time.time(); rc = subprocess.run(sys.argv[1:]).returncode
print(f"wall {time.time() - t:.1f} s, exit {rc}, peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")' \
        "$B/da3" stream "$W/frames$n" --model "$W/$m.gguf" --device CUDA0 --out-dir "$W/s-$m-$n" \
        --mesh --loop-closure 2>&1 | tr '\r' '\n' | grep -v '^\s*$' | tail -8
      kill "$sampler"
      echo "peak GPU memory in use $(sort -n "$W/gpumem.txt" | tail -1) MiB (the whole card)"
    done
  done
fi
