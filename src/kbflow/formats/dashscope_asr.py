"""DashScope speech recognition (Qwen3-ASR-Flash), synchronous HTTP API, audio sent inline as a data URL.

POST {base}/api/v1/services/aigc/multimodal-generation/generation with ``Authorization: Bearer <key>`` and
``{"model", "input": {"messages": [system text, user audio]}, "parameters": {"asr_options": {...}}}``; the transcript
is ``output.choices[0].message.content[*].text``. Errors come back as ``{"code", "message", "request_id"}`` with an
HTTP status: 401/403 bad key (permanent), 400 bad input (permanent), 429 and 5xx (retried, honouring Retry-After).
The key is read from the environment and never appears in an error or a log line.
"""

from __future__ import annotations

import base64
import os
import random
import time
from dataclasses import dataclass

from kbflow.errors import ConversionError, TransientError

ENDPOINT = "/api/v1/services/aigc/multimodal-generation/generation"
MAX_DATA_URL_BYTES = 10 * 1024 * 1024  # the service's limit on an inline (base64) audio
MIME = {".wav": "audio/wav", ".mp3": "audio/mpeg", ".flac": "audio/flac", ".ogg": "audio/ogg", ".oga": "audio/ogg",
        ".aiff": "audio/aiff", ".aif": "audio/aiff"}


@dataclass
class DashScopeASR:
    api_key: str
    base_url: str
    model: str
    timeout_s: float
    retries: int
    backoff_s: float = 1.0

    @classmethod
    def from_options(cls, options) -> "DashScopeASR":
        key = os.environ.get(options.dashscope_api_key_env, "")
        if not key:
            raise ConversionError(
                f"audio backend 'dashscope' needs an API key in the environment variable "
                f"{options.dashscope_api_key_env}; set it, or use convert.audio_backend: pocketsphinx"
            )
        return cls(key, options.dashscope_base_url.rstrip("/"), options.dashscope_asr_model,
                   options.dashscope_timeout_s, options.dashscope_retries)

    def request_body(self, data: bytes, suffix: str) -> dict:
        encoded = base64.b64encode(data).decode("ascii")
        url = f"data:{MIME.get(suffix, 'audio/wav')};base64,{encoded}"
        return {"model": self.model,
                "input": {"messages": [{"role": "system", "content": [{"text": ""}]},
                                       {"role": "user", "content": [{"audio": url}]}]},
                "parameters": {"asr_options": {"enable_itn": False}}}

    def transcribe(self, data: bytes, suffix: str, source: str) -> str:
        if len(data) * 4 / 3 > MAX_DATA_URL_BYTES:
            raise ConversionError(
                f"{source}: {len(data) / 1e6:.1f} MB of audio is over DashScope's 10 MB inline limit; split the "
                "recording, compress it (MP3), or use convert.audio_backend: pocketsphinx"
            )
        body = self.request_body(data, suffix)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                return self._post(body, source)
            except TransientError as exc:
                last = exc
                if attempt == self.retries:
                    break
                delay = exc.retry_after if exc.retry_after is not None else self.backoff_s * 2 ** attempt
                time.sleep(min(delay, 60.0) * (1 + 0.25 * random.random()))
        raise TransientError(f"{source}: DashScope speech recognition failed after {self.retries + 1} attempts: "
                             f"{last}; the next run retries it")

    def _post(self, body: dict, source: str) -> str:
        import httpx

        try:
            response = httpx.post(self.base_url + ENDPOINT, json=body, timeout=self.timeout_s,
                                  headers={"Authorization": f"Bearer {self.api_key}"})
        except httpx.TimeoutException as exc:
            raise TransientError(f"timed out after {self.timeout_s:.0f} s (convert.dashscope_timeout_s)") from None
        except httpx.TransportError as exc:
            raise TransientError(f"connection failed ({type(exc).__name__})") from None
        status = response.status_code
        if status == 200:
            return _transcript(response, source)
        code, message = _error_fields(response)
        if status in (401, 403):
            raise ConversionError(f"{source}: DashScope refused the API key (HTTP {status} {code}); check the key in "
                                  "the variable named by convert.dashscope_api_key_env")
        if status == 429 or status >= 500:
            retry_after = response.headers.get("Retry-After")
            raise TransientError(f"HTTP {status} {code}: {message}",
                                 retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None)
        raise ConversionError(f"{source}: DashScope rejected the audio (HTTP {status} {code}: {message}); check the "
                              "file's format and length (at most 5 minutes)")


def _error_fields(response) -> tuple[str, str]:
    try:
        payload = response.json()
        return str(payload.get("code", "")), str(payload.get("message", ""))[:300]
    except ValueError:
        return "", response.text[:300]


def _transcript(response, source: str) -> str:
    try:
        choices = response.json()["output"]["choices"]
        content = choices[0]["message"]["content"]
        return " ".join(part["text"] for part in content if "text" in part).strip()
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise ConversionError(f"{source}: DashScope answered without a transcript ({type(exc).__name__}: {exc}); "
                              "check convert.dashscope_asr_model") from None
