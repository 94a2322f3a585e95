"""`kbflow bench search --sample DIR --clients 1,6`: MCP `search` as agents see it, with several at once.

The sample folder is ingested once into ``--work-dir`` (kept: a repeat reuses it); then a real
``kbflow mcp --http 127.0.0.1:PORT`` process serves it, with a bearer token made for the run (passed to the server
in ``KBFLOW_MCP_TOKEN``, to the clients in memory, never printed or written), so every call goes through the same
gate a deployed server has. Each client is its own process with its own MCP session (the SDK's
``streamable_http_client`` and ``Client``), as separate agents are; each times the round trip of its ``search``
calls, with queries of its own.

Rounds interleave the variants: in each round, ``KnowledgeBase.search`` in this process over the same queries
(the server idle), then each client count in turn; the percentiles pool every round. The in-process p50 and the
MCP p50 come from the same run, so their difference is what the transport adds. The machine's load average is
recorded beside them.
"""

from __future__ import annotations

import multiprocessing
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbflow.bench.common import machine
from kbflow.bench.results import panels, save

SERVER_START_S = 180  # the server imports the engine and loads the model before its first answer


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _client_process(url: str, token: str, commands, answers) -> None:
    """One agent: an MCP session held open; each command is a list of queries, answered with their round trips
    in ms (each ``search`` call, from the request's send to its parsed result)."""
    import anyio
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async def main() -> None:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300) as http:
            async with Client(streamable_http_client(url, http_client=http), read_timeout_seconds=300) as client:
                await client.call_tool("search", {"query": "warm-up"})  # the session's first call: not timed
                answers.send(("ready", []))
                while (queries := await anyio.to_thread.run_sync(commands.recv)) is not None:
                    samples = []
                    for query in queries:
                        started = time.perf_counter()
                        result = await client.call_tool("search", {"query": query})
                        samples.append(1000 * (time.perf_counter() - started))
                        if result.is_error:
                            answers.send(("error", [str(getattr(result.content[0], "text", result.content[0]))]))
                            return
                    answers.send(("done", samples))

    try:
        anyio.run(main)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the run with it
        answers.send(("error", [f"{type(exc).__name__}: {exc}"]))


class _Server:
    """``kbflow mcp --http`` over the sample's data dir, as its own process, token in its environment."""

    def __init__(self, config, data_dir: Path, namespace: str, token: str):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        kbflow = str(Path(sys.executable).with_name("kbflow"))
        args = [kbflow, "mcp", "--data-dir", str(data_dir), "--namespace", namespace, "--read-only",
                "--http", f"127.0.0.1:{self.port}"] + (["--config", str(config)] if config else [])
        env = {key: value for key, value in os.environ.items() if not key.startswith("PREFECT_API")}
        self.log = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(args, env={**env, "KBFLOW_MCP_TOKEN": token}, stdout=self.log,
                                        stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    output = self.output()
                    self.stop()
                    from kbflow.core.errors import KbflowError

                    raise KbflowError(f"kbflow mcp --http did not start: {output[-2000:]}") from None
                time.sleep(0.3)

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


class _Clients:
    """``count`` client processes, each with its MCP session open (spawned: this process holds torch's threads)."""

    def __init__(self, url: str, token: str, count: int):
        context = multiprocessing.get_context("spawn")
        self.pipes, self.processes = [], []
        for _ in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_client_process, args=(url, token, theirs, theirs), daemon=True)
            process.start()
            self.pipes.append(ours)
            self.processes.append(process)
        try:
            for pipe in self.pipes:
                self._answer(pipe)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _answer(pipe) -> list[float]:
        if not pipe.poll(SERVER_START_S):
            from kbflow.core.errors import KbflowError

            raise KbflowError(f"an MCP bench client gave no answer within {SERVER_START_S} s")
        kind, payload = pipe.recv()
        if kind == "error":
            from kbflow.core.errors import KbflowError

            raise KbflowError(f"an MCP bench client failed: {payload[0]}")
        return payload

    def run(self, queries_per_client: list[list[str]]) -> list[float]:
        """The first ``len(queries_per_client)`` clients at once, each through its queries; every round trip."""
        for pipe, queries in zip(self.pipes, queries_per_client):
            pipe.send(queries)
        return [sample for pipe in self.pipes[:len(queries_per_client)] for sample in self._answer(pipe)]

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(None)
            except OSError:
                pass
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()


def client_queries(questions: list[str], clients: int, calls: int, round_number: int) -> list[list[str]]:
    """Each client's queries for one round: distinct between clients (a suffix when the list runs out)."""
    plan = []
    for client in range(clients):
        queries = []
        for call in range(calls):
            index = (round_number * clients * calls) + client * calls + call
            base = questions[index % len(questions)]
            lap = index // len(questions)
            queries.append(base if lap == 0 else f"{base} ({lap})")
        plan.append(queries)
    return plan


def bench_mcp_clients(sample: Path, out_file: Path, clients: list[int], calls: int, rounds: int = 3,
                      work_dir: Path | None = None, config=None) -> dict:
    """p50/p95/p99 of MCP ``search`` round trips per client count, and in-process ``KnowledgeBase.search`` over
    the same queries, interleaved over ``rounds`` (see the module's doc)."""
    import numpy as np

    from kbflow import KnowledgeBase
    from kbflow.bench.search import percentiles
    from kbflow.bench.warm_search import QUESTIONS

    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-mcp-"))
    data_dir, namespace = work / "data", "sample"
    kb = KnowledgeBase(namespace=namespace, config=config, data_dir=data_dir)
    kb.add_document(sample)
    for query in QUESTIONS[:3]:  # warm: weights, table, full-text index
        kb.search(query)
    token = secrets.token_urlsafe(32)
    server = _Server(config, data_dir, namespace, token)
    pool = None
    in_process: list[float] = []
    per_count: dict[int, list[float]] = {count: [] for count in clients}
    loads: list[float] = []
    try:
        pool = _Clients(server.url, token, max(clients))
        for round_number in range(rounds):
            loads.append(os.getloadavg()[0])
            for count in clients:
                plan = client_queries(QUESTIONS, count, calls, round_number)
                for queries in plan:  # the same queries in this process, the server idle
                    for query in queries:
                        started = time.perf_counter()
                        kb.search(query)
                        in_process.append(1000 * (time.perf_counter() - started))
                per_count[count] += pool.run(plan)
        loads.append(os.getloadavg()[0])
    finally:
        if pool is not None:
            pool.close()
        server.stop()
    reference = percentiles(in_process)
    rows = []
    for count in clients:
        row = {"clients": count, "calls_per_client": calls * rounds, **percentiles(per_count[count])}
        row["overhead_p50_ms"] = round(row["p50_ms"] - reference["p50_ms"], 3)
        row.pop("qps")
        rows.append(row)
    result = {"sample": str(sample), "namespace_chunks": kb.searcher.store.count(),
              "model_id": kb.searcher.embedder.model_id, "mode": "hybrid", "transport": "streamable HTTP, bearer token",
              "rounds": rounds, "calls_per_client_per_round": calls, "cpu_count": os.cpu_count(), "machine": machine(),
              "load_avg_1m": round(float(np.mean(loads)), 2), "load_avg_1m_range": [round(min(loads), 2),
                                                                                   round(max(loads), 2)],
              "in_process": reference, "mcp_search": rows}
    return save(result, out_file, plot_mcp_clients)


def plot_mcp_clients(result: dict, png: Path) -> Path:
    """Round-trip p50, p95 and p99 per client count, the in-process p50 as a line."""
    with panels(png, columns=1, size=(6, 4), title="MCP search over streamable HTTP") as (_, axis):
        counts = [str(row["clients"]) for row in result["mcp_search"]]
        for offset, key in enumerate(("p50_ms", "p95_ms", "p99_ms")):
            axis.bar([i + offset * 0.27 for i in range(len(counts))], [row[key] for row in result["mcp_search"]],
                     0.27, label=key.replace("_ms", ""))
        axis.axhline(result["in_process"]["p50_ms"], color="black", linewidth=0.8,
                     label="KnowledgeBase.search p50 (in process)")
        axis.set_xticks([i + 0.27 for i in range(len(counts))], counts)
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel("ms per search call")
        axis.set_title(f"load average {result['load_avg_1m']} on {result['cpu_count']} cores", fontsize=9)
        axis.legend(fontsize=8)
    return png
