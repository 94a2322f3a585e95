"""One writer per namespace on object storage: a lease object taken with a conditional write.

A local lock file (``lock.py``) is a file that two machines sharing a bucket could both "take". Here the lock is
an object, ``<state>/ingest.lock``, and every change to it is a conditional write, which S3 applies atomically:

* **take**: ``PutObject`` with ``If-None-Match: *`` succeeds for exactly one of any number of racing writers;
* **hold**: the holder renews its lease every ``lease_s / 3`` seconds with ``If-Match: <its ETag>``, so a renewal
  can only overwrite its own lease;
* **take over**: a lease not renewed for ``2 x lease_s``, judged by the store's own clock (the object's
  ``Last-Modified`` against the ``Date`` of the same response: no two machines' clocks are compared), belongs to
  a dead or stalled run, and so does one whose holder ran on this host and is no longer alive (a crash re-run on
  the same machine does not wait out the lease, as with the local lock file); it is replaced with
  ``If-Match: <the stale ETag>``, so of several runs that saw it free, one wins;
* **release**: ``DeleteObject`` with ``If-Match: <its ETag>`` removes only its own lease.

A holder whose renewal fails (it stalled past its lease and was taken over) is told by ``check()``, which the
engine calls before each store write, and stops with NamespaceLocked instead of writing under another run's lock.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid

from kbflow.core.errors import ConfigError
from kbflow.state.files import LOCK_NAME
from kbflow.state.holders import NamespaceLocked, died_here, held_by
from kbflow.core.urls import filesystem

log = logging.getLogger(__name__)

LEASE_S = 60.0
STALE_AFTER = 2.0  # leases: a lease this many lease times old was not renewed by a live holder


def _precondition_failed(exc: BaseException) -> bool:
    """Whether a conditional write was refused (412, or 409 when two conditional writes raced)."""
    if isinstance(exc, FileExistsError):
        return True
    error: BaseException | None = exc
    while error is not None:
        response = getattr(error, "response", None)
        if isinstance(response, dict):
            return response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict",
                                                             "412", "409")
        error = error.__cause__
    return False


class ObjectLock:
    def __init__(self, state_url: str, namespace: str, lease_s: float = LEASE_S):
        fs, path = filesystem(state_url.rstrip("/") + "/" + LOCK_NAME)
        if "s3" not in (fs.protocol if isinstance(fs.protocol, (list, tuple)) else (fs.protocol,)):
            raise ConfigError(f"{state_url!r}: kbflow's lock on object storage uses S3 conditional writes; keep the "
                              "data dir on S3 (or an S3-compatible store) or on a local or NFS path")
        self.fs, self.url, self.namespace, self.lease_s = fs, fs.unstrip_protocol(path), namespace, lease_s
        self.bucket, self.key, _ = fs.split_path(path)
        self.owner = {"owner": uuid.uuid4().hex, "pid": os.getpid(), "host": socket.gethostname(),
                      "started": time.time(), "lease_s": lease_s}
        self.etag: str | None = None
        self.renewed_at = 0.0  # time.monotonic() of the last write of the lease that succeeded
        self.lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._mutex = threading.Lock()

    def _put(self, **condition) -> str:
        body = json.dumps({**self.owner, "renewed": time.time()}).encode()
        return self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=body, **condition)["ETag"]

    def acquire(self) -> None:
        try:
            self.etag = self._put(IfNoneMatch="*")
        except Exception as exc:
            if not _precondition_failed(exc):
                raise
            self.etag = self._take_over()
        self.renewed_at = time.monotonic()
        self._renewer = threading.Thread(target=self._renew, name=f"kbflow-lease-{self.namespace}", daemon=True)
        self._renewer.start()

    def _take_over(self) -> str:
        head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)
        holder = self._holder()
        age = self._store_now(head) - head["LastModified"].timestamp()
        if not died_here(holder) and age <= STALE_AFTER * float(holder.get("lease_s", self.lease_s)):
            raise NamespaceLocked(
                f"{held_by(self.namespace, holder)} (its lease {self.url} was renewed {age:.0f} s ago); wait for it. "
                f"A lease not renewed for {STALE_AFTER:g} x its {holder.get('lease_s', self.lease_s):g} s is taken over")
        try:
            return self._put(IfMatch=head["ETag"])
        except Exception as exc:
            if _precondition_failed(exc):
                raise NamespaceLocked(f"namespace {self.namespace!r}: another run took over the stale lease "
                                      f"{self.url} first; try again") from None
            raise

    @staticmethod
    def _store_now(response: dict) -> float:
        from email.utils import parsedate_to_datetime

        date = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        return parsedate_to_datetime(date).timestamp() if date else time.time()

    def _holder(self) -> dict:
        try:
            return json.loads(self.fs.cat_file(f"{self.bucket}/{self.key}"))
        except (OSError, ValueError):
            return {}

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            with self._mutex:
                if self.etag is None:
                    return
                try:
                    self.etag = self._put(IfMatch=self.etag)
                    self.renewed_at = time.monotonic()
                except Exception as exc:
                    if _precondition_failed(exc):  # another run took it over: this run stalled past its lease
                        self.lost = f"namespace {self.namespace!r}: another run took over this run's lease {self.url}"
                        return
                    log.warning("could not renew the lease %s (%s); retrying", self.url, type(exc).__name__)

    def check(self) -> None:
        """Raise NamespaceLocked unless this run surely still holds its lease: it was not taken over, and it was
        renewed within ``lease_s`` (another run may take it over only after twice that). Called before writes."""
        if self.lost:
            raise NamespaceLocked(self.lost + "; this run stopped before writing")
        age = time.monotonic() - self.renewed_at
        if self.etag is None or age > self.lease_s:
            raise NamespaceLocked(f"namespace {self.namespace!r}: this run's lease {self.url} was last renewed "
                                  f"{age:.0f} s ago (lease {self.lease_s:g} s); this run stopped before writing")

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with self._mutex:
            etag, self.etag = self.etag, None
        if etag is None or self.lost:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=etag)
        except Exception as exc:
            if not _precondition_failed(exc):
                raise

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
