#!/usr/bin/env bash
# Multi-view parity for a preset larger than the committed da3-tiny fixture: the official
# multi-view forward (tests/reference/da3_multiview_reference.py: 2, 3 and 5 views, every
# reference-view strategy, known poses, the ray branch) on that preset's synthetic weights,
# then tests/da3_multiview.rs's parity tests against it (DA3_MULTIVIEW_FIXTURE).
#
#   tests/reference/multiview_parity.sh PYTHON [preset] [process_res]
#   e.g. tests/reference/multiview_parity.sh /path/to/venv/bin/python da3-small 504
set -euo pipefail
PY=${1:?usage: multiview_parity.sh PYTHON [preset] [process_res]}
PRESET=${2:-da3-small}
RES=${3:-504}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$PY" tests/reference/da3_multiview_reference.py --preset "$PRESET" --process-res "$RES" --out "$out"
DA3_MULTIVIEW_FIXTURE="$out" cargo test --release --test da3_multiview -- --test-threads 1 \
  --nocapture scenes_match ray_branch_matches known_poses_match 2>&1 | grep -E "^test |Agreement|test result"
