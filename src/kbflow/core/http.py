"""One HTTP layer for every remote service kbflow speaks (DashScope embeddings, rerank and speech recognition,
OpenAI-compatible embeddings and chat): what a status code, a timeout or a ``Retry-After`` means.

* 408, 425, 429, 5xx, timeouts and connection failures are ``TransientError`` (``retry_after`` from the header,
  seconds or an HTTP date), retried by the caller's ``RetryPolicy``;
* 401/403 are ``AuthError`` (the key was refused: nothing else will work either), every other 4xx is a
  ``PermanentError`` naming what to check.

One request per call: retrying is the caller's (``kbflow.core.retry``), so a retried request is visible to it and
counted. The API key goes into the Authorization header only; no message here contains it.
"""

from __future__ import annotations

import email.utils
import os
import time
from urllib.parse import urlsplit

import httpx

from kbflow.core.errors import AuthError, PermanentError, TransientError

TRANSIENT_STATUS = frozenset({408, 425, 429})
DASHSCOPE_API = "https://dashscope.aliyuncs.com/api/v1"
DASHSCOPE_URL_ENV = "DASHSCOPE_HTTP_BASE_URL"  # the dashscope SDK's own variable (a proxy, a regional endpoint)
DASHSCOPE_RERANK_PATH = "/services/rerank/text-rerank/text-rerank"  # under the DashScope API base


def dashscope_base_url(configured: str | None) -> str:
    """Where every DashScope request goes (embeddings, rerank, speech): the config's value when set, else the
    SDK's ``DASHSCOPE_HTTP_BASE_URL``, else the public endpoint. A bare host (``https://dashscope-intl.aliyuncs.com``)
    means its ``/api/v1``."""
    url = (configured or os.environ.get(DASHSCOPE_URL_ENV, "").strip() or DASHSCOPE_API).rstrip("/")
    return url + "/api/v1" if urlsplit(url).path in ("", "/") else url


def is_transient_status(status: int) -> bool:
    return status in TRANSIENT_STATUS or status >= 500


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: a number of seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_for_status(service: str, status: int, code: str = "", message: str = "", retry_after: str | None = None,
                     key_env: str | None = None) -> Exception:
    """A failed reply as a kbflow error whose class says whether retrying can help."""
    detail = f"{service} answered HTTP {status}" + (f" {code}" if code else "") + (f": {message[:300]}" if message else "")
    if is_transient_status(status):
        return TransientError(detail, retry_after=parse_retry_after(retry_after))
    if status in (401, 403):
        where = f"the environment variable {key_env}" if key_env else "the configured key variable"
        return AuthError(f"{detail}; the API key was refused: check the key in {where}")
    return PermanentError(f"{detail}; the request was refused as invalid: check the model name, its options and "
                          "the input")


def transport_error(service: str, exc: Exception, timeout_s: float) -> TransientError:
    kind = "timed out" if isinstance(exc, httpx.TimeoutException) else "connection failed"
    return TransientError(f"{service}: {kind} ({type(exc).__name__}; timeout {timeout_s:g} s)")


def error_fields(response: httpx.Response) -> tuple[str, str]:
    """The service's own error code and message: DashScope ``{code, message}``, OpenAI ``{error: {code|type,
    message}}``; the raw text when the body is not JSON."""
    try:
        body = response.json()
    except ValueError:
        return "", response.text[:300]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if not isinstance(body, dict):
        return "", str(body)[:300]
    code = str(body.get("code") or body.get("type") or "")
    return code, str(body.get("message") or "")[:300]


def post_json(url: str, payload: dict, *, service: str, timeout_s: float, key: str | None = None,
              key_env: str | None = None, client: httpx.Client | None = None) -> dict:
    """POST ``payload`` once; the parsed JSON of a 200 reply, or the error its status means."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        if client is not None:
            response = client.post(url, json=payload, headers=headers, timeout=timeout_s)
        else:
            response = httpx.post(url, json=payload, headers=headers, timeout=timeout_s)
    except (httpx.TimeoutException, httpx.TransportError) as exc:
        raise transport_error(service, exc, timeout_s) from None
    if response.status_code != 200:
        code, message = error_fields(response)
        raise error_for_status(service, response.status_code, code, message, response.headers.get("retry-after"),
                               key_env)
    try:
        return response.json()
    except ValueError:
        raise PermanentError(f"{service} answered 200 with a body that is not JSON: {response.text[:120]!r}") from None
