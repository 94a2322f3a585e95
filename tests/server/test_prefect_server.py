"""Deployments against a real `prefect server`: serve, trigger with typed parameters, watch, artifacts, failure.

Its own directory: the flow tests' session ``prefect_test_harness`` must not be the API these processes use.
Everything here runs in subprocesses with an explicit environment (temporary PREFECT_HOME and SQLite database,
a free loopback port), and everything started is stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kbflow import api

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "cases"
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], env: dict, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: stopping it stops its children


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _wait_for(check, timeout: float, what: str, log: Path):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}; log:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real Prefect server on a free loopback port, and `kbflow serve` registered with it."""
    root = tmp_path_factory.mktemp("prefect-server")
    port = _free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ,
           "PREFECT_HOME": str(root / "home"),
           "PREFECT_API_URL": api_url,
           "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'prefect.db'}",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)  # kbflow comes from its installation only
    env.pop("PREFECT_LOGGING_LEVEL", None)  # kbflow's own defaults decide what reaches the API
    docs = root / "docs"
    shutil.copytree(CASES / "docs", docs)
    (root / "configs").mkdir()  # served runs read configs from ./configs of the served folder only
    config = root / "configs" / "kbflow.yaml"
    config.write_text(f"data_dir: {root / 'data'}\nsources: [{docs}]\n"
                      f"deploy:\n  schedules:\n    - namespace: srv\n      cron: '0 3 * * *'\n", encoding="utf-8")
    bad_config = root / "configs" / "bad.yaml"
    bad_config.write_text("flow:\n  doc_batch: 0\n", encoding="utf-8")

    server_log, serve_log = root / "server.log", root / "serve.log"
    started = [start_prefect_server(port, env, server_log)]
    try:
        # served from a folder outside the checkout: nothing may depend on the working directory
        started.append(_start([str(BIN / "kbflow"), "serve", "--config", str(config)], env, serve_log, cwd=root))

        def served():
            response = httpx.post(f"{api_url}/deployments/filter", json={}, timeout=5)
            return len(response.json()) == 4 and started[1].poll() is None

        _wait_for(served, 180, "kbflow serve to register 4 deployments", serve_log)
        yield {"api_url": api_url, "env": env, "config": config, "bad_config": bad_config, "docs": docs,
               "serve_log": serve_log, "serve": started[1]}
    finally:
        for process in reversed(started):
            _stop(process)


def start_prefect_server(port: int, env: dict, log: Path) -> subprocess.Popen:
    """`prefect server start` on 127.0.0.1:``port``, returned once its /api/health answers (stopped if it never
    does)."""
    server = _start([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)], env, log)

    def healthy():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        _wait_for(healthy, 180, "prefect server /api/health", log)
    except BaseException:
        _stop(server)
        raise
    return server


def _flow_run_id(output: str) -> str:
    match = re.search(r"UUID: ([0-9a-f-]{36})", output)
    assert match, output
    return match.group(1)


def test_deployments_have_schedules_and_typed_forms(server):
    deployments = {d["name"]: d for d in httpx.post(f"{server['api_url']}/deployments/filter", json={}).json()}
    assert set(deployments) == {"nightly-srv", "on-demand", "backfill", "reembed"}
    assert [s["schedule"]["cron"] for s in deployments["nightly-srv"]["schedules"]] == ["0 3 * * *"]
    schema = deployments["on-demand"]["parameter_openapi_schema"]["definitions"]["IngestRequest"]
    assert {"namespace", "sources", "config", "dry_run", "force"} <= set(schema["properties"])
    assert all(field.get("description") for field in schema["properties"].values())
    # the server validates the form: a namespace with a space is refused before any run is created
    response = httpx.post(f"{server['api_url']}/deployments/{deployments['on-demand']['id']}/create_flow_run",
                          json={"parameters": {"request": {"namespace": "not valid"}}})
    assert response.status_code == 409, response.text


def test_on_demand_run_completes_and_a_bad_config_run_fails_the_ci_script(server):
    """Both runs at once (the served process runs them side by side): one ingests, one fails on its config."""
    request = {"namespace": "srv", "sources": [str(server["docs"])], "config": str(server["config"])}
    on_demand = subprocess.Popen(
        [str(BIN / "prefect"), "deployment", "run", "kbflow-ingest-request/on-demand",
         "--param", f"request={json.dumps(request)}", "--watch", "--watch-timeout", "300"],
        cwd=REPO, env=server["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ci_env = {**server["env"], "PREFECT": str(BIN / "prefect"), "KBFLOW_WATCH_TIMEOUT": "300"}
    ci_script = subprocess.Popen(
        ["bash", str(REPO / "deployments" / "ci" / "backfill.sh"), json.dumps({"config": str(server["bad_config"])})],
        cwd=REPO, env=ci_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    on_demand_output, _ = on_demand.communicate(timeout=360)
    ci_output, _ = ci_script.communicate(timeout=360)

    # the failing run: Failed on the server, and the CI script exits non-zero saying so
    assert ci_script.returncode != 0, ci_output
    assert "Flow run finished in state 'Failed'" in ci_output and "did not complete" in ci_output
    failed = httpx.get(f"{server['api_url']}/flow_runs/{_flow_run_id(ci_output)}").json()
    assert failed["state"]["type"] == "FAILED" and "flow.doc_batch" in failed["state"]["message"]

    # the on-demand run: Completed, with its artifacts, readable task-run names, and the documents in the store
    assert on_demand.returncode == 0, on_demand_output + server["serve_log"].read_text()[-3000:]
    run_id = _flow_run_id(on_demand_output)
    run = httpx.get(f"{server['api_url']}/flow_runs/{run_id}").json()
    assert run["state"]["type"] == "COMPLETED"
    # the artifacts belong to the run that was started (not to a child run), and its logs reached the API
    artifacts = {a["key"]: a for a in httpx.post(f"{server['api_url']}/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run_id]}}}).json()}
    logs = httpx.post(f"{server['api_url']}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}}).json()
    assert any("plan for srv" in log["message"] for log in logs), [log["message"] for log in logs]
    assert set(artifacts) == {"kbflow-srv-progress", "kbflow-srv-run-summary", "kbflow-srv-failures"}
    assert float(artifacts["kbflow-srv-progress"]["data"]) == 100.0
    rows = json.loads(artifacts["kbflow-srv-run-summary"]["data"])
    figures = {(row["group"], row["item"]): row["value"] for row in rows}
    assert figures[("documents", "new")] == 4 and figures[("documents", "failed")] == 0
    assert figures[("chunks", "embedded")] > 0 and ("seconds", "embed") in figures
    assert "No failures" in artifacts["kbflow-srv-failures"]["data"]
    task_runs = httpx.post(f"{server['api_url']}/task_runs/filter", json={}).json()
    assert {"convert docs 0-3", "split docs 0-3", "chunk docs 0-3", "upsert docs 0-3"} <= {t["name"] for t in task_runs}
    stats = api.stats("srv", server["config"])
    assert stats["documents"] == 4 and stats["chunks"] == figures[("store", "count")] > 0


def _wait_final(api_url: str, run_id: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api_url}/flow_runs/{run_id}").json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return run
        time.sleep(1)
    raise AssertionError(f"flow run {run_id} did not finish in {timeout} s")


def test_a_partial_request_keeps_the_served_config(server):
    """The CI script sends only {"dry_run": true}: the served config (its deploy.schedules: namespace srv) stays."""
    ci_env = {**server["env"], "PREFECT": str(BIN / "prefect"), "KBFLOW_WATCH_TIMEOUT": "300"}
    ci = subprocess.run(["bash", str(REPO / "deployments" / "ci" / "backfill.sh"), '{"dry_run": true}'],
                        cwd=REPO, env=ci_env, capture_output=True, text=True, timeout=360)
    assert ci.returncode == 0, ci.stdout + ci.stderr + server["serve_log"].read_text()[-3000:]
    run_id = _flow_run_id(ci.stdout)
    [table] = httpx.post(f"{server['api_url']}/artifacts/filter", json={
        "artifacts": {"flow_run_id": {"any_": [run_id]}, "key": {"any_": ["kbflow-backfill"]}}}).json()
    assert [row["namespace"] for row in json.loads(table["data"])] == ["srv"]


def _create_flow_run(api_url: str, deployment_id: str, parameters: dict) -> str:
    """A flow run of the deployment; the server's answer is shown when it refuses. A 5xx is asked again (twice):
    the SQLite-backed test server can answer 'database is locked' while the served runs write to it, and a
    failed create leaves nothing behind."""
    for attempt in range(3):
        response = httpx.post(f"{api_url}/deployments/{deployment_id}/create_flow_run",
                              json={"parameters": parameters})
        if response.status_code < 500:
            break
        time.sleep(1 + attempt)
    assert response.status_code == 201, f"{response.status_code}: {response.text}"
    return response.json()["id"]


def test_a_second_run_for_a_busy_namespace_waits_then_completes(server):
    deployment = next(d for d in httpx.post(f"{server['api_url']}/deployments/filter", json={}).json()
                      if d["name"] == "on-demand")
    request = {"namespace": "queued", "sources": [str(server["docs"])], "config": str(server["config"]), "force": True}
    ids = [_create_flow_run(server["api_url"], deployment["id"], {"request": request}) for _ in range(2)]
    runs = [_wait_final(server["api_url"], run_id) for run_id in ids]
    assert [run["state"]["type"] for run in runs] == ["COMPLETED", "COMPLETED"], \
        [run["state"]["message"] for run in runs]
    # one writer at a time: the engine's work (its task runs) of one run ends before the other's begins. Which
    # run takes the namespace's slot first is not the order the runs started in (both start, one waits)
    first, second = sorted(_task_span(server["api_url"], run_id) for run_id in ids)
    assert first[1] <= second[0], (first, second)


def _task_span(api_url: str, run_id: str) -> tuple[str, str]:
    """(first start, last end) of a flow run's task runs."""
    tasks = httpx.post(f"{api_url}/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}).json()
    assert tasks, f"flow run {run_id} has no task runs"
    return min(t["start_time"] for t in tasks if t["start_time"]), max(t["end_time"] for t in tasks if t["end_time"])


def _run_logs(api_url: str, output: str) -> str:
    """The state message and the logs of the flow run `prefect deployment run` printed the id of."""
    run_id = _flow_run_id(output)
    run = httpx.get(f"{api_url}/flow_runs/{run_id}").json()
    logs = httpx.post(f"{api_url}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run_id]}}}).json()
    return "\n".join([f"state: {run['state']['message']}", *(log["message"] for log in logs)])[-6000:]


def test_prefect_yaml_deploys_to_a_process_pool_and_a_worker_runs_it(server, tmp_path):
    """Last in this module: it re-registers on-demand on the work pool, replacing the served one."""
    prefect = str(BIN / "prefect")
    # `kbflow serve` polls for runs of the deployments it registered, by id, and the pool's deployments keep
    # those ids: stopped, it cannot take the run meant for the worker
    _stop(server["serve"])

    def cli(*args):
        result = subprocess.run([prefect, *args], cwd=REPO, env=server["env"], capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout + result.stderr

    cli("work-pool", "create", "kbflow-process", "--type", "process")
    cli("--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    pooled = {d["name"]: d for d in httpx.post(f"{server['api_url']}/deployments/filter", json={}).json()
              if d["work_pool_name"] == "kbflow-process"}
    assert set(pooled) == {"nightly-default", "on-demand", "backfill", "reembed"}
    assert pooled["on-demand"]["parameter_openapi_schema"]["definitions"]["IngestRequest"]

    worker_log = tmp_path / "worker.log"
    worker = _start([prefect, "worker", "start", "--pool", "kbflow-process", "--limit", "1"],
                    {**server["env"], "PREFECT_WORKER_QUERY_SECONDS": "2",
                     "KBFLOW_CONFIGS_DIR": str(server["config"].parent)}, worker_log)  # the configs it may read
    try:
        request = {"namespace": "srv", "config": str(server["config"]), "dry_run": True}
        run = subprocess.run([prefect, "deployment", "run", "kbflow-ingest-request/on-demand",
                              "--param", f"request={json.dumps(request)}", "--watch", "--watch-timeout", "300"],
                             cwd=REPO, env=server["env"], capture_output=True, text=True, timeout=300)
    finally:
        _stop(worker)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "finished successfully in 'Completed'" in output, \
        _run_logs(server["api_url"], output) + "\n--- worker log ---\n" + worker_log.read_text()[-3000:]
    summary = httpx.post(f"{server['api_url']}/artifacts/filter", json={
        "artifacts": {"key": {"any_": ["kbflow-srv-plan-summary"]}}}).json()
    figures = {(row["group"], row["item"]): row["value"] for row in json.loads(summary[0]["data"])}
    assert figures[("documents", "unchanged")] == 4  # the dry run saw what the served run ingested
