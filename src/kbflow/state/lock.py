"""One writer per namespace: in this process, an in-process lock that writes queue behind (threads, an MCP server,
a backfill's runs); across processes and machines, a lock file with owner and start time or, on object storage, a
lease object (``object_lock``), which a write waits for (``flow.lock_wait_s``) and takes over once its holder is
provably gone. A lock file kbflow cannot read is reported as far as it can be read, with the command that removes
it, never taken silently."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from kbflow.state.files import LOCK_NAME, damaged
from kbflow.runtime import progress
from kbflow.state.holders import NamespaceLocked, died_here, held_by, pid_of
from kbflow.state.object_lock import ObjectLock
from kbflow.core.storage import is_remote, location

log = logging.getLogger("kbflow.lock")


def what_to_do(holder: dict, lock_path) -> str:
    """The advice of a NamespaceLocked error. Removing the lock is suggested only where kbflow cannot tell whether
    its holder lives (another host, a record it cannot read); a live holder here (this process included) is waited
    for, never removed."""
    pid = pid_of(holder)
    if holder.get("host") == socket.gethostname() and pid is not None:
        if pid == os.getpid():
            return ("it is this process's own write (another thread, or a second data-dir path to the same folder); "
                    "it ends by itself: try again when it has finished")
        return "wait for that run to finish (it is alive), then try again"
    host = holder.get("host") if isinstance(holder.get("host"), str) and holder.get("host") else "its host"
    return (f"wait for that run to finish; if no kbflow process writes this namespace on {host} any more, remove "
            f"the lock: rm '{lock_path}'")


EMPTY_RECORD_S = 60.0  # a lock file is written whole right after it is created: empty for longer, its writer died


class NamespaceLock:
    def __init__(self, state_root: Path, namespace: str):
        self.path = Path(state_root) / LOCK_NAME
        self.namespace = namespace

    def acquire(self) -> None:
        """Take the lock, or raise NamespaceLocked at once naming the holder (``namespace_lock`` waits and asks
        again). A lock whose holder is provably gone is taken over: its process died on this host, its record
        stayed empty past ``EMPTY_RECORD_S``, or it is an empty folder (kbflow never makes one)."""
        for folder in (self.path.parent.parent, self.path.parent):
            if folder.exists() and not folder.is_dir():
                raise damaged(folder, self.namespace, "a file stands where this folder belongs")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder, problem = self._holder()
                if self._stale(holder, problem):
                    continue
                if problem:
                    raise NamespaceLocked(f"namespace {self.namespace!r} is locked by {self.path}, which {problem}; "
                                          f"{what_to_do({}, self.path)}") from None
                raise NamespaceLocked(f"{held_by(self.namespace, holder)}; {what_to_do(holder, self.path)}") from None
            with os.fdopen(fd, "w") as handle:
                json.dump(owner, handle)
            return
        raise NamespaceLocked(f"could not take the lock {self.path}; another run raced for it, try again")

    def _holder(self) -> tuple[dict, str]:
        """(the holder record, '') or ({}, what is wrong with the lock file)."""
        try:
            if self.path.is_dir():
                return {}, "is a folder, not a lock file"
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}, ""  # released meanwhile: the next try takes it
        except (OSError, UnicodeDecodeError) as exc:
            return {}, f"cannot be read ({exc.strerror if isinstance(exc, OSError) and exc.strerror else exc})"
        if not text.strip():
            return {}, "is empty"
        try:
            holder = json.loads(text)
        except ValueError:
            return {}, "is not a kbflow lock record (not JSON)"
        if not isinstance(holder, dict):
            return {}, "is not a kbflow lock record (not a JSON object)"
        return holder, ""

    def _would_take_over(self, holder: dict, problem: str) -> bool:
        """Whether the lock's holder is provably gone: its process died on this host, its record stayed empty past
        ``EMPTY_RECORD_S``, or the lock is an empty folder (kbflow never makes one)."""
        try:
            if problem == "is a folder, not a lock file":
                return not any(self.path.iterdir())
            if problem == "is empty":
                return time.time() - self.path.stat().st_mtime > EMPTY_RECORD_S
        except OSError:
            return False
        return bool(holder) and died_here(holder)

    def _stale(self, holder: dict, problem: str) -> bool:
        """Whether the lock's holder is provably gone; if so the lock is removed here (the caller tries again)."""
        if not holder and not problem:
            return True  # released between the two looks
        if not self._would_take_over(holder, problem):
            return False
        try:
            if self.path.is_dir():
                self.path.rmdir()  # only an empty one (a folder with something in it is reported)
            else:
                self.path.unlink(missing_ok=True)  # its owner is gone: take over
        except OSError:
            return False
        return True

    def release(self) -> None:
        holder, _problem = self._holder()
        if pid_of(holder) == os.getpid():
            self.path.unlink(missing_ok=True)
            try:
                self.path.parent.rmdir()  # the state folder, when a clear emptied it under this lock
            except OSError:
                pass  # it holds the namespace's state

    def check(self) -> None:
        """Still held (a lock file is not taken from a live process: nothing to check; see ObjectLock)."""

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def describe_lock(state_root, namespace: str) -> str | None:
    """What ``kbflow verify`` says of a namespace's lock file: nothing when there is none or a live run of this
    host holds it; else whose it is as far as it reads, and whether a write takes it over (provably stale) or it
    must be removed by hand (the command)."""
    root = location(state_root)
    if is_remote(root):
        return None  # a lease: its own expiry heals it (object_lock)
    lock = NamespaceLock(root, namespace)
    if not lock.path.exists() and not lock.path.is_symlink():
        return None
    holder, problem = lock._holder()
    if not holder and not problem:
        return None
    pid = pid_of(holder)
    if holder and holder.get("host") == socket.gethostname() and pid is not None and not died_here(holder):
        return None  # a run in progress
    stale = lock._would_take_over(holder, problem)
    who = f"{lock.path} {problem}" if problem else held_by(namespace, holder)
    return (f"{who}: " + ("stale (its holder is gone); the next write or `kbflow verify --repair` takes it over"
                          if stale else what_to_do(holder, lock.path)))


DEFAULT_WAIT_S = 600.0  # flow.lock_wait_s


class _Queue:
    """The in-process lock of one namespace: who holds it (thread and since when), so a write that waits too long
    says what it waited for, and a write nested in another one of the same thread fails at once instead of
    waiting for itself."""

    def __init__(self):
        self.lock = threading.Lock()
        self.owner: int | None = None
        self.since = 0.0


_queues: dict[str, _Queue] = {}  # one per state folder for the life of the process: a queue must be shared to work
_queues_guard = threading.Lock()


def _queue_of(root) -> _Queue:
    key = str(root) if not isinstance(root, Path) else os.path.realpath(root)
    with _queues_guard:
        return _queues.setdefault(key, _Queue())


@contextmanager
def _in_process(root, namespace: str, wait_s: float):
    queue = _queue_of(root)
    me = threading.get_ident()
    if queue.owner == me:
        raise NamespaceLocked(f"namespace {namespace!r} is being ingested by this same thread: a write was started "
                              "inside another write of the namespace; start it after that one returns")
    if not queue.lock.acquire(timeout=wait_s):
        held = time.time() - queue.since if queue.owner is not None else 0.0
        raise NamespaceLocked(f"namespace {namespace!r} is being written by another thread of this process "
                              f"(for {held:.0f} s); this write waited flow.lock_wait_s ({wait_s:g} s) for it. It "
                              "ends by itself: try again later, or raise flow.lock_wait_s")
    queue.owner, queue.since = me, time.time()
    try:
        yield
    finally:
        queue.owner = None
        queue.lock.release()


@contextmanager
def namespace_lock(state_root, namespace: str, wait_s: float = DEFAULT_WAIT_S):
    """The one-writer lock of a namespace, as a context manager yielding the cross-process lock (its ``check()``
    is called before each store write). A write waits up to ``wait_s`` seconds in all (``flow.lock_wait_s``):
    first behind the other writes of this process (an in-process lock), then for a writer of another process or
    machine (a lock file on a local or NFS data dir, a lease object on object storage, ``object_lock``), asking
    again every second and saying whom it waits for; a lock whose holder is provably gone is taken over."""
    root = location(state_root)
    started = time.monotonic()
    with _in_process(root, namespace, wait_s):
        lock: ObjectLock | NamespaceLock
        if is_remote(root):
            lock = ObjectLock(str(root), namespace)
        else:
            lock = NamespaceLock(root, namespace)
        _acquire_waiting(lock, max(0.0, wait_s - (time.monotonic() - started)))
        try:
            yield lock
        finally:
            lock.release()


def _acquire_waiting(lock, wait_s: float) -> None:
    """``lock.acquire()``, asked again every second for up to ``wait_s`` seconds while another writer holds it;
    the wait shows as a progress line naming the holder, and its end as the holder's error with the time waited."""
    started = time.monotonic()
    told = False
    while True:
        try:
            lock.acquire()
            return
        except NamespaceLocked as exc:
            waited = time.monotonic() - started
            if waited >= wait_s:
                if not told:
                    raise
                raise NamespaceLocked(f"{exc} (this write waited {waited:.0f} s for it: flow.lock_wait_s)") from None
            if not told:
                log.warning("%s; waiting up to %.0f s (flow.lock_wait_s)", exc, wait_s)
                told = True
            progress.report(f"waiting: {str(exc).split(';', 1)[0]}", int(waited), int(wait_s))
            time.sleep(min(1.0, max(0.05, wait_s - waited)))
