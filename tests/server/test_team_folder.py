"""Served deployments for a team, as docs/operations.md tells it: a folder of the team's own holding
configs/team.yaml (relative sources and data dir), `kbflow serve --config team` started there, and a work pool's
worker fed by `kbflow serve --prefect-yaml` and `prefect deploy` run there. A Run form's partial request
completes on the team's config either way, with no environment variable set by hand.

Its own Prefect server (a module of its own): `kbflow serve` here registers deployments of the same names as the
other server module's."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from kbflow import api
from tests.conftest import CASES
from tests.server.test_prefect_server import (BIN, _create_flow_run, _free_port, _start, _stop, _wait_final,
                                             _wait_for, start_prefect_server)


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    root = tmp_path_factory.mktemp("prefect-team")
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_", "KBFLOW_"))}
    env.update({"PREFECT_HOME": str(root / "home"), "PREFECT_API_URL": api_url,
                "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "KBFLOW__EMBEDDER__BACKEND": "local"})
    env.pop("PYTHONPATH", None)
    folder = root / "team"
    (folder / "configs").mkdir(parents=True)
    import shutil

    shutil.copytree(CASES / "docs", folder / "docs")
    (folder / "configs" / "team.yaml").write_text(
        "data_dir: data\nnamespace: handbook\nsources: [docs]\n"
        "deploy:\n  schedules:\n    - namespace: handbook\n      cron: '0 3 * * *'\n", encoding="utf-8")
    server_log = root / "server.log"
    server = start_prefect_server(port, env, server_log)
    try:
        yield {"root": root, "folder": folder, "env": env, "api_url": api_url}
    finally:
        _stop(server)


def _deployment(api_url: str, name: str, pool: str | None = None) -> dict:
    found = [d for d in httpx.post(f"{api_url}/deployments/filter", json={}).json()
             if d["name"] == name and (pool is None or d["work_pool_name"] == pool)]
    assert found, f"no deployment {name!r}"
    return found[0]


def test_kbflow_serve_in_the_team_folder_runs_a_partial_request_on_the_team_config(team):
    log = team["root"] / "serve.log"
    serve = _start([str(BIN / "kbflow"), "serve", "--config", "team"], team["env"], log, cwd=team["folder"])
    try:
        _wait_for(lambda: len(httpx.post(f"{team['api_url']}/deployments/filter", json={}).json()) == 4
                  and serve.poll() is None, 180, "kbflow serve to register 4 deployments", log)
        on_demand = _deployment(team["api_url"], "on-demand")
        assert on_demand["parameters"]["request"]["config"] == "team"
        run_id = _create_flow_run(team["api_url"], on_demand["id"], {"request": {"dry_run": False}})
        run = _wait_final(team["api_url"], run_id)
    finally:
        _stop(serve)
    assert run["state"]["type"] == "COMPLETED", run["state"]["message"] + log.read_text()[-3000:]
    stats = api.stats("handbook", data_dir=team["folder"] / "data")
    assert stats["documents"] == 4


def test_a_work_pool_worker_runs_the_team_deployments_from_prefect_yaml(team, tmp_path):
    folder, env = team["folder"], team["env"]

    def run(*args, cwd=folder):
        done = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    run(str(BIN / "kbflow"), "serve", "--config", "team", "--prefect-yaml", "prefect.yaml", "--pool", "team-pool")
    run(str(BIN / "prefect"), "work-pool", "create", "team-pool", "--type", "process")
    run(str(BIN / "prefect"), "--no-prompt", "deploy", "--all", "--prefect-file", "prefect.yaml")
    on_demand = _deployment(team["api_url"], "on-demand", "team-pool")
    log = tmp_path / "worker.log"
    worker = _start([str(BIN / "prefect"), "worker", "start", "--pool", "team-pool", "--limit", "1"],
                    {**env, "PREFECT_WORKER_QUERY_SECONDS": "2"}, log, cwd=tmp_path)  # started anywhere
    try:
        run_id = _create_flow_run(team["api_url"], on_demand["id"], {"request": {"force": True}})
        result = _wait_final(team["api_url"], run_id)
    finally:
        _stop(worker)
    assert result["state"]["type"] == "COMPLETED", result["state"]["message"] + log.read_text()[-3000:]
    assert api.stats("handbook", data_dir=folder / "data")["documents"] == 4
