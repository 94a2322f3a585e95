"""`kbflow config show`: every setting's effective value and where it came from (default, file, environment, flag).

The values are the ones ``load_config`` validates, read through the same function, so what this prints is what a
command given the same file, environment and flags runs with. A config never holds a secret (settings ending in
``_env`` name the variable that does), and a password inside a URL is masked all the same.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from kbflow.config import KbConfig, Origins, load_config_with_origins
from kbflow.core.errors import ConfigError

config_app = typer.Typer(help="Inspect the configuration commands run with.", no_args_is_help=True,
                         context_settings={"help_option_names": ["-h", "--help"]})

_URL_PASSWORD = re.compile(r"(://[^/@\s:]*):[^/@\s]*@")


def _masked(value: object) -> object:
    """``value`` with the password of any ``scheme://user:password@host`` in it replaced by ``***``."""
    if isinstance(value, str):
        return _URL_PASSWORD.sub(r"\1:***@", value)
    if isinstance(value, list):
        return [_masked(item) for item in value]
    if isinstance(value, dict):
        return {key: _masked(item) for key, item in value.items()}
    return value


def _leaves(values: dict, path: tuple[str, ...] = ()):
    """(path, value) of every setting in a dumped config; a list (deploy.schedules, include patterns) is one."""
    for key, value in values.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        else:
            yield (*path, key), value


def effective_settings(config: KbConfig, origins: Origins) -> dict[str, dict]:
    """``{dotted name: {"value", "source", "from"}}`` in the models' field order; ``source`` is default, file,
    environment or flag, and ``from`` names the file, variable or flag (None for a default)."""
    settings = {}
    for path, value in _leaves(config.model_dump(mode="json")):
        label = origins.get(path)
        source, _, where = (label or "default").partition(" ")
        settings[".".join(path)] = {"value": _masked(value), "source": source, "from": where or None}
    return settings


@config_app.command("show")
def show(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config file (see configs/default.yaml)."),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="As the other commands' --namespace."),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="As the other commands' --data-dir."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document on stdout."),
) -> None:
    """Print every setting (dotted name = value) and where its value came from: the built-in default, the config
    file, an environment variable or a flag; later sources win in that order."""
    try:
        loaded, origins = load_config_with_origins(config, namespace=namespace, data_dir=data_dir)
    except ConfigError as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        if as_json:
            sys.stdout.write(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}}) + "\n")
        raise typer.Exit(2)
    settings = effective_settings(loaded, origins)
    if as_json:
        sys.stdout.write(json.dumps({"settings": settings}, ensure_ascii=False, indent=2) + "\n")
        return
    for name, setting in settings.items():
        where = setting["source"] + (f" {setting['from']}" if setting["from"] else "")
        value = json.dumps(setting["value"], ensure_ascii=False)
        sys.stdout.write(f"{name} = {value}  # {where}\n")
