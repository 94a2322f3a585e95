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
