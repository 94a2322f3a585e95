import pickle

import cloudpickle
import pytest

from kbflow.engine import portable
from kbflow.stores.vector_cache import VectorCache
from kbflow.config.embedders import embedder_config
from kbflow.embed import get_embedder
from kbflow.core.errors import ConfigError
from kbflow.stores.lancedb_store import LanceStore
from kbflow.stores.qdrant_store import QdrantStore


def test_embedder_stores_and_cache_travel_as_recipes(tmp_path):
    portable.register()
    # any backend travels as its config section (batch_size 17: an embedder no other test of this process built)
    embedder = get_embedder(embedder_config(backend="local", batch_size=17))
    store = LanceStore(tmp_path / "lancedb", "ns", 384)
    cache = VectorCache(tmp_path / "lancedb", embedder.model_id, 384)
    for dumps in (pickle.dumps, cloudpickle.dumps):
        copy = pickle.loads(dumps(embedder))
        assert copy.model_id == embedder.model_id and copy is pickle.loads(dumps(embedder))  # built once per process
        store_copy = pickle.loads(dumps(store))
        assert (store_copy.uri, store_copy.namespace, store_copy.dimension) == (store.uri, "ns", 384)
        cache_copy = pickle.loads(dumps(cache))
        assert (cache_copy.model_id, cache_copy.dimension) == (cache.model_id, 384)
    assert embedder._model is None  # pickling never loaded the weights


def test_qdrant_local_mode_cannot_be_sent_to_another_process(tmp_path):
    portable.register()
    with pytest.raises(ConfigError, match="server URL"):
        pickle.dumps(QdrantStore(str(tmp_path / "qdrant"), "ns", 384))
