"""A planted API key never appears in anything a run writes: data dir files (snapshots, manifests, state, stores,
Prefect results), `--json` output, stderr, Prefect logs or artifacts — on success and on a bad-key failure."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter,
                                            FlowRunFilterStartTime, LogFilter, LogFilterFlowRunId)

from kbflow.flows.ingest import ingest
from kbflow.testing.fake_services import FakeServices
from kbflow.core.errors import AuthError
from tests.flows.conftest import subprocess_env

KEY = "sk-planted-9f3c1e7a5b2d4c6e8f0a"
ENV = "KBFLOW_SECRET_TEST_KEY"


def config_for(tmp_path: Path, server: FakeServices) -> Path:
    config = {"data_dir": str(tmp_path / "data"),
              "embedder": {"backend": "dashscope", "model": "text-embedding-v4", "dimension": 64, "task_batch": 4,
                           "connection": {"base_url": server.url + "/api/v1", "api_key_env": ENV, "timeout_s": 2.0,
                                          "retries": 1, "retry_backoff_s": 0.05}}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def prefect_texts(since: datetime) -> tuple[str, int]:
    """Every log line and artifact of the flow runs that started since ``since`` (this test's runs: the session's
    Prefect server serves one test file at a time), and how many flow runs that was."""
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            start_time=FlowRunFilterStartTime(after_=since)), limit=200)
        ids = [run.id for run in runs]
        logs, artifacts = [], []
        while len(logs) % 200 == 0:  # the API pages by at most 200
            page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)), limit=200,
                                    offset=len(logs))
            logs += page
            if not page:
                break
        while len(artifacts) % 200 == 0:
            page = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=ids)),
                                         limit=200, offset=len(artifacts))
            artifacts += page
            if not page:
                break
    texts = [log.message for log in logs] + [repr(a.data) + repr(a.description) for a in artifacts]
    assert any("plan for default" in text for text in texts), "no run log reached the server: nothing was checked"
    return "\n".join(texts), len(ids)


def test_planted_key_appears_nowhere(docs_dir, tmp_path, monkeypatch, own_backend):
    monkeypatch.setenv(ENV, KEY)
    since = datetime.now(timezone.utc)
    with FakeServices(key=KEY, max_batch=10, dimension=64) as server:
        config = config_for(tmp_path, server)
        server.script = ["bad_key"]  # the credential check is refused: the run stops with an error message
        with pytest.raises(AuthError) as refused:
            ingest(sources=[str(docs_dir)], config_path=str(config))
        server.script = ["ok", "bad_key"]  # refused in the middle of a run: a failure row is written
        failed = ingest(sources=[str(docs_dir)], config_path=str(config))
        assert failed["failures"], "the bad-key reply should have failed a batch"
        summary = ingest(sources=[str(docs_dir)], config_path=str(config))
        assert summary["documents"]["failed"] == 0
        cli = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", str(docs_dir), "--config", str(config),
                              "--json", "--force"], capture_output=True, env=subprocess_env(**{ENV: KEY}), timeout=600)
        assert cli.returncode == 0, cli.stderr.decode()[-2000:]
        assert server.requests, "the server saw no request: the test proves nothing"
        assert all((request["auth"] or "").endswith(KEY) for request in server.requests)  # the key was really used
    needle = KEY.encode()
    assert len(list((tmp_path / "data").rglob("*.parquet"))) > 3  # the scan below reads a real data dir
    assert files_holding(tmp_path / "data", needle) == []
    assert needle not in cli.stdout and needle not in cli.stderr
    assert KEY not in str(refused.value) and KEY not in repr(failed) and KEY not in repr(summary)
    texts, runs = prefect_texts(since)
    assert runs == 4 and KEY not in texts  # the three in-process runs and the CLI's, logs and artifacts
