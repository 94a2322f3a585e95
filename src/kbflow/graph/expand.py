"""Graph-aware search (``search --mode graph``): hybrid search's ranking, with the best chunks its top hits link to
inserted below its first places; every hit says why it was returned.

1. Seeds: the best ``graph.seeds`` hits of hybrid search, and the chunks whose defined term, section heading or
   extracted entity the query names (``defines``/``heading``/``entity`` edges, whole words only).
2. Expansion, ``graph.hops`` times: the seeds' links, grouped by the document they point to (at most
   ``graph.max_targets`` documents per hop, those linked from the best seeds first); from each linked document the
   chunk its link's anchor or text names (a defined term or heading there) and the ``graph.per_target`` chunks
   closest to the query; and, where the LLM extracted them (``graph.llm_extract``), the relations the seeds state:
   the chunks naming each relation's target entity. The chunks reached are the next hop's seeds.
3. The ranking (``insert``): hybrid's first ``graph.insert_after`` hits, then the ``graph.slots`` chunks reached by
   a hop that are closest to the query (cosine similarity), then the rest of hybrid's hits in their order. The graph
   moves a hybrid hit down by ``slots`` places at most and keeps their order (an inserted chunk may be one hybrid
   ranked lower, moved up): fusing the graph's list into the
   ranking (RRF, weighted RRF) lost 5-18 nDCG points to hybrid on the relation sets, inserting is within ±0.5
   (docs/retrieval.md#graph-search).

Every hit reached through the graph carries ``extra["path"]``, the steps that reached it ("hit #2 for the query:
sql-vacuum.html § Parameters", "links to runtime-config-client.html#GUC-VACUUM-FREEZE-MIN-AGE
'vacuum_freeze_min_age', which names: runtime-config-client.html § ..."); a hybrid hit says so with its ranks in
the vector and BM25 lists.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

from kbflow.config import GraphConfig
from kbflow.convert.scan import doc_id_for
from kbflow.graph.extract import SECTION_NUMBER_RE, term_key
from kbflow.graph.store import GraphStore
from kbflow.stores.base import Hit, SearchFilter
from kbflow.stores.lancedb_store import IN_LIST_MAX

MAX_NGRAM = 4
CJK_RUN_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]{2,}")
STOP = frozenset("a an and are as at be by can do does for from how i in is it its of on or should the to use what "
                 "when where which who why with".split())


def query_term_keys(query: str) -> list[str]:
    """The term keys a query names: its word n-grams (1 to 4 words; single words of 3+ letters that are not stop
    words) and, for Chinese and Japanese text, every substring of 2 to 12 characters of a CJK run."""
    words = re.findall(r"[^\W_]+", term_key(query))
    keys: list[str] = []
    for size in range(MAX_NGRAM, 0, -1):
        for start in range(len(words) - size + 1):
            gram = words[start:start + size]
            if size == 1 and (len(gram[0]) < 3 or gram[0] in STOP):
                continue
            keys.append(" ".join(gram))
    for run in CJK_RUN_RE.findall(query):
        keys += [run[i:j] for i in range(len(run)) for j in range(i + 2, min(len(run), i + 12) + 1)]
    return list(dict.fromkeys(keys))


def anchor_keys(anchor: str, label: str) -> list[str]:
    """What a link says it points to, as term keys: the anchor's trailing words (GUC-WORK-MEM → 'guc work mem',
    'work mem', 'mem' ...) and the link's text and title without section numbers."""
    words = re.findall(r"[^\W_]+", term_key(anchor))
    keys = [" ".join(words[i:]) for i in range(len(words))]
    for part in label.split(" | "):
        key = term_key(SECTION_NUMBER_RE.sub("", part.strip()))
        if key:
            keys.append(key)
    return list(dict.fromkeys(keys))


def _where(where: SearchFilter | None, **fields) -> SearchFilter:
    base = where or SearchFilter()
    return SearchFilter(source_glob=base.source_glob, heading_prefix=base.heading_prefix,
                        doc_ids=fields.get("doc_ids", ()), chunk_ids=fields.get("chunk_ids", ()))


def insert(hybrid: list[Hit], reached: list[Hit], after: int, slots: int) -> list[Hit]:
    """Hybrid's first ``after`` hits, the best ``slots`` chunks of ``reached`` (best first) that were reached by a
    hop and are not among them, then the rest of hybrid's hits in their order. An inserted hit takes the score of
    the hybrid hit below it (scores never rise down the list; its cosine similarity is ``extra['graph']``)."""
    def said(hit: Hit, rank: int) -> Hit:
        ranks = ", ".join(f"{name} #{hit.extra[name + '_rank']}" for name in ("vector", "bm25")
                          if name + "_rank" in hit.extra)
        return replace(hit, extra={**hit.extra, "path": [f"hit #{rank} for the query ({ranks})"]})

    top = [said(hit, rank) for rank, hit in enumerate(hybrid[:after], 1)]
    taken = {hit.chunk_id for hit in top}
    hopped = [hit for hit in reached if len(hit.extra["path"]) > 1 and hit.chunk_id not in taken][:slots]
    taken |= {hit.chunk_id for hit in hopped}
    rest = [said(hit, rank) for rank, hit in enumerate(hybrid[after:], after + 1) if hit.chunk_id not in taken]
    score = rest[0].score if rest else top[-1].score if top else 0.0
    inserted = [replace(hit, score=score, extra={**hit.extra, "graph": hit.score,
                                                 "graph_rank": reached.index(hit) + 1}) for hit in hopped]
    return top + inserted + rest


def _place(hit: Hit) -> str:
    heading = hit.heading_path[-1] if hit.heading_path else ""
    return f"{hit.source_path} § {heading}" if heading else hit.source_path


class GraphExpander:
    def __init__(self, store, graph: GraphStore, namespace: str, settings: GraphConfig):
        self.store = store
        self.graph = graph
        self.namespace = namespace
        self.settings = settings

    def _fetch(self, vector: np.ndarray, where: SearchFilter | None, chunk_ids: list[str]) -> dict[str, Hit]:
        """These chunks (those the user's filter admits), scored by cosine similarity to the query."""
        found: dict[str, Hit] = {}
        for start in range(0, len(chunk_ids), IN_LIST_MAX):
            part = tuple(chunk_ids[start:start + IN_LIST_MAX])
            for hit in self.store.search_vector(vector, len(part), _where(where, chunk_ids=part), exact=True):
                found[hit.chunk_id] = hit
        return found

    def entity_seeds(self, query: str, vector: np.ndarray, where: SearchFilter | None) -> list[Hit]:
        """Chunks that define a term, or start a section titled with a phrase, that the query names (longest
        phrases first; at most ``seeds`` of them)."""
        keys = query_term_keys(query)
        edges = self.graph.terms(keys).to_pylist()
        order = {key: i for i, key in enumerate(keys)}  # longer n-grams come first
        edges.sort(key=lambda e: (order[e["target"]], e["kind"] != "defines", e["chunk_id"]))
        chosen: dict[str, dict] = {}
        for edge in edges:
            if len(chosen) >= self.settings.seeds:
                break
            chosen.setdefault(edge["chunk_id"], edge)
        hits = self._fetch(vector, where, list(chosen))
        seeds = []
        for chunk_id, edge in chosen.items():
            if chunk_id in hits:
                what = {"defines": "defines", "heading": "is the section"}.get(edge["kind"], "names the entity")
                seeds.append(replace(hits[chunk_id], extra={"path": [
                    f"{what} '{edge['label']}', named in the query: {_place(hits[chunk_id])}"]}))
        return seeds

    def expand(self, query: str, vector: np.ndarray, fused: list[Hit], where: SearchFilter | None) -> list[Hit]:
        """Every chunk reached from the seeds (query-named entity seeds, and the chunks reached by hops), best
        cosine similarity first, each with its path."""
        settings = self.settings
        reached: dict[str, Hit] = {}
        frontier = [replace(hit, extra={"path": [f"hit #{rank} for the query: {_place(hit)}"]})
                    for rank, hit in enumerate(fused[:settings.seeds], 1)]
        for seed in self.entity_seeds(query, vector, where):
            reached.setdefault(seed.chunk_id, seed)
            frontier.append(seed)
        seen = {hit.chunk_id for hit in frontier}
        for _hop in range(settings.hops):
            nxt = self._hop(vector, frontier, where, seen)
            for hit in nxt:
                reached.setdefault(hit.chunk_id, hit)
            seen |= {hit.chunk_id for hit in nxt}
            frontier = nxt
            if not frontier:
                break
        return sorted(reached.values(), key=lambda hit: -hit.score)

    def _hop(self, vector: np.ndarray, frontier: list[Hit], where: SearchFilter | None, seen: set[str]) -> list[Hit]:
        by_chunk = {hit.chunk_id: hit for hit in frontier}
        links = self.graph.edges_from(list(by_chunk)).to_pylist()
        rank = {chunk_id: i for i, chunk_id in enumerate(by_chunk)}
        links.sort(key=lambda e: (rank[e["chunk_id"]], e["edge_id"]))
        targets: dict[str, list[dict]] = {}  # doc id -> the links into it, best seed first
        for edge in links:
            doc_id = doc_id_for(self.namespace, edge["target"])
            if doc_id in targets or len(targets) < self.settings.max_targets:
                targets.setdefault(doc_id, []).append(edge)
        doc_ids = list(targets)
        # the chunk each link's anchor or text names, in the document it points to
        named: dict[str, tuple[dict, dict]] = {}  # chunk id -> (link, term edge)
        keys_by_doc = {doc_id: {key: link for link in links_in for key in anchor_keys(link["anchor"], link["label"])}
                       for doc_id, links_in in targets.items()}
        all_keys = sorted({key for keys in keys_by_doc.values() for key in keys})
        for term in self.graph.terms(all_keys, doc_ids).to_pylist():
            link = keys_by_doc.get(term["doc_id"], {}).get(term["target"])
            if link is not None and term["chunk_id"] not in named:
                named[term["chunk_id"]] = (link, term)
        found: dict[str, tuple[Hit, str, str]] = {}  # chunk id -> (hit, the chunk it was reached from, the step)

        def link_step(link: dict, how: str) -> str:
            anchor = f"#{link['anchor']}" if link["anchor"] else ""
            return f"links to {link['target']}{anchor} '{link['label']}', {how}"

        for chunk_id, hit in self._fetch(vector, where, list(named)).items():
            link = named[chunk_id][0]
            found[chunk_id] = (hit, link["chunk_id"], link_step(link, "which names"))
        # the relations the LLM found in the seeds: the chunks naming each relation's target entity
        relations = self.graph.edges_from(list(by_chunk), kind="relation").to_pylist()
        relations.sort(key=lambda e: (rank[e["chunk_id"]], e["edge_id"]))
        by_entity: dict[str, dict] = {}
        for relation in relations:
            by_entity.setdefault(relation["target"], relation)
        naming = self.graph.terms(list(by_entity), kinds=("entity",)).to_pylist()
        naming_ids = list(dict.fromkeys(e["chunk_id"] for e in naming if e["chunk_id"] not in by_chunk))
        naming_ids = naming_ids[:self.settings.max_targets * self.settings.per_target]
        entity_of = {e["chunk_id"]: e["target"] for e in naming}
        for chunk_id, hit in self._fetch(vector, where, naming_ids).items():
            relation = by_entity[entity_of[chunk_id]]
            found.setdefault(chunk_id, (hit, relation["chunk_id"], f"states '{relation['label']}', whose target "
                                                                   "is named in"))
        # and the chunks of each linked document closest to the query
        per_doc: dict[str, int] = {}
        for start in range(0, len(doc_ids), IN_LIST_MAX):
            part = tuple(doc_ids[start:start + IN_LIST_MAX])
            depth = self.settings.per_target * len(part) * 4
            for hit in self.store.search_vector(vector, depth, _where(where, doc_ids=part), exact=True):
                if per_doc.get(hit.doc_id, 0) < self.settings.per_target:
                    per_doc[hit.doc_id] = per_doc.get(hit.doc_id, 0) + 1
                    link = targets[hit.doc_id][0]
                    found.setdefault(hit.chunk_id, (hit, link["chunk_id"], link_step(link, "close to the query there")))
        reached = []
        for chunk_id, (hit, source_id, step) in found.items():
            if chunk_id in seen:
                continue
            path = by_chunk[source_id].extra["path"] + [f"{step}: {_place(hit)}"]
            reached.append(replace(hit, extra={"path": path}))
        return reached
