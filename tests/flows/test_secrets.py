"""A planted API key never appears in anything a run writes: data dir files (snapshots, manifests, state, stores,
Prefect results), `--json` output, stderr, Prefect logs or artifacts — on success and on a bad-key failure."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter

from kbflow.flows.ingest import ingest
from tests.fakes.embedding_server import EmbeddingServer

KEY = "sk-planted-9f3c1e7a5b2d4c6e8f0a"
ENV = "KBFLOW_SECRET_TEST_KEY"


def config_for(tmp_path: Path, server: EmbeddingServer) -> Path:
    config = {"data_dir": str(tmp_path / "data"),
              "embedder": {"backend": "dashscope", "model": "text-embedding-v4", "dimension": 64,
                           "base_url": server.url + "/api/v1", "api_key_env": ENV, "timeout_s": 2.0,
                           "task_batch": 4, "retries": 1, "retry_backoff_s": 0.05}}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def files_holding(root: Path, needle: bytes) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


async def prefect_texts() -> str:
    async with get_client() as client:
        logs = await client.read_logs(log_filter=LogFilter(), limit=200)
        artifacts = await client.read_artifacts(limit=200)
    return "\n".join([log.message for log in logs] + [repr(a.data) + repr(a.description) for a in artifacts])


def test_planted_key_appears_nowhere(docs_dir, tmp_path, monkeypatch, own_backend):
    monkeypatch.setenv(ENV, KEY)
    with EmbeddingServer(key=KEY, max_batch=10, dimension=64) as server:
        config = config_for(tmp_path, server)
        server.script = ["bad_key"]  # the first request is refused as a bad key: an error message is written
        failed = ingest(sources=[str(docs_dir)], config_path=str(config))
        assert failed["failures"], "the bad-key reply should have failed a batch"
        summary = ingest(sources=[str(docs_dir)], config_path=str(config))
        assert summary["documents"]["failed"] == 0
        cli = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", str(docs_dir), "--config", str(config),
                              "--json", "--force"], capture_output=True, env={**os.environ, ENV: KEY}, timeout=600)
        assert cli.returncode == 0, cli.stderr.decode()[-2000:]
        assert server.requests, "the server saw no request: the test proves nothing"
        assert all((request["auth"] or "").endswith(KEY) for request in server.requests)  # the key was really used
    needle = KEY.encode()
    assert files_holding(tmp_path / "data", needle) == []
    assert needle not in cli.stdout and needle not in cli.stderr
    assert KEY not in repr(failed) and KEY not in repr(summary)
    assert KEY not in asyncio.run(prefect_texts())
