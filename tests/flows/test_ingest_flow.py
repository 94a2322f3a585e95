"""Real Prefect runs of flows/ingest.py on real files, the real model and real LanceDB."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kbflow.flows.ingest import ingest
from kbflow import api
from kbflow.core.errors import DeletionGuardError, ModelMismatchError
from kbflow.state.manifest import NamespaceState
from kbflow.stores.vector_cache import VectorCache
from tests.conftest import CASES
from tests.flows.conftest import DIM, snapshot, store_of



def run(docs, data_dir, **kwargs):
    return ingest(sources=[str(docs)], data_dir=str(data_dir), **kwargs)


def test_first_run_then_rerun_changes_nothing(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    first = run(docs_dir, data)
    assert first["documents"]["new"] == 4 and first["documents"]["failed"] == 0
    assert first["chunks"]["embedded"] == counting.texts_embedded > 0
    rows, manifest = snapshot(data)
    ids = [row["chunk_id"] for row in rows]
    assert len(ids) == len(set(ids)) == first["store"]["count"]
    assert sum(len(m["chunk_ids"]) for m in manifest) == len(ids)
    assert all(np.linalg.norm(row["vector"]) > 0.99 for row in rows)

    counting.texts_embedded = 0
    second = run(docs_dir, data)
    assert counting.texts_embedded == 0 and second["chunks"]["embedded"] == 0
    assert second["documents"] == {"new": 0, "changed": 0, "same_text": 0, "unchanged": 4, "removed": 0, "failed": 0}
    assert snapshot(data) == (rows, manifest)


def test_editing_one_paragraph_embeds_only_changed_chunks(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = {row["chunk_id"]: row for row in store_of(data).rows().to_pylist()}
    target = docs_dir / "backups.md"
    target.write_text(target.read_text().replace("Keep seven daily backups", "Keep ten daily backups"))

    counting.texts_embedded = 0
    summary = run(docs_dir, data)
    assert summary["documents"]["changed"] == 1 and summary["documents"]["unchanged"] == 3
    after = {row["chunk_id"]: row for row in store_of(data).rows().to_pylist()}
    new_texts = {row["embed_sha256"] for row in after.values()} - {row["embed_sha256"] for row in before.values()}
    assert counting.texts_embedded == len(new_texts) == 1
    assert not any("seven daily" in row["text"] for row in after.values())
    assert any("ten daily" in row["text"] for row in after.values())
    assert len(after) == len(before)


def test_a_changed_document_rewrites_only_the_rows_that_changed(tmp_path, counting):
    """Store writes follow the change (issue 22): an edit inside one section rewrites that section's chunk, and one
    that moves the text below it rewrites those chunks too (their offsets changed); every other row stays where it
    was, with its LanceDB row id."""
    docs, data = tmp_path / "docs", tmp_path / "data"
    docs.mkdir()
    sections = [f"## Part {i}\n\n" + f"Part {i} keeps seven copies of record {i}. " * 20 for i in range(6)]
    (docs / "long.md").write_text("\n\n".join(sections))

    def rows():
        table = store_of(data).table.search().with_row_id(True).limit(None).to_arrow().drop_columns(["vector"])
        return {row["chunk_id"]: row for row in table.to_pylist()}

    first = run(docs, data)
    assert first["chunks"]["written"] == first["store"]["count"] == 6  # one chunk per section
    before = rows()
    (docs / "long.md").write_text("\n\n".join(sections).replace("record 3.", "record 9.", 1))  # same length
    same_length = run(docs, data)
    after = rows()
    differ = {cid for cid in after if {**after[cid], "_rowid": 0} != {**before.get(cid, {}), "_rowid": 0}}
    assert same_length["chunks"]["embedded"] == same_length["chunks"]["written"] == len(differ) == 1
    assert all(after[cid]["_rowid"] == before[cid]["_rowid"] for cid in after if cid not in differ)

    (docs / "long.md").write_text("\n\n".join(sections).replace("record 3.", "record 33.", 1))  # one longer
    longer = run(docs, data)
    final = rows()
    differ = {cid for cid in final if {**final[cid], "_rowid": 0} != {**after.get(cid, {}), "_rowid": 0}}
    assert longer["chunks"]["embedded"] == 1 and longer["chunks"]["written"] == len(differ) == 3  # parts 3, 4, 5
    assert {final[cid]["ordinal"] for cid in differ} == {3, 4, 5}
    assert all(final[cid]["_rowid"] == after[cid]["_rowid"] for cid in final if cid not in differ)


def test_a_changed_file_with_the_same_text_is_recorded_not_chunked_or_written(tmp_path, counting):
    """A new patch release of a manual changes every page's navigation bar and nothing else of most pages: those
    pages convert to the Markdown their stored chunks were made from. Their manifest rows take the new source hash
    (the next run skips them before conversion) and nothing of them is split, chunked, embedded or written; a page
    whose text changed goes through every stage, and so does one whose stored chunks the store lacks."""
    docs, data = tmp_path / "docs", tmp_path / "data"
    docs.mkdir()

    def page(release: str, body: str) -> str:
        return (f'<html><body><div class="navheader">PostgreSQL {release} Documentation</div>'
                f"<h1>Backups</h1><p>{body}</p></body></html>")

    bodies = {name: f"The {name} page keeps seven daily copies of its records. " * 8 for name in ("a", "b", "c")}
    for name, body in bodies.items():
        (docs / f"{name}.html").write_text(page("15.18", body))
    first = run(docs, data)
    assert first["documents"]["new"] == 3 and first["documents"]["same_text"] == 0
    rows_before, manifest_before = snapshot(data)

    for name, body in bodies.items():  # a new release: every page's furniture, and one page's text
        (docs / f"{name}.html").write_text(page("15.20", body.replace("seven", "ten") if name == "c" else body))
    counting.texts_embedded = 0
    update = run(docs, data)
    assert update["documents"]["changed"] == 3 and update["documents"]["same_text"] == 2
    assert update["chunks"]["total"] == update["chunks"]["written"] == counting.texts_embedded == 1  # page c only
    run_dir = data / "runs" / "default" / update["run_id"]
    chunked = {row["doc_id"] for part in (run_dir / "chunks").glob("*.parquet")
               for row in pq.read_table(part).to_pylist()}
    by_path = {row["source_path"]: row for row in NamespaceState(data, "default").read_manifest().to_pylist()}
    assert chunked == {by_path["docs/c.html"]["doc_id"]}
    rows_after, _ = snapshot(data)
    assert [row for row in rows_after if row["source_path"] != "docs/c.html"] == \
        [row for row in rows_before if row["source_path"] != "docs/c.html"]
    for before in manifest_before:  # the new source hash, the same chunks
        after = by_path[before["source_path"]]
        assert after["source_sha256"] != before["source_sha256"] and after["run_id"] == update["run_id"]
        assert (after["chunk_ids"] == before["chunk_ids"]) == (before["source_path"] != "docs/c.html")
    assert run(docs, data)["documents"]["unchanged"] == 3  # the recorded hashes are the files' own

    # a page whose chunks the store lost is written back, though its text is the recorded one
    store_of(data).table.delete("source_path = 'docs/a.html'")
    (docs / "a.html").write_text(page("15.21", bodies["a"]))
    healed = run(docs, data)
    assert healed["documents"]["same_text"] == 0 and healed["chunks"]["written"] == 1
    assert [row for row in snapshot(data)[0] if row["source_path"] == "docs/a.html"] == \
        [row for row in rows_before if row["source_path"] == "docs/a.html"]


def test_a_manifest_without_markdown_hashes_chunks_changed_files_once_and_records_them(tmp_path, counting):
    """Rows written before the Markdown's hash was recorded read as null: such a changed file is chunked as before
    (nothing to compare with), and its new row records the hash."""
    docs, data = tmp_path / "docs", tmp_path / "data"
    docs.mkdir()
    (docs / "a.html").write_text('<div class="navheader">v1</div><p>Keep seven daily copies of the records.</p>')
    run(docs, data)
    state = NamespaceState(data, "default")
    pq.write_table(pq.read_table(state.manifest_path).drop_columns(["markdown_sha256"]), state.manifest_path)
    assert state.read_manifest().column("markdown_sha256").to_pylist() == [None]
    (docs / "a.html").write_text('<div class="navheader">v2</div><p>Keep seven daily copies of the records.</p>')
    first = run(docs, data)
    assert first["documents"]["same_text"] == 0 and first["chunks"]["total"] == 1
    assert state.read_manifest().column("markdown_sha256").to_pylist()[0]
    (docs / "a.html").write_text('<div class="navheader">v3</div><p>Keep seven daily copies of the records.</p>')
    assert run(docs, data)["documents"]["same_text"] == 1


def test_deleting_a_file_deletes_exactly_its_chunks(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    rows = store_of(data).rows().to_pylist()
    doomed = {row["chunk_id"] for row in rows if row["source_path"] == "docs/search.md"}
    assert doomed
    (docs_dir / "search.md").unlink()
    summary = run(docs_dir, data)
    assert summary["documents"]["removed"] == 1
    assert summary["chunks"]["deleted"] == len(doomed)
    remaining = {row["chunk_id"] for row in store_of(data).rows().to_pylist()}
    assert remaining == {row["chunk_id"] for row in rows} - doomed
    assert "docs/search.md" not in {m["source_path"] for m in NamespaceState(data, "default").read_manifest().to_pylist()}


def test_deletion_guard_stops_mass_delete(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    for name in ("search.md", "backups.md"):
        (docs_dir / name).unlink()
    with pytest.raises(DeletionGuardError, match="allow-mass-delete"):
        run(docs_dir, data)
    assert snapshot(data) == before
    summary = run(docs_dir, data, allow_mass_delete=True)
    assert summary["documents"]["removed"] == 2


def test_add_document_adds_one_file_and_leaves_the_others(docs_dir, tmp_path, counting):
    """An agent adding a file (KnowledgeBase.add_document, the MCP tool, `kbflow add-document`) must not make the
    namespace hold only that file: `ingest` of the same path would remove the other documents (here it is stopped
    by the deletion guard, 3 of 5)."""
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    extra = tmp_path / "inbox" / "tea.md"
    extra.parent.mkdir()
    extra.write_text("# Tea\n\nGreen tea is brewed with water at 80 degrees for two minutes.\n")
    summary = api.add_document(extra, data_dir=data)
    assert summary["documents"] == {"new": 1, "changed": 0, "same_text": 0, "unchanged": 0, "removed": 0, "failed": 0}
    rows, manifest = snapshot(data)
    assert {m["source_path"] for m in manifest} == {m["source_path"] for m in before[1]} | {"tea.md"}
    assert [row for row in rows if row["source_path"] != "tea.md"] == before[0]

    extra.write_text("# Tea\n\nGreen tea is brewed with water at 70 degrees for two minutes.\n")
    assert api.add_document(extra, data_dir=data)["documents"]["changed"] == 1
    assert any("70 degrees" in row["text"] for row in store_of(data).rows().to_pylist())
    with pytest.raises(DeletionGuardError):  # ingest: the namespace is exactly its sources
        api.ingest([str(extra)], data_dir=data)
    with pytest.raises(Exception, match="does not exist"):
        api.add_document(tmp_path / "missing.md", data_dir=data)


def test_renaming_a_file_reuses_its_vectors(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    shutil.move(docs_dir / "backups.md", docs_dir / "backup-guide.md")
    counting.texts_embedded = 0
    summary = run(docs_dir, data)
    assert counting.texts_embedded == 0
    assert summary["documents"]["new"] == 1 and summary["documents"]["removed"] == 1
    paths = {row["source_path"] for row in store_of(data).rows().to_pylist()}
    assert "docs/backup-guide.md" in paths and "docs/backups.md" not in paths


def fail_lance_commits(monkeypatch, table_dir: Path) -> list[str]:
    """Make every merge_insert into the store table at ``table_dir`` fail inside LanceDB's own commit, after its
    real write: the real merge_insert runs and writes the new rows' data files, and only then finds the version it
    would commit already taken (a directory squats on the next manifest's name), so the commit fails. Whatever else
    the store does (a separate delete, say) commits as usual. Returns the errors the merges raised."""
    from lancedb.merge import LanceMergeInsertBuilder

    real = LanceMergeInsertBuilder.execute
    errors: list[str] = []

    def commit_fails(self, new_data, *args, **kwargs):
        if self._table.name != table_dir.stem:
            return real(self, new_data, *args, **kwargs)
        versions = table_dir / "_versions"
        numbers = [int(path.stem) for path in versions.glob("*.manifest")]
        assert numbers and min(numbers) > 2**63, numbers  # Lance's V2 names: version v is u64::MAX - v
        squatter = versions / f"{min(numbers) - 1}.manifest"  # the name the next version would take
        squatter.mkdir()
        try:
            return real(self, new_data, *args, **kwargs)
        except Exception as exc:
            errors.append(str(exc))
            raise
        finally:
            squatter.rmdir()

    monkeypatch.setattr(LanceMergeInsertBuilder, "execute", commit_fails)
    return errors


def test_upsert_failure_leaves_store_and_manifest_as_before(docs_dir, tmp_path, counting, monkeypatch):
    data = tmp_path / "data"
    run(docs_dir, data)
    before = snapshot(data)
    version = store_of(data).table.version
    table_dir = data / "lancedb" / "chunks_default.lance"
    data_files = table_dir / "data"
    files_before = set(data_files.iterdir())
    (docs_dir / "search.md").write_text("# Search\n\nA completely rewritten page about ranking.\n")

    errors = fail_lance_commits(monkeypatch, table_dir)
    summary = run(docs_dir, data)
    assert summary["documents"]["failed"] == 1
    assert [f["stage"] for f in summary["failures"]] == ["upsert"]
    assert errors and all("Commit conflict" in error for error in errors)  # it failed at LanceDB's commit ...
    assert set(data_files.iterdir()) - files_before  # ... after writing the new rows: a partial write on disk
    assert snapshot(data) == before  # which no reader sees, and the manifest was not touched
    assert store_of(data).table.version == version
    failures = pq.read_table(next((data / "runs" / "default").glob(f"{summary['run_id']}/failures.parquet")))
    assert failures.column("stage").to_pylist() == ["upsert"]

    monkeypatch.undo()
    import kbflow.engine.ingest

    monkeypatch.setattr(kbflow.engine.ingest, "get_embedder", lambda config: counting)
    counting.texts_embedded = 0
    again = run(docs_dir, data)
    assert again["documents"]["changed"] == 1 and again["documents"]["failed"] == 0
    assert counting.texts_embedded == 0  # its vectors were cached by the failed run
    assert any("rewritten page" in row["text"] for row in store_of(data).rows().to_pylist())


def test_embedding_failure_keeps_stored_version_and_writes_no_vector(docs_dir, tmp_path, counting, real_embedder,
                                                                     monkeypatch):
    """The failure comes out of the real model: it encodes every batch, and for the batch holding one text its
    output has a NaN row (as a model in trouble returns), which kbflow's output check refuses. The other changed
    document's batch, embedded in the same run, is stored."""
    data = tmp_path / "data"
    run(docs_dir, data)
    before_rows, before_manifest = snapshot(data)
    def cached() -> int:  # a fresh handle each time: an open table does not see later commits
        return VectorCache(data / "lancedb", real_embedder.model_id, DIM).count()

    cached_before = cached()
    (docs_dir / "backups.md").write_text("# Backups\n\nNew policy: back up every hour.\n")
    (docs_dir / "search.md").write_text("# Search\n\nA completely rewritten page about ranking.\n")
    monkeypatch.setenv("KBFLOW__EMBEDDER__TASK_BATCH", "1")  # one text per embed call: the good one gets through

    model = real_embedder._load()
    encode = model.encode
    encoded: list[tuple[list[str], bool]] = []  # (texts, whether the model's output was spoiled)
    state = {"broken": True}

    def model_in_trouble(texts, *args, **kwargs):
        vectors = encode(texts, *args, **kwargs)  # the model really runs
        spoiled = [i for i, text in enumerate(texts) if state["broken"] and "every hour" in text]
        vectors[spoiled] = np.nan
        encoded.append((list(texts), bool(spoiled)))
        return vectors

    monkeypatch.setattr(model, "encode", model_in_trouble)
    summary = run(docs_dir, data)
    assert summary["documents"]["changed"] == 2 and summary["documents"]["failed"] == 1  # of the 2, 1 failed
    assert {f["stage"] for f in summary["failures"]} == {"embed"}
    [refused] = [f for f in summary["failures"] if f.get("chunk_ids")]
    assert refused["error_type"] == "EmbeddingError" and "NaN" in refused["message"]
    assert [spoiled for _, spoiled in encoded].count(True) == 1  # one batch spoiled, not retried
    good = [texts for texts, spoiled in encoded if not spoiled]
    assert any("rewritten page" in text for texts in good for text in texts)  # the other batch was embedded ...
    rows, manifest = snapshot(data)
    assert any("rewritten page" in row["text"] for row in rows)  # ... and its document stored
    assert cached() == cached_before + sum(len(texts) for texts in good) > cached_before  # none for the refused text
    backups = {m["doc_id"] for m in before_manifest if m["source_path"] == "docs/backups.md"}
    assert [r for r in rows if r["doc_id"] in backups] == [r for r in before_rows if r["doc_id"] in backups]
    assert [m for m in manifest if m["doc_id"] in backups] == [m for m in before_manifest if m["doc_id"] in backups]
    assert not any("every hour" in row["text"] for row in rows)  # old version kept, nothing half-written

    state["broken"] = False
    again = run(docs_dir, data)
    assert again["documents"]["changed"] == 1 and again["chunks"]["embedded"] >= 1
    assert any("every hour" in row["text"] for row in store_of(data).rows().to_pylist())


def test_namespace_remembers_its_model(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data)
    meta_path = data / "state" / "default" / "namespace.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "model_id": "some-other-model;dim=768", "dimension": 768}))
    with pytest.raises(ModelMismatchError, match="kbflow clear"):
        run(docs_dir, data)


def test_bad_files_are_recorded_and_the_rest_ingested(tmp_path, counting):
    data = tmp_path / "data"
    docs = tmp_path / "mixed"
    (docs / "bad").mkdir(parents=True)
    for name in ("broken.pdf", "empty.docx", "random.xlsx"):  # the full bad set: tests/flows/test_convert_flow.py
        shutil.copy(CASES / "bad" / name, docs / "bad" / name)
    shutil.copy(CASES / "docs" / "search.md", docs / "search.md")
    summary = ingest(sources=[str(docs)], data_dir=str(data))
    assert summary["documents"]["failed"] == 3
    assert {f["source_path"] for f in summary["failures"]} == {"mixed/bad/broken.pdf", "mixed/bad/empty.docx",
                                                               "mixed/bad/random.xlsx"}
    assert all(f["message"] for f in summary["failures"])
    assert {row["source_path"] for row in store_of(data).rows().to_pylist()} == {"mixed/search.md"}


def test_add_text_and_clear_touch_one_namespace(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    run(docs_dir, data, namespace="alpha")
    api.add_text("Tea is brewed with water at 80 degrees.", doc_id="tea", namespace="beta", data_dir=data)
    hits = api.search("how hot should tea water be", namespace="beta", data_dir=data)
    assert hits and hits[0].source_path == "text:tea"
    alpha_before = snapshot(data, "alpha")

    # the same doc id replaces the text; a later file ingest into beta does not remove it
    api.add_text("Tea is brewed with water at 70 degrees.", doc_id="tea", namespace="beta", data_dir=data)
    texts = [row["text"] for row in store_of(data, "beta").rows().to_pylist()]
    assert texts == ["Tea is brewed with water at 70 degrees."]

    api.clear("beta", data_dir=data)
    assert api.stats("beta", data_dir=data)["chunks"] == 0
    assert not (data / "state" / "beta").exists()  # the lock released, nothing of the namespace stays
    assert snapshot(data, "alpha") == alpha_before
    assert api.stats("alpha", data_dir=data)["documents"] == 4


def test_dry_run_writes_nothing(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    summary = run(docs_dir, data, dry_run=True)
    assert summary["documents"]["new"] == 4
    assert {row["action"] for row in summary["plan"]} == {"new"}
    assert counting.texts_embedded == 0
    assert not (data / "lancedb").exists() and not (data / "state").exists()


def test_eval_on_a_small_labelled_set(tmp_path, counting):
    from kbflow.engine.evaluate import eval_beir

    result = eval_beir(CASES / "beir-mini", data_dir=tmp_path / "data", ingest=api.ingest)
    assert result["documents"] == 5 and result["queries"] == 3
    # The metrics by hand, from rankings this test reads itself (the same vector search, the corpus files that
    # eval writes are doc-000000.md ... in corpus.jsonl's order) and the qrels file
    corpus = [json.loads(line)["_id"] for line in (CASES / "beir-mini" / "corpus.jsonl").read_text().splitlines()]
    queries = {row["_id"]: row["text"] for row in map(json.loads,
                                                      (CASES / "beir-mini" / "queries.jsonl").read_text().splitlines())}
    relevant: dict[str, set[str]] = {}
    for line in (CASES / "beir-mini" / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        query_id, doc, score = line.split("\t")
        if int(score) > 0:
            relevant.setdefault(query_id, set()).add(doc)
    assert relevant == {"q1": {"d1", "d4"}, "q2": {"d2"}, "q3": {"d3"}}
    reciprocal_ranks, recalls, ndcgs = [], [], []
    for query_id, wanted in relevant.items():
        hits = api.search(queries[query_id], namespace=result["namespace"], data_dir=tmp_path / "data", mode="vector",
                          limit=100, min_score=-1e9)
        ranked = list(dict.fromkeys(corpus[int(h.source_path.split("-")[-1].split(".")[0])] for h in hits))
        assert sorted(ranked) == corpus  # all 5 documents come back
        assert ranked[0] in wanted, (query_id, ranked)  # these queries are easy: a right document ranks first
        first = next(rank for rank, doc in enumerate(ranked, 1) if doc in wanted)
        reciprocal_ranks.append(1 / first if first <= 10 else 0.0)
        recalls.append(len(wanted & set(ranked[:100])) / len(wanted))
        # nDCG@10, binary gains: sum of 1 / log2(rank + 1) over the relevant documents in the top 10, over the
        # same sum for the ideal list (all relevant first)
        dcg = sum(1 / math.log2(rank + 1) for rank, doc in enumerate(ranked[:10], 1) if doc in wanted)
        ndcgs.append(dcg / sum(1 / math.log2(rank + 1) for rank in range(1, len(wanted) + 1)))
    assert reciprocal_ranks == [1.0, 1.0, 1.0]  # so MRR@10 = (1/1 + 1/1 + 1/1) / 3 = 1
    assert result["metrics"]["mrr@10"] == sum(reciprocal_ranks) / 3 == 1.0
    assert result["metrics"]["recall@100"] == sum(recalls) / 3 == 1.0  # 5 documents: every one is in the list
    assert result["metrics"]["recall@10"] == 1.0  # the same: 5 documents, all in the top 10
    # q1's second relevant document (the Chinese one) ranks where it ranks: nDCG is below 1 unless it is second
    assert result["metrics"]["ndcg@10"] == pytest.approx(sum(ndcgs) / 3, abs=1e-4)


def test_qdrant_store_holds_the_same_chunks_as_lancedb(docs_dir, tmp_path, counting):
    from kbflow.stores.qdrant_store import QdrantStore

    config = tmp_path / "qdrant.yaml"
    config.write_text(f"store:\n  kind: qdrant\n  qdrant_location: {tmp_path / 'qdrant'}\n")
    lance = run(docs_dir, tmp_path / "lance-data")
    qdrant = ingest(sources=[str(docs_dir)], data_dir=str(tmp_path / "qdrant-data"), config_path=str(config))
    assert qdrant["store"]["count"] == lance["store"]["count"]
    store = QdrantStore(str(tmp_path / "qdrant"), "default", DIM)
    assert sorted(store.chunk_ids().column("chunk_id").to_pylist()) == sorted(
        store_of(tmp_path / "lance-data").chunk_ids().column("chunk_id").to_pylist())
    again = ingest(sources=[str(docs_dir)], data_dir=str(tmp_path / "qdrant-data"), config_path=str(config))
    assert again["chunks"]["embedded"] == 0 and again["store"]["count"] == qdrant["store"]["count"]
    hits = api.search("how long are backups kept", data_dir=tmp_path / "qdrant-data", config=config)
    assert hits[0].source_path == "docs/backups.md"
    report = api.verify("default", config=config, data_dir=tmp_path / "qdrant-data")  # it reads every vector back
    assert report["ok"] and report["counts"]["store_rows"] == qdrant["store"]["count"], report["findings"]


def test_bench_ingest_reports_phases_and_writes_json_and_plot(tmp_path, counting):
    from kbflow.bench.ingest import bench_ingest

    before, after = tmp_path / "v1" / "docs", tmp_path / "v2" / "docs"
    shutil.copytree(CASES / "docs", before)
    shutil.copytree(CASES / "docs", after)
    (after / "search.md").write_text((after / "search.md").read_text() + "\nRanking also uses BM25.\n")
    out = tmp_path / "bench" / "ingest.json"
    result = bench_ingest(before, after, out, tmp_path / "work", None)
    phases = {phase["phase"]: phase for phase in result["phases"]}
    assert phases["rerun"]["texts_embedded"] == 0
    assert 1 <= phases["update"]["texts_embedded"] <= 2
    assert result["update_floor"]["texts"] == phases["update"]["texts_embedded"]  # exactly what it had to embed
    assert result["ratios"]["update_over_update_floor"] > 0 and result["ratios"]["update_floor_over_full"] < 1
    assert result["ratios"]["update_store_equals_fresh"] is True
    assert json.loads(out.read_text())["ratios"] == result["ratios"]
    assert out.with_suffix(".png").stat().st_size > 1000


def test_vector_index_is_built_after_the_last_batch_not_during_them(docs_dir, tmp_path, counting, monkeypatch):
    """Building an ANN index takes memory in proportion to the table; an ingest builds it once, after its batches
    are written and freed, so the two peaks do not add up (kbflow bench memory)."""
    from kbflow.runtime import failpoints

    data = tmp_path / "data"
    monkeypatch.setenv("KBFLOW__SEARCH__VECTOR_INDEX_MIN_ROWS", "8")
    monkeypatch.setenv("KBFLOW__SEARCH__VECTOR_INDEX_TYPE", "IVF_FLAT")
    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "1")
    monkeypatch.setenv(failpoints.ENV, "upsert.done=4:raise")  # the run dies after its last batch is written
    failpoints.reset()
    with pytest.raises(failpoints.FailpointError):
        run(docs_dir, data)
    interrupted = store_of(data).stats()
    assert interrupted["rows"] >= 8 and set(interrupted["indexes"]) == {"text_tokens"}  # no vector index yet

    monkeypatch.delenv(failpoints.ENV)
    summary = run(docs_dir, data)
    # the end of the run also indexes the text again: rows the batches left outside the full-text index are in
    assert summary["documents"]["unchanged"] == 4
    assert summary["store"]["indexes"] == {"vector": "created IVF_FLAT", "text_tokens": "rebuilt"}
    indexes = store_of(data).stats()["indexes"]
    assert indexes["vector"]["unindexed_rows"] == 0 and indexes["text_tokens"]["unindexed_rows"] == 0
    assert run(docs_dir, data)["store"]["indexes"] == {}  # nothing left to do


def test_the_next_batch_is_chunked_while_the_last_ones_are_embedded(docs_dir, tmp_path, counting, monkeypatch):
    """Embedding overlaps the next batches' conversion and chunking: a round's embed call waits (up to 15 s)
    for the chunk stage to start on a later batch, which happens only if the round runs in the background."""
    import threading

    from kbflow.engine import rows

    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "1")
    monkeypatch.setenv("KBFLOW__FLOW__EMBED_GATHER_DOCS", "1")  # every batch starts a round
    chunked, next_chunking = [], threading.Event()
    original = rows.chunk_documents

    def chunk(*args, **kwargs):
        chunked.append(len(chunked))
        if len(chunked) >= 2:
            next_chunking.set()
        return original(*args, **kwargs)

    monkeypatch.setattr(rows, "chunk_documents", chunk)  # what the chunk stage calls, under either runner
    overlapped = []
    counting.fail_when = lambda texts: overlapped.append(next_chunking.wait(timeout=15)) or None
    summary = run(docs_dir, tmp_path / "data")
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0 and len(chunked) == 4
    assert overlapped and all(overlapped)
    rows, manifest = snapshot(tmp_path / "data")
    assert sum(len(m["chunk_ids"]) for m in manifest) == len(rows) == summary["store"]["count"]


def test_an_idle_model_gets_the_first_batchs_texts_without_waiting_for_the_gather(docs_dir, tmp_path, counting,
                                                                                  monkeypatch):
    """While a round embeds, the next one gathers up to embedder.task_batch x max_workers missing texts or
    flow.embed_gather_docs documents (here 1,024 or 400: four documents never fill it); the model, idle at the
    run's start, gets the first batch's texts at once instead of all four documents' at the end."""
    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "1")
    calls: list[list[str]] = []
    counting.fail_when = lambda texts: calls.append(list(texts)) or None
    data = tmp_path / "data"
    summary = run(docs_dir, data)
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0
    first = pq.read_table(data / "runs" / "default" / summary["run_id"] / "chunks" / "part-00000.parquet")
    first_texts = {prefix + text for prefix, text in zip(first.column("embed_prefix").to_pylist(),
                                                        first.column("text").to_pylist())}
    assert first_texts and set(calls[0]) <= first_texts
    assert sum(map(len, calls)) == summary["chunks"]["embedded"] > len(first_texts)
    rows, manifest = snapshot(data)
    assert sum(len(m["chunk_ids"]) for m in manifest) == len(rows) == summary["store"]["count"]


def test_a_large_run_converts_in_worker_processes_and_stops_them_at_the_end(docs_dir, tmp_path, counting, monkeypatch):
    """``convert.workers: auto`` (the default) converts a run of AUTO_WORKERS_MIN_FILES files or more in one process
    per core (at most AUTO_WORKERS_MAX), decided on the run's size, not a batch's; the processes end with the run,
    and the store is the one an in-process conversion gives."""
    import os

    from kbflow.convert import converters

    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: 'auto' converts in-process, there is no pool to see")
    monkeypatch.setattr(converters, "AUTO_WORKERS_MIN_FILES", 4)  # the four case documents are a "large" run here
    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "2")  # batches below the threshold: the run's size decides
    pools = []
    original = converters.ConversionPool.get
    monkeypatch.setattr(converters.ConversionPool, "get",
                        lambda self, workers, nice=0: pools.append(original(self, workers, nice)) or pools[-1])
    summary = run(docs_dir, tmp_path / "pool")
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0
    assert pools and all(len(pool.workers) == min(cores, converters.AUTO_WORKERS_MAX) for pool in pools)
    assert len({id(pool) for pool in pools}) == 1  # the run's one pool, for each of its batches
    assert not any(w.process.is_alive() for w in pools[-1].workers)

    monkeypatch.setenv("KBFLOW__CONVERT__WORKERS", "1")
    pools.clear()
    in_process = run(docs_dir, tmp_path / "one")
    assert not pools and in_process["store"]["count"] == summary["store"]["count"]
    assert snapshot(tmp_path / "one")[0] == snapshot(tmp_path / "pool")[0]


def test_the_embed_progress_counts_the_runs_texts_from_the_start_and_moves_per_model_call(docs_dir, tmp_path,
                                                                                          counting, monkeypatch):
    """The embed bar (and the progress artifact) get (texts embedded, texts to embed) for the whole run: the total
    is there before the first text is embedded and grows as batches are chunked, and the count moves with every
    model call (here 4 texts), not once per stage call."""
    from kbflow.runtime import progress

    monkeypatch.setenv("KBFLOW__FLOW__DOC_BATCH", "1")
    counting.max_batch = 4
    events = []
    with progress.listening(lambda stage, done, total: events.append((done, total)) if stage == "embed" else None):
        summary = run(docs_dir, tmp_path / "data")
    texts = summary["chunks"]["embedded"]
    assert texts >= 8 and events[-1] == (texts, texts)
    assert events[0][0] == 0 and events[0][1] > 0  # a total before anything was embedded
    done, totals = [d for d, _ in events], [t for _, t in events]
    assert done == sorted(done) and totals == sorted(totals) and all(d <= t for d, t in events)
    steps = [after - before for before, after in zip(done, done[1:]) if after > before]
    assert max(steps) <= 4 and len(steps) >= texts // 4, steps
