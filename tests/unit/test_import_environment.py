"""Importing the library changes nothing in the process's environment: a notebook or a service that imports
kbflow keeps its own settings (the command line and the flows set their defaults where they start)."""

import json
import os
import subprocess
import sys


def test_importing_kbflow_sets_no_environment_variables():
    code = ("import json, os; before = dict(os.environ); import kbflow, kbflow.api, kbflow.kb, kbflow.ops.verify; "
            "from kbflow import KnowledgeBase; after = dict(os.environ); "
            "print(json.dumps(sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))))")
    env = {key: value for key, value in os.environ.items()
           if key not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "PREFECT_LOGGING_LEVEL", "MALLOC_ARENA_MAX",
                          "ARROW_DEFAULT_MEMORY_POOL", "HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []
