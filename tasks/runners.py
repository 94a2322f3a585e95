"""The ingest flow's task runner, chosen by the config's ``runner`` section.

threads: the flow's own ThreadPoolTaskRunner (one process). processes: a local process pool. dask: a Dask cluster
at ``runner.dask_address`` (or a temporary LocalCluster). Tasks then run in other processes or machines, so their
arguments are pickled: ``kbflow.engine.portable`` makes the embedder, stores and vector cache travel as recipes.
"""

from __future__ import annotations

from prefect.task_runners import ProcessPoolTaskRunner

from kbflow.engine import portable
from kbflow.config import KbConfig
from kbflow.core.extras import require


def task_runner_for(config: KbConfig):
    """A task runner for ``config``, or None to keep the flow's own (threads)."""
    kind = config.runner.kind
    if kind == "threads":
        return None
    portable.register()
    # convert prefetch + flow.max_workers embed batches are the most a run has in flight
    if kind == "processes":
        return ProcessPoolTaskRunner(max_workers=config.flow.max_workers + 1)
    DaskTaskRunner = require("prefect_dask", "runner.kind 'dask'").DaskTaskRunner

    if config.runner.dask_address:
        return DaskTaskRunner(address=config.runner.dask_address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": config.runner.dask_workers, "threads_per_worker": 1,
                                          "processes": True, "dashboard_address": None})


def with_task_runner(flow, config: KbConfig):
    """``flow`` with the task runner ``config`` asks for."""
    runner = task_runner_for(config)
    return flow if runner is None else flow.with_options(task_runner=runner)
