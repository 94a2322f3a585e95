"""Texts added with a caller's id (``add_text``, the MCP tool, ``KnowledgeBase.add_text``).

Identity: ``text:<doc_id>``, a space of its own: a text never takes a file's identity. Nothing is read from
outside: the text is the request. Change: SHA-256 of its UTF-8 bytes."""

from __future__ import annotations

import hashlib
import time

from kbflow.convert.scan import SourceFile, doc_id_for
from kbflow.sources.base import SourceKind, claims_nothing, not_a_source, register


TEXT = register(SourceKind(
    name="text", origin="text", prefix="text:", claims=claims_nothing, normalise=str, confine=not_a_source,
    identity="`text:<doc_id>`, the id the caller chose", confinement="at most the inline limit over MCP",
    fetch="the request's own text", change="SHA-256 of the text"))


def text_sources(texts: list[dict], namespace: str) -> list[SourceFile]:
    """Literal texts ({'doc_id', 'text'}) as sources: path 'text:<doc_id>', hash of the text's bytes."""
    sources = []
    for item in texts:
        body = item["text"].encode("utf-8")
        source_path = TEXT.prefix + item["doc_id"]
        sources.append(SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path="",
                                  source_sha256=hashlib.sha256(body).hexdigest(), size=len(body),
                                  mtime=time.time(), mime="text/markdown"))
    return sources
