"""Build a labelled dev set of *relation questions* over the PostgreSQL manual, in BEIR layout.

    python scripts/relation_devset.py                       # /work/shared/corpora/postgresql-15.20-html.tar.xz -> /tmp/relset
    python scripts/relation_devset.py --n 3 --out /tmp/relset-try   # look at a few questions first

A relation question names the subject of one page (A) but is answered by a passage of another page (B) that A links
to: plain vector/keyword search on the question tends to find A, and following A's link finds B. How the set is
built, deterministically for a given --seed:

1. Every ``html/*.html`` page is read from the tar archive (nothing is extracted to disk) and parsed with
   BeautifulSoup. Navigation (``div.navheader``, ``div.navfooter``) and in-page tables of contents (``div.toc``) are
   not main content; the book index (bookindex.html) and the top page (index.html) are never A pages nor distractors.
2. Candidates are links ``<a href="B.html#ANCHOR">`` in A's main content, B != A, whose anchor resolves in B to a
   passage: a ``<dt>`` (varlistentry, glossary entry) = the term + the text of the following ``<dd>``; or a section
   (``div.sect1..5``/``refsect1..3``/``section``/``simplesect``... whose id is the anchor, or an element with that id
   inside its title) = its title + the first ~1200 characters of its text. Only passages of 150-1500 characters are
   kept. A link whose text or B's term appears in A's title is dropped (the question could not name A without it).
   Each candidate keeps A's title (section numbers stripped), ~400 characters of A's text around the link, and the
   link text.
3. Candidates are ordered by a seeded weighted shuffle (definitions, i.e. dt anchors, weigh 3, sections 2) within
   each chapter (the first number of the page's title; the navigation parent for unnumbered reference pages), then
   taken round-robin over the chapters in seeded order, so the set spreads over the manual. While generating, a
   candidate is skipped once its A page has 2 kept questions, its B passage 1, or its chapter ceil(8 % of --n).
4. For each candidate a local LLM (kbflow's in-process llama.cpp chat, by default Qwen2.5-Coder-1.5B-Instruct
   Q4_K_M, greedy) writes one question from A's title (disambiguated by its parent's title when several pages share
   it), A's paragraph around the link and B's passage, in which the link text and B's terms are replaced by "X"
   (prompt in SYSTEM/PROMPT/EXAMPLES below: two worked examples as earlier chat turns). Replies are dropped when they
   are not one question ending with '?' ("format"), contain the link text or one of B's terms, case-insensitively as
   whole words ("leak"), contain the placeholder X ("placeholder"), have more than 30 words ("long"), or the model
   ran past max_tokens ("cut"). Generation stops when --n questions are kept or candidates run out.
5. The BEIR folder (--out): ``files/<page>.html`` (raw bytes, manual's own names, so relative links resolve),
   ``corpus.jsonl`` (``{"_id", "title", "text": "", "file"}`` per page), ``queries.jsonl``, ``qrels/test.tsv`` (the B
   page, score 1), ``relations.jsonl`` (per question: A, B, anchor, link text, passage, the raw reply, seconds),
   ``rejected.jsonl`` (dropped replies and why) and ``README.md``. The corpus is every A and B page of the kept
   questions, every page linked from an A page's main content (the graph must choose among real neighbours), and
   --distractors more random pages, capped at --max-pages.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import tarfile
import time
from collections import Counter, defaultdict
from pathlib import Path, PurePosixPath

import warnings

from bs4 import BeautifulSoup, Tag, XMLParsedAsHTMLWarning

warnings.filterwarnings("ignore", category=XMLParsedAsHTMLWarning)

ARCHIVE = "/work/shared/corpora/postgresql-15.20-html.tar.xz"
MODEL = "/tmp/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
SECTION_CLASSES = {"sect1", "sect2", "sect3", "sect4", "sect5", "section", "simplesect", "refsect1", "refsect2",
                   "refsect3", "chapter", "appendix", "preface", "refentry", "part", "reference"}
BLOCKS = ("p", "dd", "li", "td", "th", "dt", "blockquote", "pre")
NUMBER = re.compile(r"^\s*(?:(?:Chapter|Appendix|Part)\s+)?([0-9A-Z]+(?:\.[0-9A-Z]+)*)\.\s+")
MIN_PASSAGE, MAX_PASSAGE, SECTION_CHARS, CONTEXT_CHARS = 150, 1500, 1200, 400
WEIGHTS = {"dt": 3.0, "section": 2.0}
NOT_CONTENT = {"bookindex.html", "index.html"}  # the book index and the top TOC: never A pages nor distractors

SYSTEM = ("You write test questions for a documentation search engine. Reply with exactly one question and "
          "nothing else.")
# The linked item's names (link text, B's terms) are replaced by X in what the model sees, so it cannot copy them.
PROMPT = """Page the user reads: "{a_subject}"
Paragraph on that page, which links to X: "{context}"
What the manual says about X: "{passage}"

A user reading "{a_subject}" wants to know something that only the text about X tells. Write their question, \
under 25 words. Start it with a phrase naming {a_subject} (like "In {a_subject}, ..." or "When using {a_subject}, \
..."). Ask about one specific fact from the text about X (a default, a limit, an effect, when or why), describing X \
by what it does. Never write X or its name; do not ask "what is the purpose"."""
EXAMPLES = [  # two worked examples, given as earlier turns of the chat
    {"a_subject": "Routine Vacuuming",
     "context": "The autovacuum daemon runs in the background. Its launcher starts a worker for each database at the "
                "interval set by X, and the workers check every table.",
     "passage": "X: Specifies the minimum delay between autovacuum runs on any given database. In each round the "
                "daemon examines the database and issues VACUUM and ANALYZE commands as needed for tables in that "
                "database. If this value is specified without units, it is taken as seconds. The default is one "
                "minute (1min).",
     "question": "In Routine Vacuuming, how long does the background daemon wait by default before visiting the same "
                 "database again?"},
    {"a_subject": "CREATE INDEX",
     "context": "Storage parameters such as fillfactor can be set for the index; see X for the table-level "
                "equivalent.",
     "passage": "X: The fillfactor for a table is a percentage between 10 and 100. 100 (complete packing) is the "
                "default. When a smaller fillfactor is specified, INSERT operations pack table pages only to the "
                "indicated percentage; the remaining space on each page is reserved for updating rows on that page.",
     "question": "When using CREATE INDEX, what is the space left free in table pages by a lower packing percentage "
                 "kept for?"},
]
PLACEHOLDER = re.compile(r"(?<![\w-])X(?![\w-])")


def clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def strip_number(title: str) -> str:
    return NUMBER.sub("", clean(title))


def read_pages(archive: str) -> dict[str, bytes]:
    """file name -> raw bytes of every html/*.html page (read from the archive, not extracted)."""
    pages: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            path = PurePosixPath(member.name)
            if member.isfile() and path.suffix == ".html" and "html" in path.parts[:-1]:
                pages[path.name] = tar.extractfile(member).read()
    return pages


def is_section(tag: Tag) -> bool:
    return tag.name == "div" and bool(SECTION_CLASSES & set(tag.get("class") or []))


def section_passage(section: Tag) -> tuple[str, str] | None:
    heading = section.find(re.compile(r"^h[1-6]$"))
    if heading is None:
        return None
    title = strip_number(heading.get_text(" "))
    parts: list[str] = []
    size = 0
    for piece in section.find_all(string=True):
        if any(p is heading or (p.name == "div" and "toc" in (p.get("class") or [])) for p in piece.parents):
            continue
        parts.append(str(piece))
        size += len(piece)
        if size > SECTION_CHARS * 2:
            break
    body = clean(" ".join(parts))
    if len(body) > SECTION_CHARS:
        body = body[:SECTION_CHARS].rsplit(" ", 1)[0] + " ..."
    return title, clean(f"{title}. {body}")


def dt_passage(dt: Tag) -> tuple[list[str], str] | None:
    """The terms of dt's group (dt siblings sharing one dd) and 'terms: definition'."""
    group = [dt]
    node = dt.find_next_sibling()
    while node is not None and node.name == "dt":
        group.append(node)
        node = node.find_next_sibling()
    if node is None or node.name != "dd":
        return None
    back = dt.find_previous_sibling()
    while back is not None and back.name == "dt":
        group.insert(0, back)
        back = back.find_previous_sibling()
    terms = [clean(d.get_text(" ")) for d in group]
    terms = [re.sub(r"\s*\([^()]*\)\s*$", "", t) for t in terms]  # "wal_level (enum)" -> "wal_level"
    passage = clean(f"{' / '.join(terms)}: {node.get_text(' ')}")
    names: list[str] = []
    for term in terms:  # "-k --data-checksums" / "-D directory, --pgdata=directory": each option is a name too
        names.append(term)
        if term.startswith("-"):
            names += [re.split(r"[ =\[]", part.strip())[0] for part in re.split(r",\s*|\s+(?=-)", term)]
    return [t for t in dict.fromkeys(names) if t], passage


def resolve(soup: BeautifulSoup, anchor: str) -> dict | None:
    element = soup.find(id=anchor)
    if element is None:
        return None
    dt = element if element.name == "dt" else element.find_parent("dt")
    if dt is not None:
        found = dt_passage(dt)
        if found is None:
            return None
        return {"kind": "dt", "terms": found[0], "passage": found[1]}
    section = element if is_section(element) else None
    if section is None:  # an anchor inside a section's title
        title = element.find_parent(re.compile(r"^h[1-6]$")) or element.find_parent("div", class_="titlepage")
        if title is not None:
            section = next((p for p in title.parents if is_section(p)), None)
    if section is None:
        return None
    found = section_passage(section)
    if found is None:
        return None
    return {"kind": "section", "terms": [found[0]], "passage": found[1]}


def context_around(link: Tag, link_text: str) -> str:
    block = next((p for p in link.parents if p.name in BLOCKS), link.parent)
    text = clean(block.get_text(" "))
    at = text.find(link_text)
    if len(text) <= CONTEXT_CHARS or at < 0:
        return text[:CONTEXT_CHARS]
    start = max(0, at + len(link_text) // 2 - CONTEXT_CHARS // 2)
    start = min(start, len(text) - CONTEXT_CHARS)
    window = text[start:start + CONTEXT_CHARS]
    if start > 0:
        window = "..." + window.split(" ", 1)[-1]
    if start + CONTEXT_CHARS < len(text):
        window = window.rsplit(" ", 1)[0] + "..."
    return window


def parent_of(soup: BeautifulSoup) -> str:
    """The title of the page's parent (the middle heading of its navigation header)."""
    head = soup.find("div", class_="navheader")
    headings = head.find_all("th") if head else []
    return clean(headings[-1].get_text(" ")) if len(headings) > 1 else ""


def chapter_of(title: str, parent: str) -> str:
    for text in (title, parent):
        match = NUMBER.match(text)
        if match:
            return match.group(1).split(".")[0]
    return parent or "?"


def word_in(term: str, text: str) -> bool:
    term = clean(term)
    if not term:
        return False
    return re.search(r"(?<!\w)" + re.escape(term.lower()) + r"(?!\w)", text.lower()) is not None


def scan(pages: dict[str, bytes]) -> tuple[dict, list[dict], Counter]:
    """Titles, chapters and main-content links of every page; candidate (A, B, anchor) pairs with passages."""
    info: dict[str, dict] = {}
    raw_links: list[tuple] = []
    soups: dict[str, BeautifulSoup] = {}
    stats: Counter = Counter()
    for name in sorted(pages):
        soup = BeautifulSoup(pages[name], "lxml")
        title_tag = soup.find("title")
        title = clean(title_tag.get_text(" ")) if title_tag else name
        parent = parent_of(soup)
        page = {"title": title, "subject": strip_number(title), "parent": strip_number(parent),
                "chapter": chapter_of(title, parent), "links": set()}
        info[name] = page
        for nav in soup.find_all("div", class_=["navheader", "navfooter"]):
            nav.decompose()
        for link in soup.find_all("a", href=True):
            href = link["href"]
            target, _, anchor = href.partition("#")
            if "/" in target or ":" in target or not target.endswith(".html") or target not in pages:
                continue
            if target != name:
                page["links"].add(target)
            if (not anchor or target == name or name in NOT_CONTENT
                    or link.find_parent("div", class_="toc") is not None):
                continue
            text = clean(link.get_text(" ")) or clean(link.get("title", ""))
            raw_links.append((name, target, anchor, text, context_around(link, text)))
        soups[name] = soup
    titles = Counter(page["subject"] for page in info.values())
    for page in info.values():  # "Implementation" -> "Implementation (GiST Indexes)"
        if titles[page["subject"]] > 1 and page["parent"]:
            page["subject"] = f"{page['subject']} ({page['parent']})"
    seen: set[tuple] = set()
    resolved: dict[tuple, dict | None] = {}
    candidates: list[dict] = []
    for a, b, anchor, text, context in raw_links:
        if (a, b, anchor) in seen:
            continue
        seen.add((a, b, anchor))
        stats["links"] += 1
        key = (b, anchor)
        if key not in resolved:
            resolved[key] = resolve(soups[b], anchor)
        target = resolved[key]
        if target is None:
            stats["anchor not a dt or section"] += 1
            continue
        if not MIN_PASSAGE <= len(target["passage"]) <= MAX_PASSAGE:
            stats["passage outside 150-1500 chars"] += 1
            continue
        subject = info[a]["subject"]
        if any(word_in(t, subject) for t in [text, *target["terms"]]):
            stats["link text or B term in A's title"] += 1
            continue
        stats["candidates"] += 1
        candidates.append({"a": a, "b": b, "anchor": anchor, "link_text": text, "context": context,
                           "a_title": subject, "kind": target["kind"], "terms": target["terms"],
                           "passage": target["passage"], "chapter": info[a]["chapter"]})
    return info, candidates, stats


def order(candidates: list[dict], rng: random.Random) -> list[dict]:
    """Seeded weighted shuffle inside each chapter, then round-robin over chapters in seeded order."""
    chapters: dict[str, list] = defaultdict(list)
    for cand in candidates:
        key = rng.random() ** (1.0 / WEIGHTS[cand["kind"]])
        chapters[cand["chapter"]].append((key, cand))
    names = sorted(chapters)
    rng.shuffle(names)
    queues = [[c for _, c in sorted(chapters[n], key=lambda kc: -kc[0])] for n in names]
    ordered: list[dict] = []
    depth = 0
    while any(depth < len(q) for q in queues):
        ordered.extend(q[depth] for q in queues if depth < len(q))
        depth += 1
    return ordered


def check(reply: str, cand: dict) -> tuple[str | None, str]:
    """(reason it is dropped or None, the question)."""
    question = clean(reply.strip().strip('"\u201c\u201d\'`'))
    question = re.sub(r"^(?:\*\*)?(?:question|q)\s*:\s*(?:\*\*)?\s*", "", question, flags=re.I)
    question = question.strip().strip('"\u201c\u201d\'`').strip()
    if "\n" in reply.strip() or not question.endswith("?") or question.count("?") != 1:
        return "format", question
    if any(word_in(t, question) for t in [cand["link_text"], *cand["terms"]]):
        return "leak", question
    if PLACEHOLDER.search(question):
        return "placeholder", question
    if len(question.split()) > 30:
        return "long", question
    return None, question


def mask(text: str, names: list[str]) -> str:
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        text = re.sub(r"(?<!\w)" + re.escape(name) + r"(?!\w)", "X", text, flags=re.I)
    return text


def prompt_for(cand: dict) -> list[dict]:
    names = [cand["link_text"], *cand["terms"]]
    user = PROMPT.format(a_subject=cand["a_title"], context=mask(cand["context"], names),
                         passage=mask(cand["passage"], names))
    messages = [{"role": "system", "content": SYSTEM}]
    for example in EXAMPLES:
        messages += [{"role": "user", "content": PROMPT.format(**{k: v for k, v in example.items() if k != "question"})},
                     {"role": "assistant", "content": example["question"]}]
    return messages + [{"role": "user", "content": user}]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--archive", default=ARCHIVE, help="the PostgreSQL HTML manual as a tar archive")
    parser.add_argument("--out", default="/tmp/relset", help="BEIR folder to write")
    parser.add_argument("--n", type=int, default=60, help="questions to keep")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--model", default=MODEL, help="GGUF chat model for kbflow's local llama.cpp chat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--distractors", type=int, default=100, help="random extra pages in the corpus")
    parser.add_argument("--max-pages", type=int, default=400, help="cap on corpus pages")
    parser.add_argument("--files-only", action="store_true", help="write only files/: the pages an existing "
                        "corpus.jsonl in --out lists, from the archive (the committed set, docs/bench/relset, "
                        "without the model)")
    parser.add_argument("--whole-manual", action="store_true", help="with --files-only: first rewrite corpus.jsonl "
                        "in --out to list every page of the manual (the same questions over the corpus a user "
                        "would ingest)")
    args = parser.parse_args()
    if args.whole_manual and not args.files_only:
        parser.error("--whole-manual rewrites a copy's corpus.jsonl: use it with --files-only")
    if args.files_only:
        out = Path(args.out)
        pages = read_pages(args.archive)
        if args.whole_manual:
            (out / "corpus.jsonl").write_text("".join(
                json.dumps({"_id": name, "title": "", "text": "", "file": f"files/{name}"}) + "\n"
                for name in sorted(pages)), encoding="utf-8")
        rows = [json.loads(line) for line in (out / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]
        (out / "files").mkdir(parents=True, exist_ok=True)
        for row in rows:
            (out / row["file"]).write_bytes(pages[Path(row["file"]).name])
        print(f"{len(rows)} pages written to {out / 'files'}")
        return

    from kbflow.config import LlmConfig
    from kbflow.core.errors import PermanentError
    from kbflow.search.local_llm import LocalChat

    started = time.perf_counter()
    pages = read_pages(args.archive)
    info, candidates, stats = scan(pages)
    print(f"{len(pages)} pages; {stats['links']} distinct cross-page anchor links; {len(candidates)} candidates "
          f"({dict(stats)}) in {time.perf_counter() - started:.0f} s", flush=True)
    rng = random.Random(args.seed)
    queue = order(candidates, rng)

    chat = LocalChat(LlmConfig(kind="local", model_path=args.model, max_tokens=60, temperature=0.0,
                               context_tokens=2048, threads=args.threads))
    chapter_cap = max(2, math.ceil(0.08 * args.n))
    per_a: Counter = Counter()
    per_chapter: Counter = Counter()
    used_b: set[tuple] = set()
    kept: list[dict] = []
    rejected: list[dict] = []
    drops: Counter = Counter()
    gen_started = time.perf_counter()
    for cand in queue:
        if len(kept) >= args.n:
            break
        if per_a[cand["a"]] >= 2 or (cand["b"], cand["anchor"]) in used_b or per_chapter[cand["chapter"]] >= chapter_cap:
            continue
        t0 = time.perf_counter()
        try:
            reply = chat.complete(prompt_for(cand))
            reason, question = check(reply, cand)
        except PermanentError as exc:  # ran past max_tokens
            reply, reason, question = str(exc), "cut", ""
        seconds = round(time.perf_counter() - t0, 1)
        timings = chat.last_timings or {}
        speed = (f"{seconds} s; read {timings.get('prompt_n', '?')} new prompt tokens, "
                 f"wrote {timings.get('predicted_n', '?')} at {timings.get('predicted_per_second', 0):.1f}/s")
        row = {"a": cand["a"], "b": cand["b"], "anchor": cand["anchor"], "link_text": cand["link_text"],
               "a_title": cand["a_title"], "b_terms": cand["terms"], "kind": cand["kind"],
               "chapter": cand["chapter"], "reply": reply, "seconds": seconds}
        if reason:
            drops[reason] += 1
            rejected.append({**row, "reason": reason})
            print(f"  drop ({reason}, {speed}) {cand['a']} -> {cand['b']}#{cand['anchor']}: {reply!r}", flush=True)
            continue
        per_a[cand["a"]] += 1
        per_chapter[cand["chapter"]] += 1
        used_b.add((cand["b"], cand["anchor"]))
        qid = f"q{len(kept) + 1:03d}"
        kept.append({"id": qid, "question": question, **row, "context": cand["context"],
                     "b_passage": cand["passage"][:300]})
        print(f"{qid} ({speed}) {cand['a']} -> {cand['b']}#{cand['anchor']}: {question}", flush=True)
    gen_s = time.perf_counter() - gen_started
    print(f"kept {len(kept)}, dropped {dict(drops)}, generation {gen_s:.0f} s "
          f"({gen_s / max(1, len(kept) + sum(drops.values())):.1f} s per reply)", flush=True)

    # corpus: A and B pages, A's one-hop neighbours, random distractors; capped
    core = list(dict.fromkeys([r["a"] for r in kept] + [r["b"] for r in kept]))
    neighbours = sorted({n for r in kept for n in info[r["a"]]["links"]} - set(core))
    rng.shuffle(neighbours)
    chosen = list(core) + neighbours[: max(0, args.max_pages - len(core))]
    rest = sorted(set(pages) - set(chosen) - NOT_CONTENT)
    rng.shuffle(rest)
    chosen += rest[: max(0, min(args.distractors, args.max_pages - len(chosen)))]
    cut_neighbours = max(0, len(core) + len(neighbours) - args.max_pages)

    out = Path(args.out)
    (out / "files").mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    for old in (out / "files").glob("*.html"):
        if old.name not in chosen:
            old.unlink()
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for name in chosen:
            (out / "files" / name).write_bytes(pages[name])
            handle.write(json.dumps({"_id": name, "title": strip_number(info[name]["title"]), "text": "",
                                     "file": f"files/{name}"}, ensure_ascii=False) + "\n")
    with open(out / "queries.jsonl", "w", encoding="utf-8") as handle:
        for r in kept:
            handle.write(json.dumps({"_id": r["id"], "text": r["question"]}, ensure_ascii=False) + "\n")
    with open(out / "qrels" / "test.tsv", "w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for r in kept:
            handle.write(f"{r['id']}\t{r['b']}\t1\n")
    with open(out / "relations.jsonl", "w", encoding="utf-8") as handle:
        for r in kept:
            handle.write(json.dumps(r, ensure_ascii=False) + "\n")
    with open(out / "rejected.jsonl", "w", encoding="utf-8") as handle:
        for r in rejected:
            handle.write(json.dumps(r, ensure_ascii=False) + "\n")
    kinds = Counter(r["kind"] for r in kept)
    chapters = Counter(r["chapter"] for r in kept)
    readme = f"""# Relation questions over the PostgreSQL 15.20 manual (BEIR layout)

Built by `scripts/relation_devset.py --n {args.n} --seed {args.seed}` from `{args.archive}`.

Each question names the subject of a page A and is answered by a passage of a page B that A links to with an
anchor (`A.html` contains `<a href="B.html#ANCHOR">` in its main content). `qrels/test.tsv` labels B only (score 1):
plain search on the question tends to find A; following A's link finds B. `relations.jsonl` says, per question,
A, B, the anchor, the link text, A's paragraph around the link, the first 300 characters of B's passage, the
model's raw reply and the seconds it took; `rejected.jsonl` holds the dropped replies and why.

## How
* Candidates: cross-page links with an anchor in A's main content (not `div.navheader`/`div.navfooter`/`div.toc`)
  whose anchor resolves in B to a `<dt>` + its `<dd>` (a definition) or to a section (title + first ~1200 characters),
  passage of 150-1500 characters, link text and B's term not in A's title. {dict(stats)}.
* Order: seeded weighted shuffle per chapter (dt 3 : section 2), round-robin over chapters. At most 2 questions per
  A page, 1 per B passage, {chapter_cap} per chapter.
* Questions: `{Path(args.model).name}` through kbflow's in-process llama.cpp chat (temperature 0, max 60 tokens,
  2048-token window), one reply per candidate. A's subject is its title without section number, with its parent's
  title in parentheses when several pages share the title. The link text and B's terms are replaced by "X" in A's
  paragraph and B's passage before the model sees them. System prompt: "{SYSTEM}" Then two worked examples as
  earlier user/assistant turns (EXAMPLES in the script; their questions:
  {" / ".join(repr(e["question"]) for e in EXAMPLES)}), then the user prompt:

```
{PROMPT}
```

* Filters (the first that fails): not one question ending with '?' (format: {drops['format']}), the link text or
  one of B's terms as whole words, case-insensitive (leak: {drops['leak']}), the placeholder X (placeholder:
  {drops['placeholder']}), more than 30 words (long:
  {drops['long']}), ran past max_tokens (cut: {drops['cut']}). A leading "Question:" label and surrounding quotes
  are stripped first.

## Counts
* {len(kept)} questions ({dict(kinds)}), over {len(chapters)} chapters, {len(set(r['a'] for r in kept))} A pages,
  {len(set(r['b'] for r in kept))} B pages; {len(kept) + sum(drops.values())} replies generated in {gen_s:.0f} s.
* {len(chosen)} corpus pages: {len(core)} A/B pages, {min(len(neighbours), len(chosen) - len(core))} more pages
  linked from an A page{f' ({cut_neighbours} neighbours cut by the cap)' if cut_neighbours else ''},
  {len(chosen) - len(core) - min(len(neighbours), len(chosen) - len(core))} random distractors (seed {args.seed});
  cap {args.max_pages}. `files/` holds the raw HTML under the manual's own names, so relative links resolve.
"""
    (out / "README.md").write_text(readme, encoding="utf-8")
    print(f"wrote {out}: {len(chosen)} pages, {len(kept)} questions; total {time.perf_counter() - started:.0f} s",
          flush=True)


if __name__ == "__main__":
    main()
