"""Installed plugins: the modules other packages name under one of kbflow's entry point groups (``kbflow.formats``,
``kbflow.embedders``, ``kbflow.stores``), loaded in name order; a plugin that does not load is one error naming it,
never a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points

from kbflow.core.errors import ConfigError


def load_plugins(group: str, what: str) -> Iterator[tuple[str, str, object]]:
    """(entry point name, a label naming it for errors, what it loads) for each plugin of ``group``; ``what`` names
    the kind of plugin in the label ('format plugin')."""
    for point in sorted(entry_points(group=group), key=lambda point: point.name):
        origin = f"{what} {point.name!r} ({point.value})"
        try:
            loaded = point.load()
        except Exception as exc:  # a broken plugin names itself, never a traceback
            raise ConfigError(f"{origin} does not load: {type(exc).__name__}: {exc}; reinstall it, or uninstall its "
                              "package") from exc
        yield point.name, origin, loaded
