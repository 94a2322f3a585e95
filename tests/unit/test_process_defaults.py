"""What importing kbflow sets for the process: OpenMP threads that sleep instead of spinning and a tokenizer without
its own thread pool (an ingest's model shares two cores with conversion and chunking: docs/benchmarks.md). They
must be in the environment before torch loads OpenMP, and a value the user set is kept."""

import json
import os
import subprocess
import sys

PROBE = ("import json, os, kbflow, torch; print(json.dumps({k: os.environ.get(k) for k in "
         "('OMP_WAIT_POLICY', 'TOKENIZERS_PARALLELISM')}))")


def run(env: dict) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "TOKENIZERS_PARALLELISM")}
    done = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env}, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_kbflow_sets_passive_openmp_and_a_serial_tokenizer_before_torch_loads():
    assert run({}) == {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}


def test_values_the_user_set_are_kept():
    assert run({"OMP_WAIT_POLICY": "ACTIVE", "TOKENIZERS_PARALLELISM": "true"}) == {
        "OMP_WAIT_POLICY": "ACTIVE", "TOKENIZERS_PARALLELISM": "true"}


def test_an_ingest_hands_the_gil_over_quickly_while_it_runs_and_gives_the_process_its_own_interval_back(tmp_path,
                                                                                                       monkeypatch):
    """During an ingest Python's switch interval is 0.5 ms (the embedding thread waits less for the chunking
    thread's turn to end, docs/benchmarks.md); runs at once in threads keep it until the last one ends; a lower
    interval the process set itself is kept; after the runs the process has its own value back."""
    import threading

    from kbflow import api
    from kbflow.runtime.environment import INGEST_SWITCH_INTERVAL_S, quick_gil_handoffs

    seen: list[float] = []
    original = sys.getswitchinterval()
    sys.setswitchinterval(0.004)
    try:
        from kbflow.search import tokens

        terms = tokens.terms  # the chunk stage's BM25 terms: called while the run chunks
        with monkeypatch.context() as patch:
            patch.setattr(tokens, "terms", lambda text: seen.append(sys.getswitchinterval()) or terms(text))
            api.add_text("a sentence about backups", doc_id="one", data_dir=tmp_path)
        assert seen and set(seen) == {INGEST_SWITCH_INTERVAL_S} and sys.getswitchinterval() == 0.004

        inside, leave = threading.Event(), threading.Event()

        def long_run():
            with quick_gil_handoffs():
                inside.set()
                leave.wait(10)

        other = threading.Thread(target=long_run)
        other.start()
        inside.wait(10)
        with quick_gil_handoffs():
            assert sys.getswitchinterval() == INGEST_SWITCH_INTERVAL_S
        assert sys.getswitchinterval() == INGEST_SWITCH_INTERVAL_S  # the other run is still going
        leave.set()
        other.join()
        assert sys.getswitchinterval() == 0.004
        sys.setswitchinterval(0.0001)
        low = sys.getswitchinterval()  # as Python keeps it (whole microseconds)
        with quick_gil_handoffs():
            assert sys.getswitchinterval() == low
        assert sys.getswitchinterval() == low
    finally:
        sys.setswitchinterval(original)
