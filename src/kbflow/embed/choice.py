"""Which embedding backend a namespace uses when the config says ``embedder.backend: auto`` (the default).

A namespace keeps the model it was made with for life (its ``namespace.json`` records the model id): ``auto``
reads the backend back from that id, so an existing namespace goes on with its model after kbflow's default
changes, without a config edit. A new namespace gets ``DEFAULT_BACKEND``, the local model that measured best over
English and Chinese natural-question sets among those fast enough for a real manual (docs/embedding.md). A
remote model cannot be rebuilt from its id (it needs its endpoint and key settings): such a namespace must name
its backend in the config.
"""

from __future__ import annotations

from kbflow.config import EmbedderConfig
from kbflow.errors import ConfigError
from kbflow.model_ids import backend_of_model

DEFAULT_BACKEND = "e5"
def for_namespace(config: EmbedderConfig, meta: dict | None) -> EmbedderConfig:
    """``config`` with ``auto`` resolved for a namespace whose recorded state is ``meta`` (None: a new one)."""
    if config.backend != "auto":
        return config
    if meta is None:
        return config.model_copy(update={"backend": DEFAULT_BACKEND})
    backend = backend_of_model(meta["model_id"])
    if backend is None:
        raise ConfigError(f"this namespace holds vectors of {meta['model_id']}, a remote model that "
                          "`embedder.backend: auto` cannot rebuild from its id; name it in the config "
                          "(embedder.backend, embedder.model, embedder.dimension, ...)")
    update = {"backend": backend}
    if backend == "e5":
        update["precision"] = "bf16" if meta["model_id"].startswith("e5small-torch-bf16") else "fp32"
    return config.model_copy(update=update)
