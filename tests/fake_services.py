"""Local stand-ins for remote services, as real HTTP servers on 127.0.0.1 speaking their wire formats.

``FakeService`` serves an OpenAI-compatible ``/v1/chat/completions`` and DashScope's text-rerank endpoint,
checks the bearer key like the real services (401 with their error bodies), and plays queued faults first:
``(429, retry_after)``, ``(500,)``, ``("sleep", seconds)``. Every request body is recorded.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT_PATH = "/v1/chat/completions"
RERANK_PATH = "/api/v1/services/rerank/text-rerank/text-rerank"


def overlap_score(query: str, document: str) -> float:
    """The fake reranker's relevance: share of the query's characters (CJK) and words found in the document."""
    units = set(re.findall(r"[\u4e00-\u9fff]|[a-z0-9]+", query.lower()))
    found = {unit for unit in units if unit in document.lower()}
    return round(len(found) / len(units), 6) if units else 0.0


class FakeService:
    def __init__(self, key: str = "test-key"):
        self.key = key
        self.faults: list[tuple] = []
        self.requests: list[dict] = []
        self.chat_responder = lambda messages: "ok"
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                service.requests.append({"path": self.path, "body": body})
                if service.faults:
                    fault = service.faults.pop(0)
                    if fault[0] == "sleep":
                        time.sleep(fault[1])
                    else:
                        headers = {"Retry-After": str(fault[1])} if len(fault) > 1 else {}
                        return self.reply(fault[0], service.error_body(self.path, fault[0]), headers)
                if self.headers.get("Authorization") != f"Bearer {service.key}":
                    return self.reply(401, service.error_body(self.path, 401))
                if self.path == CHAT_PATH:
                    return self.reply(200, service.chat(body))
                if self.path == RERANK_PATH:
                    return self.reply(*service.rerank(body))
                self.reply(404, {"error": {"message": f"no route {self.path}"}})

            def reply(self, status, payload, headers=None):
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def error_body(path: str, status: int) -> dict:
        if path == RERANK_PATH:  # DashScope: code, message, request_id
            code = {401: "InvalidApiKey", 429: "Throttling.RateQuota", 400: "InvalidParameter"}.get(status, "InternalError")
            return {"code": code, "message": f"fake {code}", "request_id": str(uuid.uuid4())}
        kind = {401: "invalid_api_key", 429: "rate_limit_exceeded"}.get(status, "server_error")
        return {"error": {"message": f"fake {kind}", "type": kind, "code": kind}}

    def chat(self, body: dict) -> dict:
        content = self.chat_responder(body["messages"])
        return {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}

    def rerank(self, body: dict) -> tuple[int, dict]:
        documents = body.get("input", {}).get("documents")
        query = body.get("input", {}).get("query")
        if not isinstance(documents, list) or not isinstance(query, str) or not body.get("model"):
            return 400, self.error_body(RERANK_PATH, 400)
        if len(documents) > 500:
            return 400, {"code": "InvalidParameter", "message": "documents must be at most 500", "request_id": "x"}
        scored = sorted(((overlap_score(query, doc), i) for i, doc in enumerate(documents)), key=lambda p: (-p[0], p[1]))
        top_n = body.get("parameters", {}).get("top_n", len(documents))
        return 200, {"output": {"results": [{"index": i, "relevance_score": s} for s, i in scored[:top_n]]},
                     "usage": {"total_tokens": 10}, "request_id": str(uuid.uuid4())}
