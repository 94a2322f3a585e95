"""A backfill's shape in one process: two namespaces ingested at the same time from two threads, each converting
in worker processes. Each run owns its conversion workers, so the run that ends first stops only its own, and both
stores come out exactly as two separate runs make them."""

from __future__ import annotations

import shutil
import threading

from kbflow import api
from kbflow.config import load_config
from tests.flows.conftest import store_of

SIZES = {"alpha": 200, "beta": 240}  # unequal: one run ends while the other still converts


def _sources(root, namespace: str, count: int):
    folder = root / namespace
    folder.mkdir(parents=True)
    for number in range(count):
        (folder / f"note-{number:03d}.md").write_text(
            f"# {namespace} note {number}\n\nThe {namespace} team wrote note {number} on item {number * 7 % 101}.\n")
    return folder


def _pools_used(monkeypatch) -> dict[str, set[int]]:
    """Which conversion pool each namespace's batches converted in (by object identity)."""
    from kbflow.convert import converters
    from kbflow.engine import stages

    used: dict[str, set[int]] = {}
    converting = threading.local()
    convert_batch, get = stages.convert_batch, converters.ConversionPool.get

    def spy_convert(sources, *args, **kwargs):
        converting.namespace = sources[0].source_path.split("/")[0] if sources else None
        return convert_batch(sources, *args, **kwargs)

    def spy_get(pool, workers, nice=0):
        used.setdefault(converting.namespace, set()).add(id(pool))
        return get(pool, workers, nice)

    monkeypatch.setattr(stages, "convert_batch", spy_convert)
    monkeypatch.setattr(converters.ConversionPool, "get", spy_get)
    return used


def test_two_namespaces_at_once_with_conversion_workers_equal_separate_runs(tmp_path, counting, monkeypatch):
    sources = {namespace: _sources(tmp_path / "sources", namespace, count) for namespace, count in SIZES.items()}
    pools = _pools_used(monkeypatch)
    config = load_config(None, data_dir=tmp_path / "together")
    config.convert.workers = 2  # worker processes for every run, whatever the machine's cores
    config.flow.doc_batch = 20

    summaries, errors = {}, []

    def run(namespace: str) -> None:
        try:
            summaries[namespace] = api.ingest([str(sources[namespace])], namespace, config)
        except BaseException as exc:  # noqa: BLE001 - asserted on below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(namespace,)) for namespace in SIZES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    # each run converted in its own pool (a pool shared by the process is stopped by whichever run ends first)
    assert set(pools) == set(SIZES) and all(len(ids) == 1 for ids in pools.values()), pools
    assert pools["alpha"] != pools["beta"], pools
    for namespace, count in SIZES.items():
        summary = summaries[namespace]
        assert summary["documents"]["new"] == count and summary["documents"]["failed"] == 0, summary["failures"]
        assert api.verify(namespace, config)["ok"]

    separate = tmp_path / "separate"  # the same sources one run at a time; the vector cache copied: nothing to embed
    shutil.copytree(tmp_path / "together" / "lancedb", separate / "lancedb",
                    ignore=lambda folder, names: [name for name in names if name.startswith("chunks_")])
    one_at_a_time = config.model_copy(update={"data_dir": separate})
    for namespace in SIZES:
        alone = api.ingest([str(sources[namespace])], namespace, one_at_a_time)
        assert alone["chunks"]["embedded"] == 0
        assert store_of(separate, namespace).rows().to_pylist() == \
            store_of(tmp_path / "together", namespace).rows().to_pylist()
