"""A hostile client against `kbflow mcp`, through the real transports: the official MCP client over stdio and
streamable HTTP, and raw HTTP requests where the attack is in the headers. Every refusal happens before anything
is read, and names the setting that would allow it."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import httpx
import httpx2  # the MCP SDK's HTTP client
import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from kbflow import __version__
from tests.agents.test_mcp import KBFLOW, _env, _free_port

SECRET_LINE = "the launch code is swordfish-4471"


class _Metadata(BaseHTTPRequestHandler):
    """An instance-metadata look-alike on 127.0.0.1, and an allowed docs path that redirects into it."""

    def do_GET(self):  # noqa: N802
        if self.path == "/docs/redirect":
            self.send_response(302)
            self.send_header("Location", "/latest/meta-data.txt")
            self.end_headers()
            return
        body = (f"# Page\n\n{SECRET_LINE}\n" if self.path.startswith("/latest") else "# Allowed page\n\nGreen tea "
                "is brewed at 80 degrees.\n").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/markdown")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metadata_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.fixture
def layout(tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "tea.md").write_text("# Tea\n\nGreen tea is brewed at 80 degrees.\n")
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "notes.md").write_text(f"# Notes\n\n{SECRET_LINE}\n")
    (root / "planted.md").symlink_to(outside / "notes.md")  # a link inside the root, pointing out of it
    config = tmp_path / "kb.yaml"
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "embedder": {"backend": "local"},
                                      "mcp": {"max_inline_mb": 0.01}}))
    return root, outside, config


def _text(result) -> str:
    return " ".join(getattr(item, "text", "") for item in result.content)


def _json(result):
    assert not result.is_error, _text(result)
    return json.loads(result.content[0].text) if len(result.content) == 1 else \
        [json.loads(item.text) for item in result.content]


def test_stdio_client_reaches_only_its_root_and_allowed_sources(layout, tmp_path, metadata_server):
    root, outside, config = layout
    server = StdioServerParameters(command=KBFLOW, args=[
        "mcp", "--config", str(config), "--root", str(root), "--allow-source", f"{metadata_server}/docs/",
        "--allow-source", "https://"], cwd=str(tmp_path), env=_env())

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            assert client.server_info.version == __version__
            added = _json(await client.call_tool("add_document", {"path": str(root)}))
            assert added["documents"]["failed"] == 1  # the planted link is a failure, never read
            assert [f["source_path"] for f in added["failures"]] == ["docs/planted.md"]
            assert "refused" in added["failures"][0]["message"] and str(outside) not in added["failures"][0]["message"]
            for path in (str(outside / "notes.md"), str(root / ".." / "private" / "notes.md"), "../private/notes.md",
                         str(root / "planted.md"), "/etc/passwd", "~/.ssh/id_rsa"):
                refused = await client.call_tool("add_document", {"path": path})
                assert refused.is_error and "--root" in _text(refused), (path, _text(refused))
            for url in (f"{metadata_server}/latest/meta-data.txt", f"{metadata_server}/docs/redirect",
                        f"http://localhost:{metadata_server.rsplit(':', 1)[1]}/docs/x", "http://169.254.169.254/latest",
                        "file:///etc/passwd", "s3://someone-elses-bucket/"):
                refused = await client.call_tool("add_document", {"path": url})
                assert refused.is_error and "--allow-source" in _text(refused), (url, _text(refused))
            fetched = _json(await client.call_tool("add_document", {"path": f"{metadata_server}/docs/page.md"}))
            assert fetched["documents"]["new"] == 1
            big = await client.call_tool("add_document", {"filename": "big.md", "content": "x" * 20_000})
            assert big.is_error and "mcp.max_inline_mb" in _text(big)
            big = await client.call_tool("add_text", {"text": "x" * 20_000, "doc_id": "big"})
            assert big.is_error and "mcp.max_inline_mb" in _text(big)
            hits = _json(await client.call_tool("search", {"query": "launch code", "limit": 10}))
            hits = hits if isinstance(hits, list) else [hits]
            assert all(SECRET_LINE not in hit["text"] for hit in hits)
            stats = _json(await client.call_tool("stats", {}))
            assert stats["documents"] == 2

    anyio.run(session)


def test_stdio_without_roots_refuses_paths_but_takes_inline_content(layout, tmp_path):
    root, _, config = layout
    server = StdioServerParameters(command=KBFLOW, args=["mcp", "--config", str(config)], cwd=str(root), env=_env())

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            refused = await client.call_tool("add_document", {"path": "tea.md"})
            assert refused.is_error and "--root" in _text(refused)
            added = _json(await client.call_tool("add_document", {
                "filename": "tea.md", "content_base64": base64.b64encode(b"# Tea\n\nGreen tea.\n").decode()}))
            assert added["documents"]["new"] == 1

    anyio.run(session)


class _Server:
    def __init__(self, args: list[str], env: dict, bind: str = "127.0.0.1"):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process = subprocess.Popen([KBFLOW, "mcp", *args, "--http", f"{bind}:{self.port}"], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{self.port}/", timeout=1)
                return
            except httpx.TransportError:
                assert self.process.poll() is None and time.monotonic() < deadline, self.process.stdout.read()
                time.sleep(0.3)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def _post(server: _Server, headers: dict, body: bytes | None = None) -> httpx.Response:
    return httpx.post(server.url, headers={**JSON_HEADERS, **headers}, content=body or json.dumps(INIT).encode(),
                      timeout=30)


def test_http_needs_the_token_checks_host_and_origin_and_scopes_each_token(layout, tmp_path):
    root, _, config = layout
    subprocess.run([KBFLOW, "add-text", "Zebrafish regrow their fins.", "--doc-id", "fish", "--namespace", "team-a",
                    "--config", str(config)], check=True, env=_env(), capture_output=True, timeout=600)
    subprocess.run([KBFLOW, "add-text", "Board minutes: budget approved.", "--doc-id", "minutes", "--namespace",
                    "board", "--config", str(config)], check=True, env=_env(), capture_output=True, timeout=600)
    reader, writer, admin = "r" * 8 + "-reader-token-123", "w" * 8 + "-writer-token-456", "a" * 8 + "-admin-token-789"
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(yaml.safe_dump({"tokens": [
        {"name": "readers", "sha256": hashlib.sha256(reader.encode()).hexdigest(), "namespaces": ["team-a"],
         "access": "read-only"},
        {"name": "writers", "token_env": "TEAM_A_WRITE", "namespaces": ["team-a"], "access": "read-write"}]}))
    server = _Server(["--config", str(config), "--tokens", str(tokens), "--root", str(root)],
                     _env(TEAM_A_WRITE=writer, KBFLOW_MCP_TOKEN=admin))
    try:
        assert _post(server, {}).status_code == 401
        assert _post(server, {"Authorization": "Bearer wrong-token-wrong-token"}).status_code == 401
        assert _post(server, {"Authorization": f"Basic {reader}"}).status_code == 401
        ok = _post(server, {"Authorization": f"Bearer {reader}"})
        assert ok.status_code == 200, ok.text
        rebinding = _post(server, {"Authorization": f"Bearer {reader}", "Host": "evil.example:80"})
        assert rebinding.status_code == 421
        foreign = _post(server, {"Authorization": f"Bearer {reader}", "Origin": "http://evil.example"})
        assert foreign.status_code == 403
        big = _post(server, {"Authorization": f"Bearer {admin}"}, b"{" + b" " * 1_200_000 + b"}")
        assert big.status_code == 413 and "mcp.max_inline_mb" in big.text

        async def as_token(token: str, calls):
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300) as http:
                async with Client(streamable_http_client(server.url, http_client=http),
                                  read_timeout_seconds=300) as client:
                    return await calls(client)

        async def reader_calls(client):
            assert client.server_info.version == __version__
            listed = _json(await client.call_tool("list_namespaces", {}))
            assert [row["namespace"] for row in (listed if isinstance(listed, list) else [listed])] == ["team-a"]
            hits = _json(await client.call_tool("search", {"query": "which animal regrows fins"}))
            assert (hits if isinstance(hits, list) else [hits])[0]["source_path"] == "text:fish"
            other = await client.call_tool("search", {"query": "budget", "namespace": "board"})
            assert other.is_error and "outside this token's namespaces" in _text(other)
            write = await client.call_tool("add_text", {"text": "x", "doc_id": "x"})
            assert write.is_error and "read-only" in _text(write)
            write = await client.call_tool("add_document", {"path": str(root)})
            assert write.is_error and "read-only" in _text(write)

        async def writer_calls(client):
            added = _json(await client.call_tool("add_document", {"path": str(root / "tea.md")}))
            assert added["namespace"] == "team-a" and added["documents"]["new"] == 1
            other = await client.call_tool("add_text", {"text": "x", "doc_id": "x", "namespace": "board"})
            assert other.is_error and "outside this token's namespaces" in _text(other)

        async def admin_calls(client):
            listed = _json(await client.call_tool("list_namespaces", {}))
            assert {row["namespace"] for row in (listed if isinstance(listed, list) else [listed])} == {"team-a",
                                                                                                    "board"}

        anyio.run(as_token, reader, reader_calls)
        anyio.run(as_token, writer, writer_calls)
        anyio.run(as_token, admin, admin_calls)
    finally:
        server.stop()


def test_a_public_bind_without_a_token_refuses_to_start(layout):
    _, _, config = layout
    refused = subprocess.run([KBFLOW, "mcp", "--config", str(config), "--http", f"0.0.0.0:{_free_port()}"],
                             env=_env(), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "KBFLOW_MCP_TOKEN" in refused.stderr and "Traceback" not in refused.stderr
    no_host = subprocess.run([KBFLOW, "mcp", "--config", str(config), "--http", f"0.0.0.0:{_free_port()}"],
                             env=_env(KBFLOW_MCP_TOKEN="t" * 32), capture_output=True, text=True, timeout=120)
    assert no_host.returncode == 2 and "--allowed-host" in no_host.stderr


def test_host_and_origin_are_checked_on_a_non_loopback_bind_too(layout):
    _, _, config = layout
    token = "t" * 32
    server = _Server(["--config", str(config), "--allowed-host", "kb.team.example"], _env(KBFLOW_MCP_TOKEN=token),
                     bind="0.0.0.0")
    url = server.url
    try:
        auth = {**JSON_HEADERS, "Authorization": f"Bearer {token}"}
        body = json.dumps(INIT)
        assert httpx.post(url, headers={**auth, "Host": "kb.team.example:8765"}, content=body).status_code == 200
        # a DNS-rebinding page: the browser sends the attacker's name as Host, and its own Origin
        assert httpx.post(url, headers={**auth, "Host": "attacker.example"}, content=body).status_code == 421
        assert httpx.post(url, headers={**auth, "Host": "kb.team.example", "Origin": "http://attacker.example"},
                          content=body).status_code == 403
        assert httpx.post(url, headers={**auth, "Host": "kb.team.example", "Origin": "https://kb.team.example"},
                          content=body).status_code == 200
    finally:
        server.stop()
    assert Path(config).exists()


# -- one way in: the same identity, confinement and scan through MCP as through the CLI ------------------------------

GITHUB_TOKEN = "ghp_" + "Kx4" * 12


def test_mcp_names_a_file_as_the_cli_does_and_keeps_uploads_apart(layout, tmp_path, metadata_server):
    """`kbflow ingest docs/` then MCP add_document of docs/tea.md (by path and by file:// URL) is one document;
    an inline upload named tea.md is another (upload:tea.md) and never replaces the file; refused inline content
    is not written; a file:// prefix confines like --root."""
    root, outside, config = layout
    (root / "planted.md").unlink()
    subprocess.run([KBFLOW, "ingest", str(root), "--config", str(config)], check=True, env=_env(),
                   capture_output=True, timeout=600)
    server = StdioServerParameters(command=KBFLOW, args=[
        "mcp", "--config", str(config), "--allow-source", f"file://{root}/",
        "--allow-source", f"{metadata_server}/docs/"], cwd=str(tmp_path), env=_env())

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            for path in (str(root / "tea.md"), f"file://{root}/tea.md", "tea.md"):
                again = _json(await client.call_tool("add_document", {"path": path}))
                assert again["documents"]["unchanged"] == 1 and again["documents"]["new"] == 0, (path, again)
            uploaded = _json(await client.call_tool("add_document", {"filename": "tea.md",
                                                                      "content": "# Upload\n\nOolong notes.\n"}))
            assert uploaded["documents"]["new"] == 1
            secret = await client.call_tool("add_document", {"filename": "deploy.md",
                                                              "content": f"push with {GITHUB_TOKEN}\n"})
            assert secret.is_error and "GitHub Token" in _text(secret) and GITHUB_TOKEN not in _text(secret)
            (root / "out.md").symlink_to(outside / "notes.md")
            refused = await client.call_tool("add_document", {"path": f"file://{root}/out.md"})
            assert refused.is_error and "outside the folders" in _text(refused)
            walked = _json(await client.call_tool("add_document", {"path": f"file://{root}/"}))
            assert [f["source_path"] for f in walked["failures"]] == ["docs/out.md"]
            hits = _json(await client.call_tool("search", {"query": "Green tea brewed", "limit": 10}))
            paths = [hit["source_path"] for hit in (hits if isinstance(hits, list) else [hits])]
            assert paths.count("docs/tea.md") == 1 and "upload:tea.md" in paths, paths
            stats = _json(await client.call_tool("stats", {}))
            assert stats["documents"] == 2

    anyio.run(session)
    assert not list((tmp_path / "data").rglob("deploy.md"))


def test_every_bad_input_is_a_tool_error_in_kbflows_words(layout, tmp_path, metadata_server):
    """Inputs that used to end in a bare 'Error executing tool' or in the validator's text."""
    root, _, config = layout
    server = StdioServerParameters(command=KBFLOW, args=[
        "mcp", "--config", str(config), "--root", str(root), "--allow-source", f"{metadata_server}/docs/"],
        cwd=str(tmp_path), env=_env())
    cases = [
        ("add_document", {"path": str(root / ("x" * 300))}, "longer than a file system allows"),
        ("add_document", {"path": "/".join(["deep"] * 1500)}, "longer than a file system allows"),
        ("add_document", {"filename": "n" * 300 + ".md", "content": "x"}, "at most 255 bytes"),
        ("add_document", {"filename": "a\x00b.md", "content": "x"}, "plain file name"),
        ("add_document", {"filename": "a\nb.md", "content": "x"}, "plain file name"),
        ("search", {"query": "tea", "doc_ids": ["d"] * 5001}, "argument 'doc_ids'"),
        ("search", {"query": "tea", "limit": 0}, "argument 'limit'"),
        ("search", {"query": "tea", "limit": "many"}, "argument 'limit'"),
        ("search", {"query": ""}, "argument 'query'"),
        ("add_text", {"text": "x"}, "argument 'doc_id'"),
    ]

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            await client.call_tool("add_text", {"text": "# Tea\n\nGreen tea.\n", "doc_id": "tea"})
            # a fetched page whose URL ends in an encoded NUL: kept under the page's identity, its inbox file named
            # by a hash (a URL's last segment is never a file name)
            page = _json(await client.call_tool("add_document", {"path": f"{metadata_server}/docs/a%00b"}))
            assert page["documents"]["new"] == 1 and page["failures"] == []
            for tool, arguments, words in cases:
                result = await client.call_tool(tool, arguments)
                text = _text(result)
                assert result.is_error and words in text, (tool, str(arguments)[:80], text[:300])
                assert "validation error" not in text and not text.rstrip().endswith(f"Error executing tool {tool}")

    anyio.run(session)


def test_a_tokens_file_must_name_its_namespaces_and_star_means_all(layout, tmp_path):
    _, _, config = layout
    token = "s" * 8 + "-star-token-000000"
    for entry, words in (({"namespaces": []}, "namespaces must list"), ({}, "namespaces must list"),
                         ({"namespaces": ["*", "x"]}, "beside names")):
        tokens = tmp_path / "tokens.yaml"
        tokens.write_text(yaml.safe_dump({"tokens": [{"name": "t", "sha256": hashlib.sha256(token.encode())
                                                      .hexdigest(), "access": "read-only", **entry}]}))
        refused = subprocess.run([KBFLOW, "mcp", "--config", str(config), "--tokens", str(tokens), "--http",
                                  f"127.0.0.1:{_free_port()}"], env=_env(), capture_output=True, text=True,
                                 timeout=120)
        assert refused.returncode == 2 and words in refused.stderr and "Traceback" not in refused.stderr, \
            refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
    for name in ("team-a", "board"):
        subprocess.run([KBFLOW, "add-text", f"Notes of {name}.", "--doc-id", "n", "--namespace", name, "--config",
                        str(config)], check=True, env=_env(), capture_output=True, timeout=600)
    tokens.write_text(yaml.safe_dump({"tokens": [{"name": "all", "sha256": hashlib.sha256(token.encode())
                                                  .hexdigest(), "namespaces": ["*"], "access": "read-only"}]}))
    server = _Server(["--config", str(config), "--tokens", str(tokens)], _env())
    try:
        async def calls():
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=300) as http:
                async with Client(streamable_http_client(server.url, http_client=http),
                                  read_timeout_seconds=300) as client:
                    listed = _json(await client.call_tool("list_namespaces", {}))
                    return {row["namespace"] for row in (listed if isinstance(listed, list) else [listed])}

        assert anyio.run(calls) == {"team-a", "board"}
    finally:
        server.stop()
