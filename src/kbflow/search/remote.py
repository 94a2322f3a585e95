"""JSON over HTTP for the remote services of the read side (rerank API, chat LLM): one request through
``kbflow.http`` (what each status means), retried under a ``RetryPolicy`` (429, 5xx and timeouts, with backoff
and jitter, honouring Retry-After; a refused key or a bad request fails at once). The key never appears in a
message."""

from __future__ import annotations

import os

import httpx

from kbflow import http
from kbflow.errors import ConfigError
from kbflow.retry import RetryPolicy, call_with_retries

MAX_RETRY_AFTER_S = 60.0  # an interactive search or answer does not wait longer than this for one retry


def api_key(env_name: str, purpose: str) -> str:
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise ConfigError(f"{purpose} needs an API key in the environment variable {env_name}; it is not set")
    return key


def read_side_policy(retries: int, backoff_s: float = 1.0) -> RetryPolicy:
    return RetryPolicy(attempts=1 + retries, backoff_s=backoff_s, max_retry_after_s=MAX_RETRY_AFTER_S)


def post_json(url: str, payload: dict, key: str, key_env: str, what: str, timeout_s: float, retries: int,
              backoff_s: float = 1.0, client: httpx.Client | None = None) -> dict:
    """POST ``payload``; the parsed JSON reply, after up to ``retries`` retries of transient failures."""
    return call_with_retries(lambda: http.post_json(url, payload, service=f"{what} at {url}", timeout_s=timeout_s,
                                                    key=key, key_env=key_env, client=client),
                             read_side_policy(retries, backoff_s))
