"""Open the configured store for one namespace."""

from __future__ import annotations

from pathlib import Path

from kbflow.config import KbConfig
from kbflow.core.errors import ConfigError
from kbflow.core.storage import is_remote, location


def store_uri(config: KbConfig) -> str:
    """Where the LanceDB tables live (the store when store.kind is lancedb, and the vector cache in every case): a
    local folder, or an object-storage URL (``kbflow.stores.location``)."""
    return config.store.uri if config.store.uri else str(location(config.data_dir) / "lancedb")


def mirror_dir(config: KbConfig) -> Path:
    """Where searches keep local copies of tables in a bucket (``kbflow.stores.mirror``)."""
    from kbflow.runtime.environment import user_cache_dir

    return Path(config.store.mirror_dir) if config.store.mirror_dir else user_cache_dir() / "mirror"


def open_store(config: KbConfig, namespace: str, dimension: int, for_search: bool = False):
    """``for_search``: a store that answers searches (a LanceDB table in a bucket is then read from a local copy,
    when ``store.mirror`` is on)."""
    if config.store.kind == "qdrant":
        from kbflow.stores.qdrant_store import QdrantStore

        where = config.store.qdrant_location
        if not where:
            if is_remote(location(config.data_dir)):
                raise ConfigError(
                    f"store.kind qdrant without store.qdrant_location runs Qdrant's local mode in <data_dir>/qdrant, "
                    f"and data_dir {config.data_dir} is object storage, which local mode cannot use: set "
                    "store.qdrant_location to a Qdrant server (http://host:6333), or use store.kind lancedb")
            where = str(Path(config.data_dir) / "qdrant")
        return QdrantStore(where, namespace, dimension, config.store.qdrant_api_key_env,
                           config.search.bm25_k1, config.search.bm25_b, config.search.bm25_avg_len)
    from kbflow.stores.lancedb_store import LanceStore

    search = config.search
    return LanceStore(store_uri(config), namespace, dimension, search.vector_index_min_rows, search.vector_index_type,
                      search.ann_nprobes, search.ann_ef, search.ann_refine_factor,
                      mirror_dir=mirror_dir(config) if for_search and config.store.mirror else None,
                      exact_in_memory_rows=search.exact_in_memory_rows if for_search else 0)
