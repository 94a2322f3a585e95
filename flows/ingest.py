"""The ingest flow: scan → convert → split → chunk → embed → upsert, in document batches, incrementally.

Composition only; every step is a kbflow function or a task from ``tasks/``.
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
from prefect import flow, get_run_logger
from prefect.filesystems import LocalFileSystem
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from kbflow import housekeeping, progress
from kbflow.config import KbConfig, check_namespace, load_config
from kbflow.convert import converter_fingerprint
from kbflow.embed import get_embedder
from kbflow.embed.cache import VectorCache
from kbflow.lock import NamespaceLock
from kbflow.manifest import NamespaceState
from kbflow.pipeline import (Fingerprints, Plan, check_deletion_guard, embed_inputs, failure_rows, make_plan,
                             manifest_rows, resolve_chunk_tokens, store_rows)
from kbflow.chunk import chunker_fingerprint
from kbflow.scan import SourceFile, doc_id_for, scan
from kbflow.schemas import CHUNKS, DOCUMENTS, SECTIONS
from kbflow.snapshots import clean_temporaries, write_table
from kbflow.stores import open_store
from kbflow.stores.factory import store_uri
from tasks.stages import (batch_key, chunk_task, convert_task, delete_task, embed_task, split_task, upsert_task)

MAX_WORKERS = 8  # hard bound of the task runner's threads; flow.max_workers bounds what one run submits at once
STAGES = ("scan", "convert", "split", "chunk", "embed", "upsert")


class Timer:
    def __init__(self) -> None:
        self.seconds = {stage: 0.0 for stage in STAGES}

    def add(self, stage: str, started: float) -> None:
        self.seconds[stage] += time.perf_counter() - started


def _result_storage(data_dir: Path) -> LocalFileSystem:
    """Cached task results under the data dir (pruned by kbflow), as a saved block, which Prefect requires."""
    basepath = str((data_dir / "prefect" / "results").resolve())
    block = LocalFileSystem(basepath=basepath)
    block.save("kbflow-results-" + hashlib.sha256(basepath.encode()).hexdigest()[:12], overwrite=True)
    return block


def _text_documents(texts: list[dict], namespace: str) -> list[SourceFile]:
    sources = []
    for item in texts:
        body = item["text"].encode("utf-8")
        source_path = f"text:{item['doc_id']}"
        sources.append(SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path="",
                                  source_sha256=hashlib.sha256(body).hexdigest(), size=len(body),
                                  mtime=time.time(), mime="text/markdown"))
    return sources


def _text_rows(sources: list[SourceFile], texts_by_path: dict[str, str]) -> pa.Table:
    return pa.Table.from_pylist([{
        "doc_id": s.doc_id, "source_path": s.source_path, "abs_path": "", "source_sha256": s.source_sha256,
        "size": s.size, "mtime": s.mtime, "mime": s.mime, "converter": converter_fingerprint(),
        "markdown": texts_by_path[s.source_path], "status": "ok", "error": None,
    } for s in sources], schema=DOCUMENTS)


@flow(name="kbflow-ingest", log_prints=True, validate_parameters=True,
      task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS))
def ingest(
    sources: list[str] | None = None,
    namespace: str | None = None,
    config_path: str | None = None,
    data_dir: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    allow_mass_delete: bool = False,
    texts: list[dict] | None = None,
) -> dict:
    """Ingest files and folders (and/or literal texts) into a namespace; returns the run summary."""
    config = load_config(config_path, data_dir=data_dir)
    namespace = check_namespace(namespace or config.namespace)
    sources = sources if sources is not None else (config.sources or None)
    texts = texts or []
    logger = get_run_logger()
    data_dir = Path(config.data_dir)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + str(flow_run.id or "local")[:8]
    state = NamespaceState(data_dir, namespace)
    timer = Timer()
    embedder = get_embedder(config.embedder)
    state.check_model(embedder.model_id, embedder.dimension)
    counter = embedder.token_counter()
    chunk_tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    chunker = chunker_fingerprint(counter, chunk_tokens, config.chunking.overlap_tokens, config.chunking.heading_prefix)
    fingerprints = Fingerprints(converter_fingerprint(), chunker, embedder.model_id)

    started = time.perf_counter()
    scanned = scan(sources, namespace, config.convert.include, config.convert.exclude) if sources else []
    text_sources = _text_documents(texts, namespace)
    manifest = state.read_manifest()
    plan = make_plan(scanned, manifest, fingerprints, force=force, track_removals=bool(sources))
    text_plan = make_plan(text_sources, manifest, fingerprints, force=force, track_removals=False)
    plan = Plan(plan.new + text_plan.new, plan.changed + text_plan.changed, plan.unchanged + text_plan.unchanged,
                plan.removed)
    timer.add("scan", started)
    logger.info("plan for %s: %s", namespace, plan.counts())
    summary = {"namespace": namespace, "run_id": run_id, "dry_run": dry_run,
               "documents": {**plan.counts(), "failed": 0},
               "chunks": {"total": 0, "embedded": 0, "reused": 0, "deleted": 0},
               "store": {"count": 0}, "failures": []}
    if dry_run:
        summary["plan"] = plan.table().to_pylist()
        summary["seconds"] = {**timer.seconds, "total": time.perf_counter() - started}
        return summary

    run_dir = data_dir / "runs" / namespace / run_id
    check_deletion_guard(plan, len(manifest), config.flow.max_delete_fraction, allow_mass_delete)
    with NamespaceLock(state.root, namespace):
        clean_temporaries(data_dir / "state")
        state.record_model(embedder.model_id, embedder.dimension)
        write_table(plan.table(), run_dir / "plan.parquet")
        store = open_store(config, namespace, embedder.dimension)
        cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
        results = _result_storage(data_dir)
        failures: list[dict] = []
        texts_by_path = {f"text:{t['doc_id']}": t["text"] for t in texts}
        _ingest_batches(config, plan, run_dir, run_id, fingerprints, counter, chunk_tokens, chunker, embedder,
                        cache, store, state, results, texts_by_path, failures, summary, timer, force)
        if plan.removed:
            started = time.perf_counter()
            removed_ids = [row["doc_id"] for row in plan.removed]
            summary["chunks"]["deleted"] += delete_task(store, removed_ids, len(removed_ids))
            state.update_manifest(manifest_rows([], CHUNKS.empty_table(), fingerprints, run_id), removed_ids)
            timer.add("upsert", started)
        write_table(failure_rows(failures), run_dir / "failures.parquet")
        summary["documents"]["failed"] = len({f["doc_id"] for f in failures if f.get("doc_id")})
        summary["failures"] = failures
        summary["store"]["count"] = store.count()
        summary["seconds"] = {**{k: round(v, 3) for k, v in timer.seconds.items()},
                              "total": round(sum(timer.seconds.values()), 3)}
        state.record_run({key: value for key, value in summary.items() if key != "failures"})
        housekeeping.prune_runs(data_dir / "runs" / namespace, config.flow.keep_runs)
        housekeeping.prune_results(data_dir / "prefect" / "results", config.flow.cache_days)
    for failure in failures:
        logger.warning("failed: %s %s: %s", failure["stage"], failure.get("source_path") or "", failure["message"])
    return summary


def _ingest_batches(config, plan, run_dir, run_id, fingerprints, counter, chunk_tokens, chunker, embedder, cache,
                    store, state, results, texts_by_path, failures, summary, timer, force) -> None:
    todo = plan.todo
    size = config.flow.doc_batch
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    cached = dict(result_storage=results, refresh_cache=True if force else None)
    convert = convert_task.with_options(**cached)
    split = split_task.with_options(**cached)
    chunk = chunk_task.with_options(**cached)
    embed = embed_task.with_options(retries=config.embedder.retries,
                                    retry_delay_seconds=exponential_backoff(config.embedder.retry_backoff_s))

    def start_convert(index: int):
        batch = [s for s in batches[index] if s.abs_path]
        first = index * size
        return convert.submit(batch, config.convert, first, first + len(batches[index]) - 1) if batch else None

    pending = start_convert(0) if batches else None
    for index, batch in enumerate(batches):
        first, last = index * size, index * size + len(batch) - 1
        started = time.perf_counter()
        file_docs = pending.result() if pending is not None else DOCUMENTS.empty_table()
        pending = start_convert(index + 1) if index + 1 < len(batches) else None  # overlaps the next conversion
        text_docs = _text_rows([s for s in batch if not s.abs_path], texts_by_path)
        documents = pa.concat_tables([file_docs, text_docs])
        timer.add("convert", started)
        progress.report("convert", first + len(batch), len(todo))
        write_table(documents, run_dir / "documents" / f"part-{index:05d}.parquet", DOCUMENTS)
        for row in documents.filter(pa.compute.equal(documents.column("status"), "failed")).to_pylist():
            failures.append({"stage": "convert", "doc_id": row["doc_id"], "source_path": row["source_path"],
                             "error_type": row["error"].split(":", 1)[0], "message": row["error"]})
        key = batch_key(batch) + ("" if not text_docs.num_rows else hashlib.sha256(
            "".join(text_docs.column("source_sha256").to_pylist()).encode()).hexdigest())

        started = time.perf_counter()
        sections = split(documents, key, first, last)
        timer.add("split", started)
        progress.report("split", first + len(batch), len(todo))
        write_table(sections, run_dir / "sections" / f"part-{index:05d}.parquet", SECTIONS)

        started = time.perf_counter()
        chunks = chunk(documents, sections, counter, chunk_tokens, config.chunking, chunker, key, first, last)
        timer.add("chunk", started)
        progress.report("chunk", first + len(batch), len(todo))
        write_table(chunks, run_dir / "chunks" / f"part-{index:05d}.parquet", CHUNKS)

        started = time.perf_counter()
        vectors, failed_keys = _embed(chunks, embedder, cache, embed, config.embedder.task_batch,
                                      config.flow.max_workers, failures, summary)
        timer.add("embed", started)

        started = time.perf_counter()
        _upsert(documents, chunks, vectors, failed_keys, store, state, fingerprints, run_id, first, last,
                embedder.dimension, failures, summary)
        timer.add("upsert", started)
        progress.report("upsert", first + len(batch), len(todo))


def _embed(chunks, embedder, cache, embed, task_batch, max_in_flight, failures, summary):
    """Vectors for every chunk: cache hits in one bulk lookup, the misses embedded in retryable batches,
    at most ``max_in_flight`` batches at a time."""
    keys, texts = embed_inputs(chunks)
    vectors = cache.lookup(keys)
    missing = [(k, t) for k, t in zip(keys, texts) if k not in vectors]
    summary["chunks"]["total"] += chunks.num_rows
    summary["chunks"]["reused"] += len(keys) - len(missing)
    parts = [missing[start:start + task_batch] for start in range(0, len(missing), task_batch)]
    offsets = list(range(0, len(missing), task_batch))

    def submit(i: int):
        part = parts[i]
        return embed.submit([k for k, _ in part], [t for _, t in part], embedder, cache,
                            offsets[i], offsets[i] + len(part) - 1)

    in_flight = [submit(i) for i in range(min(max_in_flight, len(parts)))]
    failed_keys: set[str] = set()
    done = 0
    for i, part in enumerate(parts):
        future = in_flight[i]
        if i + max_in_flight < len(parts):
            in_flight.append(submit(i + max_in_flight))
        try:
            vectors.update(future.result())
            summary["chunks"]["embedded"] += len(part)
        except Exception as exc:  # recorded with its chunk ids; those chunks are not stored, the next run retries
            part_keys = {k for k, _ in part}
            failed_keys |= part_keys
            mask = [k in part_keys for k in chunks.column("embed_sha256").to_pylist()]
            chunk_ids = chunks.filter(pa.array(mask)).column("chunk_id").to_pylist()
            failures.append({"stage": "embed", "chunk_ids": chunk_ids, "error_type": type(exc).__name__,
                             "message": str(exc)[:1000]})
        done += len(part)
        progress.report("embed", done, len(missing))
    return vectors, failed_keys


def _upsert(documents, chunks, vectors, failed_keys, store, state, fingerprints, run_id, first, last, dimension,
            failures, summary) -> None:
    """Replace whole documents: a document with any chunk lacking a vector keeps its stored version."""
    ok_docs = documents.filter(pa.compute.equal(documents.column("status"), "ok")).to_pylist()
    chunk_doc_ids = chunks.column("doc_id").to_pylist()
    blocked = {d for d, k in zip(chunk_doc_ids, chunks.column("embed_sha256").to_pylist()) if k in failed_keys}
    for doc in ok_docs:
        if doc["doc_id"] in blocked:
            failures.append({"stage": "embed", "doc_id": doc["doc_id"], "source_path": doc["source_path"],
                             "error_type": "EmbeddingIncomplete",
                             "message": f"{doc['source_path']}: some chunks failed to embed; "
                                        "its stored version is kept and the next run retries it"})
    ready = [doc for doc in ok_docs if doc["doc_id"] not in blocked]
    if not ready:
        return
    ready_ids = {doc["doc_id"] for doc in ready}
    doc_chunks = chunks.filter(pa.array([d in ready_ids for d in chunk_doc_ids], pa.bool_()))
    rows = store_rows(doc_chunks, {doc["doc_id"]: doc["source_path"] for doc in ready}, vectors, dimension)
    for doc in ready:
        doc["origin"] = "text" if doc["source_path"].startswith("text:") else "file"
    try:
        upsert_task(store, sorted(ready_ids), rows, first, last)
    except Exception as exc:  # the store write is one operation: it happened whole or not at all
        for doc in ready:
            failures.append({"stage": "upsert", "doc_id": doc["doc_id"], "source_path": doc["source_path"],
                             "error_type": type(exc).__name__, "message": f"{doc['source_path']}: {str(exc)[:500]}"})
        return
    state.update_manifest(manifest_rows(ready, doc_chunks, fingerprints, run_id), [])


