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
            _cache[key] = build_embedder(config)
        return _cache[key]
