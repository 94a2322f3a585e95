#!/usr/bin/env bash
# Set up the core (no extras: the sample is HTML, PDF, DOCX and Markdown), ingest the bundled sample corpus into the
# default namespace (LanceDB + packaged local model, no server, no API key), and run one search.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh ''
.venv/bin/kbflow ingest data/sample
.venv/bin/kbflow search "How does PostgreSQL handle concurrent transactions?" --limit 3
