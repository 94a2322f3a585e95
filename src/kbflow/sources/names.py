"""The secret scan at the edge, for names: a source whose name (a file or folder name, an object key, a page's
URL, an archive member) holds a credential is refused before its name reaches a plan, a manifest, a log or the
store; it is listed under its redacted name so that the run reports it."""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc

from kbflow.config import ConvertConfig
from kbflow.convert.scan import SourceFile, doc_id_for
from kbflow.convert.secrets import name_reason, redact


def _allowed(name: str, options: ConvertConfig) -> bool:
    return not options.secret_scan or any(fnmatch.fnmatch(name, pattern) for pattern in options.secret_scan_allow)


def refuse_secret_names(scanned: list[SourceFile], namespace: str, options: ConvertConfig) -> list[SourceFile]:
    """``scanned`` with every source whose name holds a credential replaced by a refused one under the
    redacted name (with ``convert.secret_scan`` on; ``secret_scan_allow`` globs match the real name)."""
    kept: dict[str, SourceFile] = {}
    for source in scanned:
        redacted, found = (source.source_path, []) if _allowed(source.source_path, options) else \
            redact(source.source_path)
        if found:
            source = replace(source, source_path=redacted, doc_id=doc_id_for(namespace, redacted), abs_path="-",
                             member=None, location=None, size=0, mime="application/octet-stream",
                             source_sha256=hashlib.sha256(f"refused name\x00{redacted}".encode()).hexdigest(),
                             unreadable=name_reason(found))
        kept.setdefault(source.doc_id, source)
    return list(kept.values())


def stored_secret_names(manifest: pa.Table, options: ConvertConfig) -> list[dict]:
    """Manifest rows whose source path holds a credential, to be removed. Only rows without a location are read:
    a file stored with one was named by a version that scans names (texts, uploads and pages have none)."""
    unplaced = manifest.filter(pc.is_null(manifest.column("location")))
    return [row for row in unplaced.to_pylist()
            if not _allowed(row["source_path"], options) and redact(row["source_path"])[1]]
