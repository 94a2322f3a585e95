"""Prefect artifacts of a run: overall progress (updated per embed batch), the summary table, the failures page.

The content comes from ``kbflow.report``; this module only publishes it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from kbflow import progress, report


@contextmanager
def progress_artifact(namespace: str, total_documents: int, doc_batch: int):
    """A progress artifact for the run, moved by the flow's progress events from this thread only (a backfill
    runs several namespaces in parallel threads; each updates its own artifact)."""
    artifact_id = create_progress_artifact(
        0.0, key=report.artifact_key(namespace, "progress"),
        description=f"kbflow ingest of {namespace}: {total_documents} documents to process")
    tracker = report.RunProgress(total_documents, doc_batch)
    owner = threading.get_ident()
    last = [0.0]

    def on_event(stage: str, completed: int, total: int) -> None:
        if threading.get_ident() != owner:
            return
        percent = tracker.update(stage, completed, total)
        if percent is not None and percent != last[0]:
            last[0] = percent
            update_progress_artifact(artifact_id, round(percent, 1))

    with progress.also_listening(on_event):
        yield
    if last[0] != 100.0:  # nothing to process, or the last event did not land on the total
        update_progress_artifact(artifact_id, 100.0)


def publish_summary(summary: dict) -> dict:
    """The run summary as a table artifact and its failures as a markdown artifact; returns the summary."""
    namespace = summary["namespace"]
    kind = "plan" if summary.get("dry_run") else "run"
    create_table_artifact(report.summary_rows(summary), key=report.artifact_key(namespace, f"{kind}-summary"),
                          description=f"kbflow {kind} {summary['run_id']} of {namespace}")
    create_markdown_artifact(report.failures_markdown(summary), key=report.artifact_key(namespace, "failures"),
                             description=f"failures of kbflow {kind} {summary['run_id']} of {namespace}")
    return summary
