"""Offline OCR, English and Simplified Chinese, with the PP-OCRv4 ONNX models packaged in rapidocr-onnxruntime.

rapidocr-onnxruntime 1.4.x loads its models from its own wheel and makes no network call (3.x downloads models at
run time: do not upgrade without checking). Lines come back in reading order: full-width lines top to bottom, and a
two-column band as its left column, then its right.
"""

from __future__ import annotations

import io

import numpy as np

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format, Markdown
from kbflow.convert.formats.text import escape_line
from kbflow.core.errors import ConversionError
from kbflow.core.extras import package_version, require

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".gif", ".webp"}
_engine = None


def ocr_fingerprint(max_side: int) -> str:
    return f"rapidocr-onnxruntime@{package_version('rapidocr-onnxruntime')}(PP-OCRv4 ch+en,side{max_side})"


def _get_engine():
    global _engine
    if _engine is None:
        _engine = require("rapidocr_onnxruntime", "OCR (images, PDF pages without text)").RapidOCR()
    return _engine


def image_array(data: bytes, source: str) -> np.ndarray:
    """BGR pixels of an image file (any PIL mode: palette and 1-bit images are converted first)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise ConversionError(f"{source}: not a readable image ({exc}); re-export it as PNG or JPEG") from exc
    return np.ascontiguousarray(np.asarray(rgb)[:, :, ::-1])


def ocr_lines(pixels: np.ndarray, max_side: int) -> list[tuple[list[list[float]], str, float]]:
    """(box, text, score) per recognised line, in reading order."""
    engine = _get_engine()
    engine.max_side_len = max_side
    result, _elapsed = engine(pixels)
    return reading_order(result or [], pixels.shape[1])


def ocr_text(pixels: np.ndarray, max_side: int) -> str:
    """Recognised text: lines joined by newlines, a blank line where the vertical gap says a paragraph ends."""
    lines = ocr_lines(pixels, max_side)
    if not lines:
        return ""
    heights = sorted(_bottom(box) - _top(box) for box, _, _ in lines)
    line_height = heights[len(heights) // 2]
    out, previous = [], None
    for box, text, _score in lines:
        if previous is not None and (_top(box) - _bottom(previous) > 0.9 * line_height or _top(box) < _top(previous)):
            out.append("")
        out.append(escape_line(text))
        previous = box
    return "\n".join(out).strip() + "\n"


def _top(box) -> float:
    return min(point[1] for point in box)


def _bottom(box) -> float:
    return max(point[1] for point in box)


def _left(box) -> float:
    return min(point[0] for point in box)


def _right(box) -> float:
    return max(point[0] for point in box)


def reading_order(result: list, page_width: int) -> list:
    """Full-width lines top to bottom; a run of lines that fall wholly in the left or right half of the page is a
    two-column band, read left column first."""
    items = sorted(result, key=lambda item: (_top(item[0]), _left(item[0])))
    middle = page_width / 2
    ordered: list = []
    band: list = []

    def flush():
        left = [item for item in band if _right(item[0]) <= middle]
        right = [item for item in band if _right(item[0]) > middle]
        ordered.extend(left + right)
        band.clear()

    for item in items:
        box = item[0]
        in_one_half = _right(box) <= middle * 1.02 or _left(box) >= middle * 0.98
        if in_one_half:
            band.append(item)
        else:
            flush()
            ordered.append(item)
    flush()
    return [(box, text, score) for box, text, score in ordered]


def _convert(data: bytes, name: str, source: str, options: ConvertConfig) -> Markdown:
    if not options.ocr:
        raise ConversionError(f"{source}: images need OCR, which is off; set convert.ocr: true or exclude images")
    return Markdown(ocr_text(image_array(data, source), options.ocr_max_side), "image-ocr")


FORMATS = [Format("image", frozenset(IMAGE_SUFFIXES), _convert, lambda options: ocr_fingerprint(options.ocr_max_side))]
