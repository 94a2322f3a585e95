"""Office documents and e-books through MarkItDown: DOCX, PPTX, XLSX, XLS and EPUB, and PDF when
``convert.pdf_engine`` is ``markitdown``. A file whose bytes are not its format's container is refused before
MarkItDown reads it (it would read them as plain text)."""

from __future__ import annotations

import io
from pathlib import PurePosixPath

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format, Markdown
from kbflow.core.errors import ConversionError
from kbflow.core.extras import package_version

ZIP_MAGIC = b"PK\x03\x04"
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
# Office/e-book formats MarkItDown converts, with the container their bytes must be
MARKITDOWN_FORMATS = {".docx": ZIP_MAGIC, ".pptx": ZIP_MAGIC, ".xlsx": ZIP_MAGIC, ".epub": ZIP_MAGIC, ".xls": OLE_MAGIC}

_markitdown = None


def _get_markitdown():
    global _markitdown
    if _markitdown is None:
        from markitdown import MarkItDown

        _markitdown = MarkItDown(enable_plugins=False)
    return _markitdown


def markitdown_convert(data: bytes, suffix: str, source: str) -> str:
    from markitdown import StreamInfo

    fmt = suffix[1:].upper()
    magic = MARKITDOWN_FORMATS.get(suffix)
    if magic is not None and not data.startswith(magic):
        hint = " (it is an OLE container: password-protected?)" if data.startswith(OLE_MAGIC) else ""
        raise ConversionError(f"{source}: not a valid {fmt} file{hint}; the bytes are not a {fmt} container. "
                              "Repair or re-export it, or exclude it with convert.exclude")
    try:
        result = _get_markitdown().convert_stream(io.BytesIO(data), stream_info=StreamInfo(extension=suffix))
    except Exception as exc:  # markitdown raises many unrelated types; each becomes one clear failure row
        raise ConversionError(
            f"{source}: corrupt or truncated {fmt} file, MarkItDown could not read it ({type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}); check that it opens in its own application, re-export it, or exclude it with "
            "convert.exclude"
        ) from exc
    markdown = result.text_content or ""
    if magic is not None and markdown.strip() == data.decode("utf-8", "replace").strip():
        raise ConversionError(f"{source}: not a valid {fmt} file (MarkItDown read its bytes as plain text); "
                              "repair or re-export it, or exclude it with convert.exclude")
    return markdown


def _convert(data: bytes, name: str, source: str, options: ConvertConfig) -> Markdown:
    suffix = PurePosixPath(name).suffix.lower()  # the registry chose this format by it
    return Markdown(markitdown_convert(data, suffix, source), f"markitdown{suffix}")


def _fingerprint(options: ConvertConfig) -> str:
    return f"markitdown@{package_version('markitdown')}"


FORMATS = [
    Format("office", frozenset(MARKITDOWN_FORMATS), _convert, _fingerprint),
    Format("pdf-markitdown", frozenset({".pdf"}), _convert, _fingerprint,
           applies=lambda options: options.pdf_engine != "pdfium"),
]
