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
