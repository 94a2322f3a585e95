#!/usr/bin/env bash
# Set up (idempotent) and run the whole test suite. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# two workers, one test file each at a time (module fixtures stay in one process): CI stays well inside 30 min
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
