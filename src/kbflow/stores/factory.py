"""Open the configured store for one namespace."""

from __future__ import annotations

from pathlib import Path

from kbflow.config import KbConfig
from kbflow.core.extras import check
from kbflow.core.storage import location
from kbflow.stores.kinds import store_kind


def store_uri(config: KbConfig) -> str:
    """Where the LanceDB tables live (the store when store.kind is lancedb, and the vector cache in every case): a
    local folder, or an object-storage URL (``kbflow.stores.location``)."""
    return config.store.uri if config.store.uri else str(location(config.data_dir) / "lancedb")


def mirror_dir(config: KbConfig) -> Path:
    """Where searches keep local copies of tables in a bucket (``kbflow.stores.mirror``)."""
    from kbflow.runtime.environment import user_cache_dir

    return Path(config.store.mirror_dir) if config.store.mirror_dir else user_cache_dir() / "mirror"


def open_store(config: KbConfig, namespace: str, dimension: int, for_search: bool = False):
    """The store of ``config.store.kind`` for one namespace's table (``kbflow.stores.kinds``); its optional modules
    are checked first, so a missing one is one line naming its extra. ``for_search``: a store that answers searches
    (a LanceDB table in a bucket is then read from a local copy, when ``store.mirror`` is on)."""
    kind = store_kind(config.store.kind)
    for module in kind.required_modules:
        check(module, f"store.kind {kind.name!r}")
    return kind.open(config, namespace, dimension, for_search)
