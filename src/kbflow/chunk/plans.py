"""Each document's chunk plans and token counts, kept beside the namespace's state, so re-chunking a changed
document costs what changed.

Memories that are pure functions of what they are keyed by, so a stale, missing or unreadable file costs time,
never correctness:

- ``sections``: section key -> plan (``kbflow.chunk.chunker.chunk_documents``): an unchanged section (same text,
  blocks, heading path, chunker fingerprint) is not chunked again at all;
- ``counts``: text hash -> tokens (``kbflow.chunk.counters.MemoCounter``) for the document's blocks and chunks,
  and ``splits``: how each block too long for one chunk was cut into units, under the tokenizer named beside
  them: in a section that did change, only its new texts are tokenized;
- ``words``: chunk text hash -> BM25 words, under ``words_version`` (written by
  ``kbflow.engine.rows.chunk_documents``): an unchanged chunk's words are not cut again.

One JSON file per document (``<state>/chunk-plans/<doc_id[:2]>/<doc_id>.json``), read before the document is
chunked and rewritten after, through a temporary name and a rename. A removed document's file goes with it.
"""

from __future__ import annotations

import json
from pathlib import Path

from kbflow.chunk.chunker import Chunk, ChunkJob, chunk_documents, prefix_line, trimmed_span
from kbflow.chunk.counters import MemoCounter, count_key
from kbflow.chunk.tokens import TokenCounter
from kbflow.core.storage import location, write_cache_entry


# each field of a plan file, and its type: a file with one of another type is a miss, never half trusted
PLAN_TYPES: dict[str, type | tuple[type, ...]] = {"tokenizer": str, "sections": dict, "counts": dict,
                                                  "splits": dict, "words_version": str, "words": dict}


class PlanCache:
    def __init__(self, root: str | Path):
        self.root = location(root)

    def _path(self, doc_id: str):
        return self.root / doc_id[:2] / f"{doc_id}.json"

    def load(self, doc_id: str) -> dict[str, dict]:
        try:
            plans = json.loads(self._path(doc_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(plans, dict) or any(key in plans and not isinstance(plans[key], kind)
                                              for key, kind in PLAN_TYPES.items()):
            return {}
        return plans

    def save(self, doc_id: str, plans: dict[str, dict]) -> None:
        write_cache_entry(self._path(doc_id), json.dumps(plans, ensure_ascii=False, separators=(",", ":")).encode())

    def forget(self, doc_ids: list[str]) -> None:
        for doc_id in doc_ids:
            self._path(doc_id).unlink(missing_ok=True)


def chunk_remembering(jobs: list[ChunkJob], memories: list[dict], counter: TokenCounter, chunk_tokens: int,
                      overlap_tokens: int, heading_prefix: bool, chunker: str) -> tuple[list[list[Chunk]], int]:
    """``chunk_documents`` with each document's memory (a ``PlanCache`` file's content, ``{}`` for none): read
    before, and left in ``memories`` as the next run should find it. Returns the chunks and how many texts were
    tokenized."""
    memo = MemoCounter(counter)
    for memory in memories:
        if memory.get("tokenizer") == counter.name and isinstance(memory.get("counts"), dict):
            memo.memo.update(memory["counts"])
            memo.splits.update(memory.get("splits") or {})
    for job, memory in zip(jobs, memories):
        sections = memory.get("sections")
        job.plans = dict(sections) if isinstance(sections, dict) else {}
    results = chunk_documents(jobs, memo, chunk_tokens, overlap_tokens, heading_prefix, chunker)
    for job, memory, chunks in zip(jobs, memories, results):
        keys = [count_key(job.markdown[block.char_start:block.char_end]) for block in job.blocks]
        keys += [chunk.embed_sha256[:24] for chunk in chunks]  # a chunk's embedded text, as the chunker counts it
        keys += [count_key(prefix_line(path)) for path in {tuple(b.heading_path) for b in job.blocks} if path]
        trimmed = {count_key(job.markdown[slice(*trimmed_span(job.markdown, block.char_start, block.char_end))])
                   for block in job.blocks}  # what a long block's split is keyed by
        memory.clear()
        memory.update(tokenizer=counter.name, sections=job.plans,
                      counts={key: memo.memo[key] for key in keys if key in memo.memo},
                      splits={key: units for key, units in memo.splits.items() if key.split(":", 1)[0] in trimmed})
    return results, memo.tokenized
