"""The tables a run builds, as pure functions over Arrow tables: sections from documents, chunks from sections,
store rows from chunks and vectors, manifest and failure rows. No I/O here."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Set
from dataclasses import asdict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbflow.chunk.chunker import ChunkJob, chunk_documents as chunk_batch
from kbflow.chunk.plans import PlanCache, chunk_remembering
from kbflow.config import ChunkConfig
from kbflow.engine.plan import Fingerprints
from kbflow.engine.summary import Failure
from kbflow.core.errors import ConfigError
from kbflow.search.tokens import TOKENIZER_VERSION, tokens_text
from kbflow.sources import origin_of
from kbflow.core.schemas import CHUNKS, FAILURES, MANIFEST, SECTIONS, store_schema
from kbflow.chunk.split import Block, split_markdown
from kbflow.chunk.tokens import TokenCounter


def with_status(documents: pa.Table, status: str) -> list[dict]:
    """Rows of a documents table whose conversion status is ``status`` ('ok' or 'failed')."""
    return documents.filter(pc.equal(documents.column("status"), status)).to_pylist()


def conversion_failures(documents: pa.Table) -> list[Failure]:
    return [Failure("convert", row["error"].split(":", 1)[0], row["error"], doc_id=row["doc_id"],
                    source_path=row["source_path"]) for row in with_status(documents, "failed")]


def split_documents(documents: pa.Table) -> pa.Table:
    rows = []
    for doc in with_status(documents, "ok"):
        markdown = doc["markdown"]
        for ordinal, block in enumerate(split_markdown(markdown)):
            rows.append({
                "doc_id": doc["doc_id"], "ordinal": ordinal, "heading_path": block.heading_path,
                "text": markdown[block.char_start:block.char_end], "char_start": block.char_start,
                "char_end": block.char_end, "kind": block.kind,
            })
    return pa.Table.from_pylist(rows, schema=SECTIONS)


def resolve_chunk_tokens(config: ChunkConfig, model_max_tokens: int, model_id: str) -> int:
    if config.chunk_tokens is None:
        return model_max_tokens
    if config.chunk_tokens > model_max_tokens:
        raise ConfigError(
            f"chunking.chunk_tokens is {config.chunk_tokens}, but {model_id} reads at most {model_max_tokens} tokens; "
            f"longer chunks would be truncated. Set chunking.chunk_tokens to {model_max_tokens} or less, or leave it empty"
        )
    if config.overlap_tokens >= config.chunk_tokens // 2:
        raise ConfigError(
            f"chunking.overlap_tokens ({config.overlap_tokens}) must be under half of chunk_tokens ({config.chunk_tokens})"
        )
    return config.chunk_tokens


def chunk_documents(documents: pa.Table, sections: pa.Table, counter: TokenCounter, chunk_tokens: int,
                    config: ChunkConfig, chunker: str, plans: PlanCache | None = None) -> pa.Table:
    """Chunks of every converted document, counted in one batch; with ``plans``, each document's unchanged sections
    reuse their plans and its unchanged texts their token counts (``kbflow.chunk.plans``)."""
    by_doc: dict[str, list[Block]] = {}
    for row in sections.to_pylist():
        by_doc.setdefault(row["doc_id"], []).append(
            Block(row["kind"], row["char_start"], row["char_end"], row["heading_path"]))
    docs = with_status(documents, "ok")
    jobs = [ChunkJob(doc["doc_id"], doc["markdown"], by_doc.get(doc["doc_id"], [])) for doc in docs]
    if plans is None:
        results = chunk_batch(jobs, counter, chunk_tokens, config.overlap_tokens, config.heading_prefix, chunker)
        memories: list[dict] = [{} for _ in jobs]
        words_before = [(None, None)] * len(jobs)
    else:
        memories = [plans.load(job.doc_id) for job in jobs]
        before = [dict(memory) for memory in memories]
        words_before = [(memory.get("words_version"), memory.get("words")) for memory in memories]
        results, _ = chunk_remembering(jobs, memories, counter, chunk_tokens, config.overlap_tokens,
                                       config.heading_prefix, chunker)
    rows = []
    for doc, chunks, memory, (version, known) in zip(docs, results, memories, words_before):
        doc_words = _bm25_words(chunks, known if version == TOKENIZER_VERSION else None, memory)
        for chunk, text_tokens in zip(chunks, doc_words):
            row = asdict(chunk)
            embed_text = row.pop("embed_text")
            row["embed_prefix"] = embed_text[: len(embed_text) - len(chunk.text)]
            rows.append({**row, "doc_id": doc["doc_id"], "chunker": chunker, "text_tokens": text_tokens})
    if plans is not None:
        for job, memory, old in zip(jobs, memories, before):
            if memory != old:
                plans.save(job.doc_id, memory)
    return pa.Table.from_pylist(rows, schema=CHUNKS)


def _bm25_words(chunks: list, known: dict | None, memory: dict) -> list[str]:
    """Each chunk's BM25 words (``tokens_text``), from ``known`` (the document's memory of its chunks' words under
    this word tokenizer) where its text was cut before: jieba cuts ~0.4 MB/s, and an update's unchanged chunks
    must not pay it again. ``memory`` is left holding this version's words of these chunks."""
    known = known if isinstance(known, dict) else {}
    result: list[str] = []
    kept: dict[str, str] = {}
    for chunk in chunks:
        key = chunk.text_sha256[:24]
        kept[key] = known[key] if key in known else kept.get(key) or tokens_text(chunk.text)
        result.append(kept[key])
    memory["words_version"], memory["words"] = TOKENIZER_VERSION, kept
    return result


def embed_inputs(chunks: pa.Table) -> tuple[list[str], list[str]]:
    """Unique (embed_sha256, text the model reads) pairs of a chunks table, in first-seen order."""
    seen: dict[str, str] = {}
    for key, prefix, text in zip(chunks.column("embed_sha256").to_pylist(), chunks.column("embed_prefix").to_pylist(),
                                 chunks.column("text").to_pylist()):
        seen.setdefault(key, prefix + text)
    return list(seen), list(seen.values())


def ready_documents(documents: pa.Table, chunks: pa.Table, failed_keys: set[str]) -> tuple[list[dict], list[dict]]:
    """Converted documents split into (ready, blocked): a document with any chunk lacking a vector is blocked and
    keeps its stored version; documents are only ever replaced whole."""
    ok_docs = with_status(documents, "ok")
    blocked_ids = {d for d, k in zip(chunks.column("doc_id").to_pylist(), chunks.column("embed_sha256").to_pylist())
                   if k in failed_keys}
    for doc in ok_docs:
        doc["origin"] = origin_of(doc["source_path"])
    return ([doc for doc in ok_docs if doc["doc_id"] not in blocked_ids],
            [doc for doc in ok_docs if doc["doc_id"] in blocked_ids])


def chunks_of(chunks: pa.Table, doc_ids: set[str]) -> pa.Table:
    return chunks.filter(pa.array([d in doc_ids for d in chunks.column("doc_id").to_pylist()], pa.bool_()))


def store_rows(chunks: pa.Table, source_paths: dict[str, str], vectors: dict[str, np.ndarray], dimension: int) -> pa.Table:
    """Rows for the store; every chunk must have its vector (the caller drops documents that lack one)."""
    flat = np.stack([vectors[key] for key in chunks.column("embed_sha256").to_pylist()]).astype(np.float32) \
        if chunks.num_rows else np.zeros((0, dimension), np.float32)
    columns = {name: chunks.column(name) for name in ("chunk_id", "doc_id", "ordinal", "heading_path", "text",
                                                        "char_start", "char_end", "n_tokens", "embed_sha256")}
    columns["source_path"] = pa.array([source_paths[d] for d in chunks.column("doc_id").to_pylist()], pa.string())
    columns["text_tokens"] = chunks.column("text_tokens")  # cut by the chunk stage (chunk_documents)
    columns["vector"] = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), pa.float32()), dimension)
    schema = store_schema(dimension)
    return pa.table([columns[name] for name in schema.names], schema=schema)


def markdown_sha256(markdown: str) -> str:
    """The hash a manifest row keeps of the Markdown its document's chunks were made from."""
    return hashlib.sha256(markdown.encode("utf-8")).hexdigest()


def same_text(documents: pa.Table, stored: dict[str, dict], run_id: str) -> tuple[pa.Table, pa.Table]:
    """(the documents left to split, chunk, embed and write; the manifest rows of the others). The others are
    changed files (``stored``: their manifest rows, whose fingerprints are today's) that converted to the very
    Markdown their stored chunks were made from: the store already holds what chunking it again would write, so
    their rows only take the new source hash and this run's id."""
    if not stored or not documents.num_rows:
        return documents, MANIFEST.empty_table()
    same: list[dict] = []
    keep: list[bool] = []
    for doc_id, status, source_sha256, markdown in zip(*(documents.column(c).to_pylist() for c in
                                                         ("doc_id", "status", "source_sha256", "markdown"))):
        row = stored.get(doc_id)
        if row is not None and status == "ok" and markdown is not None \
                and row["markdown_sha256"] == markdown_sha256(markdown):
            same.append({**row, "source_sha256": source_sha256, "run_id": run_id})
            keep.append(False)
        else:
            keep.append(True)
    if not same:
        return documents, MANIFEST.empty_table()
    return documents.filter(pa.array(keep, pa.bool_())), pa.Table.from_pylist(same, schema=MANIFEST)


def manifest_rows(documents: list[dict], chunks: pa.Table, fingerprints: Fingerprints, run_id: str,
                  graph_incomplete: Set[str] = frozenset(), locations: Mapping[str, str] | None = None) -> pa.Table:
    """The manifest rows of written documents. A document whose graph is incomplete (an LLM extraction failed)
    records a graph fingerprint that matches no extractor, so the next run re-processes it (from its cached
    conversion, vectors and extracted facts) and extracts what is missing."""
    ids_by_doc: dict[str, list[str]] = {}
    for doc_id, chunk_id in zip(chunks.column("doc_id").to_pylist(), chunks.column("chunk_id").to_pylist()):
        ids_by_doc.setdefault(doc_id, []).append(chunk_id)
    rows = [{
        "doc_id": doc["doc_id"], "source_path": doc["source_path"], "origin": doc.get("origin", "file"),
        "source_sha256": doc["source_sha256"], "converter": fingerprints.converter, "chunker": fingerprints.chunker,
        "model_id": fingerprints.model_id, "chunk_ids": ids_by_doc.get(doc["doc_id"], []), "run_id": run_id,
        "graph": fingerprints.graph + ("!incomplete" if doc["doc_id"] in graph_incomplete else ""),
        "markdown_sha256": markdown_sha256(doc["markdown"]) if doc.get("markdown") is not None else None,
        "location": (locations or {}).get(doc["doc_id"]),
    } for doc in documents]
    return pa.Table.from_pylist(rows, schema=MANIFEST)


def failure_rows(failures: list[Failure]) -> pa.Table:
    return pa.Table.from_pylist([failure.to_dict() for failure in failures], schema=FAILURES)
