#!/usr/bin/env python3
"""Build "which section explains this?" retrieval sets (BEIR layout) from a manual's glossary.

A glossary entry defines a term in a sentence or two and links to the part of the manual that explains it ("For
more information, see Section 9.21"). The query is the definition with the term itself masked (every word of the
term, so the query describes the thing without naming it, as a user who does not know the word would), and the
relevant documents are the sections the entry links to. Distractors are other sections of the same manual. The
definition is written by other authors, in other words, than the section it points to: a set where matching
meaning matters more than matching words.

  pg-glossary-en  PostgreSQL 15 manual (glossary.html → the linked pages and sections). Licence: PostgreSQL.
  py-glossary-en  Python 3.11 documentation (glossary.html → the linked library, reference, howto and tutorial
                  sections). Licence: PSF-2.0.

    .venv/bin/python scripts/build_glossary_beir.py --set pg-glossary-en \\
        --tarball postgresql-15.20-html.tar.xz --out docs/eval
    .venv/bin/python scripts/build_glossary_beir.py --set py-glossary-en \\
        --tarball python-3.11-html.tar.xz --out docs/eval

The output is a pure function of the tarball and --seed (parsing only: bs4 + lxml).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path
from urllib.parse import urldefrag

sys.path.insert(0, str(Path(__file__).resolve().parent))  # a script beside its sibling, not the package
from build_faq_beir import (HEADINGS, LATIN_WORD, drop, events, join_blocks, read_tar, sections,  # noqa: E402
                            soup, truncate)

SETS = {
    "pg-glossary-en": {"prefix": "html/", "licence": "PostgreSQL Licence (the PostgreSQL 15 manual)",
                       "what": "PostgreSQL 15.20 manual"},
    "py-glossary-en": {"prefix": "html/", "licence": "PSF License Version 2 (the Python 3.11 documentation)",
                       "what": "Python 3.11 documentation"},
}
MIN_WORDS = 30          # sections under this many words are not documents
DOC_CHARS = 5000        # documents are cut at a line boundary before this
MIN_QUERY_WORDS = 6     # masked definitions shorter than this are dropped
STOP = {"a", "an", "the", "of", "and", "or", "in", "on", "to", "for", "with", "by", "as", "is", "be", "at", "from"}
MORE = re.compile(r"\s*(For more information,? see|See also|See Also|See the|See)\b.*$", re.S)


def _page(data: bytes, pg: bool) -> tuple[str, list, object]:
    page = soup(data)
    root = (page.select_one("div[role=main]") or page.select_one("div.body") or page.select_one("div#docContent")
            or page.body)
    drop(root, ["nav.contents", "div.contents", "div.toctree-wrapper", "a.headerlink", "span.linenos",
                "div.sphinxsidebar", "div.related", "footer", "div.navheader", "div.navfooter", "div.toc"])
    evs = events(root)
    title = next((e.text for e in evs if e.kind == "h"), "")
    return title, evs, root


def _mask(definition: str, term: str) -> str:
    """The definition without the term's words (whole words, any case, plural s)."""
    words = [w for w in re.findall(r"[A-Za-z0-9_]+", re.sub(r"\(.*?\)", " ", term)) if w.lower() not in STOP]
    text = definition
    for word in sorted(set(words), key=len, reverse=True):
        text = re.sub(rf"(?i)\b{re.escape(word)}(e?s)?\b", "…", text)
    return " ".join(text.split())


def _entries(root, prefix_dir: str) -> list[dict]:
    """Glossary entries: term, definition (its own text, 'see …' sentences cut), link targets within the manual."""
    out = []
    for dt in root.find_all("dt"):
        dd = dt.find_next_sibling("dd")
        if dd is None:
            continue
        term = " ".join(dt.get_text(" ", strip=True).replace("¶", "").split())
        links = []
        for a in dd.find_all("a", href=True):
            href = a["href"]
            if href.startswith(("http:", "https:", "mailto:", "#")) or "glossary.html" in href:
                continue
            page, anchor = urldefrag(href)
            links.append((str(Path(prefix_dir, page)).lstrip("./") if prefix_dir else page, anchor))
        paragraphs = [" ".join(p.get_text(" ", strip=True).split()) for p in dd.find_all("p")] or \
                     [" ".join(dd.get_text(" ", strip=True).split())]
        definition = MORE.sub("", " ".join(paragraphs)).strip()
        out.append({"term": term, "definition": definition, "links": links})
    return out


def _section_of(root, secs, anchor: str):
    """The section holding the element with id ``anchor`` (the nearest heading at or before it)."""
    if not anchor:
        return None
    target = root.find(id=anchor)
    if target is None:
        return None
    heading = target if target.name in HEADINGS else (target.find(list(HEADINGS)) or target.find_previous(list(HEADINGS)))
    if heading is None:
        return None
    text = " ".join(heading.get_text(" ").replace("¶", "").split())
    for sec in secs:
        if sec.heading == text:
            return sec
    return None


def build(name: str, tarball: Path, seed: int, max_docs: int) -> dict:
    prefix = SETS[name]["prefix"]
    pg = name.startswith("pg-")
    files = read_tar(tarball, lambda n: n.endswith(".html") and n.startswith(prefix)
                     and (pg or n[len(prefix):].split("/")[0] in ("library", "reference", "howto", "tutorial",
                                                                   "glossary.html")))
    pages = {}
    for path, data in files.items():
        rel = path[len(prefix):-len(".html")]
        title, evs, root = _page(data, pg)
        pages[rel] = (title, sections(rel, evs, intro_title=title), root)

    def doc_of(rel: str, sec, title: str) -> tuple[str, str, str]:
        text = join_blocks(sec.own)
        if len(LATIN_WORD.findall(text)) < MIN_WORDS:
            text = join_blocks(sec.full)
        path = [p for p in [title] + sec.path + [sec.heading] if p]
        path = [p for i, p in enumerate(path) if i == 0 or p != path[i - 1]]
        return f"{rel}#{sec.anchor}", " › ".join(path), truncate(text, DOC_CHARS)

    glossary_root = pages["glossary"][2]
    whole_pages: set[str] = set()
    corpus, queries, qrels, dropped = {}, {}, {}, {"no link into the manual": 0, "too short once masked": 0,
                                                  "linked section not found": 0}
    for number, entry in enumerate(_entries(glossary_root, "")):
        query = _mask(entry["definition"], entry["term"])
        if len(LATIN_WORD.findall(query)) < MIN_QUERY_WORDS:
            dropped["too short once masked"] += 1
            continue
        if not entry["links"]:
            dropped["no link into the manual"] += 1
            continue
        relevant = []
        for page, anchor in entry["links"]:
            rel = page[:-len(".html")] if page.endswith(".html") else page
            if rel not in pages:
                continue
            title, secs, root = pages[rel]
            sec = _section_of(root, secs, anchor)
            if sec is not None:
                doc_id, doc_title, text = doc_of(rel, sec, title)
            else:  # a link to the page (or to an anchor no heading holds): the whole page is the document
                doc_id, doc_title = f"{rel}#page", title
                text = truncate(join_blocks([line for s in secs for line in [s.heading] + s.own]), DOC_CHARS)
                whole_pages.add(rel)
            if len(LATIN_WORD.findall(text)) < MIN_WORDS:
                continue
            corpus.setdefault(doc_id, {"_id": doc_id, "title": doc_title, "text": text})
            if doc_id not in relevant:
                relevant.append(doc_id)
        if not relevant:
            dropped["linked section not found"] += 1
            continue
        qid = f"q{number:03d}"
        queries[qid] = {"_id": qid, "text": query, "metadata": {"term": entry["term"]}}
        qrels[qid] = relevant
    pool = []
    for rel, (title, secs, _root) in pages.items():
        if rel == "glossary" or rel in whole_pages:  # a whole page's sections would repeat its text
            continue
        for sec in secs:
            doc_id, doc_title, text = doc_of(rel, sec, title)
            if doc_id not in corpus and len(LATIN_WORD.findall(join_blocks(sec.own))) >= MIN_WORDS:
                pool.append((doc_id, doc_title, text))
    rng = random.Random(seed)
    rng.shuffle(pool)
    answers = len(corpus)
    for doc_id, doc_title, text in sorted(pool[:max(0, max_docs - answers)]):
        corpus[doc_id] = {"_id": doc_id, "title": doc_title, "text": text}
    order = sorted(queries)
    rng.shuffle(order)
    return {"name": name, "corpus": corpus, "queries": {q: queries[q] for q in order}, "qrels": qrels,
            "answers": answers, "dropped": dropped}


def write(built: dict, out: Path, tarball: Path, seed: int) -> None:
    folder = out / built["name"]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for row in built["corpus"].values():
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as handle:
        for row in built["queries"].values():
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(folder / "qrels" / "test.tsv", "w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for qid in built["queries"]:
            for doc_id in built["qrels"][qid]:
                handle.write(f"{qid}\t{doc_id}\t1\n")
    meta = SETS[built["name"]]
    n_rel = sum(len(v) for v in built["qrels"].values())
    (folder / "README.md").write_text(
        f"# {built['name']}\n\n"
        f"For anyone measuring retrieval on questions that describe a thing without naming it.\n\n"
        f"Built by `scripts/build_glossary_beir.py --set {built['name']} --tarball {tarball.name} --seed {seed}` "
        f"from the {meta['what']}.\n\n"
        f"* {len(built['queries'])} queries: each is a glossary entry's definition with every word of the term "
        f"masked (`…`) and its 'see …' pointers cut; `metadata.term` keeps the term.\n"
        f"* {n_rel} relevance judgements (grade 1): the sections the entry links to.\n"
        f"* {len(built['corpus'])} documents: {built['answers']} linked sections and "
        f"{len(built['corpus']) - built['answers']} other sections of the same manual (seeded sample), each cut "
        f"before {DOC_CHARS} characters at a line boundary.\n"
        f"* Entries left out: {json.dumps(built['dropped'])}.\n\n"
        f"Licence: {meta['licence']}; the texts are excerpts of that work, redistributed under it.\n",
        encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--tarball", type=Path, required=True, help="the manual's HTML tarball")
    parser.add_argument("--out", type=Path, required=True, help="parent folder; the set goes to OUT/<set>/")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--max-docs", type=int, default=1500)
    args = parser.parse_args()
    built = build(args.set, args.tarball, args.seed, args.max_docs)
    write(built, args.out, args.tarball, args.seed)
    print(f"{args.set}: {len(built['queries'])} queries, {len(built['corpus'])} documents, dropped {built['dropped']}")


if __name__ == "__main__":
    main()
