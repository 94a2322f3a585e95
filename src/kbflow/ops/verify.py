"""`kbflow verify`: manifest ↔ store ↔ vector cache consistency of one namespace, and its repair.

Checked first, the state itself: that the namespace's state files (``namespace.json``, ``manifest.parquet``,
``last_run.json``), its store table and its vector cache can be read at all (a disk that filled up, a file emptied
or deleted by hand). Then the namespace's recorded model against the configured one; in the store, duplicate chunk
ids, vectors of the wrong dimension, zero or non-finite vectors, documents the manifest does not list (a run died
between its store write and its manifest write, and the file is gone since); per manifest document, that the store
holds exactly its chunk ids; per stored chunk, that the vector cache agrees with the stored vector; with a graph
(``graph.enabled``), that every edge leaves a stored chunk of its document and that no document ingested with the
graph stage off has edges.

Repair never invents data. Unreadable state is healed first (``kbflow.state.heal``: the model record rewritten from
what the namespace holds, a store table restored to its newest version that reads whole, a vector cache restored or
emptied, the manifest rebuilt from the store, the last-run record removed); then what is wrong is deleted from the
store and the cache and the affected documents are dropped from the manifest, so the next ingest of the sources
re-runs exactly those documents (their vectors from the vector cache).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

from kbflow.chunk.plans import PLAN_TYPES
from kbflow.config import KbConfig
from kbflow.convert.cache import ENTRY_TYPES
from kbflow.embed import get_embedder
from kbflow.embed.choice import for_namespace
from kbflow.stores.vector_cache import VectorCache
from kbflow.core.errors import ConfigError
from kbflow.sources import origin_of
from kbflow.graph.store import GraphStore
from kbflow.state import heal, layout
from kbflow.state.files import StateDamaged, repair_command
from kbflow.state.manifest import NamespaceState, store_namespace_for
from kbflow.core.schemas import MANIFEST
from kbflow.search.tokens import stored_terms_version
from kbflow.stores import open_store
from kbflow.stores.factory import store_uri

AGREE = 0.999  # cosine between a stored vector and its cached twin; the same model on the same text gives ~1.0


@dataclass
class Finding:
    check: str
    detail: str
    doc_ids: list[str] = field(default_factory=list)


@dataclass
class Report:
    namespace: str
    model_id: str
    counts: dict
    findings: list[Finding]
    repaired: dict | None = None

    @property
    def ok(self) -> bool:
        return not self.findings

    def to_dict(self) -> dict:
        return {"namespace": self.namespace, "model_id": self.model_id, "ok": self.ok, "counts": self.counts,
                "findings": [asdict(f) for f in self.findings], "repaired": self.repaired}


EMPTY_COUNTS = {"manifest_documents": 0, "manifest_chunks": 0, "store_rows": 0, "store_documents": 0,
                "cached_of_stored": 0, "cache_rows": 0, "graph_edges": 0}


def verify(config: KbConfig, namespace: str, repair: bool = False) -> Report:
    state = NamespaceState(config.data_dir, namespace)
    findings: list[Finding] = []
    healed: dict = {}
    misplaced = layout.misplaced(config.data_dir, namespace)  # a file where a folder belongs: read nothing below it
    for damage in misplaced:
        findings.append(Finding(damage.check, f"{damage.path}: {damage.reason}; {repair_command(namespace)} moves it "
                                              "aside (renamed, not deleted)"))
        if repair:
            _note(healed, damage.check, layout.heal(damage))
    if misplaced and not repair:
        return Report(namespace, "", dict(EMPTY_COUNTS), findings)
    try:
        meta = state.meta()
        lost = None if meta is not None else state_lost(config, state)
    except StateDamaged as exc:
        meta, lost = None, str(exc)
    if lost:
        findings.append(Finding("namespace.json", lost))
        if not repair:
            return Report(namespace, "", dict(EMPTY_COUNTS), findings)
        moved = heal.set_aside(state.meta_path)
        meta = rewrite_meta(config, state)
        _note(healed, "namespace.json", f"{moved}rewritten: {meta['model_id']} (dim {meta['dimension']})")
    if meta is None:
        raise ConfigError(f"namespace {namespace!r} does not exist under {config.data_dir}; nothing to verify")
    model_id, dimension = meta["model_id"], meta["dimension"]
    configured = get_embedder(for_namespace(config.embedder, meta))
    if configured.model_id != model_id or configured.dimension != dimension:
        findings.append(Finding("model", f"the namespace holds {model_id} (dim {dimension}) but the config names "
                                         f"{configured.model_id} (dim {configured.dimension})"))

    try:
        store = open_store(config, state.store_namespace(), dimension)
        store_damage = store.unreadable()
    except StateDamaged as exc:  # a local store whose files cannot even be opened (Qdrant's local mode)
        store, store_damage = None, str(exc)
    cache = VectorCache(store_uri(config), model_id, dimension)
    unreadable = [Finding(check, reason) for check, reason in (("store", store_damage),
                                                                ("vector-cache", cache.unreadable())) if reason]
    manifest: pa.Table | None = None
    for check, read in (("last_run.json", state.last_run), ("manifest.parquet", state.read_manifest)):
        try:
            result = read()
        except StateDamaged as exc:
            unreadable.append(Finding(check, str(exc)))
        else:
            if isinstance(result, pa.Table):  # the manifest (last_run.json reads as a dict)
                manifest = result
    if manifest is not None and store is not None and not store_damage and manifest_lost(state, store):
        unreadable.append(Finding("manifest.parquet", f"{state.manifest_path} is missing while the store holds "
                                                      f"{store.count()} chunks; {repair_command(namespace)} "
                                                      "rebuilds it from the store"))
        manifest = None
    index_damage = store.index_damage() if store is not None and not store_damage else None
    if index_damage:
        unreadable.append(Finding("index", f"a search index of the store cannot be used ({index_damage}); "
                                           f"{repair_command(namespace)} builds it again from the rows"))
    findings += unreadable
    if unreadable and not repair:  # the checks below read what is unreadable
        return Report(namespace, model_id, dict(EMPTY_COUNTS), findings)
    damaged = {finding.check for finding in unreadable}
    if "store" in damaged:  # first: the manifest may be rebuilt from it
        if store is None:
            set_aside = heal.set_aside_store(config, state.store_namespace())
            store = open_store(config, state.store_namespace(), dimension)
            healed["store"] = f"{set_aside}; {heal.store_table(store)}"
        else:
            healed["store"] = heal.store_table(store)
        if store.index_damage():  # the restored version's index files may be among those moved aside
            damaged.add("index")
    if "index" in damaged and store is not None:
        healed["index"] = f"rebuilt: {store.rebuild_indexes()}"
    if "vector-cache" in damaged:
        healed["vector-cache"] = heal.vector_cache(cache, store)
    if "last_run.json" in damaged:
        healed["last_run.json"] = heal.drop_last_run(state)
    if "manifest.parquet" in damaged:
        moved = heal.set_aside(state.manifest_path)
        manifest = heal.rebuild_manifest(state, store, model_id, origin_of)
        healed["manifest.parquet"] = (f"{moved}rebuilt from the store: {manifest.num_rows} documents, re-checked by "
                                      "the next ingest")
    if manifest is None:  # unreadable without repair returned above; repaired, it was rebuilt
        raise RuntimeError("the manifest was neither read nor rebuilt")

    rows = store.rows(["chunk_id", "doc_id", "embed_sha256", "vector"])
    chunk_ids = rows.column("chunk_id").to_pylist()
    doc_of = rows.column("doc_id").to_pylist()
    keys = rows.column("embed_sha256").to_pylist()
    vectors = [np.asarray(v, dtype=np.float32) for v in rows.column("vector").to_pylist()]

    bad_vector_docs: set[str] = set()
    healthy = [vector.shape == (dimension,) and bool(np.all(np.isfinite(vector))) and np.linalg.norm(vector) > 0
               for vector in vectors]
    seen, duplicates = set(), set()
    for chunk_id, doc_id, ok in zip(chunk_ids, doc_of, healthy):
        if chunk_id in seen:
            duplicates.add(doc_id)
        seen.add(chunk_id)
        if not ok:
            bad_vector_docs.add(doc_id)
    if duplicates:
        findings.append(Finding("duplicates", "chunk ids stored more than once", sorted(duplicates)))
    if bad_vector_docs:
        findings.append(Finding("vectors", f"vectors of the wrong dimension (not {dimension}), zero or not finite",
                                sorted(bad_vector_docs)))

    stored_by_doc: dict[str, set[str]] = defaultdict(set)
    for chunk_id, doc_id in zip(chunk_ids, doc_of):
        stored_by_doc[doc_id].add(chunk_id)
    listed = {row["doc_id"]: row for row in manifest.to_pylist()}
    orphans = sorted(set(stored_by_doc) - set(listed))
    if orphans:
        findings.append(Finding("orphans", "documents in the store that the manifest does not list", orphans))
    mismatched = sorted(doc_id for doc_id, row in listed.items()
                        if set(row["chunk_ids"]) != stored_by_doc.get(doc_id, set()))
    if mismatched and not rows.num_rows:  # the table or collection gone or emptied
        findings.append(Finding("store", f"the store holds no chunks of this namespace while the manifest lists "
                                         f"{len(mismatched)} documents; {repair_command(namespace)} forgets them, and "
                                         "the next ingest writes them again (vectors from the vector cache where it "
                                         "still holds them)", mismatched))
    elif mismatched:
        findings.append(Finding("manifest", "manifest chunk ids differ from the stored ones", mismatched))
    other_model = sorted(doc_id for doc_id, row in listed.items() if row["model_id"] != model_id)
    if other_model:
        findings.append(Finding("manifest-model", f"manifest rows embedded with another model than {model_id}",
                                other_model))

    cached = cache.lookup(keys)
    disagree_docs, disagree_keys = set(), set()
    for key, doc_id, vector, ok in zip(keys, doc_of, vectors, healthy):
        twin = cached.get(key)
        if twin is None or not ok:  # a broken vector is reported above
            continue
        cosine = float(vector @ twin) / (float(np.linalg.norm(vector) * np.linalg.norm(twin)) or 1.0)
        if cosine < AGREE:
            disagree_docs.add(doc_id)
            disagree_keys.add(key)
    if disagree_docs:
        findings.append(Finding("cache", f"stored vectors differ from the vector cache (cosine < {AGREE})",
                                sorted(disagree_docs)))

    graph = GraphStore(store_uri(config), namespace)
    edge_count = _check_graph(graph, stored_by_doc, listed, findings)

    counts = {"manifest_documents": len(listed), "manifest_chunks": sum(len(r["chunk_ids"]) for r in listed.values()),
              "store_rows": rows.num_rows, "store_documents": len(stored_by_doc),
              "cached_of_stored": sum(1 for key in set(keys) if key in cached), "cache_rows": cache.count(),
              "graph_edges": edge_count}
    uncached = len(set(keys)) - counts["cached_of_stored"]
    if uncached and "vector-cache" not in healed:  # every stored vector came through the cache: it was lost
        findings.append(Finding("vector-cache", f"{uncached} of {len(set(keys))} stored texts are missing from the "
                                                "vector cache: a model change or a re-chunk would embed them again; "
                                                f"{repair_command(namespace)} adds them back from the store"))
        if repair:
            healed["vector-cache"] = heal.vector_cache(cache, store)
    for damage in (layout.damaged_cache_entries(layout.conversion_cache_dir(config.data_dir), "conversion-cache",
                                                ENTRY_TYPES, ("markdown",)) +
                   layout.damaged_cache_entries(state.plans_dir, "chunk-plans", PLAN_TYPES) +
                   layout.damaged_snapshots(config.data_dir, namespace)):
        findings.append(Finding(damage.check, f"{damage.path}: {damage.reason}"))
        if repair:
            _note(healed, damage.check, layout.heal(damage))
    report = Report(namespace, model_id, counts, findings)
    if repair and findings:
        report.repaired = {**_repair(state, store, cache, findings, disagree_keys, graph), **healed}
    return report


def _note(healed: dict, check: str, done: str) -> None:
    healed[check] = f"{healed[check]}; {done}" if check in healed else done


def state_lost(config: KbConfig, state: NamespaceState) -> str | None:
    """Why a namespace with no model record is not simply new: its store table holds chunks (its state folder was
    deleted or emptied, a restore left it out); None when nothing of it is stored."""
    dimension = get_embedder(for_namespace(config.embedder, None)).dimension
    store = open_store(config, state.namespace, dimension)
    if not store.present() or not store.count():
        return None
    return (f"the state of namespace {state.namespace!r} ({state.root}) is missing while its store holds "
            f"{store.count()} chunks; run {repair_command(state.namespace)}: it writes the model record and the "
            "manifest again from the store, and the next `kbflow ingest` re-checks every document (nothing is "
            "embedded again)")


def manifest_lost(state: NamespaceState, store) -> bool:
    """Whether the manifest file is gone while the store still holds chunks (deleted by hand, a bad restore): not
    an empty namespace but one whose record of what it holds was lost."""
    return not state.manifest_path.exists() and not state.manifest_path.is_symlink() and store.count() > 0


def _check_graph(graph: GraphStore, stored_by_doc: dict[str, set[str]], listed: dict[str, dict],
                 findings: list[Finding]) -> int:
    """Edges must leave a chunk their document holds in the store (a crash or a bug that wrote edges and not the
    chunks, or deleted a document and not its edges, leaves them dangling), and only documents whose manifest row
    names a graph extractor have edges (the graph stage was on for them)."""
    edges = graph.columns(["chunk_id", "doc_id"])
    dangling, graph_off = set(), set()
    for chunk_id, doc_id in zip(edges.column("chunk_id").to_pylist(), edges.column("doc_id").to_pylist()):
        if chunk_id not in stored_by_doc.get(doc_id, ()):
            dangling.add(doc_id)
        elif doc_id in listed and not listed[doc_id].get("graph"):
            graph_off.add(doc_id)
    if dangling:
        findings.append(Finding("graph", "graph edges leave chunks the store does not hold", sorted(dangling)))
    if graph_off:
        findings.append(Finding("graph-off", "graph edges of documents whose manifest row names no graph extractor "
                                             "(ingested with the graph stage off, or a run died between writing "
                                             "them and the manifest)", sorted(graph_off)))
    return edges.num_rows


def _repair(state: NamespaceState, store, cache: VectorCache, findings: list[Finding], bad_keys: set[str],
            graph: GraphStore) -> dict:
    """Delete what is wrong and forget the affected documents, so the next ingest re-runs them."""
    affected = sorted({doc_id for finding in findings for doc_id in finding.doc_ids})
    deleted = store.delete_documents(affected) if affected else 0
    graph.delete_documents(affected)
    if bad_keys:
        cache.delete(sorted(bad_keys))
    state.update_manifest(MANIFEST.empty_table(), affected)
    return {"documents_forgotten": len(affected), "rows_deleted": deleted, "cache_rows_deleted": len(bad_keys),
            "next": "run `kbflow ingest` over the namespace's sources: it re-runs exactly these documents"}


def rewrite_meta(config: KbConfig, state: NamespaceState) -> dict:
    """namespace.json from what the namespace holds: its model id from the manifest (or the last run, or the
    configured embedder), its dimension from that model. The live store table is the one a reembed to that model
    writes (``store_namespace_for``) where it exists, the namespace's own table being then an earlier model's
    (listed as superseded, for ``kbflow prune`` and ``kbflow clear``); else the namespace's own."""
    model_id = None
    for read in (lambda: state.read_manifest().column("model_id").to_pylist(),
                 lambda: [(state.last_run() or {}).get("model_id")]):
        try:
            known = Counter(value for value in read() if value)
        except StateDamaged:
            continue
        if known:
            model_id = known.most_common(1)[0][0]
            break
    embedder = get_embedder(for_namespace(config.embedder, {"model_id": model_id} if model_id else None))
    if model_id is not None and embedder.model_id != model_id:
        raise ConfigError(f"namespace {state.namespace!r} was built with {model_id}, which is not the configured "
                          f"embedder ({embedder.model_id}); name that model in the config (embedder.backend, "
                          "embedder.model) and run `kbflow verify --repair` again")
    model_id, dimension = embedder.model_id, embedder.dimension
    meta: dict = {"model_id": model_id, "dimension": dimension, "created": "rebuilt-by-verify"}
    reembedded = store_namespace_for(state.namespace, model_id)
    if open_store(config, reembedded, dimension).present():
        meta["store_namespace"] = reembedded
        if open_store(config, state.namespace, dimension).present():  # its model is not known any more
            meta["superseded"] = [{"store_namespace": state.namespace, "model_id": None, "dimension": None,
                                   "replaced": "found-by-verify"}]
    try:  # the terms the stored rows were written with, when the manifest says so for every document
        terms_version = stored_terms_version(state.read_manifest().column("chunker").to_pylist())
    except StateDamaged:
        terms_version = None
    if terms_version is not None:
        meta["bm25_terms"] = terms_version
    state.write_meta(meta)
    return meta
