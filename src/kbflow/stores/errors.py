"""What a store or file-system failure means: passing (retry the stage) or lasting (say what to fix, once).

The stores and the state files are written through libraries that report trouble as ``OSError`` (with an errno)
or as LanceDB errors whose kind is only in their text ("Retryable commit conflict", "Incompatible transaction":
another writer committed first). This is the one place that reads those; everything above it sees kbflow's
classes: ``StoreBusy`` (transient, the stage is retried) or ``StoreUnwritable`` (permanent, with the path and the
fix), and retries are driven by the class.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Callable
from contextlib import contextmanager
from typing import ParamSpec, TypeVar
from pathlib import Path

from kbflow.core.errors import DATA_DIR_IN_USE, AccessDenied, KbflowError, PermanentError, StoreBusy

TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EBUSY, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE,
                              errno.ECONNRESET, errno.ECONNABORTED, errno.ENETDOWN, errno.ENETUNREACH,
                              errno.EHOSTUNREACH, errno.ETXTBSY})
UNWRITABLE_ERRNOS = {errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
                     errno.EROFS: "read-only file system", errno.ENOSPC: "no space left on the device",
                     errno.EDQUOT: "disk quota exceeded",
                     errno.ENOTDIR: "a part of the path is a file, not a folder"}
# LanceDB's own words for a concurrent commit or a slow object store: retrying against the new version succeeds
LANCE_TRANSIENT = ("Retryable commit conflict", "Commit conflict for version", "Incompatible transaction",
                   "TooMuchWriteContention", "request has timed out", "operation timed out")


# LanceDB's words for a file it found damaged (cut short, scrambled, emptied, or of another format)
LANCE_DAMAGE = ("LanceError(IO)", "LanceError(Corrupt", "does not appear to be a Lance file",
                "Unknown Lance storage version", "file size is too small", "Invalid range", "Encountered corrupt file")


class StoreUnwritable(PermanentError):
    """The data dir (or a store under it) cannot be written: permissions, a read-only or full disk."""


def unwritable_message(what: str, path: str | Path | None, reason: str) -> str:
    where = f" {str(path)!r}" if path else ""
    return (f"cannot write{where} while {what}: {reason}. kbflow keeps its stores, state and run snapshots under "
            "the data dir: make it writable by this user, free space, or pass another one with --data-dir "
            "(config data_dir)")


def classify(exc: BaseException, what: str) -> BaseException:
    """``exc`` as kbflow sees it: StoreBusy, StoreUnwritable, or ``exc`` itself when it means neither (kbflow's own
    errors are already classified)."""
    if isinstance(exc, KbflowError):
        return exc
    if isinstance(exc, OSError) and exc.errno is not None:
        if exc.errno in TRANSIENT_ERRNOS:
            return StoreBusy(f"{what}: {exc.strerror or exc} ({exc.filename or 'store'}); retried")
        if exc.errno in UNWRITABLE_ERRNOS:
            return StoreUnwritable(unwritable_message(what, exc.filename, UNWRITABLE_ERRNOS[exc.errno]))
    text = str(exc)
    if any(marker in text for marker in LANCE_TRANSIENT):
        return StoreBusy(f"{what}: another writer committed first or the store timed out ({text[:300]}); retried")
    lowered = text.lower()
    for code, reason in UNWRITABLE_ERRNOS.items():
        if reason in lowered or f"os error {code})" in lowered:
            return StoreUnwritable(unwritable_message(what, None, f"{reason} ({text[:300]})"))
    return exc


@contextmanager
def store_errors(what: str):
    """Re-raise a store or file-system failure inside the block as the kbflow error it means."""
    try:
        yield
    except Exception as exc:
        mapped = classify(exc, what)
        if mapped is exc:
            raise
        raise mapped from exc


_MISSING_FILE = re.compile(r"Not found: (?:Wrapped error: Not found: )?([^,\s]+)")


def damage_reason(exc: BaseException) -> str | None:
    """What a store's read failure says about damage on disk (a data file missing, cut short or unreadable), in a
    few words; None when it is not that kind of failure."""
    if isinstance(exc, KbflowError) or denied(exc) is not None:  # a permission error is not damage
        return None
    text = str(exc)
    missing = _MISSING_FILE.search(text)
    if missing:
        path = missing.group(1)
        if not path.startswith("/") and os.path.isdir("/" + os.path.dirname(path)):
            path = "/" + path  # LanceDB names local files by their object-store path, without the root
        what = "a search index file" if "/_indices/" in path else "a data file"  # an index is rebuilt, not restored
        return f"{what} is missing: {path}"
    if any(marker in text for marker in LANCE_DAMAGE):
        return text.strip().splitlines()[0][:200]
    return None


_DENIED_PATH = re.compile(r"""(?:path: Some\("|'|\"|operation on |open file )(/[^"':]+)""")


def _blocking(path: str) -> str:
    """The outermost folder or file on the way to ``path`` this user cannot enter or read (a folder of mode 000
    makes every path below it fail): what to give back access to."""
    parts = Path(path).parts
    for end in range(2, len(parts) + 1):
        step = Path(*parts[:end])
        if not step.exists() and not step.parent.exists():
            break
        if step.is_dir() and not os.access(step, os.R_OK | os.X_OK) or \
                not step.is_dir() and step.exists() and not os.access(step, os.R_OK):
            return str(step)
    return path


def denied(exc: BaseException, within: str | Path | None = None) -> AccessDenied | None:
    """``exc`` as an AccessDenied naming the path it could not read or write, when it is a permission error (an
    OSError, or a store library's error that says so in its text); else None. When the error names no path, the
    first unreadable one under ``within`` (the folder the failed call read; by default the data dir of the call
    under way) is named."""
    if isinstance(exc, KbflowError):
        return None
    text = str(exc)
    if isinstance(exc, PermissionError) and exc.filename:
        path = exc.filename
    elif isinstance(exc, PermissionError) or "Permission denied" in text or "os error 13)" in text:
        found = _DENIED_PATH.search(text)
        path = found.group(1) if found else ""
    else:  # LanceDB reports some files it may not read as missing
        missing = _MISSING_FILE.search(text)
        path = missing.group(1) if missing else ""
        if path and not path.startswith("/"):
            path = "/" + path
        if not path or not os.path.exists(path) or os.access(path, os.R_OK):
            return None
    within = within if within is not None else DATA_DIR_IN_USE.get()  # the data dir of the call under way
    if not path and within is not None:
        path = getattr(first_denied(within), "filename", None) or ""
    where = _blocking(str(path)) if path else ""
    target = f" {where!r}" if where else ""
    fix = f"`chmod u+rwX '{where}'`" if where else "`chmod -R u+rwX` on the data dir"
    return AccessDenied(f"cannot read or write{target}: permission denied. kbflow needs read and write access to its "
                        f"data dir: give it back to the user running kbflow ({fix}, or `chown` it to that user), "
                        "or pass another --data-dir")


def first_denied(root: str | Path) -> BaseException:
    """A PermissionError naming the first file or folder under ``root`` this user cannot read (or enter), or a
    plain Exception when every one reads: for libraries whose own error does not say (SQLite's "unable to open")."""
    if not os.access(root, os.R_OK | os.X_OK if os.path.isdir(root) else os.R_OK):
        return PermissionError(errno.EACCES, "Permission denied", str(root))
    for folder, subfolders, files in os.walk(root):
        for name in sorted(subfolders) + sorted(files):
            path = os.path.join(folder, name)
            wanted = os.R_OK | os.X_OK if os.path.isdir(path) else os.R_OK
            if not os.path.islink(path) and not os.access(path, wanted):
                return PermissionError(errno.EACCES, "Permission denied", path)
    return Exception(f"every file under {root} reads")


def refuse_denied(exc: BaseException, within: str | Path | None = None) -> None:
    """Raise ``exc`` as AccessDenied when it is a permission error: code that treats a failure to read as damage
    (and moves files aside) must never do so for a file it is only not allowed to read."""
    mapped = denied(exc, within)
    if mapped is not None:
        raise mapped from exc


@contextmanager
def access_errors():
    """A permission error inside the block is one AccessDenied naming the path and the fix, not a traceback."""
    try:
        yield
    except Exception as exc:
        mapped = denied(exc)
        if mapped is None:
            raise
        raise mapped from exc


P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(function: Callable[P, R]) -> Callable[P, R]:
    """A permission error anywhere below a public call is one AccessDenied naming the path and the fix (every door
    answers in one line: the CLI, ``KnowledgeBase``, MCP)."""
    @functools.wraps(function)
    def answer(*args: P.args, **kwargs: P.kwargs) -> R:
        token = DATA_DIR_IN_USE.set(DATA_DIR_IN_USE.get())  # the data dir this call resolves, for this call only
        try:
            with access_errors():
                return function(*args, **kwargs)
        finally:
            DATA_DIR_IN_USE.reset(token)

    return answer
