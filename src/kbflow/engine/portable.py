"""Pickling recipes for what crosses process boundaries when tasks run in a process pool or on Dask workers.

A model, a LanceDB connection or a Qdrant client cannot be pickled (locks, native handles); they are sent as
the arguments that build them: a store as its kind declares (``kbflow.stores.kinds``); an embedder by its own
recipe, its config section (``BaseEmbedder.recipe``, set by ``kbflow.embed.factory``), built once per worker
process (it loads once, not per task). Store connections are opened fresh for each task, since other processes
write between tasks, with every setting the config gave the store (its index and search settings, an ingest's
deferred vector index).
Registered through ``copyreg``, which pickle and cloudpickle both consult, so the classes stay untouched.
"""

from __future__ import annotations

import copyreg


def _vector_cache(uri: str, model_id: str, dimension: int):
    from kbflow.stores.vector_cache import VectorCache

    return VectorCache(uri, model_id, dimension)  # a fresh connection: another process may have written since


def _reduce_vector_cache(cache):
    return _vector_cache, (cache.uri, cache.model_id, cache.dimension)


def register() -> None:
    """Install the recipes (idempotent). The API key of a Qdrant server travels as its variable's name only."""
    from kbflow.stores.kinds import store_kinds
    from kbflow.stores.vector_cache import VectorCache

    copyreg.pickle(VectorCache, _reduce_vector_cache)
    for kind in store_kinds().values():  # each store kind says how its store travels
        if kind.travels is not None:
            copyreg.pickle(*kind.travels)
