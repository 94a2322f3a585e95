"""The registry of input formats: every ``FORMATS`` list of the modules of this package, then those of the
installed plugins (entry point group ``kbflow.formats``, whose value is a module or a list of ``Format``).

A plugin is one module: ``[project.entry-points."kbflow.formats"] toy = "my_package.toy"`` in its package's
``pyproject.toml``, and ``FORMATS = [Format(...)]`` in the module. Its fingerprint joins the converter fingerprint
every stored document records, so installing, upgrading or removing it re-plans the stored documents (their
conversions of other formats come from the conversion cache)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from pathlib import PurePosixPath
from typing import NamedTuple

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format
from kbflow.core.errors import ConfigError
from kbflow.core.plugins import load_plugins

ENTRY_POINT_GROUP = "kbflow.formats"


class Registry(NamedTuple):
    builtin: tuple[Format, ...]
    plugins: tuple[Format, ...]

    @property
    def all(self) -> tuple[Format, ...]:
        return self.builtin + self.plugins


def _declared(module: object, origin: str) -> list[Format]:
    found = module if isinstance(module, (list, tuple)) else getattr(module, "FORMATS", [])
    wrong = [item for item in found if not isinstance(item, Format)]
    if wrong:
        raise ConfigError(f"{origin}: FORMATS holds {type(wrong[0]).__name__}, not kbflow.convert.formats.base.Format; "
                          "fix the module or uninstall its package")
    return list(found)


@lru_cache(maxsize=1)
def registry() -> Registry:
    """Every format, built-in ones first; checked once per process."""
    package = importlib.import_module(__package__)
    builtin = [fmt for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name)
               for fmt in _declared(importlib.import_module(f"{__package__}.{info.name}"), info.name)]
    plugins = [fmt for _name, origin, loaded in load_plugins(ENTRY_POINT_GROUP, "format plugin")
               for fmt in _declared(loaded, origin)]
    found = Registry(tuple(builtin), tuple(plugins))
    _check(found.all)
    return found


def _check(formats: tuple[Format, ...]) -> None:
    names = [fmt.name for fmt in formats]
    twice = sorted({name for name in names if names.count(name) > 1})
    bad = sorted(suffix for fmt in formats for suffix in fmt.suffixes
                 if not suffix.startswith(".") or suffix != suffix.lower())
    fallbacks = [fmt.name for fmt in formats if fmt.fallback]
    claimed: dict[str, str] = {}
    for fmt in formats:
        for suffix in fmt.suffixes if fmt.applies is None else ():
            if suffix in claimed:
                raise ConfigError(f"formats {claimed[suffix]!r} and {fmt.name!r} both take {suffix} files; "
                                  "uninstall one of them, or give one an `applies` condition")
            claimed[suffix] = fmt.name
    if twice or bad or len(fallbacks) != 1:
        raise ConfigError(f"the input formats are inconsistent (names twice: {twice}, suffixes not lower-case "
                          f"with a dot: {bad}, fallback formats: {fallbacks}, need one); fix or uninstall the plugin")


def format_for(name: str, options: ConvertConfig) -> Format:
    """The format that converts a file called ``name`` under ``options``: by suffix, else the fallback."""
    suffix = PurePosixPath(name).suffix.lower()
    formats = registry().all
    return next((fmt for fmt in formats if fmt.takes(suffix, options)),
                next(fmt for fmt in formats if fmt.fallback))


def content_type_suffixes() -> dict[str, str]:
    """Content type -> the suffix a fetched body of that type is converted as (built-in formats win)."""
    found: dict[str, str] = {}
    for fmt in registry().all:
        for content_type, suffix in fmt.content_types.items():
            found.setdefault(content_type, suffix)
    return found


def plugin_fingerprint(options: ConvertConfig) -> str:
    """The plugins' part of the converter fingerprint: empty without plugins, so the built-in fingerprint every
    stored document records is unchanged."""
    return "".join(f"+{fmt.name}[{fmt.fingerprint(options)}]" for fmt in registry().plugins)
