"""A process pool for conversions whose per-job timeout really ends a stuck worker.

``concurrent.futures`` cannot stop one running job: a worker stuck in a C parser keeps its slot until the pool dies.
Here each worker is a process of its own with a pipe; a job past its deadline gets its worker killed (SIGKILL) and
replaced, and a worker that dies on its own (a crash in native code, the OOM killer) is reported the same way.
Workers are spawned, never forked: the parent holds torch and Prefect threads.

Workers may run at a lower priority (``nice``), so that the embedding model in the parent gets the cores first and
conversions fill what it leaves idle. A starved worker's job must not be taken for a stuck one: where the pool can
read a worker's CPU time (Linux), a niced job's time limit counts the CPU time it got, up to
``NICED_WALL_FACTOR`` times the limit in wall time (a worker blocked without using CPU is still stopped); where it
cannot, workers are not niced.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Callable

from kbflow.core.errors import WorkerStartError


READY = "ready"
STARTUP_TIMEOUT_S = 300  # a spawned worker imports the converters first; that is not the job's time
NICED_WALL_FACTOR = 4


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds process ``pid`` has used (``/proc``), or None where that cannot be read."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def can_nice() -> bool:
    """Whether workers may be niced here: the pool can read their CPU time to time a job fairly."""
    return hasattr(os, "setpriority") and cpu_seconds(os.getpid()) is not None


def _worker_main(conn, function, nice: int = 0) -> None:
    if nice > os.getpriority(os.PRIO_PROCESS, 0):  # a parent niced further already is left as it is
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    conn.send(READY)
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        index, args = job
        conn.send((index, function(*args)))


class _Worker:
    def __init__(self, context, function, nice: int = 0):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, function, nice), daemon=True)
        self.process.start()
        child.close()
        self.job: int | None = None
        self.deadline = 0.0
        self.started = 0.0
        self.cpu_at_start: float | None = None  # of a niced worker's job

    def start(self, index: int, job: tuple, timeout_s: float, niced: bool) -> None:
        self.job, self.started = index, time.monotonic()
        self.deadline = self.started + timeout_s
        self.cpu_at_start = cpu_seconds(self.process.pid) if niced else None
        self.conn.send((index, job))

    def extended(self, timeout_s: float, now: float) -> bool:
        """Past its deadline: move it by the CPU time the job has not had yet (a niced worker whose job had less
        than ``timeout_s`` of CPU, within ``NICED_WALL_FACTOR`` x ``timeout_s`` of wall time). False: stop it."""
        if self.cpu_at_start is None or now - self.started >= timeout_s * NICED_WALL_FACTOR:
            return False
        used = cpu_seconds(self.process.pid)
        if used is None or used - self.cpu_at_start >= timeout_s:
            return False
        self.deadline = min(now + timeout_s - (used - self.cpu_at_start), self.started + timeout_s * NICED_WALL_FACTOR)
        return True

    def wait_ready(self) -> None:
        """Block until the worker has imported what it needs, so a job's clock starts when the job does."""
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise WorkerStartError(f"a conversion worker process did not start within {STARTUP_TIMEOUT_S} s; "
                                   "the machine may be out of memory or processes (check `free` and `ulimit -u`)")
        try:
            if self.conn.recv() == READY:
                return
        except (EOFError, OSError):  # it exited before saying it was ready
            pass
        self.process.join(5)
        code = self.process.exitcode
        self.kill()
        raise WorkerStartError(
            f"a conversion worker process exited while starting (exit code {code}); its own error, if any, is "
            "printed above. Workers are started with the 'spawn' method, which runs the program's main module "
            "again: a Python script that calls kbflow must do so under `if __name__ == \"__main__\":`")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class KillablePool:
    """``map`` a picklable top-level function over argument tuples with a per-job timeout; ``nice``: the workers'
    niceness (at least; 0 where ``can_nice`` is false)."""

    def __init__(self, workers: int, function: Callable, nice: int = 0):
        self.context = multiprocessing.get_context("spawn")
        self.function = function
        self.nice = nice if nice > 0 and can_nice() else 0
        self.workers = [_Worker(self.context, function, self.nice) for _ in range(workers)]
        try:
            for worker in self.workers:  # started together, awaited one by one
                worker.wait_ready()
        except WorkerStartError:  # the others are not left running
            for worker in self.workers:
                worker.kill()
            raise

    def map(self, jobs: list[tuple], timeout_s: float, on_timeout: Callable[[int], object],
            on_crash: Callable[[int, int | None], object]) -> list:
        """Results in job order; a job past ``timeout_s`` gives ``on_timeout(index)``, a worker that died gives
        ``on_crash(index, exitcode)``."""
        results: list = [None] * len(jobs)
        pending = list(range(len(jobs)))[::-1]
        busy: dict = {}
        while pending or busy:
            for worker in self.workers:
                if worker.job is None and pending:
                    index = pending.pop()
                    try:
                        worker.start(index, jobs[index], timeout_s, self.nice > 0)
                    except OSError:  # it died between jobs (the OOM killer, a signal): the job goes to a new one
                        pending.append(index)
                        self._replace(worker)
                        continue
                    busy[worker.conn] = worker
            if not busy:
                continue
            now = time.monotonic()
            ready = wait(list(busy), timeout=max(0.0, min(w.deadline for w in busy.values()) - now))
            for conn in ready:
                worker = busy.pop(conn)
                try:
                    index, result = worker.conn.recv()  # the connection `wait` found ready
                    results[index] = result
                    worker.job = None
                except (EOFError, OSError):  # the worker died mid-job
                    worker.process.join(5)
                    results[worker.job] = on_crash(worker.job, worker.process.exitcode)
                    self._replace(worker)
            now = time.monotonic()
            for conn, worker in list(busy.items()):
                if worker.deadline <= now and not worker.extended(timeout_s, now):
                    busy.pop(conn)
                    results[worker.job] = on_timeout(worker.job)
                    self._replace(worker)
        return results

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        replacement = _Worker(self.context, self.function, self.nice)
        replacement.wait_ready()
        self.workers[self.workers.index(worker)] = replacement

    def close(self) -> None:
        for worker in self.workers:
            try:
                worker.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
            worker.process.join(5)
            if worker.process.is_alive():
                worker.process.kill()
            worker.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
