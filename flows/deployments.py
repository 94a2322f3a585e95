"""The deployments `kbflow serve` registers, built from the config (deployments/prefect.yaml is the same set
for `prefect deploy` with a work pool)."""

from __future__ import annotations

from prefect.schedules import Cron

from kbflow.flows.backfill import backfill
from kbflow.flows.ingest_request import ingest_request
from kbflow.flows.reembed import reembed
from kbflow.config import KbConfig
from kbflow.errors import ConfigError


def build_deployments(config: KbConfig, config_name: str) -> list:
    """Nightly ingest per configured namespace, on-demand ingest, backfill and re-embed."""
    deployments = []
    for index, schedule in enumerate(config.deploy.schedules):
        try:
            cron = Cron(schedule.cron, timezone=schedule.timezone)
        except ValueError as exc:
            raise ConfigError(f"deploy.schedules[{index}] ({schedule.namespace}): cron {schedule.cron!r} / "
                              f"timezone {schedule.timezone!r} is invalid ({exc}); use five cron fields and an "
                              "IANA zone such as 'Europe/Berlin'") from None
        deployments.append(ingest_request.to_deployment(
            name=f"nightly-{schedule.namespace}", schedules=[cron], tags=["kbflow", "nightly"],
            description=f"Incremental ingest of namespace {schedule.namespace!r}, {schedule.cron} ({schedule.timezone}).",
            parameters={"request": {"namespace": schedule.namespace, "sources": schedule.sources,
                                    "config": config_name}}))
    deployments.append(ingest_request.to_deployment(
        name="on-demand", tags=["kbflow"], parameters={"request": {"config": config_name}},
        description="Ingest a namespace now: fill in the request form (namespace, sources, config, dry run, force)."))
    deployments.append(backfill.to_deployment(
        name="backfill", tags=["kbflow", "backfill"], parameters={"request": {"config": config_name}},
        description="Ingest or rebuild many configured namespaces, optionally only those changed since a date."))
    deployments.append(reembed.to_deployment(
        name="reembed", tags=["kbflow", "reembed"], parameters={"config_path": config_name},
        description="Re-embed a namespace with another model into a new table; switch only when complete."))
    return deployments


def deployment_names(deployments: list) -> list[str]:
    return [f"{d.flow_name}/{d.name}" for d in deployments]


def serve_all(deployments: list, limit: int | None) -> None:
    """Register ``deployments`` with the Prefect server at PREFECT_API_URL and run their flow runs here."""
    from prefect import serve

    serve(*deployments, limit=limit)
