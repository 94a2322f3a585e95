"""The graph stage: edges out of each chunk of a batch, read from the structure the documents already carry.

Three kinds of edge, each from one chunk:
* ``link``: a Markdown link in the chunk's text to another document of the collection (or to a section of its
  own): ``target`` is the linked document's source path, resolved against the chunk's own path exactly as a
  browser would resolve the href, ``anchor`` the fragment, ``label`` the link's text and title. Links to other
  sites (a scheme), to site-absolute paths and above the collection's root are not edges.
* ``defines``: a term the chunk defines: a definition-list entry ("Term" then ":   its definition", which is how
  HTML ``<dt>/<dd>`` and glossaries arrive), e.g. a configuration parameter ``work_mem``.
* ``heading``: the title of the section the chunk starts (its first chunk under that heading path).

``target`` of ``defines`` and ``heading`` is the term normalised by ``term_key`` (what a query's words are matched
against). Pure and cheap (regular expressions over text the chunker already holds); the edges of a chunk depend
on its text, heading path and document path only, so an unchanged document is never read again (the plan skips
it) and a changed one costs microseconds per chunk.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from functools import partial
from urllib.parse import unquote

import pyarrow as pa

from kbflow.graph.llm_extract import fact_edges
from kbflow.graph.terms import term_key
from kbflow.core.schemas import EDGES

GRAPH_VERSION = "2"  # 2: dotted names as words (os.path.join), signature keywords dropped
STRUCTURE = f"structure@{GRAPH_VERSION}"

# [text](href "title"): the innermost brackets (a glossary's [*[datum](…)*](…) yields the inner link)
LINK_RE = re.compile(r'\[([^\[\]]*)\]\(\s*<?([^()\s<>]+)>?(?:\s+"([^"]*)")?\s*\)')
SCHEME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
DEFINITION_RE = re.compile(r"(?m)^(?!\s)(?P<term>[^\n:][^\n]{0,150})\n:[ \t]+\S")
CODE_RE = re.compile(r"`([^`]+)`")
SECTION_NUMBER_RE = re.compile(r"^(?:[A-Z]|\d+)(?:\.\d+)*\.\s+")  # "12.3. ", "E.5.1. " (the chunker's own rule)
MARKUP_RE = re.compile(r"[*`\[\]]|\([^)]*\)$")  # emphasis, code, brackets; a trailing "(process)"
MAX_TERM_CHARS = 80
# what an API reference writes, emphasised, before a defined name (Sphinx: "*class* io.StringIO(...)",
# "*exception* OSError"); a glossary's "class variable" or "coroutine function" is not emphasised and stays whole
SIGNATURE_WORDS_RE = re.compile(r"^(?:\*(?:abstract|async|await|class|classmethod|coroutine|exception|final|property|"
                                r"staticmethod)\*\s+)+")
ESCAPE_RE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|~<>])")  # Markdown's backslash escapes (effective\_cache\_size)


def unescape_markdown(text: str) -> str:
    return ESCAPE_RE.sub(r"\1", text)


def extractor_fingerprint(enabled: bool, llm_extractor: str | None = None) -> str:
    """What the manifest records for the graph: '' when the stage is off (documents are re-processed once when it
    is turned on or off, or the LLM extractor changes, from their cached conversions and vectors)."""
    if not enabled:
        return ""
    return f"{STRUCTURE}+{llm_extractor}" if llm_extractor else STRUCTURE


def defined_term(line: str) -> str | None:
    """The term of a definition-list entry: its first code span when it starts with one ("`work_mem`
    (`integer`)"), else its text without markup and a trailing parenthesis ("Autovacuum (process)")."""
    line = line.strip()
    code = CODE_RE.match(line)
    term = code.group(1) if code else LINK_RE.sub(lambda m: m.group(1), line)
    term = MARKUP_RE.sub("", SIGNATURE_WORDS_RE.sub("", unescape_markdown(term))).strip().rstrip(":").strip()
    return term if 2 <= len(term) <= MAX_TERM_CHARS else None


def resolve_link(href: str, source_path: str) -> tuple[str, str] | None:
    """(target source path, anchor) of an href in the document at ``source_path``; None when it leaves the
    collection (another site, a site-absolute path, above the collection's root)."""
    if SCHEME_RE.match(href) or href.startswith(("/", "\\")):
        return None
    path, _, anchor = href.partition("#")
    path = unquote(path.split("?", 1)[0])
    if not path:
        return source_path, unquote(anchor)
    target = posixpath.normpath(posixpath.join(posixpath.dirname(source_path), path))
    if target.startswith("../") or target == "..":
        return None
    return target, unquote(anchor)


def _edge(chunk_id: str, doc_id: str, source_path: str, kind: str, target: str, anchor: str, label: str,
          extractor: str = STRUCTURE) -> dict:
    edge_id = hashlib.sha256(f"{chunk_id}\0{kind}\0{target}\0{anchor}".encode()).hexdigest()[:32]
    return {"edge_id": edge_id, "doc_id": doc_id, "chunk_id": chunk_id, "source_path": source_path, "kind": kind,
            "target": target, "anchor": anchor, "label": label, "extractor": extractor}


def chunk_edges(chunk_id: str, doc_id: str, source_path: str, text: str, heading: str | None) -> list[dict]:
    """The edges out of one chunk (``heading``: the title of the section it starts, if it starts one)."""
    edges: dict[str, dict] = {}

    def add(edge: dict) -> None:
        edges.setdefault(edge["edge_id"], edge)

    for match in LINK_RE.finditer(text):
        resolved = resolve_link(match.group(2), source_path)
        if resolved is None:
            continue
        text_part = unescape_markdown(match.group(1)).strip(" *_`")
        label = " | ".join(part for part in (text_part, (match.group(3) or "").strip()) if part)
        add(_edge(chunk_id, doc_id, source_path, "link", resolved[0], resolved[1], label[:200]))
    for match in DEFINITION_RE.finditer(text):
        term = defined_term(match.group("term"))
        if term:
            add(_edge(chunk_id, doc_id, source_path, "defines", term_key(term), "", term))
    if heading:
        title = SECTION_NUMBER_RE.sub("", heading.lstrip("# ").strip())
        if 2 <= len(title) <= MAX_TERM_CHARS:
            add(_edge(chunk_id, doc_id, source_path, "heading", term_key(title), "", title))
    return list(edges.values())


def extract_edges(chunks: pa.Table, source_paths: dict[str, str], facts: dict[str, dict] | None = None,
                  llm_extractor: str = "") -> pa.Table:
    """The graph stage over one batch: every edge out of its chunks (``source_paths``: doc id -> source path); with
    ``facts`` (text sha256 -> the LLM's entities and relations, ``kbflow.graph.llm_extract``) their edges too."""
    rows: list[dict] = []
    seen_headings: set[tuple[str, tuple[str, ...]]] = set()
    columns = [chunks.column(name).to_pylist() for name in ("chunk_id", "doc_id", "heading_path", "text",
                                                            "text_sha256")]
    for chunk_id, doc_id, heading_path, text, text_sha256 in zip(*columns):
        path = tuple(heading_path or ())
        starts = bool(path) and (doc_id, path) not in seen_headings
        seen_headings.add((doc_id, path))
        rows += chunk_edges(chunk_id, doc_id, source_paths[doc_id], text, path[-1] if starts else None)
        if facts and text_sha256 in facts:
            rows += fact_edges(chunk_id, doc_id, source_paths[doc_id], facts[text_sha256],
                               partial(_edge, extractor=llm_extractor))
    unique = {row["edge_id"]: row for row in rows}  # an entity named twice in a chunk is one edge
    return pa.Table.from_pylist(list(unique.values()), schema=EDGES)
