"""Local stand-ins for every remote API kbflow speaks, as one real HTTP server on 127.0.0.1 speaking their wire
formats, errors included. The tests use it (the real services are never called there) and so does
`kbflow bench embed --provider` (embedding against a throttling provider). Nothing of kbflow is mocked:
kbflow's clients send real HTTP (the dashscope SDK through requests, httpx elsewhere).

Routes
    POST /api/v1/services/embeddings/text-embedding/text-embedding   DashScope text embeddings
        {"model", "input": {"texts"}, "parameters": {"text_type", "dimension"}}
        -> {"output": {"embeddings": [{"text_index", "embedding"}]}, "usage", "request_id"}
    POST /v1/embeddings                                              OpenAI-compatible embeddings
        {"model", "input": [...], "encoding_format", "dimensions"?} -> {"data": [{"index", "embedding"}], ...}
    POST /api/v1/services/rerank/text-rerank/text-rerank             DashScope rerank
    POST /api/v1/services/aigc/multimodal-generation/generation     DashScope speech recognition (Qwen3-ASR)
    POST /v1/chat/completions                                        OpenAI-compatible chat
    Errors: DashScope ``{"code", "message", "request_id"}``; OpenAI ``{"error": {"message", "type", "code"}}``.

Behaviour of each request, in this order: a scripted fault (``script``, consumed one per request) or a periodic
one (``every``: ``{4: "429", 6: "500", 9: "slow"}`` fails every 4th, 6th and 9th request), or a 429 when the
request rate goes over ``requests_per_second`` (the provider's allowance); then the key (401); then the input
(a batch over ``max_batch`` texts, or a text holding ``poison``: 400); then the answer. Embeddings are a hash of
the text (the same text always gets the same vector), returned in reverse order (the services do not promise
order). Every request is logged in ``requests`` (route, texts, body, arrival time, status sent); ``served`` counts
each embedding text answered 200.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

DASHSCOPE_EMBED = "/api/v1/services/embeddings/text-embedding/text-embedding"
OPENAI_EMBED = "/v1/embeddings"
DASHSCOPE_RERANK = "/api/v1/services/rerank/text-rerank/text-rerank"
DASHSCOPE_ASR = "/api/v1/services/aigc/multimodal-generation/generation"
OPENAI_CHAT = "/v1/chat/completions"
ROUTES = {DASHSCOPE_EMBED: "dashscope-embed", OPENAI_EMBED: "openai-embed", DASHSCOPE_RERANK: "dashscope-rerank",
          DASHSCOPE_ASR: "dashscope-asr", OPENAI_CHAT: "openai-chat"}
DASHSCOPE_CODES = {400: "InvalidParameter", 401: "InvalidApiKey", 429: "Throttling.RateQuota",
                   500: "InternalError", 503: "ServiceUnavailable", 504: "RequestTimeOut"}
OPENAI_CODES = {400: "invalid_request_error", 401: "invalid_api_key", 429: "rate_limit_exceeded",
                500: "server_error", 503: "server_error", 504: "timeout"}


def text_vector(text: str, dimension: int) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimension)
    return (vector / np.linalg.norm(vector)).tolist()


def overlap_score(query: str, document: str) -> float:
    """The fake reranker's relevance: share of the query's characters (CJK) and words found in the document."""
    units = set(re.findall(r"[\u4e00-\u9fff]|[a-z0-9]+", query.lower()))
    found = {unit for unit in units if unit in document.lower()}
    return round(len(found) / len(units), 6) if units else 0.0


class FakeServices:
    """``with FakeServices(key=...) as fake:`` serves until the block ends; ``fake.url`` is its base URL."""

    def __init__(self, key: str = "sk-test-secret", dimension: int = 64, max_batch: int = 10, slow_s: float = 2.0,
                 retry_after: str = "1", every: dict[int, str] | None = None,
                 requests_per_second: float | None = None):
        self.key, self.dimension, self.max_batch, self.slow_s = key, dimension, max_batch, slow_s
        self.retry_after, self.every, self.requests_per_second = retry_after, dict(every or {}), requests_per_second
        self.script: list = []  # "429" | "500" | "503" | "slow" | "bad_key" | "invalid" | ("sleep", s) | (status, retry_after)
        self.poison: str | None = None
        self.response_dimension: int | None = None
        self.chat_responder = lambda messages: "ok"
        self.transcripts: list[str] = []  # speech recognition answers, one per successful request ("hello" after)
        self.requests: list[dict] = []
        self.served: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._allowance_at = 0.0  # when the next request is within the allowance
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

    def routed(self, route: str) -> list[dict]:
        """The logged requests of one route ('dashscope-embed', 'openai-chat', ...)."""
        return [request for request in self.requests if request["route"] == route]

    # -- what one request gets -------------------------------------------------------------------------------
    def _fault(self, number: int):
        with self._lock:
            if self.script:
                return self.script.pop(0)
            for period, behaviour in sorted(self.every.items()):
                if number % period == 0:
                    return behaviour
            if self.requests_per_second:
                now = time.monotonic()
                if now < self._allowance_at:
                    return (429, f"{self._allowance_at - now:.2f}")
                self._allowance_at = max(now, self._allowance_at) + 1.0 / self.requests_per_second
        return "ok"

    def _error(self, route: str, status: int, message: str, headers: dict | None = None) -> tuple:
        body: dict[str, object]
        if route.startswith("dashscope"):
            body = {"code": DASHSCOPE_CODES.get(status, "InternalError"), "message": message,
                    "request_id": str(uuid.uuid4())}
        else:
            code = OPENAI_CODES.get(status, "server_error")
            body = {"error": {"message": message, "type": code, "param": None, "code": code}}
        return status, body, headers or {}

    def _answer(self, route: str, body: dict, auth: str | None, fault) -> tuple:
        if fault == "slow":  # past the client's timeout; by the time it answers, the client is gone
            time.sleep(self.slow_s)
            return self._error(route, 504, "Request timed out.")
        if isinstance(fault, tuple) and fault[0] == "sleep":  # a late but good answer
            time.sleep(fault[1])
        if fault == "bad_key" or auth != f"Bearer {self.key}":
            return self._error(route, 401, "Invalid API-key provided.")
        if fault == "429":
            return self._error(route, 429, "Requests rate limit exceeded, please try again later.",
                               {"Retry-After": self.retry_after})
        if fault in ("500", "503"):
            return self._error(route, int(fault), "An internal error has occured.")
        if isinstance(fault, tuple) and isinstance(fault[0], int):
            headers = {"Retry-After": str(fault[1])} if len(fault) > 1 and fault[1] is not None else {}
            return self._error(route, fault[0], f"scripted {fault[0]}", headers)
        return getattr(self, "_" + route.replace("-", "_"))(route, body, fault)

    def _texts_of(self, route: str, body: dict) -> list[str]:
        if route == "dashscope-embed":
            return list(body.get("input", {}).get("texts") or [])
        if route == "openai-embed":
            return list(body.get("input") or [])
        return []

    def _embedding_error(self, route: str, texts: list[str], fault) -> tuple | None:
        if len(texts) > self.max_batch:
            return self._error(route, 400, f"batch size is invalid, it should not be larger than {self.max_batch}.: "
                                            "input.contents")
        if fault == "invalid" or (self.poison and any(self.poison in text for text in texts)):
            return self._error(route, 400, "Input should be a valid string: input.contents")
        return None

    def _dashscope_embed(self, route: str, body: dict, fault) -> tuple:
        texts = self._texts_of(route, body)
        error = self._embedding_error(route, texts, fault)
        if error:
            return error
        dimension = self.response_dimension or body.get("parameters", {}).get("dimension", self.dimension)
        items = [(i, text_vector(text, dimension)) for i, text in enumerate(texts)][::-1]
        with self._lock:
            self.served.update(texts)
        return 200, {"output": {"embeddings": [{"text_index": i, "embedding": v} for i, v in items]},
                     "usage": {"total_tokens": sum(len(t) for t in texts)}, "request_id": str(uuid.uuid4())}, {}

    def _openai_embed(self, route: str, body: dict, fault) -> tuple:
        texts = self._texts_of(route, body)
        error = self._embedding_error(route, texts, fault)
        if error:
            return error
        dimension = self.response_dimension or self.dimension
        items = [(i, text_vector(text, dimension)) for i, text in enumerate(texts)][::-1]
        with self._lock:
            self.served.update(texts)
        return 200, {"object": "list", "model": body.get("model"),
                     "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in items],
                     "usage": {"prompt_tokens": 1, "total_tokens": 1}}, {}

    def _dashscope_rerank(self, route: str, body: dict, fault) -> tuple:
        documents = body.get("input", {}).get("documents")
        query = body.get("input", {}).get("query")
        if not isinstance(documents, list) or not isinstance(query, str) or not body.get("model"):
            return self._error(route, 400, "input.query and input.documents are required")
        if len(documents) > 500:
            return self._error(route, 400, "documents must be at most 500")
        scored = sorted(((overlap_score(query, d), i) for i, d in enumerate(documents)), key=lambda p: (-p[0], p[1]))
        top_n = body.get("parameters", {}).get("top_n", len(documents))
        return 200, {"output": {"results": [{"index": i, "relevance_score": s} for s, i in scored[:top_n]]},
                     "usage": {"total_tokens": 10}, "request_id": str(uuid.uuid4())}, {}

    def _dashscope_asr(self, route: str, body: dict, fault) -> tuple:
        try:
            audio = body["input"]["messages"][1]["content"][0]["audio"]
        except (KeyError, IndexError, TypeError):
            return self._error(route, 400, "input.messages must hold a user message with audio")
        if not audio.startswith("data:audio/"):
            return self._error(route, 400, "The audio is not a data URL")
        with self._lock:
            text = self.transcripts.pop(0) if self.transcripts else "hello"
        return 200, {"request_id": str(uuid.uuid4()), "output": {"choices": [{"finish_reason": "stop", "message": {
            "annotations": [{"language": "en", "type": "audio_info", "emotion": "neutral"}],
            "content": [{"text": text}], "role": "assistant"}}]}, "usage": {"seconds": 3}}, {}

    def _openai_chat(self, route: str, body: dict, fault) -> tuple:
        content = self.chat_responder(body["messages"])
        return 200, {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                     "model": body.get("model"), "choices": [{"index": 0, "finish_reason": "stop",
                                                             "message": {"role": "assistant", "content": content}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}, {}

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, payload: dict, headers: dict) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout)
                    pass

            def do_POST(self):  # noqa: N802 (http.server's naming)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                route = ROUTES.get(self.path)
                if route is None:
                    return self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}, {})
                body = json.loads(raw or b"{}")
                auth = self.headers.get("Authorization")
                with fake._lock:
                    number = len(fake.requests) + 1
                    entry = {"route": route, "path": self.path, "number": number, "at": time.monotonic(),
                             "texts": fake._texts_of(route, body), "body": body, "auth": auth}
                    fake.requests.append(entry)
                status, payload, headers = fake._answer(route, body, auth, fake._fault(number))
                entry["status"] = status
                self._send(status, payload, headers)

        return Handler
