"""The cores the process's own work holds (kbflow.runtime.cores): counted while it runs, and left to it by the model."""

from __future__ import annotations

import shutil
import threading

from kbflow import api
from kbflow.runtime import cores
from kbflow.embed.base import passage_threads, torch_threads
from tests.conftest import CASES


def test_marked_work_is_counted_while_it_runs_from_any_thread_and_torch_passes_leave_its_cores():
    import torch

    torch.set_num_threads(2)
    assert cores.taken() == 0 and passage_threads() == 2
    inside, release = threading.Event(), threading.Event()

    def chunking() -> None:
        with cores.working():
            inside.set()
            release.wait(60)

    other = threading.Thread(target=chunking)
    other.start()
    inside.wait(60)
    assert cores.taken() == 1 and passage_threads() == 1
    with cores.working(2):  # two conversion workers besides
        assert cores.taken() == 3 and passage_threads() == 1  # never fewer than one
        with torch_threads(passage_threads()):
            assert torch.get_num_threads() == 1
    release.set()
    other.join(60)
    assert cores.taken() == 0 and torch.get_num_threads() == 2
    try:
        with cores.working():
            raise ValueError("a stage failed")
    except ValueError:
        pass
    assert cores.taken() == 0  # a failure gives its cores back


def test_an_ingest_marks_its_chunking_its_writes_and_its_busy_conversion_workers(tmp_path, monkeypatch, real_embedder):
    from kbflow.convert.pool import KillablePool
    from kbflow.engine import ingest, stages

    seen: dict[str, list[int]] = {"chunk": [], "upsert": [], "convert": []}

    def recording(name, function):
        def wrapper(*args, **kwargs):
            seen[name].append(cores.taken())
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(stages, "chunk", recording("chunk", stages.chunk))
    monkeypatch.setattr(ingest, "_upsert", recording("upsert", ingest._upsert))
    monkeypatch.setattr(KillablePool, "map", recording("convert", KillablePool.map))
    folder = tmp_path / "docs"
    shutil.copytree(CASES / "docs", folder)
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nembedder:\n  backend: local\nconvert:\n  workers: 2\n"
                      "flow:\n  doc_batch: 2\n")
    summary = api.ingest([str(folder)], config=config)
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0
    assert len(seen["chunk"]) == 2 and len(seen["upsert"]) == 2 and len(seen["convert"]) == 2
    # the run's thread holds one core while it chunks or writes; busy workers one each (2 files a batch); a
    # batch's conversion may run beside the chunking of the one before it
    assert all(n in (1, 3) for n in seen["chunk"] + seen["upsert"]) and all(n >= 2 for n in seen["convert"])
    assert cores.taken() == 0
