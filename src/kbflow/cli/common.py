"""What the `kbflow` command and its `kbflow bench` sub-commands share: the consoles, the common options, JSON
output and the one-line error exit.

Imported by kbflow.cli after it has set the quiet/offline defaults, so typer and rich load after them."""

from __future__ import annotations

import json
import sys

import typer
from rich.console import Console
from rich.markup import escape

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}
out = Console()
err = Console(stderr=True)

NamespaceOpt = typer.Option(None, "--namespace", "-n", help="Namespace (default: the config's, 'default').")
ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config file (see configs/default.yaml).")
DataDirOpt = typer.Option(None, "--data-dir", help="Data folder for stores, state and snapshots, or an object-storage URL "
                          "(s3://bucket/kb) (default: ./data).")
JsonOpt = typer.Option(False, "--json", help="Print one JSON document on stdout.")


def print_json(payload) -> None:
    """Plain JSON on stdout (no rich wrapping), for other tools to read."""
    sys.stdout.write(json.dumps(payload, default=str, ensure_ascii=False, indent=2) + "\n")


def fail(exc: Exception, as_json: bool = False) -> None:
    """Exit 2 with the error on stderr; with --json also as a JSON object on stdout, so a CI job that parses
    stdout learns what went wrong."""
    err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    if as_json:
        print_json({"error": {"type": type(exc).__name__, "message": str(exc)}})
    raise typer.Exit(2)
