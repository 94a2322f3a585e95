"""Web sources: a documentation site kept in step with conditional requests.

A source ``https://site/docs/sitemap.xml`` (a last segment ending in ``.xml`` or ``.xml.gz``) lists its pages
from the sitemap, nested sitemap indexes followed; any other http(s) URL is a start page, crawled breadth first
(links resolved against the page like a browser does, ``<base href>`` included; fragments dropped; query strings
dropped unless ``web.keep_query``), up to ``web.max_depth`` links deep and ``web.max_pages`` pages. Either way the
source's *site* is its URL's scheme, host and folder (``https://site/docs/``): pages, nested sitemaps, links and
redirects outside it are not read. That is ``kbflow.core.trust``'s ``SourcePolicy`` with that folder as its only
prefix; the prefix names the host, so a site on a private address is read when the user names it, and nothing
else on that network is. ``robots.txt`` (the host's own, the one read outside the folder) is honoured.

Each page is requested once per run with the validators of its last download (``If-None-Match`` /
``If-Modified-Since``). A 304 is a source carrying the stored hash (the plan says unchanged; nothing is
downloaded); a 200 is saved under ``<data dir>/web/<namespace>/pages/`` and hashed; a 404/410, a page gone from
the sitemap or one robots.txt disallows is not listed (the plan removes it, through the deletion guard); a 5xx, a
timeout or a refused redirect is a source that fails at conversion with the reason, so its stored version stays.
A sitemap or robots.txt that cannot be read makes the whole source out of sight: nothing under it is removed.

Validators are sent only for a page whose saved body still has the hash they were recorded with, so a 304 always
means "the server's version is the saved body": a 304 source carries that body's hash and points at it, and the
plan compares the hash with the manifest's as for any file. A crash between a download and the manifest write
leaves a body the manifest does not hold yet: the next run's 304 (or 200) lists it as changed and ingests it; a
lost or altered body costs one full download. The validators (``pages.json``) are written by ``save_state`` after
the run's store and manifest writes.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import posixpath
import threading
import time
import xml.etree.ElementTree as ET
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html.parser import HTMLParser
from urllib.parse import quote, urldefrag, urljoin, urlsplit
from urllib.robotparser import RobotFileParser

from kbflow.convert.formats.registry import content_type_suffixes
from kbflow.convert.scan import SourceFile, UnreadableFolder, doc_id_for
from kbflow.core.errors import KbflowError, PermanentError
from kbflow.core.storage import write_bytes_atomic
from kbflow.core.trust import SourcePolicy, SourceRefused, fetch, http_client

STATE_VERSION = 1
MAX_SITEMAP_NESTING = 5
URL_SAFE = ":/?#[]@!$&'()*+,;=%~"


def suffix_for(url: str, content_type: str, default: str) -> str:
    """The extension a fetched body is converted by: its content type's, else its URL path's (a short ASCII
    one), else ``default``."""
    known = content_type_suffixes().get(content_type.split(";", 1)[0].strip().lower())
    if known:
        return known
    suffix = posixpath.splitext(urlsplit(url).path)[1].lower()
    return suffix if suffix.isascii() and suffix[1:].isalnum() and len(suffix) <= 8 else default


def is_web(source: object) -> bool:
    return isinstance(source, str) and source.lower().startswith(("http://", "https://"))


def is_sitemap(url: str) -> bool:
    return urlsplit(url).path.lower().endswith((".xml", ".xml.gz"))


def site_of(url: str) -> str:
    """The folder a web source covers: its URL up to the last '/' of the path (query and fragment dropped)."""
    parts = urlsplit(url)
    return f"{parts.scheme.lower()}://{parts.netloc.lower()}{parts.path.rsplit('/', 1)[0] or ''}/"


def source_path_of(url: str) -> str:
    """A page's source path: host (and port) and path, ``index.html`` for a folder, then the query if kept; stable
    from the URL alone, so a page keeps its document id across runs."""
    parts = urlsplit(url)
    path = parts.path or "/"
    return parts.netloc.lower() + (path + "index.html" if path.endswith("/") else path) + \
        (f"?{parts.query}" if parts.query else "")


@dataclass
class WebScan:
    """What the web sources of one run listed: sources for the plan, folders out of sight, the validators to save
    once the run's writes succeeded, and what it cost."""

    sources: list[SourceFile] = field(default_factory=list)
    unreadable: list[UnreadableFolder] = field(default_factory=list)
    records: dict[str, dict] = field(default_factory=dict)  # url -> validators of the version listed
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("requests", "bytes", "downloaded", "not_modified", "lastmod_unchanged", "gone", "failed", "disallowed"), 0))


class Pages:
    """The download folder and validator file of one namespace: ``<data dir>/web/<namespace>/``."""

    def __init__(self, folder):
        self.folder = folder
        self.state_path = folder / "pages.json"

    def read(self) -> dict[str, dict]:
        if not self.state_path.exists():
            return {}
        try:
            payload = json.loads(self.state_path.read_text(encoding="utf-8"))
        except (ValueError, OSError):  # a damaged validator file costs full downloads, never a wrong 304
            return {}
        return payload.get("pages", {}) if payload.get("version") == STATE_VERSION else {}

    def body_path(self, url: str, content_type: str):
        suffix = suffix_for(url, content_type, ".html")  # a site's page of no known type is read as HTML
        return self.folder / "pages" / (hashlib.sha256(url.encode()).hexdigest()[:32] + suffix)

    def body_sha256(self, record: dict) -> str | None:
        path = self.folder / "pages" / record["file"]
        try:
            return hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            return None


def save_state(folder, scan: WebScan) -> None:
    """Write the validators of what the run listed (after its store and manifest writes) and drop saved bodies of
    pages no longer listed."""
    pages = Pages(folder)
    write_bytes_atomic(pages.state_path, json.dumps({"version": STATE_VERSION, "pages": scan.records},
                                                     sort_keys=True).encode())
    kept = {record["file"] for record in scan.records.values()}
    body_folder = folder / "pages"
    if body_folder.exists():
        for path in body_folder.iterdir():
            if path.name not in kept:
                path.unlink(missing_ok=True)


class _Pace:
    """Request starts on one host at least ``interval`` seconds apart."""

    def __init__(self, interval: float):
        self.interval = interval
        self.lock = threading.Lock()
        self.next_start = 0.0

    def wait(self) -> None:
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_start)
            self.next_start = start + self.interval
        if start > now:
            time.sleep(start - now)


@dataclass
class _Page:
    """One page's outcome: ``source`` when it is listed (None: gone, disallowed), ``record`` the validators to
    keep, ``links`` what a crawl follows from it."""

    source: SourceFile | None
    record: dict | None
    links: list[str] = field(default_factory=list)


class _Site:
    """One web source's reader: its policy, robots rules, pace, and the run's shared counters."""

    def __init__(self, url: str, namespace: str, config, pages: Pages, old: dict[str, dict], force: bool,
                 save: bool, scan: WebScan, lock: threading.Lock):
        self.url, self.namespace, self.config, self.pages = url, namespace, config, pages
        self.old, self.force, self.save, self.scan, self.lock = old, force, save, scan, lock
        self.site = site_of(url)
        self.policy = SourcePolicy.create([], [self.site], source_setting="sources")
        self.pace = _Pace(1.0 / config.requests_per_second)
        self.robots: RobotFileParser | None = None
        self.client = http_client(config.timeout_s)  # one per site: its connections are reused, it is closed last

    def get(self, url: str, policy: SourcePolicy | None = None, headers: dict | None = None):
        self.pace.wait()
        with self.lock:
            self.scan.counts["requests"] += 1
        fetched = fetch(url, policy or self.policy, int(self.config.max_page_mb * 1e6), self.config.timeout_s,
                        headers={"User-Agent": self.config.user_agent, **(headers or {})}, client=self.client)
        with self.lock:
            self.scan.counts["bytes"] += len(fetched.content)
        return fetched

    def read_robots(self) -> None:
        """The host's robots.txt: a 4xx (none) allows everything; a 5xx or no answer raises (out of sight)."""
        parts = urlsplit(self.url)
        robots_url = f"{parts.scheme.lower()}://{parts.netloc.lower()}/robots.txt"
        self.robots = RobotFileParser(robots_url)
        try:
            text = self.get(robots_url, SourcePolicy.create([], [robots_url], source_setting="sources")).content
        except KbflowError as exc:
            if 400 <= getattr(exc, "status", 0) < 500:
                self.robots.parse([])
                return
            raise
        self.robots.parse(text.decode("utf-8", "replace").splitlines())
        delay = self.robots.crawl_delay(self.config.user_agent)
        if delay:
            self.pace.interval = max(self.pace.interval, float(delay))

    def in_scope(self, url: str) -> bool:
        path = urlsplit(url).path
        return url.startswith(self.site) and not any(fnmatch.fnmatch(path, p) for p in self.config.exclude)

    def page(self, url: str, lastmod: str | None = None) -> _Page:
        if self.robots is None:
            raise RuntimeError("read_robots() must run before the site's pages are read")
        if not self.robots.can_fetch(self.config.user_agent, url):
            self._count("disallowed")
            return _Page(None, None)
        old = self.old.get(url)
        source_path = source_path_of(url)
        doc_id = doc_id_for(self.namespace, source_path)
        headers = {}
        if old and not self.force and self.pages.body_sha256(old) == old["sha256"]:  # they describe the saved body
            if self.config.use_lastmod and lastmod and old.get("lastmod") == lastmod:
                self._count("lastmod_unchanged")
                return self._unchanged(url, old)
            headers = {name: old[key] for name, key in (("If-None-Match", "etag"),
                                                       ("If-Modified-Since", "last_modified")) if old.get(key)}
        try:
            fetched = self.get(url, headers=headers)
            if fetched.status == 304 and old is None:  # only a stored page is asked conditionally
                raise PermanentError(f"URL {url!r} answered 304 Not Modified to a request that was not conditional")
        except KbflowError as exc:
            if getattr(exc, "status", None) in (404, 410):
                self._count("gone")
                return _Page(None, None)
            self._count("failed")
            if isinstance(exc, SourceRefused) and f"URL {url!r}" not in str(exc):  # refused at a redirect hop
                reason = (f"not read: it redirects outside the source's folder {self.site}; its stored version is "
                          "kept (list the page's new address, or remove it from the site's sitemap)")
            else:
                reason = f"not downloaded ({exc}); its stored version is kept and the next run tries again"
            failed = SourceFile(doc_id=doc_id, source_path=source_path, abs_path=url,
                                source_sha256=hashlib.sha256(f"failed\x00{exc}".encode()).hexdigest(), size=0,
                                mtime=0.0, mime="text/html", unreadable=reason)
            return _Page(failed, old, list((old or {}).get("links", [])))
        if fetched.status == 304 and old is not None:
            self._count("not_modified")
            return self._unchanged(url, {**old, "lastmod": lastmod})
        return self._downloaded(url, fetched, source_path, doc_id, lastmod)

    def _unchanged(self, url: str, old: dict) -> _Page:
        path = self.pages.folder / "pages" / old["file"]
        source = SourceFile(doc_id=doc_id_for(self.namespace, old["source_path"]), source_path=old["source_path"],
                            abs_path=str(path), source_sha256=old["sha256"], size=old["size"],
                            mtime=old.get("mtime", 0.0),
                            mime=old["mime"])
        return _Page(source, old, list(old.get("links", [])))

    def _downloaded(self, url: str, fetched, source_path: str, doc_id: str, lastmod: str | None) -> _Page:
        self._count("downloaded")
        mime = fetched.content_type.split(";")[0].strip().lower() or "text/html"
        path = self.pages.body_path(url, mime)
        if self.save:
            write_bytes_atomic(path, fetched.content, durable=False)
        digest, now = hashlib.sha256(fetched.content).hexdigest(), time.time()
        links = _links(fetched.content, fetched.url) if mime in ("text/html", "application/xhtml+xml") else []
        record = {"source_path": source_path, "file": path.name, "sha256": digest, "size": len(fetched.content),
                  "mime": mime, "mtime": now, "etag": fetched.headers.get("etag"), "last_modified": fetched.headers.get(
                      "last-modified"), "lastmod": lastmod, "links": links}
        source = SourceFile(doc_id=doc_id, source_path=source_path, abs_path=str(path) if self.save else url,
                            source_sha256=digest, size=len(fetched.content), mtime=now, mime=mime)
        return _Page(source, record, links)

    def _count(self, what: str) -> None:
        with self.lock:
            self.scan.counts[what] += 1

    # -- listing -------------------------------------------------------------------------------------------------

    def sitemap_entries(self, url: str, depth: int = 0) -> list[tuple[str, str | None]]:
        """(page URL, lastmod) of a sitemap, nested indexes followed; any failure raises (out of sight)."""
        content = self.get(url).content
        if content[:2] == b"\x1f\x8b":  # a .xml.gz sitemap: unpacked up to the page limit, never further
            limit = int(self.config.max_page_mb * 1e6)
            content = zlib.decompressobj(wbits=31).decompress(content, limit + 1)
            if len(content) > limit:
                raise PermanentError(f"sitemap {url!r} unpacks to more than web.max_page_mb")
        root = ET.fromstring(content)  # expat >= 2.4.1 refuses entity expansion bombs; no external entities
        kind = root.tag.rsplit("}", 1)[-1]
        entries: list[tuple[str, str | None]] = []
        for item in root:
            loc = next((c.text.strip() for c in item if c.tag.rsplit("}", 1)[-1] == "loc" and c.text), None)
            lastmod = next((c.text.strip() for c in item if c.tag.rsplit("}", 1)[-1] == "lastmod" and c.text), None)
            if not loc:
                continue
            if kind == "sitemapindex":  # nested sitemaps: only those within the site are read
                if depth < MAX_SITEMAP_NESTING and loc.startswith(self.site):
                    entries += self.sitemap_entries(loc, depth + 1)
            elif self.in_scope(urldefrag(loc)[0]):
                entries.append((urldefrag(loc)[0], lastmod))
        return list(dict.fromkeys(entries))

    def crawl(self, pool: ThreadPoolExecutor) -> dict[str, _Page]:
        """Pages reachable from the start page within the site, breadth first."""
        found: dict[str, _Page] = {}
        start = self._normal(self.url)
        seen, level, depth, listed = {start}, [start], 0, 0
        while level:
            fetched = []
            while level and listed < self.config.max_pages:  # pages gone or disallowed do not count
                batch, level = level[: self.config.max_pages - listed], level[self.config.max_pages - listed:]
                for url, page in zip(batch, pool.map(self.page, batch)):
                    found[url] = page
                    listed += page.source is not None
                fetched += batch
            if depth == 0 and found[start].source is None:  # a typo or a moved site must not empty the namespace
                raise PermanentError(f"start page {start!r} is gone or disallowed by robots.txt")
            if depth >= self.config.max_depth or listed >= self.config.max_pages:
                break
            following = []
            for url in fetched:
                for link in found[url].links:
                    link = self._normal(link)
                    if link not in seen and self.in_scope(link):
                        seen.add(link)
                        following.append(link)
            level, depth = following, depth + 1
        return found

    def _normal(self, url: str) -> str:
        url = urldefrag(url)[0]
        return url if self.config.keep_query else url.split("?", 1)[0]


class _LinkParser(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.base: str | None = None
        self.hrefs: list[str] = []

    def handle_starttag(self, tag, attrs):
        values = dict(attrs)
        if tag == "base" and values.get("href") and self.base is None:
            self.base = values["href"]
        elif tag in ("a", "area") and values.get("href"):
            self.hrefs.append(values["href"].strip())


def _links(content: bytes, page_url: str) -> list[str]:
    """Absolute http(s) links of an HTML page, resolved as a browser does (against ``<base href>`` if any)."""
    parser = _LinkParser()
    try:
        parser.feed(content.decode("utf-8", "replace"))
        parser.close()
    except Exception:  # a page too broken to parse gives no links; its conversion reports the rest
        return []
    base = urljoin(page_url, parser.base) if parser.base else page_url
    # spaces and other characters a browser percent-encodes are encoded the same way (the URL check refuses them raw)
    links = (quote(urldefrag(urljoin(base, href))[0], safe=URL_SAFE) for href in parser.hrefs)
    return list(dict.fromkeys(link for link in links if link.lower().startswith(("http://", "https://"))))


def scan_web(urls: list[str], namespace: str, config, folder, force: bool = False, save: bool = True) -> WebScan:
    """List and fetch the pages of web sources (``config``: ``web``; ``folder``: ``<data dir>/web/<namespace>``;
    ``force``: no conditional requests; ``save``: keep the bodies, not on a dry run)."""
    scan, lock, pages = WebScan(), threading.Lock(), Pages(folder)
    old = pages.read()
    found: dict[str, _Page] = {}
    for url in urls:
        site = _Site(url, namespace, config, pages, old, force, save, scan, lock)
        with site.client, ThreadPoolExecutor(max_workers=config.concurrency, thread_name_prefix="kbflow-web") as pool:
            try:
                site.read_robots()
                if is_sitemap(url):
                    entries = site.sitemap_entries(url)[: config.max_pages]
                    listed = dict(zip((u for u, _ in entries),
                                      pool.map(lambda entry: site.page(*entry), entries)))
                else:
                    listed = site.crawl(pool)
            except (KbflowError, ET.ParseError, OSError, EOFError) as exc:
                scan.unreadable.append(UnreadableFolder(source_path_of(site.site).removesuffix("/index.html"),
                                                        f"web source {url!r} could not be listed: {exc}"))
                # out of sight: what it listed last time stays, validators included
                found.update({u: _Page(None, r) for u, r in old.items() if u.startswith(site.site)})
                continue
        found.update(listed)
    sources: dict[str, SourceFile] = {}
    for url, page in found.items():
        if page.record is not None:
            scan.records[url] = page.record
        if page.source is not None:
            sources[page.source.source_path] = page.source
    scan.sources = [sources[key] for key in sorted(sources)]
    return scan
