"""The graph stage in real ingests (Prefect flow runs against the session's test server) of four real PostgreSQL
manual pages that link to each other, and graph search over what it stored (issue 21, points 1 and 2)."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import pyarrow as pa
import pytest

from kbflow import api
from kbflow.core.errors import ConfigError
from kbflow.graph.store import GraphStore
from kbflow.ops.prune import prune
from kbflow.config import load_config
from kbflow.core.schemas import MANIFEST
from kbflow.search.searcher import Searcher, embed_query
from kbflow.state.manifest import NamespaceState
from kbflow.stores import SearchFilter
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES

PRESET = "graph/runtime-config-preset.html"


@pytest.fixture
def manual(tmp_path):
    target = tmp_path / "graph"
    shutil.copytree(CASES / "graph", target)
    return target


def _edges(data_dir) -> list[dict]:
    return GraphStore(data_dir / "lancedb", "default").rows().to_pylist()


def test_the_graph_is_built_with_the_chunks_and_kept_current_document_by_document(manual, tmp_path, monkeypatch,
                                                                                  counting):
    data = tmp_path / "data"
    plain = api.ingest([str(manual)], data_dir=data)
    assert "graph" not in plain and not GraphStore(data / "lancedb", "default").exists()

    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    counting.texts_embedded = 0
    first = api.ingest([str(manual)], data_dir=data)  # turning the graph on re-processes each document once
    assert first["documents"]["changed"] == 4 and counting.texts_embedded == 0 and first["chunks"]["written"] == 0
    edges = _edges(data)
    assert first["graph"]["edges_written"] == len(edges) == sum(first["graph"]["edges"].values())
    assert {"link", "defines", "heading"} <= set(first["graph"]["edges"])
    link = [e for e in edges if e["kind"] == "link" and e["source_path"] == "graph/checksums.html"
            and e["anchor"] == "GUC-DATA-CHECKSUMS"]
    assert [(e["target"], e["label"]) for e in link] == [(PRESET, "data_checksums")]
    assert any(e["kind"] == "defines" and e["target"] == "data checksums" and e["source_path"] == PRESET
               for e in edges)
    runs = data / "runs" / "default" / first["run_id"] / "graph"
    assert sorted(p.name for p in runs.iterdir()) == ["part-00000.parquet"]  # the run's graph snapshot

    again = api.ingest([str(manual)], data_dir=data)
    assert again["documents"]["unchanged"] == 4 and again["graph"]["edges_written"] == 0 and _edges(data) == edges

    # one page changes: its edges are replaced, the others' stay as they were
    page = manual / "checksums.html"
    page.write_text(page.read_text(encoding="utf-8").replace('href="runtime-config-preset.html#GUC-DATA-CHECKSUMS"',
                                                             'href="sql-altersystem.html"'), encoding="utf-8")
    changed = api.ingest([str(manual)], data_dir=data)
    assert changed["documents"]["changed"] == 1
    after = _edges(data)
    assert not any(e["anchor"] == "GUC-DATA-CHECKSUMS" and e["source_path"] == "graph/checksums.html" for e in after)
    assert any(e["source_path"] == "graph/checksums.html" and e["target"] == "graph/sql-altersystem.html"
               for e in after)
    assert [e for e in after if e["source_path"] != "graph/checksums.html"] == \
        [e for e in edges if e["source_path"] != "graph/checksums.html"]

    # a removed page's edges go with it
    (manual / "sql-altersystem.html").unlink()
    removed = api.ingest([str(manual)], data_dir=data)
    assert removed["documents"]["removed"] == 1
    assert not any(e["source_path"] == "graph/sql-altersystem.html" for e in _edges(data))

    # every replace added a table version: prune compacts the graph's table, its edges unchanged
    kept = _edges(data)
    report = prune(load_config(data_dir=data), keep_runs=1, versions_older_than=timedelta(0))
    assert report["tables"]["graph_default"]["versions_before"] > 1 == report["tables"]["graph_default"]["versions_after"]
    assert _edges(data) == kept

    # turned off: every document is re-processed once and the graph is emptied, nothing is embedded
    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "false")
    counting.texts_embedded = 0
    off = api.ingest([str(manual)], data_dir=data)
    assert off["documents"]["changed"] == 3 and counting.texts_embedded == 0 and _edges(data) == []
    assert set(NamespaceState(data, "default").read_manifest().column("graph").to_pylist()) == {""}
    api.clear("default", data_dir=data)
    assert not GraphStore(data / "lancedb", "default").exists()


def test_graph_search_follows_links_and_says_why_each_hit_was_returned(manual, tmp_path, monkeypatch):
    data = tmp_path / "data"
    api.ingest([str(manual)], data_dir=data)
    with pytest.raises(ConfigError, match="graph.enabled"):
        api.search("data checksums", data_dir=data, mode="graph")

    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    api.ingest([str(manual)], data_dir=data)
    monkeypatch.setenv("KBFLOW__GRAPH__SEEDS", "1")
    monkeypatch.setenv("KBFLOW__GRAPH__INSERT_AFTER", "1")
    monkeypatch.setenv("KBFLOW__GRAPH__SLOTS", "3")
    question = "Are data pages of a cluster protected by checksums?"
    hits = api.search(question, data_dir=data, mode="graph", limit=50)
    hybrid = api.search(question, data_dir=data, mode="hybrid", limit=50)
    assert all(h.extra.get("path") and h.to_dict()["path"] == h.extra["path"] for h in hits)  # every hit says why
    seed = hits[0] if hits[0].source_path == "graph/checksums.html" else None
    assert seed is not None, [h.source_path for h in hits[:3]]
    # hybrid's first hit keeps its place, three chunks reached by a hop follow, then the rest of hybrid's hits in
    # their order: the graph never reorders hybrid's hits
    assert hits[0].chunk_id == hybrid[0].chunk_id
    followed = hits[1:4]
    assert all(len(h.extra["path"]) == 2 for h in followed), [h.extra["path"] for h in hits[:5]]
    inserted = {h.chunk_id for h in followed}
    assert [h.chunk_id for h in hits[4:]] == [h.chunk_id for h in hybrid[1:] if h.chunk_id not in inserted][:46]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].extra["path"] == [f"hit #1 for the query (vector #{hits[0].extra['vector_rank']}, "
                                     f"bm25 #{hits[0].extra['bm25_rank']})"]
    named = [h for h in followed if "data_checksums` (`boolean`)" in h.text]
    assert named and named[0].extra["path"][1].startswith(
        f"links to {PRESET}#GUC-DATA-CHECKSUMS 'data_checksums', which names: {PRESET}")
    assert named[0].extra["path"][0].startswith("hit #1 for the query: graph/checksums.html")
    assert "graph_rank" in named[0].extra

    # an entity the query names: the chunk defining it is a seed, whatever the vector and BM25 lists hold
    searcher = Searcher(load_config(None, data_dir=data), "default")
    query = "data_directory_mode"
    reached = searcher.expander.expand(query, embed_query(searcher.embedder, query), [], None)
    seeds = [h for h in reached if h.extra["path"][0].startswith("defines 'data_directory_mode', named in the query")]
    assert seeds and seeds[0].source_path == PRESET


def test_eval_on_source_files_keeps_their_links_for_graph_search(tmp_path, monkeypatch):
    """A BEIR corpus row with ``file`` is that source file, copied under its relative path (its links resolve as in
    the manual), so `kbflow eval --mode graph` measures the graph built from real pages; a file outside the folder
    is refused."""
    from kbflow.engine.evaluate import eval_beir

    beir = tmp_path / "relset"
    shutil.copytree(CASES / "graph", beir / "files")
    pages = sorted(p.name for p in (beir / "files").iterdir())
    (beir / "corpus.jsonl").write_text("".join(json.dumps({"_id": name, "title": "", "text": "",
                                                           "file": f"files/{name}"}) + "\n" for name in pages))
    (beir / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "How can I tell whether the data pages "
                                                    "of my cluster carry checksums?"}) + "\n")
    (beir / "qrels").mkdir()
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\truntime-config-preset.html\t1\n")
    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    result = eval_beir(beir, data_dir=tmp_path / "data", modes=["hybrid", "graph"], ingest=api.ingest)
    assert result["documents"] == 4 and [run["mode"] for run in result["runs"]] == ["hybrid", "graph"]
    assert all(run["metrics"]["recall@10"] == 1.0 for run in result["runs"])  # four pages: both find it
    stored = GraphStore(tmp_path / "data" / "lancedb", result["namespace"]).rows().to_pylist()
    assert any(e["anchor"] == "GUC-DATA-CHECKSUMS" and e["target"] == "corpus/files/runtime-config-preset.html"
               for e in stored)

    (beir / "corpus.jsonl").write_text(json.dumps({"_id": "x", "file": "../outside.html"}) + "\n")
    with pytest.raises(ConfigError, match="not a file inside"):
        eval_beir(beir, data_dir=tmp_path / "data2", modes=["hybrid"], ingest=api.ingest)


def test_entities_and_relations_from_the_chat_model_are_extracted_once_per_text_and_followed(manual, tmp_path,
                                                                                              monkeypatch):
    """graph.llm_extract through a real OpenAI-compatible HTTP server on 127.0.0.1 with scripted replies: one call
    per chunk text never extracted before; a reply that is not the JSON asked for fails that chunk (its document
    keeps its stored version, the failure is in the run's snapshot) and the next run sends only that text; the
    relations are followed by graph search, and say so in the hit's path."""
    from kbflow.testing.fake_services import FakeServices
    from kbflow.core.schemas import FAILURES
    from kbflow.state.snapshots import read_table

    import threading
    import time

    data = tmp_path / "data"
    calls: list[str] = []
    broken = {"on": True}
    in_flight = {"now": 0, "most": 0}
    lock = threading.Lock()

    def respond(messages):
        assert messages[0]["content"].startswith("You extract a knowledge graph")
        passage = messages[-1]["content"]
        with lock:
            calls.append(passage)
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
        time.sleep(0.05)  # long enough for the next requests to arrive while this one is answered
        with lock:
            in_flight["now"] -= 1
        if "config_file" in passage and broken["on"]:
            return "Sure! The passage talks about configuration files."
        facts = {"entities": [], "relations": []}
        if "ALTER SYSTEM" in passage:
            facts["entities"].append({"name": "ALTER SYSTEM", "type": "command"})
        if "checksum" in passage.lower():
            facts["entities"].append({"name": "data checksums", "type": "feature"})
            facts["relations"].append({"source": "data checksums", "relation": "configured with",
                                       "target": "ALTER SYSTEM"})
        return json.dumps(facts)

    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    monkeypatch.setenv("KBFLOW__GRAPH__LLM_EXTRACT", "true")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigError, match="no LLM configured"):  # before anything is converted or written
        api.ingest([str(manual)], data_dir=data)
    assert api.stats(data_dir=data)["documents"] == 0
    with FakeServices(key="test-key") as service:
        monkeypatch.setenv("OPENAI_BASE_URL", service.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", service.key)
        service.chat_responder = respond
        first = api.ingest([str(manual)], data_dir=data)
        texts = first["chunks"]["total"]
        assert first["graph"]["llm_calls"] == len(calls) > 0
        assert in_flight["most"] > 1  # graph.llm_workers requests at once to a remote model
        failed = [f for f in first["failures"] if f["stage"] == "graph"]
        assert {f["error_type"] for f in failed} == {"PermanentError", "GraphIncomplete"}
        assert [f["source_path"] for f in failed if f["error_type"] == "GraphIncomplete"] == \
            ["graph/runtime-config-file-locations.html"]
        snapshot = read_table(data / "runs" / "default" / first["run_id"] / "failures.parquet", FAILURES)
        assert "not the JSON object asked for" in " ".join(snapshot.column("message").to_pylist())
        assert first["documents"]["failed"] == 1
        searchable = api.search("config_file", data_dir=data, mode="bm25", limit=3)  # stored, searchable
        assert searchable and searchable[0].source_path == "graph/runtime-config-file-locations.html"
        manifest = NamespaceState(data, "default").read_manifest().to_pylist()
        assert {row["source_path"]: row["graph"].endswith("!incomplete") for row in manifest} == {
            "graph/checksums.html": False, "graph/runtime-config-file-locations.html": True,
            "graph/runtime-config-preset.html": False, "graph/sql-altersystem.html": False}
        kinds = {e["kind"] for e in _edges(data)}
        assert {"entity", "relation", "link"} <= kinds
        assert all(e["extractor"].startswith("llm:openai:") for e in _edges(data) if e["kind"] in ("entity",
                                                                                                   "relation"))

        broken["on"] = False
        sent_before = len(calls)
        second = api.ingest([str(manual)], data_dir=data)
        retried = calls[sent_before:]
        assert second["documents"]["changed"] == 1 and second["chunks"]["embedded"] == 0  # only the failed one
        assert retried and all("config_file" in passage for passage in retried)  # only the texts that failed
        assert second["failures"] == [] and texts > len(retried)
        third = api.ingest([str(manual)], data_dir=data)
        assert third["graph"]["llm_calls"] == 0 and len(calls) == sent_before + len(retried)
        report = prune(load_config(data_dir=data), keep_runs=1, versions_older_than=timedelta(0))
        facts = [name for name in report["tables"] if name.startswith("graph_facts_")]
        assert len(facts) == 1 and report["tables"][facts[0]]["versions_before"] > 1 == \
            report["tables"][facts[0]]["versions_after"]

        monkeypatch.setenv("KBFLOW__GRAPH__SLOTS", "10")  # every chunk a hop reached, in this small manual
        hits = api.search("Are data pages protected by checksums?", data_dir=data, mode="graph", limit=50)
        related = [h for h in hits if h.source_path == "graph/sql-altersystem.html"
                   and any("states 'data checksums —configured with→ ALTER SYSTEM'" in step
                           for step in h.extra["path"])]
        assert related, [h.extra["path"] for h in hits]


def test_verify_finds_edges_without_their_chunks_and_edges_of_documents_ingested_with_the_graph_off(manual, tmp_path,
                                                                                                     monkeypatch):
    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    data = tmp_path / "data"
    api.ingest([str(manual)], data_dir=data)
    report = api.verify("default", data_dir=data)
    assert report["ok"], report["findings"]
    edges = _edges(data)
    assert report["counts"]["graph_edges"] == len(edges) > 0

    state = NamespaceState(data, "default")
    manifest = {row["source_path"]: row for row in state.read_manifest().to_pylist()}
    checksums, preset = manifest["graph/checksums.html"], manifest[PRESET]
    # 1. the chunks of one page gone from the store, its edges left behind
    LanceStore(data / "lancedb", state.store_namespace(), state.meta()["dimension"]).table.delete(
        f"doc_id = '{checksums['doc_id']}'")
    # 2. a page whose manifest row says the graph stage was off, with edges in the graph
    state.update_manifest(pa.Table.from_pylist([{**preset, "graph": ""}], schema=MANIFEST), [])

    report = api.verify("default", data_dir=data)
    found = {finding["check"]: finding["doc_ids"] for finding in report["findings"]}
    assert found["graph"] == [checksums["doc_id"]] and found["graph-off"] == [preset["doc_id"]]

    repaired = api.verify("default", data_dir=data, repair=True)
    assert repaired["repaired"]["documents_forgotten"] == 2
    assert not any(e["doc_id"] in (checksums["doc_id"], preset["doc_id"]) for e in _edges(data))
    rerun = api.ingest([str(manual)], data_dir=data)
    assert rerun["documents"]["new"] == 2 and api.verify("default", data_dir=data)["ok"]
    assert _edges(data) == edges


def test_a_sphinx_manual_has_no_permalink_edges_and_its_links_name_the_definitions(tmp_path, monkeypatch):
    """Two real pages of the Python 3.11 manual (Sphinx): glob.html links to fnmatch.html#fnmatch.fnmatch."""
    shutil.copytree(CASES / "sphinx", tmp_path / "py")
    monkeypatch.setenv("KBFLOW__GRAPH__ENABLED", "true")
    data = tmp_path / "data"
    api.ingest([str(tmp_path / "py")], data_dir=data)
    edges = _edges(data)
    assert not any("¶" in e["label"] or "Permalink" in e["label"] for e in edges)  # the pilcrow self-links are gone
    defined = {e["target"] for e in edges if e["kind"] == "defines" and e["source_path"] == "py/fnmatch.html"}
    assert {"fnmatch fnmatch", "fnmatch fnmatchcase", "fnmatch filter", "fnmatch translate"} <= defined
    link = next(e for e in edges if e["kind"] == "link" and e["anchor"] == "fnmatch.fnmatch")
    assert link["source_path"] == "py/glob.html" and link["target"] == "py/fnmatch.html"

    searcher = Searcher(load_config(None, data_dir=data), "default")
    query = "Which function matches a file name against a pattern?"
    vector = embed_query(searcher.embedder, query)
    seed = searcher.store.search_vector(vector, 1, SearchFilter(chunk_ids=(link["chunk_id"],)), exact=True)
    reached = searcher.expander.expand(query, vector, seed, None)
    named = [h for h in reached if h.extra["path"][-1].startswith(
        "links to py/fnmatch.html#fnmatch.fnmatch 'fnmatch.fnmatch() | fnmatch.fnmatch', which names: "
        "py/fnmatch.html § `fnmatch` — Unix filename pattern matching")]
    assert named and "fnmatch.fnmatch(*filename*, *pattern*)" in named[0].text, [h.extra["path"] for h in reached]
