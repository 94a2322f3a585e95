"""How a write runs: the engine (``kbflow.engine``) in this process, or its Prefect flow (``kbflow.flows``) as a flow
run, per ``flow.orchestrator``. The API's writes go through here, and so does an ingest that the engine is handed
(the reembed flow's quality check ingests its labelled corpus with ``ingest_sources``), so that ingest runs the
way any other does."""

from __future__ import annotations

import os

from kbflow.config import KbConfig
from kbflow.engine.ingest import IngestJob
from kbflow.engine.ingest import ingest as run_engine_ingest
from kbflow.runtime.environment import check_not_a_starting_worker, set_quiet_offline_defaults


def orchestration(config: KbConfig) -> str:
    """'prefect' or 'direct': how a write runs under ``config``.

    ``auto`` picks a Prefect flow run when a Prefect server is configured (``PREFECT_API_URL``): scheduled, UI and CI
    runs, and anyone watching the UI, see the run with its task runs, artifacts and logs. Without a server a flow
    run would first start a temporary one (15-30 s per process here, its records discarded at exit, a process
    that a SIGKILL orphans), so the engine runs in this process instead: same stages, retries, snapshots and
    summary, in about a second for a no-op. Process pools and Dask clusters are Prefect task runners, so
    ``runner.kind`` other than threads always runs as a flow.

    Every write asks this first, so it is where a write is refused inside a worker that is still starting
    (``check_not_a_starting_worker``): as a flow run it would wait for the run whose worker it is."""
    check_not_a_starting_worker()
    choice = config.flow.orchestrator
    if choice == "auto":
        return "prefect" if os.environ.get("PREFECT_API_URL") or config.runner.kind != "threads" else "direct"
    return choice


def as_flow_run(run):
    """``run()`` (which calls a flow) reporting to the configured Prefect server, or to a temporary one that dies
    with this process (``kbflow.tasks.server``) when none is configured; run logs go to the API only."""
    from prefect.settings import PREFECT_API_URL

    from kbflow.tasks.artifacts import run_logs_to_api_only
    from kbflow.tasks.server import temporary_server

    run_logs_to_api_only()
    if PREFECT_API_URL.value():  # the environment, a Prefect profile, or a test harness
        return run()
    with temporary_server():
        return run()


def run_ingest(config: KbConfig, job: IngestJob) -> dict:
    """Run ``job`` under ``config``: the engine in this process, or the ingest flow as a Prefect flow run."""
    if orchestration(config) == "direct":
        return run_engine_ingest(config, job)
    set_quiet_offline_defaults()  # a flow run starts here: Prefect's settings (importing kbflow sets no variables)
    from kbflow.flows.ingest import ingest as ingest_flow
    from kbflow.tasks.runners import with_task_runner

    flow = with_task_runner(ingest_flow, config)  # threads, processes or dask, as configured
    return as_flow_run(lambda: flow(sources=job.sources, namespace=job.namespace, texts=job.texts or None,
                                     dry_run=job.dry_run, force=job.force, allow_mass_delete=job.allow_mass_delete,
                                     config=config, add_only=job.add_only,
                                     roots=list(job.roots) or None, uploads=job.uploads or None))


def ingest_sources(sources: list[str], namespace: str, config: KbConfig) -> dict:
    """Ingest ``sources`` (existing files or folders) into ``namespace``; the run summary. The ingest callable the
    evaluator (``kbflow.engine.evaluate``) and a reembed's quality check take."""
    return run_ingest(config, IngestJob([str(source) for source in sources], namespace))
