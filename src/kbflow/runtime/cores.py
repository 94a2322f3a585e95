"""The cores this process's own CPU work takes from the embedding model.

A torch forward pass splits each operation over its threads, one per core, and waits for the last of them before
the next: when another thread of this process (an ingest's chunking, or its writes) runs on one of those cores at
the same priority, the whole pass goes at the pace of the model thread it displaced, and both lose. Work marked
``working()`` counts as holding a core; a forward pass that starts meanwhile runs on that many threads fewer (at
least one), leaving the core to it (``kbflow.embed.base.torch_threads``).

Conversion workers are other processes, at a lower priority (``convert.worker_nice``) so that they fill what the
model leaves idle; while they have jobs they are marked too, one core per busy worker. Where conversion is what a run
waits for (an update that converts every page again to embed a few texts), they then get their cores instead of
waiting for the model. The count is the process's, since the cores are: two runs in one process (a server's) each
add theirs. Measured with research/update_cores.py (docs/benchmarks.md, "The model beside the run's own work").
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_working = 0


@contextmanager
def working(count: int = 1) -> Iterator[None]:
    """Mark CPU work of this process (its threads other than the model's, its worker processes) that holds
    ``count`` cores, for as long as it runs."""
    global _working
    with _lock:
        _working += count
    try:
        yield
    finally:
        with _lock:
            _working -= count


def taken() -> int:
    """How many cores marked work holds now."""
    return _working
