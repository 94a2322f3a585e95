"""Progress events from the flow to whoever listens (the CLI's rich bars); a no-op by default.

Kept out of Prefect: the flow calls ``report``; the CLI installs a listener for the duration of a run.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

Listener = Callable[[str, int, int], None]  # (stage, completed so far, total)
_listener: Listener | None = None


def report(stage: str, completed: int, total: int) -> None:
    if _listener is not None:
        _listener(stage, completed, total)


@contextmanager
def listening(listener: Listener):
    global _listener
    previous, _listener = _listener, listener
    try:
        yield
    finally:
        _listener = previous


@contextmanager
def also_listening(listener: Listener):
    """Add a listener for the duration, keeping the one already installed (the CLI's bars) informed too."""
    previous = _listener

    def both(stage: str, completed: int, total: int) -> None:
        listener(stage, completed, total)
        if previous is not None:
            previous(stage, completed, total)

    with listening(both):
        yield
