"""A temporary Prefect server for a flow run in a process with no server configured, that dies with its process.

Prefect would start one of its own (a uvicorn child) and stop it at exit, but a SIGKILL of the parent leaves that
child running for good, holding a port and a few hundred MB (reparented to PID 1). This one is ``prefect server
start`` (uvicorn in its own process, API only, no services) started with the kernel's parent-death signal, so it is
killed whenever the process that started it dies, however it dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from kbflow.errors import ConfigError

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _drain_to_server() -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=10)


@contextmanager
def temporary_server():
    """Yield the API URL of a Prefect server started for this process; this process's Prefect client uses it
    inside the block."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = Path(tempfile.mkstemp(prefix="kbflow-prefect-server-", suffix=".log")[1])
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                    "--port", str(port), "--no-services", "--log-level", "WARNING"],
                                   env=env, stdout=output, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
    try:
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise ConfigError(f"the temporary Prefect server exited ({process.returncode}); its log: "
                                  f"{log.read_text()[-1500:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(f"the temporary Prefect server did not answer within {timeout:g} s "
                                  "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); start one with `prefect server "
                                  "start` and set PREFECT_API_URL, or set flow.orchestrator: direct")
            time.sleep(0.5)
        with temporary_settings(updates={PREFECT_API_URL: url}):
            try:
                yield url
            finally:
                _drain_to_server()  # queued run logs and events reach the server before it stops
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.unlink(missing_ok=True)
