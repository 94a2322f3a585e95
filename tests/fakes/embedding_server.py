"""A real HTTP server on 127.0.0.1 speaking DashScope's and OpenAI's embeddings wire formats.

Not a mock of kbflow's code: the backends send real HTTP through ``dashscope`` (requests) and httpx. The server
returns deterministic vectors (a hash of the text, so the same text always gets the same vector) and can be
scripted to misbehave the ways the real services do: 429 with Retry-After, 500, a reply slower than the client's
timeout, a too-large batch, a bad key, an invalid input.

DashScope: POST /api/v1/services/embeddings/text-embedding/text-embedding
    {"model", "input": {"texts": [...]}, "parameters": {"text_type", "dimension"}}
    -> 200 {"output": {"embeddings": [{"text_index", "embedding"}]}, "usage": {"total_tokens"}, "request_id"}
    -> error {"code": "Throttling.RateQuota" | "InvalidApiKey" | "InvalidParameter" | "InternalError", "message", "request_id"}
OpenAI: POST /v1/embeddings {"model", "input": [...], "encoding_format", "dimensions"?}
    -> 200 {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}
    -> error {"error": {"message", "type", "param", "code"}}
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

DASHSCOPE_PATH = "/api/v1/services/embeddings/text-embedding/text-embedding"
OPENAI_PATH = "/v1/embeddings"


def text_vector(text: str, dimension: int) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimension)
    return (vector / np.linalg.norm(vector)).tolist()


class EmbeddingServer:
    """``script``: a list of behaviours consumed one per request, in arrival order ('429', '500', 'slow',
    'bad_key', 'invalid'); an exhausted script answers normally. ``poison``: a request holding a text that
    contains it is refused as invalid input (400), every time. ``served`` counts each text answered with 200."""

    def __init__(self, key: str = "sk-test-secret", max_batch: int = 10, dimension: int = 64, slow_s: float = 2.0,
                 retry_after: str = "1", response_dimension: int | None = None):
        self.key, self.max_batch, self.dimension, self.slow_s = key, max_batch, dimension, slow_s
        self.retry_after, self.response_dimension = retry_after, response_dimension
        self.script: list[str] = []
        self.poison: str | None = None
        self.served: Counter[str] = Counter()
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def _next(self) -> str:
        with self._lock:
            return self.script.pop(0) if self.script else "ok"

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict, headers: dict | None = None) -> None:
                body = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in (headers or {}).items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                    pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = json.loads(raw or b"{}")
                if self.path == DASHSCOPE_PATH:
                    texts = request["input"]["texts"]
                    params = request.get("parameters", {})
                    dimension, kind = params.get("dimension", server.dimension), "dashscope"
                elif self.path == OPENAI_PATH:
                    texts, dimension, kind = request["input"], server.dimension, "openai"
                else:
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                with server._lock:
                    server.requests.append({"kind": kind, "texts": texts, "body": request, "at": time.monotonic(),
                                            "auth": self.headers.get("Authorization")})
                error = server._error(kind, texts, self.headers.get("Authorization"))
                if error is not None:
                    return self._send(*error)
                dimension = server.response_dimension or dimension
                items = [(i, text_vector(t, dimension)) for i, t in enumerate(texts)]
                items.reverse()  # the services do not promise order; clients must sort by index
                with server._lock:
                    server.served.update(texts)
                if kind == "dashscope":
                    return self._send(200, {"output": {"embeddings": [{"text_index": i, "embedding": v} for i, v in items]},
                                            "usage": {"total_tokens": sum(len(t) for t in texts)},
                                            "request_id": str(uuid.uuid4())})
                return self._send(200, {"object": "list", "model": request.get("model"),
                                        "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in items],
                                        "usage": {"prompt_tokens": 1, "total_tokens": 1}})

        return Handler

    def _error(self, kind: str, texts: list[str], auth: str | None):
        behaviour = self._next()
        if behaviour == "slow":  # past the client's timeout; by the time it answers, the client is gone
            time.sleep(self.slow_s)
            return self._fail(kind, 504, "RequestTimeOut", "timeout", "Request timed out.")
        if behaviour == "bad_key" or auth != f"Bearer {self.key}":
            return self._fail(kind, 401, "InvalidApiKey", "invalid_api_key", "Invalid API-key provided.")
        if behaviour == "429":
            return self._fail(kind, 429, "Throttling.RateQuota", "rate_limit_exceeded",
                              "Requests rate limit exceeded, please try again later.", {"Retry-After": self.retry_after})
        if behaviour == "500":
            return self._fail(kind, 500, "InternalError", "server_error", "An internal error has occured.")
        if len(texts) > self.max_batch:
            return self._fail(kind, 400, "InvalidParameter", "invalid_request_error",
                              f"batch size is invalid, it should not be larger than {self.max_batch}.: input.contents")
        if behaviour == "invalid" or (self.poison and any(self.poison in t for t in texts)):
            return self._fail(kind, 400, "InvalidParameter", "invalid_request_error",
                              "Input should be a valid string: input.contents")
        return None

    @staticmethod
    def _fail(kind, status, ds_code, oa_code, message, headers=None):
        if kind == "dashscope":
            return status, {"code": ds_code, "message": message, "request_id": str(uuid.uuid4())}, headers
        return status, {"error": {"message": message, "type": oa_code, "param": None, "code": oa_code}}, headers
