"""What deployed runs are asked to do: typed requests (the Prefect UI's forms), config names, backfill selection.

Pure pydantic and file-system logic; ``flows/`` turns these into flow runs and ``deployments`` into schedules.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from kbflow.config import NAMESPACE_RE, KbConfig, ScheduleConfig, load_config
from kbflow.errors import ConfigError

CONFIGS_DIR_ENV = "KBFLOW_CONFIGS_DIR"  # where config names are looked up; default: ./configs


# a pattern, not a validator: it goes into the JSON schema, so the UI form and the server check it too
Namespace = Annotated[str, Field(pattern=NAMESPACE_RE.pattern)]


class IngestRequest(BaseModel):
    """Ingest one namespace: what the on-demand deployment's Run form asks for."""

    model_config = ConfigDict(extra="forbid", title="Ingest request")

    namespace: Namespace | None = Field(
        None, description="Namespace to ingest into (letters, digits, '_', '-'). Empty: the config's namespace."
    )
    sources: list[str] = Field(
        default_factory=list,
        description="Files or folders on the machine that runs the flow. Empty: the config's `sources`.",
    )
    config: str = Field(
        "default",
        description="Config name: 'default' reads configs/default.yaml (folder set by KBFLOW_CONFIGS_DIR); "
        "a path ending in .yaml is read as is.",
    )
    dry_run: bool = Field(False, description="Only plan (new / changed / unchanged / removed); write nothing.")
    force: bool = Field(False, description="Convert and chunk every document again (vectors still come from the cache).")
    allow_mass_delete: bool = Field(
        False, description="Delete even when more than flow.max_delete_fraction of the namespace vanished."
    )



class BackfillRequest(BaseModel):
    """Ingest or rebuild many namespaces: what the backfill deployment's Run form asks for."""

    model_config = ConfigDict(extra="forbid", title="Backfill request")

    namespaces: list[Namespace] = Field(
        default_factory=list,
        description="Namespaces to ingest, each listed in the config's deploy.schedules. Empty: all of them.",
    )
    config: str = Field("default", description="Config name (see the ingest request) holding deploy.schedules.")
    changed_since: datetime | None = Field(
        None,
        description="Only namespaces with a source file modified at or after this time (ISO 8601; UTC when no "
        "offset). A selected namespace is ingested whole, so removals are still detected.",
    )
    rebuild: bool = Field(False, description="Convert and chunk every document again (same as force).")
    dry_run: bool = Field(False, description="Only plan each namespace; write nothing.")
    concurrency: int | None = Field(
        None, ge=1, le=32, description="Namespaces ingested at once. Empty: the config's deploy.backfill_concurrency."
    )


DEFAULT_CONFIG = "default"


def config_path(name: str) -> Path | None:
    """The YAML file a config name stands for; an error lists the names that exist. ``default`` with no
    ``default.yaml`` in the configs folder means kbflow's built-in defaults (None): a plain install has no
    configs folder."""
    if name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name:
        path = Path(name)
    else:
        folder = Path(os.environ.get(CONFIGS_DIR_ENV, "configs"))
        path = folder / f"{name}.yaml"
        if not path.is_file():
            if name == DEFAULT_CONFIG:
                return None
            known = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
            raise ConfigError(
                f"config {name!r} not found: no {str(path)!r} (working directory {os.getcwd()!r}); "
                f"known names: {known or 'none'}; pass one of them or a path to a YAML file"
            )
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist: pass an existing YAML file or a config name")
    return path


def load_named_config(name: str) -> KbConfig:
    return load_config(config_path(name))


def backfill_targets(config: KbConfig, namespaces: list[str]) -> list[ScheduleConfig]:
    """The configured schedules a backfill covers: all, or the listed ones (each must be configured)."""
    configured = {schedule.namespace: schedule for schedule in config.deploy.schedules}
    if not namespaces:
        return list(configured.values())
    unknown = [name for name in namespaces if name not in configured]
    if unknown:
        raise ConfigError(
            f"namespaces {unknown} are not in deploy.schedules (configured: {sorted(configured)}); "
            "add them there with their sources, or leave the list empty for all"
        )
    return [configured[name] for name in dict.fromkeys(namespaces)]


def sources_of(config: KbConfig, schedule: ScheduleConfig) -> list[str]:
    sources = schedule.sources or config.sources
    if not sources:
        raise ConfigError(
            f"namespace {schedule.namespace!r} has no sources: set deploy.schedules[].sources or `sources`"
        )
    return sources


def changed_since(sources: list[str], since: datetime) -> bool:
    """Whether any file under ``sources`` was modified at or after ``since`` (a stat walk, no hashing).

    A missing source counts as changed: the ingest then reports it properly instead of the backfill hiding it."""
    cutoff = (since if since.tzinfo else since.replace(tzinfo=timezone.utc)).timestamp()
    for source in sources:
        root = Path(source)
        if not root.exists():
            return True
        if root.is_file():
            if root.stat().st_mtime >= cutoff:
                return True
            continue
        for folder, _dirs, files in os.walk(root):
            if any((Path(folder) / name).stat().st_mtime >= cutoff for name in files):
                return True
    return False


def failed_documents_message(summary: dict) -> str:
    """Why a deployed ingest run ends Failed although it ingested the rest."""
    docs, failures = summary["documents"], summary["failures"]
    stages = sorted({failure["stage"] for failure in failures})
    return (f"{len(failures)} failure(s) ({', '.join(stages)}; {docs['failed']} document(s)) in namespace "
            f"{summary['namespace']!r}, run {summary['run_id']} (the rest was ingested): see the run's failures "
            "artifact or failures.parquet, fix or remove those files, and run again")
