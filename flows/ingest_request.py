"""The deployed ingest: one typed request (the Prefect UI shows it as a validated form) → the ingest flow.

Nightly and on-demand deployments both run this flow. It resolves the config name, picks the task runner the
config asks for, runs ``flows/ingest.py:ingest`` as a subflow, and ends Failed when documents failed (their
messages are in the failures artifact), so schedules and CI notice.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from kbflow.flows.ingest import ingest
from kbflow.deploy import IngestRequest, failed_documents_message, load_named_config
from kbflow.errors import PermanentError
from kbflow.tasks.runners import with_task_runner


class DocumentsFailed(PermanentError):
    """Some documents could not be ingested; the rest were."""


@flow(name="kbflow-ingest-request", log_prints=True, validate_parameters=True)
def ingest_request(request: IngestRequest = IngestRequest()) -> dict:
    """Ingest one namespace as the request says; returns the run summary."""
    config = load_named_config(request.config)
    get_run_logger().info("ingest request: namespace=%s sources=%s config=%s runner=%s dry_run=%s force=%s",
                          request.namespace or config.namespace, request.sources or config.sources, request.config,
                          config.runner.kind, request.dry_run, request.force)
    summary = with_task_runner(ingest, config)(
        sources=request.sources or None, namespace=request.namespace, config=config,
        dry_run=request.dry_run, force=request.force, allow_mass_delete=request.allow_mass_delete)
    if summary["failures"]:
        raise DocumentsFailed(failed_documents_message(summary))
    return summary
