"""The ingest flow: scan → convert → split → chunk → embed → upsert, in document batches, incrementally.

Composition only; every step is a kbflow function or a task from ``tasks/``.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
from prefect import flow, get_run_logger
from prefect.filesystems import LocalFileSystem
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from kbflow import housekeeping, memory, progress
from kbflow.chunk import chunker_fingerprint
from kbflow.config import KbConfig, check_namespace, load_config
from kbflow.convert import converter_fingerprint, text_documents, text_sources
from kbflow.embed import get_embedder
from kbflow.embed.cache import VectorCache
from kbflow.errors import ConfigError, is_transient
from kbflow.failpoints import failpoint
from kbflow.lock import NamespaceLock
from kbflow.manifest import NamespaceState
from kbflow.pipeline import (
    Fingerprints,
    Plan,
    check_deletion_guard,
    chunks_of,
    conversion_failures,
    embed_inputs,
    failure_rows,
    make_plan,
    manifest_rows,
    ready_documents,
    resolve_chunk_tokens,
    store_rows,
)
from kbflow.archive import ArchiveLimits
from kbflow.scan import scan
from kbflow.schemas import CHUNKS, DOCUMENTS, SECTIONS
from kbflow.snapshots import clean_temporaries, write_table
from kbflow.stores import open_store
from kbflow.stores.factory import store_uri
from tasks.artifacts import progress_artifact, publish_summary
from tasks.stages import (batch_key, chunk_task, convert_task, delete_task, embed_task, index_task, split_task,
                          upsert_task)

MAX_WORKERS = 8  # hard bound of the task runner's threads; flow.max_workers bounds what one run submits at once
STAGES = ("scan", "convert", "split", "chunk", "embed", "upsert")


@dataclass
class Run:
    """What one flow run works with; built once, passed to the steps."""

    config: KbConfig
    namespace: str
    run_id: str
    run_dir: Path
    state: NamespaceState
    embedder: object
    fingerprints: Fingerprints
    chunk_tokens: int
    force: bool
    summary: dict
    failures: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: {stage: 0.0 for stage in STAGES})
    store: object = None
    cache: VectorCache | None = None

    def timed(self, stage: str, started: float, done: int | None = None, total: int = 0) -> None:
        """Charge the time since ``started`` to ``stage``; with ``done``, also report the stage's progress."""
        self.seconds[stage] += time.perf_counter() - started
        if done is not None:
            progress.report(stage, done, total)


def _result_storage(data_dir: Path) -> LocalFileSystem:
    """Cached task results under the data dir (pruned by kbflow), as a saved block, which Prefect requires."""
    basepath = str((data_dir / "prefect" / "results").resolve())
    block = LocalFileSystem(basepath=basepath)
    block.save("kbflow-results-" + hashlib.sha256(basepath.encode()).hexdigest()[:12], overwrite=True)
    return block


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
    wall_started = time.perf_counter()
    config = load_config(config_path, data_dir=data_dir)
    namespace = check_namespace(namespace or config.namespace)
    sources = sources if sources is not None else (config.sources or None)
    texts = texts or []
    if not sources and not texts:
        raise ConfigError("nothing to ingest: pass files or folders, or set `sources` in the config file")
    logger = get_run_logger()
    data_dir = Path(config.data_dir)
    run_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + str(flow_run.id or "local")[:8]
    state = NamespaceState(data_dir, namespace)
    embedder = get_embedder(config.embedder)
    state.check_model(embedder.model_id, embedder.dimension)
    chunk_tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    chunker = chunker_fingerprint(embedder.token_counter(), chunk_tokens, config.chunking.overlap_tokens,
                                  config.chunking.heading_prefix)
    run = Run(config, namespace, run_id, data_dir / "runs" / namespace / run_id, state, embedder,
              Fingerprints(converter_fingerprint(config.convert), chunker, embedder.model_id), chunk_tokens, force,
              summary={"namespace": namespace, "run_id": run_id, "dry_run": dry_run,
                       "documents": {"new": 0, "changed": 0, "unchanged": 0, "removed": 0, "failed": 0},
                       "chunks": {"total": 0, "embedded": 0, "reused": 0, "deleted": 0},
                       "store": {"count": 0, "indexes": {}}, "failures": []})
    if dry_run:
        plan = _plan(run, sources, texts)
        run.summary["plan"] = plan.table().to_pylist()
        if state.meta() is not None:  # what the namespace holds now; nothing is created by a dry run
            run.summary["store"]["count"] = open_store(config, state.store_namespace(), embedder.dimension).count()
        return publish_summary(_finish(run, wall_started))  # table + failures artifacts in the Prefect UI

    with NamespaceLock(state.root, namespace):  # one writer per namespace; the plan is made under the lock
        plan = _plan(run, sources, texts)
        check_deletion_guard(plan, len(state.read_manifest()), config.flow.max_delete_fraction, allow_mass_delete)
        for folder in (state.root, data_dir / "runs" / namespace):  # leftovers of a killed run
            clean_temporaries(folder)
        state.record_model(embedder.model_id, embedder.dimension)
        write_table(plan.table(), run.run_dir / "plan.parquet")
        failpoint("plan.written")
        run.store = open_store(config, state.store_namespace(), embedder.dimension)
        run.store.defer_vector_index = True  # built once after the last batch, not on top of a batch's memory
        run.cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
        with progress_artifact(namespace, len(plan.todo), config.flow.doc_batch):  # moves per embed batch
            _ingest_batches(run, plan, {f"text:{t['doc_id']}": t["text"] for t in texts})
        if plan.removed:
            started = time.perf_counter()
            removed_ids = [row["doc_id"] for row in plan.removed]
            run.summary["chunks"]["deleted"] += delete_task(run.store, removed_ids, len(removed_ids))
            failpoint("delete.after_store")
            state.update_manifest(manifest_rows([], CHUNKS.empty_table(), run.fingerprints, run_id), removed_ids)
            run.timed("upsert", started)
        started = time.perf_counter()
        run.store.defer_vector_index = False
        try:
            run.summary["store"]["indexes"] = index_task(run.store)
        except Exception as exc:  # nothing stored is at stake: searches scan exactly until an index exists
            run.failures.append({"stage": "index", "error_type": type(exc).__name__,
                                 "message": f"refreshing the indexes of {namespace!r} failed: {str(exc)[:500]}; "
                                            "searches stay correct (unindexed rows are scanned) and the next "
                                            "write retries"})
        run.timed("upsert", started)
        failpoint("run.finishing")
        write_table(failure_rows(run.failures), run.run_dir / "failures.parquet")
        run.summary["store"]["count"] = run.store.count()
        summary = _finish(run, wall_started)
        state.record_run({key: value for key, value in summary.items() if key != "failures"})
        housekeeping.prune_runs(data_dir / "runs" / namespace, config.flow.keep_runs)
        housekeeping.prune_results(data_dir / "prefect" / "results", config.flow.cache_days)
    for failure in run.failures:
        logger.warning("failed: %s %s: %s", failure["stage"], failure.get("source_path") or "", failure["message"])
    return publish_summary(summary)  # after the state is recorded: an API hiccup here loses no bookkeeping


def _plan(run: Run, sources: list[str] | None, texts: list[dict]) -> Plan:
    started = time.perf_counter()
    config = run.config
    limits = ArchiveLimits(int(config.convert.zip_max_total_mb * 1e6), config.convert.zip_max_members)
    scanned = scan(sources, run.namespace, config.convert.include, config.convert.exclude, limits) if sources else []
    manifest = run.state.read_manifest()
    files = make_plan(scanned, manifest, run.fingerprints, force=run.force, track_removals=bool(sources))
    literal = make_plan(text_sources(texts, run.namespace), manifest, run.fingerprints, force=run.force,
                        track_removals=False)
    plan = Plan(files.new + literal.new, files.changed + literal.changed, files.unchanged + literal.unchanged,
                files.removed)
    run.summary["documents"].update(plan.counts())
    run.timed("scan", started)
    get_run_logger().info("plan for %s: %s", run.namespace, plan.counts())
    return plan


def _finish(run: Run, wall_started: float) -> dict:
    run.summary["documents"]["failed"] = len({f["doc_id"] for f in run.failures if f.get("doc_id")})
    run.summary["failures"] = run.failures
    run.summary["seconds"] = {**{k: round(v, 3) for k, v in run.seconds.items()},
                              "total": round(time.perf_counter() - wall_started, 3)}
    return run.summary


def _ingest_batches(run: Run, plan: Plan, texts_by_path: dict[str, str]) -> None:
    config, todo, size = run.config, plan.todo, run.config.flow.doc_batch
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    results = _result_storage(Path(config.data_dir))
    cached = dict(result_storage=results, refresh_cache=True if run.force else None,
                  cache_expiration=timedelta(days=config.flow.cache_days))  # result files are pruned at the same age
    split, chunk = (t.with_options(**cached) for t in (split_task, chunk_task))
    # per-document conversion cache, pruned with the results; --force converts everything again
    convert_cache_dir = None if run.force else str(Path(config.data_dir) / "prefect" / "results" / "kbflow-convert")
    embed = embed_task.with_options(retries=config.embedder.retries,
                                    retry_delay_seconds=exponential_backoff(config.embedder.retry_backoff_s))

    def start_convert(index: int):
        files = [s for s in batches[index] if s.abs_path]
        first = index * size
        return convert_task.submit(files, config.convert, convert_cache_dir, first,
                                   first + len(batches[index]) - 1) if files else None

    pending = start_convert(0) if batches else None
    for index, batch in enumerate(batches):
        first, last = index * size, index * size + len(batch) - 1
        part = f"part-{index:05d}.parquet"
        started = time.perf_counter()
        file_docs = pending.result() if pending is not None else DOCUMENTS.empty_table()
        pending = start_convert(index + 1) if index + 1 < len(batches) else None  # overlaps this batch's embedding
        text_docs = text_documents([s for s in batch if not s.abs_path], texts_by_path)
        documents = pa.concat_tables([file_docs, text_docs])
        run.timed("convert", started, last + 1, len(todo))
        write_table(documents, run.run_dir / "documents" / part, DOCUMENTS)
        run.failures.extend(conversion_failures(documents))
        failpoint("convert.done")
        key = batch_key(documents)

        started = time.perf_counter()
        sections = split(documents, key, first, last)
        run.timed("split", started, last + 1, len(todo))
        write_table(sections, run.run_dir / "sections" / part, SECTIONS)
        failpoint("split.done")

        started = time.perf_counter()
        chunks = chunk(documents, sections, run.embedder.token_counter(), run.chunk_tokens, config.chunking,
                       run.fingerprints.chunker, key, first, last)
        run.timed("chunk", started, last + 1, len(todo))
        write_table(chunks, run.run_dir / "chunks" / part, CHUNKS)
        failpoint("chunk.done")

        started = time.perf_counter()
        vectors, failed_keys = _embed(run, chunks, embed)
        run.timed("embed", started)

        started = time.perf_counter()
        _upsert(run, documents, chunks, vectors, failed_keys, first, last)
        run.timed("upsert", started, last + 1, len(todo))
        del file_docs, text_docs, documents, sections, chunks, vectors
        memory.trim()  # the batch is written: hand its freed pages back before the next one


def _embed(run: Run, chunks: pa.Table, embed) -> tuple[dict, set[str]]:
    """Vectors for every chunk: cache hits in one bulk lookup, the misses embedded in retryable batches,
    at most ``flow.max_workers`` batches in flight."""
    task_batch, max_in_flight = run.config.embedder.task_batch, run.config.flow.max_workers
    keys, texts = embed_inputs(chunks)
    vectors = run.cache.lookup(keys)
    missing = [(k, t) for k, t in zip(keys, texts) if k not in vectors]
    run.summary["chunks"]["total"] += chunks.num_rows
    run.summary["chunks"]["reused"] += len(keys) - len(missing)
    parts = [missing[start:start + task_batch] for start in range(0, len(missing), task_batch)]

    def submit(i: int):
        first = i * task_batch
        return embed.submit([k for k, _ in parts[i]], [t for _, t in parts[i]], run.embedder, run.cache,
                            first, first + len(parts[i]) - 1, run.config.embedder.max_retry_after_s)

    in_flight = [submit(i) for i in range(min(max_in_flight, len(parts)))]
    failed_keys: set[str] = set()
    done = 0
    for i, part in enumerate(parts):
        future = in_flight[i]
        if i + max_in_flight < len(parts):
            in_flight.append(submit(i + max_in_flight))
        try:
            vectors.update(zip(*future.result()))
            run.summary["chunks"]["embedded"] += len(part)
            failpoint("embed.batch_done")
        except Exception as exc:  # recorded with its chunk ids; those chunks are not stored, the next run retries
            part_keys = {k for k, _ in part}
            failed_keys |= part_keys
            mask = pa.array([k in part_keys for k in chunks.column("embed_sha256").to_pylist()], pa.bool_())
            run.failures.append({"stage": "embed", "chunk_ids": chunks.filter(mask).column("chunk_id").to_pylist(),
                                 "error_type": type(exc).__name__, "message": str(exc)[:1000],
                                 "attempts": 1 + (run.config.embedder.retries if is_transient(exc) else 0)})
        done += len(part)
        progress.report("embed", done, len(missing))
    return vectors, failed_keys


def _upsert(run: Run, documents, chunks, vectors, failed_keys, first: int, last: int) -> None:
    """Replace whole documents in one store operation, then record them in the manifest."""
    ready, blocked = ready_documents(documents, chunks, failed_keys)
    for doc in blocked:
        run.failures.append({"stage": "embed", "doc_id": doc["doc_id"], "source_path": doc["source_path"],
                             "error_type": "EmbeddingIncomplete",
                             "message": f"{doc['source_path']}: some chunks failed to embed; "
                                        "its stored version is kept and the next run retries it"})
    if not ready:
        return
    ready_ids = {doc["doc_id"] for doc in ready}
    doc_chunks = chunks_of(chunks, ready_ids)
    rows = store_rows(doc_chunks, {doc["doc_id"]: doc["source_path"] for doc in ready}, vectors,
                      run.embedder.dimension)
    try:
        upsert_task(run.store, sorted(ready_ids), rows, first, last)
    except Exception as exc:  # the store write is one operation: it happened whole or not at all
        for doc in ready:
            run.failures.append({"stage": "upsert", "doc_id": doc["doc_id"], "source_path": doc["source_path"],
                                 "error_type": type(exc).__name__,
                                 "message": f"{doc['source_path']}: {str(exc)[:500]}"})
        return
    failpoint("upsert.after_store")
    run.state.update_manifest(manifest_rows(ready, doc_chunks, run.fingerprints, run.run_id), [])
    failpoint("upsert.done")
