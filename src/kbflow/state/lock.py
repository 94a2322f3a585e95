"""One writer per namespace: a lock file with owner and start time, taken over when its owner died."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from kbflow.errors import KbflowError


class NamespaceLocked(KbflowError):
    """Another live run holds the namespace."""


def alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def died_here(holder: dict) -> bool:
    """Whether a lock's holder ran on this host and is no longer alive: its lock is taken over at once."""
    return bool(holder) and holder.get("host") == socket.gethostname() and not alive(int(holder.get("pid", 0) or 0))


def held_by(namespace: str, holder: dict) -> str:
    """Who holds a namespace, in the words of the NamespaceLocked error."""
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"namespace {namespace!r} is being ingested by pid {holder.get('pid')} on {holder.get('host')} since {started}"


class NamespaceLock:
    def __init__(self, state_root: Path, namespace: str):
        self.path = Path(state_root) / "ingest.lock"
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
                raise NamespaceLocked(f"{held_by(self.namespace, holder)}; wait for it, or remove {self.path} if "
                                      "that run is gone") from None
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

    def check(self) -> None:
        """Still held (a lock file is not taken from a live process: nothing to check; see ObjectLock)."""

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


def namespace_lock(state_root, namespace: str):
    """The one-writer lock of a namespace: a lock file on a local (or NFS) data dir, a lease object
    (``object_lock.ObjectLock``) on object storage."""
    from kbflow.storage import is_remote, location

    root = location(state_root)
    if is_remote(root):
        from kbflow.state.object_lock import ObjectLock

        return ObjectLock(str(root), namespace)
    return NamespaceLock(root, namespace)
