"""A progress listener belongs to the run (the context) that installed it: runs in other threads neither receive
its events nor replace it, and runs that end out of order leave each other's listeners as they were."""

import contextvars
import threading

from kbflow.runtime import progress


def test_overlapping_runs_in_threads_keep_their_own_listeners():
    heard: dict[str, list[str]] = {"a": [], "b": [], "main": []}
    a_installed, b_installed, b_done = threading.Event(), threading.Event(), threading.Event()

    def run_a():
        with progress.listening(lambda stage, done, total: heard["a"].append(stage)):
            a_installed.set()
            b_installed.wait()
            progress.report("a1", 1, 1)  # b installed its listener meanwhile: this is still a's
            b_done.wait()
            progress.report("a2", 1, 1)  # b ended first: a's listener is still in place
        progress.report("after-a", 1, 1)

    def run_b():
        a_installed.wait()
        with progress.also_listening(lambda stage, done, total: heard["b"].append(stage)):
            b_installed.set()
            progress.report("b1", 1, 1)
        b_done.set()

    with progress.listening(lambda stage, done, total: heard["main"].append(stage)):
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(run,)) for run in (run_a, run_b)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        progress.report("main", 1, 1)
    progress.report("nobody", 1, 1)
    # b kept informing what it found installed (main's listener, whose context it was started in): also_listening
    assert heard == {"a": ["a1", "a2"], "b": ["b1"], "main": ["b1", "after-a", "main"]}
