"""A run whose chunks look wrong says so, naming the document: in the summary (`--json`: chunk_quality) and on the
terminal after the summary table."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_an_ingest_warns_of_a_punctuation_only_chunk_naming_its_document(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fine.md").write_text("# Backups\n\nBack up the database every night.\n", encoding="utf-8")
    # a thematic break makes the bullets a section of their own: one chunk with no word in it
    (docs / "dots.md").write_text("# Notes\n\nKeep seven daily copies.\n\n* * *\n\n• • • • • • • •\n", encoding="utf-8")
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    data = str(tmp_path / "data")
    shown = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", str(docs), "--data-dir", data],
                           capture_output=True, text=True, env=env, timeout=600)
    assert shown.returncode == 0, shown.stderr
    warnings = [line for line in shown.stderr.splitlines() if line.startswith("warning chunks:")]
    assert len(warnings) == 1 and "docs/dots.md: 1 of 2 chunks hold only punctuation" in warnings[0], shown.stderr
    (docs / "dots.md").write_text("# Notes\n\nKeep seven daily copies, and one more.\n", encoding="utf-8")
    again = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", str(docs), "--data-dir", data, "--json"],
                           capture_output=True, text=True, env=env, timeout=600)
    quality = json.loads(again.stdout)["chunk_quality"]
    assert quality["documents"] == 1 and quality["punctuation_only"] == 0 and quality["warnings"] == []
