"""Which embedding backend a namespace uses when the config says ``embedder.backend: auto`` (the default).

A namespace keeps the model it was made with for life (its ``namespace.json`` records the model id): ``auto``
reads the backend back from that id, so an existing namespace goes on with its model after kbflow's default
changes, without a config edit. A new namespace gets ``DEFAULT_BACKEND``, the local model that measured best over
English and Chinese natural-question sets among those fast enough for a real manual (docs/embedding.md). A
remote model cannot be rebuilt from its id (it needs its endpoint and key settings): such a namespace must name
its backend in the config.
"""

from __future__ import annotations

from typing import cast

from kbflow.config import EmbedderConfig
from kbflow.config.embedders import AutoEmbedder, backend_of_model, embedder_sections, recorded_settings
from kbflow.core.errors import ConfigError

DEFAULT_BACKEND = "e5"
def for_namespace(config: EmbedderConfig, meta: dict | None) -> EmbedderConfig:
    """``config`` with ``auto`` resolved for a namespace whose recorded state is ``meta`` (None: a new one)."""
    if config.backend == "e5" and config.precision == "auto" and meta is not None:
        recorded = recorded_settings(meta["model_id"]) if backend_of_model(meta["model_id"]) == "e5" else {}
        return config.model_copy(update=recorded) if recorded else config
    if config.backend != "auto":
        return config
    if meta is None:
        return _as_backend(config, DEFAULT_BACKEND)
    backend = backend_of_model(meta["model_id"])
    if backend is None:
        raise ConfigError(f"this namespace holds vectors of {meta['model_id']}, a remote model that "
                          "`embedder.backend: auto` cannot rebuild from its id; name it in the config "
                          "(embedder.backend, embedder.model, embedder.dimension, ...)")
    return _as_backend(config, backend, recorded_settings(meta["model_id"]))


def _as_backend(auto: AutoEmbedder, backend: str, update: dict | None = None) -> EmbedderConfig:
    """The ``backend`` section ``auto`` stands for: the settings of auto's that backend reads (the others tune
    backends it did not become). A prefix set under auto for a backend whose prefixes are fixed is an error."""
    model = embedder_sections()[backend]
    prefixes = [name for name in ("query_prefix", "passage_prefix") if getattr(auto, name) is not None]
    if prefixes and "query_prefix" not in model.model_fields:
        raise ConfigError(f"embedder.backend 'auto' chose {backend!r}, whose prefixes are fixed; remove "
                          f"{' and '.join('embedder.' + name for name in prefixes)} or name a backend")
    settings = {name: value for name, value in auto if name in model.model_fields}
    section = model(**{**settings, **(update or {}), "backend": backend})
    return cast(EmbedderConfig, section)  # each backend's section is its member of the union
