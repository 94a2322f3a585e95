"""How close the e5 backend's vectors in another precision (int8 or bf16) are to its fp32 ones, and what that
does to retrieval.

1. Cosine of the other precision vs fp32 on real chunks in English (the PostgreSQL 15.20 manual) and Chinese (the Debian
   Administrator's Handbook, zh-CN), each made as ``kbflow bench embed`` makes its chunks
   (``kbflow.bench.embed.sample_chunks``): min, p1 and mean per language.
2. nDCG@10 (vector mode) with fp32 and with the other precision on each dev set named, through ``kbflow eval``.

Reproduce (about an hour on 2 cores; results are written after every step, so a cut run keeps what it measured):

    .venv/bin/python research/e5_precision_agreement.py --precision int8 --chunks 1000 \\
        --out docs/bench/e5-int8-agreement.json --eval SEMANLINK --eval docs/eval/pg-glossary-en ...

(SEMANLINK: the semanlink dev set's BEIR folder.) The gate for a precision as the default of new e5 namespaces: cosine >= 0.99 on every chunk, and nDCG@10
within 0.5 point of fp32 on every dev set measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kbflow.bench.common import machine

CORPORA = {"en": "/work/shared/corpora/postgresql-15.20-html.tar.xz",
           "zh": "/work/shared/corpora/debian-handbook-zh-CN-html.tar.xz"}
GATE_COSINE, GATE_NDCG_POINTS = 0.99, 0.5


def cosine_stats(corpus: Path, limit: int, work: Path, precision: str) -> dict:
    from kbflow.bench.embed import sample_chunks
    from kbflow.embed.e5 import E5SmallEmbedder

    texts, files = sample_chunks(corpus, limit, work)
    fp32, other = E5SmallEmbedder("fp32"), E5SmallEmbedder(precision)
    counter = fp32.token_counter()
    tokens = [n + counter.special_tokens for n in counter.count(texts)]
    started = time.perf_counter()
    reference = fp32.embed_passages(texts)
    fp32_s = time.perf_counter() - started
    started = time.perf_counter()
    vectors = other.embed_passages(texts)
    other_s = time.perf_counter() - started
    cosine = (reference * vectors).sum(axis=1)
    return {"corpus": str(corpus), "chunks": len(texts), "files": len(files),
            "e5_tokens_mean": round(float(np.mean(tokens)), 1), "e5_tokens_max": int(max(tokens)),
            "cosine": {"min": round(float(cosine.min()), 5), "p1": round(float(np.quantile(cosine, 0.01)), 5),
                       "mean": round(float(cosine.mean()), 5)},
            "seconds": {"fp32": round(fp32_s, 1), precision: round(other_s, 1)},
            "model_ids": {"fp32": fp32.model_id, precision: other.model_id}}


def ndcg(beir: Path, precision: str, work: Path) -> dict:
    config = work / f"e5-{precision}.yaml"
    config.write_text(f"embedder:\n  backend: e5\n  precision: {precision}\n", encoding="utf-8")
    kbflow = Path(sys.executable).with_name("kbflow")
    run = subprocess.run([str(kbflow), "eval", "--beir", str(beir), "-c", str(config), "--json"],
                         capture_output=True, text=True, check=True)
    result = json.loads(run.stdout)
    return {key: result[key] for key in ("documents", "queries", "chunks", "metrics", "ingest_s") if key in result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("int8", "bf16"), default="int8", help="compared with fp32")
    parser.add_argument("--chunks", type=int, default=1000)
    parser.add_argument("--eval", action="append", default=[], help="a dev set in BEIR layout (repeatable)")
    parser.add_argument("--skip-cosine", action="store_true", help="keep the cosine figures already in --out")
    parser.add_argument("--out", type=Path, help="default: docs/bench/e5-<precision>-agreement.json")
    args = parser.parse_args()
    args.out = args.out or Path(f"docs/bench/e5-{args.precision}-agreement.json")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix=f"kbflow-e5-{args.precision}-"))
    out: dict = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    out.update({"gate": {"cosine_min": GATE_COSINE, "ndcg_at_10_points": GATE_NDCG_POINTS},
                "precision": args.precision, "machine": machine(),
                "command": "python research/e5_precision_agreement.py " + " ".join(sys.argv[1:])})
    if not args.skip_cosine:
        out["cosine"] = {language: cosine_stats(Path(path), args.chunks, work / language, args.precision)
                         for language, path in CORPORA.items()}
        args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    evals = out.setdefault("ndcg_at_10", {})
    for beir in map(Path, args.eval):
        row = {precision: ndcg(beir, precision, work) for precision in ("fp32", args.precision)}
        evals[beir.name] = {"dev_set": str(beir), **{precision: row[precision]["metrics"]["ndcg@10"]
                                                      for precision in row}, "runs": row}
        evals[beir.name]["points"] = round(100 * (evals[beir.name][args.precision] - evals[beir.name]["fp32"]), 2)
        args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    cosines = [c["cosine"]["min"] for c in out.get("cosine", {}).values()]
    points = [abs(e["points"]) for e in evals.values()]
    out["gate"]["passed"] = bool(cosines) and min(cosines) >= GATE_COSINE and all(p <= GATE_NDCG_POINTS
                                                                                   for p in points)
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k != "ndcg_at_10"}, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
