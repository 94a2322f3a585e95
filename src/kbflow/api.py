"""The operations as plain Python functions; the CLI is a thin wrapper over these.

``ingest`` and ``add_text`` run the Prefect flow ``flows/ingest.py:ingest`` (the flows folder sits beside the
installed package in a checkout, or on ``sys.path``); the read side never touches Prefect.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from kbflow.config import KbConfig, check_namespace, load_config
from kbflow.errors import ConfigError
from kbflow.lock import NamespaceLock
from kbflow.manifest import NamespaceState
from kbflow.search.searcher import Searcher
from kbflow.stores import Hit, SearchFilter, open_store


def _config(config: KbConfig | str | Path | None, data_dir: str | Path | None) -> KbConfig:
    if isinstance(config, KbConfig):
        return config.model_copy(update={"data_dir": Path(data_dir)}) if data_dir else config
    return load_config(config, data_dir=data_dir)


def load_flow(name: str = "ingest"):
    """The flow ``name`` of ``flows/<name>.py``."""
    return getattr(load_module(name), name)


def load_module(name: str):
    """Import ``flows/<name>.py`` from the repository that holds this package (or from ``sys.path``)."""
    repo_root = Path(__file__).resolve().parents[2]
    if (repo_root / "flows" / f"{name}.py").exists() and str(repo_root) not in sys.path:
        sys.path.insert(0, str(repo_root))
    try:
        module = importlib.import_module(f"flows.{name}")
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"cannot import flows/{name}.py ({exc}); run kbflow from a checkout of the repository "
            "(pip install -e .) or put the repository root on PYTHONPATH"
        ) from exc
    return module


def ingest(sources: list[str] | None, namespace: str | None = None, config: str | Path | None = None,
           data_dir: str | Path | None = None, dry_run: bool = False, force: bool = False,
           allow_mass_delete: bool = False) -> dict:
    """Run the ingest flow over files and folders; returns the run summary."""
    for source in sources or []:
        if not Path(source).exists():  # fail before starting a flow run
            raise ConfigError(f"source {str(source)!r} does not exist: pass an existing file or folder")
    flow = load_flow("ingest")
    from tasks.runners import with_task_runner  # beside flows/; load_flow put the repository on sys.path

    flow = with_task_runner(flow, _config(config, data_dir))  # threads, processes or dask, as configured
    return flow(sources=[str(s) for s in sources] if sources else None, namespace=namespace,
                config_path=str(config) if config else None, data_dir=str(data_dir) if data_dir else None,
                dry_run=dry_run, force=force, allow_mass_delete=allow_mass_delete)


def add_text(text: str, doc_id: str, namespace: str | None = None, config: str | Path | None = None,
             data_dir: str | Path | None = None) -> dict:
    """Add (or replace) one text as a document with a caller-chosen id."""
    if not text.strip():
        raise ConfigError("add_text got an empty text; pass the text to add")
    if not doc_id.strip():
        raise ConfigError("add_text needs a non-empty doc_id")
    flow = load_flow("ingest")
    return flow(sources=None, namespace=namespace, config_path=str(config) if config else None,
                data_dir=str(data_dir) if data_dir else None, texts=[{"doc_id": doc_id, "text": text}])


def search(query: str, namespace: str | None = None, limit: int | None = None, min_score: float | None = None,
           config: KbConfig | str | Path | None = None, data_dir: str | Path | None = None, mode: str | None = None,
           where: SearchFilter | None = None, expand: str | None = None) -> list[Hit]:
    """Best chunks for ``query`` (mode: vector, bm25, hybrid, rerank; scores in the mode's unit, see
    kbflow.search.searcher); hits under ``min_score`` are dropped. Opens the namespace for this one call: use
    ``kbflow.KnowledgeBase`` or ``Searcher`` for many queries."""
    cfg = _config(config, data_dir)
    return Searcher(cfg, namespace).search(query, mode, limit, min_score, where, expand)


def ask(question: str, namespace: str | None = None, config: KbConfig | str | Path | None = None,
        data_dir: str | Path | None = None, mode: str | None = None, where: SearchFilter | None = None,
        expand: str | None = None) -> dict:
    """An answer grounded in retrieved chunks with numbered citations, through the configured chat model."""
    from kbflow.search.ask import ask as ask_question

    return ask_question(Searcher(_config(config, data_dir), namespace), question, mode, where, expand)


def stats(namespace: str | None = None, config: KbConfig | str | Path | None = None,
          data_dir: str | Path | None = None) -> dict:
    """Documents, chunks, model, dimension, store size and last run of one namespace."""
    cfg = _config(config, data_dir)
    namespace = check_namespace(namespace or cfg.namespace)
    state = NamespaceState(cfg.data_dir, namespace)
    meta = state.meta() or {}
    manifest = state.read_manifest()
    dimension = meta.get("dimension")
    store = open_store(cfg, state.store_namespace(), dimension) if dimension else None
    last = state.last_run() or {}
    return {
        "namespace": namespace,
        "documents": manifest.num_rows,
        "chunks": store.count() if store else 0,
        "model_id": meta.get("model_id"),
        "dimension": dimension,
        "store": cfg.store.kind,
        "store_bytes": store.size_bytes() if store else 0,
        "last_run": {key: last.get(key) for key in ("run_id", "documents", "chunks", "seconds")} if last else None,
    }


def clear(namespace: str, config: KbConfig | str | Path | None = None, data_dir: str | Path | None = None) -> dict:
    """Empty one namespace: its store table and its state. Other namespaces are untouched.

    Refused while an ingest of the namespace runs (it holds the namespace lock)."""
    cfg = _config(config, data_dir)
    namespace = check_namespace(namespace)
    state = NamespaceState(cfg.data_dir, namespace)
    meta = state.meta() or {}
    removed = 0
    with NamespaceLock(state.root, namespace):
        if meta.get("dimension"):
            store = open_store(cfg, state.store_namespace(), meta["dimension"])
            removed = store.count()
            store.clear()
        state.clear()  # the lock file goes with the state folder
    return {"namespace": namespace, "chunks_removed": removed}


def verify(namespace: str | None = None, config: KbConfig | str | Path | None = None,
           data_dir: str | Path | None = None, repair: bool = False) -> dict:
    """Check manifest ↔ store ↔ vector cache of one namespace; ``repair`` deletes what is wrong and forgets the
    affected documents (under the namespace lock) so the next ingest re-runs them."""
    from kbflow.verify import verify as run_verify

    cfg = _config(config, data_dir)
    namespace = check_namespace(namespace or cfg.namespace)
    if not repair:
        return run_verify(cfg, namespace).to_dict()
    with NamespaceLock(NamespaceState(cfg.data_dir, namespace).root, namespace):
        return run_verify(cfg, namespace, repair=True).to_dict()
