"""What deployed runs are asked to do: typed requests (the Prefect UI's forms), config names, backfill selection.

Pure pydantic and file-system logic; ``flows/`` turns these into flow runs and ``deployments`` into schedules.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from kbflow.config import NAMESPACE_RE, KbConfig, ScheduleConfig, load_config
from kbflow.convert.objects import is_url
from kbflow.config.embedders import embed_backends
from kbflow.core.errors import ConfigError
from kbflow.sources import confine, kind_of, normalise
from kbflow.core.trust import SourcePolicy, SourceRefused

CONFIGS_DIR_ENV = "KBFLOW_CONFIGS_DIR"  # where config names are looked up; default: ./configs


# a pattern, not a validator: it goes into the JSON schema, so the UI form and the server check it too
Namespace = Annotated[str, Field(pattern=NAMESPACE_RE.pattern)]

YAML_FILE = r"\.ya?ml$"

# the backends a namespace can be switched to: the registry's (kbflow.config.embedders.embed_backends(), plugins
# included) without 'auto', which names no model; as a type, a drop-down in the UI that the server checks too
if TYPE_CHECKING:
    EmbedBackend = str
else:
    EmbedBackend = Literal[tuple(name for name in embed_backends() if name != "auto")]
# what reembed's `model` may be: a backend name, or a YAML config whose embedder section names the model
EmbedderModel = (Annotated[EmbedBackend, Field(title="Backend")]
                 | Annotated[str, Field(title="YAML file", pattern=YAML_FILE)])


def empty_means_unset(schema: dict) -> None:
    """json_schema_extra of an optional field typed ``X | SkipJsonSchema[None]``: the form shows a plain input
    (no 'None' tab to switch away from first) and an empty input is simply not sent, so the default applies.
    Python callers may still pass None."""
    schema.pop("default", None)


class IngestRequest(BaseModel):
    """What to ingest now. Empty fields keep the config's namespace and sources."""

    model_config = ConfigDict(extra="forbid", title="Ingest request")

    namespace: Namespace | SkipJsonSchema[None] = Field(
        None, title="Namespace", json_schema_extra=empty_means_unset,
        description="Namespace to ingest into: 1-64 letters, digits, '_' or '-', starting with a letter or digit. "
        "Empty: the config's namespace.",
    )
    sources: list[str] = Field(
        default_factory=list, title="Sources",
        description="Files or folders to ingest (folders recursively), one per item, as paths on the machine that "
        "runs the flow (where kbflow serve or the worker runs; relative paths start in its folder). "
        "Empty: the config's sources.",
    )
    config: str = Field(
        "default", title="Config",
        description="Config name or YAML file: a name reads configs/NAME.yaml in the folder the flow runs in "
        "(KBFLOW_CONFIGS_DIR moves it; 'default' without that file means kbflow's built-in defaults); a path "
        "ending in .yaml is read as is.",
    )
    dry_run: bool = Field(False, title="Dry run",
                          description="Only plan (new / changed / unchanged / removed); write nothing.")
    force: bool = Field(False, title="Force", description="Convert and chunk every document again, changed or not "
                        "(vectors of unchanged text still come from the cache).")
    allow_mass_delete: bool = Field(
        False, title="Allow mass delete",
        description="Remove the documents whose files vanished even when they are more than the config's "
        "flow.max_delete_fraction (default 30%) of the namespace; otherwise such a run stops before deleting.",
    )


class BackfillRequest(BaseModel):
    """Ingest or rebuild the namespaces configured in deploy.schedules, a few at a time."""

    model_config = ConfigDict(extra="forbid", title="Backfill request")

    namespaces: list[Namespace] = Field(
        default_factory=list, title="Namespaces",
        description="Namespaces to ingest, one per item, each listed in the config's deploy.schedules (with its "
        "sources). Empty: all of them.",
    )
    config: str = Field("default", title="Config",
                        description="Config name or YAML file holding deploy.schedules (as in the ingest request: "
                        "a name reads configs/NAME.yaml in the folder the flow runs in).")
    changed_since: datetime | SkipJsonSchema[None] = Field(
        None, title="Changed since", json_schema_extra=empty_means_unset,
        description="Only namespaces with a source file modified at or after this time (UTC when no offset is "
        "given); a selected namespace is ingested whole, so removals are still detected. Empty: every namespace.",
    )
    rebuild: bool = Field(False, title="Rebuild",
                          description="Convert and chunk every document again (the ingest's force).")
    dry_run: bool = Field(False, title="Dry run", description="Only plan each namespace; write nothing.")
    concurrency: Annotated[int, Field(ge=1, le=32)] | SkipJsonSchema[None] = Field(
        None, title="Concurrency", json_schema_extra=empty_means_unset,
        description="Namespaces ingested at once, 1-32. Empty: the config's deploy.backfill_concurrency (default 2).",
    )


DEFAULT_CONFIG = "default"


def configs_folder() -> Path:
    """The folder config names are looked up in: KBFLOW_CONFIGS_DIR, else ./configs, as an absolute path."""
    return Path(os.environ.get(CONFIGS_DIR_ENV) or "configs").expanduser().absolute()


def is_config_file(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or os.sep in name or "/" in name


def config_path(name: str) -> Path | None:
    """The YAML file a config name stands for; an error lists the names that exist. ``default`` with no
    ``default.yaml`` in the configs folder means kbflow's built-in defaults (None): a plain install has no
    configs folder."""
    if is_config_file(name):
        path = Path(name).expanduser()
    else:
        folder = configs_folder()
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


def config_names() -> list[str]:
    """The config names known here: ``default`` (kbflow's built-in defaults when there is no default.yaml) and
    every YAML file in the configs folder (KBFLOW_CONFIGS_DIR, default ./configs)."""
    folder = configs_folder()
    found = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
    return [DEFAULT_CONFIG] + [name for name in found if name != DEFAULT_CONFIG]


def served_config(text: str | None) -> tuple[str, Path]:
    """(the config name served deployments pass, the configs folder their runs read it from) for ``kbflow serve
    --config TEXT``: a name is looked up in the configs folder; a file path names its folder as the configs folder
    (with KBFLOW_CONFIGS_DIR set, the file must lie in that folder). The operator's choice is made absolute here,
    once, so a run started from a Run form finds it whatever folder the run executes in."""
    text = text or DEFAULT_CONFIG
    if not is_config_file(text):
        config_path(text)  # an unknown name is an error now, not at the first run
        return text, configs_folder()
    path = Path(text).expanduser().absolute()
    if not path.is_file():
        raise ConfigError(f"config file {text!r} does not exist: pass an existing YAML file or a config name")
    if path.suffix != ".yaml":
        raise ConfigError(f"config file {text!r}: a served config is named NAME.yaml (its name is what a Run form "
                          "sends); rename it")
    folder = configs_folder() if os.environ.get(CONFIGS_DIR_ENV) else path.parent
    if path.parent.resolve() != folder.resolve():
        raise ConfigError(f"config file {text!r} is not in the configs folder {str(folder)!r} ({CONFIGS_DIR_ENV}): "
                          "served runs read configs from that folder only; move the file there or unset "
                          f"{CONFIGS_DIR_ENV}")
    return path.stem, path.parent


def offer_config_names(schema: dict, names: list[str], default: str) -> dict:
    """Turn a Run form's config field into a drop-down of ``names`` (the UI shows it; the server checks it), or a
    YAML file path as the other choice, defaulting to ``default``. ``schema`` is a flow's parameter schema as
    Prefect stores it; the config field is ``config`` of the request model or the flow's ``config_path``."""
    props = schema["properties"]
    if "request" in props:
        model = props["request"]["$ref"].rsplit("/", 1)[1]
        field, name = schema["definitions"][model]["properties"], "config"
        props["request"].setdefault("default", {})["config"] = default
    else:
        field, name = props, "config_path"
    prop = field[name]
    field[name] = {
        "title": prop["title"], "description": prop["description"], "default": default,
        **({"position": prop["position"]} if "position" in prop else {}),
        "anyOf": [{"title": "Config name", "type": "string", "enum": names},
                  {"title": "YAML file", "type": "string", "pattern": YAML_FILE}],
    }
    return schema


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

    A missing source counts as changed: the ingest then reports it properly instead of the backfill hiding it; so
    does a URL source (object storage has no cheap stat walk here: the ingest's own scan decides)."""
    cutoff = (since if since.tzinfo else since.replace(tzinfo=timezone.utc)).timestamp()
    for source in sources:
        if is_url(str(source)):
            return True
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


# -- the trust boundary of served deployments (kbflow.core.trust): a Run form, the API or a CI backfill is someone else


def served_config_path(name: str) -> Path | None:
    """``config_path`` for a name that arrived in a Run form or a CI request: a YAML file must lie in the configs
    folder (KBFLOW_CONFIGS_DIR, default ./configs), so a form cannot point the run at another config."""
    path = config_path(name)
    if path is None:
        return None
    folder = configs_folder()
    allowed = SourcePolicy.create([folder], root_setting=CONFIGS_DIR_ENV) if folder.is_dir() else SourcePolicy()
    try:  # a relative file name is relative to the run's folder, as config_path read it, not to the configs folder
        return allowed.check_path(path.absolute())
    except ConfigError:
        raise SourceRefused(f"config {name!r} is not in the configs folder {str(folder)!r}: a deployed run reads "
                            f"only the configs there (pass a config name, or move the file there; "
                            f"{CONFIGS_DIR_ENV} moves the folder)") from None


def load_served_config(name: str) -> KbConfig:
    return load_config(served_config_path(name))


def served_policy(config: KbConfig) -> SourcePolicy:
    """What served deployments may read: ``deploy.source_roots``, or by default the folders of the config's own
    sources and deploy.schedules sources (a file's folder; a URL source is allowed as a prefix)."""
    if config.deploy.source_roots is not None:
        chosen = list(config.deploy.source_roots)
    else:
        chosen = [*config.sources, *(s for schedule in config.deploy.schedules for s in schedule.sources)]
    folders, prefixes = [], []
    for source in chosen:
        if is_url(source):
            prefixes.append(source)
        elif Path(source).expanduser().exists():
            folders.append(source if Path(source).expanduser().is_dir() else str(Path(source).expanduser().parent))
        elif config.deploy.source_roots is not None:
            raise ConfigError(f"deploy.source_roots entry {source!r} does not exist: pass existing folders")
    return SourcePolicy.create(folders, prefixes, root_setting="deploy.source_roots",
                               source_setting="deploy.source_roots")


def check_served_sources(config: KbConfig, sources: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """(sources to read, roots their walk stays under) for sources a deployed run was given: each must lie under
    ``served_policy``; the run fails before anything is read otherwise."""
    policy = served_policy(config)
    configured = {*config.sources, *(s for schedule in config.deploy.schedules for s in schedule.sources)}
    for source in sources:  # the operator's own source gone: say so (a form's path outside says only "outside")
        if source in configured and not is_url(source) and not Path(source).expanduser().exists():
            raise ConfigError(f"source {source!r} does not exist: pass an existing file or folder")
    # a relative path starts in the folder the run executes in (as the form says), not in a root
    checked = [confine(str(Path(normalise(source)).expanduser().absolute())
                       if kind_of(source).name == "local" else str(source), policy) for source in sources]
    return checked, tuple(str(root) for root in policy.roots)
