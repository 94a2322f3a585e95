"""`kbflow bench ingest`: full ingest, no-op re-run, update, and the raw-encode floor, in one process."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbflow import api
from kbflow.bench.common import check_corpus, corpus_dir, machine, peak_rss_mb, phase_row, same_store
from kbflow.bench.results import save
from kbflow.config import load_config
from kbflow.embed import get_embedder
from kbflow.core.errors import ConfigError
from kbflow.state.snapshots import read_table
from kbflow.core.storage import location


def _reset_phase_peak() -> None:
    """Start a new peak-RSS measurement (Linux: writing 5 to clear_refs resets the process's VmHWM)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _phase_peak_mb() -> float | None:
    """The process's peak resident memory since the last reset (VmHWM), or None where /proc cannot say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _phase(name: str, sources: list[str], namespace: str, data_dir: Path, config) -> dict:
    _reset_phase_peak()
    started = time.perf_counter()
    summary = api.ingest(sources, namespace, config, str(data_dir))
    return phase_row(name, time.perf_counter() - started, summary, _phase_peak_mb())


def _process_rerun(sources: list[str], namespace: str, data_dir: Path, config) -> dict:
    """The no-op re-run as a user runs it: a fresh ``kbflow ingest`` process, interpreter start, imports, model
    and store opening included."""
    command = [sys.executable, "-m", "kbflow", "ingest", *sources, "-n", namespace, "--data-dir", str(data_dir),
               "--json"]
    if config is not None:
        command += ["-c", str(config)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"the re-run process failed ({done.returncode}): {done.stderr[-2000:]}")
    # the largest child's peak: this process starts no other child
    return phase_row("rerun-process", wall, json.loads(done.stdout),
                      round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1))


def _run_texts(data_dir, namespace: str, run_id: str) -> dict[str, str]:
    """What the model reads for each chunk of a run (its snapshot), by ``embed_sha256``."""
    texts: dict[str, str] = {}
    for path in sorted((data_dir / "runs" / namespace / run_id / "chunks").glob("*.parquet"), key=str):
        table = read_table(path).select(["embed_sha256", "embed_prefix", "text"])
        for key, prefix, text in zip(*(table.column(c).to_pylist() for c in ("embed_sha256", "embed_prefix", "text"))):
            texts.setdefault(key, prefix + text)
    return texts


def _floor(texts: dict[str, str], config, phase: str = "floor") -> dict:
    """The model alone on ``texts``, in the calls the embed stage makes (``embedder.task_batch`` texts each), with
    nothing else to do: any backend."""
    settings = load_config(config).embedder
    embedder = get_embedder(settings)
    values = list(texts.values())
    started = time.perf_counter()
    for start in range(0, len(values), settings.task_batch):
        embedder.embed_documents(values[start:start + settings.task_batch])
    return {"phase": phase, "wall_s": round(time.perf_counter() - started, 3), "texts": len(texts)}


def bench_ingest(corpus: Path, update_to: Path | None, out_file: Path, work_dir: Path | None, config,
                 data_dir: str | None = None) -> dict:
    """The phases on ``corpus`` (and ``update_to``) with the knowledge base in ``data_dir`` (default:
    ``<work>/data``; an object-storage URL measures it there)."""
    # every argument is checked before any work: a mistake must not cost the full phase first
    top_a = check_corpus(corpus)
    if update_to:
        top_b = check_corpus(update_to, "--update-to")
        if top_b != top_a:
            raise ConfigError(f"--update-to's top folder {top_b!r} differs from --corpus's {top_a!r}: the documents' "
                              "source paths would not match, so the update would be a removal of everything plus a "
                              "new corpus. Give both versions the same top folder name")
    embedder = get_embedder(load_config(config).embedder)
    machine_at_start = machine()
    work = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="kbflow-bench-"))
    data_path = location(data_dir) if data_dir else work / "data"
    source_a = corpus_dir(corpus, work / "corpus-a")
    source_b = corpus_dir(update_to, work / "corpus-b") if update_to else None
    started = time.perf_counter()
    embedder.embed_documents(["warm up"])  # model load is timed on its own, not charged to the first phase
    load_s = time.perf_counter() - started
    phases = [_phase("full", [str(source_a)], "bench", data_path, config)]
    phases.append(_phase("rerun", [str(source_a)], "bench", data_path, config))
    phases.append(_process_rerun([str(source_a)], "bench", data_path, config))
    if update_to:
        phases.append(_phase("update", [str(source_b)], "bench", data_path, config))
        phases.append(_phase("fresh-of-update", [str(source_b)], "bench-fresh", data_path, config))
    by_name = {phase["phase"]: phase for phase in phases}
    full_texts = _run_texts(data_path, "bench", by_name["full"]["run_id"])
    floor = _floor(full_texts, config)
    ratios = {
        "full_over_floor": round(by_name["full"]["wall_s"] / floor["wall_s"], 3),
        "rerun_over_full": round(by_name["rerun"]["wall_s"] / by_name["full"]["wall_s"], 4),
        "rerun_process_over_full": round(by_name["rerun-process"]["wall_s"] / by_name["full"]["wall_s"], 4),
        "rerun_texts_embedded": by_name["rerun"]["texts_embedded"] + by_name["rerun-process"]["texts_embedded"],
    }
    if update_to:
        ratios["update_over_full"] = round(by_name["update"]["wall_s"] / by_name["full"]["wall_s"], 4)
        ratios["update_store_equals_fresh"] = same_store(config, data_path, "bench", "bench-fresh", embedder.dimension)
        # the update's own floor: the model alone on the texts it had to embed (those no earlier run embedded; the
        # re-runs embed none), what no pipeline can avoid; the rest of the update's time is the machinery's
        update_texts = {key: text for key, text in _run_texts(data_path, "bench", by_name["update"]["run_id"]).items()
                        if key not in full_texts}
        floors = {"update_floor": _floor(update_texts, config, "update-floor")}
        ratios["update_floor_over_full"] = round(floors["update_floor"]["wall_s"] / by_name["full"]["wall_s"], 4)
        ratios["update_over_update_floor"] = (round(by_name["update"]["wall_s"] / floors["update_floor"]["wall_s"], 3)
                                              if update_texts else None)
    else:
        floors = {}
    full = by_name["full"]
    documents = sum(full["documents"][key] for key in ("new", "changed", "unchanged"))
    # what a user should expect: the full ingest's time per 1,000 documents (one HTML page of a manual each here)
    per_1000 = {"documents": documents, "full_s": round(full["wall_s"] * 1000 / documents, 1) if documents else None,
                "texts_embedded": round(full["texts_embedded"] * 1000 / documents) if documents else None}
    result = {"corpus": str(corpus), "update_to": str(update_to) if update_to else None, "model_id": embedder.model_id,
              "model_load_s": round(load_s, 3), "phases": phases, "floor": floor, **floors, "ratios": ratios,
              "per_1000_documents": per_1000, "peak_rss_mb": round(peak_rss_mb(), 1),
              "machine": {**machine_at_start, "load_avg_1m_at_end": machine()["load_avg_1m"]}}
    return save(result, out_file, plot_ingest)


def plot_ingest(result: dict, path: Path) -> Path:
    """Wall time per phase, stacked by stage, beside the raw-encode floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = ["scan", "convert", "split", "chunk", "embed", "upsert"]
    names = [phase["phase"] for phase in result["phases"]] + ["floor"]
    figure, axis = plt.subplots(figsize=(8, 4))
    bottoms = [0.0] * len(names)
    for stage in stages:
        values = [phase["stage_seconds"].get(stage, 0.0) for phase in result["phases"]] + [0.0]
        axis.bar(names, values, bottom=bottoms, label=stage)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    axis.bar(["floor"], [result["floor"]["wall_s"]], color="black", label="raw encode")
    for name, phase in zip(names, result["phases"]):
        axis.annotate(f"{phase['wall_s']:.0f}s\n{phase['texts_embedded']} emb.", (name, phase["wall_s"]),
                      ha="center", va="bottom", fontsize=8)
    axis.set_ylabel("seconds")
    axis.set_title(f"kbflow ingest: {Path(result['corpus']).name}")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
