#!/usr/bin/env python3
"""Write a random subset of a BEIR folder: N corpus documents, the queries whose relevant documents are among
them, and those qrels. The README's 100-page manpages-zh comparison is

    python scripts/beir_subset.py ../shared/eval/manpages-zh /tmp/zhsub --docs 100 --seed 7
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--docs", type=int, required=True)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with open(args.source / "corpus.jsonl", encoding="utf-8") as handle:
        docs = [json.loads(line) for line in handle]
    random.seed(args.seed)
    keep = {doc["_id"] for doc in random.sample(docs, args.docs)}
    with open(args.source / "qrels" / "test.tsv", encoding="utf-8") as handle:
        rows = [row for row in csv.DictReader(handle, delimiter="\t") if row["corpus-id"] in keep]
    queries = {row["query-id"] for row in rows}
    (args.target / "qrels").mkdir(parents=True, exist_ok=True)
    with open(args.target / "corpus.jsonl", "w", encoding="utf-8") as out:
        out.writelines(json.dumps(doc, ensure_ascii=False) + "\n" for doc in docs if doc["_id"] in keep)
    with open(args.source / "queries.jsonl", encoding="utf-8") as handle, \
            open(args.target / "queries.jsonl", "w", encoding="utf-8") as out:
        out.writelines(line for line in handle if json.loads(line)["_id"] in queries)
    with open(args.target / "qrels" / "test.tsv", "w", encoding="utf-8") as out:
        out.write("query-id\tcorpus-id\tscore\n")
        out.writelines(f"{row['query-id']}\t{row['corpus-id']}\t{row['score']}\n" for row in rows)
    print(f"{len(keep)} documents, {len(queries)} queries → {args.target}")


if __name__ == "__main__":
    main()
