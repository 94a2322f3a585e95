"""`kbflow bench search --sample DIR --cold`: fresh `kbflow mcp` processes timed from their spawn, over stdio
(raw JSON-RPC lines) and streamable HTTP (the SDK's client, a token made for the run). Checks the result's
shape and order of events, never a time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import CASES

KBFLOW = str(Path(sys.executable).with_name("kbflow"))


def test_cold_start_bench_times_each_step_of_both_transports(tmp_path):
    config = tmp_path / "kb.yaml"  # the suite's model (MiniLM)
    config.write_text(yaml.safe_dump({"embedder": {"backend": "local"}}))
    out = tmp_path / "cold.json"
    done = subprocess.run([KBFLOW, "bench", "search", "--sample", str(CASES / "docs"), "--cold", "--rounds", "1",
                           "--work-dir", str(tmp_path / "work"), "--config", str(config), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    stdio, http = result["stdio"]["rounds"][0], result["http"]["rounds"][0]
    assert stdio["exit_status"] == 0  # stdin closed: a clean exit, not a kill
    assert 0 < stdio["initialize_s"] <= stdio["first_search_s"] and stdio["second_search_s"] > 0
    assert 0 < http["listening_s"] <= http["first_search_s"] and stdio["exit_after_eof_s"] > 0
    assert result["namespace_chunks"] > 0 and "all-MiniLM-L6-v2" in result["model_id"]
    assert result["machine"]["cpu_count"] and Path(result["plot"]).is_file()
