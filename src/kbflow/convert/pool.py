"""A process pool for conversions whose per-job timeout really ends a stuck worker.

``concurrent.futures`` cannot stop one running job: a worker stuck in a C parser keeps its slot until the pool dies.
Here each worker is a process of its own with a pipe; a job past its deadline gets its worker killed (SIGKILL) and
replaced, and a worker that dies on its own (a crash in native code, the OOM killer) is reported the same way.
Workers are spawned, never forked: the parent holds torch and Prefect threads.
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.connection import wait
from typing import Callable


READY = "ready"
STARTUP_TIMEOUT_S = 300  # a spawned worker imports the converters first; that is not the job's time


def _worker_main(conn, function) -> None:
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
    def __init__(self, context, function):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, function), daemon=True)
        self.process.start()
        child.close()
        self.job: int | None = None
        self.deadline = 0.0

    def wait_ready(self) -> None:
        """Block until the worker has imported what it needs, so a job's clock starts when the job does."""
        if not self.conn.poll(STARTUP_TIMEOUT_S) or self.conn.recv() != READY:
            self.kill()
            raise RuntimeError(f"a conversion worker did not start within {STARTUP_TIMEOUT_S} s")

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()


class KillablePool:
    """``map`` a picklable top-level function over argument tuples with a per-job timeout."""

    def __init__(self, workers: int, function: Callable):
        self.context = multiprocessing.get_context("spawn")
        self.function = function
        self.workers = [_Worker(self.context, function) for _ in range(workers)]
        for worker in self.workers:  # started together, awaited one by one
            worker.wait_ready()

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
                    worker.job, worker.deadline = index, time.monotonic() + timeout_s
                    worker.conn.send((index, jobs[index]))
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
                if worker.deadline <= now:
                    busy.pop(conn)
                    results[worker.job] = on_timeout(worker.job)
                    self._replace(worker)
        return results

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        replacement = _Worker(self.context, self.function)
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
