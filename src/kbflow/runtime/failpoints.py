"""Failpoints: named places in the pipeline where a test makes the real process crash, fail or pause.

Armed only through the environment, never by config: ``KBFLOW_FAILPOINTS="upsert.after_store=2:kill"`` makes the
second pass through ``upsert.after_store`` SIGKILL its own process; ``:raise`` raises ``FailpointError`` there;
``:pause(20)`` writes the point's name to ``$KBFLOW_FAILPOINTS_MARKER`` (if set) and waits until the test removes that
file (at most 20 s; without a marker it sleeps 20 s), so a test acts while a run stands at a known place and then
lets it go on: a handshake, not a guess at timing. Several points are separated by commas. Unarmed, a failpoint costs one
environment lookup; the pipeline passes through a handful per batch.

The points (kbflow.engine.ingest and kbflow.engine.embedding): ``plan.written``, ``convert.done``, ``split.done``, ``chunk.done`` (per document
batch), ``embed.batch_done`` (per finished embedding task, its vectors already in the cache),
``upsert.after_store`` (store written, manifest not yet), ``upsert.done``, ``delete.after_store``, ``run.finishing``. And ``mcp.warm_up.done`` (kbflow.mcp.server: the model and table loaded, the server not yet answering).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

ENV = "KBFLOW_FAILPOINTS"
MARKER_ENV = "KBFLOW_FAILPOINTS_MARKER"
SPEC_RE = re.compile(r"^\s*([\w.]+)(?:=(\d+))?:(kill|raise|pause\((\d+(?:\.\d+)?)\))\s*$")

_hits: dict[str, int] = {}
_lock = threading.Lock()


class FailpointError(RuntimeError):
    """Raised by an armed ``:raise`` failpoint."""


def reset() -> None:
    """Forget how often each point was passed (tests arming points in-process)."""
    with _lock:
        _hits.clear()


def failpoint(name: str) -> None:
    spec = os.environ.get(ENV)
    if not spec:
        return
    for item in spec.split(","):
        match = SPEC_RE.match(item)
        if not match:
            raise ValueError(f"{ENV}: cannot read {item!r}; write POINT[=N]:kill|raise|pause(SECONDS)")
        point, nth, action, seconds = match.groups()
        if point != name:
            continue
        with _lock:
            _hits[name] = hit = _hits.get(name, 0) + 1
        if hit != int(nth or 1):
            continue
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "raise":
            raise FailpointError(f"failpoint {name} (pass {hit}) raised on purpose")
        _pause(name, float(seconds))


def _pause(name: str, seconds: float) -> None:
    """Stand still at ``name``: a handshake when ``$KBFLOW_FAILPOINTS_MARKER`` is set (write the point's name there,
    wait until the test removes the file, at most ``seconds``), else a plain sleep."""
    marker = os.environ.get(MARKER_ENV)
    if not marker:
        time.sleep(seconds)
        return
    Path(marker).write_text(name, encoding="utf-8")
    deadline = time.monotonic() + seconds
    while Path(marker).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
