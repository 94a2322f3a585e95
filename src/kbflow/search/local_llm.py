"""Chat completions from a GGUF model run in this process by llama.cpp (``xllamacpp``): ``search.llm.kind: local``.

No server to run and no key: the model file named by ``search.llm.model_path`` is loaded once per process (a few
seconds) and kept. Prompts are measured with the model's own chat template and tokenizer, so ``ask`` packs as
many sources as fit its window (``context_tokens`` less ``max_tokens`` for the answer). Answers can stream: the
callback gets each piece as the model writes it.

llama.cpp's server core also opens an HTTP port on 127.0.0.1 (it cannot be switched off); kbflow gives it a
random key per process, uses it only to reach the template and tokenizer, and sends completions in-process.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path
from typing import Callable

import httpx

from kbflow.config import LlmConfig
from kbflow.core.errors import ConfigError, LlmNotConfigured, PermanentError
from kbflow.core.extras import require

_servers: dict[tuple, tuple] = {}
_lock = threading.Lock()


def check_model_file(path: str | None) -> Path:
    if not path:
        raise LlmNotConfigured("search.llm.kind is 'local' but search.llm.model_path is empty: set it to a GGUF chat "
                               "model file (docs/retrieval.md#answers-from-a-local-model names one that installs "
                               "from the package index)")
    file = Path(path).expanduser()
    try:
        with open(file, "rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        raise ConfigError(f"search.llm.model_path {path!r} cannot be read ({exc.strerror or exc}); point it at a "
                          "GGUF model file") from None
    if magic != b"GGUF":
        raise ConfigError(f"search.llm.model_path {path!r} is not a GGUF file (it starts with {magic!r}); llama.cpp "
                          "models come as .gguf")
    return file


def _server(file: Path, context_tokens: int, threads: int):
    """One loaded model per (file, window, threads) in this process, with the key of its local port."""
    key = (str(file.resolve()), context_tokens, threads)
    with _lock:
        if key not in _servers:
            xllamacpp = require("xllamacpp", "search.llm.kind 'local'")

            params = xllamacpp.CommonParams()
            params.model.path = str(file)
            params.n_ctx = context_tokens
            params.n_parallel = 1
            params.warmup = False
            params.cpuparams.n_threads = threads
            params.cpuparams_batch.n_threads = threads
            params.hostnames = ["127.0.0.1"]
            params.api_keys = [secret := secrets.token_hex(16)]
            params.verbosity = 0
            try:
                server = xllamacpp.Server(params)
            except RuntimeError as exc:
                raise ConfigError(f"llama.cpp could not load {str(file)!r} ({exc}); check that it is a chat model "
                                  "in a GGUF version this xllamacpp reads, and that it fits in memory") from None
            _servers[key] = (server, secret)
        return _servers[key]


class LocalChat:
    """The ``complete`` of kbflow.search.llm.ChatClient, on a local GGUF model."""

    def __init__(self, config: LlmConfig):
        self.config = config
        self.file = check_model_file(config.model_path)
        self.threads = config.threads or os.cpu_count() or 1
        self.server, secret = _server(self.file, config.context_tokens, self.threads)
        self._http = httpx.Client(base_url=self.server.listening_address, timeout=60,
                                  headers={"Authorization": f"Bearer {secret}"})
        self.name = self.file.name
        self._window: int | None = None
        self.last_timings: dict = {}  # llama.cpp's figures for the last completion (tokens, ms, tokens/s)

    @property
    def window(self) -> int:
        """The context llama.cpp gave the model: context_tokens, or less when the model was trained on less."""
        if self._window is None:
            props = self._http.get("/props")
            settings = props.json().get("default_generation_settings", {}) if props.status_code == 200 else {}
            if "n_ctx" not in settings:
                raise PermanentError(f"local model {self.name}: /props did not report the context size "
                                     f"(HTTP {props.status_code})")
            self._window = min(int(settings["n_ctx"]), self.config.context_tokens)
        return self._window

    def count_tokens(self, messages: list[dict]) -> int:
        """Tokens of ``messages`` as the model will read them (its chat template, its tokenizer)."""
        prompt = self._local("/apply-template", {"messages": messages})["prompt"]
        return len(self._local("/tokenize", {"content": prompt, "add_special": True})["tokens"])

    def _local(self, path: str, body: dict) -> dict:
        reply = self._http.post(path, json=body)
        if reply.status_code != 200:
            raise PermanentError(f"local model {self.name}: {path} answered HTTP {reply.status_code} "
                                 f"({reply.text[:200]})")
        return reply.json()

    def complete(self, messages: list[dict], temperature: float | None = None,
                 on_token: Callable[[str], None] | None = None, max_tokens: int | None = None,
                 limit_name: str = "search.llm.max_tokens") -> str:
        """The reply; ``max_tokens`` (default ``search.llm.max_tokens``, whose setting ``limit_name`` names in the
        error when the reply is cut there) bounds it."""
        config = self.config
        limit = max_tokens or config.max_tokens
        request = {"messages": messages, "max_tokens": limit,
                   "temperature": config.temperature if temperature is None else temperature}
        pieces: list[str] = []
        finish: list[str] = []

        def chunk(event: dict) -> None:
            if "error" in event:
                finish.append(f"error: {event['error']}")
                return
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    pieces.append(piece)
                    if on_token is not None:
                        on_token(piece)
                if choice.get("finish_reason"):
                    finish.append(choice["finish_reason"])
            if "timings" in event:
                self.last_timings = event["timings"]

        reply = self.server.handle_chat_completions({**request, "stream": True}, chunk)
        if isinstance(reply, dict) and "error" in reply:
            finish.append(f"error: {reply['error']}")
        reason = finish[-1] if finish else None
        if reason and reason.startswith("error"):
            raise PermanentError(f"local model {self.name} failed: {reason[7:]}")
        content = "".join(pieces)
        if reason == "length":
            raise PermanentError(f"local model {self.name} stopped at {limit_name} ({limit}) mid-answer; raise "
                                 f"{limit_name}")
        if not content.strip():
            raise PermanentError(f"local model {self.name} returned an empty answer (finish_reason {reason!r})")
        return content.strip()
