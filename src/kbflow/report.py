"""What a run shows in the Prefect UI, as plain data: summary table rows, a failures page, overall progress.

No Prefect here; ``tasks/artifacts.py`` publishes these as artifacts.
"""

from __future__ import annotations

import re

STAGE_ORDER = ("scan", "convert", "split", "chunk", "embed", "upsert", "total")


def artifact_key(namespace: str, kind: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"[^a-z0-9-]+", "-", f"kbflow-{namespace.lower()}-{kind}").strip("-")


def summary_rows(summary: dict) -> list[dict]:
    """One row per figure: documents new/changed/unchanged/removed/failed, chunks, store, seconds per stage, chunk
    quality (one row per warning)."""
    rows = [{"group": "documents", "item": key, "value": value} for key, value in summary["documents"].items()]
    rows += [{"group": "chunks", "item": key, "value": value} for key, value in summary["chunks"].items()]
    rows.append({"group": "store", "item": "count", "value": summary["store"]["count"]})
    seconds = summary.get("seconds", {})
    rows += [{"group": "seconds", "item": stage, "value": seconds[stage]} for stage in STAGE_ORDER if stage in seconds]
    quality = summary.get("chunk_quality")
    if quality:  # kbflow.chunk.quality: small, punctuation-only and repeated chunks, and what looks wrong where
        rows += [{"group": "chunk quality", "item": key, "value": quality[key]}
                 for key in ("small", "small_share", "punctuation_only", "duplicates")]
        rows += [{"group": "chunk quality", "item": "warning", "value": text} for text in quality["warnings"]]
    return rows


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def failures_markdown(summary: dict) -> str:
    """A page listing every failure with its stage, source and message (or saying there were none)."""
    failures = summary.get("failures", [])
    title = f"# Failures of {summary['namespace']} run {summary['run_id']}\n\n"
    if not failures:
        return title + "No failures: every planned document was ingested.\n"
    lines = [title + f"{len(failures)} failure(s); the other documents were ingested. "
             "Each row is also in the run's `failures.parquet`.\n",
             "| stage | source | error | message |", "|---|---|---|---|"]
    for failure in failures:
        where = failure.get("source_path") or ", ".join(failure.get("chunk_ids", [])[:3]) or failure.get("doc_id", "")
        lines.append(f"| {_cell(failure['stage'])} | {_cell(where)} | {_cell(failure.get('error_type', ''))} "
                     f"| {_cell(failure['message'])} |")
    return "\n".join(lines) + "\n"


class RunProgress:
    """Overall percent done of one run from the flow's per-stage progress events.

    Documents finished by upsert count whole; during a batch's embedding the batch counts by the share of its
    texts embedded so far, so the figure moves with every embed task."""

    def __init__(self, total_documents: int, doc_batch: int):
        self.total = total_documents
        self.doc_batch = doc_batch
        self.documents_done = 0

    def update(self, stage: str, completed: int, total: int) -> float | None:
        """The new percentage after an event, or None when the event does not move it."""
        if self.total == 0:
            return None
        if stage == "upsert":
            self.documents_done = completed
            return 100.0 * completed / self.total
        if stage == "embed" and total:
            in_batch = min(self.doc_batch, self.total - self.documents_done)
            return 100.0 * (self.documents_done + in_batch * completed / total) / self.total
        return None
