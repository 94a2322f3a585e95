from __future__ import annotations

import pytest
from prefect.testing.utilities import prefect_test_harness

from tests.conftest import CountingEmbedder


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
