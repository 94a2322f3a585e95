"""JSON over HTTP for the remote services of the read side (rerank API, chat LLM): one request through
``kbflow.core.http`` (what each status means), retried as the section's ``RemoteConnection`` says (429, 5xx and
timeouts, with backoff and jitter, honouring Retry-After; a refused key or a bad request fails at once). The key
never appears in a message."""

from __future__ import annotations

import os

import httpx

from kbflow.core import http
from kbflow.config.connection import RemoteConnection
from kbflow.core.errors import ConfigError
from kbflow.core.retry import call_with_retries


def api_key(env_name: str, purpose: str) -> str:
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise ConfigError(f"{purpose} needs an API key in the environment variable {env_name}; it is not set")
    return key


def post_json(url: str, payload: dict, key: str, key_env: str, what: str, connection: RemoteConnection,
              client: httpx.Client | None = None) -> dict:
    """POST ``payload``; the parsed JSON reply, transient failures retried as ``connection`` says."""
    return call_with_retries(lambda: http.post_json(url, payload, service=f"{what} at {url}",
                                                    timeout_s=connection.timeout_s, key=key, key_env=key_env,
                                                    client=client),
                             connection.policy())
