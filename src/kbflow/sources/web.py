"""Web pages: an http(s) URL (a page, a site's folder, a sitemap), crawled by ``kbflow.convert.web``.

Identity: host and path (``docs.example.com/guide/index.html``), the same for a page crawled as a configured web
source, added with ``add-document URL``, or fetched for an MCP client. Confinement: someone else's URL only under
an allowed prefix, to public addresses unless the prefix names the host, every redirect checked again."""

from __future__ import annotations

from kbflow.convert.web import is_web
from kbflow.sources.base import SourceKind, confine_url, register


WEB = register(SourceKind(
    name="web", origin="file", prefix="", claims=is_web, normalise=str, confine=confine_url,
    identity="host and path of the page (`docs.example.com/guide/index.html`)",
    confinement="someone else's URL: under an allowed prefix, to public addresses unless the prefix names "
                "the host, every redirect checked again",
    fetch="HTTP GET, size-limited, robots.txt and a crawl delay honoured; for someone else's URL the connection "
          "is pinned to the checked public address",
    change="ETag / Last-Modified validators, then SHA-256 of the body"))
