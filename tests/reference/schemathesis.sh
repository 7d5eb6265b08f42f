#!/usr/bin/env bash
# Fuzzes `da3 serve`'s API from its own OpenAPI document with schemathesis (PyPI), bounded:
# a fixed number of generated requests per operation, the built-in model, loopback only.
# Passes when no request gets a 5xx (schemathesis' not_a_server_error check) or a response
# outside the documented ones.
#
#   python3 -m venv /tmp/st && /tmp/st/bin/pip install schemathesis
#   tests/reference/schemathesis.sh /tmp/st/bin/schemathesis [MAX_EXAMPLES]
set -euo pipefail
cd "$(dirname "$0")/../.."
st=${1:?path to the schemathesis program}
examples=${2:-25}
da3=${DA3:-target/release/da3}
work=$(mktemp -d)
trap 'kill "${server:-}" 2>/dev/null || true; rm -rf "$work"' EXIT
# Small images only: process_res is drawn from the whole documented range (14..2048).
"$da3" -q serve --addr 127.0.0.1:0 --timeout 60 > "$work/serve.out" &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/^listening on //p' "$work/serve.out")
[ -n "$url" ] || { echo "da3 serve did not start" >&2; exit 1; }
"$st" --version
"$st" run "$url/openapi.json" --checks not_a_server_error,status_code_conformance \
  --max-examples "$examples" --workers 1 --request-timeout 120 "${@:3}"
