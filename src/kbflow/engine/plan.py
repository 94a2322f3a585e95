"""What a run has to do: scanned sources sorted against the manifest into new / changed / unchanged / removed,
and the deletion guard that refuses to remove most of a namespace because a folder went missing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from kbflow.convert.scan import SourceFile, UnreadableFolder
from kbflow.core.errors import DeletionGuardError
from kbflow.core.schemas import PLAN


@dataclass
class Fingerprints:
    converter: str
    chunker: str
    model_id: str
    graph: str = ""  # the graph extractor ('' when the graph stage is off)


@dataclass
class Plan:
    new: list[SourceFile] = field(default_factory=list)
    changed: list[SourceFile] = field(default_factory=list)
    unchanged: list[SourceFile] = field(default_factory=list)
    removed: list[dict] = field(default_factory=list)  # manifest rows
    # changed files whose stored version was made by today's converter, chunker, model and graph extractor, and
    # records its Markdown's hash: their manifest rows by doc id. Such a file whose new Markdown is the same (a
    # page whose only change is furniture the converter drops) needs no chunking or writing (``same_text``)
    same_fingerprints: dict[str, dict] = field(default_factory=dict)
    # manifest rows removed for another reason than a vanished source: a second copy of a file an earlier version
    # stored (kbflow.sources.local), a document whose name holds a credential. Not counted by the deletion guard
    withdrawn: list[dict] = field(default_factory=list)

    @property
    def todo(self) -> list[SourceFile]:
        return self.new + self.changed

    def counts(self) -> dict[str, int]:
        counts = {key: len(getattr(self, key)) for key in ("new", "changed", "unchanged", "removed")}
        return {**counts, "removed": counts["removed"] + len(self.withdrawn)}

    @property
    def deleted(self) -> list[dict]:
        """Every manifest row this run removes."""
        return self.removed + self.withdrawn

    def table(self) -> pa.Table:
        rows = [
            {"doc_id": s.doc_id, "source_path": s.source_path, "action": action, "source_sha256": s.source_sha256}
            for action in ("new", "changed", "unchanged")
            for s in getattr(self, action)
        ]
        rows += [{"doc_id": r["doc_id"], "source_path": r["source_path"], "action": "removed",
                  "source_sha256": r["source_sha256"]} for r in self.deleted]
        return pa.Table.from_pylist(rows, schema=PLAN)


def make_plan(scanned: list[SourceFile], manifest: pa.Table, fingerprints: Fingerprints, force: bool = False,
              track_removals: bool = True, unreadable_folders: Sequence[UnreadableFolder] = ()) -> Plan:
    """Sort scanned files into new / changed / unchanged; manifest files no longer scanned are removed, except
    those under a folder the scan could not list (out of sight is not deleted)."""
    stored = {row["doc_id"]: row for row in manifest.to_pylist()}
    plan = Plan()
    current = (fingerprints.converter, fingerprints.chunker, fingerprints.model_id, fingerprints.graph)
    for source in scanned:
        row = stored.get(source.doc_id)
        if row is None:
            plan.new.append(source)
            continue
        same = (row["converter"], row["chunker"], row["model_id"], row.get("graph") or "") == current
        if force or not same or row["source_sha256"] != source.source_sha256:
            plan.changed.append(source)
            if same and not force and row.get("markdown_sha256") and row["source_path"] == source.source_path:
                plan.same_fingerprints[source.doc_id] = row
        else:
            plan.unchanged.append(source)
    if track_removals:
        seen = {source.doc_id for source in scanned}
        plan.removed = [row for row in stored.values() if row["origin"] == "file" and row["doc_id"] not in seen
                        and not any(folder.holds(row["source_path"]) for folder in unreadable_folders)]
    return plan


def check_deletion_guard(plan: Plan, stored_documents: int, max_fraction: float, allow_mass_delete: bool) -> None:
    if allow_mass_delete or not plan.removed or stored_documents == 0:
        return
    share = len(plan.removed) / stored_documents
    if share > max_fraction:
        raise DeletionGuardError(
            f"this run would delete {len(plan.removed)} of {stored_documents} documents ({share:.0%}), more than "
            f"flow.max_delete_fraction ({max_fraction:.0%}); is a source folder missing or unmounted? "
            "Check the sources, or pass --allow-mass-delete to delete them"
        )
