import json
import os
import socket
import subprocess
import sys

import pytest

from kbflow.state.lock import NamespaceLock, NamespaceLocked


def test_second_writer_is_refused_with_owner_and_start(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock_file = tmp_path / "ingest.lock"
        lock_file.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "started": 0}))
        with pytest.raises(NamespaceLocked, match=f"pid {holder.pid}"):
            NamespaceLock(tmp_path, "ns").acquire()
    finally:
        holder.kill()
        holder.wait()


def test_lock_of_a_dead_owner_is_taken_over(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "ingest.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": 0}))
    with NamespaceLock(tmp_path, "ns") as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    assert not (tmp_path / "ingest.lock").exists()


def test_namespaces_lock_independently(tmp_path):
    with NamespaceLock(tmp_path / "a", "a") as a:
        with NamespaceLock(tmp_path / "b", "b") as b:  # a held: b is still free to take
            assert a.path != b.path
            for lock in (a, b):
                assert json.loads(lock.path.read_text())["pid"] == os.getpid()
            with pytest.raises(NamespaceLocked, match="namespace 'a' is being ingested"):
                NamespaceLock(tmp_path / "a", "a").acquire()  # b taken: a is still held
        assert not b.path.exists() and a.path.exists()  # releasing b leaves a held
        with pytest.raises(NamespaceLocked, match="namespace 'a'"):
            NamespaceLock(tmp_path / "a", "a").acquire()
        with NamespaceLock(tmp_path / "b", "b"):  # and b can be taken again while a is held
            pass
    assert not a.path.exists()


# -- locks that heal: what an operator finds in a state folder after a bad day ---------------------------------------

def _dead_pid() -> int:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


@pytest.mark.parametrize("record", [
    {"pid": "DEAD", "host": "HERE", "started": "yesterday"},  # hand-written: a string start time
    {"pid": "DEAD", "host": "HERE"},  # no start time at all
])
def test_a_hand_written_record_of_a_dead_process_here_is_taken_over(tmp_path, record):
    record = {key: (_dead_pid() if value == "DEAD" else socket.gethostname() if value == "HERE" else value)
              for key, value in record.items()}
    (tmp_path / "ingest.lock").write_text(json.dumps(record))
    with NamespaceLock(tmp_path, "ns") as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_a_foreign_record_is_reported_as_far_as_it_reads_with_the_command_that_removes_it(tmp_path):
    lock = tmp_path / "ingest.lock"
    lock.write_text(json.dumps({"pid": "x1", "host": "build-7", "started": "2026-12-01T03:00"}))
    with pytest.raises(NamespaceLocked) as refused:
        NamespaceLock(tmp_path, "ns").acquire()
    message = str(refused.value)
    assert "unreadable pid ('x1')" in message and "on build-7" in message and "unreadable time" in message
    assert f"rm '{lock}'" in message


@pytest.mark.parametrize("content,words", [(b"", "is empty"), (b"\x00\x01garbage", "not a kbflow lock record"),
                                           (b"[1, 2]", "not a JSON object")])
def test_a_damaged_lock_file_is_named_with_the_fix_and_an_old_empty_one_is_taken_over(tmp_path, content, words):
    lock = tmp_path / "ingest.lock"
    lock.write_bytes(content)
    with pytest.raises(NamespaceLocked) as refused:
        NamespaceLock(tmp_path, "ns").acquire()
    assert words in str(refused.value) and f"rm '{lock}'" in str(refused.value)
    if not content:  # a record still empty a minute after its file was made: its writer died before writing it
        old = lock.stat().st_mtime - 120
        os.utime(lock, (old, old))
        with NamespaceLock(tmp_path, "ns"):
            assert json.loads(lock.read_text())["pid"] == os.getpid()


def test_a_lock_replaced_by_a_folder_is_taken_over_when_empty_and_named_otherwise(tmp_path):
    (tmp_path / "manifest.parquet").write_bytes(b"kept")  # the state folder outlives the lock
    lock = tmp_path / "ingest.lock"
    lock.mkdir()
    with NamespaceLock(tmp_path, "ns"):
        assert lock.is_file()
    lock.mkdir()
    (lock / "keep.txt").write_text("someone's file")
    with pytest.raises(NamespaceLocked, match="is a folder, not a lock file"):
        NamespaceLock(tmp_path, "ns").acquire()


def test_a_writer_of_another_process_is_waited_for_naming_it(tmp_path):
    """flow.lock_wait_s covers writers of other processes too: the wait reports the holder, and a wait that runs
    out ends with the holder's error and the time waited."""
    import time

    from kbflow.runtime import progress
    from kbflow.state.lock import namespace_lock

    ready = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time, pathlib\n"
        "from kbflow.state.lock import namespace_lock\n"
        f"with namespace_lock({str(tmp_path)!r}, 'ns'):\n"
        f"    pathlib.Path({str(ready)!r}).write_text('x')\n"
        "    time.sleep(4)\n")])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert holder.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(NamespaceLocked) as gave_up:
            with namespace_lock(tmp_path, "ns", wait_s=0.5):
                pass
        assert f"pid {holder.pid}" in str(gave_up.value) and "waited" in str(gave_up.value)
        events = []
        started = time.monotonic()
        with progress.listening(lambda stage, done, total: events.append(stage)):
            with namespace_lock(tmp_path, "ns", wait_s=60):
                waited = time.monotonic() - started
        assert waited > 0.5 and any(f"pid {holder.pid}" in stage for stage in events), events
    finally:
        holder.kill()
        holder.wait()
