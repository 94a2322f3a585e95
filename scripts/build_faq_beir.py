#!/usr/bin/env python3
"""Build natural-question retrieval sets (BEIR layout) from the documentation tarballs in ../shared/corpora.

Each set pairs a question (a FAQ heading, a question heading in a manual, or a help page's task title) with its
answer passage, from which the question text has been removed, and adds other sections of the same manuals as
distractors. Sets:

  python-faq-en  Python 3.11 documentation: the faq/*.html entries; distractors from tutorial/, howto/, using/,
                 reference/ and a sample of library/.
  help-qa-zh     LibreOffice 7.4 help (zh-CN) and The Debian Administrator's Handbook (zh-CN): question headings
                 and question sidebars, plus LibreOffice guide pages whose title is a task ("插入表格" asked as
                 "如何插入表格？"); distractors from the other sections of both.

    .venv/bin/python scripts/build_faq_beir.py --out docs/eval --set all

writes docs/eval/<set>/{corpus.jsonl,queries.jsonl,qrels/test.tsv,README.md}. The output is a pure function of
the tarballs and --seed (parsing only: bs4 + lxml, which the project's .venv holds). Queries are written in a
seeded random order so that `kbflow eval --max-queries N` scores a representative sample.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import random
import re
import tarfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from bs4 import BeautifulSoup, Comment, NavigableString, Tag

try:  # the Debian handbook is XHTML; parsing it as HTML is what we want
    from bs4 import XMLParsedAsHTMLWarning
    warnings.filterwarnings("ignore", category=XMLParsedAsHTMLWarning)
except ImportError:  # pragma: no cover
    pass

DEFAULT_CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
SETS = ("python-faq-en", "help-qa-zh")

HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}
BLOCKS = HEADINGS | {
    "p", "div", "section", "article", "aside", "nav", "header", "footer", "main", "blockquote", "figure",
    "figcaption", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tfoot", "tr", "td", "th",
    "caption", "pre", "hr", "form", "fieldset", "details", "summary", "center", "address",
}
SKIP_TAGS = {"script", "style", "noscript", "meta", "link", "img", "svg", "iframe", "input", "button", "head",
             "title", "template", "object", "embed", "audio", "video", "canvas", "map"}

CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
LATIN_WORD = re.compile(r"[A-Za-z0-9_]+(?:[.'’-][A-Za-z0-9_]+)*")


# --------------------------------------------------------------------------------------------------- HTML to text

@dataclass
class Event:
    kind: str            # "h" (heading) or "t" (a block of text)
    text: str
    level: int = 0
    anchor: str = ""


def _inline(text: str) -> str:
    return " ".join(text.split())


def _heading_text(tag: Tag) -> str:
    return _inline(tag.get_text(" ")).replace("¶", "").strip()


def _heading_anchor(tag: Tag) -> str:
    """Sphinx: the enclosing <section id>; LibreOffice: the heading's id; DocBook: an <a id> inside it."""
    parent = tag.parent
    if parent is not None and parent.name == "section" and parent.get("id"):
        return parent["id"]
    if tag.get("id"):
        return tag["id"]
    inner = tag.find("a", id=True)
    if inner is not None:
        return inner["id"]
    link = tag.find("a", class_="headerlink")
    if link is not None and link.get("href", "").startswith("#"):
        return link["href"][1:]
    return ""


def events(root: Tag) -> list[Event]:
    """The page as a flat sequence of headings and text blocks, in document order.

    Inline runs are joined with single spaces; every block element (and <br>) ends a run; <pre> keeps its lines.
    """
    out: list[Event] = []

    def flush(buf: list[str]) -> None:
        text = _inline("".join(buf))
        if text:
            out.append(Event("t", text))
        buf.clear()

    def walk(node: Tag, buf: list[str]) -> None:
        for child in node.children:
            if isinstance(child, Comment):
                continue
            if isinstance(child, NavigableString):
                if type(child) is NavigableString:  # not CData/Doctype/ProcessingInstruction
                    buf.append(str(child))
                continue
            if not isinstance(child, Tag) or child.name in SKIP_TAGS:
                continue
            if child.name in HEADINGS:
                flush(buf)
                text = _heading_text(child)
                if text:
                    out.append(Event("h", text, int(child.name[1]), _heading_anchor(child)))
            elif child.name == "pre":
                flush(buf)
                lines = [line.rstrip() for line in child.get_text().splitlines()]
                text = "\n".join(lines).strip("\n")
                if text.strip():
                    out.append(Event("t", text))
            elif child.name == "br":
                flush(buf)
            elif child.name in BLOCKS:
                flush(buf)
                inner: list[str] = []
                walk(child, inner)
                flush(inner)
            else:
                walk(child, buf)

    buf: list[str] = []
    walk(root, buf)
    flush(buf)
    return out


def drop(root: Tag, selectors: list[str]) -> None:
    for selector in selectors:
        for tag in root.select(selector):
            tag.decompose()


def join_blocks(blocks: list[str]) -> str:
    return "\n".join(blocks).strip()


def truncate(text: str, limit: int) -> str:
    """Cut at a line boundary before `limit` characters (distractors only)."""
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > limit // 2 else limit].rstrip()


def units(text: str) -> int:
    """Content size: CJK characters plus Latin words."""
    return len(CJK.findall(text)) + len(LATIN_WORD.findall(text))


def cjk_share(text: str) -> float:
    """The share of content units (see `units`) that are CJK characters."""
    cjk = len(CJK.findall(text))
    latin = len(LATIN_WORD.findall(text))
    return cjk / (cjk + latin) if cjk + latin else 0.0


def norm_question(text: str) -> str:
    return re.sub(r"[\s?？:：。.!！]+", "", text).lower()


# ------------------------------------------------------------------------------------------------------ sections

@dataclass
class Section:
    """One heading with its text: `own` stops at the next heading of any level, `full` at the next heading of the
    same or a higher level (it holds its subsections, their headings as lines of text)."""
    page: str
    anchor: str
    heading: str
    level: int
    path: list[str]            # the headings above this one on the page, outermost first
    own: list[str] = field(default_factory=list)
    full: list[str] = field(default_factory=list)
    leaf: bool = True


def answer_blocks(secs: list[Section], i: int, is_question) -> list[str]:
    """A question's answer: its own text and its subsections' (their headings as lines), up to the next heading of
    the same or a higher level or the next heading that is itself a question."""
    blocks = list(secs[i].own)
    for sec in secs[i + 1:]:
        if sec.level <= secs[i].level or is_question(sec.heading):
            break
        blocks += [sec.heading] + sec.own
    return blocks


def sections(page: str, evs: list[Event], intro_title: str = "") -> list[Section]:
    """Cut a page's events at its headings. Text before the first heading becomes a section titled `intro_title`."""
    out: list[Section] = []
    stack: list[Section] = []
    intro = Section(page, "", intro_title, 0, [])
    for ev in evs:
        if ev.kind == "h":
            while stack and stack[-1].level >= ev.level:
                stack.pop()
            for sec in stack:
                sec.leaf = False
                sec.full.append(ev.text)
            sec = Section(page, ev.anchor, ev.text, ev.level, [s.heading for s in stack])
            out.append(sec)
            stack.append(sec)
        else:
            if stack:
                stack[-1].own.append(ev.text)
                for sec in stack:
                    sec.full.append(ev.text)
            else:
                intro.own.append(ev.text)
                intro.full.append(ev.text)
    if intro.own:
        out.insert(0, intro)
    used: collections.Counter = collections.Counter()
    for sec in out:  # anchors unique within the page
        base = sec.anchor or ("intro" if sec.level == 0 else "s")
        used[base] += 1
        sec.anchor = base if used[base] == 1 else f"{base}-{used[base]}"
    return out


# ------------------------------------------------------------------------------------------------------ the sets

@dataclass
class Built:
    name: str
    corpus: dict[str, dict]                     # id -> {"_id","title","text"}
    queries: dict[str, dict]                    # id -> {"_id","text","metadata"}
    qrels: dict[str, list[str]]                 # query id -> relevant doc ids
    distractors: int
    notes: dict


def read_tar(path: Path, keep) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(path, "r:xz") as tar:
        for member in tar:
            if member.isfile() and keep(member.name):
                files[member.name] = tar.extractfile(member).read()
    return dict(sorted(files.items()))


def soup(data: bytes) -> BeautifulSoup:
    return BeautifulSoup(data, "lxml")


def add_doc(corpus: dict, seen_text: dict, doc_id: str, title: str, text: str) -> str:
    """Add a document unless the same text is already there; returns the id that holds the text."""
    key = hashlib.sha1(text.encode("utf-8")).hexdigest()
    if key in seen_text:
        return seen_text[key]
    assert doc_id not in corpus, doc_id
    corpus[doc_id] = {"_id": doc_id, "title": title, "text": text}
    seen_text[key] = doc_id
    return doc_id


def merge_questions(pairs: list[dict], corpus: dict, seen_text: dict) -> tuple[dict, dict, int]:
    """pairs: {qid, question, doc_id, title, text, metadata}. Identical questions (after normalising punctuation and
    case) become one query whose relevant documents are all their answers; identical answers become one document."""
    queries: dict[str, dict] = {}
    qrels: dict[str, list[str]] = {}
    by_norm: dict[str, str] = {}
    merged = 0
    for pair in pairs:
        doc = add_doc(corpus, seen_text, pair["doc_id"], pair["title"], pair["text"])
        norm = norm_question(pair["question"])
        if norm in by_norm:
            merged += 1
            qid = by_norm[norm]
            if doc not in qrels[qid]:
                qrels[qid].append(doc)
            continue
        by_norm[norm] = pair["qid"]
        queries[pair["qid"]] = {"_id": pair["qid"], "text": pair["question"], "metadata": pair["metadata"]}
        qrels[pair["qid"]] = [doc]
    return queries, qrels, merged


def leak_counts(queries: dict, qrels: dict, corpus: dict) -> dict:
    """How many queries appear verbatim (case-insensitive, trailing ?/？/: dropped) in their own answer / elsewhere."""
    texts = {doc_id: (row["title"] + "\n" + row["text"]).lower() for doc_id, row in corpus.items()}
    own = other = 0
    examples = []
    for qid, row in queries.items():
        needle = re.sub(r"[?？:：\s]+$", "", row["text"]).lower()
        if len(needle) < 6:
            continue
        hits = [d for d, t in texts.items() if needle in t]
        if any(d in qrels[qid] for d in hits):
            own += 1
            examples.append((qid, "own"))
        if any(d not in qrels[qid] for d in hits):
            other += 1
            examples.append((qid, "other:" + ",".join(d for d in hits if d not in qrels[qid])[:120]))
    return {"in_own_answer": own, "in_other_docs": other, "examples": examples[:20]}


# --------------------------------------------------------------------------------------------- python-faq-en

PY_PREFIX = "html/"
PY_FAQ_PAGES = ("general", "programming", "design", "library", "extending", "windows", "gui", "installed")
PY_DISTRACTOR_DIRS = ("tutorial", "howto", "using", "reference", "library")
PY_MIN_WORDS = 15           # answers and distractors under this many words are dropped
PY_DISTRACTOR_MIN_WORDS = 30
PY_MAX_DISTRACTORS = 2500
PY_DISTRACTOR_CHARS = 5000  # distractors are cut at a line boundary before this


def _sphinx_page(data: bytes) -> tuple[str, list[Event]]:
    page = soup(data)
    root = page.select_one("div[role=main]") or page.select_one("div.body") or page.body
    drop(root, ["nav.contents", "div.contents", "div.toctree-wrapper", "a.headerlink", "span.linenos",
                "div.sphinxsidebar", "div.related", "footer"])
    evs = events(root)
    title = next((e.text for e in evs if e.kind == "h"), "")
    return title, evs


def build_python(corpora: Path, seed: int) -> Built:
    tarball = corpora / "python-3.11-html.tar.xz"
    wanted = tuple(f"{PY_PREFIX}{d}/" for d in PY_DISTRACTOR_DIRS) + (f"{PY_PREFIX}faq/",)
    files = read_tar(tarball, lambda n: n.endswith(".html") and n.startswith(wanted))
    corpus: dict[str, dict] = {}
    seen_text: dict[str, str] = {}
    pairs: list[dict] = []
    dropped = collections.Counter()

    for page_name in PY_FAQ_PAGES:
        page = f"faq/{page_name}"
        title, evs = _sphinx_page(files[f"{PY_PREFIX}{page}.html"])
        secs = sections(page, evs)
        for i, sec in enumerate(secs):
            # an FAQ entry: a heading below the page title that is a question or has no subsections
            if sec.level < 2 or not ("?" in sec.heading or sec.leaf):
                continue
            text = join_blocks(answer_blocks(secs, i, lambda heading: "?" in heading))
            if len(LATIN_WORD.findall(text)) < PY_MIN_WORDS:
                dropped["answer under 15 words"] += 1
                continue
            pairs.append({
                "qid": f"q:{page}#{sec.anchor}", "question": sec.heading, "doc_id": f"{page}#{sec.anchor}",
                "title": " › ".join(sec.path), "text": text,
                "metadata": {"kind": "faq-question", "source": f"python-3.11 {page}.html"},
            })
    queries, qrels, merged = merge_questions(pairs, corpus, seen_text)
    answers = len(corpus)

    pool: list[tuple[str, str, str]] = []
    for name, data in files.items():
        rel = name[len(PY_PREFIX):-len(".html")]
        if rel.startswith("faq/"):
            continue
        title, evs = _sphinx_page(data)
        for sec in sections(rel, evs, intro_title=title):
            text = join_blocks(sec.own)
            if len(LATIN_WORD.findall(text)) < PY_DISTRACTOR_MIN_WORDS:
                continue
            path = sec.path + [sec.heading] if sec.level else [title]
            if path and path[0] != title:
                path = [title] + path
            if len(path) > 1 and path[0] == path[1]:
                path = path[1:]
            pool.append((f"{rel}#{sec.anchor}", " › ".join(path), truncate(text, PY_DISTRACTOR_CHARS)))
    rng = random.Random(seed)
    tutorial = [p for p in pool if not p[0].startswith("library/")]
    library = [p for p in pool if p[0].startswith("library/")]
    rng.shuffle(library)
    chosen = (tutorial + library)[:PY_MAX_DISTRACTORS]
    for doc_id, title, text in sorted(chosen):
        add_doc(corpus, seen_text, doc_id, title, text)
    distractors = len(corpus) - answers
    notes = {
        "pool": {"non-library sections": len(tutorial), "library sections": len(library)},
        "dropped": dict(dropped), "merged_duplicate_questions": merged,
    }
    return Built("python-faq-en", corpus, queries, qrels, distractors, notes)


# ----------------------------------------------------------------------------------------------- help-qa-zh

LO_PREFIX = "zh-CN/text/"
HB_PREFIX = "zh-CN/"
ZH_MIN_UNITS = 15           # answers under 15 units (CJK characters + Latin words) are dropped
ZH_DISTRACTOR_MIN_UNITS = 40
ZH_MIN_CJK_SHARE = 0.5      # answers and distractors must be mostly Chinese (the zh-CN help is partly untranslated)
ZH_MAX_DISTRACTORS = 2500
ZH_DISTRACTOR_CHARS = 2500

QUESTION_ZH = re.compile(r"[？?]\s*$|如何|怎样|怎么|为什么|什么|何时")
# LibreOffice wizard/dialog prompts that are headings but not questions a user would ask
LO_NOT_QUESTIONS = re.compile(r"^(您|要|是否要|是否确实|如何继续)")
def is_question_zh(heading: str) -> bool:
    heading = heading.rstrip(":：").strip()
    return len(CJK.findall(heading)) >= 2 and bool(QUESTION_ZH.search(heading))


LO_MODULES = {
    "shared": "LibreOffice", "swriter": "LibreOffice Writer", "scalc": "LibreOffice Calc",
    "simpress": "LibreOffice Impress", "sdraw": "LibreOffice Draw", "smath": "LibreOffice Math",
    "sbasic": "LibreOffice Basic", "sdatabase": "LibreOffice Base", "schart": "LibreOffice 图表",
}
# A guide page's title is a task when it starts with a verb (or a preposition that leads to one)
TASK_START = re.compile(
    r"^(使用|插入|创建|修改|更改|输入|定义|编辑|选择|添加|应用|打印|合并|显示|打开|删除|复制|旋转|关闭|计算|导入|"
    r"导出|更新|引用|筛选|组合|自定义|启动|注册|查找|比较|记录|禁用|保护|取消|仅复制|高亮|过滤|冻结|横向|重命名|替换|"
    r"连接|建立|调整|执行|保存|拖放|发送|集成|制作|录制|接受|浏览|生成|撤消|查看|加载|绘制|移动|防止|转到|重置|固定|"
    r"检查|强调|微调|格式化|排列|结合|交叉|手动|覆盖|设置|根据|通过|在|以|从|给|为|向|把|对|将)")
TASK_EXCLUDE = re.compile(r"快捷键|中的[^，、]*$|的一般说明|使用说明|^在 LibreOffice 中的")
ODD_CHARS = re.compile(r"[^\u3400-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef\u2010-\u201f\u2026「」 -~]")


def _lo_page(data: bytes) -> tuple[str, list[Event]]:
    page = soup(data)
    root = page.select_one("#DisplayArea") or page.body
    drop(root, ["div.relatedtopics", "footer", "#SearchFrame", "#DonationFrame", "div.debug"])
    for variant in root.select("[hidden]"):  # per-system/per-module variants that the page's script picks from:
        if variant.decomposed:                           # inside one dropped already
            continue
        if variant.get("id", "").startswith("default"):  # keep the default one ("工具 - 选项", "Ctrl"),
            del variant["hidden"]
        else:                                            # drop the macOS and module-specific ones
            variant.decompose()
    related = root.select_one("p.related")  # a "相关主题" list written inline: it and everything after it go
    if related is not None:
        top = related
        while top.parent is not None and top.parent is not root:
            top = top.parent
        if top.parent is root:
            for tail in list(top.find_next_siblings()):
                tail.decompose()
            top.decompose()
    evs = events(root)
    title = next((e.text for e in evs if e.kind == "h"), "")
    return title, evs


HB_NUMBER = re.compile(r"^(第\s*\d+\s*章|附录\s*[A-Z]|\d+(\.\d+)*\.?)\s*")


def _hb_strip(text: str) -> str:
    return HB_NUMBER.sub("", text).strip()


def _hb_page(data: bytes) -> tuple[str, BeautifulSoup, Tag]:
    page = soup(data)
    root = page.body
    drop(root, ["#banner", "#title", "ul.docnav", "div.toc", "a.indexterm", "div.legalnotice"])
    up = page.find("link", rel="up")
    chapter = _hb_strip(up["title"]) if up is not None and up.get("title") else ""
    if chapter == "Debian 管理员手册":
        chapter = ""
    return chapter, page, root


def build_zh(corpora: Path, seed: int) -> Built:
    lo = read_tar(corpora / "libreoffice-help-zh-CN-html.tar.xz",
                  lambda n: n.startswith(LO_PREFIX) and n.endswith(".html"))
    hb = read_tar(corpora / "debian-handbook-zh-CN-html.tar.xz",
                  lambda n: n.startswith(HB_PREFIX) and n.endswith(".html") and n.count("/") == 1)
    corpus: dict[str, dict] = {}
    seen_text: dict[str, str] = {}
    pairs: list[dict] = []
    pool: list[tuple[str, str, str]] = []
    dropped = collections.Counter()
    counts = collections.Counter()

    def answer_ok(text: str, what: str) -> bool:
        if units(text) < ZH_MIN_UNITS:
            dropped[f"{what}: answer under {ZH_MIN_UNITS} characters/words"] += 1
            return False
        if cjk_share(text) < ZH_MIN_CJK_SHARE:
            dropped[f"{what}: answer mostly untranslated English"] += 1
            return False
        return True

    # --- LibreOffice help: question headings, then task-titled guide pages, the rest as distractors
    for name, data in lo.items():
        rel = name[len(LO_PREFIX):-len(".html")]          # e.g. swriter/guide/table_insert
        module = LO_MODULES.get(rel.split("/")[0], "LibreOffice")
        title, evs = _lo_page(data)
        secs = sections(rel, evs)
        used: set[int] = set()
        for i, sec in enumerate(secs):
            q = sec.heading.rstrip(":：").strip()
            if sec.level < 2 or not is_question_zh(q):
                continue
            if rel.startswith("shared/autopi/") or LO_NOT_QUESTIONS.search(q):
                dropped["libreoffice: wizard/dialog prompt heading"] += 1
                continue
            if rel.endswith("/main0000"):  # "如何使用 LibreOffice Calc": answered by a list of links only
                dropped["libreoffice: module start page (answer is a list of links)"] += 1
                continue
            text = join_blocks(answer_blocks(secs, i, is_question_zh))
            if not answer_ok(text, "libreoffice question"):
                continue
            used.add(i)
            path = [module] + [p for p in sec.path if norm_question(p) != norm_question(q)]
            pairs.append({
                "qid": f"q:lo/{rel}#{sec.anchor}", "question": q, "doc_id": f"lo/{rel}#{sec.anchor}",
                "title": " › ".join(path), "text": text,
                "metadata": {"kind": "question-heading", "source": f"libreoffice-help zh-CN text/{rel}.html"},
            })
            counts["libreoffice question headings"] += 1
        task = None
        if "/guide/" in rel and not used and title and secs and secs[0].level == 1:
            t = title.strip()
            if (TASK_START.search(t) and not TASK_EXCLUDE.search(t) and not ODD_CHARS.search(t)
                    and len(CJK.findall(t)) >= 2 and not is_question_zh(t)):
                text = join_blocks(secs[0].full)   # the whole page below its title
                if answer_ok(text, "libreoffice task page"):
                    task = t
                    pairs.append({
                        "qid": f"t:lo/{rel}", "question": f"如何{t}？", "doc_id": f"lo/{rel}",
                        "title": module, "text": text,
                        "metadata": {"kind": "task-title", "source": f"libreoffice-help zh-CN text/{rel}.html",
                                     "page_title": t},
                    })
                    counts["libreoffice task-titled guide pages"] += 1
        if task is not None:
            continue
        for i, sec in enumerate(secs):
            if i in used:
                continue
            text = join_blocks(sec.own)
            if units(text) < ZH_DISTRACTOR_MIN_UNITS or cjk_share(text) < ZH_MIN_CJK_SHARE:
                continue
            path = [module] + sec.path + ([sec.heading] if sec.heading else [])
            pool.append((f"lo/{rel}#{sec.anchor}", " › ".join(path), truncate(text, ZH_DISTRACTOR_CHARS)))

    # --- Debian handbook: question sidebars and question headings, the rest as distractors
    for name, data in hb.items():
        rel = name[len(HB_PREFIX):-len(".html")]
        if rel == "index":                                 # front matter and the whole table of contents
            continue
        chapter, page, root = _hb_page(data)
        for n, box in enumerate(root.select("div.sidebar")):
            head = box.select_one("p.title")
            if head is None:
                continue
            label_tag = head.find("em")
            label = _inline(label_tag.get_text()) if label_tag is not None else ""
            full = _inline(head.get_text(" "))
            q = full[len(label):].strip() if label and full.startswith(label) else full
            if not is_question_zh(q):
                continue
            box_title = box.select_one("div.titlepage")
            if box_title is not None:
                box_title.decompose()
            text = join_blocks([e.text for e in events(box) if e.kind == "t"])
            anchor = box.find("a", id=True)
            anchor = anchor["id"] if anchor is not None else f"sidebar-{n}"
            # the section that holds the box, for the passage's title
            holder = box.find_previous(HEADINGS)
            path = [p for p in (chapter, _hb_strip(_heading_text(holder)) if holder else "") if p]
            if label:
                path.append(label)
            box.decompose()                                  # out of the enclosing section's text
            if not answer_ok(text, "handbook sidebar"):
                continue
            pairs.append({
                "qid": f"q:hb/{rel}#{anchor}", "question": q, "doc_id": f"hb/{rel}#{anchor}",
                "title": " › ".join(path), "text": text,
                "metadata": {"kind": "question-sidebar", "source": f"debian-handbook zh-CN {rel}.html"},
            })
            counts["handbook question sidebars"] += 1
        evs = [Event(e.kind, _hb_strip(e.text) if e.kind == "h" else e.text, e.level, e.anchor)
               for e in events(root)]
        secs = sections(rel, evs)
        for i, sec in enumerate(secs):
            q = sec.heading
            if sec.level >= 1 and is_question_zh(q):
                text = join_blocks(answer_blocks(secs, i, is_question_zh))
                if answer_ok(text, "handbook question heading"):
                    path = [p for p in [chapter] + sec.path if p and p != q]
                    pairs.append({
                        "qid": f"q:hb/{rel}#{sec.anchor}", "question": q, "doc_id": f"hb/{rel}#{sec.anchor}",
                        "title": " › ".join(path), "text": text,
                        "metadata": {"kind": "question-heading", "source": f"debian-handbook zh-CN {rel}.html"},
                    })
                    counts["handbook question headings"] += 1
                    continue
            text = join_blocks(sec.own)
            if units(text) < ZH_DISTRACTOR_MIN_UNITS or cjk_share(text) < ZH_MIN_CJK_SHARE:
                continue
            path = [p for p in [chapter] + sec.path + [sec.heading] if p]
            if len(path) > 1 and path[0] == path[1]:
                path = path[1:]
            pool.append((f"hb/{rel}#{sec.anchor}", " › ".join(path), truncate(text, ZH_DISTRACTOR_CHARS)))

    queries, qrels, merged = merge_questions(pairs, corpus, seen_text)
    answers = len(corpus)
    answer_ids = set(corpus)
    # a distractor must not be a section inside an answer passage (a question heading's answer holds its subsections)
    inside = {d.split("#")[0] for d in answer_ids}
    rng = random.Random(seed)
    handbook = [p for p in pool if p[0].startswith("hb/")]
    libre = [p for p in pool if p[0].startswith("lo/")]
    rng.shuffle(libre)
    chosen = (handbook + libre)[:ZH_MAX_DISTRACTORS]
    skipped_inside = 0
    answer_texts = [corpus[d]["text"] for d in answer_ids]
    for doc_id, title, text in sorted(chosen):
        if doc_id.split("#")[0] in inside and any(text in a for a in answer_texts):
            skipped_inside += 1
            continue
        add_doc(corpus, seen_text, doc_id, title, text)
    distractors = len(corpus) - answers
    notes = {
        "sources": dict(counts), "dropped": dict(dropped), "merged_duplicate_questions": merged,
        "pool": {"handbook sections": len(handbook), "libreoffice sections": len(libre)},
        "distractors_skipped_as_part_of_an_answer": skipped_inside,
    }
    return Built("help-qa-zh", corpus, queries, qrels, distractors, notes)


# -------------------------------------------------------------------------------------------------------- output

README_PY = """# python-faq-en: natural questions over the Python 3.11 documentation (BEIR layout)

Built by `scripts/build_faq_beir.py --set python-faq-en` from `../shared/corpora/python-3.11-html.tar.xz`
(Debian python3.11-doc: the Python 3.11.2 HTML documentation).

- **Queries**: {queries} questions, the entry headings of the FAQ pages `faq/{{{faq_pages}}}.html` (every heading
  below the page title that contains "?" or has no subsections; category headings such as "Core Language" are
  not questions). Query ids are `q:` + the answer's id. Their order in `queries.jsonl` is a seeded shuffle
  (seed {seed}), so `kbflow eval --max-queries N` scores a random sample of all pages.
- **Relevant documents**: {relevant} answer passages, one per question except where a question is asked on two
  pages ({multi}: {multi_names}; merged into one query, all its answers relevant), id `faq/<page>#<section-id>`, e.g.
  `faq/programming#how-do-i-copy-an-object-in-python`. The passage is the entry's text up to the next heading of the same
  or a higher level, subsections included. Entries whose answer has fewer than {min_words} words were dropped
  ({dropped_short}, e.g. "See the Unicode HOWTO.", "See the next question.").
- **Distractors**: {distractors} other sections of the manual, each a section of a page (its own text up to the next
  heading, at least {dmin} words, cut at a line boundary before {dchars} characters), id `<dir>/<page>#<section-id>`:
  every section of tutorial/, howto/, using/ and reference/ ({nonlib} sections), then library/ sections in a seeded
  random order until there are {dmax} ({libtaken} of the {lib} library sections). Identical texts are stored once.
- **Qrels**: `qrels/test.tsv`, {qrels} rows, score 1.

## How the question was removed from its passage
The heading element that holds the question is not part of the passage; the passage's `title` is the page title and
the category heading above the question (e.g. "Programming FAQ › Core Language"), never the question. The FAQ pages'
local table of contents (which lists every question), Sphinx's "¶" permalinks, the sidebar and the navigation are
dropped before the text is taken, so the question text does not remain elsewhere on its own page.
Leak check after building (case-insensitive, trailing "?" ignored): {leak_own} questions still occur verbatim in
their own answer passage and {leak_other} occur verbatim in some other document (e.g. a cross-reference whose link
text is the question's title); those were left as the documentation wrote them.

Text extraction: block elements become lines, inline runs are joined with single spaces, `<pre>` code keeps its
lines. The relevance labels are the documentation's own question → answer structure, not human judgements of
other passages: a distractor (e.g. a tutorial section) may also answer a question and count as a miss.

## Licence
Python 3.11.2 documentation, © 2001-2023 Python Software Foundation (and BeOpen.com, CNRI, CWI before it). Its
`license.html` (in the tarball) says: "Python software and documentation are licensed under the PSF License
Agreement"; since 3.8.6 the examples, recipes and other code in the documentation are dual-licensed under the PSF
License Agreement and the Zero-Clause BSD licence.
"""

README_ZH = """# help-qa-zh: Chinese questions over the LibreOffice help and the Debian Administrator's Handbook (BEIR layout)

Built by `scripts/build_faq_beir.py --set help-qa-zh` from two tarballs in `../shared/corpora`:
`libreoffice-help-zh-CN-html.tar.xz` (LibreOffice 7.4 help, Simplified Chinese, 2,560 pages under text/) and
`debian-handbook-zh-CN-html.tar.xz` (The Debian Administrator's Handbook, Debian 11 edition, Simplified Chinese).
Neither holds a real FAQ and together they have only {genuine} usable question headings, so the set combines three
kinds of query (`metadata.kind` in `queries.jsonl`, and the query-id prefix):

| kind | id prefix | queries | what |
|---|---|---|---|
| question-heading | `q:lo/…`, `q:hb/…` | {n_heading} | a heading that is a question ("什么是矩阵？", "如何隐藏文档中公式附加的注释？", "为什么选择 Debian 发行版？", "udev 如何工作"); the section under it is the answer |
| question-sidebar | `q:hb/…` | {n_sidebar} | a handbook side box whose title is a question ("什么是 i18n 与 l10n？"; its label such as "基础知识" removed); the box's text is the answer |
| task-title | `t:lo/…` | {n_task} | a LibreOffice guide page (text/*/guide/) whose title is a task, asked as "如何<title>？" (title "插入表格" → "如何插入表格？"); the whole page below its title is the answer |

Score the kinds separately by filtering on the prefix if needed: task-title queries are a template around the page
title, so they share words with their answer more than the genuine questions do.

- **Queries**: {queries} ({merged} duplicates merged: the same question on two pages has both answers relevant).
  Queries are in a seeded shuffle (seed {seed}) so `--max-queries N` takes a random sample.
- **Relevant documents**: {relevant}; ids `lo/<module>/<dir>/<page>#<heading-id>` (question sections),
  `lo/<module>/guide/<page>` (task pages), `hb/<page>#<anchor>` (handbook sections and side boxes).
- **Dropped**: {dropped}.
  LibreOffice wizard/dialog prompts that are headings (shared/autopi/*, "您想为选项组指定哪个标题？",
  "是否确实要在图形视图中打开查询？", "如何继续？") are not questions a user asks; the modules' start pages'
  "如何使用 LibreOffice Calc/Math/Impress/Draw" are answered by a list of links only. The zh-CN help is partly untranslated:
  passages (answers and distractors) where CJK characters are under {share:.0%} of the content (CJK characters +
  Latin words) are dropped; passages above that keep their untranslated English sentences, as the manuals have them.
- **Distractors**: {distractors} sections (text up to the next heading, at least {dmin} CJK characters + Latin
  words, cut at a line boundary before {dchars} characters): every usable section of the handbook ({n_hb}
  candidates) and a seeded sample of the other LibreOffice pages' sections (from {n_lo}), {dmax} at most in all.
  Identical texts are stored once.
- **Qrels**: `qrels/test.tsv`, {qrels} rows, score 1.

## How the question was removed from its passage
The heading (or the side box's title) holding the question is not part of the passage; a passage's `title` is the
LibreOffice module or the handbook chapter plus the headings above the question, never the question or (for task
pages) the page title. Dropped before taking text: LibreOffice's "相关主题" (related topics: they list other pages'
titles), the debug footer ("Title is: …"), the non-default per-platform and per-module variants (the default,
e.g. "工具 - 选项" rather than macOS's "LibreOffice - 偏好设置", is kept), the index keywords; the handbook's
navigation bars (they name the previous/next section), tables of contents, index terms and its front page
(index.html). A question side box is also cut out of the section that holds it, so its text is in one passage only.
Leak check after building (case-insensitive, trailing "？" ignored): {leak_own} queries occur verbatim in their own
answer and {leak_other} in some other document (for task-title queries the check looks for "如何<title>", which
rarely occurs; the bare title words often do, as they name the feature).

## Licences
- LibreOffice help: Mozilla Public License 2.0 (the help pages name no licence themselves; the LibreOffice help
  sources are MPL-2.0, © The Document Foundation and contributors).
- The Debian Administrator's Handbook: © Raphaël Hertzog, Roland Mas, Freexian SARL; dual-licensed under
  CC-BY-SA-3.0 (unported) and GPL-2+, as its legal notice in `index.html` of the tarball says.
"""


def scrub_titles(built: Built) -> int:
    """Drop from every passage's title path the parts that are some query's text (a side box or a subsection
    under a question heading would otherwise carry that question in its title). Returns how many titles changed."""
    asked = {norm_question(q["text"]) for q in built.queries.values()}
    changed = 0
    for row in built.corpus.values():
        parts = [p for p in row["title"].split(" › ") if p and norm_question(p) not in asked]
        title = " › ".join(parts)
        if title != row["title"]:
            row["title"] = title
            changed += 1
    return changed


def write_set(built: Built, out: Path, readme: str) -> None:
    folder = out / built.name
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with open(folder / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for row in built.corpus.values():
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as handle:
        for row in built.queries.values():
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(folder / "qrels" / "test.tsv", "w", encoding="utf-8") as handle:
        handle.write("query-id\tcorpus-id\tscore\n")
        for qid in built.queries:
            for doc in built.qrels[qid]:
                handle.write(f"{qid}\t{doc}\t1\n")
    (folder / "README.md").write_text(readme, encoding="utf-8")


def shuffle_queries(built: Built, seed: int) -> None:
    order = list(built.queries)
    random.Random(seed).shuffle(order)
    built.queries = {q: built.queries[q] for q in order}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="parent folder; each set goes to OUT/<set>/")
    parser.add_argument("--set", choices=SETS + ("all",), default="all", help="which set to build")
    parser.add_argument("--corpora", type=Path, default=DEFAULT_CORPORA, help="folder holding the tarballs")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    for name in SETS if args.set == "all" else (args.set,):
        built = build_python(args.corpora, args.seed) if name == "python-faq-en" else build_zh(args.corpora, args.seed)
        shuffle_queries(built, args.seed)
        built.notes["titles_scrubbed_of_a_question"] = scrub_titles(built)
        leaks = leak_counts(built.queries, built.qrels, built.corpus)
        relevant = {d for docs in built.qrels.values() for d in docs}
        qrel_rows = sum(len(d) for d in built.qrels.values())
        multi = sum(1 for d in built.qrels.values() if len(d) > 1)
        if name == "python-faq-en":
            readme = README_PY.format(
                queries=len(built.queries), faq_pages=",".join(PY_FAQ_PAGES), seed=args.seed,
                relevant=len(relevant), multi=multi, min_words=PY_MIN_WORDS,
                dropped_short=built.notes["dropped"].get("answer under 15 words", 0), distractors=built.distractors,
                dmin=PY_DISTRACTOR_MIN_WORDS, dchars=PY_DISTRACTOR_CHARS,
                nonlib=built.notes["pool"]["non-library sections"], lib=built.notes["pool"]["library sections"],
                multi_names=", ".join(f'"{built.queries[q]["text"]}"' for q, d in built.qrels.items() if len(d) > 1),
                libtaken=sum(1 for d in built.corpus if d.startswith("library/")),
                dmax=PY_MAX_DISTRACTORS, qrels=qrel_rows, leak_own=leaks["in_own_answer"],
                leak_other=leaks["in_other_docs"])
        else:
            kinds = collections.Counter(q["metadata"]["kind"] for q in built.queries.values())
            readme = README_ZH.format(
                genuine=kinds["question-heading"] + kinds["question-sidebar"], n_heading=kinds["question-heading"],
                n_sidebar=kinds["question-sidebar"], n_task=kinds["task-title"], queries=len(built.queries),
                merged=built.notes["merged_duplicate_questions"], seed=args.seed, relevant=len(relevant),
                dropped="".join(f"\n  - {k}: {v}" for k, v in sorted(built.notes["dropped"].items())) or "none",
                share=ZH_MIN_CJK_SHARE, distractors=built.distractors, dmin=ZH_DISTRACTOR_MIN_UNITS,
                dchars=ZH_DISTRACTOR_CHARS, n_hb=built.notes["pool"]["handbook sections"],
                n_lo=built.notes["pool"]["libreoffice sections"], dmax=ZH_MAX_DISTRACTORS, qrels=qrel_rows,
                leak_own=leaks["in_own_answer"], leak_other=leaks["in_other_docs"])
        write_set(built, args.out, readme)
        size = (args.out / name / "corpus.jsonl").stat().st_size
        print(json.dumps({"set": name, "queries": len(built.queries), "relevant_docs": len(relevant),
                          "distractors": built.distractors, "corpus_docs": len(built.corpus),
                          "corpus_bytes": size, "notes": built.notes, "leaks": leaks}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
