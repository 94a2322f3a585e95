"""The ingest flow: the engine's ingest as a Prefect flow run, every stage call a task run.

Composition only: ``kbflow.engine.ingest`` does the work; ``kbflow.tasks`` gives each stage its task (cache keys,
retries under the stage's policy), and this flow adds the run's artifacts (progress, summary, failures) and its
logs in the UI.
"""

from __future__ import annotations

from contextlib import nullcontext

from prefect import flow
from prefect.runtime import flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from kbflow.engine.ingest import IngestJob, new_run_id
from kbflow.engine.ingest import ingest as run_engine_ingest
from kbflow.config import KbConfig, check_namespace, load_config
from kbflow.ops.deploy import config_path as config_file
from kbflow.tasks.artifacts import engine_logs_in_run, progress_artifact, publish_summary
from kbflow.tasks.runs import one_run_per_namespace
from kbflow.tasks.stages import PrefectRunner

MAX_WORKERS = 8  # hard bound of the task runner's threads; flow.max_workers bounds what one run submits at once


def flow_config(config: KbConfig | None, config_path: str | None, data_dir: str | None) -> KbConfig:
    """The run's config: an object as given (``data_dir`` may override it), else the file or config name
    (``configs/<name>.yaml``; 'default' without such a file: the built-in defaults)."""
    if config is not None:
        return config.model_copy(update={"data_dir": data_dir}) if data_dir else config
    return load_config(config_file(config_path) if config_path else None, data_dir=data_dir)


def run_ingest(config: KbConfig, job: IngestJob) -> dict:
    """The engine's ingest inside the current flow run, with the run's artifacts and logs; a writing run waits
    for another flow run of the same namespace to finish first (``kbflow.tasks.runs``)."""
    namespace = check_namespace(job.namespace or config.namespace)
    queue = nullcontext() if job.dry_run else one_run_per_namespace(config.data_dir, namespace)
    with queue, engine_logs_in_run(), progress_artifact(namespace):
        summary = run_engine_ingest(config, job, PrefectRunner(config, job.force),
                                    run_id=new_run_id(str(flow_run.id or "") or None))
    return publish_summary(summary)  # after the state is recorded: an API hiccup here loses no bookkeeping


@flow(name="kbflow-ingest", log_prints=True, validate_parameters=True,
      task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS))  # type: ignore[arg-type]  # Prefect types its decorator against its own runner
def ingest(
    sources: list[str] | None = None,
    namespace: str | None = None,
    config_path: str | None = None,
    data_dir: str | None = None,
    dry_run: bool = False,
    force: bool = False,
    allow_mass_delete: bool = False,
    texts: list[dict] | None = None,
    config: KbConfig | None = None,
    add_only: bool = False,
    roots: list[str] | None = None,
    uploads: list[dict] | None = None,
) -> dict:
    """Ingest files and folders (and/or literal texts) into a namespace; returns the run summary. The config is
    ``config`` (an object) or the YAML file ``config_path`` (or the defaults). The sources are the namespace's
    whole set of files (stored files no longer among them are removed) unless ``add_only``. ``roots``: folders
    every file met in the walk must really lie under (sources someone else sent, checked by ``kbflow.core.trust``);
    ``uploads``: documents sent inline, already in the inbox (``kbflow.sources.upload``)."""
    settings = flow_config(config, config_path, data_dir)
    job = IngestJob(sources, namespace, texts or [], dry_run, force, allow_mass_delete, add_only,
                    tuple(roots or ()), uploads or [])
    return run_ingest(settings, job)
