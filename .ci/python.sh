#!/usr/bin/env bash
# The Python package as a user installs it: a fresh venv, `pip install .[test]` at the
# repository's root (maturin builds python/ against the library), then its tests, which compare
# with the official outputs and with the CLI that `cargo test --release --workspace` built.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="$(mktemp -d)"
trap 'rm -rf "$venv"' EXIT
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --upgrade pip
(cd "$repo" && "$venv/bin/pip" install --quiet ".[test]")
# Outside the repository, so that `import da3` is the installed package, not python/da3.
(cd "$venv" && DA3_BIN="$repo/target/release/da3" "$venv/bin/python" -m pytest -q "$repo/python/tests")
