"""A run's conversion workers are its own: a run that ends (here while another run's worker is still reading a
file) stops only its own workers, and the other run's conversion finishes. A named pipe holds that worker at its
read until the test writes to it, so the overlap is certain, not a matter of timing."""

from __future__ import annotations

import contextvars
import os
import threading

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch, run_conversion_pool
from kbflow.convert.scan import SourceFile


def _source(path, name: str) -> SourceFile:
    return SourceFile(doc_id=name, source_path=f"docs/{name}", abs_path=str(path), source_sha256="0" * 64, size=0,
                      mtime=0.0, mime="text/markdown")


def test_a_run_that_ends_stops_only_its_own_conversion_workers(tmp_path):
    pipe = tmp_path / "slow.md"
    os.mkfifo(pipe)
    quick = tmp_path / "quick.md"
    quick.write_text("# Quick\n\nConverted at once.\n")
    other = tmp_path / "other.md"
    other.write_text("# Other\n\nThe other run's file.\n")
    options = ConvertConfig(workers=2, timeout_s=120)
    converted: dict[str, list[dict]] = {}

    def slow_run() -> None:
        with run_conversion_pool():
            converted["slow"] = convert_batch([_source(pipe, "slow.md"), _source(quick, "quick.md")],
                                              options).to_pylist()

    slow = threading.Thread(target=contextvars.copy_context().run, args=(slow_run,))
    slow.start()
    reader_stopped = False
    writer = open(pipe, "w")  # returns once the slow run's worker has opened the pipe: it is mid-read
    try:
        with run_conversion_pool():  # a second run converts and ends meanwhile
            converted["other"] = convert_batch([_source(other, "other.md"), _source(quick, "quick.md")],
                                               options).to_pylist()
        writer.write("# Slow\n\nWritten after the other run ended.\n")
        writer.close()
    except BrokenPipeError:  # nobody reads the pipe any more: the other run's end stopped the slow run's worker
        reader_stopped = True
    slow.join(timeout=300)
    assert not reader_stopped, "the run that ended stopped the other run's conversion worker"
    assert not slow.is_alive()
    for run, rows in converted.items():
        assert [row["status"] for row in rows] == ["ok", "ok"], (run, [row["error"] for row in rows])
    assert "Written after the other run ended" in converted["slow"][0]["markdown"]
