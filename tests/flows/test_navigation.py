"""Navigation is not content: link bars, previous/next lists and tables of contents of real converted pages are
left out of the chunks, so they never come back as hits; the pages' text is all there."""

from __future__ import annotations

import shutil

from kbflow import api
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES

PAGES = ("debian-handbook-zh-sect.rights-management.docx", "pg-mvcc-intro.docx", "debian-handbook-zh-rights.html")


def test_link_bars_and_tables_of_contents_are_not_stored(tmp_path):
    (tmp_path / "pages").mkdir()
    for name in PAGES:
        shutil.copy(CASES / "formats" / name, tmp_path / "pages" / name)
    summary = api.ingest([str(tmp_path / "pages")], data_dir=tmp_path / "data")
    assert summary["failures"] == [] and summary["documents"]["new"] == 3
    texts = [row["text"] for row in LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist()]
    stored = "\n".join(texts)
    for navigation in ("Download the ebook", "[**上一页**]", "[Prev](", "[Up]("):
        assert navigation not in stored, navigation
    for content in ("Linux 是一个典型的多用户系统", "Multiversion Concurrency Control, MVCC"):
        assert content in stored.replace("\n", " "), content
    hits = api.search("上一页 下一页 起始页", data_dir=tmp_path / "data", mode="bm25")
    assert all("](" not in hit.text[:40] for hit in hits)  # no hit is a bare list of links
