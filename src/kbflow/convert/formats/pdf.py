"""PDF through PDFium (pypdfium2, Apache-2.0/BSD): the text layer page by page, OCR for pages without one.

Structure comes from the page geometry: a line in a font larger than the body text is a heading (its level by
size rank), a vertical gap or a font change ends a paragraph. Document furniture is dropped first
(``kbflow.convert.furniture``): running headers and footers, page numbers, dot-leader tables of contents,
back-of-book indexes.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass

from kbflow.convert.formats.text import escape_line
from kbflow.convert.furniture import drop_furniture
from kbflow.errors import ConversionError

PDF_VERSION = "2"  # 2: tables of contents, back-of-book indexes and bare page numbers dropped (part of the
# converter fingerprint: a bump re-converts every PDF)
FPDF_ERR_PASSWORD = 4
MIN_TEXT_CHARS = 8  # a page with fewer visible characters than this has no text layer worth the name


@dataclass
class Line:
    text: str
    bottom: float
    top: float
    size: float


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


def page_lines(textpage) -> list[Line]:
    import pypdfium2.raw as raw

    count = textpage.count_chars()
    text = textpage.get_text_range(0, count)
    lines, start = [], 0
    for piece in text.split("\r\n"):
        if piece.strip():
            _left, bottom, _right, top = textpage.get_charbox(start)
            size = round(raw.FPDFText_GetFontSize(textpage.raw, start), 1)
            lines.append(Line(piece.replace("\x02", "-").replace("\ufffe", "-").rstrip(), bottom, top, size))
        start += len(piece) + 2
    return lines


def lines_to_markdown(pages: list[list[Line]]) -> list[str]:
    """Markdown per page: headings by font size, paragraphs by vertical gaps."""
    sizes: Counter[float] = Counter()
    for lines in pages:
        for line in lines:
            sizes[line.size] += len(line.text)
    body = sizes.most_common(1)[0][0] if sizes else 0.0
    heading_sizes = sorted({s for s in sizes if s > body * 1.15}, reverse=True)[:6]
    level = {size: i + 1 for i, size in enumerate(heading_sizes)}
    out = []
    for lines in pages:
        steps = sorted(a.bottom - b.bottom for a, b in zip(lines, lines[1:]) if 0 < a.bottom - b.bottom < 3 * body)
        step = steps[len(steps) // 2] if steps else body * 1.2
        parts: list[str] = []
        previous = None
        for line in lines:
            heading = line.size in level and len(line.text) <= 150
            new_block = previous is None or heading or previous.size != line.size or \
                (previous.bottom - line.bottom) > 1.5 * step or previous.bottom < line.bottom
            if heading:
                if previous is not None and parts and parts[-1].startswith("#") and previous.size == line.size:
                    parts[-1] += " " + line.text.strip()  # a heading wrapped over two lines
                else:
                    parts += ["", "#" * level[line.size] + " " + line.text.strip(), ""]
            elif new_block:
                parts += ["", escape_line(line.text)]
            else:
                parts.append(escape_line(line.text))
            previous = line
        out.append(re.sub(r"\n{3,}", "\n\n", "\n".join(parts)).strip())
    return out


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
    ocr_pages = 0
    try:
        for index in range(len(document)):
            page = document[index]
            textpage = page.get_textpage()
            lines = page_lines(textpage)
            textpage.close()
            if sum(len(line.text.strip()) for line in lines) >= MIN_TEXT_CHARS or not ocr or not _has_image(page):
                pages.append(lines)  # a text page, or a blank one: nothing to OCR
            else:
                from kbflow.convert.formats.ocr import ocr_text

                pages.append(ocr_text(render_page(page, ocr_dpi), ocr_max_side))
                ocr_pages += 1
            page.close()
    finally:
        document.close()
    text_pages = drop_furniture([p for p in pages if isinstance(p, list)])
    rendered = iter(lines_to_markdown(text_pages))
    parts = [next(rendered) if isinstance(page, list) else page.strip() for page in pages]
    markdown = re.sub(r"\n{3,}", "\n\n", "\n\n".join(part for part in parts if part)) + "\n"
    return markdown, {"pages": len(pages), "ocr_pages": ocr_pages}
