"""Documents sent inline (MCP ``add_document`` with ``filename`` and content) and pages an MCP client asked the
server to fetch.

Identity: ``upload:<file name>`` for inline content, a space of its own, so an upload named ``tea.md`` never
replaces the file ``tea.md``; a fetched page is named like any web page (host and path). Confinement: a name is
one plain file name (no folder, no control characters, at most 255 bytes), the content at most the inline limit,
and the secret scan reads it before it is written anywhere (``check_upload``): refused content never reaches the
disk. The bytes are kept in the data dir's inbox (``<data dir>/mcp-inbox/<namespace>/``), which conversion reads.
"""

from __future__ import annotations

import hashlib
import mimetypes
import time

from kbflow.config import ConvertConfig
from kbflow.convert.objects import read_bytes
from kbflow.convert.scan import SourceFile, doc_id_for
from kbflow.core.errors import ConfigError
from kbflow.sources.base import SourceKind, claims_nothing, not_a_source, register
from kbflow.core.trust import MAX_NAME_BYTES

INBOX = "mcp-inbox"  # under the data dir: one folder per namespace


UPLOAD = register(SourceKind(
    name="upload", origin="upload", prefix="upload:", claims=claims_nothing, normalise=str, confine=not_a_source,
    identity="`upload:<file name>`; the same name replaces it",
    confinement="one plain file name (no folder or control characters, at most 255 bytes), at most the inline "
                "limit, scanned for credentials before anything is written",
    fetch="the request's own bytes, kept in the data dir's inbox once the scan passed",
    change="SHA-256 of the bytes"))


def check_name(name: str | None) -> str:
    """An upload's file name, or a ConfigError naming what is wrong with it."""
    text = (name or "").strip()
    if not text or text in (".", "..") or text.startswith(".") or "/" in text or "\\" in text \
            or any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ConfigError(f"filename {(name or '')[:100]!r} must be a plain file name with an extension, e.g. "
                          "notes.md (no folder, no leading dot, no control characters)")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise ConfigError(f"filename {text[:60]!r}... is {len(text.encode('utf-8', 'surrogateescape'))} bytes long: "
                          f"a file name may have at most {MAX_NAME_BYTES} bytes")
    return text


def inbox_name(source_path: str, suffix: str) -> str:
    """The inbox file of an upload: its own name for inline content, a hash of the page's identity for a
    fetched page (a URL's last segment may be anything)."""
    if source_path.startswith(UPLOAD.prefix):
        return source_path[len(UPLOAD.prefix):]
    return hashlib.sha256(source_path.encode()).hexdigest()[:32] + suffix


def check_upload(data: bytes, name: str, source_path: str, options: ConvertConfig) -> None:
    """Refuse content whose name or text holds a credential, before it is written anywhere: the same scan a
    converted file gets (``kbflow.convert.secrets``), on the content converted in memory."""
    from kbflow.convert.converters import convert_bytes
    from kbflow.convert.secrets import check_name_secrets, check_secrets, scan_text

    if not options.secret_scan:
        return
    check_name_secrets(source_path, options.secret_scan_allow)
    converted = convert_bytes(data, name, source_path, options)
    check_secrets(scan_text(converted.markdown), source_path, options.secret_scan_allow)


def upload_sources(uploads: list[dict], namespace: str) -> list[SourceFile]:
    """Sources for uploads already in the inbox ({'source_path', 'path'}): hash of the bytes there."""
    sources = []
    for item in uploads:
        path, source_path = item["path"], item["source_path"]
        data = read_bytes(str(path))  # the inbox may be in a bucket (a data dir on object storage)
        sources.append(SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path,
                                  abs_path=str(path), source_sha256=hashlib.sha256(data).hexdigest(),
                                  size=len(data), mtime=time.time(),
                                  mime=mimetypes.guess_type(str(path))[0] or "application/octet-stream"))
    return sources
