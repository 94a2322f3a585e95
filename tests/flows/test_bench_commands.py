"""`kbflow bench ...` checks its arguments before any work and runs on the shipped default backend (a bench that
crashes after ten minutes, or only works with one model, measures nothing)."""

from __future__ import annotations

import json
import shutil
import time

import pytest
from typer.testing import CliRunner

from kbflow.cli.main import app
from kbflow.embed.e5 import auto_precision
from tests.conftest import CASES


def invoke(*args: str):
    started = time.perf_counter()
    result = CliRunner().invoke(app, ["bench", *args], terminal_width=200)
    return result, time.perf_counter() - started


@pytest.mark.parametrize("args, message", [
    (["ingest", "--corpus", "/no/such/corpus"], "neither a folder nor a tar archive"),
    (["memory", "--corpus", "/no/such/corpus"], "neither a folder nor a tar archive"),
    (["search", "--corpus", "/no/such/corpus"], "neither a folder nor a tar archive"),
    (["chunk", "--corpus", "/no/such/corpus"], "neither a folder nor a tar archive"),
    (["embed", "--corpus", "/no/such/corpus", "--backends", "nope"], "unknown backend"),
    (["embed", "--corpus", str(CASES / "docs"), "--provider", "nope"], "--provider 'nope'"),
    (["embed", "--corpus", str(CASES / "docs"), "--provider", "dashscope", "--faults", "1:429"], "--faults item"),
    (["overhead", "--corpus", "/no/such/corpus"], "is not a folder"),
    (["search", "--clients", "1,6"], "--clients needs --sample"),
    (["search", "--sample", str(CASES / "docs"), "--clients", "one,six"], "not a list of client counts"),
])
def test_a_bad_argument_is_refused_before_any_work(args, message):
    result, seconds = invoke(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output.replace("\n", " ") and seconds < 10


def test_update_to_with_another_top_folder_is_refused_before_the_full_phase(tmp_path):
    for name in ("a/docs", "b/other"):
        shutil.copytree(CASES / "docs", tmp_path / name)
    result, seconds = invoke("ingest", "--corpus", str(tmp_path / "a" / "docs"), "--update-to",
                             str(tmp_path / "b" / "other"), "--out", str(tmp_path / "out.json"))
    assert result.exit_code == 2 and "differs from --corpus's 'docs'" in result.output and seconds < 10
    assert not (tmp_path / "out.json").exists()


def test_bench_ingest_runs_on_the_shipped_default_backend(tmp_path, own_backend):
    for version in ("a", "b"):
        shutil.copytree(CASES / "docs", tmp_path / version / "docs")
    (tmp_path / "b" / "docs" / "backups.md").write_text("# Backups\n\nBack up every hour now.\n", encoding="utf-8")
    (tmp_path / "b" / "docs" / "search.md").unlink()
    out = tmp_path / "ingest.json"
    result, _ = invoke("ingest", "--corpus", str(tmp_path / "a" / "docs"), "--update-to", str(tmp_path / "b" / "docs"),
                       "--out", str(out), "--work-dir", str(tmp_path / "work"), "--json")
    assert result.exit_code == 0, result.output
    measured = json.loads(out.read_text())
    assert measured["model_id"].startswith(f"e5small-torch-{auto_precision()}:")  # the default, not the suite's MiniLM
    phases = {phase["phase"]: phase for phase in measured["phases"]}
    assert phases["full"]["texts_embedded"] > 0 and phases["rerun"]["texts_embedded"] == 0
    # the no-op re-run again as a user runs it: a fresh `kbflow ingest` process, embedding nothing
    assert phases["rerun-process"]["texts_embedded"] == 0 and phases["rerun-process"]["store_count"] == \
        phases["full"]["store_count"] and phases["rerun-process"]["wall_s"] > phases["rerun"]["wall_s"]
    assert 0 < phases["update"]["texts_embedded"] < phases["full"]["texts_embedded"]
    assert phases["update"]["documents"]["removed"] == 1
    assert all(phase["peak_rss_mb"] > 0 for phase in phases.values())
    assert measured["floor"]["texts"] == phases["full"]["texts_embedded"]
    ratios = measured["ratios"]
    assert ratios["update_store_equals_fresh"] is True and ratios["rerun_texts_embedded"] == 0
    assert ratios["update_over_full"] == round(phases["update"]["wall_s"] / phases["full"]["wall_s"], 4)


def test_bench_search_records_recall_and_latency_for_every_ann_setting_it_tried(tmp_path, own_backend):
    """Issue 22: the ANN defaults are chosen from a sweep that `bench search` records whole (every variant)."""
    from kbflow.bench.search import ANN_GRID

    out = tmp_path / "search.json"
    result, _ = invoke("search", "--corpus", str(CASES / "docs"), "--size", "600", "--store", "lancedb",
                       "--real-vectors", "5", "--queries", "12", "--out", str(out), "--work-dir", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    run = json.loads(out.read_text())["runs"][0]
    assert run["rows"] == 600 and run["vector_index_type"] == "IVF_FLAT"
    assert run["vector_index_name"] == "vector_ivf24"  # sqrt(600) partitions
    sweep = run["ann_sweep"]
    assert [(s["nprobes"], s["ef"], s["refine_factor"]) for s in sweep] == ANN_GRID
    assert all(0.0 <= s["recall@10"] <= 1.0 and s["p50_ms"] > 0 for s in sweep)
    # the configured setting is one of the grid's: its recall in the sweep is the run's own
    own = next(s for s in sweep
               if (s["nprobes"], s["ef"], s["refine_factor"]) == (run["ann_nprobes"], run["ann_ef"], run["ann_refine_factor"]))
    assert own["recall@10"] == run["ann_recall@10"]


def test_bench_search_clients_times_mcp_search_from_concurrent_sessions_beside_in_process_search(tmp_path,
                                                                                                monkeypatch):
    """A real `kbflow mcp --http` server and real MCP client sessions, tiny: 1 then 2 clients, 3 calls each."""
    import kbflow.bench.mcp_clients

    token = "bench-token-for-this-test-only-0123456789"
    monkeypatch.setattr(kbflow.bench.mcp_clients.secrets, "token_urlsafe", lambda size: token)
    out = tmp_path / "clients.json"
    result, _ = invoke("search", "--sample", str(CASES / "docs"), "--clients", "1,2", "--calls", "3", "--rounds", "1",
                       "--out", str(out), "--work-dir", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    measured = json.loads(out.read_text())
    assert measured["namespace_chunks"] > 0 and measured["cpu_count"] >= 1 and measured["load_avg_1m"] >= 0
    reference = measured["in_process"]
    assert reference["queries"] == (1 + 2) * 3 and 0 < reference["p50_ms"] < 60_000
    rows = measured["mcp_search"]
    assert [(row["clients"], row["queries"]) for row in rows] == [(1, 3), (2, 6)]
    for row in rows:
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] < 60_000
        assert row["overhead_p50_ms"] == round(row["p50_ms"] - reference["p50_ms"], 3)
    assert (tmp_path / "clients.png").stat().st_size > 0
    assert token not in result.output and token not in out.read_text()  # the run's token stays secret


def test_bench_chunk_measures_an_update_that_reuses_the_unchanged_sections_plans(tmp_path):
    out = tmp_path / "chunk.json"
    result, _ = invoke("chunk", "--corpus", str(CASES / "docs"), "--mb", "0.05", "--out", str(out))
    assert result.exit_code == 0, result.output
    update = json.loads(out.read_text())["chunk_update"]
    assert update["identical_to_a_fresh_chunking"] is True and update["documents_compared"] >= 4
    # each edit touches one section: those are planned again, and only those
    assert 0 < update["sections_planned_again"] <= update["blocks_edited"] < update["sections"]
