"""Process defaults for a terminal or test run: offline model loading, quiet progress, no telemetry.

Set before Prefect and transformers read their settings; values already in the environment win.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

DEFAULTS = {
    "HF_HUB_OFFLINE": "1",  # never download weights at run time
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    # flow and task run logs reach the API (the UI shows them) at INFO; the terminal shows WARNING and up
    "PREFECT_LOGGING_LEVEL": "INFO",
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",  # no network from here: telemetry only logs errors
    # the temporary server a serverless run starts needs more than Prefect's 20 s on a busy 2-core machine
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    # glibc: at most two malloc arenas in the processes kbflow starts (conversion workers, the temporary Prefect
    # server); the kbflow process itself sets the same with mallopt (kbflow.runtime.memory)
    "MALLOC_ARENA_MAX": "2",
    # Arrow buffers from the C allocator, which kbflow.runtime.memory trims after each batch; Arrow's default jemalloc pool
    # keeps them out of the trim's reach (what it saves, measured: docs/reliability.md)
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    # LanceDB's Rust logger (read once, when lancedb is first imported): errors only. At its default it printed
    # 'WARN lance_index::vector::kmeans ... clusters are empty' lines onto the terminal whenever a vector index
    # was trained on a table with repeated vectors
    "LANCEDB_LOG": "error",
}


def set_quiet_offline_defaults() -> None:
    for key, value in DEFAULTS.items():
        os.environ.setdefault(key, value)


def user_cache_dir() -> Path:
    """kbflow's folder in the user's cache: $XDG_CACHE_HOME/kbflow (~/.cache/kbflow), for files derived from
    installed packages (the ONNX export, the joined Whisper weights)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kbflow"


def cpu_info(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The first processor's fields in /proc/cpuinfo (``model name``, ``flags``, ...); empty where there is none
    (not Linux) or it cannot be read."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    return fields


# How often a thread that wants the GIL gets it from one that runs Python, during an ingest: the embedding thread
# hands each of the model's operations to torch (which releases the GIL while it runs), and between two of them
# waited up to Python's 5 ms for the chunking thread's turn to end, leaving the model's cores idle. Measured:
# docs/benchmarks.md (research/gil_switch_interval.py)
INGEST_SWITCH_INTERVAL_S = 0.0005
_switch_lock = threading.Lock()
_switch_users = 0
_switch_before = 0.005


@contextmanager
def quick_gil_handoffs():
    """Python's thread switch interval at ``INGEST_SWITCH_INTERVAL_S`` (or the process's own, if lower) while any
    run in this process is inside the block; the process's value again once the last one leaves."""
    global _switch_users, _switch_before
    with _switch_lock:
        if _switch_users == 0:
            _switch_before = sys.getswitchinterval()
            if _switch_before > INGEST_SWITCH_INTERVAL_S:
                sys.setswitchinterval(INGEST_SWITCH_INTERVAL_S)
        _switch_users += 1
    try:
        yield
    finally:
        with _switch_lock:
            _switch_users -= 1
            if _switch_users == 0 and _switch_before > INGEST_SWITCH_INTERVAL_S:
                sys.setswitchinterval(_switch_before)


def check_not_a_starting_worker() -> None:
    """Refuse a run inside a worker process that is still starting. Workers are spawned, and spawning runs the
    program's main module again in each: a script that calls kbflow at its top level would start a second run there,
    which waits for the first's namespace (or its Prefect flow run) while the first waits for the worker."""
    import multiprocessing

    from kbflow.core.errors import WorkerStartError

    if getattr(multiprocessing.current_process(), "_inheriting", False):  # set while a spawned child bootstraps
        raise WorkerStartError("kbflow was called while this process was starting as another kbflow run's worker: "
                               "spawning a worker runs the program's main module again, so a Python script must "
                               "call kbflow under `if __name__ == \"__main__\":`")

