"""Convert source files to Markdown. A file that fails becomes a row with status 'failed', never an exception
that stops the batch.

Each format is one module of ``kbflow.convert.formats`` (or a plugin's) that declares what it takes and how it
converts; the formats registry picks one per file name. ZIP members are documents of their own (``archive``).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow as pa

from kbflow.runtime import cores
from kbflow.convert.archive import ZIP_SUFFIXES, ArchiveLimits, open_archive, read_member
from kbflow.convert.objects import read_bytes
from kbflow.config import ConvertConfig
from kbflow.core.extras import package_version
from kbflow.core.errors import ConversionError
from kbflow.convert.formats.audio import audio_fingerprint
from kbflow.convert.formats.html import HTML_VERSION
from kbflow.convert.formats.ocr import ocr_fingerprint
from kbflow.convert.formats.pdf import PDF_VERSION
from kbflow.convert.formats.registry import format_for, plugin_fingerprint
from kbflow.convert.formats.text import decode_text
from kbflow.convert.scan import SourceFile
from kbflow.convert.secrets import SecretFound, check_secrets, scan_text
from kbflow.core.schemas import DOCUMENTS

__all__ = ["Converted", "convert_file", "convert_bytes", "convert_batch", "converter_fingerprint", "decode_text",
           "text_documents"]

CONVERT_VERSION = "3"  # bump when this module's output changes for the same input


def converter_fingerprint(options: ConvertConfig | None = None) -> str:
    """Name, version and options of every converter: every stored document records it, so an upgrade or an option
    change re-plans the stored documents (what each format's own ``fingerprint`` did not change comes from the
    conversion cache). The built-in formats' part is spelled as it always was, since every stored document
    records it; a plugin format adds its name and fingerprint."""
    options = options or ConvertConfig()
    output_options = (f"pdf={options.pdf_engine},ocr={options.ocr}/{options.ocr_pdf_dpi}dpi,"
                      f"line<={options.max_line_chars},html=v{HTML_VERSION},pdf=v{PDF_VERSION},"
                      f"depth<={options.html_max_depth}")
    return (f"kbflow-convert-v{CONVERT_VERSION}+markitdown@{package_version('markitdown')}"
            f"+pypdfium2@{package_version('pypdfium2')}"
            f"+{ocr_fingerprint(options.ocr_max_side)}+{audio_fingerprint(options)}"
            f"+[{output_options}]{plugin_fingerprint(options)}")


def format_fingerprint(options: ConvertConfig, name: str) -> str:
    """The part of the fingerprint that one file's output depends on (its format's): the per-document cache key,
    so switching the speech backend re-converts audio, not PDFs."""
    return f"kbflow-convert-v{CONVERT_VERSION}+{format_for(name, options).fingerprint(options)}"


@dataclass(frozen=True)
class Converted:
    markdown: str
    converter: str  # the fingerprint and the path taken, e.g. '...:pdf-pdfium'
    encoding: str | None = None  # the text encoding, for text formats
    source_sha256: str | None = None  # of the bytes actually converted (a file may change after the scan)


def without_nul(markdown: str) -> str:
    """``markdown`` without NUL characters (U+0000). No format uses them as text (a browser drops them from a
    page; most come from UTF-16 read as 8-bit text, one after every letter), and the e5 tokenizer reads a text
    only up to its first one, so a chunk holding one would be embedded up to it and counted as that short."""
    return markdown.replace("\x00", "")


def convert_bytes(data: bytes, name: str, source: str, options: ConvertConfig | None = None) -> Converted:
    """Markdown of one file's bytes; ``name`` (its file name) selects the format. Raises ConversionError."""
    options = options or ConvertConfig()
    fingerprint = converter_fingerprint(options)
    suffix = PurePosixPath(name).suffix.lower()
    if not data:
        raise ConversionError(f"{source}: empty file (0 bytes); remove it or exclude it with convert.exclude")
    if suffix in ZIP_SUFFIXES:
        raise ConversionError(f"{source}: a ZIP archive inside an archive is not opened; unpack the outer archive "
                              "and ingest the folder")
    markdown, path, encoding = format_for(name, options).convert(data, name, source, options)
    markdown = without_nul(markdown)
    if not markdown.strip():
        raise ConversionError(f"{source}: conversion produced no text (blank page, silent audio, or an image without "
                              "legible text?); supply a text version or exclude it with convert.exclude")
    return Converted(markdown, f"{fingerprint}:{path}", encoding)


def convert_file(path: str, source_path: str, options: ConvertConfig | None = None,
                 member: str | None = None) -> Converted:
    """Markdown of one file (or of one ZIP member, read in memory), with the sha256 of the bytes it was made from.
    Raises ConversionError with the file name and what to do."""
    options = options or ConvertConfig()
    limits = ArchiveLimits(int(options.zip_max_total_mb * 1e6), options.zip_max_members)
    if member is not None:
        archive, members = open_archive(path, source_path, limits)
        with archive:
            info = next((m for m in members if m.filename == member), None)
            if info is None:
                raise ConversionError(f"{source_path}: the archive no longer holds this member; run again")
            data = read_member(archive, info, source_path)
        return _converted_from(data, member, source_path, options)
    if Path(path).suffix.lower() in ZIP_SUFFIXES:
        archive, _members = open_archive(path, source_path, limits)  # raises the reason the scan refused it
        archive.close()
        raise ConversionError(f"{source_path}: a ZIP archive is ingested member by member; scan it again")
    try:
        data = read_bytes(path)  # a local file or an object (kbflow.convert.objects)
    except OSError as exc:
        raise ConversionError(f"{source_path}: cannot be read ({exc.strerror or exc}); fix its permissions or "
                              "exclude it with convert.exclude") from None
    return _converted_from(data, Path(path).name, source_path, options)


def _converted_from(data: bytes, name: str, source_path: str, options: ConvertConfig) -> Converted:
    converted = convert_bytes(data, name, source_path, options)
    return Converted(converted.markdown, converted.converter, converted.encoding, hashlib.sha256(data).hexdigest())


def _row(source: SourceFile, converted: Converted | None, converter: str, error: str | None) -> dict:
    return {
        "doc_id": source.doc_id, "source_path": source.source_path, "abs_path": source.abs_path,
        # the hash of what was converted, which the manifest then records: a file edited between scan and convert
        # is seen as changed by the next run instead of keeping the edited text under the old hash
        "source_sha256": (converted.source_sha256 if converted and converted.source_sha256 else source.source_sha256),
        "size": source.size, "mtime": source.mtime, "mime": source.mime,
        "converter": converted.converter if converted else converter,
        "markdown": converted.markdown if converted else None,
        "status": "failed" if error else "ok", "error": error,
        "encoding": converted.encoding if converted else None,
    }


def _convert_one(source: SourceFile, options: ConvertConfig) -> dict:
    try:
        if source.unreadable:
            raise ConversionError(f"{source.source_path}: {source.unreadable}")
        max_bytes = int(options.max_file_mb * 1e6)
        if source.size > max_bytes:
            raise ConversionError(
                f"{source.source_path}: {source.size / 1e6:.1f} MB is over convert.max_file_mb "
                f"({max_bytes / 1e6:.1f} MB); raise the limit in config or exclude the file"
            )
        converted = convert_file(source.abs_path, source.source_path, options, source.member)
    except RecursionError:
        return _row(source, None, converter_fingerprint(options),
                    f"ConversionError: {source.source_path}: the document is nested too deeply to convert; "
                    "simplify it or exclude it with convert.exclude")
    except Exception as exc:  # every failure is recorded, the batch goes on
        return _row(source, None, converter_fingerprint(options), f"{type(exc).__name__}: {exc}")
    row = _row(source, converted, "", None)
    _hold_back_secrets(row, options)  # here, in the conversion worker, beside the other files' conversions
    return row


def text_documents(sources: list[SourceFile], texts_by_path: dict[str, str],
                   options: ConvertConfig | None = None) -> pa.Table:
    """Documents rows for literal texts: the text is its own Markdown, nothing to convert; one holding a
    credential is a failure like a file's (``options.secret_scan``)."""
    rows = [_row(source, Converted(without_nul(texts_by_path[source.source_path]), converter_fingerprint(), "utf-8"),
                 "", None) for source in sources]
    if options is not None:
        for row in rows:
            _hold_back_secrets(row, options)
    return pa.Table.from_pylist(rows, schema=DOCUMENTS)


AUTO_WORKERS_MIN_FILES = 200  # below this, starting the workers (each imports the converters) costs what they save
AUTO_WORKERS_MAX = 4  # conversion runs one batch ahead of embedding; more processes mostly add memory


def conversion_workers(options: ConvertConfig, job_files: int) -> int:
    """Processes converting a job of ``job_files`` files: ``convert.workers``, or for 'auto' one per core (at most
    ``AUTO_WORKERS_MAX``) when the job is large enough to pay for starting them and this process may start
    children (a Dask worker is a daemon process, which may not)."""
    if options.workers != "auto":
        return options.workers
    if job_files < AUTO_WORKERS_MIN_FILES or multiprocessing.current_process().daemon:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, AUTO_WORKERS_MAX))


class ConversionPool:
    """The conversion worker processes of one run: started when its first batch needs them, stopped when the run
    ends (``run_conversion_pool``). Never shared: a run that ends stops only its own workers, and two runs never
    send jobs to the same worker."""

    def __init__(self):
        self._pool = None
        self._asked_nice = 0
        self._guard = threading.Lock()

    def get(self, workers: int, nice: int = 0):
        from kbflow.convert.pool import KillablePool

        with self._guard:
            if self._pool is None or len(self._pool.workers) != workers or self._asked_nice != nice:
                if self._pool is not None:
                    self._pool.close()
                self._pool, self._asked_nice = KillablePool(workers, _convert_one, nice), nice
            return self._pool

    def close(self) -> None:
        with self._guard:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


_run_pool: ContextVar[ConversionPool | None] = ContextVar("kbflow_conversion_pool", default=None)


@contextmanager
def run_conversion_pool():
    """Conversions in this context (and in the threads a run starts with it) share one pool, stopped at the end."""
    pool = ConversionPool()
    token = _run_pool.set(pool)
    try:
        yield pool
    finally:
        _run_pool.reset(token)
        pool.close()


def convert_batch(sources: list[SourceFile], options: ConvertConfig | None = None, cache=None,
                  on_file=None, job_files: int | None = None) -> pa.Table:
    """Documents table for ``sources``: one row each, failed ones with status 'failed' and the error.

    ``cache`` (a ``ConversionCache``) returns earlier successes and stores new ones; failures are never cached,
    so a file that failed for a passing reason is converted again next time. ``on_file(n)`` is called as the
    ``n`` th file is done (in-process conversion; a worker pool reports once, at the end). ``job_files``: the
    files of the whole job these are a batch of, which ``workers: auto`` decides on (default: this batch's)."""
    options = options or ConvertConfig()
    fingerprint = converter_fingerprint(options)
    keys = [format_fingerprint(options, source.member or source.abs_path) for source in sources]
    rows: list[dict | None] = [cache.get(s, key) if cache is not None else None for s, key in zip(sources, keys)]
    for source, key, row in zip(sources, keys, rows):
        if row is not None:  # same output, current fingerprint (it may differ in parts this format ignores)
            row["converter"] = f"{fingerprint}:{row['converter'].rsplit(':', 1)[-1]}"
            row["markdown"] = without_nul(row["markdown"])  # cached before NULs were removed
            # the scan may have been off, or its rules older, when it was cached: such an entry leaves the cache
            if _hold_back_secrets(row, options) and cache is not None:
                cache.forget(source.source_sha256, key)
    todo = [i for i, row in enumerate(rows) if row is None]
    report = on_file or (lambda done: None)
    report(len(sources) - len(todo))  # the cached ones
    workers = conversion_workers(options, len(todo) if job_files is None else job_files)
    if workers <= 1 or len(todo) <= 1:
        for number, i in enumerate(todo, 1):
            rows[i] = _convert_one(sources[i], options)
            report(len(sources) - len(todo) + number)
    else:
        def timed_out(job: int) -> dict:
            return _row(sources[todo[job]], None, fingerprint,
                        f"ConversionError: {sources[todo[job]].source_path}: conversion took over convert.timeout_s "
                        f"({options.timeout_s:g} s{limit_kind}) and its worker was stopped; raise the limit or "
                        "exclude the file")

        def crashed(job: int, exitcode: int | None) -> dict:
            return _row(sources[todo[job]], None, fingerprint,
                        f"ConversionError: {sources[todo[job]].source_path}: the converter process died (exit code "
                        f"{exitcode}; out of memory?); exclude the file or convert it with workers: 1 to see the error")

        from kbflow.convert.pool import NICED_WALL_FACTOR

        owner = _run_pool.get()  # a run's pool; a call outside any run starts workers for this call only
        pool = owner or ConversionPool()
        try:
            workers_pool = pool.get(workers, options.worker_nice)
            limit_kind = f" of CPU time, or {NICED_WALL_FACTOR}x that of wall time" if workers_pool.nice else ""
            with cores.working(min(workers, len(todo))):  # the model's passes leave the workers their cores
                results = workers_pool.map([(sources[i], options) for i in todo], options.timeout_s, timed_out,
                                           crashed)
        finally:
            if owner is None:
                pool.close()
        for i, row in zip(todo, results):
            rows[i] = row
        report(len(sources))
    done = [row for row in rows if row is not None]
    if len(done) != len(rows):
        raise RuntimeError(f"{len(rows) - len(done)} of {len(rows)} files came back from conversion without a row")
    if cache is not None:
        for i in todo:
            if done[i]["status"] == "ok":
                cache.put(done[i]["source_sha256"], keys[i], done[i])
    return pa.Table.from_pylist(done, schema=DOCUMENTS)


def _hold_back_secrets(row: dict, options: ConvertConfig) -> bool:
    """With ``options.secret_scan``, a converted row whose text holds a credential becomes a failure without its
    text (never stored); whether it did. The scan reads what the file says (``scan_text``: the Markdown's escapes
    undone), not the Markdown."""
    if not options.secret_scan or row["status"] != "ok" or not row["markdown"]:
        return False
    try:
        check_secrets(scan_text(row["markdown"]), row["source_path"], options.secret_scan_allow)
    except SecretFound as exc:
        row.update(status="failed", markdown=None, error=f"{type(exc).__name__}: {exc}")
        return True
    return False
