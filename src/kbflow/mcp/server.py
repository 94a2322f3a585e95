"""`kbflow mcp`: namespaces of a knowledge base as Model Context Protocol tools, for agents.

The tools are the operations of ``kbflow.kb.KnowledgeBase`` (search, ask, add_text, add_document, stats) plus
list_namespaces; writes run the same engine as the CLI (incremental, one writer per namespace, a run record).
The SDK runs each call in a worker thread, so a search is answered while an ingest runs; two writes to one
namespace from this server queue on a lock here instead of failing on the namespace lock. A failure an agent
can act on (an unknown namespace, a missing file, no chat model configured) comes back as a tool error with the
message the CLI would print; arguments are checked against the tools' input schemas by the SDK.

A client is someone else: every path or URL it sends goes through the trust boundary (``kbflow.core.trust``: paths
only under ``--root``, URLs only under ``--allow-source``, never private hosts unless named), inline content has a
size limit, and over HTTP each request's token limits its namespaces and writes (``kbflow.mcp.http``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import sys
import time
import threading
from typing import Annotated, Literal

from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ToolError, UnexpectedToolError
from mcp.server.mcpserver.tools.base import Tool
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

from kbflow import __version__, api
from kbflow.config import KbConfig, check_namespace
from kbflow.core.errors import ConfigError, KbflowError
from kbflow.kb import KnowledgeBase
from kbflow.runtime.failpoints import failpoint
from kbflow.convert.web import suffix_for
from kbflow.mcp.results import Answer, NamespaceStats, SearchResults, WriteResult, write_result
from kbflow.mcp.http import FULL, GRANT_KEY, NO_AUTH_FLAG, TOKEN_ENV, Gate, Grant, TokenTable, allowed_hosts, is_loopback
from kbflow.sources import confine, kind_of
from kbflow.sources.upload import check_name
from kbflow.core.trust import SourcePolicy, fetch

INSTRUCTIONS = (
    "A searchable knowledge base built from documents (PDF, Office, HTML, Markdown, code, images, audio; English "
    "and Chinese), split into namespaces. Use `search` to find passages (each with its source file and section) "
    "before answering from them; `ask` returns an answer with numbered citations when the server has a chat "
    "model. `list_namespaces` says what exists."
)
Mode = Literal["hybrid", "vector", "bm25", "rerank", "graph"]
NamespaceArg = Annotated[str | None, Field(
    description="The namespace to use (see list_namespaces). Empty: the server's default namespace.")]


DOCUMENT_URI = "kbflow://{namespace}/{doc_id}"
MAX_DOC_IDS = 1000  # a search's doc_ids filter: more is refused with this limit named


class Tools:
    """The tool functions, over one config; ``namespaces`` limits which namespaces may be used (empty: any),
    ``policy`` what paths and URLs a client may make the server read, ``inline_bytes`` the largest inline
    document."""

    def __init__(self, config: KbConfig, namespaces: list[str], read_only: bool, policy: SourcePolicy,
                 inline_bytes: int):
        self.config = config
        self.allowed = [check_namespace(name) for name in namespaces]
        self.default = self.allowed[0] if self.allowed else check_namespace(config.namespace)
        self.read_only = read_only
        self.policy = policy
        self.inline_bytes = inline_bytes
        self._kbs: dict[str, KnowledgeBase] = {}
        self._writes: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def _name(self, namespace: str | None, grant: Grant) -> str:
        default = self.default if grant.allows(self.default) else grant.namespaces[0]
        try:
            name = check_namespace(namespace or default)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        if self.allowed and name not in self.allowed:
            raise ToolError(f"namespace {name!r} is not served here; served: {', '.join(self.allowed)}")
        if not grant.allows(name):
            raise ToolError(f"namespace {name!r} is outside this token's namespaces ({', '.join(grant.namespaces)})")
        return name

    def _kb(self, namespace: str | None, grant: Grant, existing: bool = True) -> KnowledgeBase:
        name = self._name(namespace, grant)
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

    def warm_up(self) -> None:
        _warm_up(self)

    def _check_writable(self, grant: Grant) -> None:
        if self.read_only:
            raise ToolError("this server is read-only (kbflow mcp --read-only): writes are refused")
        if not grant.write:
            raise ToolError("this token is read-only: writes are refused (ask the server's operator for a "
                            "read-write token)")

    def _write(self, namespace: str | None, grant: Grant, operation) -> WriteResult:
        self._check_writable(grant)
        kb = self._kb(namespace, grant, existing=False)
        with self._writes[kb.namespace]:
            try:
                summary = operation(kb)
            except KbflowError as exc:
                raise ToolError(str(exc)) from None
        return write_result(summary)

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
                   max_length=MAX_DOC_IDS,
                   description="Only these documents (doc_id values from earlier results).")] = None,
               ctx: Context | None = None) -> Annotated[CallToolResult, SearchResults]:
        """Find the passages of a namespace that best match a query. Each result has the source file path, the
        heading path of its section, a score (higher is better; its scale depends on the mode) and the text."""
        kb = self._kb(namespace, grant_of(ctx))
        try:
            hits = kb.search(query, limit=limit, mode=mode, source_glob=source_glob, heading_prefix=heading_prefix,
                             doc_ids=doc_ids)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        passages = [hit.to_dict() for hit in hits]
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(passage, ensure_ascii=False))
                                       for passage in passages],
                              structured_content={"hits": passages})

    def ask(self, question: Annotated[str, Field(min_length=1, description="The question to answer.")],
            namespace: NamespaceArg = None,
            mode: Annotated[Mode | None, Field(description="Retrieval mode, as in search.")] = None,
            source_glob: Annotated[str | None, Field(description="Only files matching this glob.")] = None,
            agentic: Annotated[bool, Field(description="Let the question choose its retrieval (one search, parallel "
                                                       "searches for a comparison, several hops, a rewritten query); "
                                                       "the rounds come back as 'trace'.")] = False,
            ctx: Context | None = None) -> Answer:
        """Answer a question from the namespace's passages with the server's chat model: the answer cites its
        sources as [1], [2] and lists them (number, document, path, heading, chunk, score). An error when the
        server has no chat model: then use search and answer from the passages yourself."""
        kb = self._kb(namespace, grant_of(ctx))
        try:
            return Answer.model_validate(kb.ask(question, mode=mode, source_glob=source_glob, agentic=agentic))
        except KbflowError as exc:
            raise ToolError(str(exc)) from None

    def add_text(self, text: Annotated[str, Field(min_length=1, description="The text (Markdown is fine).")],
                 doc_id: Annotated[str, Field(min_length=1, description="Your id for this document; adding "
                                              "another text with the same id replaces it.")],
                 namespace: NamespaceArg = None, ctx: Context | None = None) -> WriteResult:
        """Add a text to the knowledge base as a document (created with the namespace if new). Returns the run
        summary: documents new/changed/unchanged, chunks embedded, failures."""
        if len(text.encode("utf-8")) > self.inline_bytes:
            raise ToolError(self._too_large(len(text.encode("utf-8"))))
        return self._write(namespace, grant_of(ctx), lambda kb: kb.add_text(text, doc_id))

    def add_document(self, path: Annotated[str | None, Field(
                         description="A file or folder on the server's machine to add (only under the folders the "
                         "server allows, its --root), or a URL under a source it allows (--allow-source).")] = None,
                     filename: Annotated[str | None, Field(
                         description="For content sent inline: the file name, whose extension picks the "
                         "converter (report.pdf, notes.md, page.html); the same name replaces it.")] = None,
                     content: Annotated[str | None, Field(description="Inline text content (with filename).")] = None,
                     content_base64: Annotated[str | None, Field(
                         description="Inline binary content, base64 (with filename), e.g. a PDF.")] = None,
                     namespace: NamespaceArg = None, ctx: Context | None = None) -> WriteResult:
        """Add or update a document: a path on the server's machine (under the folders it allows), a URL (under
        the sources it allows), or content sent inline with a file name (up to the server's inline limit). Only
        new or changed files are converted and embedded; the namespace's other documents stay. A file whose text
        looks like it holds credentials is not stored (a failure says which rule and line)."""
        grant = grant_of(ctx)
        if (path is None) == (content is None and content_base64 is None) or (content is not None
                                                                            and content_base64 is not None):
            raise ToolError("pass either path, or filename with content or content_base64")
        if path is not None:
            return self._add_source(path, namespace, grant)
        try:
            name = check_name(filename)
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        inline_base64 = ""
        if content is not None:
            size = len(content.encode("utf-8"))
        elif content_base64 is not None:
            inline_base64 = content_base64
            size = len(inline_base64) * 3 // 4
        else:  # ruled out above
            raise ToolError("pass either path, or filename with content or content_base64")
        if size > self.inline_bytes:
            raise ToolError(self._too_large(size))
        try:
            data = content.encode("utf-8") if content is not None else base64.b64decode(inline_base64,
                                                                                         validate=True)
        except binascii.Error as exc:
            raise ToolError(f"content_base64 is not valid base64 ({exc})") from None
        return self._write(namespace, grant, lambda kb: kb.add_upload(name, data))

    def _add_source(self, source: str, namespace: str | None, grant: Grant) -> WriteResult:
        """A client's path or URL, checked at the trust boundary before anything is read (``kbflow.sources``:
        the same rule for a path and a ``file://`` URL): an http(s) URL is fetched here (each redirect checked,
        size-limited) and added under the page's identity; a path is added with its walk confined to the roots."""
        self._check_writable(grant)  # refused before anything is read
        self._name(namespace, grant)
        try:
            kind = kind_of(source)
            checked = confine(source, self.policy)
            if kind.name == "web":
                fetched = fetch(checked, self.policy, self.inline_bytes)
                name = "page" + suffix_for(fetched.url, fetched.content_type, ".txt")
                return self._write(namespace, grant, lambda kb: kb.add_upload(name, fetched.content,
                                                                              page_url=source))
        except KbflowError as exc:
            raise ToolError(str(exc)) from None
        roots = tuple(str(root) for root in self.policy.roots) if kind.name == "local" else ()
        return self._write(namespace, grant, lambda kb: kb.add_document(checked, roots=roots))

    def _too_large(self, size: int) -> str:
        return (f"inline content of {size / 1e6:.1f} MB is over this server's limit of {self.inline_bytes / 1e6:g} "
                "MB (mcp.max_inline_mb, default convert.max_file_mb); add the file by path under an allowed root "
                "instead")

    def stats(self, namespace: NamespaceArg = None, ctx: Context | None = None) -> NamespaceStats:
        """Documents, chunks, embedding model, store size and last run of a namespace."""
        kb = self._kb(namespace, grant_of(ctx))
        return NamespaceStats.model_validate(kb.stats())

    def document(self, namespace: str, doc_id: str, ctx: Context | None = None) -> str:
        """A document of a namespace as Markdown: its source path, then its passages in order under their
        headings (what search can return of it)."""
        try:
            found = self._kb(namespace or None, grant_of(ctx)).document(doc_id)
        except (KbflowError, ToolError) as exc:  # a resource's failure reaches the client as a resource error
            raise ResourceError(str(exc)) from None
        parts = [f"<!-- {found['source_path']} ({found['namespace']}/{found['doc_id']}) -->"]
        shown: list[str] = []
        for passage in found["passages"]:
            if passage["heading_path"] and passage["heading_path"] != shown:
                shown = passage["heading_path"]
                parts.append("#" * min(len(shown), 6) + " " + shown[-1])
            parts.append(passage["text"])
        return "\n\n".join(parts) + "\n"

    def list_namespaces(self, ctx: Context | None = None) -> list[NamespaceStats]:
        """The namespaces this server can use, with their documents, chunks, model and last run."""
        grant = grant_of(ctx)
        found = api.namespaces(self.config)
        return [NamespaceStats.model_validate(row) for row in found
                if (not self.allowed or row["namespace"] in self.allowed) and grant.allows(row["namespace"])]


def answer_with_citations(question: str, namespace: str = "") -> str:
    """The instructions an agent follows to answer ``question`` from the knowledge base with citations."""
    where = f" in namespace {namespace!r}" if namespace else ""
    return (f"Answer this question from the kbflow knowledge base{where}: {question}\n\n"
            f"1. Call the `search` tool{where} with the question (and again with other words if the first "
            "passages do not answer it; mode bm25 finds exact names, error codes and keys).\n"
            "2. Answer only from the passages returned. Number the passages you use [1], [2], ... and cite every "
            "claim with its passage's number.\n"
            "3. End with the sources: for each number, its source_path and heading_path.\n"
            "4. If the passages do not answer the question, say so instead of guessing.")


def _warm_up(tools: Tools) -> None:
    """Load what a search needs (the model's weights, the table, its full-text index) before the server answers
    anyone, so that ready means ready: ``initialize`` (stdio) or the port (HTTP) answers once a search is as fast
    as the rest. A namespace that does not exist yet loads the model a new one would get. Nothing here is an
    error an agent sees: its own call reports any problem."""
    try:
        kb = tools._kb(tools.default, FULL, existing=False)
        kb.searcher.embedder.embed_query("warm-up")  # the model's weights
        if kb.searcher.store is not None:
            kb.search("warm-up", limit=1)  # the table and its full-text index
    except Exception as exc:  # noqa: BLE001 - a warm-up must never stop the server
        logging.getLogger("kbflow").info("MCP warm-up skipped: %s", exc)
    failpoint("mcp.warm_up.done")


def grant_of(ctx: Context | None) -> Grant:
    """The caller's grant: its token's over HTTP (put in the request's scope by ``kbflow.mcp.http.Gate``), the
    server's own over stdio. An HTTP request without one is refused (fail closed)."""
    request = ctx.request_context.request if ctx is not None else None
    scope = getattr(request, "scope", None)
    if scope is None:
        return FULL
    grant = scope.get(GRANT_KEY)
    if grant is None:
        raise ToolError("this request carries no credentials check; refused")
    return grant


class KbflowTool(Tool):
    """A tool whose bad arguments come back in kbflow's words (the argument, what it must be, what was sent),
    not as the validator's text, and whose unexpected failure names its kind instead of a bare 'Error executing
    tool' (the traceback goes to the server's log)."""

    async def run(self, arguments, context, convert_result: bool = False):
        try:
            self.fn_metadata.validate_arguments(arguments)
        except ValidationError as exc:
            raise ToolError(argument_problem(self.name, exc)) from None
        try:
            return await super().run(arguments, context, convert_result=convert_result)
        except UnexpectedToolError as exc:
            cause = exc.__cause__
            logging.getLogger("kbflow").error("MCP tool %s failed", self.name, exc_info=cause)
            raise ToolError(f"{self.name} failed unexpectedly ({type(cause).__name__}); the server's log has the "
                            "details: please report it with that log") from None


def argument_problem(tool: str, exc: ValidationError) -> str:
    """One line per bad argument: its name, the rule it broke, what was sent (shortened)."""
    problems = []
    for error in exc.errors(include_url=False)[:5]:
        name = ".".join(str(part) for part in error["loc"]) or "arguments"
        rule = error["msg"].removeprefix("Input ").removeprefix("Value ").replace("should", "must", 1)
        sent = repr(error.get("input"))
        problems.append(f"argument {name!r} {rule} (sent: {sent[:60]}{'...' if len(sent) > 60 else ''})")
    more = f"; and {len(exc.errors()) - 5} more" if len(exc.errors()) > 5 else ""
    return f"{tool}: " + "; ".join(problems) + more + ". Fix the argument (the tool's input schema gives each limit)"


def inline_limit(config: KbConfig) -> int:
    """The largest inline document in bytes: mcp.max_inline_mb, else convert.max_file_mb."""
    return int((config.mcp.max_inline_mb or config.convert.max_file_mb) * 1e6)


def build_server(config: KbConfig, namespaces: list[str] | None = None, read_only: bool = False,
                 with_tools: bool = False):
    """The MCP server over ``config`` (and its ``Tools`` with ``with_tools``); its roots and allowed sources are
    ``config.mcp``'s (checked here: a root that does not exist stops the start)."""
    policy = SourcePolicy.create(config.mcp.roots, config.mcp.allow_sources)
    tools = Tools(config, namespaces or [], read_only, policy, inline_limit(config))
    server = MCPServer("kbflow", instructions=INSTRUCTIONS, log_level="WARNING", version=__version__)
    reading = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    writing = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
    for fn, hints in ((tools.search, reading), (tools.ask, reading), (tools.stats, reading),
                      (tools.list_namespaces, reading), (tools.add_text, writing), (tools.add_document, writing)):
        if hints is writing and read_only:
            continue
        server.tool(annotations=hints)(fn)
    server.resource(DOCUMENT_URI, name="document", mime_type="text/markdown",
                    description="A document of a namespace (doc_id from a search hit) as Markdown: its passages in "
                    "order under their headings. Only namespaces the caller may read.")(tools.document)
    server.prompt(name="answer_with_citations", description="Answer a question from this knowledge base: search "
                  "it, answer only from the passages found, cite each claim as [n].")(answer_with_citations)
    manager = server._tool_manager  # the SDK has no hook for a tool class: each registered tool becomes ours
    for name, tool in manager._tools.items():
        manager._tools[name] = KbflowTool.model_construct(**{key: getattr(tool, key) for key in Tool.model_fields})
    return (server, tools) if with_tools else server


def http_app(config: KbConfig, server: MCPServer, bind: str, tokens: TokenTable | None, no_auth: bool):
    """The streamable-HTTP app for ``bind`` behind the gate (``kbflow.mcp.http``); refuses a non-loopback bind
    without a token unless ``no_auth``, and a wildcard bind without the host names clients use."""
    if tokens is None and not is_loopback(bind) and not no_auth:
        raise ConfigError(f"refusing to serve {bind} without authentication: set {TOKEN_ENV} (or --token-file / "
                          f"--tokens), or pass {NO_AUTH_FLAG} if the network itself is trusted")
    if bind in ("0.0.0.0", "::", "") and not config.mcp.allowed_hosts:
        raise ConfigError(f"binding to {bind or 'every address'} accepts any Host header name: pass --allowed-host "
                          "NAME[:PORT] (repeatable) with the names clients use to reach this server")
    hosts, origins = allowed_hosts(bind, config.mcp.allowed_hosts)
    inline = inline_limit(config)
    body_limit = inline * 4 // 3 + 1_000_000  # base64 of the largest inline document, plus its JSON envelope
    app = server.streamable_http_app(
        host=bind, max_request_body_size=body_limit,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                                     allowed_origins=origins))
    return Gate(app, tokens, body_limit, inline / 1e6)


def serve(config: KbConfig, namespaces: list[str] | None, read_only: bool, http: str | None,
          tokens: TokenTable | None = None, no_auth: bool = False) -> None:
    """Run until stdin closes (stdio) or the process is stopped (``http`` = 'HOST:PORT', streamable HTTP at /mcp).
    Every refusal to start (a bad root, an unauthenticated public bind) is a ConfigError before anything runs."""
    logging.getLogger("mcp").setLevel(logging.WARNING)
    server, tools = build_server(config, namespaces, read_only, with_tools=True)
    started = time.perf_counter()
    tools.warm_up()
    # stderr is the log a client keeps of a stdio server; stdout is the protocol's
    print(f"kbflow mcp: ready, the model and table loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr,
          flush=True)
    if http is None:
        server.run("stdio")
        # stdin closed and every call has answered: leave now, without the interpreter's teardown, which aborts
        # ("terminate called without an active exception") or waits inside the model's native threads
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(0)
    host, _, port = http.rpartition(":")
    bind = (host or "127.0.0.1").strip("[]")
    app = http_app(config, server, bind, tokens, no_auth)
    import uvicorn

    uvicorn.run(app, host=bind, port=int(port), log_level="warning")
