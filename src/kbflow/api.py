"""The operations as plain Python functions; the CLI is a thin wrapper over these.

Writes (``ingest``, ``add_text``, ``reembed``) run the engine (``kbflow.engine``) either in this process or as a
Prefect flow run (``kbflow.flows``), per ``flow.orchestrator`` (``kbflow.orchestrate``): the same stages, retries,
snapshots and summary either way. The read side never touches Prefect.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kbflow.runtime.environment import set_quiet_offline_defaults

from kbflow.config import KbConfig, check_namespace  # noqa: E402
from kbflow.convert.converters import without_nul  # noqa: E402
from kbflow.convert.secrets import check_name_secrets  # noqa: E402
from kbflow.sources import kind_of  # noqa: E402
from kbflow.sources.text import TEXT  # noqa: E402
from kbflow.engine.ingest import IngestJob  # noqa: E402
from kbflow.engine.reembed import reembed as run_engine_reembed  # noqa: E402
from kbflow.engine.store_check import stored_ids  # noqa: E402
from kbflow.core.errors import ConfigError, StateDamaged  # noqa: E402
from kbflow.graph.store import GraphStore  # noqa: E402
from kbflow.orchestrate import as_flow_run, ingest_sources, orchestration, run_ingest  # noqa: E402
from kbflow.config.resolve import resolve_config  # noqa: E402


class UnknownNamespace(ConfigError):
    """The namespace has never been written in this data dir."""


from kbflow.search.searcher import Searcher  # noqa: E402
from kbflow.state.files import damaged  # noqa: E402
from kbflow.state.lock import describe_lock, namespace_lock  # noqa: E402
from kbflow.state.manifest import NamespaceState, live_store_namespace  # noqa: E402
from kbflow.stores import Hit, SearchFilter, open_store  # noqa: E402
from kbflow.stores.errors import one_line_errors, store_errors  # noqa: E402
from kbflow.stores.factory import store_uri  # noqa: E402


@one_line_errors
def ingest(sources: Sequence[str | Path] | None, namespace: str | None = None, config: KbConfig | str | Path | None = None,
           data_dir: str | Path | None = None, dry_run: bool = False, force: bool = False,
           allow_mass_delete: bool = False) -> dict:
    """Ingest files and folders (changed ones only); returns the run summary."""
    for source in sources or []:
        if not str(source).strip():
            raise ConfigError("an empty source path was given; pass an existing file or folder (an empty string "
                              "would mean the current directory)")
        if not _exists(str(source)):  # fail before any work (a URL: at its listing)
            raise ConfigError(f"source {str(source)!r} does not exist: pass an existing file or folder")
    cfg = resolve_config(config, data_dir)
    return run_ingest(cfg, IngestJob([str(s) for s in sources] if sources else None, namespace,
                                             dry_run=dry_run, force=force, allow_mass_delete=allow_mass_delete))


@one_line_errors
def add_document(path: str | Path, namespace: str | None = None, config: KbConfig | str | Path | None = None,
                 data_dir: str | Path | None = None, force: bool = False, roots: tuple[str, ...] = ()) -> dict:
    """Add (or update) one file, or a folder's files, without touching the namespace's other documents (``ingest``
    instead makes the namespace hold exactly its sources and removes the rest). The document id comes from the
    path relative to the file's own folder, so adding ``a/x.md`` and ``b/x.md`` is one document, the later one.
    ``roots``: a path someone else sent, already checked (``kbflow.core.trust``); a symlink met in its folder that
    leads out of these folders is not read."""
    if not str(path).strip() or not _exists(str(path)):
        raise ConfigError(f"document {str(path)!r} does not exist: pass an existing file or folder")
    return run_ingest(resolve_config(config, data_dir), IngestJob([str(path)], namespace, force=force, add_only=True,
                                                            roots=tuple(roots)))


def _exists(source: str) -> bool:
    """Whether a local source (a path, a file:// URL) exists; any other URL is checked when it is listed."""
    kind = kind_of(source)
    return kind.name != "local" or Path(kind.normalise(source)).expanduser().exists()


@one_line_errors
def add_upload(name: str, data: bytes, namespace: str | None = None, config: KbConfig | str | Path | None = None,
               data_dir: str | Path | None = None, page_url: str | None = None) -> dict:
    """Add (or replace, same name) a document sent inline: ``data`` is the file's bytes, ``name`` its file name
    (its extension picks the converter). It is stored as ``upload:<name>``, apart from files, so it never replaces
    a file of the same name. ``page_url``: the bytes are that web page's (fetched for someone else), stored under
    the page's identity instead (``kbflow.sources.web``). The secret scan reads the content before anything is
    written; refused content never reaches the disk (``kbflow.sources.upload``)."""
    from kbflow.convert.web import source_path_of
    from kbflow.sources.upload import INBOX, UPLOAD, check_name, check_upload, inbox_name
    from kbflow.core.storage import location, write_bytes_atomic

    cfg = resolve_config(config, data_dir)
    name = check_name(name)
    namespace = check_namespace(namespace or cfg.namespace)
    source_path = source_path_of(page_url) if page_url else UPLOAD.prefix + name
    check_upload(data, name, source_path, cfg.convert)
    target = location(cfg.data_dir) / INBOX / namespace / inbox_name(source_path, Path(name).suffix)
    write_bytes_atomic(target, data)
    return run_ingest(cfg, IngestJob([], namespace, add_only=True,
                                     uploads=[{"source_path": source_path, "path": str(target)}]))


@one_line_errors
def add_text(text: str, doc_id: str, namespace: str | None = None, config: KbConfig | str | Path | None = None,
             data_dir: str | Path | None = None) -> dict:
    """Add (or replace) one text as a document with a caller-chosen id."""
    if not without_nul(text).strip():  # NULs are removed from every text (they carry none)
        raise ConfigError("add_text got an empty text; pass the text to add")
    if not doc_id.strip():
        raise ConfigError("add_text needs a non-empty doc_id")
    cfg = resolve_config(config, data_dir)
    if cfg.convert.secret_scan:  # an id is a name, stored and shown: scanned like a file's (the text is, at convert)
        check_name_secrets(TEXT.prefix + doc_id, cfg.convert.secret_scan_allow)
    return run_ingest(cfg, IngestJob([], namespace, [{"doc_id": doc_id, "text": text}]))


@one_line_errors
def reembed(namespace: str, model: str, config: KbConfig | str | Path | None = None,
            data_dir: str | Path | None = None, eval_beir: str | Path | None = None,
            max_ndcg_drop: float = 0.0) -> dict:
    """Re-embed a namespace's chunks with ``model`` into a new table; switch only when complete."""
    cfg = resolve_config(config, data_dir)
    beir = str(eval_beir) if eval_beir else None
    if orchestration(cfg) == "direct":
        return run_engine_reembed(cfg, namespace, model, beir, max_ndcg_drop, ingest=ingest_sources)
    set_quiet_offline_defaults()  # a flow run starts here
    from kbflow.flows.reembed import reembed as reembed_flow

    return as_flow_run(lambda: reembed_flow(namespace=namespace, model=model, eval_beir=beir,
                                             max_ndcg_drop=max_ndcg_drop, config=cfg))


@one_line_errors
def search(query: str, namespace: str | None = None, limit: int | None = None, min_score: float | None = None,
           config: KbConfig | str | Path | None = None, data_dir: str | Path | None = None, mode: str | None = None,
           where: SearchFilter | None = None, expand: str | None = None) -> list[Hit]:
    """Best chunks for ``query`` (mode: vector, bm25, hybrid, rerank; scores in the mode's unit, see
    kbflow.search.searcher); hits under ``min_score`` are dropped. Opens the namespace for this one call: use
    ``kbflow.KnowledgeBase`` or ``Searcher`` for many queries."""
    cfg = resolve_config(config, data_dir)
    searcher = Searcher(cfg, namespace)
    if searcher.store is None:  # nothing recorded: a new namespace, or one whose state was lost beside its store
        _refuse_lost_state(cfg, searcher.state)
    return searcher.search(query, mode, limit, min_score, where, expand)


@one_line_errors
def ask(question: str, namespace: str | None = None, config: KbConfig | str | Path | None = None,
        data_dir: str | Path | None = None, mode: str | None = None, where: SearchFilter | None = None,
        expand: str | None = None, on_token=None, agentic: bool = False) -> dict:
    """An answer grounded in retrieved chunks with numbered citations, through the configured chat model;
    ``on_token`` receives the answer as it is written (piece by piece from a local model); ``agentic``: the
    question chooses its retrieval rounds (``kbflow.search.agentic``), returned as ``trace``."""
    from kbflow.search.ask import ask as ask_question

    return ask_question(Searcher(resolve_config(config, data_dir), namespace), question, mode, where, expand,
                        on_token=on_token, agentic=agentic)


@one_line_errors
def stats(namespace: str | None = None, config: KbConfig | str | Path | None = None,
          data_dir: str | Path | None = None) -> dict:
    """Documents, chunks, model, dimension, store size and last run of one namespace."""
    cfg = resolve_config(config, data_dir)
    namespace = check_namespace(namespace or cfg.namespace)
    state = NamespaceState(cfg.data_dir, namespace)
    meta = state.meta() or {}
    if not meta:
        _refuse_lost_state(cfg, state)
    manifest = state.read_manifest()
    dimension = meta.get("dimension")
    store = open_store(cfg, state.store_namespace(), dimension) if dimension else None
    last = state.last_run() or {}
    # the rows' ids, not the table's recorded count: a table with a data file gone still "counts" its rows
    chunks = stored_ids(store, namespace).num_rows if store else 0
    if chunks and not manifest.num_rows and not state.manifest_path.exists():
        raise damaged(state.manifest_path, namespace, f"it is missing, while the store holds {chunks} chunks")
    return {
        "namespace": namespace,
        "documents": manifest.num_rows,
        "chunks": chunks,
        "model_id": meta.get("model_id"),
        "dimension": dimension,
        "store": cfg.store.kind,
        "store_bytes": store.size_bytes() if store else 0,
        "last_run": {key: last.get(key) for key in ("run_id", "documents", "chunks", "seconds")} if last else None,
    }


@one_line_errors
def namespaces(config: KbConfig | str | Path | None = None, data_dir: str | Path | None = None) -> list[dict]:
    """Every namespace of the data dir with its documents, chunks, model and last run (``kbflow namespaces``)."""
    from kbflow.state.manifest import namespaces as names

    cfg = resolve_config(config, data_dir)
    return [stats(name, cfg) for name in names(cfg.data_dir)]


@one_line_errors
def require_namespace(namespace: str | None, config: KbConfig | str | Path | None = None,
                      data_dir: str | Path | None = None) -> str:
    """``namespace`` (or the config's) if it exists in the data dir; else an error that lists the ones that do
    (a typo must not look like an empty namespace)."""
    from kbflow.state.manifest import namespaces as names

    cfg = resolve_config(config, data_dir)
    name = check_namespace(namespace or cfg.namespace)
    state = NamespaceState(cfg.data_dir, name)
    if state.meta() is None:
        _refuse_lost_state(cfg, state)
        known = names(cfg.data_dir)
        raise UnknownNamespace(f"namespace {name!r} does not exist in data dir {str(cfg.data_dir)!r} (known: "
                               f"{', '.join(known) if known else 'none'}); ingest into it first (`kbflow ingest PATH "
                               f"--namespace {name}`), or pass --namespace / --data-dir")
    return name


def _refuse_lost_state(cfg: KbConfig, state: NamespaceState) -> None:
    """StateDamaged when a namespace without a model record still has a store table with chunks: its state was
    lost, and answering "does not exist" or "0 documents" would hide it."""
    from kbflow.ops.verify import state_lost

    lost = state_lost(cfg, state)
    if lost:
        raise StateDamaged(lost, str(state.root), state.namespace)


@one_line_errors
def clear(namespace: str, config: KbConfig | str | Path | None = None, data_dir: str | Path | None = None) -> dict:
    """Empty one namespace: its store table, the tables of its earlier models that a reembed left for
    ``kbflow prune`` (left behind, a later ingest of the namespace would write into the first model's table and serve
    its old rows again), and its state. Other namespaces are untouched.

    Refused while an ingest of the namespace runs (it holds the namespace lock)."""
    from kbflow.engine.reembed import drop_superseded

    cfg = resolve_config(config, data_dir)
    namespace = check_namespace(namespace)
    state = NamespaceState(cfg.data_dir, namespace)
    removed, superseded = 0, []
    with store_errors(f"clearing namespace {namespace!r} in data dir {str(cfg.data_dir)!r}"), \
            namespace_lock(state.root, namespace, cfg.flow.lock_wait_s):
        meta = state.meta() or {}  # under the lock: a reembed may have switched tables until it was free
        if meta.get("dimension"):
            superseded = drop_superseded(cfg, namespace, meta)  # the record goes below
            store = open_store(cfg, live_store_namespace(namespace, meta), meta["dimension"])
            removed = store.count()
            store.clear()
        GraphStore(store_uri(cfg), namespace).clear()
        state.clear()  # the lock file goes with the state folder
    return {"namespace": namespace, "chunks_removed": removed, "superseded_removed": superseded}


@one_line_errors
def verify(namespace: str | None = None, config: KbConfig | str | Path | None = None,
           data_dir: str | Path | None = None, repair: bool = False) -> dict:
    """Check manifest ↔ store ↔ vector cache of one namespace; ``repair`` deletes what is wrong and forgets the
    affected documents (under the namespace lock) so the next ingest re-runs them."""
    from kbflow.state import layout
    from kbflow.ops.verify import verify as run_verify

    cfg = resolve_config(config, data_dir)
    namespace = check_namespace(namespace or cfg.namespace)
    root = NamespaceState(cfg.data_dir, namespace).root
    lock_note = describe_lock(root, namespace)  # a lock no live run of this host holds
    if not repair:
        report = run_verify(cfg, namespace).to_dict()
        if lock_note:
            report["findings"].append({"check": "ingest.lock", "detail": lock_note, "doc_ids": []})
            report["ok"] = False
        return report
    # a data dir that cannot be written is one error naming the path, as for an ingest
    with store_errors(f"repairing namespace {namespace!r} in data dir {str(cfg.data_dir)!r}"):
        # a file where the state folder belongs is moved aside first: the lock is taken inside that folder
        moved = [layout.heal(damage) for damage in layout.misplaced(cfg.data_dir, namespace)
                 if damage.path in (root, root.parent)]
        with namespace_lock(root, namespace, cfg.flow.lock_wait_s):  # takes over a stale lock, waits for a live one
            report = run_verify(cfg, namespace, repair=True).to_dict()
    if moved:
        repaired = report["repaired"] or {}
        repaired["namespace.json"] = "; ".join(moved + ([repaired["namespace.json"]] if "namespace.json" in repaired
                                                        else []))
        report["repaired"] = repaired
    if lock_note:
        report["repaired"] = {**(report["repaired"] or {}), "ingest.lock": f"taken over ({lock_note.split(':')[0]})"}
    return report
