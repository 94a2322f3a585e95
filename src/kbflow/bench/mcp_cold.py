"""`kbflow bench search --sample DIR --cold`: how long an agent waits for `kbflow mcp` from a cold start.

The sample folder is ingested once into ``--work-dir``; then, ``--rounds`` times, a fresh server process is
started as a client starts it, with the default model (or the config's), and timed from the spawn:

- stdio: ``initialize`` answered (the server answers once the model and table are loaded), the first ``search``
  result from the spawn and from that answer, a second (warm) search, and, after the client closes stdin, the
  process's exit. The messages are written as the MCP JSON-RPC lines a client sends, so the
  times are the server's and the pipe's, not a client library's.
- streamable HTTP: the port accepting connections (once the model and table are loaded), then the first
  ``search`` result of a client session from the spawn and from the port's opening (the SDK's client, a bearer
  token made for the run).

Each round starts a new process; the machine's load average is recorded beside the times.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbflow.bench.common import machine
from kbflow.bench.results import save
from kbflow.core.errors import KbflowError

PROTOCOL = "2025-06-18"
QUERY = "how do I restore a backup"
START_S = 300  # a server that has not answered by then has failed


def _kbflow() -> str:
    return str(Path(sys.executable).with_name("kbflow"))


def _env(**extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "KBFLOW_FAIL"))}
    return {**env, **extra}


def _stdio_round(data_dir: Path, namespace: str, config) -> dict:
    args = [_kbflow(), "mcp", "--data-dir", str(data_dir), "--namespace", namespace, "--read-only"] + \
        (["--config", str(config)] if config else [])
    started = time.perf_counter()
    server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env())
    times: dict[str, float] = {}

    def call(message: dict) -> dict | None:
        assert server.stdin is not None and server.stdout is not None
        server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        server.stdin.flush()
        if "id" not in message:
            return None
        line = server.stdout.readline()
        if not line:
            error = server.stderr.read() if server.stderr is not None else ""
            raise KbflowError(f"kbflow mcp (stdio) ended before answering: {error[-2000:]}")
        return json.loads(line)

    try:
        call({"id": 1, "method": "initialize", "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                                                          "clientInfo": {"name": "kbflow-bench", "version": "1"}}})
        times["initialize_s"] = time.perf_counter() - started
        call({"method": "notifications/initialized"})
        for key, number in (("first_search_s", 2), ("second_search_s", 3)):
            before = time.perf_counter()
            answer = call({"id": number, "method": "tools/call",
                           "params": {"name": "search", "arguments": {"query": QUERY}}})
            if answer is None or answer.get("error") or answer["result"].get("isError"):
                raise KbflowError(f"search over stdio failed: {answer}")
            times[key] = time.perf_counter() - (started if key == "first_search_s" else before)
        times["first_search_after_ready_s"] = times["first_search_s"] - times["initialize_s"]
        assert server.stdin is not None
        closed = time.perf_counter()
        server.stdin.close()
        status = server.wait(timeout=120)
        times["exit_after_eof_s"] = time.perf_counter() - closed
        times["exit_status"] = status
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return {key: round(value, 3) if isinstance(value, float) else value for key, value in times.items()}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _http_round(data_dir: Path, namespace: str, config) -> dict:
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    port, token = _free_port(), secrets.token_urlsafe(32)
    args = [_kbflow(), "mcp", "--data-dir", str(data_dir), "--namespace", namespace, "--read-only", "--http",
            f"127.0.0.1:{port}"] + (["--config", str(config)] if config else [])
    log = tempfile.TemporaryFile(mode="w+")
    started = time.perf_counter()
    server = subprocess.Popen(args, env=_env(KBFLOW_MCP_TOKEN=token), stdout=log, stderr=subprocess.STDOUT)
    times: dict[str, float] = {}
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.perf_counter() - started > START_S:
                    log.seek(0)
                    raise KbflowError(f"kbflow mcp --http did not start: {log.read()[-2000:]}") from None
                time.sleep(0.02)
        times["listening_s"] = time.perf_counter() - started

        async def first_result() -> None:
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=START_S) as http:
                async with Client(streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http),
                                  read_timeout_seconds=START_S) as client:
                    result = await client.call_tool("search", {"query": QUERY})
                    if result.is_error:
                        raise KbflowError(f"search over HTTP failed: {result.content}")
                    times["first_search_s"] = time.perf_counter() - started
                    times["first_search_after_ready_s"] = times["first_search_s"] - times["listening_s"]
                    before = time.perf_counter()
                    await client.call_tool("search", {"query": QUERY})
                    times["second_search_s"] = time.perf_counter() - before

        anyio.run(first_result)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    return {key: round(value, 3) for key, value in times.items()}


def _median(rows: list[dict], key: str) -> float | None:
    values = sorted(row[key] for row in rows if isinstance(row.get(key), (int, float)))
    return round(values[len(values) // 2], 3) if values else None


def bench_mcp_cold(sample: Path, out_file: Path, rounds: int = 3, work_dir: Path | None = None,
                   config=None) -> dict:
    from kbflow import KnowledgeBase

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-mcp-cold-"))
    data_dir, namespace = work / "data", "sample"
    kb = KnowledgeBase(namespace=namespace, config=config, data_dir=data_dir)
    kb.add_document(sample)
    loads, stdio, http = [], [], []
    for _ in range(rounds):
        loads.append(round(os.getloadavg()[0], 2))
        stdio.append(_stdio_round(data_dir, namespace, config))
        http.append(_http_round(data_dir, namespace, config))
    loads.append(round(os.getloadavg()[0], 2))
    result = {
        "sample": str(sample), "namespace_chunks": kb.stats()["chunks"], "model_id": kb.stats()["model_id"],
        "rounds": rounds, "machine": machine(), "load_avg_1m_per_round": loads,
        "stdio": {"median": {key: _median(stdio, key) for key in ("initialize_s", "first_search_s",
                                                                 "first_search_after_ready_s", "second_search_s",
                                                                 "exit_after_eof_s")},
                  "rounds": stdio},
        "http": {"median": {key: _median(http, key) for key in ("listening_s", "first_search_s",
                                                                "first_search_after_ready_s", "second_search_s")},
                 "rounds": http},
    }
    return save(result, out_file, plot_mcp_cold)


def plot_mcp_cold(result: dict, png: Path) -> Path:
    """Median seconds from the spawn to each step, stdio and HTTP side by side."""
    from kbflow.bench.results import panels

    with panels(png, columns=2, title=f"kbflow mcp from a cold start ({result['rounds']} rounds, medians)") as (_fig,
                                                                                                            axes):
        for ax, transport in zip(axes, ("stdio", "http")):
            medians = {key: value for key, value in result[transport]["median"].items() if value is not None}
            ax.barh(list(medians), list(medians.values()), color="#4c72b0")
            ax.set_xlabel("seconds")
            ax.set_title(transport)
    return png
