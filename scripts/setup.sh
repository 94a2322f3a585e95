#!/usr/bin/env bash
# Create .venv and install kbflow with every extra and its test tools (what the test suite needs), or with the
# extras named in the first argument ('' for the core alone, as scripts/quickstart.sh does). Idempotent: a second
# run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1-all,test,bench}"
PYTHON_BIN="${PYTHON:-}"
if [ -z "$PYTHON_BIN" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON_BIN="$candidate"; break; fi
  done
fi
[ -x .venv/bin/python ] || "$PYTHON_BIN" -m venv .venv
# CPU torch first (the default e5 embedder runs on it): without it pip would pull a multi-GB CUDA build
.venv/bin/pip install --quiet --disable-pip-version-check torch==2.13.0
# uv resolves kbflow's ~250 dependencies in seconds (pip's own resolver has backtracked for over 20 minutes on this
# set); the constraints pin the versions the suite passed with. uv keeps the CPU torch installed above.
.venv/bin/pip install --quiet --disable-pip-version-check uv==0.13.9
.venv/bin/uv pip install --quiet --python .venv/bin/python -c scripts/constraints.txt -e ".${EXTRAS:+[$EXTRAS]}"
