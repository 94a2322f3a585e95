"""What a flow run shows in the Prefect UI besides its task runs: overall progress (moved by the engine's progress
events), the summary table, the failures page, and the engine's log lines in the run's logs.

The content comes from ``kbflow.ops.report``; this module only publishes it.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from kbflow.runtime import progress
from kbflow.ops import report
from kbflow.engine.ingest import round_thread_prefix

UPDATE_EVERY_S = 2.0


@contextmanager
def progress_artifact(namespace: str):
    """A progress artifact for this run, created when the engine announces how many documents it will process
    ("documents" event) and moved by its later events; while it embeds, its description says how many texts are
    done, the rate and the time left. Events reach only the listener of the run that made them (kbflow.runtime.progress:
    a backfill runs several namespaces in parallel threads, each updating its own artifact)."""
    state: dict = {"id": None, "tracker": None, "last": 0.0, "sent": 0.0}
    lock = threading.Lock()  # embed events come from the run's stage threads

    def on_event(stage: str, completed: int, total: int) -> None:
        with lock:
            if stage == "documents":
                state["tracker"] = report.RunProgress(total)
                state["id"] = create_progress_artifact(
                    0.0, key=report.artifact_key(namespace, "progress"),
                    description=f"kbflow ingest of {namespace}: {total} documents to process")
                return
            if state["tracker"] is None:
                return
            percent = state["tracker"].update(stage, completed, total)
            # at most one update every UPDATE_EVERY_S (a fast model reports many model calls a second)
            if percent is None or (time.monotonic() - state["sent"] < UPDATE_EVERY_S and percent < 99.0):
                return
            state["last"], state["sent"] = percent, time.monotonic()
            update_progress_artifact(state["id"], round(percent, 1), description=(
                f"kbflow ingest of {namespace}: {state['tracker'].description()}" if stage == "embed" else None))

    with progress.also_listening(on_event):
        yield
    if state["id"] is not None and state["last"] != 100.0:  # nothing to process, or the last event fell short
        update_progress_artifact(state["id"], 100.0)


def publish_summary(summary: dict) -> dict:
    """The run summary as a table artifact and its failures as a markdown artifact; returns the summary."""
    namespace = summary["namespace"]
    kind = "plan" if summary.get("dry_run") else "run"
    create_table_artifact(report.summary_rows(summary), key=report.artifact_key(namespace, f"{kind}-summary"),
                          description=f"kbflow {kind} {summary['run_id']} of {namespace}")
    create_markdown_artifact(report.failures_markdown(summary), key=report.artifact_key(namespace, "failures"),
                             description=f"failures of kbflow {kind} {summary['run_id']} of {namespace}")
    return summary


class _ToRunLogger(logging.Handler):
    """Re-emits the engine's records from the flow run's thread (and its embedding round's) on that run's logger."""

    def __init__(self, run_logger):
        super().__init__(level=logging.INFO)
        self.run_logger = run_logger
        self.owner = threading.get_ident()
        self.round_thread = round_thread_prefix(self.owner)  # the run's embedding rounds log from there

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.owner or (record.threadName or "").startswith(self.round_thread + "_"):
            self.run_logger.log(record.levelno, record.getMessage())


_forwarding = {"runs": 0, "saved": (logging.NOTSET, True)}
_forwarding_lock = threading.Lock()


@contextmanager
def engine_logs_in_run():
    """The engine logs through the standard ``kbflow`` logger (it never imports Prefect); inside a flow run its
    INFO and higher lines go to the run's logger instead, so they appear in the run's logs in the UI (and on the
    console as Prefect's own lines do, per PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL), once. Runs in parallel
    threads (a backfill) each forward their own thread's lines."""
    handler = _ToRunLogger(get_run_logger())
    logger = logging.getLogger("kbflow")
    with _forwarding_lock:
        if _forwarding["runs"] == 0:
            _forwarding["saved"] = (logger.level, logger.propagate)
            logger.setLevel(logging.INFO)
            logger.propagate = False
        _forwarding["runs"] += 1
        logger.addHandler(handler)
    try:
        yield
    finally:
        with _forwarding_lock:
            logger.removeHandler(handler)
            _forwarding["runs"] -= 1
            if _forwarding["runs"] == 0:
                logger.level, logger.propagate = _forwarding["saved"]


def run_logs_to_api_only() -> None:
    """Flow and task run log lines go to the Prefect API (the UI shows them), not to this process's stderr: a
    caller of the library or the CLI gets kbflow's own summary and one-line errors, not Prefect's INFO lines
    and tracebacks. `kbflow serve` and workers keep Prefect's console logging."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).propagate = False
