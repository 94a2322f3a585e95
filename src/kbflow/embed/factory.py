"""Build the configured embedder once per process (loading a model is the expensive part)."""

from __future__ import annotations

import threading

from kbflow.config import EmbedderConfig
from kbflow.embed.base import Embedder

_cache: dict[str, Embedder] = {}
_lock = threading.Lock()


def get_embedder(config: EmbedderConfig) -> Embedder:
    """The embedder for ``config``, shared by every caller in this process with the same settings."""
    from kbflow.embed.registry import build_embedder

    key = config.model_dump_json()
    with _lock:
        if key not in _cache:
            embedder = build_embedder(config)
            embedder.recipe = (get_embedder, (config,))  # another process builds it again from its settings
            _cache[key] = embedder
        return _cache[key]


def built_model_ids() -> list[str]:
    """The model id of every embedder this process has built (a worker reports what it loaded)."""
    with _lock:
        return [embedder.model_id for embedder in _cache.values()]
