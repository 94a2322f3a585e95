#!/usr/bin/env bash
# Launch a kbflow deployment run on a Prefect server and wait for it; exit non-zero unless it Completed.
# Works in any CI: needs PREFECT_API_URL (and PREFECT_API_KEY for Prefect Cloud) in the environment and a
# process serving the deployments (`kbflow serve`) or a worker on its work pool (`prefect worker start`).
#
#   deployments/ci/backfill.sh                               # backfill every configured namespace
#   deployments/ci/backfill.sh '{"namespaces": ["docs"], "changed_since": "2026-11-01", "rebuild": false}'
#   KBFLOW_DEPLOYMENT=kbflow-ingest-request/on-demand deployments/ci/backfill.sh '{"namespace": "docs"}'
#
# Environment: KBFLOW_DEPLOYMENT (default kbflow-backfill/backfill), KBFLOW_WATCH_TIMEOUT seconds (default 21600),
# PREFECT (the prefect command, default `prefect`).
set -euo pipefail

request="${1:-{\}}"
deployment="${KBFLOW_DEPLOYMENT:-kbflow-backfill/backfill}"
timeout="${KBFLOW_WATCH_TIMEOUT:-21600}"
prefect_cmd="${PREFECT:-prefect}"

if [ -z "${PREFECT_API_URL:-}" ]; then
  echo "backfill.sh: PREFECT_API_URL is not set; point it at the Prefect server's API (http://HOST:4200/api)" >&2
  exit 2
fi

log="$(mktemp)"
trap 'rm -f "$log"' EXIT
set +e
# Prefect 3.9.1: --watch exits 0 only when the run ends Completed and 1 for Failed, Crashed, Cancelled or a
# watch timeout. Older Prefect 2 releases exited 0 whatever the final state, so the final line is checked too.
"$prefect_cmd" deployment run "$deployment" --param "request=$request" --watch --watch-timeout "$timeout" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
  echo "backfill.sh: $deployment did not complete (prefect exited $status); see the flow run's logs and artifacts" >&2
  exit "$status"
fi
if ! grep -q "finished successfully in 'Completed'" "$log"; then
  echo "backfill.sh: prefect exited 0 but the run did not report Completed; treating it as failed" >&2
  exit 1
fi
echo "backfill.sh: $deployment completed"
