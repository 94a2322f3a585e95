"""Each document's chunk plans, kept beside the namespace's state, so re-chunking a changed document costs what
changed (``kbflow.chunk.chunker.chunk_document``'s ``plans``).

One JSON file per document (``<state>/chunk-plans/<doc_id[:2]>/<doc_id>.json``: section key -> plan), read before
the document is chunked and rewritten after, through a temporary name and a rename. A plan is reused only when its
key (a hash of the section's text, blocks, heading path and the chunker fingerprint) matches, so a stale, missing
or unreadable file costs time, never correctness. A removed document's file goes with it.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


class PlanCache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, doc_id: str) -> Path:
        return self.root / doc_id[:2] / f"{doc_id}.json"

    def load(self, doc_id: str) -> dict[str, dict]:
        try:
            plans = json.loads(self._path(doc_id).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return plans if isinstance(plans, dict) else {}

    def save(self, doc_id: str, plans: dict[str, dict]) -> None:
        path = self._path(doc_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp-kbflow")
        tmp.write_text(json.dumps(plans, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)

    def forget(self, doc_ids: list[str]) -> None:
        for doc_id in doc_ids:
            self._path(doc_id).unlink(missing_ok=True)
