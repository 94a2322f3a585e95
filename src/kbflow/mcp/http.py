"""`kbflow mcp --http`: who may call the server over HTTP, and for what.

* **Tokens.** With ``KBFLOW_MCP_TOKEN`` set, ``--token-file`` (a file whose first line is the token) or ``--tokens``
  (a YAML file of several tokens, each with its namespaces and read-only or read-write access), every request
  needs ``Authorization: Bearer <token>``; anything else is answered 401 before the MCP SDK sees it. Tokens are
  compared by their SHA-256 in constant time; none is logged or stored.
* **Hosts.** The ``Host`` header must name the bind address or an ``--allowed-host`` (421 otherwise) and a browser's
  ``Origin`` must be one of those (403), on every bind, not only on loopback (the SDK checks loopback binds
  only), so a DNS-rebinding page cannot reach the server.
* **Where it may listen.** A non-loopback bind without a token refuses to start, unless
  ``--no-auth-on-trusted-network`` says the network itself is the boundary.
* **Body size.** The request limit is set from the inline-document limit (as base64, plus room for the JSON around
  it); a larger request is answered 413 with a message naming ``mcp.max_inline_mb``.

The grant of the request's token (its namespaces, whether it may write) travels in the ASGI scope under
``GRANT_KEY``; the tools read it there (``kbflow.mcp.server``).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from kbflow.config import check_namespace
from kbflow.core.errors import ConfigError

TOKEN_ENV = "KBFLOW_MCP_TOKEN"
GRANT_KEY = "kbflow.grant"
NO_AUTH_FLAG = "--no-auth-on-trusted-network"


@dataclass(frozen=True)
class Grant:
    """What one caller may do: namespaces (empty: every namespace the server serves) and whether it may write."""

    name: str
    namespaces: tuple[str, ...] = ()
    write: bool = True

    def allows(self, namespace: str) -> bool:
        return not self.namespaces or namespace in self.namespaces


FULL = Grant("server")  # stdio, or HTTP without tokens: the server's own limits only


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


@dataclass(frozen=True)
class TokenTable:
    """Tokens by SHA-256 digest, each with its grant."""

    entries: tuple[tuple[bytes, Grant], ...]

    def grant_for(self, presented: str) -> Grant | None:
        digest, found = _digest(presented), None
        for expected, grant in self.entries:  # every entry compared, in constant time each
            if hmac.compare_digest(digest, expected) and found is None:
                found = grant
        return found


def load_tokens(token_file: Path | None, tokens_file: Path | None, environ=os.environ) -> TokenTable | None:
    """The server's tokens: ``KBFLOW_MCP_TOKEN`` and ``--token-file`` give one full-access token each, ``--tokens``
    a list of scoped ones. None when there are none (then HTTP has no authentication)."""
    entries: list[tuple[bytes, Grant]] = []
    if environ.get(TOKEN_ENV, "").strip():
        entries.append((_digest(_checked(environ[TOKEN_ENV].strip(), TOKEN_ENV)), Grant(TOKEN_ENV)))
    if token_file is not None:
        lines = _read(token_file, "--token-file").splitlines()
        token = lines[0].strip() if lines else ""
        entries.append((_digest(_checked(token, f"--token-file {str(token_file)!r}")), Grant("token-file")))
    if tokens_file is not None:
        entries.extend(_scoped_tokens(tokens_file, environ))
    return TokenTable(tuple(entries)) if entries else None


def _read(path: Path, option: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{option} {str(path)!r} cannot be read ({exc}); pass a readable file") from None


def _checked(token: str, where: str) -> str:
    if len(token) < 16:
        raise ConfigError(f"the token in {where} is shorter than 16 characters: use a long random one, e.g. "
                          "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`")
    return token


def _scoped_tokens(path: Path, environ) -> list[tuple[bytes, Grant]]:
    """``tokens: [{name, sha256 | token_env, namespaces, access}]``: sha256 is the hex digest of the token (so the
    file holds no secret), token_env names a variable holding the token; namespaces lists the token's namespaces
    (``["*"]``: every namespace the server serves; empty or missing is refused); access is read-only or
    read-write."""
    try:
        raw = yaml.safe_load(_read(path, "--tokens")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"--tokens {str(path)!r} is not valid YAML: {exc}") from None
    items = raw.get("tokens") if isinstance(raw, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"--tokens {str(path)!r} must hold `tokens:`, a list of {{name, sha256 or token_env, "
                          "namespaces, access}} (docs/security.md)")
    entries = []
    for number, item in enumerate(items, 1):
        where = f"--tokens {str(path)!r} entry {number}"
        if not isinstance(item, dict) or set(item) - {"name", "sha256", "token_env", "namespaces", "access"}:
            raise ConfigError(f"{where}: use the keys name, sha256 or token_env, namespaces, access")
        access = item.get("access", "read-only")
        if access not in ("read-only", "read-write"):
            raise ConfigError(f"{where}: access {access!r} must be read-only or read-write")
        listed = item.get("namespaces")
        if not isinstance(listed, list) or not listed:
            raise ConfigError(f"{where}: namespaces must list the namespaces this token may use, e.g. [handbook], "
                              "or [\"*\"] for every namespace the server serves (an empty or missing list grants "
                              "nothing, and is refused so that it is never read as 'all')")
        if "*" in listed and len(listed) > 1:
            raise ConfigError(f"{where}: namespaces lists '*' (every namespace) beside names; give one or the other")
        namespaces = () if listed == ["*"] else tuple(check_namespace(str(name)) for name in listed)
        if item.get("sha256"):
            try:
                digest = bytes.fromhex(str(item["sha256"]))
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise ConfigError(f"{where}: sha256 must be the 64 hex digits of the token's SHA-256, e.g. "
                                  "`printf %s \"$TOKEN\" | sha256sum`")
        elif item.get("token_env"):
            value = environ.get(str(item["token_env"]), "").strip()
            if not value:
                raise ConfigError(f"{where}: the environment variable {item['token_env']} is not set")
            digest = _digest(_checked(value, f"{where} ({item['token_env']})"))
        else:
            raise ConfigError(f"{where}: give sha256 (of the token) or token_env (a variable holding it)")
        entries.append((digest, Grant(str(item.get("name") or f"token {number}"), namespaces,
                                      access == "read-write")))
    return entries


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(bind: str, extra: list[str]) -> tuple[list[str], list[str]]:
    """(Host header values, Origin values) the server accepts: the bind address (any port) and the loopback
    names for a loopback bind, plus ``extra`` (name, or name:port)."""
    names = ["127.0.0.1", "localhost", "[::1]"] if is_loopback(bind) else []
    if bind not in ("0.0.0.0", "::", "") and not is_loopback(bind):
        names.append(f"[{bind}]" if ":" in bind else bind)
    hosts, origins = [], []
    for name in [*names, *extra]:
        has_port = name.rsplit(":", 1)[-1].isdigit() and not name.endswith("]")
        hosts += [name] if has_port else [name, f"{name}:*"]
        for scheme in ("http", "https"):
            origins += [f"{scheme}://{name}"] if has_port else [f"{scheme}://{name}", f"{scheme}://{name}:*"]
    return hosts, origins


class Gate:
    """ASGI middleware in front of the SDK's app: body size, then the bearer token; puts the grant in the scope."""

    def __init__(self, app, tokens: TokenTable | None, max_body_bytes: int, inline_mb: float):
        self.app, self.tokens, self.max_body_bytes, self.inline_mb = app, tokens, max_body_bytes, inline_mb

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        grant = FULL
        if self.tokens is not None:
            scheme, _, presented = headers.get("authorization", "").partition(" ")
            found = self.tokens.grant_for(presented.strip()) if scheme.lower() == "bearer" else None
            if found is None:
                await _reply(send, 401, "missing or wrong bearer token: send Authorization: Bearer <token> (the "
                             "server's operator hands out tokens; docs/security.md)",
                             [(b"www-authenticate", b'Bearer realm="kbflow"')])
                return
            grant = found
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.max_body_bytes:
            await _reply(send, 413, f"request body of {int(length) / 1e6:.1f} MB is over this server's limit of "
                         f"{self.max_body_bytes / 1e6:.1f} MB (inline documents: mcp.max_inline_mb = "
                         f"{self.inline_mb:g} MB); add large files by path or URL instead")
            return
        await self.app({**scope, GRANT_KEY: grant}, receive, send)


async def _reply(send, status: int, message: str, extra_headers: list | None = None) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(extra_headers or [])]})
    await send({"type": "http.response.body", "body": body})
