"""A documentation site on 127.0.0.1 for the web-source benchmark and tests: a folder served over real HTTP with
the validators real servers send (a strong ``ETag`` from the bytes, ``Last-Modified`` from the file's time) and
their conditional answers (304), a sitemap made from the pages it serves, a ``robots.txt``, and a log of every
request (path, status, body bytes). What it serves can be switched while it runs (a new release of the site)."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit


@dataclass
class SiteState:
    """What the site serves; tests change it between runs."""

    folder: Path
    base: str = "/docs/"  # where the folder's pages are served
    pages: list[str] | None = None  # file names listed in the sitemap and served (None: every *.html)
    robots: str = ""  # robots.txt body ('' answers 404)
    status: dict[str, int] = field(default_factory=dict)  # page name (or sitemap.xml) -> forced status (503 ...)
    redirects: dict[str, str] = field(default_factory=dict)  # page name -> Location
    lastmod: bool = False  # <lastmod> in the sitemap (from the file's time)

    def names(self) -> list[str]:
        if self.pages is not None:
            return list(self.pages)
        return sorted(path.name for path in self.folder.glob("*.html"))


class StaticSite:
    """``with StaticSite(SiteState(folder)) as site:`` serves at ``site.url`` (``http://127.0.0.1:PORT/docs/``)."""

    def __init__(self, state: SiteState):
        self.state = state
        self.log: list[tuple[str, int, int]] = []  # (path, status, body bytes)
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{self.state.base}"

    def __enter__(self) -> StaticSite:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def take_log(self) -> list[tuple[str, int, int]]:
        with self.lock:
            taken, self.log = self.log, []
        return taken

    def sitemap(self) -> bytes:
        rows = []
        for name in self.state.names():
            lastmod = ""
            if self.state.lastmod:
                lastmod = f"<lastmod>{int((self.state.folder / name).stat().st_mtime)}</lastmod>"
            rows.append(f"<url><loc>{self.url}{name}</loc>{lastmod}</url>")
        return ('<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                + "".join(rows) + "</urlset>\n").encode()


def _handler(site: StaticSite):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the site's own log is enough
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = urlsplit(self.path).path
            state = site.state
            name = path[len(state.base):] if path.startswith(state.base) else None
            if name in state.status:
                self._answer(state.status[name], b"busy", "text/plain")
            elif path == "/robots.txt":
                self._answer(200 if state.robots else 404, state.robots.encode(), "text/plain")
            elif name == "sitemap.xml":
                self._answer(200, site.sitemap(), "application/xml")
            elif name in state.redirects:
                self._answer(302, b"", "text/html", {"Location": state.redirects[name]})
            elif name and name in state.names() and (state.folder / name).is_file():
                self._page(state.folder / name)
            else:
                self._answer(404, b"not found", "text/plain")

        def _page(self, file: Path) -> None:
            body = file.read_bytes()
            etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
            mtime = int(file.stat().st_mtime)
            headers = {"ETag": etag, "Last-Modified": formatdate(mtime, usegmt=True)}
            if self.headers.get("If-None-Match"):
                if etag in [tag.strip() for tag in self.headers["If-None-Match"].split(",")]:
                    return self._answer(304, b"", "text/html", headers)
            elif self.headers.get("If-Modified-Since"):
                try:
                    since = parsedate_to_datetime(self.headers["If-Modified-Since"]).timestamp()
                except (TypeError, ValueError):
                    since = None
                if since is not None and mtime <= since:
                    return self._answer(304, b"", "text/html", headers)
            self._answer(200, body, "text/html; charset=utf-8", headers)

        def _answer(self, status: int, body: bytes, content_type: str, headers: dict | None = None) -> None:
            with site.lock:
                site.log.append((self.path, status, len(body) if status != 304 else 0))
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body) if status != 304 else 0))
            self.end_headers()
            if status != 304:
                self.wfile.write(body)

    return Handler
