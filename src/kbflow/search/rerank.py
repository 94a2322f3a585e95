"""Rerankers: score (query, passage) pairs; higher is more relevant. A local CrossEncoder or DashScope's API."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import httpx

from kbflow.core import http
from kbflow.config import RerankConfig
from kbflow.core.errors import ConfigError, PermanentError
from kbflow.core.extras import require
from kbflow.search.remote import api_key, post_json

DASHSCOPE_MAX_DOCUMENTS = 500  # per request, the API's documented limit


class Reranker(Protocol):
    name: str

    def scores(self, query: str, passages: list[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder loaded from a folder, offline."""

    def __init__(self, model_path: str, batch_size: int = 32, device: str = "cpu"):
        folder = Path(model_path).expanduser()
        if not (folder / "config.json").is_file():
            raise ConfigError(f"search.rerank.model_path {str(folder)!r} is not a model folder (no config.json); "
                              "point it at a folder saved with CrossEncoder.save()")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        CrossEncoder = require("sentence_transformers", "search.rerank.kind 'cross-encoder'").CrossEncoder

        self.model = CrossEncoder(str(folder), device=device, local_files_only=True)
        self.batch_size = batch_size
        self.name = f"cross-encoder:{folder.name}"

    def scores(self, query: str, passages: list[str]) -> list[float]:
        if not passages:
            return []
        values = self.model.predict([(query, p) for p in passages], batch_size=self.batch_size,
                                    show_progress_bar=False, convert_to_numpy=True)
        if values.ndim != 1:
            raise PermanentError(f"{self.name} gives {values.shape[-1]} scores per pair; a reranker needs one "
                                 "(a model with num_labels=1)")
        return [float(v) for v in values]


class DashScopeReranker:
    """DashScope text-rerank: POST {model, input: {query, documents}, parameters: {top_n, return_documents}}."""

    def __init__(self, config: RerankConfig):
        self.config = config
        self.key_env = config.connection.key_env("DASHSCOPE_API_KEY")
        self.key = api_key(self.key_env, "the DashScope reranker (search.rerank.kind: dashscope)")
        self.name = f"dashscope:{config.dashscope_model}"
        self.url = http.dashscope_base_url(config.connection.base_url) + http.DASHSCOPE_RERANK_PATH
        self.client = httpx.Client()

    def scores(self, query: str, passages: list[str]) -> list[float]:
        result = [0.0] * len(passages)
        seen = [False] * len(passages)
        for start in range(0, len(passages), DASHSCOPE_MAX_DOCUMENTS):
            batch = passages[start:start + DASHSCOPE_MAX_DOCUMENTS]
            payload = {"model": self.config.dashscope_model, "input": {"query": query, "documents": batch},
                       "parameters": {"top_n": len(batch), "return_documents": False}}
            reply = post_json(self.url, payload, self.key, self.key_env,
                              f"DashScope rerank ({self.config.dashscope_model})", self.config.connection,
                              client=self.client)
            try:
                for item in reply["output"]["results"]:
                    result[start + item["index"]] = float(item["relevance_score"])
                    seen[start + item["index"]] = True
            except (KeyError, TypeError, IndexError) as exc:
                raise PermanentError(f"DashScope rerank answered without output.results[index, relevance_score] "
                                     f"({type(exc).__name__}: {exc})") from None
        if not all(seen):
            raise PermanentError(f"DashScope rerank scored {sum(seen)} of {len(passages)} passages; "
                                 "a missing score would silently sink a passage")
        return result


def get_reranker(config: RerankConfig, device: str = "cpu") -> Reranker:
    if config.kind == "dashscope":
        return DashScopeReranker(config)
    if not config.model_path:
        raise ConfigError("rerank mode needs a reranker: set search.rerank.model_path to a local CrossEncoder folder, "
                          "or search.rerank.kind: dashscope with DASHSCOPE_API_KEY set")
    return CrossEncoderReranker(config.model_path, config.batch_size, device)
