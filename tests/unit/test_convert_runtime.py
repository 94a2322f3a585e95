"""How conversions run: the killable worker pool, the per-document cache that never keeps a failure, ZIP members."""

from __future__ import annotations

import os
import time
import zipfile

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch
from kbflow.convert.cache import ConversionCache
from kbflow.convert.pool import KillablePool
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


def test_a_worker_that_dies_is_reported_and_replaced():
    with KillablePool(1, exit_with) as pool:
        results = pool.map([(3,)], timeout_s=30, on_timeout=lambda i: "timeout", on_crash=lambda i, code: code)
        assert results == [3]
        assert pool.workers[0].process.is_alive()


def test_pool_timeout_becomes_a_failure_row(tmp_path, monkeypatch):
    """End to end through convert_batch: a huge HTML page is still being parsed when its time is up."""
    slow = tmp_path / "docs" / "slow.html"
    slow.parent.mkdir()
    slow.write_text("<html><body>" + "<p>word " * 400_000 + "</body></html>")
    (tmp_path / "docs" / "quick.md").write_text("# Quick\n\nfine\n")
    sources = scan([tmp_path / "docs"], "ns", ["*"], [".*"])
    table = convert_batch(sources, ConvertConfig(workers=2, timeout_s=2))
    rows = {row["source_path"]: row for row in table.to_pylist()}
    assert rows["docs/quick.md"]["status"] == "ok"
    assert rows["docs/slow.html"]["status"] == "failed"
    assert "took over convert.timeout_s (2 s) and its worker was stopped" in rows["docs/slow.html"]["error"]


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
