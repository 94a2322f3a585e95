"""Who holds a namespace's write lock: the holder record both kinds of cross-process lock keep (a lock file,
``kbflow.state.lock``; a lease object, ``kbflow.state.object_lock``), how it reads in an error, and whether its
process is gone."""

from __future__ import annotations

import os
import socket
import time

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
