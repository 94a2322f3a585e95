"""The typed results of `kbflow mcp`'s tools: each tool's output schema, and the structured content of each call.

An agent reads fields instead of parsing prose. The shapes are those of the CLI's ``--json`` for the same
operation (``kbflow search``, ``ask``, ``stats``, ``namespaces``, ``add-text``, ``add-document``), so one
document describes both.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Passage(BaseModel):
    """One search hit."""

    chunk_id: str = Field(description="The passage's id (stable while its document is unchanged).")
    doc_id: str = Field(description="Its document's id; pass it in doc_ids to search within that document.")
    source_path: str = Field(description="The file (or page) it comes from, as stored.")
    heading_path: list[str] = Field(description="The headings its section sits under, outermost first.")
    score: float = Field(description="Higher is better; the scale depends on the mode.")
    text: str = Field(description="The passage itself.")
    path: list[str] | None = Field(None, description="graph mode: how the graph reached this passage.")


class SearchResults(BaseModel):
    """What search returns as structured content (the same hits also come as one JSON text block each)."""

    hits: list[Passage]


class Source(BaseModel):
    """A passage the answer was given, numbered as the answer cites it."""

    n: int = Field(description="Its number: the answer cites it as [n].")
    doc_id: str = Field(description="Its document's id.")
    source_path: str = Field(description="The file (or page) it comes from, as stored.")
    heading_path: list[str] = Field(description="The headings its section sits under, outermost first.")
    chunk_id: str = Field(description="The passage's id.")
    score: float = Field(description="Its retrieval score (higher is better).")


class Answer(BaseModel):
    """An answer with its numbered sources (``kbflow ask --json``)."""

    model_config = ConfigDict(extra="allow")  # agentic asks add their strategy, trace and planner counts

    question: str
    answer: str | None = Field(description="The chat model's answer citing [n]; null when no passage matched.")
    sources: list[Source] = Field(description="The passages the model was given, in the order it saw them.")
    cited: list[int] = Field(description="The numbers the answer cites that name a source.")
    unknown_citations: list[int] = Field(description="Numbers the answer cites that name no source.")
    sources_left_out: int = Field(description="Passages found but left out to fit the model's context window.")
    message: str | None = Field(None, description="Why nothing was asked, when no passage matched.")


class LastRun(BaseModel):
    run_id: str | None
    documents: dict[str, int] | None
    chunks: dict[str, int] | None
    seconds: dict[str, float] | None


class NamespaceStats(BaseModel):
    """A namespace's size and model (``kbflow stats --json``)."""

    namespace: str
    documents: int = Field(description="Documents held.")
    chunks: int = Field(description="Chunks (passages) held.")
    model_id: str | None = Field(description="The embedding model its vectors come from.")
    dimension: int | None = Field(description="The vectors' dimension.")
    store: str = Field(description="The vector store kind (lancedb, qdrant).")
    store_bytes: int = Field(description="The store's size on disk.")
    last_run: LastRun | None = Field(description="The latest run that wrote it.")


class DocumentCounts(BaseModel):
    new: int
    changed: int
    same_text: int = Field(description="Of the changed: files whose text did not change (only their record moved).")
    unchanged: int
    removed: int
    failed: int = Field(description="Documents with at least one failure.")


class ChunkCounts(BaseModel):
    total: int
    embedded: int = Field(description="Texts sent to the model (not found in the vector cache).")
    reused: int = Field(description="Vectors found in the vector cache.")
    written: int
    deleted: int


class Failure(BaseModel):
    """Something that failed in the run, with the message that names the fix."""

    stage: str
    error_type: str
    message: str
    doc_id: str | None = None
    source_path: str | None = None
    chunk_ids: list[str] = []
    attempts: int = 1


class WriteResult(BaseModel):
    """What a write did (the run summary of ``kbflow add-text --json`` / ``add-document --json``, in part)."""

    namespace: str
    run_id: str
    documents: DocumentCounts
    chunks: ChunkCounts
    failures: list[Failure] = Field(description="Empty when every document went in.")


def write_result(summary: dict[str, Any]) -> WriteResult:
    return WriteResult.model_validate({key: summary.get(key) for key in WriteResult.model_fields})
