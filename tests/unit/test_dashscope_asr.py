"""DashScope speech recognition against a real HTTP server on 127.0.0.1 speaking its wire format (the real service
is never called in tests): success, bad key, 429 with Retry-After, 5xx, bad input, and the key never leaking."""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_bytes, converter_fingerprint
from kbflow.errors import ConversionError, TransientError
from kbflow.convert.formats.dashscope_asr import ENDPOINT, DashScopeASR
from tests.conftest import CASES

KEY = "sk-test-not-a-real-key-1234567890"
WAV = (CASES / "formats" / "conf-onlyperson.wav").read_bytes()


class FakeDashScope(BaseHTTPRequestHandler):
    """Answers from ``self.server.script``: a list of (status, headers, body) consumed one per request."""

    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            status, headers, payload = 401, {}, {"code": "InvalidApiKey", "message": "Invalid API-key provided."}
        else:
            status, headers, payload = self.server.script.pop(0)
        if status == "hang":  # a server that answers too late: the client's timeout must fire
            time.sleep(headers["seconds"])
            status, headers = 200, {}
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout test)
            pass

    def log_message(self, *args):
        pass


def success(text: str) -> tuple:
    return 200, {}, {"request_id": "r1", "output": {"choices": [{"finish_reason": "stop", "message": {
        "annotations": [{"language": "en", "type": "audio_info", "emotion": "neutral"}],
        "content": [{"text": text}], "role": "assistant"}}]}, "usage": {"seconds": 3}}


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), FakeDashScope)
    httpd.requests, httpd.script = [], []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()


def client(server, key=KEY, retries=2, timeout_s=5.0) -> DashScopeASR:
    return DashScopeASR(key, f"http://127.0.0.1:{server.server_address[1]}/api/v1", "qwen3-asr-flash", timeout_s, retries,
                        backoff_s=0.01)


def test_request_wire_format_and_transcript(server):
    server.script = [success("You are currently the only person in this conference.")]
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
    server.script = [(429, {"Retry-After": "1"}, {"code": "Throttling", "message": "Requests rate limit exceeded"}),
                     (503, {}, {"code": "ServiceUnavailable", "message": "busy"}), success("hello")]
    assert client(server).transcribe(WAV, ".wav", "a.wav") == "hello"
    assert len(server.requests) == 3


def test_5xx_until_retries_run_out_is_transient(server):
    server.script = [(500, {}, {"code": "InternalError", "message": "oops"})] * 3
    with pytest.raises(TransientError, match="failed after 3 attempts.*HTTP 500 InternalError"):
        client(server, retries=2).transcribe(WAV, ".wav", "a.wav")


def test_a_slow_answer_times_out_and_is_retried(server):
    server.script = [("hang", {"seconds": 2}, success("late")[2]), success("in time")]
    assert client(server, timeout_s=0.5).transcribe(WAV, ".wav", "a.wav") == "in time"
    assert len(server.requests) == 2


def test_bad_key_fails_at_once_without_showing_the_key(server):
    wrong = "sk-wrong-key-abcdef"
    with pytest.raises(ConversionError, match="HTTP 401 InvalidApiKey.*API key was refused") as info:
        client(server, key=wrong).transcribe(WAV, ".wav", "a.wav")
    assert wrong not in str(info.value) and len(server.requests) == 1


def test_bad_input_is_permanent(server):
    server.script = [(400, {}, {"code": "InvalidParameter", "message": "The audio is too long"})]
    with pytest.raises(ConversionError, match="rejected the audio .*InvalidParameter"):
        client(server).transcribe(WAV, ".wav", "a.wav")


def test_audio_backend_auto_uses_dashscope_when_the_key_is_set(server, monkeypatch):
    monkeypatch.setenv("KBFLOW_TEST_DASHSCOPE_KEY", KEY)
    options = ConvertConfig(dashscope_api_key_env="KBFLOW_TEST_DASHSCOPE_KEY",
                            dashscope_base_url=f"http://127.0.0.1:{server.server_address[1]}")
    server.script = [success("weasels have eaten our phone system")]
    result = convert_bytes(WAV, "tt.wav", "audio/tt.wav", options)
    assert result.markdown == "weasels have eaten our phone system\n"
    assert result.converter.endswith(":audio-dashscope")
    assert "dashscope-asr(qwen3-asr-flash)" in converter_fingerprint(options)  # a backend switch re-converts
    assert KEY not in result.converter
