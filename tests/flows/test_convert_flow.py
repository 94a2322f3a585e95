"""Bad input through the real ingest flow: one failures row each, the rest ingested; a failure is never cached."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import yaml

from kbflow.flows.ingest import ingest
from tests.conftest import CASES
from kbflow.testing.fake_services import FakeServices

KEY = "sk-test-not-a-real-key-1234567890"


def test_bad_files_become_failure_rows_and_the_rest_is_ingested(tmp_path, counting):
    docs = tmp_path / "bad"
    shutil.copytree(CASES / "bad", docs)
    data = tmp_path / "data"
    summary = ingest(sources=[str(docs)], data_dir=str(data))
    bad = {"broken.pdf", "empty.docx", "encrypted.pdf", "malformed.epub", "random-bytes.docx", "random-bytes.pdf",
           "random.xlsx", "truncated.docx", "zip-slip.zip!/../../x"}
    assert summary["documents"]["new"] == len(bad) + 2 and summary["documents"]["failed"] == len(bad)
    failures = pq.read_table(data / "runs" / "default" / summary["run_id"] / "failures.parquet").to_pylist()
    assert sorted(f["source_path"] for f in failures) == sorted(f"bad/{name}" for name in bad)
    assert all(f["stage"] == "convert" and f["error_type"] == "ConversionError" and f["source_path"] in f["message"]
               for f in failures)
    documents = pq.read_table(data / "runs" / "default" / summary["run_id"] / "documents").to_pylist()
    ok = {d["source_path"]: d for d in documents if d["status"] == "ok"}
    assert sorted(ok) == ["bad/zip-slip.zip!/docs/inside.md", "bad/名字 with spaces.md"]
    assert {d["encoding"] for d in ok.values()} == {"utf-8"}
    assert summary["store"]["count"] >= 2


def test_a_transient_conversion_failure_is_retried_by_the_next_run(tmp_path, counting, monkeypatch):
    """DashScope answers 500 in the first run and works in the second: the second run must convert the file again
    (a batch cache that kept the failure would replay it)."""
    with FakeServices(key=KEY) as server:
        server.script = [(500,)]
        monkeypatch.setenv("KBFLOW_TEST_DASHSCOPE_KEY", KEY)
        config = tmp_path / "kbflow.yaml"
        config.write_text(yaml.safe_dump({"convert": {
            "audio_backend": "dashscope", "dashscope": {"api_key_env": "KBFLOW_TEST_DASHSCOPE_KEY",
                                                        "base_url": server.url, "retries": 0}}}))
        audio = tmp_path / "voice"
        audio.mkdir()
        shutil.copy(CASES / "formats" / "conf-onlyperson.wav", audio / "conf-onlyperson.wav")
        data = str(tmp_path / "data")

        first = ingest(sources=[str(audio)], data_dir=data, config_path=str(config))
        assert first["documents"]["failed"] == 1
        assert first["failures"][0]["error_type"] == "TransientError"

        server.transcripts = ["You are currently the only person in this conference."]
        second = ingest(sources=[str(audio)], data_dir=data, config_path=str(config))
        assert second["documents"]["failed"] == 0 and second["documents"]["new"] == 1
        assert second["store"]["count"] == 1 and len(server.requests) == 2


def test_a_script_without_a_main_guard_gets_an_error_that_names_the_guard(tmp_path):
    """Conversion workers are spawned, and spawning runs the program's main module again: a script that calls
    kbflow at its top level has its child run the script instead of starting. The run must end with an error that
    names the fix, not hang on the child or raise a bare EOFError from the pipe."""
    import subprocess
    import sys

    from tests.flows.conftest import subprocess_env

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(CASES / "docs" / "tutorial-concepts.html", docs / "a.html")
    shutil.copy(CASES / "formats" / "debian-handbook-zh-rights.html", docs / "b.html")
    script = tmp_path / "unguarded.py"
    script.write_text("import sys\nfrom kbflow import api\napi.ingest([sys.argv[1]], 'docs', None, sys.argv[2])\n")
    done = subprocess.run([sys.executable, str(script), str(docs), str(tmp_path / "data")], capture_output=True,
                          text=True, timeout=150, cwd=tmp_path,
                          env=subprocess_env(KBFLOW__EMBEDDER__BACKEND="local", KBFLOW__CONVERT__WORKERS="2"))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("kbflow.core.errors.WorkerStartError: a conversion worker process exited while starting"), \
        done.stderr[-3000:]
    assert 'if __name__ == "__main__":' in last
