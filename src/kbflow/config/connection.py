"""How kbflow reaches a remote service: one ``RemoteConnection`` model (key variable, base URL, timeout, retries)
for every section that calls one — the DashScope or OpenAI-compatible embedder, DashScope speech recognition, the
DashScope reranker and the chat model — and the ``RetryPolicy`` a connection's settings mean.

Sections differ only in their defaults (a speech file takes longer than a rerank call), so each has a subclass
that changes the defaults and nothing else. ``move_keys`` maps the flat keys those sections had before
(``convert.dashscope_timeout_s``, ``search.rerank.retries`` ...) into the connection, with one warning line.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from kbflow.core.retry import RetryPolicy


KEY_ENV_HELP = ("Name of the environment variable holding the API key (never the key itself). Empty means the "
                "provider's usual variable: DASHSCOPE_API_KEY for DashScope, OPENAI_API_KEY for an OpenAI-compatible "
                "endpoint.")
BASE_URL_HELP = ("API base URL. DashScope: empty means DASHSCOPE_HTTP_BASE_URL, else "
                 "https://dashscope.aliyuncs.com/api/v1 (a bare host means its /api/v1). An OpenAI-compatible "
                 "endpoint: its base URL ending in /v1; for the chat model empty means the OPENAI_BASE_URL variable.")
TIMEOUT_HELP = "Seconds one request may take before it is retried."
RETRIES_HELP = "Retries of one request on transient errors (429, 5xx, timeouts), within retry_budget_s."
BUDGET_HELP = ("Seconds one request may keep being retried (Retry-After waits included) before the request counts "
               "as failed.")
BACKOFF_HELP = "First retry delay; doubled each attempt, with jitter; a longer Retry-After from the service wins."
RETRY_AFTER_HELP = "Longest Retry-After a 429 may impose before a retry; longer waits are cut to this."


class RemoteConnection(BaseModel):
    """How kbflow reaches a remote provider."""

    model_config = ConfigDict(extra="forbid")

    api_key_env: str | None = Field(None, description=KEY_ENV_HELP)
    base_url: str | None = Field(None, description=BASE_URL_HELP)
    timeout_s: float = Field(60.0, gt=0, description=TIMEOUT_HELP)
    retries: int = Field(8, ge=0, le=50, description=RETRIES_HELP)
    retry_budget_s: float = Field(300.0, gt=0, description=BUDGET_HELP)
    retry_backoff_s: float = Field(2.0, ge=0, description=BACKOFF_HELP)
    max_retry_after_s: float = Field(300.0, ge=0, description=RETRY_AFTER_HELP)

    def key_env(self, usual: str) -> str:
        """The variable holding the key: the configured one, else the provider's ``usual`` one."""
        return self.api_key_env or usual

    def policy(self) -> RetryPolicy:
        """Retries of one request: transient errors (429, 5xx, timeouts) until ``retries`` retries or
        ``retry_budget_s`` seconds are spent, whichever comes first, honouring Retry-After up to
        ``max_retry_after_s``."""
        return RetryPolicy(attempts=1 + self.retries, backoff_s=self.retry_backoff_s, max_backoff_s=30.0,
                           budget_s=self.retry_budget_s, max_retry_after_s=self.max_retry_after_s)


class SpeechConnection(RemoteConnection):
    """DashScope speech recognition: one request is a whole recording."""

    timeout_s: float = Field(120.0, gt=0, description=TIMEOUT_HELP)
    retries: int = Field(3, ge=0, le=50, description=RETRIES_HELP)
    max_retry_after_s: float = Field(60.0, ge=0, description=RETRY_AFTER_HELP)


class InteractiveConnection(RemoteConnection):
    """A service a search or an answer waits for (the chat model): fewer retries, shorter waits."""

    retries: int = Field(3, ge=0, le=50, description=RETRIES_HELP)
    retry_backoff_s: float = Field(1.0, ge=0, description=BACKOFF_HELP)
    retry_budget_s: float = Field(120.0, gt=0, description=BUDGET_HELP)
    max_retry_after_s: float = Field(60.0, ge=0, description=RETRY_AFTER_HELP)


class RerankConnection(InteractiveConnection):
    """The reranker: as the chat model, with a shorter request timeout."""

    timeout_s: float = Field(30.0, gt=0, description=TIMEOUT_HELP)


Moves = list[tuple[str, str]]
_warned: set[str] = set()


def move_keys(section: object, where: str, moves: dict[str, str | Callable[[object], tuple[str, object]]],
              field: str = "connection", nested_wins: Callable[[str, str], bool] = lambda old, new: False
              ) -> tuple[object, Moves]:
    """(``section`` with its old flat keys moved, [(old dotted key, new dotted key)]). ``moves`` maps an old key to
    its key under the section's connection ``field``, or to a function of the old value giving (new key, new
    value), the new key '' when the old value meant the default and is dropped. A key set both ways keeps the
    flat value unless ``nested_wins(old key, new key)``. One warning line per distinct change in a process."""
    if not isinstance(section, dict) or not any(key in moves for key in section):
        return section, []
    section = dict(section)
    connection = dict(section.get(field) or {})
    done: Moves = []
    for old in [key for key in section if key in moves]:
        value = section.pop(old)
        target = moves[old]
        new, new_value = target(value) if callable(target) else (target, value)
        if not new:
            done.append((f"{where}.{old}", ""))
            continue
        if new not in connection or not nested_wins(old, new):
            connection[new] = new_value
        done.append((f"{where}.{old}", f"{where}.{field}.{new}"))
    if connection:
        section[field] = connection
    warn_moves(f"{where}.{field}", done)
    return section, done


def warn_moves(section: str, moves: Moves) -> None:
    moved = [f"{old} -> {new}" for old, new in moves if new]
    dropped = [old for old, new in moves if not new]
    message = "config: old flat settings: " + "; ".join(
        (["moved " + ", ".join(moved)] if moved else []) +
        (["dropped (they meant the default) " + ", ".join(dropped)] if dropped else []))
    message += f"; write {section} instead (docs/configuration.md)"
    if message not in _warned:
        _warned.add(message)
        sys.stderr.write(f"warning: {message}\n")
