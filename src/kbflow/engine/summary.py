"""What a run reports: its counts (``RunSummary``) and each thing that failed (``Failure``), typed.

The engine fills one ``RunSummary`` per run, in place, as the run goes; ``to_dict()`` is its JSON form, the one
``kbflow ingest --json`` prints, a flow run returns, ``last_run.json`` records and the Prefect summary artifact
shows. Every failure is a ``Failure`` with the columns of the run's ``failures.parquet`` (``kbflow.core.schemas.FAILURES``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MESSAGE_CHARS = 1000  # a failure's message is cut here: provider errors can carry whole response bodies


@dataclass(frozen=True)
class Failure:
    """One thing that failed in a run, and where: a document (``doc_id``, ``source_path``), some of its chunks
    (``chunk_ids``), or the run itself (neither). ``attempts``: how often the stage was tried."""

    stage: str
    error_type: str
    message: str
    doc_id: str | None = None
    source_path: str | None = None
    chunk_ids: tuple[str, ...] = ()
    attempts: int = 1

    @classmethod
    def of(cls, stage: str, error: BaseException, message: str | None = None, **where: Any) -> Failure:
        """A failure from a raised error: its type's name, its attempts (set by the retry loop or the task
        wrapper), and ``message`` (default: the error's own text)."""
        text = str(error) if message is None else message
        return cls(stage, type(error).__name__, text[:MESSAGE_CHARS], attempts=getattr(error, "attempts", 1),
                   **_where(where))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "chunk_ids": list(self.chunk_ids)}


def _where(where: dict[str, Any]) -> dict[str, Any]:
    if "chunk_ids" in where:
        where = {**where, "chunk_ids": tuple(where["chunk_ids"])}
    return where


@dataclass
class DocumentCounts:
    new: int = 0
    changed: int = 0
    # of the changed: files whose converted Markdown is what their stored chunks were made from (a page whose only
    # change is furniture the converter drops); their record takes the new source hash, nothing is chunked or written
    same_text: int = 0
    unchanged: int = 0
    removed: int = 0
    failed: int = 0  # documents with at least one failure (set when the run finishes)


@dataclass
class ChunkCounts:
    total: int = 0  # chunks of the documents processed
    embedded: int = 0  # texts sent to the model (vector cache misses)
    reused: int = 0  # vectors found in the vector cache
    written: int = 0  # store rows written (a chunk identical to its stored row is not rewritten)
    deleted: int = 0  # store rows deleted


@dataclass
class StoreCounts:
    count: int = 0  # chunks the namespace holds after the run
    indexes: dict[str, Any] = field(default_factory=dict)  # what the index refresh did


@dataclass
class GraphCounts:
    edges_extracted: int = 0
    edges_written: int = 0
    llm_calls: int | None = None  # with an LLM extractor
    edges: dict[str, int] | None = None  # the namespace's edges by kind, after the run


@dataclass
class RunSummary:
    namespace: str
    run_id: str
    dry_run: bool
    model_id: str
    documents: DocumentCounts = field(default_factory=DocumentCounts)
    chunks: ChunkCounts = field(default_factory=ChunkCounts)
    store: StoreCounts = field(default_factory=StoreCounts)
    failures: list[Failure] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # per stage, and "total" (wall)
    plan: list[dict[str, Any]] | None = None  # a dry run: what a run would do, per document
    graph: GraphCounts | None = None  # the graph stage is on, or its edges are being emptied
    web: dict[str, int] | None = None  # what the web sources listed (kbflow.convert.web)
    healed: list[str] = field(default_factory=list)  # damage found and repaired on the way (kbflow.engine.store_check)
    embedding: dict[str, int] | None = None  # a remote provider: requests, texts and retries this run sent
    chunk_quality: dict[str, Any] | None = None  # kbflow.chunk.quality: totals and warnings naming documents

    def fail(self, failure: Failure) -> None:
        self.failures.append(failure)

    def finish_counts(self) -> None:
        self.documents.failed = len({failure.doc_id for failure in self.failures if failure.doc_id})

    def to_dict(self) -> dict[str, Any]:
        """The JSON form. Optional sections appear only when the run has them."""
        out: dict[str, Any] = {
            "namespace": self.namespace, "run_id": self.run_id, "dry_run": self.dry_run, "model_id": self.model_id,
            "documents": asdict(self.documents), "chunks": asdict(self.chunks), "store": asdict(self.store),
            "failures": [failure.to_dict() for failure in self.failures], "seconds": dict(self.seconds),
        }
        if self.plan is not None:
            out["plan"] = self.plan
        if self.graph is not None:
            out["graph"] = {key: value for key, value in asdict(self.graph).items() if value is not None}
        for name in ("web", "embedding", "chunk_quality"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.healed:
            out["healed"] = list(self.healed)
        return out

    def record(self) -> dict[str, Any]:
        """What ``last_run.json`` keeps: the JSON form without the failures (they are in the run's snapshot)."""
        return {key: value for key, value in self.to_dict().items() if key != "failures"}
