"""Who holds a namespace's write lock: the holder record both kinds of cross-process lock keep (a lock file,
``kbflow.state.lock``; a lease object, ``kbflow.state.object_lock``), how it reads in an error, and whether its
process is gone."""

from __future__ import annotations

import os
import socket
import time

from kbflow.core.errors import KbflowError


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


def pid_of(holder: dict) -> int | None:
    """The holder's pid when the record gives a usable one (a hand-written or damaged record may not)."""
    pid = holder.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, (int, str)):
        return None
    try:
        value = int(pid)
    except ValueError:
        return None
    return value if value > 0 else None


def died_here(holder: dict) -> bool:
    """Whether a lock's holder ran on this host and is no longer alive: its lock is taken over at once."""
    pid = pid_of(holder)
    return pid is not None and holder.get("host") == socket.gethostname() and not alive(pid)


def _since(started: object) -> str:
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        try:
            return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
        except (OverflowError, OSError, ValueError):
            pass
    return f"an unreadable time ({str(started)[:40]!r})"


def held_by(namespace: str, holder: dict) -> str:
    """Who holds a namespace, in the words of the NamespaceLocked error, as far as its record can be read."""
    pid = pid_of(holder)
    who = f"pid {pid}" if pid is not None else f"an unreadable pid ({str(holder.get('pid'))[:40]!r})"
    host = holder.get("host")
    where = str(host)[:100] if isinstance(host, str) and host else "an unknown host"
    return f"namespace {namespace!r} is being ingested by {who} on {where} since {_since(holder.get('started'))}"
