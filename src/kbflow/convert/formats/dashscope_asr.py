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
from dataclasses import dataclass

from kbflow.core import http
from kbflow.config import ConvertConfig
from kbflow.core.errors import AuthError, ConversionError, PermanentError, TransientError
from kbflow.core.retry import RetryPolicy, call_with_retries

ENDPOINT = "/services/aigc/multimodal-generation/generation"  # under the DashScope API base
MAX_DATA_URL_BYTES = 10 * 1024 * 1024  # the service's limit on an inline (base64) audio
MIME = {".wav": "audio/wav", ".mp3": "audio/mpeg", ".flac": "audio/flac", ".ogg": "audio/ogg", ".oga": "audio/ogg",
        ".aiff": "audio/aiff", ".aif": "audio/aiff"}


@dataclass
class DashScopeASR:
    api_key: str
    base_url: str
    model: str
    timeout_s: float
    policy: RetryPolicy
    key_env: str = "DASHSCOPE_API_KEY"

    @classmethod
    def from_options(cls, options: ConvertConfig) -> "DashScopeASR":
        link = options.dashscope
        key_env = link.key_env("DASHSCOPE_API_KEY")
        key = os.environ.get(key_env, "")
        if not key:
            raise ConversionError(
                f"audio backend 'dashscope' needs an API key in the environment variable {key_env}; set it, or "
                "use convert.audio_backend: whisper")
        return cls(key, http.dashscope_base_url(link.base_url), options.dashscope_asr_model, link.timeout_s,
                   link.policy(), key_env=key_env)

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
        try:
            reply = call_with_retries(lambda: http.post_json(self.base_url + ENDPOINT, body,
                                                             service="DashScope speech recognition",
                                                             timeout_s=self.timeout_s, key=self.api_key,
                                                             key_env=self.key_env), self.policy)
        except TransientError as exc:  # not cached as a failure: the next run tries the file again
            raise TransientError(f"{source}: DashScope speech recognition failed after {getattr(exc, 'attempts', 1)} attempts: "
                                 f"{exc}; the next run retries it") from None
        except AuthError as exc:
            raise ConversionError(f"{source}: {exc}") from None
        except PermanentError as exc:
            raise ConversionError(f"{source}: DashScope rejected the audio ({exc}); check the file's format and "
                                  "length (at most 5 minutes)") from None
        return _transcript(reply, source)


def _transcript(reply: dict, source: str) -> str:
    try:
        choices = reply["output"]["choices"]
        content = choices[0]["message"]["content"]
        return " ".join(part["text"] for part in content if "text" in part).strip()
    except (KeyError, IndexError, TypeError) as exc:
        raise ConversionError(f"{source}: DashScope answered without a transcript ({type(exc).__name__}: {exc}); "
                              "check convert.dashscope_asr_model") from None
