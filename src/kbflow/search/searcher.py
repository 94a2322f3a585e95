"""The read side of one namespace, opened once: vector, BM25, hybrid and reranked search, with optional
multi-query expansion (MQE) or hypothetical-document search (HyDE).

Scores are in the mode's own unit (``Hit.extra`` keeps the inputs): vector = cosine similarity (-1..1);
bm25 = BM25 score (≥ 0); hybrid = RRF sum (≤ 2/(rrf_k+1)) or weighted min-max (0..1); rerank = the reranker's
score; graph = hybrid's scores, with the chunks inserted from the graph scored as the hybrid hit below them, each
hit with the path that reached it (``kbflow.graph.expand``). With MQE, the lists of every phrasing are fused again
by RRF, so scores are RRF sums.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Callable

import numpy as np

from kbflow.config import KbConfig, check_namespace
from kbflow.embed import get_embedder
from kbflow.embed.choice import for_namespace
from kbflow.core.errors import ConfigError
from kbflow.state.manifest import NamespaceState
from kbflow.search import fusion
from kbflow.search.tokens import TOKENIZER_VERSION, terms_function
from kbflow.core.storage import is_remote
from kbflow.stores import Hit, SearchFilter, open_store

MODES = ("vector", "bm25", "hybrid", "rerank", "graph")
EXPANSIONS = ("mqe", "hyde")


def embed_query(embedder, text: str) -> np.ndarray:
    """The one place a query becomes a vector (query-side prefixes belong to the embedder's query path)."""
    return embedder.embed_query(text)


def candidate_lists(store, query_vector: Callable[[], np.ndarray], terms: list[str], depth: int,
                    where: SearchFilter | None = None, pool: ThreadPoolExecutor | None = None) -> dict[str, list[Hit]]:
    """Vector and BM25 candidates for fusion. Given a pool and a store whose reads may overlap
    (``store.concurrent_reads``), BM25 runs on the pool's thread while this one embeds the query and searches the
    vectors, so a hybrid query costs the slower of the two rather than their sum (LanceDB searches outside the GIL)."""
    store = store.searches()  # both halves read one version of the table, looked up once
    if pool is not None and getattr(store, "concurrent_reads", False):
        bm25 = pool.submit(store.search_text, terms, depth, where)
        vector = store.search_vector(query_vector(), depth, where)
        return {"vector": vector, "bm25": bm25.result()}
    return {"vector": store.search_vector(query_vector(), depth, where), "bm25": store.search_text(terms, depth, where)}


def fuse(lists: dict[str, list[Hit]], settings) -> list[Hit]:
    """Hybrid's one ranked list from the vector and BM25 candidates, as ``search.fusion`` says."""
    if settings.fusion == "rrf":
        return fusion.rrf(lists, settings.rrf_k)
    if settings.fusion == "standout":
        return fusion.standout(lists, settings.vector_weight, settings.bm25_floor)
    if settings.fusion == "trusted":
        return fusion.trusted(lists, settings.vector_weight, settings.bm25_floor)
    return fusion.weighted(lists, {"vector": settings.vector_weight, "bm25": 1 - settings.vector_weight})


def _model_of(meta: dict | None) -> tuple | None:
    """What a searcher's embedder and store depend on in a namespace record."""
    return None if meta is None else (meta.get("model_id"), meta.get("dimension"), meta.get("store_namespace"))


class Searcher:
    def __init__(self, config: KbConfig, namespace: str | None = None):
        self.config = config
        self.namespace = check_namespace(namespace or config.namespace)
        self.state = NamespaceState(config.data_dir, self.namespace)
        self.store = None
        self._stamp = self._record_stamp()  # before reading: a change in between is seen at the next search
        self._open(self.state.meta())
        self._reranker = None
        self._chat = None
        self._pool: ThreadPoolExecutor | None = None  # one thread for BM25 beside the vector search (hybrid)
        self._expander = None

    def _open(self, meta: dict | None) -> None:
        """The namespace's embedder (its model's config files: weights load on first query), BM25 terms and store,
        as its record ``meta`` names them; no store while the namespace holds nothing."""
        self._model = _model_of(meta)
        self.embedder = get_embedder(for_namespace(self.config.embedder, meta))
        # a query's BM25 terms in the version the namespace's rows hold (an upgrade's next ingest rewrites them)
        self._terms_version = (meta or {}).get("bm25_terms")
        self.terms = terms_function(self._terms_version)
        if meta is not None:
            self.state.check_model(self.embedder.model_id, self.embedder.dimension)
            self.store = open_store(self.config, self.state.store_namespace(), self.embedder.dimension,
                                    for_search=True)

    def _record_stamp(self) -> tuple | None:
        """The namespace record file's identity on local disk (inode, mtime, size; "absent"), a few microseconds
        per search. In a bucket, where reading it costs a request: None where searches read a local copy of the
        table (``_copy``), whose syncs say when to read it; without a copy, a new stamp every search (the record
        is read each time, beside the search's own requests into the bucket)."""
        if is_remote(self.state.meta_path):
            return None if self._copy() is not None else ("read", time.monotonic_ns())
        try:
            found = os.stat(self.state.meta_path)
        except (FileNotFoundError, NotADirectoryError):  # a file where the state folder belongs reads as damage below
            return ("absent",)
        return (found.st_ino, found.st_mtime_ns, found.st_size)

    def _copy(self):
        """The local copy of the bucket's table that searches read (``kbflow.stores.mirror``), if there is one."""
        return getattr(self.store, "mirror", None)

    def _follow_record(self) -> None:
        """Another process may have cleared the namespace, or cleared it and ingested again with another model, since
        this searcher read its record (`kbflow mcp` runs for days): queries must then be embedded by the model the
        vectors are in, never by the old one (same dimension, meaningless hits). Re-read the record when its file
        changed, and re-open when its model or live table did; a cleared namespace answers []."""
        stamp = self._record_stamp()
        if stamp == self._stamp:
            return
        self._stamp = stamp
        self._reread_record()

    def _reread_record(self) -> None:
        meta = self.state.meta()
        if meta is None:
            self.store, self._model = None, None
        elif _model_of(meta) != self._model:
            self._open(meta)

    # --- lazily built helpers ------------------------------------------------------------------------------
    @property
    def reranker(self):
        if self._reranker is None:
            from kbflow.search.rerank import get_reranker

            self._reranker = get_reranker(self.config.search.rerank, self.config.embedder.device)
        return self._reranker

    @property
    def chat(self):
        if self._chat is None:
            from kbflow.search.llm import open_chat

            self._chat = open_chat(self.config.search.llm)
        return self._chat

    @property
    def expander(self):
        """Graph search over the namespace's graph; refused with the fix when the namespace has none."""
        if self._expander is None:
            from kbflow.graph.expand import GraphExpander
            from kbflow.graph.store import GraphStore
            from kbflow.stores.factory import store_uri

            graph = GraphStore(store_uri(self.config), self.namespace)
            if not graph.exists():
                raise ConfigError(f"search mode 'graph' needs the graph of namespace {self.namespace!r}, which has "
                                  "none: set graph.enabled: true in the config (or KBFLOW__GRAPH__ENABLED=true) and "
                                  "ingest again (documents are re-processed once, from their cached vectors)")
            self._expander = GraphExpander(self.store, graph, self.namespace, self.config.graph)
        return self._expander

    # --- search --------------------------------------------------------------------------------------------
    def search(self, query: str, mode: str | None = None, limit: int | None = None, min_score: float | None = None,
               where: SearchFilter | None = None, expand: str | None = None) -> list[Hit]:
        """Best ``limit`` chunks for ``query``; hits scoring under ``min_score`` (mode's unit) are dropped."""
        settings = self.config.search
        mode = mode or settings.mode
        if mode not in MODES:
            raise ConfigError(f"search mode {mode!r} is unknown; use one of {', '.join(MODES)}")
        if expand is not None and expand not in EXPANSIONS:
            raise ConfigError(f"query expansion {expand!r} is unknown; use one of {', '.join(EXPANSIONS)}")
        query = query.replace("\x00", "")  # as in stored texts (kbflow.convert.converters.without_nul): the e5
        # tokenizer would read the query only up to its first NUL
        if not query.strip():
            raise ConfigError("the query is empty; pass the text to look for")
        limit = limit or settings.limit
        min_score = settings.min_score if min_score is None else min_score
        self._follow_record()
        if self.store is None:  # empty when opened: has another process written the namespace since?
            meta = self.state.meta()
            if meta is None:
                return []
            self._open(meta)
        copy = self._copy()
        syncs = copy.syncs if copy is not None else None
        hits = self._answer(query, mode, limit, where, expand)
        if copy is not None and copy.syncs != syncs:
            # the copy fetched a new version of the bucket's table during this search: a namespace cleared and
            # ingested again with another model writes its table anew, so read the record, and answer again in
            # the new model's space if it changed (the record names the model before its table is written)
            model = self._model
            self._reread_record()
            if self._model != model:
                hits = self._answer(query, mode, limit, where, expand) if self.store is not None else []
        hits = hits[:limit]
        return hits if min_score is None else [hit for hit in hits if hit.score >= min_score]

    def _answer(self, query: str, mode: str, limit: int, where: SearchFilter | None, expand: str | None) -> list[Hit]:
        """The ranked hits of ``query``, with its expansion (MQE's phrasings fused, or HyDE's passage)."""
        if expand == "mqe":
            phrasings = [query] + self.expand_queries(query)
            lists = {f"q{i}": self._retrieve(text, text, mode, limit, where) for i, text in enumerate(phrasings)}
            hits = fusion.rrf(lists, self.config.search.rrf_k)
            for hit in hits:
                hit.extra["phrasings"] = phrasings
        elif expand == "hyde":
            passage = self.hypothetical_document(query)
            hits = self._retrieve(query, passage, mode, limit, where)
            for hit in hits:
                hit.extra["hyde"] = passage
        else:
            hits = self._retrieve(query, query, mode, limit, where)
        return hits

    def _retrieve(self, query: str, vector_text: str, mode: str, limit: int, where: SearchFilter | None) -> list[Hit]:
        """One ranked list. ``vector_text`` is what gets embedded (the query, or HyDE's passage); BM25 and the
        reranker read the query itself (with HyDE, BM25 reads both)."""
        settings = self.config.search
        if self.store is None:
            raise RuntimeError("no store to search: search() answers [] before asking for one")
        if mode == "vector":
            return self.store.search_vector(embed_query(self.embedder, vector_text), limit, where)
        bm25_text = query if vector_text == query else f"{query}\n{vector_text}"
        if self._terms_version != TOKENIZER_VERSION:  # rows of an older tokenizer: has another process's ingest
            self._terms_version = (self.state.meta() or {}).get("bm25_terms")  # rewritten them since? (one small
            self.terms = terms_function(self._terms_version)  # read per search, until they are the current ones)
        if mode == "bm25":
            return self.store.search_text(self.terms(bm25_text), limit, where)
        depth = max(settings.candidates, limit, settings.rerank.candidates if mode == "rerank" else 0)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kbflow-bm25")
        vectors: list[np.ndarray] = []

        def query_vector() -> np.ndarray:
            vectors.append(embed_query(self.embedder, vector_text))
            return vectors[-1]

        lists = candidate_lists(self.store, query_vector, self.terms(bm25_text), depth, where, self._pool)
        fused = fuse(lists, settings)
        if mode == "hybrid":
            return fused
        if mode == "graph":
            from kbflow.graph.expand import insert

            graph = self.config.graph
            reached = self.expander.expand(query, vectors[-1], fused, where)
            return insert(fused, reached, graph.insert_after, graph.slots)
        return self.rerank(query, fused[:settings.rerank.candidates])

    def rerank(self, query: str, hits: list[Hit]) -> list[Hit]:
        """``hits`` ordered by the reranker's score (the earlier score kept in ``extra['fused']``)."""
        scores = self.reranker.scores(query, [hit.text for hit in hits])
        ranked = [replace(hit, score=score, extra={**hit.extra, "fused": hit.score}) for hit, score in zip(hits, scores)]
        return sorted(ranked, key=lambda hit: -hit.score)

    # --- query expansion through the chat model -----------------------------------------------------------
    def expand_queries(self, query: str) -> list[str]:
        """MQE: other phrasings of ``query`` from the chat model, one per line."""
        n = self.config.search.llm.mqe_queries
        text = self.chat.complete([
            {"role": "system", "content": "You rewrite search queries. Answer with the queries only, one per line, "
                                          "no numbering, in the language of the original."},
            {"role": "user", "content": f"Write {n} different search queries that find the same information as:\n{query}"},
        ])
        lines = [line.strip().lstrip("-*•0123456789.) ").strip() for line in text.splitlines()]
        phrasings = [line for line in lines if line and line != query][:n]
        if not phrasings:
            raise ConfigError(f"multi-query expansion got no usable phrasing from the chat model (reply {text[:80]!r})")
        return phrasings

    def hypothetical_document(self, query: str) -> str:
        """HyDE: a short passage that would answer ``query``, written by the chat model; its embedding is searched."""
        return self.chat.complete([
            {"role": "system", "content": "Write a short factual passage (at most 120 words) that answers the question, "
                                          "as it might appear in documentation. No preamble."},
            {"role": "user", "content": query},
        ])

    def stats(self) -> dict:
        return self.store.stats() if self.store is not None else {"rows": 0, "documents": 0, "bytes": 0, "indexes": {}}
