"""`kbflow bench memory`: peak memory of an ingest against the size of the corpus.

Each share of the corpus's pages (by default half, then all of them; pages are ``*.html``: a manual's images
and page sources are not its text) is ingested by a fresh Python process into a fresh data dir, so one share's
peak cannot hide another's. The half takes every other file of the sorted file list,
so both shares hold the same mix of page sizes. Reported per share: files, bytes, chunks, wall seconds and

* ``peak_rss_mb``: the ingest process's own peak resident set (``ru_maxrss``, the kernel's exact figure);
* ``peak_tree_rss_mb``: the peak of the sum over the process and its children (the temporary Prefect server,
  conversion workers), sampled from ``/proc`` every ``SAMPLE_S`` seconds, so a shorter spike can be missed;
* ``rss_series``: those samples, for the plot.

If memory is bounded by the batch sizes (``flow.doc_batch``, ``embedder.task_batch``), the full corpus peaks where
the half does; if something holds the whole corpus, the full peak grows by what the second half adds.
Linux only (``/proc``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from fnmatch import fnmatch
from pathlib import Path

from kbflow.bench.common import corpus_dir
from kbflow.bench.results import save
from kbflow.core.errors import ConfigError

SAMPLE_S = 0.25
PAGE_KB = os.sysconf("SC_PAGE_SIZE") // 1024


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _rss_kb(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_KB
    except (OSError, IndexError, ValueError):
        return 0


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its descendants, in MB."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += _rss_kb(current)
        todo += _children(current)
    return total / 1024


def share_of(files: list[Path], root: Path, fraction: float, into: Path) -> tuple[int, int]:
    """Hard-link (or copy) an evenly spread ``fraction`` of the files under ``into``, keeping relative paths."""
    step = 1 / fraction
    chosen = [files[int(i * step)] for i in range(max(1, round(len(files) * fraction)))]
    for path in chosen:
        target = into / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
    return len(chosen), sum(p.stat().st_size for p in chosen)


def _child(source: str, data_dir: str, config: str | None) -> None:
    """Run in the measured process: one ingest, then its summary and peak RSS as one JSON line."""
    import resource

    from kbflow import api
    from kbflow.runtime import memory

    memory.limit_arenas()  # as the kbflow command does

    summary = api.ingest([source], "bench-memory", config or None, Path(data_dir))
    print(json.dumps({"chunks": summary["store"]["count"], "embedded": summary["chunks"]["embedded"],
                      "documents": summary["documents"], "failures": len(summary.get("failures", [])),
                      "stage_seconds": summary["seconds"],
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def measure_share(source: Path, data_dir: Path, config: Path | None) -> dict:
    command = [sys.executable, "-m", "kbflow.bench.memory", str(source), str(data_dir), str(config or "")]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    series: list[tuple[float, float]] = []
    while process.poll() is None:
        series.append((round(time.perf_counter() - started, 2), round(tree_rss_mb(process.pid), 1)))
        time.sleep(SAMPLE_S)
    stdout, stderr = process.communicate()
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise ConfigError(f"the measured ingest of {source} exited {process.returncode}: {stderr[-2000:]}")
    report = json.loads(stdout.strip().splitlines()[-1])
    return {**report, "wall_s": round(wall, 1), "peak_tree_rss_mb": max((m for _, m in series), default=0.0),
            "rss_series": series[:: max(1, len(series) // 400)]}


def bench_memory(corpus: Path, fractions: list[float], out_file: Path, work_dir: Path | None,
                 config: Path | None, patterns: tuple[str, ...] = ("*.html", "*.htm")) -> dict:
    if not fractions or any(not 0 < f <= 1 for f in fractions):
        raise ConfigError(f"--fraction takes values in (0, 1]; got {fractions}")
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-memory-"))
    root = corpus_dir(corpus, work / "corpus")
    files = sorted(p for p in root.rglob("*") if p.is_file() and any(fnmatch(p.name, pat) for pat in patterns))
    if not files:
        raise ConfigError(f"--corpus {corpus} holds no files matching {', '.join(patterns)}")
    shares = []
    for fraction in sorted(set(fractions)):
        share_dir = work / f"share-{fraction:g}" / root.name
        shutil.rmtree(share_dir.parent, ignore_errors=True)
        count, size = share_of(files, root, fraction, share_dir)
        row = {"fraction": fraction, "files": count, "bytes": size}
        row.update(measure_share(share_dir, work / f"data-{fraction:g}", config))
        shares.append(row)
    result: dict[str, object] = {"corpus": str(corpus), "patterns": list(patterns),
                                 "config": str(config) if config else None, "sample_s": SAMPLE_S, "shares": shares}
    if len(shares) > 1:
        small, large = shares[0], shares[-1]
        result["peak_growth"] = {
            "bytes_ratio": round(large["bytes"] / small["bytes"], 2),
            "chunks_ratio": round(large["chunks"] / max(small["chunks"], 1), 2),
            "peak_rss_ratio": round(large["peak_rss_mb"] / small["peak_rss_mb"], 3),
            "peak_rss_delta_mb": round(large["peak_rss_mb"] - small["peak_rss_mb"], 1)}
    return save(result, out_file, plot_memory)


def plot_memory(result: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4))
    for share in result["shares"]:
        xs = [t for t, _ in share["rss_series"]]
        ys = [m for _, m in share["rss_series"]]
        axis.plot(xs, ys, label=f"{share['fraction']:g} of corpus: {share['files']} files, {share['chunks']} chunks, "
                                f"peak {share['peak_rss_mb']:.0f} MB (process)")
    axis.set_xlabel("seconds into the ingest")
    axis.set_ylabel("resident MB (process + children)")
    axis.set_title(f"kbflow ingest memory: {Path(result['corpus']).name}")
    axis.set_ylim(bottom=0)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


if __name__ == "__main__":  # the measured child process
    _child(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
