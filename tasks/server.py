"""A temporary Prefect server for flow runs in a process with no server configured, that dies with its process.

Prefect would start one of its own (a uvicorn child) and stop it at exit, but a SIGKILL of the parent leaves that
child running for good, holding a port and a few hundred MB (reparented to PID 1). This one is ``prefect server
start`` (uvicorn in its own process, API only, no services) that asks the kernel for a parent-death signal before
it execs, so it is killed whenever the process that started it dies, however it dies. It is started without a
fork of this process (a small Python launcher sets the signal, then execs the server): forking a process that
holds LanceDB's runtime threads risks a deadlock in the child, and LanceDB warns on stderr when it happens.

One server per process: started by the first flow run that needs it and kept for the later ones (a library
caller's second ``add_text`` must not pay ~15 s again), stopped at exit.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from kbflow.core.errors import ConfigError

PR_SET_PDEATHSIG = 1
# the server's launcher: die with the parent (checked after the call, in case the parent died first), then exec
LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL('libc.so.6', use_errno=True).prctl({PR_SET_PDEATHSIG}, signal.SIGKILL)\n"
    "os.getppid() == int(sys.argv[1]) or os._exit(1)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'prefect', *sys.argv[2:]])\n"
)
_lock = threading.Lock()
_server: dict = {}  # url, process, log of this process's temporary server, once started


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _drain_to_server() -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=10)


def _start() -> dict:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/api"
    log = Path(tempfile.mkstemp(prefix="kbflow-prefect-server-", suffix=".log")[1])
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-c", LAUNCHER, str(os.getpid()), "server", "start", "--host",
                                    "127.0.0.1", "--port", str(port), "--no-services", "--log-level", "WARNING"],
                                   env=env, stdout=output, stderr=subprocess.STDOUT)
    server = {"url": url, "process": process, "log": log}
    try:
        timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180"))
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise ConfigError(f"the temporary Prefect server exited ({process.returncode}); its log: "
                                  f"{log.read_text()[-1500:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ConfigError(f"the temporary Prefect server did not answer within {timeout:g} s "
                                  "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); start one with `prefect server "
                                  "start` and set PREFECT_API_URL, or set flow.orchestrator: direct")
            time.sleep(0.5)
    except BaseException:
        _stop(server)
        raise


def _stop(server: dict) -> None:
    process = server["process"]
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    server["log"].unlink(missing_ok=True)


def _stop_at_exit() -> None:
    with _lock:
        if _server:
            _stop(_server)
            _server.clear()


atexit.register(_stop_at_exit)  # once per process; a server restarted after dying is stopped by the same call


@contextmanager
def temporary_server():
    """Yield the API URL of this process's temporary Prefect server (started on first use, stopped at exit);
    this process's Prefect client uses it inside the block."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with _lock:
        if _server and _server["process"].poll() is not None:  # it died: start another
            _server.clear()
        if not _server:
            _server.update(_start())
        url = _server["url"]
    with temporary_settings(updates={PREFECT_API_URL: url}):
        try:
            yield url
        finally:
            _drain_to_server()  # this run's queued logs and events reach the server
