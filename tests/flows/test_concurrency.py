"""One process, many writes: threads writing one namespace queue behind its in-process lock instead of failing;
threads writing different namespaces run side by side; readers search throughout. Every write lands, verify finds
nothing wrong, nobody sees an exception; and no lock message asks a user to remove the lock of a live run."""

from __future__ import annotations

import threading

import pytest

from kbflow import KnowledgeBase, api
from kbflow.state.lock import NamespaceLocked, namespace_lock
from kbflow.state.manifest import NamespaceState

TOPICS = ["backups", "restores", "snapshots", "replication", "indexes", "queries", "schemas", "migrations"]


def _text(writer: int, number: int) -> str:
    topic = TOPICS[(writer + number) % len(TOPICS)]
    return f"# Note {writer}-{number}\n\nWriter {writer} wrote note {number} about {topic} and how to plan {topic}.\n"


def _run(writers: dict[str, list[tuple[str, str]]], data_dir, readers: int = 1) -> list[BaseException]:
    """Each writer thread adds its texts (``namespace`` → [(doc_id, text)] per thread) through its own
    KnowledgeBase; ``readers`` threads search every namespace until the writers are done. Returns every exception."""
    errors: list[BaseException] = []
    done = threading.Event()

    def write(namespace: str, texts: list[tuple[str, str]]) -> None:
        kb = KnowledgeBase(namespace, data_dir=data_dir)
        try:
            for index, (doc_id, text) in enumerate(texts):
                summary = kb.add_text(text, doc_id)
                assert summary["documents"]["failed"] == 0, summary["failures"]
                if index == 0:
                    first_written.wait()  # readers start once every namespace exists
        except BaseException as exc:  # noqa: BLE001 - collected and asserted on in the test's thread
            errors.append(exc)
            first_written.abort()

    def read() -> None:
        try:
            first_written.wait()
            kbs = [KnowledgeBase(namespace, data_dir=data_dir) for namespace in sorted(writers)]
            while not done.wait(0.2):  # a search every 0.2 s per namespace: readers share the cores with writers
                for kb in kbs:
                    assert kb.search("how to plan backups", limit=3)
        except threading.BrokenBarrierError:
            pass  # a writer failed: its error is the one reported
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads_of = [(namespace, texts) for namespace, per_thread in writers.items() for texts in per_thread]
    first_written = threading.Barrier(len(threads_of) + readers)
    writing = [threading.Thread(target=write, args=item) for item in threads_of]
    reading = [threading.Thread(target=read) for _ in range(readers)]
    for thread in writing + reading:
        thread.start()
    for thread in writing:
        thread.join()
    done.set()
    for thread in reading:
        thread.join()
    return errors


def _all_present(data_dir, namespace: str, doc_ids: set[str]) -> None:
    manifest = NamespaceState(data_dir, namespace).read_manifest()
    assert set(manifest.column("source_path").to_pylist()) == {f"text:{doc_id}" for doc_id in doc_ids}
    report = api.verify(namespace, data_dir=data_dir)
    assert report["ok"], report["findings"]
    assert report["counts"]["store_documents"] == len(doc_ids)


def test_threads_writing_one_namespace_queue_and_every_write_lands(tmp_path, counting):
    data_dir = tmp_path / "data"
    per_thread = [[(f"w{w}-{n}", _text(w, n)) for n in range(3)] for w in range(3)]
    errors = _run({"same": per_thread}, data_dir, readers=2)
    assert not errors, errors
    _all_present(data_dir, "same", {doc_id for texts in per_thread for doc_id, _ in texts})


def test_threads_writing_different_namespaces_run_side_by_side(tmp_path, counting):
    data_dir = tmp_path / "data"
    writers = {f"ns{w}": [[(f"n{w}-{n}", _text(w, n)) for n in range(2)]] for w in range(3)}
    writers["ns0"].append([(f"extra-{n}", _text(7, n)) for n in range(2)])  # and two threads on one of them
    errors = _run(writers, data_dir, readers=1)
    assert not errors, errors
    for namespace, per_thread in writers.items():
        _all_present(data_dir, namespace, {doc_id for texts in per_thread for doc_id, _ in texts})


def test_a_write_that_waits_too_long_gives_up_without_telling_anyone_to_remove_a_lock(tmp_path):
    state = NamespaceState(tmp_path / "data", "busy")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with namespace_lock(state.root, "busy"):
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        held.wait()
        with pytest.raises(NamespaceLocked) as refused:
            with namespace_lock(state.root, "busy", wait_s=0.2):
                pass
        assert "another thread of this process" in str(refused.value)
        assert "remove" not in str(refused.value)
    finally:
        release.set()
        holder.join()
    with namespace_lock(state.root, "busy", wait_s=0.2):  # released: free again
        with pytest.raises(NamespaceLocked) as nested:  # a write inside a write of the same thread: no waiting
            with namespace_lock(state.root, "busy"):
                pass
    assert "this same thread" in str(nested.value) and "remove" not in str(nested.value)


def test_a_lock_file_of_this_very_process_is_never_called_stale(tmp_path):
    """The lock file of a live run of this process (another path to the same data dir, say) is not for removing."""
    import json
    import os
    import socket

    from kbflow.state.lock import NamespaceLock

    (tmp_path / "ingest.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                      "started": 0}))
    with pytest.raises(NamespaceLocked) as refused:
        NamespaceLock(tmp_path, "ns").acquire()
    assert f"pid {os.getpid()}" in str(refused.value) and "remove" not in str(refused.value)
