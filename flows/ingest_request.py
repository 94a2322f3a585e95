"""The deployed ingest: one typed request (the Prefect UI shows it as a validated form) → the engine's ingest, in
this flow run: its task runs, progress, summary and failures artifacts and logs belong to the run that was
started. A request that sets only some fields keeps the deployment's others (``kbflow.tasks.runs``). The run ends
Failed when the ingest recorded failures (their messages are in the failures artifact), so schedules and CI
notice. A form is someone else: its config must be one of the configs folder's and its sources must lie under
``deploy.source_roots`` (``kbflow.ops.deploy.check_served_sources``), or the run fails before reading anything.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

from kbflow.ops.deploy import IngestRequest, check_served_sources, failed_documents_message, load_served_config
from kbflow.engine.ingest import IngestJob
from kbflow.core.errors import PermanentError
from kbflow.flows.ingest import MAX_WORKERS, run_ingest
from kbflow.tasks.runs import completed_from_deployment


class DocumentsFailed(PermanentError):
    """Some documents could not be ingested; the rest were."""


@flow(name="kbflow-ingest-request", log_prints=True, validate_parameters=True,
      task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS))  # type: ignore[arg-type]  # Prefect types its decorator against its own runner
def ingest_request(request: IngestRequest = IngestRequest()) -> dict:
    """Ingest one namespace as the request says; returns the run summary."""
    request = completed_from_deployment(request)
    config = load_served_config(request.config)  # only configs in the configs folder
    # someone else's sources: each must lie under deploy.source_roots before anything is read (kbflow.core.trust)
    sources, roots = check_served_sources(config, request.sources or config.sources)
    get_run_logger().info("ingest request: namespace=%s sources=%s config=%s dry_run=%s force=%s",
                          request.namespace or config.namespace, sources, request.config,
                          request.dry_run, request.force)
    summary = run_ingest(config, IngestJob(sources or None, request.namespace, dry_run=request.dry_run,
                                           force=request.force, allow_mass_delete=request.allow_mass_delete,
                                           roots=roots))
    if summary["failures"]:
        raise DocumentsFailed(failed_documents_message(summary))
    return summary
