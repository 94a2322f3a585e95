"""Planning by hand on small cases: which documents a run redoes (and only those) when bytes or a fingerprint change,
what counts as removed, and the deletion guard's arithmetic."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kbflow.chunk import chunker as chunker_module
from kbflow.chunk.chunker import chunker_fingerprint
from kbflow.chunk.tokens import EstimateTokenCounter
from kbflow.convert.scan import SourceFile, UnreadableFolder
from kbflow.engine.plan import Fingerprints, Plan, check_deletion_guard, make_plan
from kbflow.core.errors import DeletionGuardError
from kbflow.search import tokens as search_tokens
from kbflow.core.schemas import MANIFEST

PRINTS = Fingerprints("conv-1", "chunk-1", "model-1")


def source(name: str, sha: str = "aaa") -> SourceFile:
    return SourceFile(doc_id=f"id-{name}", source_path=f"docs/{name}", abs_path=f"/x/docs/{name}",
                      source_sha256=sha, size=1, mtime=0.0, mime="text/markdown")


def manifest(*rows: tuple[str, str, Fingerprints], origin: str = "file") -> pa.Table:
    return pa.Table.from_pylist([
        {"doc_id": f"id-{name}", "source_path": f"docs/{name}", "origin": origin, "source_sha256": sha,
         "converter": prints.converter, "chunker": prints.chunker, "model_id": prints.model_id, "chunk_ids": ["c"],
         "run_id": "r0"} for name, sha, prints in rows], schema=MANIFEST)


def names(items) -> list[str]:
    return sorted(item.source_path.split("/")[-1] if hasattr(item, "source_path") else item["source_path"].split("/")[-1]
                  for item in items)


def test_new_changed_unchanged_removed():
    stored = manifest(("same.md", "aaa", PRINTS), ("edited.md", "aaa", PRINTS), ("gone.md", "aaa", PRINTS))
    plan = make_plan([source("same.md"), source("edited.md", "bbb"), source("fresh.md")], stored, PRINTS)
    assert (names(plan.new), names(plan.changed), names(plan.unchanged), names(plan.removed)) == \
        (["fresh.md"], ["edited.md"], ["same.md"], ["gone.md"])
    assert plan.counts() == {"new": 1, "changed": 1, "unchanged": 1, "removed": 1}
    assert names(plan.todo) == ["edited.md", "fresh.md"]


@pytest.mark.parametrize("field", ["converter", "chunker", "model_id"])
def test_a_fingerprint_change_redoes_exactly_the_documents_made_with_the_old_one(field):
    old = Fingerprints(**{**vars(PRINTS), field: "old"})
    stored = manifest(("a.md", "aaa", old), ("b.md", "aaa", PRINTS), ("c.md", "aaa", old))
    plan = make_plan([source("a.md"), source("b.md"), source("c.md")], stored, PRINTS)
    assert names(plan.changed) == ["a.md", "c.md"] and names(plan.unchanged) == ["b.md"]


def test_a_split_chunk_or_bm25_words_version_bump_changes_the_chunker_fingerprint(monkeypatch):
    counter = EstimateTokenCounter(256)
    before = chunker_fingerprint(counter, 256, 32, True)
    monkeypatch.setattr(chunker_module, "SPLIT_VERSION", "99")
    after_split = chunker_fingerprint(counter, 256, 32, True)
    monkeypatch.setattr(chunker_module, "CHUNK_VERSION", "99")
    after_chunk = chunker_fingerprint(counter, 256, 32, True)
    monkeypatch.setattr(search_tokens, "TOKENIZER_VERSION", "jieba-99")  # stored text_tokens would be stale
    after_words = chunker_fingerprint(counter, 256, 32, True)
    assert len({before, after_split, after_chunk, after_words}) == 4
    assert len({before, chunker_fingerprint(counter, 128, 32, True), chunker_fingerprint(counter, 256, 16, True),
                chunker_fingerprint(counter, 256, 32, False)}) == 4


def test_force_redoes_everything_and_texts_are_never_removed_by_a_file_scan():
    stored = manifest(("a.md", "aaa", PRINTS))
    assert names(make_plan([source("a.md")], stored, PRINTS, force=True).changed) == ["a.md"]
    texts = manifest(("note", "aaa", PRINTS), origin="text")
    assert make_plan([], texts, PRINTS).removed == []
    assert make_plan([], stored, PRINTS, track_removals=False).removed == []


def test_documents_under_an_unreadable_folder_are_not_removed():
    stored = manifest(("private/a.md", "aaa", PRINTS), ("private2.md", "aaa", PRINTS), ("b.md", "aaa", PRINTS))
    plan = make_plan([], stored, PRINTS, unreadable_folders=[UnreadableFolder("docs/private", "Permission denied")])
    assert names(plan.removed) == ["b.md", "private2.md"]  # 'docs/private2.md' is not under 'docs/private'


@pytest.mark.parametrize("removed, stored, allowed", [(3, 10, True), (4, 10, False), (1, 1, False), (0, 5, True)])
def test_the_deletion_guard_allows_up_to_the_share(removed, stored, allowed):
    plan = Plan(removed=[{"doc_id": str(i)} for i in range(removed)])
    if allowed:
        check_deletion_guard(plan, stored, 0.3, allow_mass_delete=False)
    else:
        with pytest.raises(DeletionGuardError, match=f"delete {removed} of {stored} documents"):
            check_deletion_guard(plan, stored, 0.3, allow_mass_delete=False)
        check_deletion_guard(plan, stored, 0.3, allow_mass_delete=True)
