"""Open the configured store for one namespace."""

from __future__ import annotations

from pathlib import Path

from kbflow.config import KbConfig


def store_uri(config: KbConfig) -> Path:
    return Path(config.store.uri) if config.store.uri else Path(config.data_dir) / "lancedb"


def open_store(config: KbConfig, namespace: str, dimension: int):
    if config.store.kind == "lancedb":
        from kbflow.stores.lancedb_store import LanceStore

        return LanceStore(store_uri(config), namespace, dimension)
    raise NotImplementedError(config.store.kind)
