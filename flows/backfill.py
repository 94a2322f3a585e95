"""Backfill: ingest (or rebuild) many configured namespaces, a bounded number at once.

Each namespace runs the ingest flow as a subflow inside a task, so ``concurrency`` of them overlap; the
namespace lock still keeps one writer per namespace. One namespace failing does not stop the others; the
backfill ends Failed naming them, after publishing a table of every namespace's outcome.
"""

from __future__ import annotations

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from kbflow.flows.ingest import ingest
from kbflow.config import KbConfig
from kbflow.ops.deploy import (BackfillRequest, backfill_targets, changed_since, check_served_sources, load_served_config,
                           sources_of)
from kbflow.core.errors import KbflowError, PermanentError
from kbflow.tasks.runners import with_task_runner
from kbflow.tasks.runs import completed_from_deployment


class BackfillFailed(PermanentError):
    """Some namespaces of a backfill failed; the others were ingested."""


@task(name="ingest-namespace", task_run_name="ingest namespace {namespace}", cache_policy=NO_CACHE)
def ingest_namespace(namespace: str, sources: list[str], config: KbConfig, force: bool, dry_run: bool,
                     roots: list[str] | None = None) -> dict:
    return with_task_runner(ingest, config)(sources=sources, namespace=namespace, config=config, force=force,
                                            dry_run=dry_run, roots=roots)


# threads only carry waiting subflows; request.concurrency (≤ 32) bounds how many run
@flow(name="kbflow-backfill", log_prints=True, validate_parameters=True,
      task_runner=ThreadPoolTaskRunner(max_workers=32))  # type: ignore[arg-type]  # Prefect types its decorator against its own runner
def backfill(request: BackfillRequest = BackfillRequest()) -> dict:
    """Ingest the requested namespaces; returns {namespace: outcome}."""
    logger = get_run_logger()
    request = completed_from_deployment(request)
    config = load_served_config(request.config)  # only configs in the configs folder
    targets = backfill_targets(config, request.namespaces)
    outcomes: dict[str, dict] = {}
    todo: list[tuple[str, list[str], list[str]]] = []
    for schedule in targets:
        # every namespace's sources checked against deploy.source_roots before any is read (kbflow.core.trust); a
        # namespace refused here fails alone, the others go on
        try:
            sources, allowed = check_served_sources(config, sources_of(config, schedule))
        except KbflowError as exc:
            outcomes[schedule.namespace] = {"status": "failed", "detail": f"{type(exc).__name__}: {exc}"}
            continue
        if request.changed_since and not changed_since(sources, request.changed_since):
            outcomes[schedule.namespace] = {"status": "skipped", "detail": f"nothing modified since {request.changed_since}"}
        else:
            todo.append((schedule.namespace, sources, list(allowed)))
    concurrency = request.concurrency or config.deploy.backfill_concurrency
    logger.info("backfill of %d namespaces (%d skipped as unchanged), %d at a time", len(todo),
                len(outcomes), concurrency)
    running: dict[PrefectFuture[dict], str] = {}
    while todo or running:
        while todo and len(running) < concurrency:
            namespace, sources, roots = todo.pop(0)
            running[ingest_namespace.submit(namespace, sources, config, request.rebuild, request.dry_run,
                                            roots)] = namespace
        future = next(as_completed(list(running)))
        namespace = running.pop(future)
        try:
            summary = future.result()
        except Exception as exc:  # one namespace's error; the others go on
            outcomes[namespace] = {"status": "failed", "detail": f"{type(exc).__name__}: {str(exc)[:500]}"}
            continue
        outcomes[namespace] = {"status": "documents failed" if summary["failures"] else "ok",
                               "detail": f"documents {summary['documents']}, chunks {summary['chunks']}",
                               "run_id": summary["run_id"]}
    create_table_artifact([{"namespace": name, **outcome} for name, outcome in sorted(outcomes.items())],
                          key="kbflow-backfill", description="kbflow backfill: one row per namespace")
    bad = sorted(name for name, outcome in outcomes.items() if outcome["status"] in ("failed", "documents failed"))
    if bad:
        raise BackfillFailed(f"backfill: namespaces {bad} failed (the others completed): "
                             + "; ".join(f"{name}: {outcomes[name]['detail']}" for name in bad))
    return outcomes
