"""Damaged state at the command line, and locks an operator finds after a bad day. Every other damage (each file
and folder an ingest leaves × each way of damaging it) is the damage matrix: test_damage_matrix.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbflow import api
from kbflow.state.lock import NamespaceLocked

DOCS = 4  # tests/cases/docs
STORES = ("lancedb", "qdrant")


def _config(tmp: Path, store: str) -> Path:
    config = tmp / f"{store}.yaml"
    lines = ["flow:", "  doc_batch: 1"]  # a store commit per document: a table of several data files
    if store == "qdrant":
        lines += ["store:", "  kind: qdrant"]  # local mode under <data_dir>/qdrant
    config.write_text("\n".join(lines) + "\n")
    return config


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One knowledge base per store, built once; each test damages a copy."""
    from tests.conftest import CASES

    root = tmp_path_factory.mktemp("damage")
    docs = root / "docs"
    shutil.copytree(CASES / "docs", docs)
    made = {}
    for store in STORES:
        config = _config(root, store)
        data = root / f"base-{store}"
        summary = api.ingest([str(docs)], config=config, data_dir=data)
        assert summary["documents"]["new"] == DOCS and summary["documents"]["failed"] == 0
        made[store] = (config, data, _contents(config, data))
    return docs, made


def _contents(config, data) -> tuple[list, int]:
    """What a search sees: every stored chunk (id, document, text), and the manifest's documents."""
    from kbflow.state.manifest import NamespaceState
    from kbflow.stores import open_store

    cfg = api.resolve_config(config, data)
    state = NamespaceState(data, "default")
    rows = open_store(cfg, state.store_namespace(), 384).rows(["chunk_id", "doc_id", "text"]).to_pylist()
    return rows, state.read_manifest().num_rows


def test_the_command_line_names_the_damage_and_exits_2_with_the_json_error(built, tmp_path):
    _docs, made = built
    config, base, _ = made["lancedb"]
    data = tmp_path / "data"
    shutil.copytree(base, data)
    manifest = data / "state" / "default" / "manifest.parquet"
    manifest.write_bytes(manifest.read_bytes()[:100])  # cut short
    env = {**os.environ, "PREFECT_LOGGING_LEVEL": "WARNING"}
    stats = subprocess.run([sys.executable, "-m", "kbflow", "stats", "--config", str(config), "--data-dir", str(data),
                            "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert stats.returncode == 2 and "Traceback" not in stats.stderr, stats.stderr
    error = json.loads(stats.stdout)["error"]
    assert error["type"] == "StateDamaged" and "manifest.parquet" in error["message"]
    assert "kbflow verify --repair" in error["message"]

    not_a_folder = tmp_path / "data-file"
    not_a_folder.write_text("not a folder")
    add = subprocess.run([sys.executable, "-m", "kbflow", "add-text", "some text", "--doc-id", "a", "--data-dir",
                          str(not_a_folder), "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert add.returncode == 2 and "Traceback" not in add.stderr, add.stderr
    assert "is a file, not a folder" in json.loads(add.stdout)["error"]["message"]


def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


@pytest.mark.parametrize("lock_kind", ["dead-holder", "hand-written", "empty-old", "folder", "foreign", "garbage"])
def test_a_damaged_or_stale_lock_is_named_by_verify_and_healed_or_named_with_the_command(built, tmp_path, lock_kind,
                                                                                        counting):
    """What an operator finds after a bad day: a lock whose holder is provably gone is reported by verify and taken
    over by verify --repair (and by the next write); one kbflow cannot prove stale (another host, an unreadable
    record) is reported as far as it reads, with the command that removes it, and never taken silently."""
    import socket
    import time

    docs, made = built
    config, base, (rows_before, _) = made["lancedb"]
    data = tmp_path / "data"
    shutil.copytree(base, data)
    lock = data / "state" / "default" / "ingest.lock"
    here = socket.gethostname()
    if lock_kind == "dead-holder":
        lock.write_text(json.dumps({"pid": _dead_pid(), "host": here, "started": time.time()}))
    elif lock_kind == "hand-written":
        lock.write_text(json.dumps({"pid": str(_dead_pid()), "host": here, "started": "yesterday 3am"}))
    elif lock_kind == "empty-old":
        lock.write_text("")
        os.utime(lock, (time.time() - 600, time.time() - 600))
    elif lock_kind == "folder":
        lock.mkdir()
    elif lock_kind == "foreign":
        lock.write_text(json.dumps({"pid": 4242, "host": "build-7", "started": time.time()}))
    else:
        lock.write_bytes(b"\x00\x17{pid")
    stale = lock_kind not in ("foreign", "garbage")
    found = api.verify("default", config, data)
    [finding] = [f for f in found["findings"] if f["check"] == "ingest.lock"]
    assert not found["ok"]
    quick = config.parent / "quick.yaml"
    quick.write_text(config.read_text() + "  lock_wait_s: 1\n")  # under the flow: section
    if stale:
        assert "takes it over" in finding["detail"]
        repaired = api.verify("default", quick, data, repair=True)
        assert "ingest.lock" in repaired["repaired"] and not lock.exists()
        assert api.verify("default", quick, data)["ok"]
        assert api.ingest([str(docs)], config=quick, data_dir=data)["chunks"]["embedded"] == 0
    else:
        assert f"rm '{lock}'" in finding["detail"]
        for write in (lambda: api.verify("default", quick, data, repair=True),
                      lambda: api.ingest([str(docs)], config=quick, data_dir=data)):
            with pytest.raises(NamespaceLocked) as refused:
                write()
            assert f"rm '{lock}'" in str(refused.value) and "waited" in str(refused.value)
        assert lock.exists()  # never taken silently
        lock.unlink()  # the command the message names
        assert api.ingest([str(docs)], config=quick, data_dir=data)["chunks"]["embedded"] == 0
    assert _contents(config, data)[0] == rows_before
