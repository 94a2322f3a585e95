"""Split Markdown into blocks (paragraph, code, table, list, heading) with heading paths and exact offsets.

A paragraph, list or table that is navigation (mostly links with little text of its own: "Prev | Up | Home",
"[上一页] … [下一页]", a chapter's table of contents) becomes a ``navigation`` block, which the chunker leaves out:
it would otherwise come back as a hit that says nothing.

Offsets are indices into the converted Markdown string: ``markdown[char_start:char_end] == text``.
A heading inside a code fence is code, not a heading. A thematic break (``* * *``, ``---``, ``___`` on a line of
its own) becomes a ``break`` block: a section boundary with no content. The converter writes one at each HTML
``section``/``article`` boundary that no heading opens, so the chunker never packs two sections together.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SPLIT_VERSION = "6"  # 3: heading whitespace normalised; 4: navigation blocks; 5: links in headings as their text;
# 6: a list does not run on into a code fence after a blank line
HEADING_LINK_RE = re.compile(r'!?\[([^\[\]]*)\]\(\s*+(?:<[^<>]*>|[^()\s]*+)(?:\s++"[^"]*")?\s*+\)')  # [text](href "t")

FENCE_RE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
ATX_RE = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT_RE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
TABLE_RE = re.compile(r"^ {0,3}\|")
THEMATIC_RE = re.compile(r"^ {0,3}(?:(?:\*[ \t]*){3,}|(?:-[ \t]*){3,}|(?:_[ \t]*){3,})$")
LIST_RE = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
LINK_RE = re.compile(r"!?\[([^\]]*)\]\([^)]*\)|<(?:https?|mailto):[^>]*>")
WORD_RE = re.compile(r"[\w\u4e00-\u9fff]+")
ITEM_RE = re.compile(r"^\s*(?:[-*+]|\d{1,9}[.)])\s+|\|")
NAV_OWN_TEXT = 24  # a navigation block's text outside its links is at most this many word characters (and no
# more than its links' own), ...
NAV_ITEM_SHARE = 0.6  # ...or, in a list or table, at least this share of its items are links alone


def _own_text(text: str) -> str:
    """The words of ``text`` outside its links."""
    return "".join(WORD_RE.findall(LINK_RE.sub(" ", text)))


def is_navigation(kind: str, text: str) -> bool:
    """Links with little text of their own: a link bar, a "previous / up / next" list, a table of contents."""
    if kind not in ("paragraph", "list", "table"):
        return False
    links = list(LINK_RE.finditer(text))
    if not links:
        return False
    linked = sum(len("".join(WORD_RE.findall(link.group(1) if link.group(1) is not None else link.group(0))))
                 for link in links)
    own = len(_own_text(text))
    if own <= NAV_OWN_TEXT and own <= linked:  # "Use [DROP INDEX](…) to remove an index." is a sentence
        return True
    if kind == "paragraph":
        return False
    items = [part for line in text.splitlines() for part in ITEM_RE.split(line) if part.strip(" |-:")]
    link_only = sum(1 for item in items if LINK_RE.search(item) and len(_own_text(item)) <= 3)
    return len(items) >= 3 and link_only >= NAV_ITEM_SHARE * len(items)


@dataclass
class Block:
    kind: str
    char_start: int
    char_end: int
    heading_path: list[str] = field(default_factory=list)


def _lines(markdown: str):
    """(start, end-without-newline, line text) for every line."""
    position = 0
    for line in markdown.splitlines(keepends=True):
        stripped = line.rstrip("\r\n")
        yield position, position + len(stripped), stripped
        position += len(line)


def normal_heading(title: str) -> str:
    """A heading as it is stored and filtered: whitespace runs (non-breaking spaces from HTML included) become one
    space, so `--heading '第 6 章 维护和更新：APT 工具'` matches what a page wrote with &nbsp;; a link or image in
    it becomes its text (Sphinx titles a module page "[`glob`](#module-glob "glob: …") — Unix style pathname
    pattern expansion": the heading path the model reads before each chunk is "`glob` — Unix style …")."""
    for _ in range(3):  # an image inside a link: the image first, then the link
        title, replaced = HEADING_LINK_RE.subn(r"\1", title)
        if not replaced:
            break
    return " ".join(title.split())


def split_markdown(markdown: str) -> list[Block]:
    lines = list(_lines(markdown))
    blocks: list[Block] = []
    path: list[tuple[int, str]] = []  # (level, title)

    def heading_path() -> list[str]:
        return [title for _, title in path]

    def set_heading(level: int, title: str) -> None:
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, normal_heading(title) or f"(h{level})"))

    i, n = 0, len(lines)
    while i < n:
        start, end, text = lines[i]
        if not text.strip():
            i += 1
            continue
        fence = FENCE_RE.match(text)
        if fence:
            marker = fence.group(1)
            j = i + 1
            closing = re.compile(rf"^ {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}[ \t]*$")
            while j < n and not closing.match(lines[j][2]):
                j += 1
            last = min(j, n - 1)
            blocks.append(Block("code", start, lines[last][1], heading_path()))
            i = last + 1
            continue
        if THEMATIC_RE.match(text):  # before lists: '* * *' would read as a list item
            blocks.append(Block("break", start, end, heading_path()))
            i += 1
            continue
        atx = ATX_RE.match(text)
        if atx:
            set_heading(len(atx.group(1)), atx.group(2) or "")
            blocks.append(Block("heading", start, end, heading_path()))
            i += 1
            continue
        if TABLE_RE.match(text):
            j = i
            while j + 1 < n and TABLE_RE.match(lines[j + 1][2]):
                j += 1
            blocks.append(Block("table", start, lines[j][1], heading_path()))
            i = j + 1
            continue
        if LIST_RE.match(text):
            j = i
            while j + 1 < n:
                nxt = lines[j + 1][2]
                if nxt.strip() and not FENCE_RE.match(nxt) and not ATX_RE.match(nxt) and not THEMATIC_RE.match(nxt):
                    j += 1
                    continue
                # a blank line ends the list unless the list goes on after it; a code fence (indented into the
                # item or not) starts a code block of its own: taken into the list, its closing fence would be read
                # as an opening one, and every heading-like comment of the code after it as a heading
                k = j + 1
                while k < n and not lines[k][2].strip():
                    k += 1
                if k < n and k > j + 1 and not FENCE_RE.match(lines[k][2]) and (
                        LIST_RE.match(lines[k][2]) or lines[k][2].startswith(("  ", "\t"))):
                    j = k
                    continue
                break
            blocks.append(Block("list", start, lines[j][1], heading_path()))
            i = j + 1
            continue
        # paragraph: runs until a blank line or the start of another block; a setext underline makes it a heading
        j = i
        setext_level = 0
        while j + 1 < n:
            nxt = lines[j + 1][2]
            if not nxt.strip() or FENCE_RE.match(nxt) or ATX_RE.match(nxt) or TABLE_RE.match(nxt):
                break
            if SETEXT_RE.match(nxt):
                setext_level = 1 if nxt.strip()[0] == "=" else 2
                break
            if LIST_RE.match(nxt) or THEMATIC_RE.match(nxt):  # a list item or a break interrupts a paragraph
                break
            j += 1
        if setext_level:
            title = " ".join(line[2].strip() for line in lines[i : j + 1])
            set_heading(setext_level, title)
            blocks.append(Block("heading", start, lines[j + 1][1], heading_path()))
            i = j + 2
            continue
        blocks.append(Block("paragraph", start, lines[j][1], heading_path()))
        i = j + 1
    for block in blocks:
        if is_navigation(block.kind, markdown[block.char_start:block.char_end]):
            block.kind = "navigation"
    return blocks
