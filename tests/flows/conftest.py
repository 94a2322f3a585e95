from __future__ import annotations

import pytest
from prefect.testing.utilities import prefect_test_harness

from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from tests.conftest import CountingEmbedder

DIM = 384  # the suite's model, all-MiniLM-L6-v2


@pytest.fixture(autouse=True, scope="session")
def prefect_harness():
    with prefect_test_harness(server_startup_timeout=120):
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
