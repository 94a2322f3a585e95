"""Where a PDF page's text and rules sit: the geometry that tables and headings are recovered from.

PDFium gives a page's text as lines (it joins runs on one baseline with a space, however wide the gap). A line
keeps the position of each space between words: a space much wider than a word gap separates two cells of an
unruled table, and a space that a table's vertical rule crosses separates two cells of a ruled one. Rules are
the thin path objects on the page (Chromium, LibreOffice and Word draw table borders so) and the edges of
stroked rectangles.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

CELL_GAP_EM = 0.6  # a space wider than this many font sizes separates two cells, not two words
UNLOCATED = -1  # a narrow gap's character, until locate_gaps finds it
NARROW_GAP_EM = 0.25  # a space this wide parts two cells where a column is known to start (a tight table)
LINK_COVER = 0.8
RULE_THICKNESS = 2.5  # points: a path thinner than this and ...
RULE_MIN_LENGTH = 6.0  # ... longer than this is a ruling line
FIXED_PITCH = 1  # PDF font descriptor flag: a monospace font
NUMBERED_RE = re.compile(r"(\d+(?:\.\d+){0,5})\.?\s+\S")  # "3.1.2 Hydro network", "9.9. Date/Time Functions"
BOLD_NAME_RE = re.compile(r"bold|black|heavy|semibold|demi", re.I)


@dataclass
class Segment:
    text: str
    left: float
    right: float


@dataclass
class Line:
    text: str
    bottom: float
    top: float
    size: float
    left: float = 0.0
    right: float = 0.0
    gaps: list[tuple[int, float, float]] = field(default_factory=list)  # (offset of a space run, its left, its right)
    mono: bool = False  # every piece between gaps starts and ends in a monospace font (known for lines with gaps)
    bold: bool = False  # known for numbered lines (heading candidates) only
    start: int = 0  # the line's first character in the page's text (where locate_gaps looks)
    first: int = 0  # offset of its first visible character
    em: float = 0.0  # the width a word gap is measured against: the font size, or the line's height where a
    # PDF scales text by its matrix and reports a font size of 1
    link: bool = False  # most of the line lies under a menu's links (see mark_links)
    heading: int = 0  # a heading level given by the document outline, 0 for none, -1 for a wrapped title's rest
    heading_text: str = ""  # the outline's title for the heading

    def segments(self, cut) -> list[Segment]:
        """The line cut at the spaces for which ``cut(gap_left, gap_right)`` is true."""
        pieces, start, left = [], 0, self.left
        for offset, gap_left, gap_right in self.gaps:
            if offset != UNLOCATED and cut(gap_left, gap_right):
                pieces.append(Segment(self.text[start:offset].strip(), left, gap_left))
                start, left = offset, gap_right
        pieces.append(Segment(self.text[start:].strip(), left, self.right))
        return [piece for piece in pieces if piece.text]

    def cells(self) -> list[Segment]:
        """The line cut at spaces wider than a word gap: the cells of an unruled table row."""
        wide = CELL_GAP_EM * self.em
        return self.segments(lambda gap_left, gap_right: gap_right - gap_left > wide)


class _Boxes:
    """Character boxes and text rectangles of one text page through PDFium's C API (no object per call)."""

    def __init__(self, textpage):
        import pypdfium2.raw as raw

        self.raw, self.page = raw, textpage.raw
        self.l, self.r, self.b, self.t = (ctypes.c_double() for _ in range(4))
        self.flags = ctypes.c_int()

    def box(self, index: int) -> tuple[float, float, float, float]:
        self.raw.FPDFText_GetCharBox(self.page, index, self.l, self.r, self.b, self.t)
        return self.l.value, self.r.value, self.b.value, self.t.value

    def rects(self, start: int, count: int) -> list[tuple[float, float, float, float]]:
        """PDFium's rectangles over a run of characters: it starts a new one at a wide gap or a font change."""
        rects = []
        for index in range(self.raw.FPDFText_CountRects(self.page, start, count)):
            self.raw.FPDFText_GetRect(self.page, index, self.l, self.t, self.r, self.b)
            rects.append((self.l.value, self.r.value, self.b.value, self.t.value))
        return rects

    def first_right_of(self, x: float, low: int, high: int) -> int:
        """The first character in [low, high) whose box starts at or right of ``x``, by bisection (a line's
        characters run left to right). PDFium's own lookup by position misses characters inside their boxes."""
        while low < high:
            middle = (low + high) // 2
            if self.box(middle)[0] >= x:
                high = middle
            else:
                low = middle + 1
        return low

    def font(self, index: int) -> tuple[str, int]:
        size = self.raw.FPDFText_GetFontInfo(self.page, index, None, 0, ctypes.byref(self.flags))
        buffer = ctypes.create_string_buffer(max(size, 1))
        self.raw.FPDFText_GetFontInfo(self.page, index, buffer, size, ctypes.byref(self.flags))
        return buffer.value.decode("utf-8", "replace"), self.flags.value

    def size(self, index: int) -> float:
        return round(self.raw.FPDFText_GetFontSize(self.page, index), 1)


def page_lines(textpage, rule_xs: Sequence[float] = ()) -> list[Line]:
    """The page's lines, each with the gaps that may part two cells: wider than a word gap (CELL_GAP_EM), or
    crossed by a vertical rule at one of ``rule_xs``, with the character each starts at (a bisection of the
    line); and narrower ones down to NARROW_GAP_EM, whose character ``locate_gaps`` finds while the text page
    is open, for the lines of a table whose columns are known."""
    count = textpage.count_chars()
    text = textpage.get_text_range(0, count)
    boxes = _Boxes(textpage)
    lines, start = [], 0
    for piece in text.split("\r\n"):
        content = piece.replace("\x02", "-").replace("\ufffe", "-").rstrip()
        if content.strip():
            first = start + len(content) - len(content.lstrip())
            _left, _right, bottom, top = boxes.box(first)
            rects = boxes.rects(first, start + len(content) - first)
            size = boxes.size(first)
            em = size if not rects or size >= 0.5 * (rects[0][3] - rects[0][2]) else 0.8 * (rects[0][3] - rects[0][2])
            gaps = []
            for (_l, gap_left, _b, _t), (gap_right, _r, low, high) in zip(rects, rects[1:]):
                width = gap_right - gap_left
                if width > CELL_GAP_EM * em or width > 0 and any(gap_left <= x <= gap_right for x in rule_xs):
                    index = boxes.first_right_of(gap_right - 0.5, first, start + len(content))
                    if first < index < start + len(content):
                        gaps.append((index - start, gap_left, gap_right))
                elif width >= NARROW_GAP_EM * em:
                    gaps.append((UNLOCATED, gap_left, gap_right))
            located = [gap for gap in gaps if gap[0] != UNLOCATED]
            name, flags = boxes.font(first) if located or NUMBERED_RE.match(content, first - start) else ("", 0)
            ends = [offset for gap in located for offset in (len(content[:gap[0]].rstrip()) - 1, gap[0])]
            mono = bool(flags & FIXED_PITCH) and all(boxes.font(start + offset)[1] & FIXED_PITCH
                                                     for offset in ends + [len(content) - 1])
            left, right = (rects[0][0], rects[-1][1]) if rects else (_left, _right)
            lines.append(Line(content, bottom, top, size, left, right, gaps, mono, bool(BOLD_NAME_RE.search(name)),
                              em=em, start=start, first=first - start))
        start += len(piece) + 2
    return lines


def locate_gaps(textpage, lines: list[Line]) -> None:
    """Finds the character each narrow gap of ``lines`` starts at (the text page they came from still open)."""
    boxes = _Boxes(textpage)
    for line in lines:
        if any(gap[0] == UNLOCATED for gap in line.gaps):
            end = line.start + len(line.text)
            line.gaps = [gap if gap[0] != UNLOCATED else
                         (boxes.first_right_of(gap[2] - 0.5, line.start + line.first, end) - line.start, gap[1], gap[2])
                         for gap in line.gaps]
            line.gaps = [gap for gap in line.gaps if line.first < gap[0] < len(line.text)]


def _link_target(raw, document, link) -> tuple[int, float] | None:
    """(page index, top) of an internal link's destination, or None."""
    destination = raw.FPDFLink_GetDest(document, link)
    if not destination:
        action = raw.FPDFLink_GetAction(link)
        if not action or raw.FPDFAction_GetType(action) != raw.PDFACTION_GOTO:
            return None
        destination = raw.FPDFAction_GetDest(document, action)
        if not destination:
            return None
    has_x, has_y, has_zoom = raw.FPDF_BOOL(), raw.FPDF_BOOL(), raw.FPDF_BOOL()
    x, y, zoom = raw.FS_FLOAT(), raw.FS_FLOAT(), raw.FS_FLOAT()
    raw.FPDFDest_GetLocationInPage(destination, has_x, has_y, has_zoom, x, y, zoom)
    return raw.FPDFDest_GetDestPageIndex(document, destination), (y.value if has_y.value else float("inf"))


def mark_links(document, page, index: int, lines: list[Line]) -> None:
    """Marks the lines that menu links cover for LINK_COVER of their width or more: links to other documents
    (URI actions), and links back to an earlier place of this one (a sidebar's contents printed after the page).
    Links forward (a section's own list of its subsections) do not count."""
    import pypdfium2.raw as raw

    position, link, rect = ctypes.c_int(0), raw.FPDF_LINK(), raw.FS_RECTF()
    boxes = []
    while raw.FPDFLink_Enumerate(page.raw, ctypes.byref(position), ctypes.byref(link)):
        if not raw.FPDFLink_GetAnnotRect(link, rect):
            continue
        action = raw.FPDFLink_GetAction(link)
        external = bool(action) and raw.FPDFAction_GetType(action) == raw.PDFACTION_URI
        target = None if external else _link_target(raw, document.raw, link)
        if external or target is not None and (target[0] < index or target[0] == index and target[1] > rect.top):
            boxes.append((rect.left, rect.bottom, rect.right, rect.top))
    if not boxes:
        return
    for line in lines:
        middle = (line.bottom + line.top) / 2
        covered = sum(max(0.0, min(right, line.right) - max(left, line.left))
                      for left, bottom, right, top in boxes if bottom <= middle <= top)
        line.link = covered >= LINK_COVER * max(line.right - line.left, 1e-6)


@dataclass
class Rule:
    left: float
    bottom: float
    right: float
    top: float

    @property
    def horizontal(self) -> bool:
        return self.top - self.bottom <= RULE_THICKNESS


def _paths(raw, count, get, handle, depth: int = 2) -> list:
    """The path objects among ``count(handle)`` objects (a page's or a form's), and inside their form XObjects
    down to ``depth``, as raw handles."""
    paths = []
    path_type, form_type, get_type = raw.FPDF_PAGEOBJ_PATH, raw.FPDF_PAGEOBJ_FORM, raw.FPDFPageObj_GetType
    for index in range(count(handle)):
        obj = get(handle, index)
        kind = get_type(obj)
        if kind == path_type:
            paths.append(obj)
        elif kind == form_type and depth:
            paths += _paths(raw, raw.FPDFFormObj_CountObjects, raw.FPDFFormObj_GetObject, obj, depth - 1)
    return paths


def page_rules(page) -> list[Rule]:
    """The page's ruling lines: thin paths, and the four edges of each stroked, unfilled rectangle.

    Bounds of an object inside a form are in the form's space; forms that move their content are rare for tables."""
    import pypdfium2.raw as raw

    rules = []
    fill, stroke = ctypes.c_int(), ctypes.c_int()
    left_, bottom_, right_, top_ = (ctypes.c_float() for _ in range(4))
    for obj in _paths(raw, raw.FPDFPage_CountObjects, raw.FPDFPage_GetObject, page.raw):
        raw.FPDFPageObj_GetBounds(obj, left_, bottom_, right_, top_)
        left, bottom, right, top = left_.value, bottom_.value, right_.value, top_.value
        width, height = right - left, top - bottom
        if height <= RULE_THICKNESS and width >= RULE_MIN_LENGTH or width <= RULE_THICKNESS and height >= RULE_MIN_LENGTH:
            rules.append(Rule(left, bottom, right, top))
        elif width >= RULE_MIN_LENGTH and height >= RULE_MIN_LENGTH and raw.FPDFPath_CountSegments(obj) <= 5:
            raw.FPDFPath_GetDrawMode(obj, fill, stroke)
            if stroke.value and not fill.value:
                rules += [Rule(left, bottom, right, bottom), Rule(left, top, right, top),
                          Rule(left, bottom, left, top), Rule(right, bottom, right, top)]
    return rules
