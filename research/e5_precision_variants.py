"""Every e5 precision tried on this CPU, shipped or not: how far each moves a vector from fp32, how fast the real
ones run, and how much of a dev set's nDCG@10 change one query makes.

1. ``cosine``: the first ``--chunks`` chunks of the English and Chinese corpora (made as ``kbflow bench embed``
   makes them), cosine to the fp32 vector (min, p1, mean), for
   * the shipped precisions through ``E5SmallEmbedder``: bf16 and int8 (CTranslate2), with texts/s (second of two
     rounds, fp32 timed the same way in the same process);
   * ``bf16-fp32-stream`` (not shipped): the products in bf16 (as the bf16 engine runs them), the residual stream,
     layer norms and attention softmax in fp32;
   * simulated int8 (not shipped; no speed: the rounding is simulated in fp32): symmetric int8 rounding of weights
     per output row and of activations per token, on every product or on one kind of product (``qkv``: the fused
     query/key/value product, ``ao``: attention output, ``fi``/``fo``: the FFN's two products), and SmoothQuant
     (a per-input-channel scale ``s = max|x|^a / max|W|^(1-a)`` moved from the activations into the weights,
     calibrated on the same chunks, so an upper bound on what it can do).
2. ``paired`` (``--paired BEIR``): nDCG@10 per query of fp32 and bf16 vectors on one dev set, the number of
   queries whose nDCG@10 moved, and a paired bootstrap 95 % interval of the mean change (in points).

Reproduce (about 30 minutes on 2 cores):

    .venv/bin/python research/e5_precision_variants.py --chunks 300 --paired docs/eval/python-faq-en \\
        --out docs/bench/e5-precision-variants-avx512bf16.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kbflow.bench.common import machine

CORPORA = {"en": "/work/shared/corpora/postgresql-15.20-html.tar.xz",
           "zh": "/work/shared/corpora/debian-handbook-zh-CN-html.tar.xz"}
KINDS = ("qkv", "ao", "fi", "fo")


def stats(vectors: np.ndarray, reference: np.ndarray) -> dict:
    cosine = (vectors * reference).sum(axis=1) / (np.linalg.norm(vectors, axis=1) * np.linalg.norm(reference, axis=1))
    return {"min": round(float(cosine.min()), 6), "p1": round(float(np.quantile(cosine, 0.01)), 6),
            "mean": round(float(cosine.mean()), 6), "one_minus_mean": float(f"{max(0.0, 1 - float(cosine.mean())):.3g}")}


def stream_engine(embedder):
    """``bf16-fp32-stream``: the bf16 engine's products, everything between them in fp32."""
    import torch

    F = torch.nn.functional
    _, engine = embedder._load()
    ln = tuple(t.float() for t in engine.ln)
    norms = [(tuple(t.float() for t in w["aln"]), tuple(t.float() for t in w["oln"])) for w in engine.layers]

    def forward(ids, mask):
        B, L = ids.shape
        H, NH = engine.hidden, engine.heads
        bf16 = torch.bfloat16
        with torch.inference_mode():
            x = torch.from_numpy(engine.words.rows(ids)) + engine.position[:L]
            x = F.layer_norm(x, (H,), *ln, engine.eps).view(B * L, H)
            keep = torch.from_numpy(mask)
            for w, (aln, oln) in zip(engine.layers, norms):
                qkv = engine._linear(x.to(bf16), w["qkv_w"], w["qkv_b"]).float()
                qkv = qkv.view(B, L, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
                context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=keep[:, None, None, :])
                context = context.transpose(1, 2).reshape(B * L, H).to(bf16)
                x = F.layer_norm(x + engine._linear(context, w["ao_w"], w["ao_b"]).float(), (H,), *aln, engine.eps)
                inner = engine._linear_gelu(x.to(bf16), w["fi_w"], w["fi_b"])
                x = F.layer_norm(x + engine._linear(inner, w["fo_w"], w["fo_b"]).float(), (H,), *oln, engine.eps)
            x = x.view(B, L, H)
            weights = keep.to(x.dtype)[..., None]
            return ((x * weights).sum(1) / weights.sum(1)).numpy()

    embedder._engine = forward
    return embedder


class Simulated:
    """The fp32 forward pass, one text at a time, with int8 rounding simulated on the products named."""

    def __init__(self):
        from kbflow.embed.e5 import E5SmallEmbedder

        self.embedder = E5SmallEmbedder("fp32")
        self.tokenizer, self.engine = self.embedder._load()
        self.maxima: dict[tuple[int, str], object] = {}

    def ids(self, texts: list[str]) -> list[list[int]]:
        from kbflow.embed.e5 import PASSAGE_PREFIX

        t = self.tokenizer
        return [[t.bos, *row, t.eos] for row in t.encode([PASSAGE_PREFIX + text for text in texts])]

    @staticmethod
    def rows(x):
        import torch

        scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / 127
        return torch.round(x / scale).clamp(-127, 127) * scale

    def product(self, x, weight, bias, key, modes, smooth, calibrate):
        import torch

        if calibrate:
            seen = x.abs().amax(0)
            self.maxima[key] = torch.maximum(self.maxima[key], seen) if key in self.maxima else seen
        mode = modes.get(key[1], "fp32")
        if mode == "bf16":
            return torch.nn.functional.linear(x.bfloat16(), weight.bfloat16(), bias.bfloat16()).float()
        if mode != "fp32" and key in smooth:
            x, weight = x / smooth[key], weight * smooth[key]
        if mode in ("int8", "act"):
            x = self.rows(x)
        if mode in ("int8", "weight"):
            weight = self.rows(weight)
        return torch.nn.functional.linear(x, weight, bias)

    def vectors(self, rows: list[list[int]], modes: dict, smooth: dict | None = None, calibrate=False) -> np.ndarray:
        import torch

        F = torch.nn.functional
        e, smooth = self.engine, smooth or {}
        H, NH = e.hidden, e.heads
        out = []
        with torch.inference_mode():
            for row in rows:
                ids = np.array([row])
                L = ids.shape[1]
                x = F.layer_norm(torch.from_numpy(e.words.rows(ids)) + e.position[:L], (H,), *e.ln, e.eps).view(L, H)
                for n, w in enumerate(e.layers):
                    def product(x, name, kind):
                        return self.product(x, w[name + "_w"], w[name + "_b"], (n, kind), modes, smooth, calibrate)

                    qkv = product(x, "qkv", "qkv").view(1, L, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
                    context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(L, H)
                    x = F.layer_norm(x + product(context, "ao", "ao"), (H,), *w["aln"], e.eps)
                    x = F.layer_norm(x + product(F.gelu(product(x, "fi", "fi")), "fo", "fo"), (H,), *w["oln"], e.eps)
                vector = x.mean(0)
                out.append((vector / vector.norm()).numpy())
        return np.array(out)

    def smoothing(self, alpha: float) -> dict:
        scales = {}
        for (n, kind), seen in self.maxima.items():
            weight = self.engine.layers[n][f"{kind}_w"].abs().amax(0)
            scales[(n, kind)] = seen.clamp_min(1e-5) ** alpha / weight.clamp_min(1e-5) ** (1 - alpha)
        return scales


SIMULATED = {
    "int8 every product": {k: "int8" for k in KINDS},
    "int8 weights only": {k: "weight" for k in KINDS},
    "int8 activations only": {k: "act" for k in KINDS},
    **{f"int8 {kind} only": {kind: "int8"} for kind in KINDS},
    "int8, fo in fp32": {k: "int8" for k in KINDS if k != "fo"},
    "int8, fo in bf16": {"qkv": "int8", "ao": "int8", "fi": "int8", "fo": "bf16"},
    "bf16 every product (simulated)": {k: "bf16" for k in KINDS},
}


def cosine_section(limit: int, work: Path) -> dict:
    from kbflow.bench.embed import sample_chunks
    from kbflow.embed.e5 import E5SmallEmbedder

    texts = {lang: sample_chunks(Path(path), limit, work / lang)[0] for lang, path in CORPORA.items()}
    real = {"fp32": E5SmallEmbedder("fp32"), "bf16": E5SmallEmbedder("bf16"), "int8": E5SmallEmbedder("int8"),
            "bf16-fp32-stream": stream_engine(E5SmallEmbedder("bf16"))}
    vectors: dict[str, dict[str, np.ndarray]] = {}
    speed: dict[str, dict[str, float]] = {}
    for round_ in range(2):  # the first round loads and warms every engine
        for name, embedder in real.items():
            for lang, chunk_texts in texts.items():
                started = time.perf_counter()
                vectors.setdefault(name, {})[lang] = embedder.embed_passages(chunk_texts)
                if round_:
                    speed.setdefault(name, {})[lang] = round(len(chunk_texts) / (time.perf_counter() - started), 1)
    result: dict = {"chunks": {lang: len(t) for lang, t in texts.items()}, "engines": {}, "simulated": {}}
    for name in real:
        result["engines"][name] = {lang: {"cosine": stats(vectors[name][lang], vectors["fp32"][lang]),
                                          "texts_per_s": speed[name][lang],
                                          "speed_vs_fp32": round(speed[name][lang] / speed["fp32"][lang], 2)}
                                   for lang in texts}
    simulated = Simulated()
    rows = {lang: simulated.ids(t) for lang, t in texts.items()}
    reference = {lang: simulated.vectors(r, {}, calibrate=True) for lang, r in rows.items()}
    for lang in texts:  # the simulation's fp32 pass is the engine's, one text at a time
        result["simulated_fp32_vs_engine"] = {**result.get("simulated_fp32_vs_engine", {}),
                                              lang: stats(reference[lang], vectors["fp32"][lang])}
    variants = {name: (modes, None) for name, modes in SIMULATED.items()}
    for alpha in (0.5, 0.7):
        variants[f"SmoothQuant a={alpha}, int8 every product"] = ({k: "int8" for k in KINDS}, alpha)
        variants[f"SmoothQuant a={alpha}, fo in bf16"] = ({"qkv": "int8", "ao": "int8", "fi": "int8", "fo": "bf16"},
                                                          alpha)
    for name, (modes, alpha) in variants.items():
        smooth = simulated.smoothing(alpha) if alpha is not None else None
        result["simulated"][name] = {lang: stats(simulated.vectors(rows[lang], modes, smooth), reference[lang])
                                     for lang in texts}
        print(name, result["simulated"][name], flush=True)
    return result


def paired_section(beir: Path, work: Path, resamples: int = 10_000) -> dict:
    import kbflow.engine.evaluate as evaluate
    from kbflow import api

    captured: dict[str, dict] = {}
    score_run = evaluate.score_run

    def keep(rankings, qrels):  # the eval's own per-query rankings, kept for the paired comparison
        captured["rankings"], captured["qrels"] = rankings, qrels
        return score_run(rankings, qrels)

    evaluate.score_run = keep
    per_query: dict[str, dict[str, float]] = {}
    try:
        for precision in ("fp32", "bf16"):
            config = work / f"e5-{precision}.yaml"
            config.write_text(f"embedder:\n  backend: e5\n  precision: {precision}\n", encoding="utf-8")
            evaluate.eval_beir(beir, config, ingest=api.ingest)
            per_query[precision] = {q: evaluate.ndcg_at(ranked, captured["qrels"][q], 10)
                                    for q, ranked in captured["rankings"].items()}
    finally:
        evaluate.score_run = score_run
    queries = sorted(per_query["fp32"])
    change = 100 * np.array([per_query["bf16"][q] - per_query["fp32"][q] for q in queries])
    rng = np.random.default_rng(0)
    means = change[rng.integers(0, len(change), size=(resamples, len(change)))].mean(axis=1)
    moved = change[np.abs(change) > 1e-9]
    return {"dev_set": str(beir), "queries": len(queries),
            "ndcg_at_10": {p: round(float(np.mean(list(per_query[p].values()))), 4) for p in per_query},
            "points": round(float(change.mean()), 2), "queries_moved": int(moved.size),
            "queries_up": int((moved > 0).sum()), "queries_down": int((moved < 0).sum()),
            "largest_moves_points": sorted((round(float(v), 1) for v in moved), key=abs, reverse=True)[:10],
            "bootstrap_95_points": [round(float(np.quantile(means, 0.025)), 2),
                                    round(float(np.quantile(means, 0.975)), 2)],
            "one_query_at_most_points": round(100 / len(queries), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=300, help="chunks per language")
    parser.add_argument("--paired", type=Path, action="append", default=[], help="a dev set in BEIR layout")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    work = Path(tempfile.mkdtemp(prefix="kbflow-e5-variants-"))
    out = {"machine": machine(), "command": "python research/e5_precision_variants.py " + " ".join(sys.argv[1:]),
           "cosine": cosine_section(args.chunks, work)}
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    for beir in args.paired:
        (work / beir.name).mkdir(parents=True, exist_ok=True)
    out["paired"] = [paired_section(beir, work / beir.name) for beir in args.paired]
    args.out.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in out.items() if k != "cosine"}, indent=1))


if __name__ == "__main__":
    main()
