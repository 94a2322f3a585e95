"""The deployments kbflow offers, built once from a config: `kbflow serve` registers and runs them in its
process, and `kbflow serve --prefect-yaml FILE` writes the same set as a prefect.yaml for `prefect deploy` with a
work pool (deployments/prefect.yaml is that file for configs/default.yaml; a test keeps them equal). Same names,
same parameters, same schedules: the two routes are alternatives for one server, not two sets that drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml
from prefect import Flow
from prefect.schedules import Cron
from prefect.utilities.callables import ParameterSchema

from kbflow.config import KbConfig
from kbflow.ops.deploy import CONFIGS_DIR_ENV, config_names, offer_config_names
from kbflow.core.errors import ConfigError
from kbflow.flows.backfill import backfill
from kbflow.flows.ingest_request import ingest_request
from kbflow.flows.reembed import reembed
from kbflow.tasks.runners import with_task_runner

# module paths of the installed package: a worker loads them from wherever `prefect deploy` ran (a team's own
# folder holds no flows/ of its own)
ENTRYPOINTS = {"kbflow-ingest-request": "kbflow.flows.ingest_request.ingest_request",
               "kbflow-backfill": "kbflow.flows.backfill.backfill", "kbflow-reembed": "kbflow.flows.reembed.reembed"}


@dataclass
class DeploymentSpec:
    flow: Flow
    name: str
    description: str
    tags: list[str]
    parameters: dict
    crons: list[tuple[str, str]] = field(default_factory=list)  # (cron, timezone)


def deployment_specs(config: KbConfig, config_name: str) -> list[DeploymentSpec]:
    """Nightly ingest per configured namespace, on-demand ingest, backfill and re-embed."""
    specs = []
    for index, schedule in enumerate(config.deploy.schedules):
        try:
            Cron(schedule.cron, timezone=schedule.timezone)
        except ValueError as exc:
            raise ConfigError(f"deploy.schedules[{index}] ({schedule.namespace}): cron {schedule.cron!r} / "
                              f"timezone {schedule.timezone!r} is invalid ({exc}); use five cron fields and an "
                              "IANA zone such as 'Europe/Berlin'") from None
        specs.append(DeploymentSpec(
            ingest_request, f"nightly-{schedule.namespace}",
            f"Incremental ingest of namespace {schedule.namespace!r}, {schedule.cron} ({schedule.timezone}).",
            ["kbflow", "nightly"],
            {"request": {"namespace": schedule.namespace, "sources": schedule.sources, "config": config_name}},
            [(schedule.cron, schedule.timezone)]))
    specs.append(DeploymentSpec(
        ingest_request, "on-demand",
        "Ingest a namespace now: fill in the request form (namespace, sources, config, dry run, force). Fields left "
        "out keep this deployment's values.", ["kbflow"], {"request": {"config": config_name}}))
    specs.append(DeploymentSpec(
        backfill, "backfill",
        "Ingest or rebuild many configured namespaces, optionally only those changed since a date.",
        ["kbflow", "backfill"], {"request": {"config": config_name}}))
    specs.append(DeploymentSpec(
        reembed, "reembed",
        "Re-embed a namespace with another model into a new table; switch only when complete.",
        ["kbflow", "reembed"], {"config_path": config_name}))
    return specs


def build_deployments(config: KbConfig, config_name: str) -> list:
    """The deployments as `kbflow serve` registers them (flow runs in its process, task runner per config).

    Their Run forms offer the config names found in the configs folder now as a drop-down (or a YAML file path),
    defaulting to the served config. `prefect deploy` computes the forms from the flow signatures itself, so
    the prefect.yaml route keeps a free-text config field."""
    names = config_names()
    deployments = []
    for spec in deployment_specs(config, config_name):
        deployment = with_task_runner(spec.flow, config).to_deployment(
            name=spec.name, description=spec.description, tags=spec.tags, parameters=spec.parameters,
            schedules=[Cron(cron, timezone=zone) for cron, zone in spec.crons])
        form = offer_config_names(deployment._parameter_openapi_schema.model_dump(), names, config_name)
        deployment._parameter_openapi_schema = ParameterSchema.model_validate(form)
        deployments.append(deployment)
    return deployments


def deployment_names(deployments: list) -> list[str]:
    return [f"{d.flow_name}/{d.name}" for d in deployments]


def prefect_yaml(config: KbConfig, config_name: str, pool: str, configs: Path | None = None) -> str:
    """The same deployments as a prefect.yaml for `prefect deploy --all`, run from the folder that holds
    ``configs/`` (the worker's runs start there); ``configs``: the configs folder when it is another one (its
    absolute path then goes into the runs' environment)."""
    moved = configs is not None and configs.resolve() != (Path.cwd() / "configs").resolve()
    deployments = []
    for spec in deployment_specs(config, config_name):
        entry: dict[str, object] = {"name": spec.name, "entrypoint": ENTRYPOINTS[spec.flow.name],
                                    "description": spec.description, "tags": spec.tags, "parameters": spec.parameters}
        if spec.crons:
            entry["schedules"] = [{"cron": cron, "timezone": zone} for cron, zone in spec.crons]
        work_pool: dict[str, object] = {"name": pool, "work_queue_name": "default"}
        if moved:
            work_pool["job_variables"] = {"env": {CONFIGS_DIR_ENV: str(configs)}}
        entry["work_pool"] = work_pool
        deployments.append(entry)
    header = (f"# Generated by `kbflow serve --config {config_name} --prefect-yaml deployments/prefect.yaml --pool {pool}`:\n"
              "# the deployments `kbflow serve` registers, for a work pool. Regenerate it after changing the config's\n"
              "# deploy section instead of editing it (tests/unit/test_deploy.py compares them).\n#\n"
              f"#   prefect work-pool create {pool} --type process\n"
              "#   prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml   # from the folder that holds configs/\n"
              f"#   prefect worker start --pool {pool}   # where kbflow is installed and the sources can be read\n")
    body = {"name": "kbflow", "deployments": deployments}
    return header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120)


def serve_all(deployments: list, limit: int | None) -> None:
    """Register ``deployments`` with the Prefect server at PREFECT_API_URL and run their flow runs here."""
    from prefect import serve

    serve(*deployments, limit=limit)
