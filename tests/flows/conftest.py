from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.testing.utilities import prefect_test_harness

from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CASES, CountingEmbedder

DIM = 384  # the suite's model, all-MiniLM-L6-v2


@pytest.fixture(autouse=True, scope="session")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=300):
        yield


@pytest.fixture
def counting(monkeypatch, real_embedder):
    """Every flow run in the test embeds through this counter."""
    import kbflow.engine.ingest

    counter = CountingEmbedder(real_embedder)
    monkeypatch.setattr(kbflow.engine.ingest, "get_embedder", lambda config: counter)
    return counter


def subprocess_env(**extra: str) -> dict:
    """Environment for a `kbflow` subprocess in these tests: it reports to the session's Prefect test server
    instead of starting a temporary server of its own (~10 s each, and a process a SIGKILL would orphan)."""
    import os

    from prefect.settings import PREFECT_API_URL

    return {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "PREFECT_LOGGING_LEVEL": "ERROR", **extra}


def store_of(data_dir, namespace="default") -> LanceStore:
    return LanceStore(data_dir / "lancedb", namespace, DIM)


def snapshot(data_dir, namespace="default"):
    """Full contents of the store and the manifest, comparable with ==."""
    rows = store_of(data_dir, namespace).rows().to_pylist()
    manifest = NamespaceState(data_dir, namespace).read_manifest().sort_by("doc_id").to_pylist()
    return rows, manifest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def endpoint():
    """A real S3 endpoint on 127.0.0.1: moto's server on a free port, for the tests of one module."""
    moto_server = pytest.importorskip("moto.server")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(endpoint, monkeypatch, request, tmp_path_factory):
    """A fresh bucket; the client environment every reader (s3fs, subprocesses) takes its settings from; searches
    keep their local copies of its tables in a folder of the test's, not in the user's cache."""
    monkeypatch.setenv("KBFLOW__STORE__MIRROR_DIR", str(tmp_path_factory.mktemp("search-mirror")))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "kbflow-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "kbflow-test-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    boto3 = pytest.importorskip("boto3")
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()  # a cached client keeps the endpoint of the module that made it
    client = boto3.client("s3")
    import hashlib

    # one bucket per test, parameters included (a name cut short would be shared between them)
    bucket = (request.node.originalname.replace("_", "-")[:40].strip("-").lower() + "-" +
              hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:8])
    client.create_bucket(Bucket=bucket)
    return client, bucket


# the crash tests' corpus, config and clean run (test_crash.py; test_object_store.py repeats them on a bucket)
CONFIG = """
flow:
  doc_batch: 2
  max_workers: 1
embedder:
  task_batch: 2
"""


@pytest.fixture(scope="module")
def crash_corpus(tmp_path_factory) -> Path:
    given = os.environ.get("KBFLOW_CRASH_CORPUS")
    if given:
        return Path(given)
    docs = tmp_path_factory.mktemp("crash") / "corpus"
    shutil.copytree(CASES / "docs", docs / "docs")  # Markdown, Chinese, HTML
    (docs / "formats").mkdir()
    shutil.copy(CASES / "formats" / "crazyones.pdf", docs / "formats")  # and a PDF: five documents, three batches
    return docs


@pytest.fixture(scope="module")
def config_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "crash.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def clean_run(crash_corpus, config_file, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("clean")
    from kbflow.flows.ingest import ingest

    summary = ingest(sources=[str(crash_corpus)], data_dir=str(data_dir), config_path=str(config_file))
    assert summary["documents"]["failed"] == 0
    return data_dir, summary


def run_killed(corpus: Path, data_dir: str | Path, config_file: Path, point: str, log: Path) -> None:
    """Run ``kbflow ingest`` (``data_dir`` a folder or an s3:// URL) in its own process group until the failpoint
    SIGKILLs it, then kill the group (anything it started would otherwise outlive it, as after a real crash); its
    stderr goes to ``log``."""
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "kbflow.cli", "ingest", str(corpus), "--data-dir", str(data_dir),
             "--config", str(config_file), "--json"], stdout=subprocess.DEVNULL, stderr=stderr,
            env=subprocess_env(KBFLOW_FAILPOINTS=f"{point}:kill"), start_new_session=True, cwd=log.parent)
        try:
            process.wait(timeout=600)
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert process.returncode == -signal.SIGKILL, log.read_text(errors="replace")[-2000:]
