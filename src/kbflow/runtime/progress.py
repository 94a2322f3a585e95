"""Progress events from a run to whoever listens (the CLI's rich bars, a flow's progress artifact); a no-op by
default.

Kept out of Prefect: the engine calls ``report``; a caller installs a listener for the duration of a run. The
listener belongs to the context that installed it (a ``ContextVar``), not to the process: runs in other threads
(a backfill's namespaces, an MCP server's writes) neither see it nor replace it, and runs that end in any order
each put back exactly what they found. Threads a run starts carry its context (``contextvars.copy_context``), so
its stages report to its listener.
"""

from __future__ import annotations

import threading
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


class TextCounter:
    """A run's texts to embed and embedded, fed from any of its threads: the engine adds the misses of each batch it
    chunks (``add_known``: the total grows as chunking goes and is final when chunking ends), the embed stage each
    model call's texts as they return (``advance``, through the context), and the engine each finished stage call
    (``settle``: where a stage runs in another process, its model calls cannot report). Each change is reported as
    ``stage`` (texts done, texts known) to the listener of the context that made the counter."""

    def __init__(self, stage: str = "embed"):
        self.stage = stage
        self.known = self.advanced = self.settled = 0
        self._lock = threading.Lock()
        self._listener = _listener.get()

    @property
    def done(self) -> int:
        return max(self.advanced, self.settled)

    def _changed(self) -> None:
        if self._listener is not None:
            self._listener(self.stage, self.done, max(self.known, self.done))

    def add_known(self, texts: int) -> None:
        with self._lock:
            self.known += texts
            self._changed()

    def advance(self, texts: int) -> None:
        with self._lock:
            self.advanced += texts
            self._changed()

    def finish(self) -> None:
        """The run has chunked everything: report the final figures (also when nothing had to be embedded)."""
        with self._lock:
            self._changed()

    def settle(self, texts: int) -> None:
        with self._lock:
            self.settled += texts
            if self.settled > self.advanced:
                self._changed()


_counter: ContextVar[TextCounter | None] = ContextVar("kbflow_text_counter", default=None)


@contextmanager
def counting(counter: TextCounter):
    """Model calls in this context (and in the threads a run starts with it) advance ``counter``."""
    token = _counter.set(counter)
    try:
        yield counter
    finally:
        _counter.reset(token)


def advance(texts: int) -> None:
    """``texts`` more texts embedded, for the run's counter if one is counting (a no-op otherwise)."""
    counter = _counter.get()
    if counter is not None:
        counter.advance(texts)


def counting_now() -> TextCounter | None:
    """The counter of this context's run, if one is counting."""
    return _counter.get()
