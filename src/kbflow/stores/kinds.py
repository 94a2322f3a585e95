"""The registry of store kinds (``store.kind``): each is one ``StoreKind`` a module declares as ``KIND``.

A built-in kind ``name`` lives in ``kbflow.stores.<name>_store`` (its name is in ``kbflow.config.schema``'s
``BUILTIN_STORE_KINDS``, which the config's ``store.kind`` accepts); a plugin package adds one through the entry point
group ``kbflow.stores`` (``[project.entry-points."kbflow.stores"] name = "package.module"``), whose name the config
accepts as soon as the package is installed. A kind declares how to open its store from the config, the optional
modules it needs (checked before it opens), how its damaged files are set aside so it opens again (``kbflow verify
--repair``), and how a store travels to another process (runner.kind processes or dask)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kbflow.config import KbConfig
from kbflow.config.schema import BUILTIN_STORE_KINDS, STORE_ENTRY_POINT_GROUP
from kbflow.core.errors import ConfigError
from kbflow.core.plugins import load_plugins


@dataclass(frozen=True)
class StoreKind:
    name: str
    # (config, the store's table namespace, vector dimension, for_search) -> a kbflow.stores.base.Store
    open: Callable[[KbConfig, str, int, bool], Any]
    required_modules: tuple[str, ...] = ()
    # (config, table namespace) -> what was done: damaged files that keep the store from opening moved aside (renamed,
    # never deleted); None: the kind keeps nothing on local disk to set aside
    set_aside: Callable[[KbConfig, str], str] | None = None
    # (the store's class, its copyreg reducer): how a store is sent to a worker process; None: it pickles as it is
    travels: tuple[type, Callable[[Any], tuple]] | None = None


def _declared(module: object, origin: str) -> StoreKind:
    kind = getattr(module, "KIND", None)
    if not isinstance(kind, StoreKind):
        raise ConfigError(f"{origin}: KIND must be a kbflow.stores.kinds.StoreKind; fix the module or uninstall its "
                          "package")
    return kind


@lru_cache(maxsize=1)
def store_kinds() -> dict[str, StoreKind]:
    """Every store kind by name, built-in ones first; a plugin that does not load is one error naming it."""
    kinds = {name: _declared(importlib.import_module(f"kbflow.stores.{name}_store"), name)
             for name in BUILTIN_STORE_KINDS}
    for name, origin, loaded in load_plugins(STORE_ENTRY_POINT_GROUP, "store plugin"):
        if name in kinds:
            raise ConfigError(f"{origin} is named as a built-in store kind; uninstall its package")
        kind = _declared(loaded, origin)
        if kind.name != name:
            raise ConfigError(f"{origin} declares the kind {kind.name!r}; its entry point and KIND must name it alike")
        kinds[kind.name] = kind
    return kinds


def store_kind(name: str) -> StoreKind:
    kinds = store_kinds()
    if name not in kinds:
        raise ConfigError(f"store.kind {name!r} is unknown; use one of {sorted(kinds)}")
    return kinds[name]
