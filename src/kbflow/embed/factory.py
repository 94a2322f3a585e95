"""Build the configured embedder once per process (loading a model is the expensive part)."""

from __future__ import annotations

import threading

from kbflow.config import EmbedderConfig
from kbflow.embed.base import Embedder

_cache: dict[str, Embedder] = {}
_lock = threading.Lock()


def get_embedder(config: EmbedderConfig) -> Embedder:
    key = f"{config.backend}|{config.model_path}|{config.batch_size}|{config.device}"
    with _lock:
        if key not in _cache:
            if config.backend == "local":
                from kbflow.embed.local import LocalEmbedder

                _cache[key] = LocalEmbedder(config.model_path, batch_size=config.batch_size, device=config.device)
        return _cache[key]
