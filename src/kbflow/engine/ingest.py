"""The ingest run: scan → plan → per document batch (convert → split → chunk → embed-with-cache → upsert →
manifest) → deletions → indexes → summary. Every entry point runs this one function: the CLI and the library
directly, Prefect flows through a runner that makes each stage a task run.

Guarantees, in the order the code keeps them:
* one writer per namespace (the namespace lock; the plan is made under it);
* a document is replaced whole, in one store operation, and only when every chunk has its vector; its manifest
  row is written after the store write, so a crash leaves the manifest behind the store, never ahead;
* every failure is a row in the run's ``failures.parquet`` (and the summary), and the run goes on;
* finished work is never redone: vectors are cached per provider request, conversions per document.

Overlap: conversion runs one batch ahead (a runner future), and the misses of gathered batches are embedded in
the background (``EmbedRound``, one at a time) while the next batches are converted, split and chunked; a round's
documents are written once the next round has started (or after the last batch). Nothing is written for a document
before its vectors exist, so a crash while a round is in flight leaves its documents as they were (their vectors,
already cached, are reused by the next run).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from collections.abc import Set
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kbflow.runtime import cores
from kbflow.runtime import memory
from kbflow.runtime import progress
from kbflow.chunk.chunker import chunker_fingerprint
from kbflow.chunk.plans import PlanCache
from kbflow.chunk.quality import add_batch as add_chunk_quality
from kbflow.config import KbConfig, check_namespace
from kbflow.convert.archive import ArchiveLimits
from kbflow.convert.converters import converter_fingerprint, run_conversion_pool, text_documents
from kbflow.convert.scan import UnreadableFolder, scan
from kbflow.convert.web import WebScan, is_web, scan_web
from kbflow.sources import normalise
from kbflow.sources.local import settle_identities
from kbflow.sources.names import refuse_secret_names, stored_secret_names
from kbflow.sources.text import TEXT, text_sources
from kbflow.sources.upload import upload_sources
from kbflow.convert.web import save_state as save_web_state
from kbflow.convert.secrets import SecretFound, redact
from kbflow.embed import get_embedder
from kbflow.embed.base import Embedder
from kbflow.embed.choice import for_namespace
from kbflow.runtime.environment import quick_gil_handoffs
from kbflow.engine import stages
from kbflow.engine.embedding import embed_with_cache
from kbflow.engine.plan import Fingerprints, Plan, check_deletion_guard, make_plan
from kbflow.engine.rows import (chunks_of, conversion_failures, embed_inputs, failure_rows, manifest_rows,
                                ready_documents, resolve_chunk_tokens, same_text, store_rows)
from kbflow.engine.runner import DirectRunner, Pending, StageRunner, call
from kbflow.engine.summary import ChunkCounts, DocumentCounts, Failure, GraphCounts, RunSummary
from kbflow.engine.store_check import readable_cache, trusted_manifest
from kbflow.core.errors import ConfigError, KbflowError
from kbflow.runtime.failpoints import failpoint
from kbflow.graph.extract import extractor_fingerprint
from kbflow.graph.llm_extract import FactCache, LlmExtractor, extractor_name
from kbflow.graph.store import GraphStore
from kbflow.core.urls import is_url
from kbflow.core.schemas import CHUNKS, DOCUMENTS, EDGES, MANIFEST, SECTIONS
from kbflow.search.llm import open_chat
from kbflow.search.tokens import TOKENIZER_VERSION, stored_terms_version
from kbflow.state import housekeeping, layout
from kbflow.state.lock import namespace_lock
from kbflow.state.manifest import NamespaceState
from kbflow.state.snapshots import clean_temporaries, write_table
from kbflow.core.storage import location
from kbflow.stores import open_store
from kbflow.stores.base import Store
from kbflow.stores.errors import store_errors
from kbflow.core.trust import SourcePolicy
from kbflow.stores.factory import store_uri
from kbflow.stores.vector_cache import VectorCache

log = logging.getLogger("kbflow.engine")
STAGE_NAMES = ("scan", "convert", "split", "chunk", "embed", "upsert")  # and "graph" when the graph stage is on


class HeldLock(Protocol):
    """The namespace's lock while a run holds it (a lock file, or a lease on object storage)."""

    def check(self) -> None:
        """Raise if the lock was lost (a lease that lapsed): the run must not write."""


@dataclass
class IngestJob:
    """What to ingest: files and folders (recursively), and/or literal texts ``{"doc_id", "text"}``."""

    sources: list[str] | None = None
    namespace: str | None = None
    texts: list[dict] = field(default_factory=list)
    dry_run: bool = False
    force: bool = False
    allow_mass_delete: bool = False
    # add these files (new or changed) and leave the namespace's other documents alone; without it the sources
    # are the namespace's whole set of files, and stored files no longer among them are removed
    add_only: bool = False
    # when set, files met in a folder's walk must really lie under these folders (``kbflow.core.trust``): a symlink
    # leading out of them is not read. Set for sources that someone else sent (MCP, a Run form, CI)
    roots: tuple[str, ...] = ()
    # documents sent inline, already scanned and kept in the inbox: {'source_path', 'path'} (kbflow.sources.upload)
    uploads: list[dict] = field(default_factory=list)


@dataclass
class Run:
    """What one run works with; built once, passed to the steps."""

    config: KbConfig
    namespace: str
    run_id: str
    run_dir: Path
    state: NamespaceState
    embedder: Embedder
    fingerprints: Fingerprints
    chunk_tokens: int
    force: bool
    runner: StageRunner
    summary: RunSummary  # filled as the run goes; its failures are the run's failures.parquet
    seconds: dict[str, float] = field(default_factory=lambda: {stage: 0.0 for stage in STAGE_NAMES})
    store: Store | None = None  # opened under the namespace lock; None in a dry run
    cache: VectorCache | None = None
    lock: HeldLock | None = None  # checked before each store write (a lease on object storage can lapse)
    graph: GraphStore | None = None  # the namespace's graph edges: written when the graph stage is on, or to empty
    # them when it was turned off
    extractor: LlmExtractor | None = None  # graph.llm_extract: the chat model extracting entities and relations
    auth_refused: BaseException | None = None
    sent: set[str] = field(default_factory=set)  # embed keys this run sent to the model (a later round looks again)
    embedding_counts_at_start: dict[str, int] = field(default_factory=dict)
    web: WebScan | None = None  # what the web sources listed (kbflow.convert.web); its validators saved at the end
    locations: dict[str, str] = field(default_factory=dict)  # doc id -> where the file is (the manifest keeps it)

    @property
    def failures(self) -> list[Failure]:
        return self.summary.failures

    def writing(self) -> tuple[Store, VectorCache, HeldLock]:
        """The store, vector cache and lock of a run that writes (opened under the lock before any stage runs)."""
        if self.store is None or self.cache is None or self.lock is None:
            raise RuntimeError("kbflow: a write stage ran before the run opened its store")  # a bug, not a user error
        return self.store, self.cache, self.lock

    def timed(self, stage: str, started: float, done: int | None = None, total: int = 0) -> None:
        """Charge the time since ``started`` to ``stage``; with ``done``, also report the stage's progress."""
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started
        if done is not None:
            progress.report(stage, done, total)


def new_run_id(suffix: str | None = None) -> str:
    """A UTC timestamp (so run folders sort by age) and a unique suffix (a flow run's id, or random)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{stamp}-{(suffix or uuid.uuid4().hex)[:8]}"


def ingest(config: KbConfig, job: IngestJob, runner: StageRunner | None = None, run_id: str | None = None) -> dict:
    """Run ``job`` against ``config``; returns the run summary. Without ``runner`` the stages run in this process."""
    own_runner = runner is None
    runner = runner or DirectRunner(stages.policies(config), config.flow.max_workers + 1)
    try:
        # this run's conversion workers, when it needs them, stopped when it ends; the GIL handed over quickly to
        # the embedding thread while the run's own threads convert and chunk
        with run_conversion_pool(), quick_gil_handoffs():
            return _ingest(config, job, runner, run_id or new_run_id())
    finally:
        if own_runner:
            runner.close()


def _ingest(config: KbConfig, job: IngestJob, runner: StageRunner, run_id: str) -> dict:
    wall_started = time.perf_counter()
    namespace = check_namespace(job.namespace or config.namespace)
    sources = job.sources if job.sources is not None else (config.sources or None)
    texts = job.texts or []
    if not sources and not texts and not job.uploads:
        raise ConfigError("nothing to ingest: pass files or folders, or set `sources` in the config file")
    data_dir = location(config.data_dir)
    state = NamespaceState(data_dir, namespace)
    state.check_files()
    embedder = get_embedder(for_namespace(config.embedder, state.meta()))
    state.check_model(embedder.model_id, embedder.dimension)
    chunk_tokens = resolve_chunk_tokens(config.chunking, embedder.max_tokens, embedder.model_id)
    chunker = chunker_fingerprint(embedder.token_counter(), chunk_tokens, config.chunking.overlap_tokens,
                                  config.chunking.heading_prefix)
    run = Run(config, namespace, run_id, layout.runs_dir(data_dir, namespace) / run_id, state, embedder,
              Fingerprints(converter_fingerprint(config.convert), chunker, embedder.model_id,
                           extractor_fingerprint(config.graph.enabled, extractor_name(config.search.llm)
                                                 if config.graph.llm_extract else None)), chunk_tokens,
              job.force, runner, RunSummary(namespace, run_id, job.dry_run, embedder.model_id))
    run.embedding_counts_at_start = _embedding_counts(embedder)
    if job.dry_run:
        plan = _plan(run, sources, texts, job.add_only, job.roots, job.uploads)
        run.summary.plan = plan.table().to_pylist()
        if state.meta() is not None:  # what the namespace holds now; nothing is created by a dry run
            run.summary.store.count = open_store(config, state.store_namespace(), embedder.dimension).count()
        return _finish(run, wall_started)

    # a data dir that cannot be written (permissions, read-only or full disk) is one clear error, naming the path
    with store_errors(f"ingesting into data dir {str(data_dir)!r}"), namespace_lock(state.root, namespace,
                                                                                        config.flow.lock_wait_s) as lock:
        run.lock = lock
        # one writer per namespace; the plan is made under the lock
        plan = _plan(run, sources, texts, job.add_only, job.roots, job.uploads)
        check_deletion_guard(plan, len(state.read_manifest()), config.flow.max_delete_fraction, job.allow_mass_delete)
        for folder in (state.root, layout.runs_dir(data_dir, namespace)):  # leftovers of a killed run
            clean_temporaries(folder)
        state.record_model(embedder.model_id, embedder.dimension, TOKENIZER_VERSION)
        write_table(plan.table(), run.run_dir / "plan.parquet")
        _record_locations(run, plan)
        failpoint("plan.written")
        run.store = open_store(config, state.store_namespace(), embedder.dimension)
        run.store.defer_vector_index = True  # built once after the last batch, not on top of a batch's memory
        run.cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
        run.cache.ensure_table()  # before any stage runs: concurrent embed calls only ever append to it
        healed_cache = readable_cache(run.cache) if plan.todo else None
        if healed_cache:
            run.summary.healed.append(healed_cache)
        graph = GraphStore(store_uri(config), namespace)
        run_graph = GraphCounts() if config.graph.enabled or graph.exists() else None
        if run_graph is not None:
            run.graph, run.summary.graph = graph, run_graph
        if run_graph is not None and config.graph.enabled and config.graph.llm_extract:  # no chat model configured:
            # the run ends here, clearly
            run.extractor = LlmExtractor(open_chat(config.search.llm), FactCache(
                store_uri(config), extractor_name(config.search.llm)), config.graph.llm_max_tokens,
                1 if config.search.llm.kind == "local" else config.graph.llm_workers)
            run_graph.llm_calls = 0
        if plan.todo:
            _check_embedder(run)
        progress.report("documents", 0, len(plan.todo))
        _ingest_batches(run, plan, {TEXT.prefix + t["doc_id"]: t["text"] for t in texts})
        if plan.deleted:
            _delete(run, plan)
        if run.web is not None:  # the validators of what the store and manifest now hold
            save_web_state(_web_folder(run), run.web)
        _refresh_indexes(run)
        if stored_terms_version(state.read_manifest().column("chunker").to_pylist()) == TOKENIZER_VERSION:
            state.record_terms(TOKENIZER_VERSION)  # the last rows of an older tokenizer were rewritten by this run
        failpoint("run.finishing")
        write_table(failure_rows(run.failures), run.run_dir / "failures.parquet")
        run.summary.store.count = run.store.count()
        if run.graph is not None and run.summary.graph is not None:
            run.summary.graph.edges = run.graph.counts()
        summary = _finish(run, wall_started)
        state.record_run(run.summary.record())
        housekeeping.prune_runs(layout.runs_dir(data_dir, namespace), config.flow.keep_runs)
        housekeeping.prune_results(layout.results_dir(data_dir), config.flow.cache_days)
    for failure in run.failures:
        log.warning("failed: %s %s: %s", failure.stage, failure.source_path or "", failure.message)
    return summary


def _plan(run: Run, sources: list[str] | None, texts: list[dict], add_only: bool = False,
          roots: tuple[str, ...] = (), uploads: list[dict] | None = None) -> Plan:
    started = time.perf_counter()
    config = run.config
    limits = ArchiveLimits(int(config.convert.zip_max_total_mb * 1e6), config.convert.zip_max_members)
    unreadable: list[UnreadableFolder] = []
    confine = SourcePolicy.create(list(roots)).contains if roots else None
    local = [normalise(source) for source in sources or [] if not is_web(source)]  # a file:// URL is its path
    own = [Path(folder) for folder in (config.data_dir, config.store.uri) if folder and not is_url(str(folder))]
    scanned = scan(local, run.namespace, config.convert.include, config.convert.exclude, limits,
                   unreadable, confine, skip=own) if local else []  # never the run's own data dir and store
    scanned = refuse_secret_names(scanned, run.namespace, config.convert)
    manifest = run.state.read_manifest()
    scanned, duplicates = settle_identities(scanned, manifest, run.namespace, add_only)
    web_sources = [source for source in sources or [] if is_web(source)]
    if web_sources:  # pages requested with the validators of their saved bodies (kbflow.convert.web)
        run.web = scan_web(web_sources, run.namespace, config.web, _web_folder(run), run.force,
                           save=not run.summary.dry_run)
        scanned = scanned + refuse_secret_names(run.web.sources, run.namespace, config.convert)
        unreadable = unreadable + run.web.unreadable
        run.summary.web = dict(run.web.counts)
    if manifest.num_rows:  # "unchanged" is trusted only for what the store holds (kbflow.engine.store_check)
        store = run.store or open_store(config, run.state.store_namespace(), run.embedder.dimension)
        manifest, rewrite = trusted_manifest(store, run.namespace, manifest)
        if rewrite:
            run.summary.healed.append(
                f"{len(rewrite)} documents listed in the manifest are missing from the store or differ; written again")
    files = make_plan(scanned + upload_sources(uploads or [], run.namespace), manifest, run.fingerprints,
                      force=run.force, track_removals=bool(sources) and not add_only, unreadable_folders=unreadable)
    removing = {row["doc_id"] for row in files.removed}
    for row in duplicates + stored_secret_names(manifest, config.convert):  # one identity per file; no secret
        if row["doc_id"] not in removing:  # in a stored name
            removing.add(row["doc_id"])
            files.withdrawn.append(row)
    run.locations = {source.doc_id: source.location for source in scanned if source.location}
    stored_paths = manifest.column("source_path").to_pylist()
    for folder in unreadable:  # out of sight is not deleted: its stored documents stay as they are
        kept = sum(1 for path in stored_paths if folder.holds(path))
        name = redact(folder.source_path)[0]  # a folder's name is scanned like a file's
        run.summary.fail(Failure("scan", "UnreadableFolder", source_path=name,
                                 message=f"{name}: cannot list this folder ({folder.reason}); its "
                                         f"{kept} stored documents are kept as they are and nothing in it was "
                                         "ingested. Fix its permissions (it must be readable by the user running "
                                         "kbflow), or exclude it with convert.exclude"))
    literal = make_plan(text_sources(texts, run.namespace), manifest, run.fingerprints, force=run.force,
                        track_removals=False)
    plan = Plan(files.new + literal.new, files.changed + literal.changed, files.unchanged + literal.unchanged,
                files.removed, {**files.same_fingerprints, **literal.same_fingerprints}, files.withdrawn)
    run.summary.documents = DocumentCounts(**plan.counts())
    run.timed("scan", started)
    log.info("plan for %s: %s", run.namespace, plan.counts())
    return plan


def _record_locations(run: Run, plan: Plan) -> None:
    """Unchanged documents stored before locations were kept get theirs now (a manifest write, nothing else), so
    the same file named another way later is found by its location."""
    unchanged = {source.doc_id for source in plan.unchanged if source.doc_id in run.locations}
    if not unchanged:
        return
    manifest = run.state.read_manifest()
    rows = [{**row, "location": run.locations[row["doc_id"]]} for row in manifest.to_pylist()
            if row["doc_id"] in unchanged and row["location"] != run.locations[row["doc_id"]]]
    if rows:
        run.state.update_manifest(pa.Table.from_pylist(rows, schema=MANIFEST), [])


def _web_folder(run: Run):
    return location(run.config.data_dir) / "web" / run.namespace


def _check_embedder(run: Run) -> None:
    """Before converting anything: a remote embedder proves its key and endpoint work with one short request
    (retried like any request). A refused key, a wrong model or a provider that stays down ends the run here,
    recorded in its failures snapshot, instead of after every document was converted and every embed call
    failed the same way."""
    try:
        run.embedder.check_access()
    except KbflowError as exc:
        run.summary.fail(Failure.of("embed", exc))
        write_table(failure_rows(run.failures), run.run_dir / "failures.parquet")
        raise


def _embedding_counts(embedder) -> dict[str, int]:
    """What a remote embedder has sent so far in this process (requests, texts, retries); nothing for a local one."""
    return {name: getattr(embedder, name) for name in ("requests_sent", "texts_sent", "retries")
            if hasattr(embedder, name)}


def _finish(run: Run, wall_started: float) -> dict:
    """The run's counts completed; returns the summary's JSON form (what every entry point hands on)."""
    run.summary.finish_counts()
    run.summary.seconds = {**{k: round(v, 3) for k, v in run.seconds.items()},
                           "total": round(time.perf_counter() - wall_started, 3)}
    sent = _embedding_counts(run.embedder)
    if sent:  # a remote provider: what this run sent, the credential check and retried requests included
        run.summary.embedding = {name: sent[name] - run.embedding_counts_at_start.get(name, 0) for name in sent}
    return run.summary.to_dict()


def _ingest_batches(run: Run, plan: Plan, texts_by_path: dict[str, str]) -> None:
    config, todo, size = run.config, plan.todo, run.config.flow.doc_batch
    batches = [todo[i:i + size] for i in range(0, len(todo), size)]
    # per-document conversion cache, pruned with the results; --force converts everything again
    convert_cache_dir = None if run.force else str(layout.conversion_cache_dir(config.data_dir))

    def start_convert(index: int) -> Pending[pa.Table] | None:
        files = [s for s in batches[index] if s.abs_path]
        first = index * size
        return run.runner.submit(call(stages.convert, files, config.convert, convert_cache_dir, first, len(todo)),
                                 label=f"docs {first}-{first + len(batches[index]) - 1}") if files else None

    pending = start_convert(0) if batches else None
    waiting: list[Waiting] = []
    waiting_misses = 0
    embedding: EmbedRound | None = None
    to_embed: set[str] = set()  # the texts the run has found missing from the vector cache so far
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix=round_thread_prefix(threading.get_ident())) as background, \
            progress.counting(progress.TextCounter("embed")) as texts:
        try:
            for index, batch in enumerate(batches):
                started = time.perf_counter()
                file_docs = pending.result() if pending is not None else DOCUMENTS.empty_table()
                pending = start_convert(index + 1) if index + 1 < len(batches) else None  # runs ahead
                with cores.working():  # the model's passes leave this thread a core meanwhile
                    waiting.append(_chunked_batch(run, batch, index, file_docs, texts_by_path, len(todo), started,
                                                  plan.same_fingerprints))
                del file_docs
                # while a round embeds, the next one gathers until enough texts are missing from the cache to fill
                # the embed calls, or enough documents wait: an update's few new texts per batch then go to the
                # model in full calls; a model with nothing to do (the run's first batch, a round that ended
                # early) gets the misses waiting at once
                waiting[-1].cached, misses = _lookup(run, waiting[-1].chunks)
                texts.add_known(len(misses - to_embed))  # the embed bar's total grows as batches are chunked
                to_embed |= misses
                waiting_misses += len(misses)
                idle = embedding is None or embedding.future.done()
                if ((idle and waiting_misses)
                        or waiting_misses >= config.embedder.task_batch * config.flow.max_workers
                        or sum(w.documents.num_rows for w in waiting) >= config.flow.embed_gather_docs):
                    embedding = _next_round(run, embedding, waiting, len(todo), background)
                    waiting_misses = 0
            texts.finish()  # every batch is chunked: the embed total is final
            if waiting:
                embedding = _next_round(run, embedding, waiting, len(todo), background)
            if embedding is not None:
                _write_round(run, embedding, _round_vectors(run, embedding), len(todo))
        except Exception:
            # a batch failed: the round in flight holds whole documents with every vector; write them, as a run
            # without the overlap would have before reaching the failed batch, then stop with the first error
            if embedding is not None and embedding.batches:
                try:
                    _write_round(run, embedding, _round_vectors(run, embedding), len(todo))
                except Exception:  # the round itself failed (it is the error being raised) or its write did
                    log.warning("the documents embedded before the failure were not written; the next run will")
            raise


def _chunked_batch(run: Run, batch: list, index: int, file_docs: pa.Table, texts_by_path: dict[str, str],
                   total: int, started: float, same_fingerprints: dict[str, dict]) -> Waiting:
    """One converted batch (its files' documents plus its literal texts) split and chunked, each step's table
    written to the run's snapshot; ``started``: when the run began waiting for its conversion. Changed files that
    converted to the Markdown their stored chunks were made from (``same_fingerprints``: their manifest rows) are
    recorded with their new source hash instead: the store holds their chunks already."""
    config, size = run.config, run.config.flow.doc_batch
    first, last = index * size, index * size + len(batch) - 1
    label, part = f"docs {first}-{last}", f"part-{index:05d}.parquet"
    text_docs = text_documents([s for s in batch if not s.abs_path], texts_by_path, config.convert)
    documents = pa.concat_tables([file_docs, text_docs])
    run.timed("convert", started, last + 1, total)
    write_table(documents, run.run_dir / "documents" / part, DOCUMENTS)
    run.summary.failures.extend(conversion_failures(documents))
    _withdraw_secrets(run, documents)
    failpoint("convert.done")
    documents, same = same_text(documents, same_fingerprints, run.run_id)
    if same.num_rows:  # the store holds exactly their chunks (checked when the run planned, under its lock)
        _, _, lock = run.writing()
        lock.check()  # a lease on object storage that lapsed: another writer may hold the namespace now
        run.state.update_manifest(same, [])
        run.summary.documents.same_text += same.num_rows
    key = stages.batch_key(documents)

    started = time.perf_counter()
    sections = run.runner.run(call(stages.split, documents), label=label, cache_key=stages.split_cache_key(key))
    run.timed("split", started, last + 1, total)
    write_table(sections, run.run_dir / "sections" / part, SECTIONS)
    failpoint("split.done")

    started = time.perf_counter()
    chunks = run.runner.run(call(stages.chunk, documents, sections, run.embedder.token_counter(), run.chunk_tokens,
                                 config.chunking, run.fingerprints.chunker, str(run.state.plans_dir)), label=label,
                            cache_key=stages.chunk_cache_key(key, run.fingerprints.chunker))
    run.timed("chunk", started, last + 1, total)
    # warnings name a document, in the summary
    run.summary.chunk_quality = add_chunk_quality(run.summary.chunk_quality, chunks, documents, run.chunk_tokens)
    write_table(chunks, run.run_dir / "chunks" / part, CHUNKS)
    failpoint("chunk.done")

    edges, graph_incomplete = None, set()
    run_graph = run.summary.graph
    if run.fingerprints.graph and run_graph is not None:
        started = time.perf_counter()
        source_paths = dict(zip(documents.column("doc_id").to_pylist(), documents.column("source_path").to_pylist()))
        edges, failed, calls = run.runner.run(call(stages.graph, chunks, source_paths, run.extractor), label=label)
        run.timed("graph", started)
        run_graph.edges_extracted += edges.num_rows
        if run_graph.llm_calls is not None:
            run_graph.llm_calls += calls
        graph_incomplete = _graph_failures(run, chunks, failed)
        write_table(edges, run.run_dir / "graph" / part, EDGES)
    return Waiting(documents, chunks, label, last, edges, graph_incomplete)


def _withdraw_secrets(run: Run, documents: pa.Table) -> None:
    """A stored document whose new text holds credentials leaves the store (unlike other conversion failures,
    which keep the stored version): it was stored before the scan saw it, or it gained a secret since."""
    held_back = [row["doc_id"] for row in documents.select(["doc_id", "error"]).to_pylist()
                 if (row["error"] or "").startswith(f"{SecretFound.__name__}:")]
    stored = set(run.state.read_manifest().column("doc_id").to_pylist()) if held_back else set()
    if any(doc_id in stored for doc_id in held_back):
        _delete_documents(run, [doc_id for doc_id in held_back if doc_id in stored], "docs holding credentials")


def _graph_failures(run: Run, chunks: pa.Table, failed: list[stages.TextFailure]) -> set[str]:
    """A failure row per chunk text the LLM could not extract; returns the documents holding such a chunk (they are
    written with the edges that were extracted, their manifest rows mark the graph incomplete, and the next run
    extracts the rest)."""
    by_text: dict[str, list[tuple[str, str]]] = {}
    for chunk_id, doc_id, text_sha256 in zip(*(chunks.column(c).to_pylist() for c in
                                             ("chunk_id", "doc_id", "text_sha256"))):
        by_text.setdefault(text_sha256, []).append((chunk_id, doc_id))
    blocked: set[str] = set()
    for text in failed:
        holders = by_text.get(text.text_sha256, [])
        blocked |= {doc_id for _, doc_id in holders}
        run.summary.fail(replace(text.failure, chunk_ids=tuple(chunk_id for chunk_id, _ in holders)))
    return blocked


@dataclass
class Waiting:
    """A converted and chunked document batch whose chunks wait for their vectors."""

    documents: pa.Table
    chunks: pa.Table
    label: str
    last: int  # index of its last document in the plan's todo list (progress)
    edges: pa.Table | None = None  # the graph stage's edges out of its chunks (graph on)
    graph_incomplete: set[str] = field(default_factory=set)  # documents with a chunk whose LLM extraction failed
    cached: dict[str, np.ndarray] = field(default_factory=dict)  # its texts' vectors the cache held when chunked


def _lookup(run: Run, chunks: pa.Table) -> tuple[dict[str, np.ndarray], set[str]]:
    """(the vectors the cache holds for the texts of ``chunks``, the embed keys it does not hold): the one lookup of
    the vector cache a text gets on its way to the model; its round takes both along."""
    keys, _texts = embed_inputs(chunks)
    _, cache, _ = run.writing()
    cached = cache.lookup(keys)
    return cached, set(keys) - set(cached)


def round_thread_prefix(owner: int) -> str:
    """The name prefix of the thread embedding a run's rounds, after the run's own thread: a log forwarder that
    keeps one run's lines (``kbflow.tasks.artifacts``) recognises the round's lines as that run's too."""
    return f"kbflow-embed-round-of-{owner}"


@dataclass
class EmbedRound:
    """Waiting batches whose misses are being embedded in the background."""

    batches: list[Waiting]
    future: Future[tuple[dict, set[str]]]  # of (vectors by key, failed keys)


def _next_round(run: Run, embedding: EmbedRound | None, waiting: list[Waiting], total: int,
                background: ThreadPoolExecutor) -> EmbedRound:
    """Start embedding ``waiting``'s misses in the background (``waiting`` is emptied: its batches now belong to the
    new round), once the round in flight has its vectors; then write that round's documents while the new one
    embeds. One round embeds at a time; at most two gathers are held."""
    vectors = _round_vectors(run, embedding) if embedding is not None else None
    batches = list(waiting)
    waiting.clear()
    chunks = pa.concat_tables([w.chunks for w in batches])
    # the round's embed calls go through the runner from its own thread: it must see the flow run's context
    cached = {key: vector for batch in batches for key, vector in batch.cached.items()}
    started = EmbedRound(batches, background.submit(contextvars.copy_context().run, _embed, run, chunks, cached))
    if embedding is not None and vectors is not None:
        _write_round(run, embedding, vectors, total)
    return started


def _round_vectors(run: Run, embedding: EmbedRound) -> tuple[dict, set[str]]:
    """Wait for a round's vectors (all in the vector cache once it returns)."""
    started = time.perf_counter()
    vectors = embedding.future.result()
    run.timed("embed", started)
    return vectors


def _write_round(run: Run, embedding: EmbedRound, vectors: tuple[dict, set[str]], total: int) -> None:
    """Replace each of a round's batches' documents."""
    by_key, failed_keys = vectors
    for batch in embedding.batches:
        started = time.perf_counter()
        with cores.working():  # beside the next round's passes
            _upsert(run, batch.documents, batch.chunks, by_key, failed_keys, batch.label, batch.edges,
                    batch.graph_incomplete)
        run.timed("upsert", started, batch.last + 1, total)
    embedding.batches.clear()
    del by_key, vectors
    memory.trim()  # the batches are written: hand their freed pages back before the next ones


def _embed(run: Run, chunks: pa.Table, cached: dict[str, np.ndarray]) -> tuple[dict, set[str]]:
    """Vectors for every chunk of a round: ``cached`` (what its batches' lookup found), then the misses; failures
    recorded with their chunk ids. A miss an earlier round of this run sent to the model (the same text in two
    batches) is looked up again: that round has put its vector in the cache since."""
    config = run.config
    keys, texts = embed_inputs(chunks)
    _, cache, _ = run.writing()
    cached = {**cached, **cache.lookup([key for key in keys if key in run.sent and key not in cached])}
    counter = progress.counting_now()
    settled = [0]

    def finished(done: int, _total: int) -> None:  # a stage call returned: its texts are done wherever it ran
        if counter is not None:
            counter.settle(done - settled[0])
        settled[0] = done

    outcome = embed_with_cache(keys, texts, run.embedder, cache, run.runner, config.embedder.task_batch,
                               config.flow.max_workers, on_progress=finished, refused=run.auth_refused,
                               cached=cached)
    run.sent.update(key for key in keys if key not in cached)
    run.auth_refused = outcome.auth_refused
    counts: ChunkCounts = run.summary.chunks
    counts.total += chunks.num_rows
    counts.reused += outcome.reused
    counts.embedded += outcome.embedded
    key_column = chunks.column("embed_sha256").to_pylist()
    for failure in outcome.failures:  # those chunks are not stored; the next run retries them
        lost = set(failure.keys)
        mask = pa.array([key in lost for key in key_column], pa.bool_())
        run.summary.fail(replace(Failure.of("embed", failure.error), attempts=failure.attempts,
                                 chunk_ids=tuple(chunks.filter(mask).column("chunk_id").to_pylist())))
    return outcome.vectors, outcome.failed_keys


def _upsert(run: Run, documents, chunks, vectors, failed_keys, label: str, edges: pa.Table | None = None,
            graph_incomplete: Set[str] = frozenset()) -> None:
    """Replace whole documents in one store operation (and their graph edges), then record them in the manifest."""
    ready, blocked = ready_documents(documents, chunks, failed_keys)
    for doc in [doc for doc in ready if doc["doc_id"] in graph_incomplete]:
        run.summary.fail(Failure("graph", "GraphIncomplete", doc_id=doc["doc_id"], source_path=doc["source_path"],
                                 message=f"{doc['source_path']}: the entities of some chunks could not be extracted; "
                                         "it is stored and searchable with the edges that were, and the next run "
                                         "extracts the rest"))
    for doc in blocked:
        run.summary.fail(Failure("embed", "EmbeddingIncomplete", doc_id=doc["doc_id"], source_path=doc["source_path"],
                                 message=f"{doc['source_path']}: some chunks failed to embed; "
                                         "its stored version is kept and the next run retries it"))
    if not ready:
        return
    store, _, lock = run.writing()
    lock.check()
    ready_ids = {doc["doc_id"] for doc in ready}
    doc_chunks = chunks_of(chunks, ready_ids)
    rows = store_rows(doc_chunks, {doc["doc_id"]: doc["source_path"] for doc in ready}, vectors,
                      run.embedder.dimension)
    doc_edges = None
    if run.graph is not None:  # with the graph off, a graph left from when it was on loses these documents' edges
        doc_edges = EDGES.empty_table() if edges is None else edges.filter(
            pc.is_in(edges.column("doc_id"), value_set=pa.array(sorted(ready_ids), pa.string())))
    try:
        run.summary.chunks.written += run.runner.run(call(stages.upsert, store, sorted(ready_ids), rows, run.graph,
                                                          doc_edges), label=label)
        if doc_edges is not None and run.summary.graph is not None:
            run.summary.graph.edges_written += doc_edges.num_rows
    except Exception as exc:  # the store write is one operation: it happened whole or not at all
        for doc in ready:
            run.summary.fail(Failure.of("upsert", exc, f"{doc['source_path']}: {str(exc)[:500]}",
                                        doc_id=doc["doc_id"], source_path=doc["source_path"]))
        return
    failpoint("upsert.after_store")
    run.state.update_manifest(manifest_rows(ready, doc_chunks, run.fingerprints, run.run_id, graph_incomplete,
                                            run.locations), [])
    failpoint("upsert.done")


def _delete(run: Run, plan: Plan) -> None:
    """Documents whose source vanished: their chunks leave the store, then their manifest rows."""
    _delete_documents(run, [row["doc_id"] for row in plan.deleted], "removed docs")


def _delete_documents(run: Run, removed_ids: list[str], what: str) -> None:
    started = time.perf_counter()
    store, _, lock = run.writing()
    lock.check()
    run.summary.chunks.deleted += run.runner.run(call(stages.delete, store, removed_ids, run.graph),
                                                 label=f"{len(removed_ids)} {what}")
    failpoint("delete.after_store")
    run.state.update_manifest(manifest_rows([], CHUNKS.empty_table(), run.fingerprints, run.run_id), removed_ids)
    PlanCache(run.state.plans_dir).forget(removed_ids)
    run.timed("upsert", started)


def _refresh_indexes(run: Run) -> None:
    started = time.perf_counter()
    store, _, _ = run.writing()
    store.defer_vector_index = False
    try:
        run.summary.store.indexes = run.runner.run(call(stages.index, store), label="refresh indexes")
    except Exception as exc:  # nothing stored is at stake: searches scan exactly until an index exists
        run.summary.fail(Failure.of("index", exc, f"refreshing the indexes of {run.namespace!r} failed: "
                                                  f"{str(exc)[:500]}; searches stay correct (unindexed rows are "
                                                  "scanned) and the next write retries"))
    run.timed("upsert", started)
