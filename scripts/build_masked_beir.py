#!/usr/bin/env python3
"""Derive a "the question does not use the answer's key word" set from a labelled set (BEIR layout).

For each query, the query words (kbflow's BM25 words: jieba for Chinese, lower-cased words otherwise) that also
occur in one of its relevant documents are ranked by how rare they are in the corpus, and the ``--mask`` rarest
are replaced by ``…``: the question keeps its meaning from the words around them, but loses the exact word that
ties it to its answer, as a user's question does when they do not know the manual's term. BM25 then follows the
words left, which often point confidently elsewhere; a dense model can still read the meaning. Queries with no
word in common with their answers are dropped. The corpus and qrels are copied unchanged (licence: the source
set's).

    .venv/bin/python scripts/build_masked_beir.py docs/eval/python-faq-en docs/eval/python-faq-masked-en
    .venv/bin/python scripts/build_masked_beir.py docs/eval/help-qa-zh docs/eval/help-qa-masked-zh
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import re
import shutil
from pathlib import Path

from kbflow.search.tokens import words

STOP = set("a an the of and or in on to for with by as is are be at from it this that do does how what why when "
           "can i my you your use using".split())
MIN_LEFT = 3  # content words a masked query must keep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--mask", type=int, default=1, help="how many of each query's shared words to mask")
    args = parser.parse_args()
    corpus = [json.loads(line) for line in open(args.source / "corpus.jsonl", encoding="utf-8")]
    doc_words = {row["_id"]: set(words(f"{row.get('title', '')}\n{row['text']}")) for row in corpus}
    df = collections.Counter(word for found in doc_words.values() for word in found)
    with open(args.source / "qrels" / "test.tsv", encoding="utf-8") as handle:
        qrels = collections.defaultdict(set)
        for row in csv.DictReader(handle, delimiter="\t"):
            if int(row["score"]) > 0:
                qrels[row["query-id"]].add(row["corpus-id"])
    queries, masked_words, dropped = [], {}, 0
    for line in open(args.source / "queries.jsonl", encoding="utf-8"):
        row = json.loads(line)
        relevant = set().union(*(doc_words.get(doc, set()) for doc in qrels.get(row["_id"], ())))
        shared = {w for w in words(row["text"]) if w in relevant and w not in STOP}
        if not shared:
            dropped += 1
            continue
        chosen = sorted(shared, key=lambda w: (-math.log(len(corpus) / df[w]), w))[:args.mask]
        text = row["text"]
        for word in chosen:  # every occurrence, any case; Chinese words have no word boundaries
            boundary = r"\b" if re.match(r"\w", word, re.ASCII) else ""
            text = re.sub(rf"(?i){boundary}{re.escape(word)}{boundary}", "…", text)
        left = [w for w in words(text) if w not in STOP]
        if len(left) < MIN_LEFT:  # "What is …?" asks nothing
            dropped += 1
            continue
        queries.append({**row, "text": text, "metadata": {**row.get("metadata", {}), "masked": chosen,
                                                          "original": row["text"]}})
        masked_words[row["_id"]] = chosen
    (args.target / "qrels").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.source / "corpus.jsonl", args.target / "corpus.jsonl")
    kept = {row["_id"] for row in queries}
    with open(args.source / "qrels" / "test.tsv", encoding="utf-8") as src, \
            open(args.target / "qrels" / "test.tsv", "w", encoding="utf-8") as out:
        for number, line in enumerate(src):
            if number == 0 or line.split("\t", 1)[0] in kept:
                out.write(line)
    with open(args.target / "queries.jsonl", "w", encoding="utf-8") as out:
        for row in queries:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    (args.target / "README.md").write_text(
        f"# {args.target.name}\n\nFor anyone measuring retrieval when a question does not use its answer's key "
        f"word.\n\n{args.source.name}'s corpus and relevance judgements with each query's rarest word shared with its "
        f"answer masked (`…`; `metadata.masked` names it, `metadata.original` keeps the question): "
        f"{len(queries)} queries ({dropped} dropped: no word in common with their answers, or fewer than {MIN_LEFT} content words left), {len(corpus)} "
        f"documents. Built by `scripts/build_masked_beir.py {args.source.name} {args.target.name} --mask "
        f"{args.mask}`. Licence: as {args.source.name} (see its README).\n", encoding="utf-8")
    print(f"{args.target.name}: {len(queries)} queries, {dropped} dropped")


if __name__ == "__main__":
    main()
