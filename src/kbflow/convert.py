"""Convert source files to Markdown. A file that fails becomes a row with status 'failed', never an exception
that stops the batch."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import multiprocessing
import re
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pyarrow as pa

from kbflow.errors import ConversionError
from kbflow.scan import SourceFile, doc_id_for
from kbflow.schemas import DOCUMENTS

CONVERT_VERSION = "2"  # bump when this module's output changes for the same input
TEXT_SUFFIXES = {".md", ".markdown", ".txt", ".rst", ".text"}
HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
BINARY_SUFFIXES = {".pdf", ".docx", ".pptx", ".xlsx", ".xls", ".epub", ".zip", ".doc", ".ppt", ".msg"}
# page furniture that is not content: navigation bars, headers and footers, scripts (never run or fetched)
HTML_DROP_TAGS = ("script", "style", "noscript", "nav", "iframe", "object", "embed")
HTML_PAGE_FURNITURE = ("header", "footer")  # dropped at page level; inside an article they may hold its title
HTML_DROP_CLASSES = re.compile(r"\b(navheader|navfooter|navigation|docnav|breadcrumbs?|sidebar|skip-?link)\b", re.I)


def converter_fingerprint() -> str:
    """Name, version and options of the converter: part of every cache key, so an upgrade re-converts."""
    return f"markitdown@{version('markitdown')}+kbflow-convert-v{CONVERT_VERSION}"


@dataclass(frozen=True)
class Converted:
    markdown: str
    converter: str


def decode_text(data: bytes, source: str) -> tuple[str, str]:
    """Decode text bytes; stop at the first decoding that works and say which one it was."""
    if data.startswith(b"\xef\xbb\xbf"):
        return data[3:].decode("utf-8"), "utf-8-sig"
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes  # installed with markitdown

    best = from_bytes(data).best()
    if best is None:
        raise ConversionError(f"{source}: bytes are not text in any known encoding; remove the file or convert it to UTF-8")
    return str(best), best.encoding


_markitdown = None


def _get_markitdown():
    global _markitdown
    if _markitdown is None:
        from markitdown import MarkItDown

        _markitdown = MarkItDown(enable_plugins=False)
    return _markitdown


def _convert_html(data: bytes):
    """MarkItDown on the page's content only: navigation, headers, footers and scripts are removed first."""
    from bs4 import BeautifulSoup  # installed with markitdown
    from markitdown import StreamInfo

    soup = BeautifulSoup(data, "html.parser")
    for element in soup(HTML_DROP_TAGS):
        element.decompose()
    for element in soup(HTML_PAGE_FURNITURE):
        if element.find_parent(("article", "main", "section")) is None:
            element.decompose()
    for element in soup.find_all(class_=HTML_DROP_CLASSES):
        element.decompose()
    for element in soup.find_all(attrs={"role": "navigation"}):
        element.decompose()
    cleaned = io.BytesIO(str(soup).encode("utf-8"))
    return _get_markitdown().convert_stream(cleaned, stream_info=StreamInfo(extension=".html", charset="utf-8"))


def convert_file(path: str, source_path: str) -> Converted:
    """Markdown of one file. Raises ConversionError with the file name and what to do."""
    file = Path(path)
    fingerprint = converter_fingerprint()
    if file.suffix.lower() in TEXT_SUFFIXES:
        text, encoding = decode_text(file.read_bytes(), source_path)
        return Converted(text, f"{fingerprint}+text:{encoding}")
    try:
        if file.suffix.lower() in HTML_SUFFIXES:
            result = _convert_html(file.read_bytes())
        else:
            result = _get_markitdown().convert_local(str(file))
    except Exception as exc:  # markitdown raises many unrelated types; each becomes one clear failure row
        raise ConversionError(
            f"{source_path}: MarkItDown could not convert it ({type(exc).__name__}: {str(exc)[:300]}); "
            "check that the file opens in its own application, or exclude it with convert.exclude"
        ) from exc
    markdown = result.text_content or ""
    suffix = file.suffix.lower()
    if suffix in BINARY_SUFFIXES and markdown.strip() == file.read_bytes().decode("utf-8", "replace").strip():
        # MarkItDown fell back to reading the bytes as plain text: the file is not a valid document of its type
        raise ConversionError(
            f"{source_path}: not a valid {suffix[1:].upper()} file (its bytes are plain text); "
            "repair or re-export it, or exclude it with convert.exclude"
        )
    if not markdown.strip():
        raise ConversionError(
            f"{source_path}: conversion produced no text (an image-only or empty file?); "
            "exclude it with convert.exclude, or supply a text version"
        )
    return Converted(markdown, fingerprint)


def _row(source: SourceFile, markdown: str | None, converter: str, error: str | None) -> dict:
    return {
        "doc_id": source.doc_id, "source_path": source.source_path, "abs_path": source.abs_path,
        "source_sha256": source.source_sha256, "size": source.size, "mtime": source.mtime, "mime": source.mime,
        "converter": converter, "markdown": markdown,
        "status": "failed" if error else "ok", "error": error,
    }


def _convert_one(source: SourceFile, max_bytes: int) -> dict:
    try:
        if source.size > max_bytes:
            raise ConversionError(
                f"{source.source_path}: {source.size / 1e6:.1f} MB is over convert.max_file_mb "
                f"({max_bytes / 1e6:.1f} MB); raise the limit in config or exclude the file"
            )
        converted = convert_file(source.abs_path, source.source_path)
    except Exception as exc:  # every failure is recorded, the batch goes on
        return _row(source, None, converter_fingerprint(), f"{type(exc).__name__}: {exc}")
    return _row(source, converted.markdown, converted.converter, None)


def text_sources(texts: list[dict], namespace: str) -> list[SourceFile]:
    """Literal texts ({'doc_id', 'text'}) as sources: path 'text:<doc_id>', hash of the text's bytes."""
    sources = []
    for item in texts:
        body = item["text"].encode("utf-8")
        source_path = f"text:{item['doc_id']}"
        sources.append(SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path="",
                                  source_sha256=hashlib.sha256(body).hexdigest(), size=len(body),
                                  mtime=time.time(), mime="text/markdown"))
    return sources


def text_documents(sources: list[SourceFile], texts_by_path: dict[str, str]) -> pa.Table:
    """Documents rows for literal texts: the text is its own Markdown, nothing to convert."""
    rows = [_row(source, texts_by_path[source.source_path], converter_fingerprint(), None) for source in sources]
    return pa.Table.from_pylist(rows, schema=DOCUMENTS)


_pool: cf.ProcessPoolExecutor | None = None
_pool_workers = 0


def _get_pool(workers: int) -> cf.ProcessPoolExecutor:
    global _pool, _pool_workers
    if _pool is None or _pool_workers != workers:
        if _pool is not None:
            _pool.shutdown(cancel_futures=True)
        # spawn: the parent has torch and Prefect threads; forking those is unsafe
        _pool = cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        _pool_workers = workers
    return _pool


def convert_batch(sources: list[SourceFile], workers: int = 1, max_file_mb: float = 50.0, timeout_s: float = 120.0) -> pa.Table:
    """Documents table for ``sources``: one row each, failed ones with status 'failed' and the error."""
    max_bytes = int(max_file_mb * 1e6)
    if workers <= 1 or len(sources) <= 1:
        rows = [_convert_one(source, max_bytes) for source in sources]
    else:
        pool = _get_pool(workers)
        futures = [pool.submit(_convert_one, source, max_bytes) for source in sources]
        rows = []
        for source, future in zip(sources, futures):
            try:
                rows.append(future.result(timeout=timeout_s))
            except cf.TimeoutError:
                # the worker keeps running until the pool is recycled; the row says what happened
                message = (f"ConversionError: {source.source_path}: took over convert.timeout_s ({timeout_s:.0f} s); "
                           "raise the limit or exclude the file")
                rows.append(_row(source, None, converter_fingerprint(), message))
    return pa.Table.from_pylist(rows, schema=DOCUMENTS)

