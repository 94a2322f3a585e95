"""JSON over HTTP for the remote services of the read side (rerank API, chat LLM): retries and clear errors.

429, 5xx and timeouts are transient: retried with exponential backoff and jitter, honouring Retry-After.
401/403 (bad key) and other 4xx are permanent and fail at once. The key never appears in a message.
"""

from __future__ import annotations

import os
import random
import time

import httpx

from kbflow.errors import ConfigError, PermanentError, TransientError

MAX_RETRY_AFTER_S = 60.0


def api_key(env_name: str, purpose: str) -> str:
    key = os.environ.get(env_name, "").strip()
    if not key:
        raise ConfigError(f"{purpose} needs an API key in the environment variable {env_name}; it is not set")
    return key


def _detail(response: httpx.Response) -> str:
    """The service's own error code and message (DashScope: code/message; OpenAI: error.message), shortened."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if isinstance(body, dict):
        parts = [str(body[key]) for key in ("code", "type", "message") if body.get(key)]
        return ": ".join(parts)[:300] if parts else str(body)[:200]
    return str(body)[:200]


def post_json(url: str, payload: dict, key: str, key_env: str, what: str, timeout_s: float, retries: int,
              backoff_s: float = 1.0, client: httpx.Client | None = None) -> dict:
    """POST ``payload``; the parsed JSON reply, after up to ``retries`` retries of transient failures."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    attempt = 0
    while True:
        attempt += 1
        try:
            if client is not None:
                response = client.post(url, json=payload, headers=headers, timeout=timeout_s)
            else:
                response = httpx.post(url, json=payload, headers=headers, timeout=timeout_s)
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            error: Exception = TransientError(f"{what} at {url}: {type(exc).__name__} after {timeout_s}s timeout "
                                              f"or connection failure (attempt {attempt})")
            retry_after = None
        else:
            if response.status_code == 200:
                try:
                    return response.json()
                except ValueError:
                    raise PermanentError(f"{what} at {url} answered 200 with a body that is not JSON: "
                                         f"{response.text[:120]!r}") from None
            detail = _detail(response)
            if response.status_code in (401, 403):
                raise PermanentError(f"{what} at {url} refused the key in {key_env} ({response.status_code} {detail}); "
                                     f"set {key_env} to a valid key")
            if response.status_code != 429 and response.status_code < 500:
                raise PermanentError(f"{what} at {url} rejected the request ({response.status_code} {detail})")
            retry_after = _retry_after(response)
            error = TransientError(f"{what} at {url}: {response.status_code} {detail} (attempt {attempt})", retry_after)
        if attempt > retries:
            raise error
        delay = retry_after if retry_after is not None else backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
        time.sleep(min(delay, MAX_RETRY_AFTER_S))


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
