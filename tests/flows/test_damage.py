"""Damaged state, as an operator meets it: a state file cut short or emptied, a store data file or a vector cache
file gone. Each damage × stats, search, verify, verify --repair and ingest, on LanceDB and on Qdrant's local mode:
reads say what is damaged and how to heal it (search goes on answering when the store itself is whole), verify
finds it, verify --repair heals it, and the next ingest brings back the whole store with nothing embedded again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kbflow import api
from kbflow.search.tokens import TOKENIZER_VERSION
from kbflow.state.files import StateDamaged
from kbflow.state.manifest import NamespaceState
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


def _oldest_but_one(folder: Path) -> Path:
    files = sorted(folder.iterdir(), key=lambda path: path.stat().st_mtime_ns)
    assert len(files) >= 2, files
    return files[1]


def damage(data: Path, kind: str) -> str:
    """Damage the copy ``data``; returns the name the error and the finding must mention."""
    state = data / "state" / "default"
    if kind == "manifest-cut":
        manifest = state / "manifest.parquet"
        manifest.write_bytes(manifest.read_bytes()[:100])
        return "manifest.parquet"
    if kind == "manifest-empty":
        (state / "manifest.parquet").write_bytes(b"")
        return "manifest.parquet"
    if kind == "namespace-empty":
        (state / "namespace.json").write_text("")
        return "namespace.json"
    if kind == "last-run-empty":
        (state / "last_run.json").write_text("")
        return "last_run.json"
    if kind.endswith("-folder"):  # a folder where the state file belongs (someone's mkdir, a bad restore)
        name = {"manifest-folder": "manifest.parquet", "namespace-folder": "namespace.json",
                "last-run-folder": "last_run.json"}[kind]
        (state / name).unlink()
        (state / name).mkdir()
        (state / name / "kept.txt").write_text("whatever was put there is kept")
        return name
    if kind == "namespace-wrong-types":
        (state / "namespace.json").write_text(json.dumps({"dimension": "abc", "model_id": 5, "created": 1}))
        return "namespace.json"
    if kind == "namespace-gone":  # deleted by hand, while the manifest and the store remain
        (state / "namespace.json").unlink()
        return "namespace.json"
    if kind == "manifest-gone":
        (state / "manifest.parquet").unlink()
        return "manifest.parquet"
    if kind == "cache-gone":  # the whole vector cache table
        [cache] = (data / "lancedb").glob("vectors_*.lance")
        shutil.rmtree(cache)
        return "vector-cache"
    if kind == "index-gone":  # the table's index files (full-text), its manifest still naming them
        shutil.rmtree(data / "lancedb" / "chunks_default.lance" / "_indices")
        return "index"
    if kind == "version-scrambled":  # the table's newest version manifest scrambled: the table cannot open
        import random

        versions = data / "lancedb" / "chunks_default.lance" / "_versions"
        newest = min(versions.glob("*.manifest"), key=lambda path: int(path.stem))  # names count down
        scrambled = bytearray(newest.read_bytes())
        shuffle = random.Random(1)
        for _ in range(len(scrambled) // 3):
            scrambled[shuffle.randrange(len(scrambled))] = shuffle.randrange(256)
        newest.write_bytes(bytes(scrambled))
        return "store"
    if kind == "store-file-gone":
        _oldest_but_one(data / "lancedb" / "chunks_default.lance" / "data").unlink()
        return "store"
    if kind == "qdrant-file-cut":  # local mode's SQLite file of the collection, cut short
        database = data / "qdrant" / "collection" / "kbflow_default" / "storage.sqlite"
        database.write_bytes(database.read_bytes()[:database.stat().st_size // 3])
        return "store"
    if kind == "cache-file-gone":
        [cache] = (data / "lancedb").glob("vectors_*.lance")
        sorted((cache / "data").iterdir(), key=lambda path: path.stat().st_mtime_ns)[0].unlink()
        return "vector-cache"
    raise AssertionError(kind)


KINDS = ["manifest-cut", "manifest-empty", "namespace-empty", "last-run-empty", "store-file-gone", "qdrant-file-cut",
         "cache-file-gone", "manifest-folder", "namespace-folder", "last-run-folder", "namespace-wrong-types",
         "namespace-gone", "manifest-gone", "cache-gone", "index-gone", "version-scrambled"]
# what each read does with each damage: "error" (StateDamaged naming the file) or "ok"
STATS = {"manifest-cut": "error", "manifest-empty": "error", "namespace-empty": "error", "last-run-empty": "error",
         "store-file-gone": "error", "qdrant-file-cut": "error", "cache-file-gone": "ok", "manifest-folder": "error",
         "namespace-folder": "error", "last-run-folder": "error", "namespace-wrong-types": "error",
         "namespace-gone": "error", "manifest-gone": "error", "cache-gone": "ok", "index-gone": "ok",
         "version-scrambled": "error"}
SEARCH = {**{kind: "ok" for kind in KINDS}, "namespace-empty": "error", "store-file-gone": "error",
          "qdrant-file-cut": "error", "namespace-folder": "error", "namespace-wrong-types": "error",
          "namespace-gone": "error", "index-gone": "error", "version-scrambled": "error"}
# a plain ingest: refuses to trust what it cannot read, and to start where it could not record its state
INGEST = {**STATS, "last-run-empty": "ok", "manifest-gone": "ok"}


OWN_FILES = {"store-file-gone": "lancedb", "qdrant-file-cut": "qdrant", "index-gone": "lancedb",
             "version-scrambled": "lancedb"}


def _matrix():
    for store in STORES:
        for kind in KINDS:
            if OWN_FILES.get(kind, store) != store:
                continue  # each store's own files: a LanceDB table's data file, Qdrant local mode's SQLite file
            yield pytest.param(store, kind, id=f"{store}-{kind}")


@pytest.mark.parametrize("store,kind", list(_matrix()))
def test_damage_is_named_found_healed_and_restored_with_nothing_embedded(built, tmp_path, store, kind, counting):
    docs, made = built
    config, base, (rows_before, documents_before) = made[store]
    data = tmp_path / "data"
    shutil.copytree(base, data)
    what = damage(data, kind)

    def outcome(read):
        try:
            read()
        except StateDamaged as exc:
            assert what in str(exc) and "kbflow verify --repair --namespace default" in str(exc), str(exc)
            return "error"
        return "ok"

    assert outcome(lambda: api.stats("default", config, data)) == STATS[kind]
    assert outcome(lambda: api.search("how do I restore a backup", config=config, data_dir=data)) == SEARCH[kind]
    if SEARCH[kind] == "ok":
        assert api.search("how do I restore a backup", config=config, data_dir=data)[0].source_path == \
            "docs/backups.md"

    found = api.verify("default", config, data)
    assert not found["ok"] and what in [finding["check"] for finding in found["findings"]], found["findings"]

    plain = tmp_path / "plain"  # a second copy: an ingest without the repair
    shutil.copytree(base, plain)
    damage(plain, kind)
    assert outcome(lambda: api.ingest([str(docs)], config=config, data_dir=plain)) == INGEST[kind]

    repaired = api.verify("default", config, data, repair=True)
    assert repaired["repaired"] and what in repaired["repaired"], repaired
    # a rewritten model record names the BM25 terms the rows hold (from the manifest), so searches ask in them
    assert NamespaceState(data, "default").meta()["bm25_terms"] == TOKENIZER_VERSION
    healed = api.verify("default", config, data)
    assert healed["ok"] and healed["counts"]["cached_of_stored"] == healed["counts"]["store_rows"], healed
    texts_before = counting.texts_embedded
    rerun = api.ingest([str(docs)], config=config, data_dir=data)
    assert rerun["chunks"]["embedded"] == 0 and counting.texts_embedded == texts_before and rerun["documents"]["failed"] == 0
    assert _contents(config, data) == (rows_before, documents_before)
    assert api.verify("default", config, data)["ok"]
    assert api.stats("default", config, data)["chunks"] == len(rows_before)
    if kind.endswith("-folder"):  # set aside, not deleted
        [aside] = (data / "state" / "default").glob(f"{what}.set-aside-*")
        assert (aside / "kept.txt").read_text() == "whatever was put there is kept"


def test_the_command_line_names_the_damage_and_exits_2_with_the_json_error(built, tmp_path):
    _docs, made = built
    config, base, _ = made["lancedb"]
    data = tmp_path / "data"
    shutil.copytree(base, data)
    damage(data, "manifest-cut")
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
