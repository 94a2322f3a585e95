"""Document furniture in paged text: what a printed book carries for finding your way on paper, and what a search
must not return. Removed from a PDF's pages before they become Markdown (as navigation is from HTML):

- tables of contents (and lists of tables and figures): pages made mostly of dot-leader lines ('1.1 Console basics
  . . . . 1'), dropped with their chapter lines and their title. The same headings open their sections in the body,
  where the heading path carries them; kept as a list, they were one chunk of every heading in the book;
- running headers and footers: first or last lines that repeat, numbers aside, on at least half of the pages;
- page numbers: a first or last line that is only a page number ('12', 'xiv', '- 12 -', 'Page 3', '3 / 233');
- back-of-book indexes: pages from an 'Index' title on, made mostly of 'term, 12, 34' entries and letter groups.

Each rule works on whole lines of one page and drops only lines of the shape it names, on pages where most lines
have it, so body text that happens to end with a number stays.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Protocol, TypeVar

PAGE_NUMBER = r"(?:\d{1,4}|[ivxlcdm]{1,7})"
LEADER_RE = re.compile(rf"(?:(?:\.\s?){{4,}}|…{{2,}}|(?:·\s?){{4,}}|_{{4,}})\s*{PAGE_NUMBER}\s*$", re.I)
CHAPTER_LINE_RE = re.compile(rf"^(?:[A-Z]|\d+)(?:\.\d+)*\.?\s*\S.{{0,150}}\s{PAGE_NUMBER}$", re.I)  # '1 GNU/Linux 1'
CONTENTS_TITLES = {"contents", "table of contents", "list of tables", "list of figures", "list of examples",
                   "目录", "目錄", "表格清单", "插图清单", "范例清单", "inhaltsverzeichnis",
                   "table des matières"}
BARE_PAGE_RE = re.compile(rf"^(?:page\s+|[-–—]\s*)?{PAGE_NUMBER}(?:\s*(?:/|of)\s*\d{{1,5}}|\s*[-–—])?$", re.I)
INDEX_TITLES = {"index", "general index", "subject index", "索引"}
INDEX_ENTRY_RE = re.compile(rf"^\S.{{0,120}}?,\s*{PAGE_NUMBER}(?:\s*[-–]\s*{PAGE_NUMBER})?"
                            rf"(?:\s*,\s*{PAGE_NUMBER}(?:\s*[-–]\s*{PAGE_NUMBER})?)*$", re.I)
LETTER_GROUP_RE = re.compile(r"^(?:[A-Z]|[A-Z]\s*[-–]\s*[A-Z]|Symbols|Numbers|\d)$")
MOSTLY = 0.5  # share of a page's lines that makes it a contents or index page


class HasText(Protocol):
    text: str


TextLine = TypeVar("TextLine", bound=HasText)  # a page's line type stays the same through every rule


def _key(text: str) -> str:
    return " ".join(text.lower().split())


def running_key(text: str) -> str:
    """A line with its numbers (arabic or roman) and punctuation taken out: what repeats from page to page."""
    without_numbers = re.sub(r"\b[ivxlcdm]+\b|\d+", " ", text, flags=re.I)
    return " ".join(re.sub(r"[\W_]+", " ", without_numbers).split())


def drop_running_lines(pages: list[list[TextLine]]) -> list[list[TextLine]]:
    """Remove first/last lines that repeat (numbers aside) on at least half of the pages, and first/last lines
    that are only a page number."""
    counts: Counter = Counter()
    if len(pages) >= 4:
        for lines in pages:
            for key in {running_key(line.text) for line in lines[:2] + lines[-2:]}:
                counts[key] += 1
    # a line of numbers and marks alone ('}', '12') has no key: a page number is judged on its own, below
    running = {key for key, seen in counts.items() if key and seen >= len(pages) / 2}

    def furniture(line: HasText) -> bool:
        return running_key(line.text) in running or bool(BARE_PAGE_RE.match(line.text.strip()))

    return [[line for i, line in enumerate(lines) if not ((i < 2 or i >= len(lines) - 2) and furniture(line))]
            for lines in pages]


def _is_contents_page(lines: Sequence[HasText]) -> bool:
    leaders = sum(bool(LEADER_RE.search(line.text)) for line in lines)
    return leaders >= 2 and leaders >= MOSTLY * len(lines)


def drop_contents(pages: list[list[TextLine]]) -> list[list[TextLine]]:
    """Remove the lines of contents pages: dot-leader lines, chapter lines ending in a page number, their titles."""
    out = []
    for lines in pages:
        if _is_contents_page(lines):
            lines = [line for line in lines if not (LEADER_RE.search(line.text) or _key(line.text) in CONTENTS_TITLES
                                                    or CHAPTER_LINE_RE.match(line.text.strip()))]
        out.append(lines)
    return out


def _index_entries(lines: Sequence[HasText]) -> int:
    return sum(bool(INDEX_ENTRY_RE.match(line.text.strip()) or LETTER_GROUP_RE.match(line.text.strip()))
               for line in lines)


def drop_index(pages: list[list[TextLine]]) -> list[list[TextLine]]:
    """Remove a back-of-book index: from a page whose lines include an index title and are mostly entries, to the
    last page after it that is mostly entries."""
    out, in_index = [], False
    for lines in pages:
        titled = any(_key(line.text) in INDEX_TITLES for line in lines)
        mostly = bool(lines) and _index_entries(lines) >= MOSTLY * len(lines)
        in_index = mostly and (in_index or titled)
        if in_index:
            lines = [line for line in lines if not (INDEX_ENTRY_RE.match(line.text.strip())
                                                    or LETTER_GROUP_RE.match(line.text.strip())
                                                    or _key(line.text) in INDEX_TITLES)]
        out.append(lines)
    return out


def drop_furniture(pages: list[list[TextLine]]) -> list[list[TextLine]]:
    """Every rule above, running lines first (a contents or index page is judged by what it holds)."""
    return drop_index(drop_contents(drop_running_lines(pages)))
