"""PDF through PDFium (pypdfium2, Apache-2.0/BSD): the text layer page by page, OCR for pages without one.

Structure comes from the page geometry (``pdf_layout``): tables, ruled or unruled, become Markdown tables
(``pdf_tables``), one across page breaks, a caption below moved above; headings come from the document outline
(bookmarks) where the PDF has one, unless the lines under one are a menu's links. Otherwise a numbered line in
bold or a larger font that stands on its own is a heading (``3.1.2 Hydro network``, its level by the depth of
its number), and so is a line in a font larger than the body's (its level by size rank) — with numbered
headings in the document, only in a font larger than theirs (a title). A vertical gap or a font change ends a
paragraph. Document furniture is dropped first
(``kbflow.convert.furniture``): running headers and footers, page numbers, dot-leader tables of contents,
back-of-book indexes.
"""

from __future__ import annotations

import os
import re
from collections import Counter

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format, Markdown
from kbflow.convert.formats.ocr import ocr_fingerprint, ocr_text
from kbflow.convert.formats.pdf_layout import NUMBERED_RE, Line, locate_gaps, mark_links, page_lines, page_rules
from kbflow.convert.formats.pdf_tables import Table, page_tables, table_markdown
from kbflow.convert.formats.text import escape_line
from kbflow.convert.furniture import drop_furniture
from kbflow.core.errors import ConversionError
from kbflow.core.extras import package_version

__all__ = ["Line", "convert_pdf", "lines_to_markdown", "open_pdf", "render_page"]

PDF_VERSION = "3"  # 2: tables of contents, back-of-book indexes and bare page numbers dropped; 3: tables as
# Markdown tables, headings from the outline and from section numbers (part of the converter fingerprint: a bump
# re-converts every PDF)
FPDF_ERR_PASSWORD = 4
MIN_TEXT_CHARS = 8  # a page with fewer visible characters than this has no text layer worth the name
NUMBERED_MAX_CHARS = 90
CAPTION_RE = re.compile(r"(?:Table|Tab\.|表)\s*[0-9A-Z]")  # a table's caption, as the chunker knows one
NUMBERED_MIN = 3  # numbered headings in a document for numbering to decide its headings
MENU_LINES, MENU_SHARE = 8, 0.6  # a heading over lines of which this share (of the next MENU_LINES) are links
OUTLINE_KEY_RE = re.compile(r"\W+")
OUTLINE_MATCH = 0.75  # a line this alike a bookmark's title (difflib ratio of letters and digits) is its heading
OUTLINE_REACH = 48.0  # points between a bookmark's destination and the line it names, when not the same text


def open_pdf(data: bytes, source: str, passwords_env: str):
    """The PDFium document, trying the passwords from ``passwords_env`` on an encrypted file."""
    import pypdfium2 as pdfium

    if b"%PDF-" not in data[:1024]:
        raise ConversionError(f"{source}: not a valid PDF file (no %PDF header); repair or re-export it, or exclude "
                              "it with convert.exclude")
    passwords = [None] + [p for p in os.environ.get(passwords_env, "").splitlines() if p]
    for password in passwords:
        try:
            return pdfium.PdfDocument(data, password=password)
        except pdfium.PdfiumError as exc:
            if getattr(exc, "err_code", None) == FPDF_ERR_PASSWORD:
                continue
            raise ConversionError(
                f"{source}: not a valid PDF file ({exc}); repair or re-export it, or exclude it with convert.exclude"
            ) from exc
    tried = len(passwords) - 1
    raise ConversionError(
        f"encrypted PDF: {source} needs a password ({tried} tried); put it in the environment variable "
        f"{passwords_env} (named by config `convert.pdf_passwords_env`, one password per line) or remove the file"
    )


def _key(text: str) -> str:
    return OUTLINE_KEY_RE.sub("", text).lower()


def outline_headings(document) -> dict[int, list[tuple[str, int, float]]]:
    """The document outline by page: (title, heading level, top of the destination) for each bookmark."""
    by_page: dict[int, list[tuple[str, int, float]]] = {}
    for bookmark in document.get_toc(max_depth=6):
        destination = bookmark.get_dest()
        title = " ".join((bookmark.get_title() or "").split())
        if destination is None or not _key(title):
            continue
        _mode, view = destination.get_view()
        top = view[1] if len(view) > 1 and view[1] else float("inf")
        by_page.setdefault(destination.get_index(), []).append((title, bookmark.level + 1, top))
    return by_page


def mark_outline(lines: list[Line], bookmarks: list[tuple[str, int, float]]) -> None:
    """Marks the line (or the run of up to three lines, a wrapped title) that each bookmark names: the same
    letters and digits, or else the closest text (at least OUTLINE_MATCH alike: a text layer that lost a glyph
    or two) within OUTLINE_REACH points of the bookmark's top. The heading takes the bookmark's title."""
    from difflib import SequenceMatcher

    keys = [_key(line.text) for line in lines] if bookmarks else []
    for title, level, top in bookmarks:
        wanted, best = _key(title), None
        for i in range(len(lines)):
            if lines[i].heading:
                continue
            near = top == float("inf") or abs(lines[i].top - top) <= OUTLINE_REACH
            joined = ""
            for j in range(i, min(i + 3, len(lines))):
                joined += keys[j]
                alike = 1.0 if joined == wanted else (
                    SequenceMatcher(None, joined, wanted).ratio() if near and abs(len(joined) - len(wanted)) <= 4 else 0)
                distance = abs(lines[i].top - top) if top != float("inf") else i
                if alike >= OUTLINE_MATCH and (best is None or (alike, -distance) > (best[0], -best[1])):
                    best = (alike, distance, i, j)
                if len(joined) >= len(wanted) + 4:
                    break
        if best is not None:
            lines[best[2]].heading, lines[best[2]].heading_text = level, title
            for k in range(best[2] + 1, best[3] + 1):
                lines[k].heading = -1  # the rest of a wrapped title


def _menu_follows(lines: list[Line], index: int) -> bool:
    """Whether the lines under a heading are mostly links (a site's menu printed with the page: "Next topic",
    "Navigation"): the heading is then the menu's label, not a section's, and stays text."""
    following = []
    for line in lines[index + 1:index + 1 + MENU_LINES]:
        if line.heading:
            break
        following.append(line.link)
    return bool(following) and sum(following) >= MENU_SHARE * len(following)


def _numbered_level(line: Line, body: float) -> int:
    """The depth of a section number (``3.1.2 Hydro network``: 3) on a short line in bold or a larger font."""
    match = NUMBERED_RE.match(line.text.strip())
    if not (match and (line.bold or line.size > body * 1.05) and len(line.text) <= NUMBERED_MAX_CHARS
            and not line.text.rstrip().endswith((".", ",", ";", ":")) and any(c.isalpha() for c in line.text)):
        return 0
    return min(match.group(1).count(".") + 1, 6)


def lines_to_markdown(pages: list[list[Line]], tables: list[list[Table]] | None = None,
                      outlined: bool = False) -> list[str]:
    """Markdown per page: tables, headings (outline marks, or by size and numbering), paragraphs by vertical gaps."""
    sizes: Counter[float] = Counter()
    for lines in pages:
        for line in lines:
            sizes[line.size] += len(line.text)
    body = sizes.most_common(1)[0][0] if sizes else 0.0
    numbered = [line.size for lines in pages for line in lines if _numbered_level(line, body)]
    # with numbered sections, a size is a heading's only above every numbered heading's (a title), so that a
    # title page's lines in a font a little larger than the body stay text
    floor = max(numbered) if len(numbered) >= NUMBERED_MIN else body * 1.15
    heading_sizes = sorted({s for s in sizes if s > floor}, reverse=True)[:6]
    level = {size: i + 1 for i, size in enumerate(heading_sizes)}
    out = []
    for number, lines in enumerate(pages):
        found = tables[number] if tables is not None else page_tables(lines, [])
        at = {id(line): index for index, line in enumerate(lines)}
        page: dict[int, Table] = {}
        for table in found:  # the table's lines where they are now, furniture dropped
            table.lines = {at[id(line)] for line in table.members if id(line) in at}
            if table.lines:
                page[min(table.lines)] = table
        in_table = set().union(*(t.lines for t in page.values())) if page else set()
        captions = {first: _caption_below(lines, t, in_table, page) for first, t in page.items()}
        moved = {index for index in captions.values() if index is not None}
        steps = sorted(a.bottom - b.bottom for a, b in zip(lines, lines[1:]) if 0 < a.bottom - b.bottom < 3 * body)
        step = steps[len(steps) // 2] if steps else body * 1.2
        parts: list[str] = []
        previous = None
        for index, line in enumerate(lines):
            if index in page:
                caption = captions[index]
                parts += (["", escape_line(lines[caption].text.strip())] if caption is not None else []) + \
                    ["", table_markdown(page[index].rows), ""]
                previous = None
                continue
            if index in in_table or index in moved:
                continue
            new_block = previous is None or previous.size != line.size or \
                (previous.bottom - line.bottom) > 1.5 * step or previous.bottom < line.bottom
            if outlined:
                if line.heading < 0:
                    continue
                heading = line.heading if not _menu_follows(lines, index) else 0
            else:
                heading = (_numbered_level(line, body) if new_block else 0) or \
                    (level.get(line.size, 0) if len(line.text) <= 150 else 0)
            if heading:
                if not outlined and previous is not None and parts and parts[-1].startswith("#") \
                        and previous.heading == heading \
                        and previous.size == line.size:
                    parts[-1] += " " + line.text.strip()  # a heading wrapped over two lines
                else:
                    parts += ["", "#" * heading + " " + (line.heading_text or line.text.strip()), ""]
                line.heading = heading
            elif new_block:
                parts += ["", escape_line(line.text)]
            else:
                parts.append(escape_line(line.text))
            previous = line
        out.append(re.sub(r"\n{3,}", "\n\n", "\n".join(parts)).strip())
    return join_split_tables(out)


def _caption_below(lines: list[Line], table: Table, in_table: set[int], tables: dict[int, Table]) -> int | None:
    """The line right below a table when it is the table's caption ("Table 1.1: ...", as LaTeX and DocBook place
    it): it moves above the table, where a caption belongs for whoever reads on. Not when a caption stands
    above the table already, nor when another table follows the line (then it is that table's caption), nor at
    a page's edges (the part of a table that a page break cut off, or a caption of the next page's table)."""
    above, below = min(table.lines) - 1, max(table.lines) + 1
    if above < 0 or below >= len(lines) - 1 or below + 1 in tables:
        return None  # a table's part at the top of a page, or a caption at the foot of one: whose is unclear
    if above not in in_table and CAPTION_RE.match(lines[above].text.strip()):
        return None
    if below < len(lines) and below not in in_table and CAPTION_RE.match(lines[below].text.strip()) \
            and len(lines[below].text) <= 200:
        return below
    return None


def _table_at(text: str, end: bool) -> list[str]:
    """The Markdown table lines a page's text ends (or starts) with."""
    lines = text.split("\n")
    picked = []
    for line in (reversed(lines) if end else lines):
        if not (line.startswith("| ") and line.endswith(" |")):
            break
        picked.append(line)
    return list(reversed(picked)) if end else picked


def join_split_tables(pages: list[str]) -> list[str]:
    """A table that runs over page breaks is one table: each later page's part loses its repeated header row
    and joins the part before it (a page that held nothing but a table's middle is left empty)."""
    pages = list(pages)
    last: int | None = None  # the latest page with text left
    for i, page in enumerate(pages):
        head = _table_at(page, False)
        tail: list[str] = _table_at(pages[last], True) if last is not None else []
        if last is not None and len(tail) >= 2 and len(head) >= 2 and tail[0].count(" | ") == head[0].count(" | "):
            body = head[2:] if head[0] == tail[0] else [head[0]] + head[2:]
            pages[last] = pages[last] + ("\n" + "\n".join(body) if body else "")
            pages[i] = page[len("\n".join(head)):].lstrip("\n")
        if pages[i].strip():
            last = i
    return pages


def _has_image(page) -> bool:
    import pypdfium2.raw as raw

    return next(iter(page.get_objects(filter=[raw.FPDF_PAGEOBJ_IMAGE], max_depth=2)), None) is not None


def render_page(page, dpi: int):
    """BGR pixels of a page, for OCR."""
    import numpy as np

    image = page.render(scale=dpi / 72).to_pil().convert("RGB")
    return np.ascontiguousarray(np.asarray(image)[:, :, ::-1])


def convert_pdf(data: bytes, source: str, passwords_env: str, ocr: bool, ocr_dpi: int, ocr_max_side: int) -> tuple[str, dict]:
    """(markdown, stats) of a PDF. Pages without a text layer are OCR'd when ``ocr`` is on."""
    document = open_pdf(data, source, passwords_env)
    pages: list[list[Line] | str] = []
    tables: dict[int, list[Table]] = {}
    ocr_pages = 0
    try:
        outline = outline_headings(document)
        for index in range(len(document)):
            page = document[index]
            textpage = page.get_textpage()
            found = page_rules(page)
            lines = page_lines(textpage, [(r.left + r.right) / 2 for r in found if not r.horizontal])
            if sum(len(line.text.strip()) for line in lines) >= MIN_TEXT_CHARS or not ocr or not _has_image(page):
                mark_outline(lines, outline.get(index, []))
                tables[id(lines)] = page_tables(lines, found, lambda some: locate_gaps(textpage, some))
                if any(line.heading > 0 for line in lines):  # a menu matters only under a heading
                    mark_links(document, page, index, lines)
                pages.append(lines)  # a text page, or a blank one: nothing to OCR
            else:
                pages.append(ocr_text(render_page(page, ocr_dpi), ocr_max_side))
                ocr_pages += 1
            textpage.close()
            page.close()
    finally:
        document.close()
    text_pages = [p for p in pages if isinstance(p, list)]
    tables_in_order = [tables[id(p)] for p in text_pages]
    kept = drop_furniture(text_pages)
    outlined = any(line.heading for lines in kept for line in lines)
    rendered = iter(lines_to_markdown(kept, tables_in_order, outlined))
    parts = [next(rendered) if isinstance(page, list) else page.strip() for page in pages]
    markdown = re.sub(r"\n{3,}", "\n\n", "\n\n".join(part for part in parts if part)) + "\n"
    return markdown, {"pages": len(pages), "ocr_pages": ocr_pages}


def _convert(data: bytes, name: str, source: str, options: ConvertConfig) -> Markdown:
    markdown, stats = convert_pdf(data, source, options.pdf_passwords_env, options.ocr, options.ocr_pdf_dpi,
                                  options.ocr_max_side)
    if not markdown.strip() and not options.ocr:
        raise ConversionError(f"{source}: the PDF has no text layer and OCR is off; set convert.ocr: true")
    return Markdown(markdown, "pdf-pdfium" + ("+ocr" if stats["ocr_pages"] else ""))


def _fingerprint(options: ConvertConfig) -> str:
    return (f"pdf-v{PDF_VERSION}+pypdfium2@{package_version('pypdfium2')}+ocr={options.ocr}/{options.ocr_pdf_dpi}dpi+"
            f"{ocr_fingerprint(options.ocr_max_side)}")


FORMATS = [Format("pdf", frozenset({".pdf"}), _convert, _fingerprint, content_types={"application/pdf": ".pdf"},
                  applies=lambda options: options.pdf_engine == "pdfium")]
