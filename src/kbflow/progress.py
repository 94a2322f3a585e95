"""Progress events from a run to whoever listens (the CLI's rich bars, a flow's progress artifact); a no-op by
default.

Kept out of Prefect: the engine calls ``report``; a caller installs a listener for the duration of a run. The
listener belongs to the context that installed it (a ``ContextVar``), not to the process: runs in other threads
(a backfill's namespaces, an MCP server's writes) neither see it nor replace it, and runs that end in any order
each put back exactly what they found. Threads a run starts carry its context (``contextvars.copy_context``), so
its stages report to its listener.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from contextvars import ContextVar

Listener = Callable[[str, int, int], None]  # (stage, completed so far, total)
_listener: ContextVar[Listener | None] = ContextVar("kbflow_progress_listener", default=None)


def report(stage: str, completed: int, total: int) -> None:
    listener = _listener.get()
    if listener is not None:
        listener(stage, completed, total)


def current() -> Listener | None:
    """The listener of this context (None: nobody listens)."""
    return _listener.get()


@contextmanager
def listening(listener: Listener | None):
    """``listener`` receives this context's events for the duration (None: nobody does)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


@contextmanager
def also_listening(listener: Listener):
    """Add a listener for the duration, keeping the one already installed in this context (the CLI's bars)
    informed too."""
    previous = _listener.get()

    def both(stage: str, completed: int, total: int) -> None:
        listener(stage, completed, total)
        if previous is not None:
            previous(stage, completed, total)

    with listening(both):
        yield
