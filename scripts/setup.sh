#!/usr/bin/env bash
# Create .venv and install kbflow with its test tools. Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_BIN="${PYTHON:-}"
if [ -z "$PYTHON_BIN" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON_BIN="$candidate"; break; fi
  done
fi
[ -x .venv/bin/python ] || "$PYTHON_BIN" -m venv .venv
# CPU torch first: without it pip would pull a multi-GB CUDA build for sentence-transformers
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
.venv/bin/pip install --quiet --disable-pip-version-check -e '.[test,bench]'
