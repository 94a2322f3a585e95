"""Search modes, filters, KnowledgeBase, ask and the CLI over a real ingest of tests/cases/docs, on both stores."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from kbflow import KnowledgeBase
from kbflow.config import load_config
from kbflow.search import tokens
from kbflow.search.searcher import Searcher
from kbflow.search.tokens import words
from kbflow.state.manifest import NamespaceState
from tests.conftest import CASES
from kbflow.testing.fake_services import FakeServices


@pytest.fixture(scope="module")
def kbs(tmp_path_factory):
    """One data dir, two namespaces: LanceDB and Qdrant local mode (the vector cache is shared: one embedding)."""
    root = tmp_path_factory.mktemp("search")
    shutil.copytree(CASES / "docs", root / "docs")
    result = {}
    for kind in ("lancedb", "qdrant"):
        config_file = root / f"{kind}.yaml"
        config_file.write_text(yaml.safe_dump({"data_dir": str(root / "data"), "store": {"kind": kind}}))
        kb = KnowledgeBase(namespace=f"docs-{kind}", config=config_file)
        summary = kb.add_document(root / "docs")
        assert summary["documents"]["failed"] == 0 and summary["store"]["count"] > 5
        result[kind] = kb
    return result


@pytest.fixture(params=["lancedb", "qdrant"])
def kb(request, kbs):
    return kbs[request.param]


def test_vector_bm25_and_hybrid_find_the_right_document(kb):
    for mode in ("vector", "bm25", "hybrid"):
        hits = kb.search("how do I restore a backup", mode=mode, limit=3)
        assert hits[0].source_path == "docs/backups.md", (mode, [h.source_path for h in hits])
    chinese = kb.search("恢复数据库", mode="bm25", limit=3)
    assert chinese[0].source_path == "docs/chinese.md" and chinese[0].score > 0


def rrf_by_hand(ranked: dict[str, list[str]], k: int) -> dict[str, float]:
    """Reciprocal rank fusion (Cormack et al. 2009): score(d) = sum over the lists holding d of 1 / (k + rank of d),
    ranks counted from 1."""
    scores: dict[str, float] = {}
    for ids in ranked.values():
        for rank, chunk_id in enumerate(ids, 1):
            scores[chunk_id] = scores.get(chunk_id, 0.0) + 1.0 / (k + rank)
    return scores


def weighted_by_hand(scored: dict[str, list[tuple[str, float]]], weights: dict[str, float]) -> dict[str, float]:
    """Weighted min-max fusion: each list's scores scaled to (s - min) / (max - min) (all 1 when max == min), then
    score(d) = sum over the lists of weight * scaled score, 0 from a list that does not hold d."""
    scores: dict[str, float] = {}
    for name, pairs in scored.items():
        low, high = min(s for _, s in pairs), max(s for _, s in pairs)
        for chunk_id, score in pairs:
            scaled = 1.0 if high == low else (score - low) / (high - low)
            scores[chunk_id] = scores.get(chunk_id, 0.0) + weights[name] * scaled
    return scores


@pytest.mark.parametrize("fusion_kind", ["trusted", "weighted", "rrf"])
def test_hybrid_fuses_its_inputs(kb, fusion_kind):
    """The default (trusted: min-max at equal shares, BM25's share 0.8 of its half when its first ten hits share
    no chunk with the vector list's, full from three in common), weighted min-max (vector 0.5) and RRF (k=60),
    through the searcher as users call it; the expected scores are computed here from the two input lists, with
    the formulas written out above."""
    query = "restore the server from backups"
    searcher = kb.searcher
    default = searcher.config
    settings = default.search
    assert (settings.mode, settings.fusion, settings.vector_weight, settings.bm25_floor) == \
        ("hybrid", "trusted", 0.5, 0.8)
    assert (settings.rrf_k, settings.candidates) == (60, 50)
    searcher.config = default.model_copy(update={"search": settings.model_copy(update={"fusion": fusion_kind})})
    try:
        vector = kb.search(query, mode="vector", limit=50)  # hybrid's inputs: 50 candidates from each
        bm25 = kb.search(query, mode="bm25", limit=50)
        hybrid = kb.search(query, limit=5)  # the configured mode: hybrid; 5 of the corpus's few chunks
    finally:
        searcher.config = default
    assert vector and bm25
    if fusion_kind == "rrf":
        by_hand = rrf_by_hand({"vector": [h.chunk_id for h in vector], "bm25": [h.chunk_id for h in bm25]}, k=60)
    else:
        share = 0.5
        if fusion_kind == "trusted":
            common = len({h.chunk_id for h in vector[:10]} & {h.chunk_id for h in bm25[:10]})
            share = 0.5 * (0.8 + 0.2 * min(1.0, common / 3))
        by_hand = weighted_by_hand({"vector": [(h.chunk_id, h.score) for h in vector],
                                    "bm25": [(h.chunk_id, h.score) for h in bm25]},
                                   {"vector": 1 - share, "bm25": share})
    assert len({h.chunk_id for h in hybrid}) == len(hybrid) == min(5, len(by_hand))
    for hit in hybrid:  # every returned hit carries the score its inputs give it
        assert hit.score == pytest.approx(by_hand[hit.chunk_id]), hit.chunk_id
    # and they are the best of all candidates, best first (equal scores may come in either order)
    assert [h.score for h in hybrid] == pytest.approx(sorted(by_hand.values(), reverse=True)[:len(hybrid)])


def test_min_score_and_filters(kb):
    hits = kb.search("backup", mode="vector", limit=20, min_score=0.3)
    assert hits and all(h.score >= 0.3 for h in hits)
    assert len(hits) < len(kb.search("backup", mode="vector", limit=20))
    only_search = kb.search("backup", mode="hybrid", limit=20, source_glob="*/search.md")
    assert only_search and {h.source_path for h in only_search} == {"docs/search.md"}
    under = kb.search("backups", mode="bm25", limit=20, heading_prefix=["Backups", "Retention"])
    assert under and all(h.heading_path[:2] == ["Backups", "Retention"] for h in under)


def test_both_stores_rank_bm25_alike(kbs):
    for query in ("恢复数据库", "filters heading", "weekly backups"):
        lance = [h.text for h in kbs["lancedb"].search(query, mode="bm25", limit=3)]  # ids differ per namespace
        qdrant = [h.text for h in kbs["qdrant"].search(query, mode="bm25", limit=3)]
        assert lance[0] == qdrant[0], query


@pytest.fixture
def llm(monkeypatch):
    with FakeServices(key="test-key") as service:
        monkeypatch.setenv("OPENAI_BASE_URL", service.url + "/v1")
        monkeypatch.setenv("OPENAI_API_KEY", service.key)
        yield service


def test_ask_cites_numbered_sources(kbs, llm):
    def answer(messages):
        prompt = messages[-1]["content"]
        assert "[1] docs/" in prompt and prompt.rstrip().endswith("Question: How do I restore a backup?")
        return "Stop the server and copy the files back [1][2]. See also [9]."

    llm.chat_responder = answer
    result = kbs["lancedb"].ask("How do I restore a backup?", mode="hybrid")
    assert result["answer"].startswith("Stop the server")
    assert result["cited"] == [1, 2] and result["unknown_citations"] == [9]
    assert result["sources"][0]["source_path"] == "docs/backups.md"
    assert result["sources"][0]["heading_path"][0] == "Backups"


def test_mqe_and_hyde_go_through_the_chat_model(kbs, llm):
    llm.chat_responder = lambda messages: ("1. restoring backups\n2. copy files back after stopping the server"
                                           if "search queries" in messages[-1]["content"]
                                           else "To restore a backup, stop the server and copy the files back.")
    kb = kbs["qdrant"]
    mqe = kb.search("recover data", mode="vector", expand="mqe", limit=3)
    assert mqe[0].extra["phrasings"] == ["recover data", "restoring backups", "copy files back after stopping the server"]
    assert mqe[0].source_path == "docs/backups.md"
    hyde = kb.search("recover data", mode="hybrid", expand="hyde", limit=3)
    assert hyde[0].source_path == "docs/backups.md" and hyde[0].extra["hyde"].startswith("To restore")
    assert len(llm.requests) == 2


def test_cli_search_modes_and_ask_without_llm(kbs, tmp_path, monkeypatch):
    kb = kbs["lancedb"]
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    base = [sys.executable, "-m", "kbflow.cli"]
    config_file = tmp_path / "kb.yaml"
    config_file.write_text(yaml.safe_dump(kb.config.model_dump(mode="json")), encoding="utf-8")
    config = ["--config", str(config_file), "--namespace", kb.namespace]
    run = subprocess.run([*base, "search", "每天晚上备份", "--mode", "bm25", "--json", *config],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)[0]["source_path"] == "docs/chinese.md"
    run = subprocess.run([*base, "ask", "How do I restore?", *config], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 2 and "OPENAI_BASE_URL and OPENAI_API_KEY" in run.stderr.replace("\n", " ")
    run = subprocess.run([*base, "search", "x", "--mode", "semantic", *config], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 2 and "unknown" in run.stderr


def test_writes_reopen_the_searcher(kbs):
    kb = kbs["lancedb"]
    assert words("zebrafish") == ["zebrafish"] and kb.search("zebrafish", mode="bm25") == []
    kb.add_text("Zebrafish regenerate their fins.", doc_id="fish")
    assert kb.search("zebrafish", mode="bm25")[0].source_path == "text:fish"
    assert kb.stats()["chunks"] == kb.searcher.stats()["rows"]


@pytest.mark.parametrize("kind", ["lancedb", "qdrant"])
def test_bm25_matches_other_forms_of_a_word_in_the_terms_its_rows_were_written_with(tmp_path, kind):
    """Stemmed terms on both stores: a question's 'connections' finds a passage's 'connecting'. A namespace whose
    rows hold an older tokenizer's words (its record names none) is asked in plain words until an ingest has
    rewritten every row, which records the new version."""
    config_file = tmp_path / "kb.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "store": {"kind": kind}}))
    kb = KnowledgeBase(namespace="stems", config=config_file)
    kb.add_text("Connecting replicas: each standby streams the primary's write-ahead log.", doc_id="replicas")
    kb.add_text("Vacuum reclaims storage occupied by dead tuples.", doc_id="vacuum")
    state = NamespaceState(tmp_path / "data", "stems")
    assert state.meta()["bm25_terms"] == tokens.TOKENIZER_VERSION and kb.searcher.terms is tokens.terms
    assert [h.source_path for h in kb.search("connections to a replica", mode="bm25")] == ["text:replicas"]
    if kind == "lancedb":  # the end of each ingest folds every row into the full-text index
        assert kb.searcher.store.stats()["indexes"]["text_tokens"]["unindexed_rows"] == 0
    assert kb.search("the of and is", mode="bm25") == []  # only stop words: nothing to match, no error
    meta = state.meta()
    del meta["bm25_terms"]  # as a namespace written before terms were recorded
    state.write_meta(meta)
    served = Searcher(load_config(config_file), "stems")  # a long-lived reader, as `kbflow mcp` holds one
    assert served.terms is tokens.words
    assert served.search("connections", mode="bm25") == []  # plain words do not meet the stored stems
    writer = KnowledgeBase(namespace="stems", config=config_file)  # another writer, as a scheduled ingest
    writer.add_text("Checkpoints flush dirty pages.", doc_id="checkpoints")  # every row now holds the new terms
    assert state.meta()["bm25_terms"] == tokens.TOKENIZER_VERSION
    assert [h.source_path for h in served.search("connections", mode="bm25")] == ["text:replicas"]
    assert served.terms is tokens.terms


def test_eval_scores_several_modes_over_one_ingest(tmp_path):
    from kbflow.core.errors import ConfigError
    from kbflow import api
    from kbflow.engine.evaluate import eval_beir

    result = eval_beir(CASES / "beir-mini", data_dir=tmp_path / "data", modes=["vector", "bm25", "hybrid"],
                       ingest=api.ingest)
    runs = {run["mode"]: run for run in result["runs"]}
    assert list(runs) == ["vector", "bm25", "hybrid"] and result["metrics"] == runs["vector"]["metrics"]
    assert runs["hybrid"]["metrics"]["recall@100"] == 1.0  # the vector list reaches every document
    assert runs["bm25"]["metrics"]["mrr@10"] > 0
    again = eval_beir(CASES / "beir-mini", data_dir=tmp_path / "data", modes=["bm25"], ingest=None)
    assert again["subset"] == {"documents": 5, "of_documents": 5}
    assert again["runs"][0]["metrics"] == runs["bm25"]["metrics"]
    with pytest.raises(ConfigError, match="holds none of the corpus"):
        eval_beir(CASES / "beir-mini", data_dir=tmp_path / "empty", ingest=None)


def test_a_searcher_opened_before_the_namespace_existed_finds_what_another_process_ingests(tmp_path):
    """`kbflow mcp` may start before the first scheduled ingest: its searcher answers [] until then, and the hits
    once another process has written the namespace, without a restart."""
    config_file = tmp_path / "kb.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))
    served = KnowledgeBase(namespace="later", config=config_file)
    assert served.search("dirty pages") == []
    subprocess.run([sys.executable, "-m", "kbflow", "add-text", "Checkpoints flush dirty pages.", "--doc-id",
                    "checkpoints", "--namespace", "later", "-c", str(config_file)], check=True, capture_output=True)
    assert [h.source_path for h in served.search("dirty pages")] == ["text:checkpoints"]
    subprocess.run([sys.executable, "-m", "kbflow", "add-text", "Vacuum reclaims dead tuples.", "--doc-id",
                    "vacuum", "--namespace", "later", "-c", str(config_file)], check=True, capture_output=True)
    assert [h.source_path for h in served.search("reclaim dead tuples", mode="vector")][:1] == ["text:vacuum"]


def test_a_long_lived_searcher_follows_a_clear_and_a_namespace_made_again_with_another_model(tmp_path, monkeypatch):
    """`kbflow mcp` keeps its searcher for days. When another process clears the namespace, searches answer [];
    when it is ingested again with another model of the same dimension (MiniLM, then e5: both 384-d), queries are
    embedded by the new model, never by the old one into the new vectors."""
    monkeypatch.delenv("KBFLOW__EMBEDDER__BACKEND", raising=False)  # embedder.backend auto: the namespace's own
    config_file = tmp_path / "kb.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data")}))

    def kbflow(*argv: str, backend: str) -> None:
        subprocess.run([sys.executable, "-m", "kbflow", *argv, "--namespace", "remade", "-c", str(config_file)],
                       check=True, capture_output=True, env={**os.environ, "KBFLOW__EMBEDDER__BACKEND": backend})

    texts = {"checkpoints": "Checkpoints flush dirty pages to disk.", "vacuum": "Vacuum reclaims dead tuples.",
             "tea": "Green tea wants water at eighty degrees."}
    folder = tmp_path / "docs"
    folder.mkdir()
    for name, text in texts.items():
        (folder / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
    kbflow("ingest", str(folder), backend="local")
    served = KnowledgeBase(namespace="remade", config=config_file)
    assert served.search("reclaim dead tuples", mode="vector")[0].source_path.endswith("vacuum.txt")
    assert served.searcher.embedder.model_id.startswith("st:")
    kbflow("clear", "--yes", backend="local")
    assert served.search("reclaim dead tuples") == []
    kbflow("ingest", str(folder), backend="e5")
    hits = served.search("reclaim dead tuples", mode="vector")
    assert served.searcher.embedder.model_id.startswith("e5small-")
    # the query in e5's space: the cosine e5 gives the pair (MiniLM's query vector against e5's would score ~0)
    expected = float(served.searcher.embedder.embed_passages([hits[0].text])[0]
                     @ served.searcher.embedder.embed_query("reclaim dead tuples"))
    assert hits[0].source_path.endswith("vacuum.txt") and abs(hits[0].score - expected) < 1e-3, (hits[0].score,
                                                                                               expected)
