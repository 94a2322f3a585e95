"""Remote embedding services: DashScope (through the ``dashscope`` package) and any OpenAI-compatible
``/v1/embeddings`` endpoint (through httpx).

Every request carries at most ``max_batch`` texts (DashScope text-embedding-v3/v4: 10 rows of at most 8,192
tokens each, the documented limits), waits for the client-side rate limit, and is retried on its own under the
embedder's ``RetryPolicy`` (``embedder.connection.retries`` / ``retry_budget_s``: 429, 5xx and timeouts, honouring
Retry-After; a bad key or bad input fails at once). What a status means is ``kbflow.core.http``'s, for every remote
client. A request that succeeded is never sent again: the ingest caches its vectors before the next request.

The API key is read from the environment variable the config names; it never appears in a message.
Where a DashScope request goes: ``embedder.connection.base_url`` when set, else the SDK's own ``DASHSCOPE_HTTP_BASE_URL``
environment variable (a proxy or a regional endpoint), else the public endpoint.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

from kbflow.core import http
from kbflow.chunk.tokens import EstimateTokenCounter
from kbflow.embed.base import BaseEmbedder, format_prefixes
from kbflow.embed.ratelimit import shared_limiter
from kbflow.core.errors import ConfigError, EmbeddingError, TransientError
from kbflow.core.retry import RetryPolicy, call_with_retries
from kbflow.config import embedders as sections

DASHSCOPE_MODELS = {  # model -> (max rows per request, max tokens per row, allowed dimensions, default dimension)
    "text-embedding-v4": (10, 8192, (2048, 1536, 1024, 768, 512, 256, 128, 64), 1024),
    "text-embedding-v3": (10, 8192, (1024, 768, 512, 256, 128, 64), 1024),
}
PROBE_TEXT = "kbflow"  # what the credential check embeds: one short word


def _quiet_dashscope_sdk() -> None:
    """The SDK logs every failed request with its traceback (to stderr, through the root logger); kbflow reports
    the failure itself, once, as the error it means. Its own switch, DASHSCOPE_LOGGING_LEVEL, still turns them on."""
    if not os.environ.get("DASHSCOPE_LOGGING_LEVEL"):
        logging.getLogger("dashscope").propagate = False


def _api_key(env_name: str, backend: str) -> str:
    key = os.environ.get(env_name, "")
    if not key.strip():
        raise ConfigError(f"embedder backend {backend!r} needs an API key in the environment variable {env_name}; "
                          f"export {env_name}=... (or set embedder.connection.api_key_env to the variable that holds it)")
    return key


class RemoteEmbedder(BaseEmbedder):
    """Shared request loop: split into provider batches, rate-limit, call with retries, check shape. Counts what
    it sent (``requests_sent``, ``texts_sent``, ``retries``), which a run's summary reports."""

    service = "remote"

    def __init__(self, max_tokens: int, max_batch: int, requests_per_minute: float | None,
                 tokens_per_minute: float | None, limiter_key: tuple, retry: RetryPolicy, key_env: str | None):
        self.max_tokens = max_tokens
        self.max_batch = max_batch
        self.retry = retry
        self.key_env = key_env
        self._counter = EstimateTokenCounter(max_tokens)
        self._limiter = shared_limiter(limiter_key, requests_per_minute, tokens_per_minute)
        self._counts_lock = threading.Lock()
        self.requests_sent = self.texts_sent = self.retries = 0

    def token_counter(self) -> EstimateTokenCounter:
        return self._counter

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        return np.vstack([call_with_retries(lambda: self._send(texts[start:start + self.max_batch], is_query),
                                            self.retry, on_retry=self._count_retry)
                          for start in range(0, len(texts), self.max_batch)])

    def _send(self, batch: list[str], is_query: bool) -> np.ndarray:
        if self._limiter is not None:
            self._limiter.acquire(sum(self._counter.count(batch)))
        with self._counts_lock:
            self.requests_sent += 1
            self.texts_sent += len(batch)
        return self._request(batch, is_query)

    def _count_retry(self, _error: BaseException, _attempt: int, _delay: float) -> None:
        with self._counts_lock:
            self.retries += 1

    def check_access(self) -> None:
        """One request of one short text, before a run converts anything: a refused key (AuthError) or a wrong
        endpoint stops the run at once instead of after every document was converted."""
        self.embed_documents([PROBE_TEXT])

    def _request(self, texts: list[str], is_query: bool) -> np.ndarray:  # pragma: no cover - subclasses
        raise NotImplementedError

    def _rows(self, items: list[tuple[int, list[float]]], expected: int) -> np.ndarray:
        """Vectors ordered by their index; exactly one per input, each of the configured dimension."""
        indexes = sorted(index for index, _ in items)
        if indexes != list(range(expected)):
            raise EmbeddingError(f"{self.service} returned vectors for inputs {indexes[:20]}, expected 0..{expected - 1}; "
                                 "nothing of this batch is stored")
        rows = [vector for _, vector in sorted(items, key=lambda item: item[0])]
        if any(len(row) != self.dimension for row in rows):
            got = sorted({len(row) for row in rows})
            raise EmbeddingError(f"{self.service} returned vectors of dimension {got}, but {self.model_id} has "
                                 f"{self.dimension}; set embedder.dimension to what the model returns")
        return np.asarray(rows, dtype=np.float32)


class DashScopeEmbedder(RemoteEmbedder):
    """DashScope text-embedding-v3/v4 through ``dashscope.TextEmbedding.call`` (text_type query/document)."""

    @classmethod
    def from_section(cls, c: sections.DashScopeEmbedder) -> DashScopeEmbedder:
        link = c.connection
        return cls(c.model or "text-embedding-v4", c.dimension, link.api_key_env or "DASHSCOPE_API_KEY",
                   link.base_url, link.timeout_s, c.max_batch, c.requests_per_minute, c.tokens_per_minute,
                   link.policy())

    service = "DashScope"

    def __init__(self, model: str, dimension: int | None, api_key_env: str, base_url: str | None, timeout_s: float,
                 max_batch: int | None, requests_per_minute: float | None, tokens_per_minute: float | None,
                 retry: RetryPolicy | None = None):
        if model not in DASHSCOPE_MODELS:
            raise ConfigError(f"embedder.model {model!r} is not a DashScope text embedding model kbflow knows; "
                              f"use one of {sorted(DASHSCOPE_MODELS)}")
        rows, max_tokens, dimensions, default_dim = DASHSCOPE_MODELS[model]
        dimension = dimension or default_dim
        if dimension not in dimensions:
            raise ConfigError(f"embedder.dimension {dimension} is not offered by {model}; use one of {list(dimensions)}")
        if max_batch and max_batch > rows:
            raise ConfigError(f"embedder.max_batch {max_batch} exceeds {model}'s limit of {rows} texts per request")
        self.model, self.dimension = model, dimension
        self.base_url = http.dashscope_base_url(base_url)
        self.timeout_s = timeout_s
        self._key = _api_key(api_key_env, "dashscope")
        _quiet_dashscope_sdk()
        super().__init__(max_tokens, max_batch or rows, requests_per_minute, tokens_per_minute,
                         ("dashscope", model, self.base_url), retry or RetryPolicy(), api_key_env)
        self.model_id = f"dashscope:{model};dim={dimension};norm=l2;prefix=text_type:query|document"

    def _request(self, texts: list[str], is_query: bool) -> np.ndarray:
        import requests
        from dashscope import TextEmbedding

        try:
            response = TextEmbedding.call(model=self.model, input=texts, api_key=self._key,
                                          text_type="query" if is_query else "document", dimension=self.dimension,
                                          base_address=self.base_url, request_timeout=self.timeout_s)
        except (requests.Timeout, requests.ConnectionError) as exc:
            raise TransientError(f"DashScope at {self.base_url}: request failed ({type(exc).__name__}; timeout "
                                 f"{self.timeout_s:g} s)") from None
        status = int(response.status_code)
        if status != 200:
            headers = {k.lower(): v for k, v in (getattr(response, "headers", None) or {}).items()}
            raise http.error_for_status(f"DashScope at {self.base_url}", status, response.code or "",
                                        str(response.message or ""), headers.get("retry-after"), self.key_env)
        embeddings = (response.output or {}).get("embeddings")
        if not isinstance(embeddings, list):
            raise EmbeddingError(f"DashScope replied 200 without output.embeddings for {self.model}; nothing stored")
        return self._rows([(item["text_index"], item["embedding"]) for item in embeddings], len(texts))


class OpenAICompatibleEmbedder(RemoteEmbedder):
    """POST ``{base_url}/embeddings`` as the OpenAI API defines it (vLLM, TEI, llama.cpp, Ollama, DashScope's
    compatible mode...). ``query_prefix`` / ``passage_prefix`` are prepended for instruction-style models."""

    @classmethod
    def from_section(cls, c: sections.OpenAIEmbedder) -> OpenAICompatibleEmbedder:
        link = c.connection
        return cls(c.model, c.dimension, link.api_key_env or "OPENAI_API_KEY", link.base_url, link.timeout_s,
                   c.max_batch, c.max_input_tokens, c.send_dimensions, c.requests_per_minute, c.tokens_per_minute,
                   c.query_prefix or "", c.passage_prefix or "", link.policy())

    service = "OpenAI-compatible endpoint"

    def __init__(self, model: str | None, dimension: int | None, api_key_env: str, base_url: str | None,
                 timeout_s: float, max_batch: int | None, max_tokens: int | None, send_dimensions: bool,
                 requests_per_minute: float | None, tokens_per_minute: float | None,
                 query_prefix: str = "", passage_prefix: str = "", retry: RetryPolicy | None = None):
        if not model or not base_url or not dimension:
            raise ConfigError("embedder.backend 'openai' needs embedder.model, embedder.connection.base_url (e.g. "
                              "http://127.0.0.1:8000/v1) and embedder.dimension (the size of the vectors it returns)")
        self.model, self.dimension, self.base_url = model, dimension, base_url.rstrip("/")
        self.timeout_s, self.send_dimensions = timeout_s, send_dimensions
        self.query_prefix, self.passage_prefix = query_prefix, passage_prefix
        self._key = os.environ.get(api_key_env, "")  # self-hosted servers often need none
        super().__init__(max_tokens or 8192, max_batch or 64, requests_per_minute, tokens_per_minute,
                         ("openai", model, self.base_url), retry or RetryPolicy(), api_key_env)
        self.model_id = (f"openai:{model};dim={dimension};norm=l2;"
                         f"prefix={format_prefixes(query_prefix, passage_prefix)}")
        self._client = None

    def _http(self):
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        return self._client

    def _request(self, texts: list[str], is_query: bool) -> np.ndarray:
        prefix = self.query_prefix if is_query else self.passage_prefix
        body: dict[str, object] = {"model": self.model, "input": [prefix + text for text in texts],
                                   "encoding_format": "float"}
        if self.send_dimensions:
            body["dimensions"] = self.dimension
        reply = http.post_json(f"{self.base_url}/embeddings", body, service=f"{self.base_url}/embeddings",
                               timeout_s=self.timeout_s, key=self._key, key_env=self.key_env, client=self._http())
        try:
            items = [(item["index"], item["embedding"]) for item in reply["data"]]
        except (KeyError, TypeError):
            raise EmbeddingError(f"{self.base_url}/embeddings replied 200 without a data list of "
                                 "{index, embedding}; nothing stored") from None
        return self._rows(items, len(texts))
