"""Chat completions through an OpenAI-compatible endpoint (OpenAI, DashScope's compatible mode, vLLM, Ollama…)."""

from __future__ import annotations

import json
import os
import re

import httpx

from kbflow.config import LlmConfig
from kbflow.core.errors import LlmNotConfigured, PermanentError
from kbflow.search.remote import post_json

BASE_URL_ENV = "OPENAI_BASE_URL"  # the OpenAI SDK's variable: the base URL when the config sets none


class ChatClient:
    def __init__(self, config: LlmConfig):
        link = config.connection
        self.key_env = link.key_env("OPENAI_API_KEY")
        base_url = (link.base_url or os.environ.get(BASE_URL_ENV, "")).strip()
        key = os.environ.get(self.key_env, "").strip()
        missing = [name for name, value in ((BASE_URL_ENV, base_url), (self.key_env, key)) if not value]
        if missing:
            raise LlmNotConfigured(
                f"no LLM configured: set {' and '.join(missing)} (an OpenAI-compatible base URL ending in /v1, and "
                "its API key; for DashScope https://dashscope.aliyuncs.com/compatible-mode/v1 with your "
                "DASHSCOPE key), or write them in search.llm.connection (base_url, api_key_env); or run a GGUF "
                "model in this process: search.llm.kind: local with search.llm.model_path")
        self.config = config
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.key = key
        self.client = httpx.Client()

    def complete(self, messages: list[dict], temperature: float | None = None, on_token=None,
                 max_tokens: int | None = None, limit_name: str = "search.llm.max_tokens") -> str:
        """The answer; ``on_token`` gets it once, whole (this client does not stream). ``max_tokens`` (default
        ``search.llm.max_tokens``, the setting ``limit_name`` names in the error when the reply is cut there)."""
        config = self.config
        limit = max_tokens or config.max_tokens
        payload = {"model": config.model, "messages": messages, "max_tokens": limit,
                   "temperature": config.temperature if temperature is None else temperature}
        reply = post_json(self.url, payload, self.key, self.key_env, f"chat model {config.model}",
                          config.connection, client=self.client)
        try:
            choice = reply["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise PermanentError(f"chat model {config.model} answered without choices[0].message.content "
                                 f"({type(exc).__name__}: {exc})") from None
        if not content or not content.strip():
            raise PermanentError(f"chat model {config.model} returned an empty answer "
                                 f"(finish_reason {choice.get('finish_reason')!r})")
        if choice.get("finish_reason") == "length":
            raise PermanentError(f"chat model {config.model} stopped at {limit_name} ({limit}) mid-answer; raise "
                                 f"{limit_name}")
        if on_token is not None:
            on_token(content.strip())
        return content.strip()


def open_chat(config: LlmConfig):
    """The configured chat model: a GGUF model in this process (kind local) or an OpenAI-compatible endpoint."""
    if config.kind == "local":
        from kbflow.search.local_llm import LocalChat

        return LocalChat(config)
    return ChatClient(config)


JSON_RE = re.compile(r"\{.*\}", re.S)


def parse_reply(reply: str) -> dict | None:
    """The JSON object a chat model was asked to reply with (it may wrap it in a code fence or a sentence), or None."""
    match = JSON_RE.search(reply)
    if not match:
        return None
    try:
        value = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
