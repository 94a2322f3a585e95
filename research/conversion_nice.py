"""What conversion worker processes cost the embedding model beside them, at three worker niceness values
(``convert.worker_nice``).

An ingest converts one batch ahead of the model, in worker processes (``kbflow.convert.pool``) that share the
cores with the model's threads. Per niceness: the model alone embeds 352 chunks of the PostgreSQL 15.20 manual
(batches of 32), the two workers alone convert 540 of its pages, then both run at once. The ratio of the model's
time beside the workers to its time alone is what conversion cost it; the time until both are done shows whether
the pages were still converted meanwhile (in the model's idle time) or waited. Each round measures both alone
again, then every niceness (in alternating order), in one process, since this machine's speed drifts from minute
to minute. Workers are started fresh for every pass and niced from the parent once they are ready.

Reproduce (a few minutes on 2 cores, nothing else running; Linux):

    .venv/bin/python research/conversion_nice.py --corpus postgresql-15.20-html.tar.xz \\
        --out docs/bench/conversion-nice.json
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from model_beside import PAGES, TEXTS, WARM_PAGES, ModelWorkload, study_main

NICES = (0, 10, 19)
WORKERS = 2


def measure(corpus: Path, rounds: int) -> list[dict]:
    from kbflow.convert.converters import _convert_one
    from kbflow.convert.pool import KillablePool

    workload = ModelWorkload(corpus, "nice")
    jobs = [(source, workload.config.convert) for source in workload.files[WARM_PAGES:]]

    def convert(nice: int) -> float:
        with KillablePool(WORKERS, _convert_one) as pool:
            for worker in pool.workers:  # as convert.worker_nice would, here from outside and after start-up
                os.setpriority(os.PRIO_PROCESS, worker.process.pid, nice)
            started = time.perf_counter()
            results = pool.map(jobs, 600, lambda i: None, lambda i, code: None)
            elapsed = time.perf_counter() - started
        if any(row is None or row["status"] != "ok" for row in results):
            raise RuntimeError("a page did not convert")
        return elapsed

    runs = []
    for round_number in range(rounds):
        model_alone, convert_alone = workload.model(), convert(0)
        for nice in NICES if round_number % 2 == 0 else NICES[::-1]:
            result = workload.beside(lambda: convert(nice))
            runs.append({"round": round_number, "worker_nice": nice, "model_alone_s": round(model_alone, 3),
                         "conversion_alone_s": round(convert_alone, 3),
                         "model_beside_conversion_s": round(result["model"], 3),
                         "conversion_beside_model_s": round(result["other"], 3),
                         "both_done_s": round(result["both"], 3),
                         "model_slowdown": round(result["model"] / model_alone, 4),
                         "both_over_model_alone": round(result["both"] / model_alone, 4)})
            print(runs[-1], flush=True)
    return runs


def study(corpus: Path, rounds: int) -> dict:
    runs = measure(corpus, rounds)

    def mean(key: str, nice: int) -> float:
        return round(sum(r[key] for r in runs if r["worker_nice"] == nice) / rounds, 4)

    return {"texts": TEXTS, "pages_converted_beside": PAGES, "workers": WORKERS, "runs": runs,
            "mean_model_slowdown": {str(nice): mean("model_slowdown", nice) for nice in NICES},
            "mean_both_over_model_alone": {str(nice): mean("both_over_model_alone", nice) for nice in NICES}}


if __name__ == "__main__":
    study_main(__doc__, "conversion_nice.py", 4, study)
