"""Per-document cache of successful conversions, keyed by (sha256 of the bytes converted, converter fingerprint).

Failures are never stored: a file that failed for a passing reason (a timeout on a busy machine, a 429 from a
speech service) is converted again on the next run. One file per document, written to a temporary name and
renamed, so a crash leaves either nothing or a whole entry. Entries live under the Prefect results folder and are
pruned with it by age.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from kbflow.convert.scan import SourceFile
from kbflow.core.storage import location, write_cache_entry

CACHED_FIELDS = ("converter", "markdown", "encoding")
ENTRY_TYPES: dict[str, type | tuple[type, ...]] = {"converter": str, "markdown": str, "encoding": (str, type(None))}


class ConversionCache:
    def __init__(self, root: str | Path):
        self.root = location(root)

    def _path(self, source_sha256: str, fingerprint: str):
        key = hashlib.sha256(f"{source_sha256}\x00{fingerprint}".encode()).hexdigest()
        return self.root / key[:2] / f"{key}.json"

    def get(self, source: SourceFile, fingerprint: str) -> dict | None:
        """The documents row of an earlier success for the bytes the scan hashed and this converter, or None."""
        path = self._path(source.source_sha256, fingerprint)
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(cached, dict) or not isinstance(cached.get("markdown"), str) or \
                any(key in cached and not isinstance(cached[key], kind) for key, kind in ENTRY_TYPES.items()):
            return None  # damaged into another shape: a miss (`kbflow verify` names it)
        return {"doc_id": source.doc_id, "source_path": source.source_path, "abs_path": source.abs_path,
                "source_sha256": source.source_sha256, "size": source.size, "mtime": source.mtime,
                "mime": source.mime, "status": "ok", "error": None, **{k: cached.get(k) for k in CACHED_FIELDS}}

    def put(self, source_sha256: str, fingerprint: str, row: dict) -> None:
        """Store a success under the hash of the bytes that were converted (not the scan's, which may be older)."""
        write_cache_entry(self._path(source_sha256, fingerprint),
                          json.dumps({k: row[k] for k in CACHED_FIELDS}, ensure_ascii=False).encode("utf-8"))

    def forget(self, source_sha256: str, fingerprint: str) -> None:
        """Remove an entry (one the secret scan now refuses must not stay on disk)."""
        path = self._path(source_sha256, fingerprint)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
