"""`kbflow bench llm`: local GGUF chat models answering `ask` over a real corpus, side by side in one run.

The corpus is ingested once into a namespace of a temporary data dir (the configured embedder); then every model
answers every question through `kbflow.search.ask` as `kbflow ask` would (same retrieval, prompt, packing and
citation checks). Reported per model: load seconds, and per question the prompt and answer tokens, llama.cpp's
prompt and generation tokens per second, the answer, its citations, and the sources left out of the window.
Questions without an answer in the corpus (``--unanswerable``) check the "I don't know" contract.
"""

from __future__ import annotations

import platform
import tempfile
import time
from pathlib import Path

from kbflow.bench.results import panels, save
from kbflow.config import KbConfig
from kbflow.core.errors import ConfigError, KbflowError

QUESTIONS = [
    "How does PostgreSQL handle concurrent transactions?",
    "What does VACUUM do in PostgreSQL?",
    "Debian 中如何管理用户权限？",
]
UNANSWERABLE = ["What is the boiling point of liquid nitrogen?"]
DONT_KNOW = ("i don't know", "i do not know", "don't know", "do not contain", "不知道", "没有")


def bench_llm(corpus: Path, models: list[Path], out_file: Path, config: KbConfig, questions: list[str] | None = None,
              unanswerable: list[str] | None = None, threads: int | None = None) -> dict:
    from kbflow import api
    from kbflow.search.ask import ask
    from kbflow.search.local_llm import check_model_file
    from kbflow.search.searcher import Searcher

    corpus = Path(corpus)
    if not corpus.exists():
        raise ConfigError(f"--corpus {str(corpus)!r} does not exist")
    if not models:
        raise ConfigError("pass at least one --model (a GGUF chat model file)")
    for model in models:
        check_model_file(str(model))
    asked = [(q, False) for q in (questions or QUESTIONS)] + [(q, True) for q in (unanswerable or UNANSWERABLE)]
    models_result: dict[str, dict] = {}
    result: dict[str, object] = {"corpus": str(corpus),
                                 "machine": f"{platform.machine()}, {platform.python_version()}",
                                 "threads": threads, "models": models_result}
    with tempfile.TemporaryDirectory(prefix="kbflow-bench-llm-") as data_dir:
        base = config.model_copy(update={"data_dir": Path(data_dir), "namespace": "bench"})
        started = time.perf_counter()
        summary = api.ingest([str(corpus)], config=base)
        result["ingest"] = {"seconds": round(time.perf_counter() - started, 1), "chunks": summary["store"]["count"],
                            "model_id": summary["model_id"]}
        for model in models:
            llm = base.search.llm.model_copy(update={"kind": "local", "model_path": str(model), "threads": threads})
            settings = base.model_copy(update={"search": base.search.model_copy(update={"llm": llm})})
            searcher = Searcher(settings, "bench")
            started = time.perf_counter()
            chat = searcher.chat  # loads the model: timed apart from the questions
            load_s = time.perf_counter() - started
            runs: list[dict[str, object]] = []
            for question, expect_unknown in asked:
                started = time.perf_counter()
                try:
                    answer = ask(searcher, question)
                except KbflowError as exc:  # e.g. stopped at max_tokens: recorded, the run goes on
                    runs.append({"question": question, "error": f"{type(exc).__name__}: {exc}"})
                    continue
                timings = chat.last_timings
                text = answer["answer"] or ""
                runs.append({
                    "question": question, "unanswerable": expect_unknown, "answer": text,
                    "seconds": round(time.perf_counter() - started, 2),
                    "prompt_tokens": timings.get("prompt_n"), "answer_tokens": timings.get("predicted_n"),
                    "prompt_tokens_per_s": round(timings.get("prompt_per_second") or 0, 1),
                    "generation_tokens_per_s": round(timings.get("predicted_per_second") or 0, 1),
                    "sources_given": len(answer["sources"]), "sources_left_out": answer["sources_left_out"],
                    "cited": answer["cited"], "unknown_citations": answer["unknown_citations"],
                    "says_unknown": any(phrase in text.lower() for phrase in DONT_KNOW),
                })
            done = [run for run in runs if "error" not in run]
            models_result[Path(model).name] = {
                "path": str(model), "bytes": Path(model).stat().st_size, "load_s": round(load_s, 2),
                "prompt_tokens_per_s": _mean(run["prompt_tokens_per_s"] for run in done),
                "generation_tokens_per_s": _mean(run["generation_tokens_per_s"] for run in done),
                "answered_with_citation": sum(bool(run["cited"]) for run in done if not run["unanswerable"]),
                "unanswerable_said_unknown": sum(run["says_unknown"] for run in done if run["unanswerable"]),
                "errors": len(runs) - len(done), "runs": runs,
            }
    return save(result, out_file, plot)


def _mean(values) -> float | None:
    values = list(values)
    return round(sum(values) / len(values), 1) if values else None


def plot(result: dict, png: Path) -> Path:
    names = list(result["models"])
    runs = [result["models"][name] for name in names]
    title = f"local models answering kbflow ask ({result['threads'] or 'all'} threads)"
    with panels(png, title=title) as (_figure, (left, right)):
        left.bar(names, [run["prompt_tokens_per_s"] or 0 for run in runs], color="#4c72b0")
        left.set_ylabel("prompt tokens / s")
        right.bar(names, [run["generation_tokens_per_s"] or 0 for run in runs], color="#55a868")
        right.set_ylabel("generated tokens / s")
        for axis in (left, right):
            axis.tick_params(axis="x", labelsize=7)
    return png
