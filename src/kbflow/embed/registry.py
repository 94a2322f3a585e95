"""Build the embedder a config section names: its ``builder`` class (``"module:Class"``, declared by the section in
``kbflow.config.embedders``) is imported only now, and ``Class.from_section(section)`` builds it.
``kbflow.embed.factory`` then gives it its recipe (its section), by which it travels to another process."""

from __future__ import annotations

import importlib

from kbflow.config import EmbedderConfig
from kbflow.config.embedders import embedder_sections
from kbflow.core.errors import ConfigError
from kbflow.embed.base import Embedder


def build_embedder(config: EmbedderConfig) -> Embedder:
    """The embedder ``config`` names; 'auto' outside a namespace means the default for new namespaces."""
    if config.backend == "auto":
        from kbflow.embed.choice import for_namespace

        config = for_namespace(config, None)
    sections = embedder_sections()
    if config.backend not in sections:
        raise ConfigError(f"embedder.backend {config.backend!r} is unknown; use one of {sorted(sections)}")
    module, _, name = type(config).builder.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"embedder.backend {config.backend!r}: its builder {type(config).builder!r} does not "
                          f"load ({type(exc).__name__}: {exc}); reinstall the package that provides it") from exc
    return cls.from_section(config)
