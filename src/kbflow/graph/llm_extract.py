"""Entities and relations extracted by the configured chat model (``graph.llm_extract``), the graph stage's
second half: one chat call per chunk text never seen before by this extractor.

The reply must be the JSON asked for (``{"entities": [{"name", "type"}], "relations": [{"source", "relation",
"target"}]}``). Each chunk's parsed reply is cached in a LanceDB table keyed by (chunk text sha256, extractor
fingerprint: the model and this prompt's version), beside the vector cache, so an unchanged chunk is never sent
again, in any document, run or namespace. A reply that is not that JSON, or a call that fails after its retries, is
a failure of that chunk: its document keeps its stored version and the next run retries it (nothing half-extracted
is stored, nothing is cached).

Edges (``kbflow.graph.extract`` rows): ``entity`` (the chunk names an entity: ``target`` its key, ``label``
"name (type)") and ``relation`` (the chunk states one: ``anchor`` the source entity's key, ``target`` the target
entity's key, ``label`` "source —relation→ target").
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import TYPE_CHECKING
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from kbflow.core import storage
from kbflow.core.errors import KbflowError, PermanentError
from kbflow.graph.terms import term_key
from kbflow.search.llm import parse_reply
from kbflow.stores.lancedb_store import open_table_or_none, select_in

if TYPE_CHECKING:
    from lancedb.table import Table

PROMPT_VERSION = "1"
MAX_ITEMS = 12  # entities and relations kept per chunk
SYSTEM = (
    "You extract a knowledge graph from a passage of documentation. Reply with one JSON object and nothing else:\n"
    '{"entities": [{"name": "...", "type": "..."}], "relations": [{"source": "...", "relation": "...", '
    '"target": "..."}]}\n'
    "Entities: the settings, commands, functions, components, concepts and products the passage is about (at most "
    f"{MAX_ITEMS}), named as the passage names them. Relations: what the passage states between two of those "
    "entities (controls, requires, replaces, is part of, is set by, ...), at most "
    f"{MAX_ITEMS}. No entity or relation the passage does not state."
)
CACHE_SCHEMA = pa.schema([("text_sha256", pa.string()), ("extractor", pa.string()), ("facts", pa.string())])
_create_lock = threading.Lock()


def extractor_name(llm) -> str:
    model = llm.model_path if llm.kind == "local" else llm.model
    return f"llm:{llm.kind}:{model}@{PROMPT_VERSION}"


def facts_of(reply: str) -> dict:
    """The entities and relations of a reply, cleaned; PermanentError naming what is wrong when it is not them."""
    parsed = parse_reply(reply)
    if parsed is None or not isinstance(parsed.get("entities", []), list) or not isinstance(
            parsed.get("relations", []), list):
        raise PermanentError(f"the chat model's extraction reply is not the JSON object asked for: {reply[:200]!r}")
    entities = [{"name": str(e["name"]).strip()[:80], "type": str(e.get("type", "")).strip()[:40]}
                for e in parsed.get("entities", []) if isinstance(e, dict) and str(e.get("name", "")).strip()]
    parts = ("source", "relation", "target")
    relations = [{key: str(r[key]).strip()[:80] for key in parts} for r in parsed.get("relations", [])
                 if isinstance(r, dict) and all(str(r.get(key, "")).strip() for key in parts)]
    return {"entities": entities[:MAX_ITEMS], "relations": relations[:MAX_ITEMS]}


FACT_TABLE_RE = re.compile(r"graph_facts_[0-9a-f]{16}")  # one table per extractor (not a namespace's graph_<ns>)


class FactCache:
    """Parsed extraction replies by (text sha256, extractor)."""

    def __init__(self, uri: str, extractor: str):
        self.extractor = extractor
        self.table_name = "graph_facts_" + hashlib.sha256(extractor.encode()).hexdigest()[:16]
        self._db = storage.lance_connect(uri)
        self._table: Table | None = None

    def _exists(self) -> bool:
        if self._table is None:
            self._table = open_table_or_none(self._db, self.table_name)
        return self._table is not None

    def lookup(self, keys: list[str]) -> dict[str, dict]:
        found: dict[str, dict] = {}
        unique = sorted(set(keys))
        if not unique or not self._exists():
            return found
        rows = select_in(self._table, "text_sha256", unique, ["text_sha256", "facts"])
        for key, facts in zip(rows.column("text_sha256").to_pylist(), rows.column("facts").to_pylist()):
            found.setdefault(key, json.loads(facts))
        return found

    def add(self, facts: dict[str, dict]) -> None:
        if not facts:
            return
        table = pa.table({"text_sha256": list(facts), "extractor": [self.extractor] * len(facts),
                          "facts": [json.dumps(f, ensure_ascii=False) for f in facts.values()]}, schema=CACHE_SCHEMA)
        with _create_lock:
            if not self._exists():
                self._table = self._db.create_table(self.table_name, schema=CACHE_SCHEMA, exist_ok=True)
        if self._table is None:
            raise RuntimeError(f"the fact cache table {self.table_name} was neither opened nor created")
        self._table.add(table)


class LlmExtractor:
    """One chat call per new chunk text (``workers`` in flight at once); the facts of every chunk of a batch, from
    the cache where it has them."""

    def __init__(self, chat, cache: FactCache, max_tokens: int, workers: int = 1):
        self.chat = chat
        self.cache = cache
        self.max_tokens = max_tokens
        self.workers = workers

    def facts(self, chunks: pa.Table) -> tuple[dict[str, dict], dict[str, KbflowError], int]:
        """(facts by text sha256, the error of each text that failed, chat calls made)."""
        texts = dict(zip(chunks.column("text_sha256").to_pylist(), chunks.column("text").to_pylist()))
        known = self.cache.lookup(list(texts))
        todo = [(key, text) for key, text in texts.items() if key not in known]

        def one(item: tuple[str, str]) -> tuple[str, dict | None, KbflowError | None]:
            key, text = item
            try:
                reply = self.chat.complete([{"role": "system", "content": SYSTEM},
                                            {"role": "user", "content": f"Passage:\n{text}"}],
                                           temperature=0.0, max_tokens=self.max_tokens,
                                           limit_name="graph.llm_max_tokens")
                return key, facts_of(reply), None
            except KbflowError as exc:
                return key, None, exc

        if self.workers > 1 and len(todo) > 1:
            with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="kbflow-extract") as pool:
                results = list(pool.map(one, todo))
        else:
            results = [one(item) for item in todo]
        fresh = {key: facts for key, facts, _ in results if facts is not None}
        failed = {key: error for key, _, error in results if error is not None}
        self.cache.add(fresh)
        return {**known, **fresh}, failed, len(fresh) + len(failed)


def fact_edges(chunk_id: str, doc_id: str, source_path: str, facts: dict, edge) -> list[dict]:
    """The ``entity`` and ``relation`` edges of one chunk's facts (``edge``: kbflow.graph.extract's row maker)."""
    rows = []
    for entity in facts["entities"]:
        key = term_key(entity["name"])
        if key:
            label = f"{entity['name']} ({entity['type']})" if entity["type"] else entity["name"]
            rows.append(edge(chunk_id, doc_id, source_path, "entity", key, "", label[:200]))
    for relation in facts["relations"]:
        source, target = term_key(relation["source"]), term_key(relation["target"])
        if source and target:
            label = f"{relation['source']} —{relation['relation']}→ {relation['target']}"
            rows.append(edge(chunk_id, doc_id, source_path, "relation", target, source, label[:200]))
    return rows
