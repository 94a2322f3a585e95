"""Nothing lost under real faults: a throttling provider, unreadable files and folders, a file edited mid-run, a
read-only data dir, a refused key, a killed process. Real processes, a real HTTP server speaking the provider's
wire format (kbflow.testing.fake_services), real file permissions: root ignores them, so the commands that must
meet them run with the capabilities that let root read anything dropped (setpriv)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from kbflow import api
from kbflow.testing.fake_services import FakeServices
from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from kbflow.stores.vector_cache import VectorCache
from tests.conftest import CASES
from tests.flows.conftest import subprocess_env

KEY = "sk-fault-test-secret"
KBFLOW = [sys.executable, "-m", "kbflow.cli"]
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"] if os.geteuid() == 0 else []


def kbflow(*args: str, cwd: Path, env: dict | None = None, unprivileged: bool = False,
           timeout: float = 600) -> subprocess.CompletedProcess:
    """A real `kbflow` process: the engine runs in it (no Prefect server configured) unless ``env`` says so."""
    base = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run([*(NO_DAC if unprivileged else []), *KBFLOW, *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def pages(root: Path, count: int) -> Path:
    """``count`` distinct Markdown pages made from the real case documents (each page's text differs)."""
    folder = root / "pages"
    folder.mkdir(parents=True)
    paragraphs = [block.strip() for name in ("backups.md", "search.md")
                  for block in (CASES / "docs" / name).read_text(encoding="utf-8").split("\n\n") if block.strip()
                  and not block.startswith("#")]
    for number in range(count):
        body = "\n\n".join(f"{paragraph} (page {number}, part {part})" for part, paragraph in enumerate(paragraphs))
        (folder / f"page-{number:02d}.md").write_text(f"# Page {number}\n\n{body}\n", encoding="utf-8")
    return folder


def provider_config(path: Path, server: FakeServices, backend: str, data_dir: Path) -> Path:
    """The shipped retry defaults, pointed at the local server; only the request timeout is short (its 'slow'
    answers take 1.5 s), chunks are small (a page is several requests' worth), the key comes from the environment."""
    embedder = {"backend": backend, "model": "text-embedding-v4" if backend == "dashscope" else "bge-m3",
                "dimension": 64, "connection": {"api_key_env": "KBFLOW_FAULT_KEY", "timeout_s": 1.0,
                                                "base_url": server.url + ("/api/v1" if backend == "dashscope" else "/v1")}}
    if backend == "openai":
        embedder["max_batch"] = 10
    path.write_text(yaml.safe_dump({"data_dir": str(data_dir), "embedder": embedder,
                                    "chunking": {"chunk_tokens": 48, "overlap_tokens": 8}}), encoding="utf-8")
    return path


@pytest.mark.parametrize("backend", ["dashscope", "openai"])
def test_a_throttling_provider_is_ridden_out_and_nothing_is_paid_twice(backend, tmp_path, monkeypatch, own_backend):
    monkeypatch.setenv("KBFLOW_FAULT_KEY", KEY)
    corpus = pages(tmp_path, 30)
    with FakeServices(key=KEY, max_batch=10, slow_s=1.5, every={4: "429", 6: "500", 9: "slow"}) as server:
        config = provider_config(tmp_path / "config.yaml", server, backend, tmp_path / "data")
        first = api.ingest([str(corpus)], config=config)
        assert first["failures"] == [] and first["documents"]["new"] == 30
        rows = LanceStore(tmp_path / "data" / "lancedb", "default", 64).rows().to_pylist()
        assert len(rows) == first["store"]["count"] == first["chunks"]["total"] >= 140  # run 1 stored every chunk
        vectors = np.array([row["vector"] for row in rows])
        assert np.isfinite(vectors).all() and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        statuses = [request["status"] for request in server.requests]
        assert {429, 500, 504} <= set(statuses)  # the faults did happen
        assert max(len(request["texts"]) for request in server.requests) <= 10
        assert max(server.served.values()) == 1  # no text was embedded (paid for) twice
        probe = 1  # the credential check before converting: one short text
        assert sum(server.served.values()) == first["chunks"]["embedded"] + probe
        assert first["embedding"]["requests_sent"] == len(server.requests)
        assert first["embedding"]["retries"] == sum(1 for status in statuses if status != 200)

        seen = len(server.requests)
        again = api.ingest([str(corpus)], config=config)
        assert again["chunks"]["embedded"] == 0 and len(server.requests) == seen  # the re-run sends nothing


def test_concurrent_first_writes_to_the_vector_cache_do_not_race(tmp_path):
    """Many embed calls writing their first vectors at once into a cache whose table does not exist yet."""
    cache = VectorCache(tmp_path / "lancedb", "model-x", 8)
    start, errors = threading.Barrier(8), []

    def write(worker: int) -> None:
        start.wait()
        try:
            cache.add([f"{worker}-{i}" for i in range(5)], np.ones((5, 8), np.float32))
        except Exception as exc:  # pragma: no cover - what the race looked like
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and cache.count() == 40


def test_an_unreadable_file_is_a_failure_row_and_the_others_are_ingested(docs_dir, tmp_path):
    secret = docs_dir / "search.md"
    secret.chmod(0)
    run = kbflow("ingest", str(docs_dir), "--data-dir", str(tmp_path / "data"), "--json", cwd=tmp_path,
                 unprivileged=True)
    secret.chmod(0o644)
    assert run.returncode == 1, run.stderr
    summary = json.loads(run.stdout)
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 1
    [failure] = summary["failures"]
    assert failure["source_path"] == "docs/search.md" and "Permission denied" in failure["message"]
    assert "fix its permissions" in failure["message"]
    stored = {row["source_path"] for row in LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist()}
    assert stored == {"docs/backups.md", "docs/chinese.md", "docs/tutorial-concepts.html"}
    assert "Traceback" not in run.stderr


def test_an_unreadable_folder_keeps_its_documents_and_is_reported(docs_dir, tmp_path):
    (docs_dir / "private").mkdir()
    for name in ("backups.md", "search.md"):
        shutil.move(docs_dir / name, docs_dir / "private" / name)
    data = str(tmp_path / "data")
    assert kbflow("ingest", str(docs_dir), "--data-dir", data, cwd=tmp_path).returncode == 0
    before = LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist()

    (docs_dir / "private").chmod(0)
    run = kbflow("ingest", str(docs_dir), "--data-dir", data, "--json", cwd=tmp_path, unprivileged=True)
    (docs_dir / "private").chmod(0o755)
    assert run.returncode == 1, run.stderr
    summary = json.loads(run.stdout)
    assert summary["documents"]["removed"] == 0 and summary["chunks"]["deleted"] == 0
    [failure] = summary["failures"]
    assert failure["stage"] == "scan" and failure["source_path"] == "docs/private"
    assert "its 2 stored documents are kept" in failure["message"] and "Permission denied" in failure["message"]
    assert LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist() == before
    assert len(NamespaceState(tmp_path / "data", "default").read_manifest()) == 4


def test_a_file_edited_between_scan_and_convert_is_never_kept_stale(docs_dir, tmp_path):
    data, marker = str(tmp_path / "data"), tmp_path / "paused"
    target = docs_dir / "backups.md"
    original = target.read_text(encoding="utf-8")
    edited = original.replace("Keep seven daily backups", "Keep ninety-nine hourly snapshots")
    assert edited != original
    env = {"KBFLOW_FAILPOINTS": "plan.written:pause(120)", "KBFLOW_FAILPOINTS_MARKER": str(marker)}
    process = subprocess.Popen([*KBFLOW, "ingest", str(docs_dir), "--data-dir", data, "--json"], cwd=tmp_path,
                               env={**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, **env},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    target.write_text(edited, encoding="utf-8")  # after the scan hashed it, before it is converted
    marker.unlink()  # let the run go on
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err

    def texts() -> str:
        return " ".join(row["text"] for row in LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist())

    import hashlib

    manifest = {row["source_path"]: row for row in NamespaceState(tmp_path / "data", "default").read_manifest().to_pylist()}
    assert manifest["docs/backups.md"]["source_sha256"] == hashlib.sha256(edited.encode()).hexdigest()  # what was read
    assert "ninety-nine hourly" in texts()

    target.write_text(original, encoding="utf-8")  # reverted: the next run must see it changed and store it again
    reverted = json.loads(kbflow("ingest", str(docs_dir), "--data-dir", data, "--json", cwd=tmp_path).stdout)
    assert reverted["documents"]["changed"] == 1
    assert "ninety-nine hourly" not in texts() and "seven daily" in texts()
    settled = json.loads(kbflow("ingest", str(docs_dir), "--data-dir", data, "--json", cwd=tmp_path).stdout)
    assert settled["documents"]["unchanged"] == 4
    assert kbflow("verify", "--data-dir", data, cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("case", ["new under a read-only parent", "existing, made read-only"])
def test_a_read_only_data_dir_is_one_clear_error(case, docs_dir, tmp_path):
    parent = tmp_path / "readonly"
    parent.mkdir()
    data = parent / "data"
    if case.startswith("existing"):
        assert kbflow("ingest", str(docs_dir), "--data-dir", str(data), cwd=tmp_path).returncode == 0
        (docs_dir / "backups.md").write_text("# Backups\n\nChanged.\n", encoding="utf-8")
        folders = [data, *(p for p in data.rglob("*") if p.is_dir())]
    else:
        folders = [parent]
    for folder in folders:
        folder.chmod(folder.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    writes = [("ingest", str(docs_dir), "--json")]
    if case.startswith("existing"):  # every command that writes a namespace
        writes += [("verify", "--repair", "--json"), ("clear", "--namespace", "default", "--yes")]
    try:
        runs = [kbflow(*write, "--data-dir", str(data), cwd=tmp_path, unprivileged=True) for write in writes]
    finally:
        for folder in folders:
            folder.chmod(folder.stat().st_mode | stat.S_IWUSR)
    for write, run in zip(writes, runs):
        assert run.returncode == 2, (write, run.stderr)
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        assert len(lines) <= 3 and "Traceback" not in run.stderr, run.stderr  # one message (rich may wrap it)
        message = " ".join(lines)
        assert "cannot write" in message and "permission denied" in message and "--data-dir" in message, message
        if "--json" in write:
            assert json.loads(run.stdout)["error"]["type"] == "StoreUnwritable"


@pytest.mark.parametrize("orchestrator", ["direct", "prefect"])
def test_errors_are_one_line_and_a_json_object_on_stdout(orchestrator, docs_dir, tmp_path):
    data = tmp_path / "data"
    lock = data / "state" / "default" / "ingest.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename, "started": time.time()}))
    env = subprocess_env(KBFLOW__FLOW__ORCHESTRATOR=orchestrator, KBFLOW__FLOW__LOCK_WAIT_S="1") \
        if orchestrator == "prefect" else {"KBFLOW__FLOW__LOCK_WAIT_S": "1"}
    run = kbflow("ingest", str(docs_dir), "--data-dir", str(data), "--json", cwd=tmp_path, env=env)
    assert run.returncode == 2
    assert json.loads(run.stdout) == {"error": {"type": "NamespaceLocked", "message": json.loads(run.stdout)["error"]["message"]}}
    assert f"pid {os.getpid()}" in json.loads(run.stdout)["error"]["message"]
    assert "Traceback" not in run.stderr and run.stderr.strip().startswith("error:"), run.stderr


def test_an_empty_source_path_is_an_error_not_the_current_folder(tmp_path):
    run = kbflow("ingest", "", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert run.returncode == 2 and "empty source path" in run.stderr
    assert not (tmp_path / "data" / "state").exists()


def test_a_refused_key_stops_the_run_before_anything_is_converted(docs_dir, tmp_path, own_backend):
    with FakeServices(key="sk-the-right-key") as server:
        config = provider_config(tmp_path / "config.yaml", server, "dashscope", tmp_path / "data")
        run = kbflow("ingest", str(docs_dir), "--config", str(config), "--json", cwd=tmp_path,
                     env={"KBFLOW_FAULT_KEY": KEY})
        assert run.returncode == 2
        error = json.loads(run.stdout)["error"]
        assert error["type"] == "AuthError" and "KBFLOW_FAULT_KEY" in error["message"] and KEY not in run.stdout
        assert len(server.requests) == 1  # one credential check, not one refusal per embed call
    [run_dir] = (tmp_path / "data" / "runs" / "default").iterdir()
    assert not (run_dir / "documents").exists()  # nothing was converted
    assert pq.read_table(run_dir / "failures.parquet").column("error_type").to_pylist() == ["AuthError"]


def test_a_killed_run_leaves_no_temporary_prefect_server_behind(docs_dir, tmp_path):
    marker = tmp_path / "paused"
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, "KBFLOW__FLOW__ORCHESTRATOR": "prefect",
           "KBFLOW_FAILPOINTS": "plan.written:pause(300)", "KBFLOW_FAILPOINTS_MARKER": str(marker)}
    process = subprocess.Popen([*KBFLOW, "ingest", str(docs_dir), "--data-dir", str(tmp_path / "data")], cwd=tmp_path,
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.1)
    children = [int(pid) for pid in Path(f"/proc/{process.pid}/task/{process.pid}/children").read_text().split()]
    servers = [pid for pid in children if "prefect" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")]
    assert servers, "the run reports to a temporary server it started"
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "Z" not in _state(pid) for pid in servers):
        assert time.monotonic() < deadline, "the temporary server outlived the killed run"
        time.sleep(0.2)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


TWO_WRITES = r"""
import json, sys
from kbflow import KnowledgeBase
from kbflow.tasks import server

kb = KnowledgeBase(data_dir=sys.argv[1])
seen = []
for number in range(2):
    kb.add_text(f"sentence {number} about restoring backups", doc_id=f"d{number}")
    seen.append({"url": server._server["url"], "pid": server._server["process"].pid})
prefects_own = sys.modules.get("prefect.server.api.server")  # the servers Prefect starts itself when it has no URL
print(json.dumps([seen, len(prefects_own.SubprocessASGIServer._instances) if prefects_own else 0]))
"""


def test_a_process_starts_one_temporary_server_for_all_its_flow_runs(tmp_path):
    """A library caller with no server configured who asks for flow runs pays for the temporary server once, not
    per write; nothing reaches its stderr (no fork of a process holding LanceDB's threads, whose warning would);
    the server stops when the process exits."""
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, "KBFLOW__FLOW__ORCHESTRATOR": "prefect"}
    run = subprocess.run([sys.executable, "-c", TWO_WRITES, str(tmp_path / "data")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (first, second), prefects_own = json.loads(run.stdout)
    assert first == second  # the second write reused the first one's server
    assert prefects_own == 0  # and nothing in the runs (the slot's lease renewals) started a server of Prefect's own
    # urllib3 warns (DependencyWarning, two lines) when a library probes for its optional SOCKS support; that is
    # the environment's, not a write's. When Prefect's logger has taken over Python's warnings at that moment, it
    # prints the same two lines and a blank one after them.
    lines = run.stderr.splitlines()
    socks = "DependencyWarning: SOCKS support in urllib3"
    kept = [line for n, line in enumerate(lines) if socks not in line
            and not (n and socks in lines[n - 1])
            and not (n > 1 and not line.strip() and socks in lines[n - 2])]
    assert kept == [], run.stderr
    assert not Path(f"/proc/{first['pid']}").exists() or _state(first["pid"]) == "Z"  # stopped at exit
    assert len(LanceStore(tmp_path / "data" / "lancedb", "default", 384).rows().to_pylist()) == 2
