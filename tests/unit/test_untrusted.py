"""Untrusted input: converting a hostile HTML page fetches nothing and runs nothing.

A real HTTP server on 127.0.0.1 counts every request; the page points scripts, images, stylesheets, frames and
meta refreshes at it. Conversion must make no request at all, and the page's script text must not leak into
the Markdown.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kbflow.convert.converters import convert_file


class Counter(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        Counter.hits.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"fetched")

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    Counter.hits = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Counter)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_hostile_html_makes_no_request_and_runs_no_script(server, tmp_path):
    page = tmp_path / "hostile.html"
    page.write_text(f"""<!doctype html><html><head>
<meta http-equiv="refresh" content="0; url={server}/refresh">
<link rel="stylesheet" href="{server}/style.css"><script src="{server}/remote.js"></script>
<script>document.write("INJECTED-BY-SCRIPT"); fetch("{server}/inline");</script>
</head><body><h1>Backups</h1><p>Keep seven daily copies.</p>
<img src="{server}/pixel.png" alt="diagram"><iframe src="{server}/frame"></iframe>
<object data="{server}/object"></object><video src="{server}/video.mp4"></video>
</body></html>""", encoding="utf-8")
    markdown = convert_file(str(page), "hostile.html").markdown
    assert "Keep seven daily copies." in markdown
    assert "INJECTED-BY-SCRIPT" not in markdown and "fetch(" not in markdown
    assert Counter.hits == []
