"""Gold evidence of `ask --agentic` against plain `ask` on a labelled question set (issue 21.3's measurement).

For each labelled question of a BEIR folder whose corpus was ingested by `kbflow eval --data-dir DIR` (namespace
``eval-<folder name>``, corpus rows with ``file``): the evidence plain `ask` would give the model (the top
``search.llm.context_chunks`` hits of the search mode) and the evidence the agent gathers in its rounds. A question
counts as found when a gold document is among a set's source documents. The answers themselves are not written
(``--answers N`` writes N of them, to time a whole agentic answer). Writes JSON.

    python research/agentic_eval.py --beir /tmp/relset --data-dir /tmp/releval/data --config llm.yaml \\
        --out docs/bench/agentic-relations.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from kbflow.config import load_config
from kbflow.engine.evaluate import load_beir
from kbflow.search.agentic import Agent
from kbflow.search.ask import ask
from kbflow.search.searcher import Searcher


def _documents(hits, by_path: dict[str, str]) -> list[str]:
    return [by_path.get(hit.source_path, hit.source_path) for hit in hits]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beir", type=Path, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--config", type=Path, required=True, help="config with search.llm (e.g. kind local)")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--answers", type=int, default=0, help="also write this many whole agentic answers (timed)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    corpus, queries, qrels = load_beir(args.beir)
    by_path = {f"corpus/{row['file']}": doc_id for doc_id, row in corpus.items() if row.get("file")}
    config = load_config(args.config, data_dir=args.data_dir)
    namespace = args.namespace or "eval-" + "".join(c if c.isalnum() else "-" for c in args.beir.name)[:40]
    searcher = Searcher(config, namespace)
    limit = config.search.llm.context_chunks
    rows, started_all = [], time.perf_counter()
    labelled = [q for q in queries if q in qrels][: args.max_queries or None]
    for number, query_id in enumerate(labelled, 1):
        question, gold = queries[query_id], {d for d, g in qrels[query_id].items() if g > 0}
        plain = searcher.search(question, limit=limit)
        started = time.perf_counter()
        agent = Agent(searcher, None, None)
        strategy, evidence = agent.retrieve(question, limit)
        seconds = time.perf_counter() - started
        row = {"id": query_id, "question": question, "gold": sorted(gold),
               "plain_found": bool(gold & set(_documents(plain, by_path))), "plain_evidence": len(plain),
               "agentic_found": bool(gold & set(_documents(evidence, by_path))), "agentic_evidence": len(evidence),
               "agentic_found_in_first_6": bool(gold & set(_documents(evidence[:limit], by_path))),
               "strategy": strategy, "rounds": sum(1 for s in agent.trace if s["step"] == "search"),
               "planner_calls": agent.calls, "planner_prompt_tokens": agent.prompt_tokens,
               "seconds": round(seconds, 2), "trace": agent.trace}
        rows.append(row)
        print(f"{number}/{len(labelled)} {query_id} plain={row['plain_found']} agentic={row['agentic_found']} "
              f"{strategy} rounds={row['rounds']} {seconds:.1f}s", flush=True)
    answers = []
    for query_id in labelled[:args.answers]:
        started = time.perf_counter()
        result = ask(searcher, queries[query_id], agentic=True)
        answers.append({"id": query_id, "seconds": round(time.perf_counter() - started, 2),
                        "answer": result["answer"], "cited": result["cited"], "strategy": result["strategy"]})
    n = len(rows)
    summary = {
        "questions": n, "context_chunks": limit, "search_mode": config.search.mode,
        "plain_found": round(sum(r["plain_found"] for r in rows) / n, 4),
        "agentic_found": round(sum(r["agentic_found"] for r in rows) / n, 4),
        "agentic_found_in_first_6": round(sum(r["agentic_found_in_first_6"] for r in rows) / n, 4),
        "agentic_evidence_mean": round(sum(r["agentic_evidence"] for r in rows) / n, 2),
        "strategies": {s: sum(r["strategy"] == s for r in rows) for s in sorted({r["strategy"] for r in rows})},
        "rounds_mean": round(sum(r["rounds"] for r in rows) / n, 2),
        "planner_seconds_median": sorted(r["seconds"] for r in rows)[n // 2],
        "plan_replies_unusable": sum(1 for r in rows for s in r["trace"] if s.get("error")),
        "model": config.search.llm.model_path or config.search.llm.model,
        "total_seconds": round(time.perf_counter() - started_all, 1),
    }
    args.out.write_text(json.dumps({"summary": summary, "answers": answers, "questions": rows}, indent=1,
                                   ensure_ascii=False))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
