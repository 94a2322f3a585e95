"""One writer per namespace: in this process, an in-process lock that writes queue behind (threads, an MCP server,
a backfill's runs); across processes and machines, a lock file with owner and start time (taken over when its owner
died) or, on object storage, a lease object (``object_lock``)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from kbflow.state.files import LOCK_NAME
from kbflow.state.holders import NamespaceLocked, died_here, held_by
from kbflow.state.object_lock import ObjectLock
from kbflow.storage import is_remote, location


def what_to_do(holder: dict, lock_path) -> str:
    """The advice of a NamespaceLocked error. Removing the lock is suggested only where kbflow cannot tell whether
    its holder lives (another host); a live holder here (this process included) is waited for, never removed."""
    if holder.get("host") == socket.gethostname():
        if int(holder.get("pid", 0) or 0) == os.getpid():
            return ("it is this process's own write (another thread, or a second data-dir path to the same folder); "
                    "it ends by itself: try again when it has finished")
        return "wait for that run to finish (it is alive), then try again"
    return (f"wait for that run to finish; if no kbflow process runs on {holder.get('host')} any more, remove "
            f"{lock_path}")


class NamespaceLock:
    def __init__(self, state_root: Path, namespace: str):
        self.path = Path(state_root) / LOCK_NAME
        self.namespace = namespace

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if died_here(holder):
                    self.path.unlink(missing_ok=True)  # its owner died: take over
                    continue
                raise NamespaceLocked(f"{held_by(self.namespace, holder)}; {what_to_do(holder, self.path)}") from None
            with os.fdopen(fd, "w") as handle:
                json.dump(owner, handle)
            return
        raise NamespaceLocked(f"could not take the lock {self.path}; another run raced for it, try again")

    def _holder(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def release(self) -> None:
        if self._holder().get("pid") == os.getpid():
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
    is called before each store write). Writes from this process queue for up to ``wait_s`` seconds behind an
    in-process lock; then a lock file on a local (or NFS) data dir, a lease object (``object_lock.ObjectLock``) on
    object storage, refuses a writer of another process at once."""
    root = location(state_root)
    with _in_process(root, namespace, wait_s):
        lock: ObjectLock | NamespaceLock
        if is_remote(root):
            lock = ObjectLock(str(root), namespace)
        else:
            lock = NamespaceLock(root, namespace)
        with lock:
            yield lock
