"""DashScope speech recognition against a real HTTP server on 127.0.0.1 speaking its wire format (the real service
is never called in tests): success, bad key, 429 with Retry-After, 5xx, bad input, and the key never leaking."""

from __future__ import annotations

import base64

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_bytes, converter_fingerprint
from kbflow.core.errors import ConversionError, TransientError
from kbflow.convert.formats.dashscope_asr import ENDPOINT, DashScopeASR
from kbflow.core.retry import RetryPolicy
from kbflow.testing.fake_services import FakeServices
from tests.conftest import CASES

KEY = "sk-test-not-a-real-key-1234567890"
WAV = (CASES / "formats" / "conf-onlyperson.wav").read_bytes()


@pytest.fixture
def server():
    with FakeServices(key=KEY) as running:
        yield running


def client(server, key=KEY, retries=2, timeout_s=5.0) -> DashScopeASR:
    return DashScopeASR(key, f"{server.url}/api/v1", "qwen3-asr-flash", timeout_s,
                        RetryPolicy(attempts=retries + 1, backoff_s=0.01, max_retry_after_s=60.0))


def test_request_wire_format_and_transcript(server):
    server.transcripts = ["You are currently the only person in this conference."]
    text = client(server).transcribe(WAV, ".wav", "audio/conf.wav")
    assert text == "You are currently the only person in this conference."
    request = server.requests[0]
    assert request["path"] == "/api/v1" + ENDPOINT and request["auth"] == f"Bearer {KEY}"
    assert request["body"]["model"] == "qwen3-asr-flash"
    system, user = request["body"]["input"]["messages"]
    assert system == {"role": "system", "content": [{"text": ""}]} and user["role"] == "user"
    prefix, encoded = user["content"][0]["audio"].split(",", 1)
    assert prefix == "data:audio/wav;base64" and base64.b64decode(encoded) == WAV


def test_429_with_retry_after_then_success(server):
    server.script, server.transcripts = [(429, "1"), (503,)], ["hello"]
    assert client(server).transcribe(WAV, ".wav", "a.wav") == "hello"
    times = [request["at"] for request in server.requests]
    assert [r["status"] for r in server.requests] == [429, 503, 200] and times[1] - times[0] >= 1.0


def test_5xx_until_retries_run_out_is_transient(server):
    server.script = [(500,)] * 3
    with pytest.raises(TransientError, match="failed after 3 attempts.*HTTP 500 InternalError"):
        client(server, retries=2).transcribe(WAV, ".wav", "a.wav")


def test_a_slow_answer_times_out_and_is_retried(server):
    server.script, server.transcripts = [("sleep", 2)], ["in time", "late"]  # the retry answers first
    assert client(server, timeout_s=0.5).transcribe(WAV, ".wav", "a.wav") == "in time"
    assert len(server.requests) == 2


def test_bad_key_fails_at_once_without_showing_the_key(server):
    wrong = "sk-wrong-key-abcdef"
    with pytest.raises(ConversionError, match="HTTP 401 InvalidApiKey.*API key was refused") as info:
        client(server, key=wrong).transcribe(WAV, ".wav", "a.wav")
    assert wrong not in str(info.value) and len(server.requests) == 1


def test_bad_input_is_permanent(server):
    server.script = [(400,)]
    with pytest.raises(ConversionError, match="rejected the audio .*InvalidParameter"):
        client(server).transcribe(WAV, ".wav", "a.wav")


def test_audio_backend_auto_uses_dashscope_when_the_key_is_set(server, monkeypatch):
    monkeypatch.setenv("KBFLOW_TEST_DASHSCOPE_KEY", KEY)
    options = ConvertConfig(dashscope={"api_key_env": "KBFLOW_TEST_DASHSCOPE_KEY", "base_url": server.url})
    server.transcripts = ["weasels have eaten our phone system"]
    result = convert_bytes(WAV, "tt.wav", "audio/tt.wav", options)
    assert result.markdown == "weasels have eaten our phone system\n"
    assert result.converter.endswith(":audio-dashscope")
    assert "dashscope-asr(qwen3-asr-flash)" in converter_fingerprint(options)  # a backend switch re-converts
    assert KEY not in result.converter
