#!/usr/bin/env python3
"""Write a random subset of a BEIR folder: N corpus documents, the queries whose relevant documents are among
them, and those qrels. The README's 100-page manpages-zh comparison is

    python scripts/beir_subset.py ../shared/eval/manpages-zh /tmp/zhsub --docs 100 --seed 7

``--keep-queries`` keeps every query instead, with all its relevant documents, and fills the rest of the corpus
with a seeded sample of the other documents up to ``--max-chars`` characters of text in all (the fusion study's
sets, cut for the time an ingest takes on 2 cores):

    python scripts/beir_subset.py docs/eval/python-faq-en /tmp/faq-lite --keep-queries --max-chars 300000 --doc-chars 1500
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
    parser.add_argument("--docs", type=int)
    parser.add_argument("--keep-queries", action="store_true", help="every query and its relevant documents")
    parser.add_argument("--max-chars", type=int, default=250_000, help="with --keep-queries: corpus text in all")
    parser.add_argument("--doc-chars", type=int, help="cut every document's text to its first N characters")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    with open(args.source / "corpus.jsonl", encoding="utf-8") as handle:
        docs = [json.loads(line) for line in handle]
    if args.doc_chars:
        docs = [{**doc, "text": doc["text"][:args.doc_chars]} for doc in docs]
    random.seed(args.seed)
    if args.keep_queries:
        with open(args.source / "qrels" / "test.tsv", encoding="utf-8") as handle:
            keep = {row["corpus-id"] for row in csv.DictReader(handle, delimiter="\t")}
        size = sum(len(doc.get("title", "")) + len(doc["text"]) for doc in docs if doc["_id"] in keep)
        for doc in random.sample(docs, len(docs)):
            if doc["_id"] not in keep and size < args.max_chars:
                keep.add(doc["_id"])
                size += len(doc.get("title", "")) + len(doc["text"])
    elif args.docs:
        keep = {doc["_id"] for doc in random.sample(docs, args.docs)}
    else:
        parser.error("give --docs N or --keep-queries")
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
