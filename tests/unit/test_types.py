"""The type checker runs over kbflow (``[tool.mypy]`` in pyproject.toml: src/kbflow, flows, tasks), and the seam the
whole design rests on — the engine handing stage calls to a runner — is typed end to end: a stage called with the
wrong arguments, or its result used as the wrong type, is an error before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

mypy_api = pytest.importorskip("mypy.api", reason="mypy is a test dependency: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parents[2]


def _mypy(*args: str) -> tuple[str, int]:
    out, err, status = mypy_api.run(["--config-file", str(ROOT / "pyproject.toml"), "--no-error-summary", *args])
    return out + err, status


def test_kbflow_type_checks_clean():
    out, status = _mypy()
    assert status == 0, out


def test_a_stage_called_with_the_wrong_arguments_or_result_type_is_a_type_error(tmp_path):
    # line 7 uses a stage with a typed result (index: dict): pyarrow ships no type information, so a pa.Table
    # result is Any to mypy and assigning it to an int is no error
    wrong = tmp_path / "wrong_stage_call.py"
    wrong.write_text(
        "from kbflow.engine import stages\n"
        "from kbflow.engine.runner import DirectRunner, call\n"
        "\n"
        "\n"
        "def use(runner: DirectRunner, documents, store) -> None:\n"
        "    runner.run(call(stages.split, documents, 2), label='one argument too many')\n"
        "    count: int = runner.run(call(stages.index, store), label='a dict, not an int')\n"
        "    runner.submit(call(stages.index), label='the store is missing')\n")
    out, status = _mypy("--follow-imports=silent", str(wrong))
    assert status == 1, out
    # by file name: mypy's incremental cache can replay a same-content module's errors under its earlier path
    lines = {int(line.split(":")[1]) for line in out.splitlines()
             if line.split(":")[0].endswith(wrong.name) and ": error:" in line}
    assert lines == {6, 7, 8}, out
