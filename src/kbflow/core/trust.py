"""The trust boundary: what someone else may make kbflow read.

The CLI and the Python API act as the OS user who runs them; nothing here applies to them. Everything that arrives
from someone else goes through ``SourcePolicy.check`` before a byte is read: an MCP tool call (``kbflow mcp
--root`` / ``--allow-source``), a Prefect Run form or a CI backfill (``deploy.source_roots``). The policy is built
once, at start-up, from resolved roots; a refusal is one ``SourceRefused`` naming the setting that would allow it.

* A path is allowed when its fully resolved real path (``~``, ``..`` and every symlink followed) lies under a root.
  "Under" is decided by comparing the identity (device, inode) of each of its ancestors with each root's, so a
  differently cased spelling on a case-insensitive file system, or a bind mount of a root, is recognised and a
  name that merely starts with a root's name is not. A refusal never says where a link points or whether a path
  outside the roots exists.
* A ``file://`` URL is a path, and a ``file://`` prefix (``--allow-source file:///srv/docs/``, a
  ``deploy.source_roots`` entry) is a root: the same real-path check and the same walk confinement.
* A folder's walk does not follow symlinked folders (``kbflow.convert.scan``) and refuses a symlinked file whose
  real path leaves the roots, or that leads nowhere (``contains``), so a link planted inside a root reads nothing
  outside it, and a broken link is refused in the same words as an outside one.
* A URL is allowed only when it starts with an allowed prefix (same scheme and host, then the path on a segment
  boundary; ``..`` refused). An http(s) URL's host must resolve to public addresses only (no loopback,
  link-local, private, shared or reserved ranges) unless the matching prefix names that host; ``fetch`` pins the
  connection to the addresses it checked and checks every redirect hop again. An IPv6 address that carries an
  IPv4 address (mapped, translated, compatible, NAT64, 6to4, Teredo) is judged by the IPv4 address too.

Limits (docs/security.md): a file swapped for a symlink between the check and the read (time of check / time of
use) is not caught; a hard link to a file outside a root cannot be told from the file itself; a prefix that
names a host trusts what that host's DNS answers.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from kbflow.core.urls import is_url
from kbflow.core.errors import ConfigError, PermanentError, TransientError

MAX_REDIRECTS = 5
USER_AGENT = "kbflow (+https://pypi.org/project/kbflow/)"


class SourceRefused(ConfigError):
    """A path or URL that the caller may not make kbflow read."""


@dataclass(frozen=True)
class Prefix:
    """One allowed URL prefix, parsed once: scheme, host (empty: any public host) and port, path."""

    text: str
    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def parse(cls, text: str) -> Prefix:
        parts = urlsplit(text.strip())
        if not parts.scheme or "://" not in text:
            raise ConfigError(f"allowed source {text!r} is not a URL prefix: write it as scheme://host/path/, e.g. "
                              "s3://team-docs/ or https://docs.example.com/manual/")
        path = parts.path or "/"
        return cls(text.strip(), parts.scheme.lower(), (parts.hostname or "").lower(), _port(parts), path)

    def matches(self, scheme: str, host: str, port: int | None, path: str) -> bool:
        if scheme != self.scheme or (self.host and (host != self.host or port != self.port)):
            return False
        return path == self.path or path.startswith(self.path if self.path.endswith("/") else self.path + "/")


MAX_PATH_BYTES = 4096  # PATH_MAX on Linux: a longer path is refused before the file system is asked
MAX_NAME_BYTES = 255  # NAME_MAX: the longest name of one file or folder


def is_file_url(source: object) -> bool:
    return isinstance(source, str) and source[:7].lower() == "file://"


def file_path(url: str) -> str:
    """The local path a ``file://`` URL names (``file:///srv/docs/`` → ``/srv/docs/``); a host other than
    localhost is refused (it would name another machine)."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise SourceRefused(f"URL {url!r} names host {parts.netloc!r}: a file:// URL reads this machine's files "
                            "only (write file:///path)")
    return unquote(parts.path) or "/"


def _root(root: str | Path, setting: str) -> Path:
    """A root resolved once (symlinks followed), which must be an existing folder."""
    path = Path(root).expanduser()
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ConfigError(f"{setting} {str(root)!r} does not exist: pass an existing folder") from None
    if not real.is_dir():
        raise ConfigError(f"{setting} {str(root)!r} is not a folder: pass the folder whose files may be read")
    return real


def _port(parts) -> int | None:
    try:
        port = parts.port
    except ValueError:
        return -1  # unreadable: never equal to a prefix's port
    return port if port is not None else {"http": 80, "https": 443}.get(parts.scheme.lower())


# IPv6 forms that carry an IPv4 address in their low 32 bits: NAT64 (RFC 6052 well-known and RFC 8215 local-use
# prefixes), IPv4-translated (RFC 2765) and IPv4-compatible (deprecated, ::a.b.c.d)
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_TRANSLATED = ipaddress.ip_network("::ffff:0:0:0/96")
_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries and would reach: IPv4-mapped, IPv4-translated,
    IPv4-compatible, NAT64 (both prefixes), 6to4 (2002::/16) and Teredo (its server and its client)."""
    low = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    found = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip in _TRANSLATED or any(ip in net for net in _NAT64) or (ip in _COMPATIBLE and int(ip) > 1):
        found.append(low)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    return found


def public_address(address: str) -> bool:
    """Whether an IP address is one the open internet routes (not loopback, link-local, private, shared,
    multicast or reserved); an IPv6 address that carries an IPv4 address (``embedded_ipv4``) is judged by each
    IPv4 address it carries as well."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        carried = embedded_ipv4(ip)
        if carried:
            return all(inner.is_global and not inner.is_multicast for inner in carried)
    return ip.is_global and not ip.is_multicast


@dataclass(frozen=True)
class CheckedUrl:
    url: str
    addresses: tuple[str, ...]  # what an http(s) URL's host resolved to when checked (empty: not http)


@dataclass(frozen=True)
class SourcePolicy:
    """Roots and URL prefixes a caller may read; ``root_setting``/``source_setting`` name what allows more."""

    roots: tuple[Path, ...] = ()
    prefixes: tuple[Prefix, ...] = ()
    root_setting: str = "--root"
    source_setting: str = "--allow-source"

    @classmethod
    def create(cls, roots: Sequence[str | Path], allow_sources: Sequence[str] = (), root_setting: str = "--root",
               source_setting: str = "--allow-source") -> SourcePolicy:
        """Resolve the roots once (each must be an existing folder) and parse the prefixes: a bad one is an error
        at start-up, never a silently narrower or wider policy."""
        resolved = [_root(root, root_setting) for root in roots]
        prefixes = []
        for text in allow_sources:
            prefix = Prefix.parse(text)
            if prefix.scheme == "file":  # a local folder however it is written: the same rule as a root
                resolved.append(_root(file_path(text), source_setting))
            else:
                prefixes.append(prefix)
        return cls(tuple(dict.fromkeys(resolved)), tuple(prefixes), root_setting, source_setting)

    # -- paths ---------------------------------------------------------------------------------------------------

    def check(self, source: str) -> str:
        """What to read for ``source``: its real path under a root (a ``file://`` URL is a path), or the URL
        under an allowed prefix."""
        if is_file_url(source):
            return str(self.check_path(file_path(source)))
        if is_url(source):
            return self.check_url(source).url
        return str(self.check_path(source))

    def check_path(self, raw: str | Path) -> Path:
        text = str(raw)
        if not text.strip() or "\x00" in text or any(ord(ch) < 32 for ch in text):
            raise SourceRefused(f"path {text[:200]!r} is not a path (empty, or holding control characters): pass a "
                                "file or folder under an allowed root")
        if len(text.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES or \
                any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in text.split("/")):
            raise SourceRefused(f"path {text[:80]!r}... is longer than a file system allows ({MAX_PATH_BYTES} bytes "
                                f"in all, {MAX_NAME_BYTES} per name): pass a file or folder under an allowed root")
        if not self.roots:
            raise SourceRefused(f"reading files by path is not allowed here (no {self.root_setting} is set): send "
                                f"the content inline, or let the server's operator allow a folder with "
                                f"{self.root_setting} DIR")
        path = Path(text).expanduser()
        if not path.is_absolute():  # relative to the first root that holds it (else the first root)
            path = next((root / path for root in self.roots if os.path.lexists(root / path)), self.roots[0] / path)
        try:
            real = path.resolve(strict=False)
        except (OSError, RuntimeError):  # a symlink loop
            raise self._outside(text) from None
        if self.root_of(real) is None:
            raise self._outside(text)
        if not real.exists():
            raise ConfigError(f"document {text!r} does not exist under the allowed roots: pass an existing file or "
                              "folder")
        return real

    def root_of(self, real: Path) -> Path | None:
        """The root that ``real`` (a resolved path) lies under, by file identity; None when it lies under none."""
        identities = {}
        for root in self.roots:
            try:
                found = root.stat()
            except OSError:
                continue
            identities[(found.st_dev, found.st_ino)] = root
        for folder in (real, *real.parents):
            try:
                found = folder.stat()
            except OSError:
                continue  # a tail that does not exist yet
            owner = identities.get((found.st_dev, found.st_ino))
            if owner is not None:
                return owner
        return None

    def contains(self, path: Path) -> bool:
        """Whether a file met in a folder's walk really lies under a root (a symlinked file may point out). A
        broken link or a loop is not contained: it is refused in the same words as a link that leads out, so a
        refusal never tells whether a target outside the roots exists."""
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return False
        return self.root_of(real) is not None

    def _outside(self, text: str) -> SourceRefused:
        return SourceRefused(f"path {text!r} is outside the folders this server may read ({self._roots_text()}): "
                             f"only files under a {self.root_setting} folder (or a {self.source_setting} file:///DIR/ "
                             "prefix) can be added (symlinks and '..' are followed before this check)")

    def _roots_text(self) -> str:
        return ", ".join(str(root) for root in self.roots) or "none"

    # -- URLs ----------------------------------------------------------------------------------------------------

    def check_url(self, url: str, resolve=socket.getaddrinfo) -> CheckedUrl:
        """``url`` if it lies under an allowed prefix; an http(s) URL's host must resolve to public addresses
        unless the prefix names that host."""
        if any(ch.isspace() or ord(ch) < 32 for ch in url) or "\\" in url:
            raise SourceRefused(f"URL {url[:200]!r} holds whitespace, control characters or backslashes: refused")
        if is_file_url(url):  # a path, confined like one: its real path under a root (file:// prefixes are roots)
            return CheckedUrl(str(self.check_path(file_path(url))), ())
        parts = urlsplit(url)
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower(), _port(parts)
        path = unquote(parts.path) or "/"
        if ".." in path.split("/") or parts.username or parts.password:
            raise SourceRefused(f"URL {url!r}: '..' segments and user names in URLs are refused")
        path = posixpath.normpath(path) + ("/" if path.endswith("/") and path != "/" else "")
        prefix = next((p for p in self.prefixes if p.matches(scheme, host, port, path)), None)
        if prefix is None:
            allowed = ", ".join(p.text for p in self.prefixes) or "none"
            raise SourceRefused(f"URL {url!r} is not under a source this server may read (allowed: {allowed}); the "
                                f"server's operator allows a prefix with {self.source_setting} PREFIX")
        if scheme not in ("http", "https"):
            return CheckedUrl(url, ())
        if not host:
            raise SourceRefused(f"URL {url!r} names no host")
        try:
            found = resolve(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise TransientError(f"URL {url!r}: cannot resolve host {host!r} ({exc})") from None
        addresses = tuple(dict.fromkeys(info[4][0] for info in found))
        if not prefix.host and not all(public_address(address) for address in addresses):
            raise SourceRefused(f"URL {url!r}: host {host!r} is a loopback, link-local or private address; such "
                                f"hosts are read only when an allowed source names them ({self.source_setting} "
                                f"{scheme}://{host}/...)")
        return CheckedUrl(url, addresses)


@dataclass(frozen=True)
class Fetched:
    url: str  # after redirects
    content: bytes
    content_type: str
    status: int = 200  # 304: not modified since the validators sent (``content`` is empty)
    headers: dict[str, str] = field(default_factory=dict)  # the final reply's headers, names lower-cased


def http_error(message: str, status: int) -> TransientError | PermanentError:
    """The error for an HTTP status: transient for 408/425/429/5xx (retry later), permanent otherwise; ``status``
    is kept on it so that a caller can tell a page that is gone (404/410) from one that failed."""
    error = TransientError(message) if status in (408, 425, 429) or status >= 500 else \
        PermanentError(message + "; check the address")
    setattr(error, "status", status)  # read with getattr: other errors have none
    return error


def http_client(timeout_s: float = 30.0):
    """The client ``fetch`` uses: redirects left to ``fetch`` (each hop checked), no proxy or credentials from the
    environment. Making one costs tens of milliseconds (its TLS context): a caller fetching many pages of one host
    passes one to every ``fetch`` of that host (it is safe across threads; its pooled connections are keyed by
    the checked address, so one client must not serve two host names) and closes it at the end."""
    import httpx

    return httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False)


def fetch(url: str, policy: SourcePolicy, max_bytes: int, timeout_s: float = 30.0, resolve=socket.getaddrinfo,
          headers: dict[str, str] | None = None, client=None) -> Fetched:
    """GET an http(s) URL the policy allows: each hop checked again (redirects followed here, at most
    ``MAX_REDIRECTS``), the connection made to the address that was checked (no second DNS answer), the body cut
    off with an error past ``max_bytes``. With conditional ``headers`` (``If-None-Match``, ``If-Modified-Since``) a
    304 comes back as a ``Fetched`` with ``status`` 304 and no content; an HTTP error carries its ``status``.
    ``client``: one from ``http_client`` to reuse (left open); without it one is made and closed here."""
    if client is None:
        with http_client(timeout_s) as own:
            return fetch(url, policy, max_bytes, timeout_s, resolve, headers, own)
    for _hop in range(MAX_REDIRECTS + 1):
        checked = policy.check_url(url, resolve)
        if not checked.addresses:
            raise SourceRefused(f"URL {url!r}: only http and https URLs are fetched")
        response = _get_pinned(client, checked, headers or {}, max_bytes)
        if response is None:
            raise PermanentError(f"URL {url!r} is larger than the {max_bytes / 1e6:g} MB limit")
        status, reply_headers, body = response
        if status in (301, 302, 303, 307, 308) and reply_headers.get("location"):
            url = urljoin(url, reply_headers["location"])
            continue
        if status >= 400:
            raise http_error(f"URL {url!r} answered HTTP {status}", status)
        return Fetched(url, body if status != 304 else b"", reply_headers.get("content-type", ""), status,
                       reply_headers)
    raise PermanentError(f"URL {url!r}: more than {MAX_REDIRECTS} redirects")


def _get_pinned(client, checked: CheckedUrl, headers: dict[str, str], max_bytes: int):
    """(status, headers, body) of one GET sent to the first checked address, with the URL's own Host header and
    TLS name; None when the body passes ``max_bytes``."""
    import httpx

    parts = urlsplit(checked.url)
    address = checked.addresses[0]
    literal = f"[{address}]" if ":" in address else address
    netloc = literal + (f":{parts.port}" if parts.port else "")
    target = parts._replace(netloc=netloc).geturl()
    extensions = {"sni_hostname": parts.hostname} if parts.scheme.lower() == "https" else {}
    request = client.build_request("GET", target, headers={"Host": parts.netloc.rsplit("@", 1)[-1],
                                                           "User-Agent": USER_AGENT, **headers},
                                   extensions=extensions)
    try:
        response = client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise TransientError(f"URL {checked.url!r}: {type(exc).__name__} ({exc})") from None
    try:
        body = bytearray()
        for block in response.iter_bytes():
            body += block
            if len(body) > max_bytes:
                return None
        return response.status_code, {k.lower(): v for k, v in response.headers.items()}, bytes(body)
    finally:
        response.close()
