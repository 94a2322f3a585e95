"""`kbflow bench overhead`: what a small job costs beside its work, per way of running the engine.

Three ways, measured in one run on the same corpus and data dir:
* ``direct``: no Prefect server configured, the engine in the process (the default without ``PREFECT_API_URL``);
* ``prefect-temporary``: a flow run with no server configured, so Prefect starts a temporary one in the process
  (how every write ran before the engine moved out of the flows);
* ``prefect-server``: a flow run reporting to a running ``prefect server`` (started here on a free loopback port).

For each: a no-op ``kbflow ingest`` of the corpus as a whole process (fresh interpreter: imports, config, scan,
plan, exit), and, in one warm process, ``KnowledgeBase.add_text`` of one sentence several times (the first call
pays model and store opening; the later ones are what an agent calling it in a loop pays) and a search.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbflow.core.errors import ConfigError
from kbflow.bench.results import save

MODES = ("direct", "prefect-temporary", "prefect-server")
ADD_TEXT_SCRIPT = """
import json, sys, time
started = time.perf_counter()
from kbflow import KnowledgeBase
kb = KnowledgeBase(namespace="overhead-agent", data_dir=sys.argv[1])
import_s = time.perf_counter() - started
calls = []
for i in range(int(sys.argv[2])):
    t = time.perf_counter()
    kb.add_text(f"Note {i}: the agent learned fact number {i} about the quick brown fox.", doc_id=f"note-{i}")
    calls.append(time.perf_counter() - t)
t = time.perf_counter()
hits = kb.search("what did the agent learn about the fox?")
print(json.dumps({"import_s": import_s, "add_text_s": calls, "search_s": time.perf_counter() - t,
                  "hits": len(hits)}))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment(mode: str, api_url: str | None, prefect_home: Path) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    env["PREFECT_HOME"] = str(prefect_home)  # the temporary server's database stays out of the user's ~/.prefect
    env["KBFLOW__FLOW__ORCHESTRATOR"] = "direct" if mode == "direct" else "prefect"
    if mode == "prefect-server":
        if api_url is None:
            raise ValueError("the prefect-server mode needs the temporary server's API URL")
        env["PREFECT_API_URL"] = api_url
    return env


def _timed(command: list[str], env: dict, cwd: Path) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - started
    if result.returncode not in (0, 1):
        raise ConfigError(f"bench overhead: {' '.join(command[:4])}… failed ({result.returncode}): "
                          f"{result.stderr[-800:]}")
    return wall, result


class _PrefectServer:
    """A real `prefect server` on a free loopback port with its own database, for the prefect-server mode."""

    def __init__(self, home: Path):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_UI_ENABLED": "false",
                    "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'server.db'}"}
        self.log = home / "server.log"
        self.process = None

    def __enter__(self):
        import httpx

        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                         "--port", str(self.port)], env=self.env, stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(1)
        self.__exit__()
        raise ConfigError(f"bench overhead: prefect server did not start in 180 s; see {self.log}")

    def __exit__(self, *exc):
        import signal

        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


def bench_overhead(corpus: Path, out_file: Path, repeats: int = 3, add_texts: int = 6,
                   modes: tuple[str, ...] = MODES, work_dir: Path | None = None) -> dict:
    corpus = Path(corpus)
    if not corpus.is_dir():
        raise ConfigError(f"--corpus {str(corpus)!r} is not a folder; pass a small folder of documents "
                          "(e.g. data/sample in a checkout)")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or repeats < 1 or add_texts < 2:
        raise ConfigError(f"bench overhead: modes must be among {list(MODES)} (got {unknown}), --repeats >= 1 and "
                          "--add-texts >= 2")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    kbflow = [sys.executable, "-m", "kbflow.cli"]
    data_dir = work / "data"
    # the namespace exists and holds the corpus before any timing: every timed ingest is a no-op
    _timed([*kbflow, "ingest", str(corpus.resolve()), "--data-dir", str(data_dir)],
           _environment("direct", None, work / "prefect-home"), work)
    results = []
    server = _PrefectServer(work / "prefect-server") if "prefect-server" in modes else None
    try:
        if server is not None:
            server.__enter__()
        for mode in modes:
            env = _environment(mode, server.url if server else None, work / f"prefect-home-{mode}")
            walls = []
            for _ in range(repeats):
                wall, run = _timed([*kbflow, "ingest", str(corpus.resolve()), "--data-dir", str(data_dir), "--json"],
                                   env, work)
                summary = json.loads(run.stdout)
                if summary["chunks"]["embedded"] or summary["documents"]["changed"] or summary["documents"]["new"]:
                    raise ConfigError(f"bench overhead: the {mode} re-run was not a no-op: {summary['documents']}")
                walls.append(wall)
            agent_dir = work / f"agent-{mode}"
            shutil.rmtree(agent_dir, ignore_errors=True)
            _, run = _timed([sys.executable, "-c", ADD_TEXT_SCRIPT, str(agent_dir), str(add_texts)], env, work)
            agent = json.loads(run.stdout.strip().splitlines()[-1])
            later = agent["add_text_s"][1:]
            results.append({
                "mode": mode,
                "noop_ingest_process_s": [round(w, 3) for w in walls],
                "noop_ingest_process_median_s": round(statistics.median(walls), 3),
                "add_text_first_s": round(agent["add_text_s"][0], 3),
                "add_text_warm_median_s": round(statistics.median(later), 3),
                "add_text_warm_max_s": round(max(later), 3),
                "add_text_s": [round(s, 3) for s in agent["add_text_s"]],
                "library_import_s": round(agent["import_s"], 3),
                "search_after_writes_s": round(agent["search_s"], 3),
                "stderr_lines_of_add_text": len([line for line in run.stderr.splitlines() if line.strip()]),
            })
    finally:
        if server is not None:
            server.__exit__()
    by_mode = {row["mode"]: row for row in results}
    ratios = {}
    if "direct" in by_mode and "prefect-temporary" in by_mode:
        ratios["noop_ingest_temporary_over_direct"] = round(
            by_mode["prefect-temporary"]["noop_ingest_process_median_s"] / by_mode["direct"]["noop_ingest_process_median_s"], 2)
        ratios["add_text_warm_temporary_over_direct"] = round(
            by_mode["prefect-temporary"]["add_text_warm_median_s"] / by_mode["direct"]["add_text_warm_median_s"], 2)
    result = {"corpus": str(corpus), "repeats": repeats, "add_texts": add_texts, "modes": results, "ratios": ratios}
    return save(result, out_file, _plot)


def _plot(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [row["mode"] for row in result["modes"]]
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    values = [row["noop_ingest_process_median_s"] for row in result["modes"]]
    axes[0].bar(modes, values, color="tab:blue")
    axes[0].set_title("no-op `kbflow ingest`, whole process (s)")
    for x, value in zip(modes, values):
        axes[0].annotate(f"{value:.1f}", (x, value), ha="center", va="bottom", fontsize=8)
    first = [row["add_text_first_s"] for row in result["modes"]]
    warm = [row["add_text_warm_median_s"] for row in result["modes"]]
    positions = range(len(modes))
    axes[1].bar([p - 0.2 for p in positions], first, width=0.4, label="first call")
    axes[1].bar([p + 0.2 for p in positions], warm, width=0.4, label="later calls (median)")
    axes[1].set_xticks(list(positions), modes)
    axes[1].set_yscale("log")
    axes[1].set_title("KnowledgeBase.add_text, warm process (s, log)")
    axes[1].legend(fontsize=8)
    for axis in axes:
        axis.tick_params(axis="x", labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
