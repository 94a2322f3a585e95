"""The reembed flow: the engine's reembed (``kbflow.engine.reembed``) as a Prefect flow run, its embed calls task
runs. Composition only."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from kbflow.config import KbConfig
from kbflow.engine.reembed import reembed as run_engine_reembed
from kbflow.engine.reembed import target_embedder_config
from kbflow.flows.ingest import flow_config
from kbflow.tasks.artifacts import engine_logs_in_run
from kbflow.tasks.stages import PrefectRunner


@flow(name="kbflow-reembed", log_prints=True, validate_parameters=True, task_runner=ThreadPoolTaskRunner(max_workers=8))
def reembed(namespace: str, model: str, config_path: str | None = None, data_dir: str | None = None,
            eval_beir: str | None = None, max_ndcg_drop: float = 0.0, config: KbConfig | None = None) -> dict:
    """Re-embed every chunk of ``namespace`` with ``model`` into a new table; switch only when complete and, with
    ``eval_beir``, only when the new model's nDCG@10 on that labelled set is at most ``max_ndcg_drop`` below the
    current model's."""
    settings = flow_config(config, config_path, data_dir)
    target = settings.model_copy(update={"embedder": target_embedder_config(model)})
    with engine_logs_in_run():
        return run_engine_reembed(settings, namespace, model, eval_beir, max_ndcg_drop, runner=PrefectRunner(target))
