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
    with NamespaceLock(tmp_path / "a", "a"), NamespaceLock(tmp_path / "b", "b"):
        pass
