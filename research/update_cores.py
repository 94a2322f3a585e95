"""What the model leaving cores to the run's own work (``kbflow.runtime.cores``) does to an update, against the same run with
no work marked.

An update of the PostgreSQL manual from 15.18 to 15.20 converts all 1,166 re-stamped pages again and embeds 299
texts: the cores are nearly always busy, and the question is who waits for whom. The older release is ingested once
(into ``<work>/base``); each trial is a fresh process that loads the model, warms the tokenizer's word counts with
the older release's text (as the full run before an update in `kbflow bench ingest` leaves them), copies the base
store and times the update into the copy. ``unmarked`` trials replace ``kbflow.runtime.cores.working`` with a no-op (no
setting does this: it exists for this comparison only); ``marked`` run kbflow as it ships. Trials alternate, pair
by pair, since this machine's speed drifts from minute to minute.

Reproduce (about ten minutes on 2 cores, nothing else running):

    .venv/bin/python research/update_cores.py --corpus postgresql-15.18-html.tar.xz \\
        --update-to postgresql-15.20-html.tar.xz --pairs 4 --work /tmp/update-cores --out docs/bench/update-cores.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

MODES = ("unmarked", "marked")


def trial(work: Path, mode: str) -> dict:
    import pyarrow.parquet as pq

    from kbflow import api
    from kbflow.runtime import cores
    from kbflow.config import load_config
    from kbflow.embed import get_embedder

    if mode == "unmarked":
        cores.working = nullcontext
    embedder = get_embedder(load_config(None).embedder)
    embedder.embed_documents(["warm up"])
    texts = []
    for path in (work / "base" / "runs" / "bench").glob("*/documents/*.parquet"):
        texts += [text for text in pq.read_table(path, columns=["markdown"]).column("markdown").to_pylist() if text]
    embedder.token_counter().count(texts)
    copy = work / "update"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(work / "base", copy)
    before, started = os.times(), time.perf_counter()
    summary = api.ingest([str(work / "corpus-b")], "bench", None, str(copy))
    wall, after = time.perf_counter() - started, os.times()
    return {"mode": mode, "wall_s": round(wall, 3), "texts_embedded": summary["chunks"]["embedded"],
            "documents_changed": summary["documents"]["changed"],
            "cpu_s": round(after.user + after.system - before.user - before.system, 1),
            "workers_cpu_s": round(after.children_user + after.children_system - before.children_user
                                   - before.children_system, 1)}


def summarise(trials: list[dict], pairs: int) -> dict:
    """Mean wall and process CPU seconds per mode, their ratios, and in how many pairs the marked trial was faster."""
    def mean(key: str, mode: str) -> float:
        return round(statistics.mean(t[key] for t in trials if t["mode"] == mode), 3)

    walls = {mode: mean("wall_s", mode) for mode in MODES}
    cpus = {mode: mean("cpu_s", mode) for mode in MODES}
    faster = sum(1 for pair in range(pairs)
                 if [t["wall_s"] for t in trials if t["pair"] == pair and t["mode"] == "marked"][0]
                 < [t["wall_s"] for t in trials if t["pair"] == pair and t["mode"] == "unmarked"][0])
    return {"mean_wall_s": walls, "marked_over_unmarked": round(walls["marked"] / walls["unmarked"], 4),
            "mean_cpu_s": cpus, "cpu_marked_over_unmarked": round(cpus["marked"] / cpus["unmarked"], 4),
            "pairs_marked_faster": faster}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path)
    parser.add_argument("--update-to", type=Path)
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--trial", choices=MODES, help=argparse.SUPPRESS)  # one trial, in its own process
    args = parser.parse_args()
    if args.trial:
        print(json.dumps(trial(args.work, args.trial)))
        return

    from kbflow import api
    from kbflow.bench.common import corpus_dir, machine

    args.work.mkdir(parents=True, exist_ok=True)
    for corpus, name in ((args.corpus, "corpus-a"), (args.update_to, "corpus-b")):
        folder = corpus_dir(corpus, args.work / f"{name}-unpacked")
        target = args.work / name
        if not target.exists():
            target.symlink_to(folder.resolve())  # one top folder name for both, so source paths match
    if not (args.work / "base" / "namespace-ready").exists():
        shutil.rmtree(args.work / "base", ignore_errors=True)
        api.ingest([str(args.work / "corpus-a")], "bench", None, str(args.work / "base"))
        (args.work / "base" / "namespace-ready").write_text("the older release, fully ingested\n")
    at_start = machine()
    trials = []
    for pair in range(args.pairs):
        for mode in MODES:
            done = subprocess.run([sys.executable, __file__, "--work", str(args.work), "--trial", mode],
                                  capture_output=True, text=True, check=True)
            row = {"pair": pair, **json.loads(done.stdout.strip().splitlines()[-1])}
            print(json.dumps(row), flush=True)
            trials.append(row)
    result = {"corpus": str(args.corpus), "update_to": str(args.update_to), "trials": trials,
              **summarise(trials, args.pairs),
              "pairs": args.pairs, "machine": {**at_start, "load_avg_1m_at_end": machine()["load_avg_1m"]}}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "trials"}))


if __name__ == "__main__":
    main()
