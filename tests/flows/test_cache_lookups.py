"""A text reads the vector cache once on its way to the model: the overlap scheduler's lookup (which it needs to
count the misses that fill an embed call) is handed to the round, and the embed stage's first try does not read
the cache again. A text that two rounds share is embedded once: the later round reads the cache for it again."""

from __future__ import annotations

from collections import Counter

from kbflow.config import load_config
from kbflow.engine.ingest import IngestJob
from kbflow.engine.ingest import ingest as engine_ingest
from kbflow.stores.vector_cache import VectorCache

def _docs(folder, shared: bool):
    folder.mkdir()
    for n in range(6):
        body = f"# Part {n}\n\nPart {n} describes valve number {n * 7} and its pressure limit of {n + 2} bar.\n"
        (folder / f"part{n}.md").write_text(body)
    if shared:  # the first and the last batch hold the same text, in different rounds
        (folder / "part5.md").write_text((folder / "part0.md").read_text())
    return folder


def _ingest(tmp_path, docs, monkeypatch, namespace: str = "default"):
    looked_up: Counter = Counter()
    lookup = VectorCache.lookup

    def counted(self, keys):
        looked_up.update(keys)
        return lookup(self, keys)

    monkeypatch.setattr(VectorCache, "lookup", counted)
    # one document per batch, a round per two batches: several rounds, the overlap scheduler at work
    config = load_config(None, data_dir=tmp_path / "kb", flow={"doc_batch": 1, "embed_gather_docs": 2})
    summary = engine_ingest(config, IngestJob([str(docs)], namespace=namespace))
    assert summary["documents"]["failed"] == 0, summary["failures"]
    return looked_up, summary


def test_each_text_is_looked_up_once_on_its_way_to_the_model(tmp_path, monkeypatch, counting):
    looked_up, summary = _ingest(tmp_path, _docs(tmp_path / "docs", shared=False), monkeypatch)
    assert looked_up and set(looked_up.values()) == {1}, looked_up
    assert counting.texts_embedded == summary["chunks"]["embedded"] == len(looked_up)
    # the same texts into another namespace: every vector comes from the cache the first run filled, read once
    again, summary = _ingest(tmp_path, tmp_path / "docs", monkeypatch, namespace="other")
    assert set(again.values()) == {1} and summary["chunks"]["embedded"] == 0 and summary["chunks"]["reused"] > 0


def test_a_text_in_two_rounds_is_embedded_once(tmp_path, monkeypatch, counting):
    looked_up, summary = _ingest(tmp_path, _docs(tmp_path / "docs", shared=True), monkeypatch)
    distinct = len(looked_up)
    assert counting.texts_embedded == distinct  # the shared note went to the model once
    assert max(looked_up.values()) > 1  # it was read again by a later batch and round, the others once
    assert sorted(looked_up.values()).count(1) == distinct - 1
