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
    import flows.ingest

    counter = CountingEmbedder(real_embedder)
    monkeypatch.setattr(flows.ingest, "get_embedder", lambda config: counter)
    return counter
