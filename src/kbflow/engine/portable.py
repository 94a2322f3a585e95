"""Pickling recipes for what crosses process boundaries when tasks run in a process pool or on Dask workers.

A model, a LanceDB connection or a Qdrant client cannot be pickled (locks, native handles); they are sent as
the arguments that build them. An embedder carries its own recipe, its config section (``BaseEmbedder.recipe``,
set by ``kbflow.embed.factory``), and is built once per worker process (it loads once, not per task); store
connections are opened fresh for each task, since other processes write between tasks, with every setting
the config gave the store (its index and search settings, an ingest's deferred vector index).
Registered through ``copyreg``, which pickle and cloudpickle both consult, so the classes stay untouched.
"""

from __future__ import annotations

import copyreg


def _vector_cache(uri: str, model_id: str, dimension: int):
    from kbflow.stores.vector_cache import VectorCache

    return VectorCache(uri, model_id, dimension)  # a fresh connection: another process may have written since


def _reduce_vector_cache(cache):
    return _vector_cache, (cache.uri, cache.model_id, cache.dimension)


def _lance_store(uri: str, namespace: str, dimension: int, settings: dict, defer_vector_index: bool):
    from kbflow.stores.lancedb_store import LanceStore

    store = LanceStore(uri, namespace, dimension, **settings)
    store.defer_vector_index = defer_vector_index  # an ingest's batches leave the vector index to its end
    return store


def _reduce_lance_store(store):
    return _lance_store, (store.uri, store.namespace, store.dimension, store.settings, store.defer_vector_index)


def _qdrant_store(location: str, namespace: str, dimension: int, settings: dict):
    from kbflow.stores.qdrant_store import QdrantStore

    return QdrantStore(location, namespace, dimension, **settings)


def _reduce_qdrant_store(store):
    from kbflow.core.errors import ConfigError

    if not store.location.startswith(("http://", "https://")):
        raise ConfigError(
            f"store.qdrant_location {store.location!r} is Qdrant local mode, which one process owns; "
            "with runner.kind 'processes' or 'dask' use a Qdrant server URL (or LanceDB)"
        )
    return _qdrant_store, (store.location, store.namespace, store.dimension, store.settings)


def register() -> None:
    """Install the recipes (idempotent). The API key of a Qdrant server travels as its variable's name only."""
    from kbflow.stores.vector_cache import VectorCache
    from kbflow.stores.lancedb_store import LanceStore
    from kbflow.stores.qdrant_store import QdrantStore

    copyreg.pickle(VectorCache, _reduce_vector_cache)
    copyreg.pickle(LanceStore, _reduce_lance_store)
    copyreg.pickle(QdrantStore, _reduce_qdrant_store)
