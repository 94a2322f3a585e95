"""Every ``kbflow`` command's ``--help`` is pinned: tests/cases/cli-help holds each one as users see it, so moving
code around cannot change what a user reads by accident. A deliberate change to a command's help regenerates the
files (``python tests/unit/test_cli_help.py``) and the diff shows the change in review."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from kbflow.cli.main import app

PINNED = Path(__file__).resolve().parents[1] / "cases" / "cli-help"


def commands() -> list[tuple[str, ...]]:
    """Every command path of the CLI: (), ("ingest",), ("bench", "search"), ..."""
    found: list[tuple[str, ...]] = []

    def walk(command, path: tuple[str, ...]) -> None:
        found.append(path)
        if isinstance(getattr(command, "commands", None), dict):  # a group (typer carries its own click)
            for name, sub in sorted(command.commands.items()):
                if not sub.hidden:
                    walk(sub, (*path, name))

    walk(typer.main.get_command(app), ())
    return found


def help_text(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], prog_name="kbflow", terminal_width=100,
                                env={"NO_COLOR": "1", "COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.output


def pinned_name(path: tuple[str, ...]) -> str:
    return "-".join(("kbflow", *path)) + ".txt"


def test_every_command_s_help_is_what_is_pinned():
    paths = commands()
    assert len(paths) > 20 and ("bench", "search") in paths
    changed = [pinned_name(path) for path in paths
               if not (PINNED / pinned_name(path)).is_file()
               or (PINNED / pinned_name(path)).read_text(encoding="utf-8") != help_text(path)]
    gone = sorted({path.name for path in PINNED.glob("*.txt")} - {pinned_name(path) for path in paths})
    assert not changed and not gone, (f"--help changed for {changed}, pinned without a command: {gone}; if meant, run "
                                      f"python tests/unit/test_cli_help.py and review the diff")


if __name__ == "__main__":
    for old in PINNED.glob("*.txt"):
        old.unlink()
    PINNED.mkdir(parents=True, exist_ok=True)
    for path in commands():
        (PINNED / pinned_name(path)).write_text(help_text(path), encoding="utf-8")
    print(f"wrote {len(commands())} files to {PINNED}", file=sys.stderr)
