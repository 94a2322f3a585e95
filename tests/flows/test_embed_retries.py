"""Real Prefect flow runs embedding through a real 127.0.0.1 server that speaks DashScope's wire format:
transient failures are retried (honouring Retry-After), permanent ones are recorded and the run goes on."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from kbflow.engine.ingest import IngestJob
from kbflow.engine.ingest import ingest as engine_ingest
from kbflow.flows.ingest import ingest
from kbflow.embed.factory import get_embedder
from kbflow.config import load_config
from kbflow.state.manifest import NamespaceState
from kbflow.stores.lancedb_store import LanceStore
from kbflow.testing.fake_services import FakeServices
from kbflow.embed.remote import PROBE_TEXT

KEY = "sk-flow-test"
PROBE = 1  # every run with work first embeds one short text (the credential check)


@pytest.fixture
def server(monkeypatch, own_backend):
    monkeypatch.setenv("KBFLOW_FLOW_TEST_KEY", KEY)
    # a normal reply has 1.5 s before the client gives up; a "slow" one takes 3 s (a 504 the client never reads)
    with FakeServices(key=KEY, max_batch=10, dimension=64, slow_s=3.0, retry_after="1") as running:
        yield running


def write_config(tmp_path, server, retries: int = 3, **embedder) -> str:
    config = {"data_dir": str(tmp_path / "data"), "flow": {"max_workers": 2},
              "embedder": {"backend": "dashscope", "model": "text-embedding-v4", "dimension": 64, "task_batch": 4,
                           "connection": {"base_url": server.url + "/api/v1", "api_key_env": "KBFLOW_FLOW_TEST_KEY",
                                          "timeout_s": 1.5, "retries": retries, "retry_backoff_s": 0.05},
                           **embedder}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def stored(tmp_path):
    rows = LanceStore(tmp_path / "data" / "lancedb", "default", 64).rows().to_pylist()
    return rows, NamespaceState(tmp_path / "data", "default").read_manifest().to_pylist()


def failures_of(summary, tmp_path):
    return pq.read_table(tmp_path / "data" / "runs" / "default" / summary["run_id"] / "failures.parquet").to_pylist()


def test_transient_failures_are_retried_and_each_text_embedded_once(docs_dir, tmp_path, server):
    server.script = ["ok", "429", "500", "slow"]  # after the credential check, three requests fail, each its own way
    config = write_config(tmp_path, server)
    summary = ingest(sources=[str(docs_dir)], config_path=config)
    assert summary["documents"]["failed"] == 0 and summary["failures"] == []
    throttled = next(r for r in server.requests if r["status"] == 429)
    again = next(r for r in server.requests if r["number"] > throttled["number"] and r["texts"] == throttled["texts"])
    assert again["at"] - throttled["at"] >= 1.0  # the same texts came back no sooner than Retry-After: 1 asked
    rows, manifest = stored(tmp_path)
    assert len(rows) == summary["store"]["count"] == summary["chunks"]["embedded"] > 4
    assert all(len(row["vector"]) == 64 and abs(np.linalg.norm(row["vector"]) - 1) < 1e-4 for row in rows)
    assert max(server.served.values()) == 1  # no text was embedded twice, though three requests failed
    assert sum(server.served.values()) == summary["chunks"]["embedded"] + PROBE
    assert len(manifest) == 4
    assert all(len(r["texts"]) <= 10 for r in server.requests)


def test_permanent_failure_is_recorded_and_the_run_goes_on(docs_dir, tmp_path, server):
    server.poison = "daily backups"  # a request holding this text is refused as invalid input, every time
    config = write_config(tmp_path, server)
    summary = ingest(sources=[str(docs_dir)], config_path=config)
    assert summary["documents"]["failed"] >= 1
    failures = failures_of(summary, tmp_path)
    batch_failures = [f for f in failures if f["chunk_ids"]]
    assert batch_failures and all(f["error_type"] == "PermanentError" for f in batch_failures)
    assert all(f["attempts"] == 1 for f in batch_failures)  # a permanent error is not retried
    assert "invalid" in batch_failures[0]["message"]
    rows, manifest = stored(tmp_path)
    failed_chunks = {c for f in batch_failures for c in f["chunk_ids"]}
    assert not failed_chunks & {row["chunk_id"] for row in rows}  # nothing of the failed batch is stored
    blocked = {f["doc_id"] for f in failures if f["error_type"] == "EmbeddingIncomplete"}
    assert blocked and not blocked & {m["doc_id"] for m in manifest}  # so the next run retries them
    assert len(manifest) == 4 - len(blocked) and rows  # the other documents were stored
    served_before = sum(server.served.values())

    server.poison = None  # the input problem is fixed: the next run embeds only what is missing
    second = ingest(sources=[str(docs_dir)], config_path=config)
    assert second["documents"]["failed"] == 0
    assert second["documents"]["new"] == len(blocked)
    rows, manifest = stored(tmp_path)
    assert len(manifest) == 4 and server.served.pop(PROBE_TEXT) == 2 and max(server.served.values()) == 1
    assert sum(server.served.values()) + 2 * PROBE - served_before == second["chunks"]["embedded"] + PROBE


def test_exhausted_retries_fail_the_batch_with_its_attempts(docs_dir, tmp_path, server):
    server.script = ["ok"] + ["500"] * 50  # the credential check passes, then the server is down for the run
    config = write_config(tmp_path, server, retries=1, task_retries=1)
    summary = ingest(sources=[str(docs_dir)], config_path=config)
    failures = [f for f in failures_of(summary, tmp_path) if f["chunk_ids"]]
    assert failures and all(f["error_type"] == "TransientError" and f["attempts"] == 2 for f in failures)  # 2 task runs
    rows, manifest = stored(tmp_path)
    assert rows == [] and manifest == []
    # counted at the server: every text of a failed embed call was sent (1 + retries) x (1 + task_retries) times
    sends = Counter(text for request in server.requests[1:] for text in request["texts"])
    assert set(sends.values()) == {4} and len(sends) == sum(len(f["chunk_ids"]) for f in failures)
    assert get_embedder(load_config(config).embedder).dimension == 64


def _run_direct(config: str, docs):
    return engine_ingest(load_config(config), IngestJob([str(docs)]))


def _run_flow(config: str, docs):
    return ingest(sources=[str(docs)], config_path=config)


@pytest.mark.parametrize("run", [_run_direct, _run_flow], ids=["direct", "prefect"])
def test_a_retried_embed_call_sends_only_the_requests_its_first_try_did_not_finish(run, docs_dir, tmp_path, server):
    """An embed stage call of three requests whose third fails: the call's retry (a task retry under Prefect, the
    direct runner's loop otherwise) finds the first two requests' vectors in the vector cache and sends only the
    third's texts again; every other text reaches the service once."""
    server.script = ["ok", "ok", "ok", "500"]  # the credential check, two requests, then the third fails once
    config = write_config(tmp_path, server, retries=0, task_retries=1, max_batch=2, task_batch=6)
    summary = run(config, docs_dir)
    assert summary["documents"]["failed"] == 0 and summary["failures"] == [], summary["failures"]
    sends = Counter(text for request in server.requests[1:] for text in request["texts"])
    failed = server.requests[3]
    assert failed["status"] == 500 and len(failed["texts"]) == 2
    assert {text: sends[text] for text in failed["texts"]} == {text: 2 for text in failed["texts"]}
    assert all(count == 1 for text, count in sends.items() if text not in failed["texts"]), sends
