"""`kbflow mcp`: namespaces of a knowledge base as Model Context Protocol tools, for agents.

The tools are the operations of ``kbflow.kb.KnowledgeBase`` (search, ask, add_text, add_document, stats) plus
list_namespaces; writes run the same engine as the CLI (incremental, one writer per namespace, a run record).
The SDK runs each call in a worker thread, so a search is answered while an ingest runs; two writes to one
namespace from this server queue on a lock here instead of failing on the namespace lock. A failure an agent
can act on (an unknown namespace, a missing file, no chat model configured) comes back as a tool error with the
message the CLI would print; arguments are checked against the tools' input schemas by the SDK.
"""

from __future__ import annotations

import base64
import binascii
import logging
import threading
from pathlib import Path
from typing import Annotated, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from kbflow import api
from kbflow.config import KbConfig, check_namespace
from kbflow.errors import KbflowError
from kbflow.kb import KnowledgeBase
from kbflow.storage import location, write_bytes_atomic

INSTRUCTIONS = (
    "A searchable knowledge base built from documents (PDF, Office, HTML, Markdown, code, images, audio; English "
    "and Chinese), split into namespaces. Use `search` to find passages (each with its source file and section) "
    "before answering from them; `ask` returns an answer with numbered citations when the server has a chat "
    "model. `list_namespaces` says what exists."
)
Mode = Literal["hybrid", "vector", "bm25", "rerank", "graph"]
NamespaceArg = Annotated[str | None, Field(
    description="The namespace to use (see list_namespaces). Empty: the server's default namespace.")]
INBOX = "mcp-inbox"  # under the data dir: files sent inline by add_document, one folder per namespace


class Tools:
    """The tool functions, over one config; ``namespaces`` limits which namespaces may be used (empty: any)."""

    def __init__(self, config: KbConfig, namespaces: list[str], read_only: bool):
        self.config = config
        self.allowed = [check_namespace(name) for name in namespaces]
        self.default = self.allowed[0] if self.allowed else check_namespace(config.namespace)
        self.read_only = read_only
        self._kbs: dict[str, KnowledgeBase] = {}
        self._writes: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _name(self, namespace: str | None) -> str:
        try:
            name = check_namespace(namespace or self.default)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        if self.allowed and name not in self.allowed:
            raise ToolError(f"namespace {name!r} is not served here; served: {', '.join(self.allowed)}")
        return name

    def _kb(self, namespace: str | None, existing: bool = True) -> KnowledgeBase:
        name = self._name(namespace)
        if existing:
            try:
                api.require_namespace(name, self.config)
            except KbflowError as exc:
                raise ToolError(str(exc)) from None
        with self._guard:
            if name not in self._kbs:
                self._kbs[name] = KnowledgeBase(name, self.config)
                self._writes[name] = threading.Lock()
            return self._kbs[name]

    def _write(self, namespace: str | None, operation) -> dict:
        if self.read_only:
            raise ToolError("this server is read-only (kbflow mcp --read-only): writes are refused")
        kb = self._kb(namespace, existing=False)
        with self._writes[kb.namespace]:
            try:
                summary = operation(kb)
            except KbflowError as exc:
                raise ToolError(str(exc)) from None
        return {key: summary.get(key) for key in ("namespace", "run_id", "documents", "chunks", "failures")}

    def search(self, query: Annotated[str, Field(min_length=1, description="What to look for, in words (a "
                                                  "question or keywords), in any language the documents use.")],
               namespace: NamespaceArg = None,
               limit: Annotated[int, Field(ge=1, le=50, description="How many passages to return.")] = 5,
               mode: Annotated[Mode | None, Field(
                   description="hybrid (default: meaning and exact words), vector (meaning), bm25 (exact words, "
                   "names, error codes), rerank (hybrid, reordered by the configured reranker), graph (hybrid, with the "
                   "passages its best hits link to inserted after its first hits, graph.insert_after; each says "
                   "why: 'path'; needs graph.enabled).")] = None,
               source_glob: Annotated[str | None, Field(
                   description="Only files whose path matches this glob, e.g. 'manual/*.html'.")] = None,
               heading_prefix: Annotated[list[str] | None, Field(
                   description="Only sections under this heading path, e.g. ['Backup', 'Restore'].")] = None,
               doc_ids: Annotated[list[str] | None, Field(
                   description="Only these documents (doc_id values from earlier results).")] = None,
               ) -> list[dict]:
        """Find the passages of a namespace that best match a query. Each result has the source file path, the
        heading path of its section, a score (higher is better; its scale depends on the mode) and the text."""
        kb = self._kb(namespace)
        try:
            hits = kb.search(query, limit=limit, mode=mode, source_glob=source_glob, heading_prefix=heading_prefix,
                             doc_ids=doc_ids)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        return [hit.to_dict() for hit in hits]

    def ask(self, question: Annotated[str, Field(min_length=1, description="The question to answer.")],
            namespace: NamespaceArg = None,
            mode: Annotated[Mode | None, Field(description="Retrieval mode, as in search.")] = None,
            source_glob: Annotated[str | None, Field(description="Only files matching this glob.")] = None,
            agentic: Annotated[bool, Field(description="Let the question choose its retrieval (one search, parallel "
                                                       "searches for a comparison, several hops, a rewritten query); "
                                                       "the rounds come back as 'trace'.")] = False) -> dict:
        """Answer a question from the namespace's passages with the server's chat model: the answer cites its
        sources as [1], [2] and lists them (path, heading). An error when the server has no chat model: then use
        search and answer from the passages yourself."""
        kb = self._kb(namespace)
        try:
            return kb.ask(question, mode=mode, source_glob=source_glob, agentic=agentic)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None

    def add_text(self, text: Annotated[str, Field(min_length=1, description="The text (Markdown is fine).")],
                 doc_id: Annotated[str, Field(min_length=1, description="Your id for this document; adding "
                                              "another text with the same id replaces it.")],
                 namespace: NamespaceArg = None) -> dict:
        """Add a text to the knowledge base as a document (created with the namespace if new). Returns the run
        summary: documents new/changed/unchanged, chunks embedded, failures."""
        return self._write(namespace, lambda kb: kb.add_text(text, doc_id))

    def add_document(self, path: Annotated[str | None, Field(
                         description="A file or folder on the server's machine to add.")] = None,
                     filename: Annotated[str | None, Field(
                         description="For content sent inline: the file name, whose extension picks the "
                         "converter (report.pdf, notes.md, page.html); the same name replaces it.")] = None,
                     content: Annotated[str | None, Field(description="Inline text content (with filename).")] = None,
                     content_base64: Annotated[str | None, Field(
                         description="Inline binary content, base64 (with filename), e.g. a PDF.")] = None,
                     namespace: NamespaceArg = None) -> dict:
        """Add or update a document: a path on the server's machine, or content sent inline with a file name.
        Only new or changed files are converted and embedded; the namespace's other documents stay."""
        if (path is None) == (content is None and content_base64 is None) or (content is not None
                                                                            and content_base64 is not None):
            raise ToolError("pass either path, or filename with content or content_base64")
        if path is not None:
            return self._write(namespace, lambda kb: kb.add_document(path))
        name = (filename or "").strip()
        if not name or Path(name).name != name or name.startswith("."):
            raise ToolError(f"filename {filename!r} must be a plain file name with an extension, e.g. notes.md")
        try:
            data = content.encode("utf-8") if content is not None else base64.b64decode(content_base64,
                                                                                         validate=True)
        except binascii.Error as exc:
            raise ToolError(f"content_base64 is not valid base64 ({exc})") from None

        def add(kb: KnowledgeBase) -> dict:
            target = location(self.config.data_dir) / INBOX / kb.namespace / name  # a folder, or the KB's bucket
            write_bytes_atomic(target, data)
            return kb.add_document(str(target))

        return self._write(namespace, add)

    def stats(self, namespace: NamespaceArg = None) -> dict:
        """Documents, chunks, embedding model, store size and last run of a namespace."""
        kb = self._kb(namespace)
        return kb.stats()

    def list_namespaces(self) -> list[dict]:
        """The namespaces this server can use, with their documents, chunks, model and last run."""
        found = api.namespaces(self.config)
        return [row for row in found if not self.allowed or row["namespace"] in self.allowed]


def build_server(config: KbConfig, namespaces: list[str] | None = None, read_only: bool = False) -> MCPServer:
    tools = Tools(config, namespaces or [], read_only)
    server = MCPServer("kbflow", instructions=INSTRUCTIONS, log_level="WARNING")
    reading = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    writing = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
    for fn, hints in ((tools.search, reading), (tools.ask, reading), (tools.stats, reading),
                      (tools.list_namespaces, reading), (tools.add_text, writing), (tools.add_document, writing)):
        if hints is writing and read_only:
            continue
        server.tool(annotations=hints)(fn)
    return server


def serve(config: KbConfig, namespaces: list[str] | None, read_only: bool, http: str | None) -> None:
    """Run until stdin closes (stdio) or the process is stopped (``http`` = 'HOST:PORT', streamable HTTP at /mcp)."""
    logging.getLogger("mcp").setLevel(logging.WARNING)
    server = build_server(config, namespaces, read_only)
    if http is None:
        server.run("stdio")
        return
    host, _, port = http.rpartition(":")
    server.run("streamable-http", host=host or "127.0.0.1", port=int(port))
