"""Stage retries mean something: a store that is busy twice and then works is retried to success, under the direct
runner and as Prefect task runs alike (one RetryPolicy drives both); a lasting store error is not retried and is
recorded with the path and the fix."""

from __future__ import annotations

import errno

import pytest

import kbflow.engine.ingest
from kbflow.config import load_config
from kbflow.engine.ingest import IngestJob
from kbflow.engine.ingest import ingest as engine_ingest
from kbflow.flows.ingest import ingest as ingest_flow
from kbflow.stores import open_store
from tests.flows.conftest import snapshot


class FlakyStore:
    """The real store; its first ``failures`` writes raise the OSError a busy file system gives."""

    def __init__(self, inner, failures: int, error_number: int = errno.EBUSY):
        self.inner, self.failures, self.error_number = inner, failures, error_number
        self.attempts = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name == "defer_vector_index":
            setattr(self.inner, name, value)
        object.__setattr__(self, name, value)

    def replace_documents(self, doc_ids, rows):
        self.attempts += 1
        if self.attempts <= self.failures:
            raise OSError(self.error_number, f"injected: {errno.errorcode[self.error_number]}", "chunks_default.lance")
        return self.inner.replace_documents(doc_ids, rows)


@pytest.fixture
def flaky(monkeypatch, counting):
    made = []

    def opener(failures, error_number=errno.EBUSY):
        def open_flaky(config, namespace, dimension):
            made.append(FlakyStore(open_store(config, namespace, dimension), failures, error_number))
            return made[-1]

        monkeypatch.setattr(kbflow.engine.ingest, "open_store", open_flaky)
        return made

    return opener


def run_direct(docs, data):
    return engine_ingest(load_config(None, data_dir=data), IngestJob([str(docs)]))


def run_flow(docs, data):
    return ingest_flow(sources=[str(docs)], data_dir=str(data))


@pytest.mark.parametrize("run", [run_direct, run_flow], ids=["direct", "prefect"])
def test_a_store_busy_twice_is_retried_to_success(run, docs_dir, tmp_path, flaky):
    stores = flaky(failures=2)
    summary = run(docs_dir, tmp_path / "data")
    assert summary["failures"] == [] and summary["documents"]["new"] == 4
    assert stores[0].attempts == 3  # two busy answers, then the write
    rows, manifest = snapshot(tmp_path / "data")
    assert len(rows) == summary["store"]["count"] > 0 and len(manifest) == 4


@pytest.mark.parametrize("run", [run_direct, run_flow], ids=["direct", "prefect"])
def test_a_read_only_store_is_not_retried_and_names_the_fix(run, docs_dir, tmp_path, flaky):
    stores = flaky(failures=99, error_number=errno.EROFS)
    summary = run(docs_dir, tmp_path / "data")
    assert stores[0].attempts == 1
    failure = summary["failures"][0]
    assert failure["stage"] == "upsert" and failure["error_type"] == "StoreUnwritable" and failure["attempts"] == 1
    assert "read-only file system" in failure["message"] and "--data-dir" in failure["message"]
    assert summary["documents"]["failed"] == 4
