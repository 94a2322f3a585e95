"""How conversions run: the killable worker pool, the per-document cache that never keeps a failure, ZIP members."""

from __future__ import annotations

import os
import threading
import time
import zipfile

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch
from kbflow.convert.cache import ConversionCache
from kbflow.convert.pool import KillablePool, can_nice, cpu_seconds
from kbflow.convert.scan import scan
from tests.conftest import CASES


def sleep_then_pid(seconds: float) -> int:
    """A job for the pool (top level, so spawned workers can import it)."""
    time.sleep(seconds)
    return os.getpid()


def exit_with(code: int) -> int:
    os._exit(code)


def test_a_stuck_job_is_killed_at_its_timeout_and_the_others_finish():
    with KillablePool(2, sleep_then_pid) as pool:
        stuck_pids = {w.process.pid for w in pool.workers}
        started = time.monotonic()
        results = pool.map([(0.1,), (60,), (0.1,), (0.1,)], timeout_s=3, on_timeout=lambda i: f"timeout {i}",
                           on_crash=lambda i, code: f"crash {i}")
        elapsed = time.monotonic() - started
        assert results[1] == "timeout 1" and all(isinstance(results[i], int) for i in (0, 2, 3))
        assert elapsed < 20  # nobody waited for the 60 s job
        assert len(pool.workers) == 2 and all(w.process.is_alive() for w in pool.workers)
        killed = stuck_pids - {w.process.pid for w in pool.workers}
        assert len(killed) == 1
        pid = killed.pop()
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def burn_cpu(seconds: float) -> str:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return "burnt"


NICING = pytest.mark.skipif(not can_nice(), reason="workers are niced only where their CPU time can be read (Linux)")


@NICING
def test_niced_workers_time_a_job_by_the_cpu_it_got_within_a_wall_time_bound():
    """A niced worker waits for the cores the parent's model leaves it; a job that waited is not a stuck job. A job
    without CPU (asleep here, as a starved one is) runs past its limit in wall time up to NICED_WALL_FACTOR times
    it; one that used its limit of CPU is stopped; at equal priority the limit is wall time."""
    own = niceness()
    timeout = lambda i: "timeout"  # noqa: E731
    crash = lambda i, code: "crash"  # noqa: E731
    with KillablePool(1, niceness, nice=7) as pool:
        assert pool.map([()], 30, timeout, crash) == [max(7, own)]
    with KillablePool(1, sleep_then_pid, nice=7) as pool:
        started = time.monotonic()
        assert isinstance(pool.map([(2.5,)], 1, timeout, crash)[0], int)  # 2.5 s asleep with a 1 s limit: let run
        assert pool.map([(60,)], 1, timeout, crash) == ["timeout"]  # but not past 4 x the limit
        assert time.monotonic() - started < 2.5 + 4 + 5
    with KillablePool(1, burn_cpu, nice=7) as pool:  # a job that used its 1 s of CPU: stopped at once
        worker = pool.workers[0]
        worker.start(0, (60,), 1, True)
        while cpu_seconds(worker.process.pid) - worker.cpu_at_start < 1:
            time.sleep(0.05)
        assert not worker.extended(1, time.monotonic())
        worker.kill()
    with KillablePool(1, sleep_then_pid) as pool:
        assert pool.map([(2.5,)], 1, timeout, crash) == ["timeout"]  # equal priority: wall time


@NICING
def test_conversion_workers_run_at_convert_worker_nice(tmp_path):
    from kbflow.convert.converters import run_conversion_pool

    for name in ("a.md", "b.md"):
        (tmp_path / name).write_text(f"# {name}\n\ntext\n")
    sources = scan([tmp_path], "ns", ["*"], [".*"])
    with run_conversion_pool() as pool:
        assert convert_batch(sources, ConvertConfig(workers=2, worker_nice=5)).column("status").to_pylist() == ["ok"] * 2
        assert [os.getpriority(os.PRIO_PROCESS, w.process.pid) for w in pool._pool.workers] == [max(5, niceness())] * 2
        convert_batch(sources, ConvertConfig(workers=2, worker_nice=0))  # another niceness: other workers
        assert [os.getpriority(os.PRIO_PROCESS, w.process.pid) for w in pool._pool.workers] == [niceness()] * 2


def test_a_worker_that_dies_is_reported_and_replaced():
    with KillablePool(1, exit_with) as pool:
        results = pool.map([(3,)], timeout_s=30, on_timeout=lambda i: "timeout", on_crash=lambda i, code: code)
        assert results == [3]
        assert pool.workers[0].process.is_alive()


class ExitsWhenUnpickled:
    """A pool function whose unpickling in the new process ends it with exit code 5: a worker that dies before it
    is ready (an import that crashes, a script without a main guard re-run in the child)."""

    def __reduce__(self):
        return (os._exit, (5,))

    def __call__(self, *args):
        raise AssertionError("never called")


def test_a_worker_that_exits_while_starting_is_a_clear_error_and_no_worker_is_left_running():
    import multiprocessing

    from kbflow.core.errors import WorkerStartError

    with pytest.raises(WorkerStartError, match=r"exited while starting \(exit code 5\).*if __name__ == "):
        KillablePool(2, ExitsWhenUnpickled())
    assert multiprocessing.active_children() == []


def test_a_worker_killed_between_jobs_is_replaced_and_the_next_job_runs():
    """An idle worker the OOM killer (or anyone) ends between two batches: the next batch's job goes to a new
    worker instead of failing the batch on the dead one's pipe."""
    import signal

    with KillablePool(1, sleep_then_pid) as pool:
        dead = pool.workers[0].process
        os.kill(dead.pid, signal.SIGKILL)
        dead.join(5)
        [pid] = pool.map([(0,)], timeout_s=30, on_timeout=lambda i: "timeout", on_crash=lambda i, code: "crash")
        assert pid != dead.pid and pid == pool.workers[0].process.pid


def test_pool_timeout_becomes_a_failure_row(tmp_path):
    """End to end through convert_batch: a document whose conversion can never finish is stopped at its timeout.

    No guess at how long a parse takes: after the scan, ``stuck.html`` is swapped for a named pipe that nobody
    writes to, so the worker's read of it blocks in open() until the worker is killed. A safety valve opens the pipe
    for writing after 60 s (only if the pool never killed the reader), so a broken timeout fails this test instead
    of hanging it."""
    stuck = tmp_path / "docs" / "stuck.html"
    stuck.parent.mkdir()
    stuck.write_text("<html><body><p>never read</p></body></html>")
    (tmp_path / "docs" / "quick.md").write_text("# Quick\n\nfine\n")
    sources = scan([tmp_path / "docs"], "ns", ["*"], [".*"])
    stuck.unlink()
    os.mkfifo(stuck)  # same path, same scanned size and hash: only reading it differs

    finished = threading.Event()

    def safety_valve():
        if finished.wait(60):
            return
        try:  # a reader still blocked in open(): let it through, with bytes that convert fine
            fd = os.open(stuck, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: nobody reads, the pool did kill the worker
            return
        os.write(fd, b"<html><body><p>released by the test</p></body></html>")
        os.close(fd)

    valve = threading.Thread(target=safety_valve, daemon=True)
    valve.start()
    try:
        # 5 s: quick.md's budget, not stuck's; workers at equal priority, so the limit is wall time
        table = convert_batch(sources, ConvertConfig(workers=2, timeout_s=5, worker_nice=0))
    finally:
        finished.set()
        valve.join()
    rows = {row["source_path"]: row for row in table.to_pylist()}
    assert rows["docs/quick.md"]["status"] == "ok"
    assert rows["docs/stuck.html"]["status"] == "failed", rows["docs/stuck.html"]
    assert "took over convert.timeout_s (5 s) and its worker was stopped" in rows["docs/stuck.html"]["error"]


def test_failures_are_never_cached_successes_are(tmp_path):
    source = scan([CASES / "docs" / "search.md"], "ns", ["*"], [".*"])
    cache = ConversionCache(tmp_path / "cache")
    failed = convert_batch(source, ConvertConfig(max_file_mb=0.0001), cache)  # fails for a passing reason
    assert failed.column("status").to_pylist() == ["failed"]
    assert not list((tmp_path / "cache").rglob("*.json"))
    ok = convert_batch(source, ConvertConfig(), cache)
    assert ok.column("status").to_pylist() == ["ok"] and len(list((tmp_path / "cache").rglob("*.json"))) == 1
    again = convert_batch(source, ConvertConfig(), cache)  # served from the cache: same row
    assert again.to_pylist() == ok.to_pylist()


def test_zip_members_are_documents_of_their_own(tmp_path):
    archive = tmp_path / "kit" / "manuals.zip"
    archive.parent.mkdir()
    with zipfile.ZipFile(archive, "w") as handle:
        handle.write(CASES / "formats" / "crazyones.pdf", "pdf/crazy ones.pdf")
        handle.writestr("notes/读我.md", "# 读我\n\n压缩包里的文件。\n")
        handle.writestr("notes/.hidden", "skipped like any hidden file")
    sources = scan([tmp_path / "kit"], "ns", ["*"], [".*"])
    assert [s.source_path for s in sources] == ["kit/manuals.zip!/notes/读我.md", "kit/manuals.zip!/pdf/crazy ones.pdf"]
    rows = convert_batch(sources).to_pylist()
    assert [row["status"] for row in rows] == ["ok", "ok"]
    assert "压缩包里的文件" in rows[0]["markdown"] and "crazy ones" in rows[1]["markdown"].lower()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["kit", "manuals.zip"]  # nothing was extracted


def test_cache_keys_depend_only_on_what_a_format_uses():
    from kbflow.convert.converters import converter_fingerprint, format_fingerprint

    offline, remote = ConvertConfig(audio_backend="pocketsphinx"), ConvertConfig(audio_backend="dashscope")
    assert converter_fingerprint(offline) != converter_fingerprint(remote)  # the manifest sees every option
    assert format_fingerprint(offline, "a.pdf") == format_fingerprint(remote, "a.pdf")
    assert format_fingerprint(offline, "a.wav") != format_fingerprint(remote, "a.wav")
    assert format_fingerprint(offline, "a.pdf") != format_fingerprint(ConvertConfig(ocr_pdf_dpi=300), "a.pdf")


def _auto_workers_in_this_process(queue) -> None:
    from kbflow.convert.converters import conversion_workers

    queue.put(conversion_workers(ConvertConfig(), 10_000))


def test_auto_workers_are_one_per_core_for_a_large_job_and_in_process_otherwise():
    import multiprocessing

    from kbflow.convert.converters import AUTO_WORKERS_MAX, AUTO_WORKERS_MIN_FILES, conversion_workers

    auto = ConvertConfig()
    assert auto.workers == "auto"
    assert conversion_workers(auto, AUTO_WORKERS_MIN_FILES - 1) == 1
    assert conversion_workers(auto, AUTO_WORKERS_MIN_FILES) == max(1, min(len(os.sched_getaffinity(0)),
                                                                          AUTO_WORKERS_MAX))
    assert conversion_workers(ConvertConfig(workers=3), 1) == 3 and conversion_workers(ConvertConfig(workers=1),
                                                                                        10_000) == 1
    # a daemon process (a Dask worker) may not start children: 'auto' converts in it
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    daemon = context.Process(target=_auto_workers_in_this_process, args=(queue,), daemon=True)
    daemon.start()
    try:
        assert queue.get(timeout=120) == 1
    finally:
        daemon.join(10)
