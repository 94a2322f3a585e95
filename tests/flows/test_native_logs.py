"""No third-party log line reaches the user's terminal unasked: a CLI ingest that trains a vector index (LanceDB's
k-means logs a WARN per training round when clusters stay empty) prints kbflow's own output only."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_an_ingest_that_builds_a_vector_index_prints_no_lance_warning(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(120):  # one text: identical vectors leave all k-means clusters but one empty
        (docs / f"page{i}.md").write_text("# Same page\n\nThe very same paragraph about backups.\n", encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key != "LANCEDB_LOG"}  # as a user's shell has it
    env.update(KBFLOW__SEARCH__VECTOR_INDEX_MIN_ROWS="1", PREFECT_LOGGING_LEVEL="WARNING")
    result = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", str(docs), "--data-dir",
                             str(tmp_path / "data"), "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["store"]["indexes"]["vector"].startswith("created")
    assert "WARN" not in result.stderr and "lance" not in result.stderr.lower(), result.stderr[:500]
