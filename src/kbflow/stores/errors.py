"""What a store or file-system failure means: passing (retry the stage) or lasting (say what to fix, once).

The stores and the state files are written through libraries that report trouble as ``OSError`` (with an errno)
or as LanceDB errors whose kind is only in their text ("Retryable commit conflict", "Incompatible transaction":
another writer committed first). This is the one place that reads those; everything above it sees kbflow's
classes: ``StoreBusy`` (transient, the stage is retried) or ``StoreUnwritable`` (permanent, with the path and the
fix), and retries are driven by the class.
"""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path

from kbflow.errors import KbflowError, PermanentError, StoreBusy

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
    if isinstance(exc, KbflowError):
        return None
    text = str(exc)
    missing = _MISSING_FILE.search(text)
    if missing:
        path = missing.group(1)
        if not path.startswith("/") and os.path.isdir("/" + os.path.dirname(path)):
            path = "/" + path  # LanceDB names local files by their object-store path, without the root
        what = "a search index file" if "/_indices/" in path else "a data file"  # an index is rebuilt, not restored
        return f"{what} is missing: {path}"
    if "LanceError(IO)" in text or "LanceError(Corrupt" in text:
        return text.strip().splitlines()[0][:200]
    return None
