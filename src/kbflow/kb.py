"""``KnowledgeBase``: one namespace as an object, for agent frameworks and scripts.

The same functions as the CLI: writes run the engine (``kbflow.api``: in this process, or as a Prefect flow run
when a server is configured), reads go through one ``Searcher`` opened on first use and reopened after every
write, so repeated searches load the model and open the store once.
"""

from __future__ import annotations

from pathlib import Path

from kbflow import api
from kbflow.config import KbConfig, check_namespace
from kbflow.core.errors import ConfigError
from kbflow.search.ask import ask as ask_question
from kbflow.search.searcher import Searcher
from kbflow.stores import Hit, SearchFilter


DOCUMENT_COLUMNS = ["chunk_id", "source_path", "ordinal", "heading_path", "text"]


class KnowledgeBase:
    def __init__(self, namespace: str | None = None, config: KbConfig | str | Path | None = None,
                 data_dir: str | Path | None = None):
        self.config = api.resolve_config(config, data_dir)
        self.namespace = check_namespace(namespace or self.config.namespace)
        self._searcher: Searcher | None = None

    @property
    def searcher(self) -> Searcher:
        if self._searcher is None:
            self._searcher = Searcher(self.config, self.namespace)
        return self._searcher

    def _written(self, summary: dict) -> dict:
        self._searcher = None  # the next read reopens the namespace (new table, indexes, model record)
        return summary

    def add_text(self, text: str, doc_id: str) -> dict:
        """Add (or replace, same ``doc_id``) a text as a document; returns the run summary."""
        return self._written(api.add_text(text, doc_id, self.namespace, self.config))

    def add_document(self, path: str | Path, roots: tuple[str, ...] = ()) -> dict:
        """Add (or update) a file or a folder's files, leaving the namespace's other documents as they are;
        returns the run summary. ``roots``: see ``kbflow.api.add_document``."""
        return self._written(api.add_document(path, self.namespace, self.config, roots=roots))

    def add_upload(self, name: str, data: bytes, page_url: str | None = None) -> dict:
        """Add (or replace, same name) a document sent inline as bytes; see ``kbflow.api.add_upload``."""
        return self._written(api.add_upload(name, data, self.namespace, self.config, page_url=page_url))

    def search(self, query: str, limit: int | None = None, mode: str | None = None, min_score: float | None = None,
               source_glob: str | None = None, heading_prefix: list[str] | None = None,
               doc_ids: list[str] | None = None, expand: str | None = None) -> list[Hit]:
        where = SearchFilter(source_glob, tuple(heading_prefix or ()), tuple(doc_ids or ()))
        return self.searcher.search(query, mode, limit, min_score, where, expand)

    def ask(self, question: str, mode: str | None = None, expand: str | None = None,
            source_glob: str | None = None, on_token=None, agentic: bool = False) -> dict:
        """An answer with numbered citations, from the configured chat model (see ``search.llm``); ``on_token``
        receives it as it is written; ``agentic``: the question chooses its retrieval rounds (``trace``)."""
        return ask_question(self.searcher, question, mode, SearchFilter(source_glob), expand, on_token=on_token,
                            agentic=agentic)

    def stats(self) -> dict:
        return api.stats(self.namespace, self.config)

    def document(self, doc_id: str) -> dict:
        """One document as a search can return it: its source path and its passages in order (heading path and
        text each; neighbours may share a sentence of overlap, and a long table's pieces each repeat its caption
        and header). Read from the store through a filter on ``doc_id``."""
        store = self.searcher.store
        rows: list[dict] = store.document_rows(doc_id, DOCUMENT_COLUMNS).to_pylist() if store is not None else []
        if not rows:
            raise ConfigError(f"document {doc_id!r} is not in namespace {self.namespace!r}; a search hit's doc_id "
                              "names one that is")
        rows.sort(key=lambda row: row["ordinal"])
        return {"namespace": self.namespace, "doc_id": doc_id, "source_path": rows[0]["source_path"],
                "passages": [{"chunk_id": row["chunk_id"], "heading_path": list(row["heading_path"] or []),
                              "text": row["text"]} for row in rows]}

    def clear(self) -> dict:
        return self._written(api.clear(self.namespace, self.config))
