"""What a run shows in the Prefect UI, as plain data: summary table rows, a failures page, overall progress.

No Prefect here; ``tasks/artifacts.py`` publishes these as artifacts.
"""

from __future__ import annotations

import re
import time

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
    """Overall percent done of one run from the flow's per-stage progress events, and what the embedding is doing.

    Embedding is most of a run's time: the percentage follows the share of the run's texts embedded (its events
    count the texts found missing from the vector cache so far; the texts of documents not yet chunked are
    extrapolated from those that were), and documents written by upsert; it never goes back."""

    def __init__(self, total_documents: int, clock=time.monotonic):
        self.total = total_documents
        self.documents_done = self.chunked = 0
        self.texts_done = self.texts_known = 0
        self.percent = 0.0
        self.clock = clock
        self.first: tuple[float, int] | None = None  # (time, texts done) of the first embed event

    def update(self, stage: str, completed: int, total: int) -> float | None:
        """The new percentage after an event, or None when the event does not move it."""
        if self.total == 0:
            return None
        if stage == "chunk":
            self.chunked = completed
            return None
        if stage == "upsert":
            self.documents_done = completed
            share = completed / self.total
        elif stage == "embed" and total:
            if self.first is None:
                self.first = (self.clock(), completed)
            self.texts_done, self.texts_known = completed, total
            share = min(completed / self.texts_expected(), 0.99)  # the last writes are still to come
        else:
            return None
        if 100.0 * share <= self.percent:
            return None
        self.percent = 100.0 * share
        return self.percent

    def texts_expected(self) -> float:
        if 0 < self.chunked < self.total:
            return self.texts_known * self.total / self.chunked
        return float(max(self.texts_known, 1))

    def rate(self) -> float | None:
        """Texts embedded per second since the first embed event."""
        if self.first is None:
            return None
        seconds, done = self.clock() - self.first[0], self.texts_done - self.first[1]
        return done / seconds if seconds > 0 and done > 0 else None

    def description(self) -> str:
        """What the embedding is doing, for the progress artifact: texts done of the total, rate, time left."""
        text = f"embedded {self.texts_done:,} of {self.texts_known:,} texts"
        if self.chunked < self.total:
            text += f" (so far: {self.chunked:,} of {self.total:,} documents chunked)"
        rate = self.rate()
        if rate:
            left = max(self.texts_expected() - self.texts_done, 0) / rate
            text += f", {rate:.1f} texts/s, about {left / 60:.0f} min left" if left >= 90 else \
                f", {rate:.1f} texts/s, about {left:.0f} s left"
        return text
