"""`kbflow mcp` as a real subprocess, driven by the MCP client SDK over stdio and streamable HTTP: the tools an agent
sees, writes through the engine, reads while a write runs, and errors as tool errors."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from tests.conftest import CASES

KBFLOW = str(Path(sys.executable).with_name("kbflow"))
TOOLS = {"search", "ask", "add_text", "add_document", "stats", "list_namespaces"}


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "kb.yaml"  # the suite's model (MiniLM): a new namespace would otherwise get e5
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "embedder": {"backend": "local"}}))
    return config


def _env(**extra: str) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "KBFLOW_FAIL"))}
    return {**env, **extra}  # no Prefect server: writes run the engine in the server's process


def _data(result) -> object:
    assert not result.is_error, result.content
    return json.loads(result.content[0].text) if len(result.content) == 1 else \
        [json.loads(item.text) for item in result.content]


def test_stdio_tools_write_search_and_answer_reads_while_a_write_runs(tmp_path):
    marker = tmp_path / "paused"
    docs = tmp_path / "docs"
    shutil.copytree(CASES / "docs", docs)
    server = StdioServerParameters(
        command=KBFLOW, args=["mcp", "--config", str(_config(tmp_path)), "--root", str(tmp_path)], cwd=str(tmp_path),
        # the second store write (add_document's) stops until the test removes the marker
        env=_env(KBFLOW_FAILPOINTS="upsert.after_store=2:pause(120)", KBFLOW_FAILPOINTS_MARKER=str(marker)))

    async def session() -> None:
        async with Client(server, read_timeout_seconds=300) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == TOOLS
            assert all(tool.description and len(tool.description) > 40 for tool in tools.values())
            assert tools["search"].input_schema["properties"]["limit"]["maximum"] == 50
            assert "graph" in tools["search"].input_schema["properties"]["mode"]["anyOf"][0]["enum"]
            assert tools["ask"].input_schema["properties"]["agentic"]["default"] is False
            assert tools["search"].annotations.read_only_hint and not tools["add_text"].annotations.read_only_hint
            # every tool declares what it returns: an agent reads fields, not prose
            assert all(tool.output_schema for tool in tools.values())
            assert set(tools["ask"].output_schema["$defs"]["Source"]["required"]) == {
                "n", "doc_id", "source_path", "heading_path", "chunk_id", "score"}
            assert {"documents", "chunks", "failures"} <= set(tools["add_text"].output_schema["required"])

            missing = await client.call_tool("search", {"query": "tea"})
            assert missing.is_error and "does not exist" in missing.content[0].text  # names the fix, no crash

            result = await client.call_tool("add_text", {"text": "Green tea is brewed at 80 degrees.", "doc_id": "tea"})
            added = _data(result)
            assert added["documents"]["new"] == 1 and added["failures"] == []
            assert result.structured_content == added and added["chunks"]["embedded"] == 1
            found = await client.call_tool("search", {"query": "how hot should water for tea be", "limit": 3})
            hits = _data(found)
            hits = hits if isinstance(hits, list) else [hits]
            assert hits[0]["source_path"] == "text:tea" and "80 degrees" in hits[0]["text"]
            # the same hits as structured content, under the advertised output schema (no JSON parsed from text)
            schema = tools["search"].output_schema
            assert schema["required"] == ["hits"] and "Passage" in schema["$defs"]
            assert set(schema["$defs"]["Passage"]["required"]) >= {"source_path", "heading_path", "score", "text"}
            assert found.structured_content == {"hits": hits}

            async with anyio.create_task_group() as group:
                done = {}

                async def add() -> None:
                    done["add"] = _data(await client.call_tool("add_document", {"path": str(docs)}))

                group.start_soon(add)
                with anyio.fail_after(240):
                    while not marker.exists():
                        await anyio.sleep(0.2)
                # the write stands inside its store write: reads are still answered
                result = await client.call_tool("stats", {})
                stats = _data(result)
                assert stats["documents"] == 1 and "add" not in done and result.structured_content == stats
                assert stats["last_run"]["chunks"]["embedded"] == 1 and stats["model_id"].startswith("st:")
                result = await client.call_tool("list_namespaces", {})
                listed = _data(result)
                assert (listed if isinstance(listed, list) else [listed])[0]["namespace"] == "default"
                assert result.structured_content["result"] == (listed if isinstance(listed, list) else [listed])
                marker.unlink()
            assert done["add"]["documents"]["new"] == 4

            hits = _data(await client.call_tool("search", {"query": "restore a backup", "mode": "hybrid",
                                                           "source_glob": "docs/*"}))
            hits = hits if isinstance(hits, list) else [hits]
            assert hits[0]["source_path"] == "docs/backups.md"
            only = _data(await client.call_tool("search", {"query": "restore a backup",
                                                           "doc_ids": [hits[-1]["doc_id"]]}))
            assert {hit["doc_id"] for hit in (only if isinstance(only, list) else [only])} == {hits[-1]["doc_id"]}
            # the document a hit came from, as a resource, and the prompt that says how to answer with citations
            templates = (await client.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["kbflow://{namespace}/{doc_id}"]
            backups = next(hit for hit in hits if hit["source_path"] == "docs/backups.md")
            read = await client.read_resource(f"kbflow://default/{backups['doc_id']}")
            document = read.contents[0].text
            assert document.startswith("<!-- docs/backups.md") and backups["text"] in document
            missing_doc = None
            try:
                await client.read_resource("kbflow://default/0000")
            except Exception as exc:  # noqa: BLE001 - the SDK raises the server's error for a failed read
                missing_doc = str(exc)
            assert missing_doc and "not in namespace" in missing_doc
            prompts = {prompt.name for prompt in (await client.list_prompts()).prompts}
            assert prompts == {"answer_with_citations"}
            prompt = await client.get_prompt("answer_with_citations", {"question": "How do I restore?"})
            assert "How do I restore?" in prompt.messages[0].content.text and "[n]" not in prompt.messages[0].content.text

            inline = _data(await client.call_tool("add_document", {
                "filename": "coffee.md", "content_base64": base64.b64encode(b"# Coffee\n\nBrew at 93 C.\n").decode()}))
            assert inline["documents"]["new"] == 1
            assert _data(await client.call_tool("stats", {}))["documents"] == 6  # nothing removed by the adds

            for name, arguments, expected in (
                    ("search", {"query": "tea", "limit": 0}, "limit"),            # schema: 1..50
                    ("search", {"query": "tea", "namespace": "../etc"}, "namespace"),
                    ("add_document", {"path": str(tmp_path / "nope.md")}, "does not exist"),
                    ("add_document", {"filename": "../x.md", "content": "x"}, "plain file name"),
                    ("add_document", {}, "either path"),
                    ("ask", {"question": "how hot is tea brewed?"}, "LLM")):
                result = await client.call_tool(name, arguments)
                assert result.is_error and expected.lower() in result.content[0].text.lower(), (name, result.content)
            assert _data(await client.call_tool("stats", {}))["documents"] == 6  # and the server is still up

    anyio.run(session)


def test_ask_over_stdio_returns_the_answer_and_each_cited_source_as_fields(tmp_path):
    """ask with a chat model behind the OpenAI wire format (a local stand-in server): the structured content
    holds the answer and, for each source, its number, document, path, heading path, chunk and score."""
    from kbflow.testing.fake_services import FakeServices

    config = _config(tmp_path)
    subprocess.run([KBFLOW, "add-text", "Green tea is brewed at 80 degrees.", "--doc-id", "tea", "--config",
                    str(config)], check=True, env=_env(), capture_output=True, timeout=600)
    with FakeServices(key="test-key") as service:
        service.chat_responder = lambda messages: "Brew it at 80 degrees [1]."
        server = StdioServerParameters(command=KBFLOW, args=["mcp", "--config", str(config)], cwd=str(tmp_path),
                                       env=_env(OPENAI_BASE_URL=service.url + "/v1", OPENAI_API_KEY=service.key))

        async def session() -> None:
            async with Client(server, read_timeout_seconds=300) as client:
                result = await client.call_tool("ask", {"question": "How hot should the water for tea be?"})
                answer = _data(result)
                assert result.structured_content == answer
                assert answer["answer"] == "Brew it at 80 degrees [1]." and answer["cited"] == [1]
                source = answer["sources"][0]
                assert source["n"] == 1 and source["source_path"] == "text:tea" and source["doc_id"]
                assert source["chunk_id"] and isinstance(source["score"], float) and source["heading_path"] == []

        anyio.run(session)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_streamable_http_read_only_server_offers_only_reads(tmp_path):
    data = tmp_path / "data"
    config = _config(tmp_path)
    subprocess.run([KBFLOW, "add-text", "Zebrafish regrow their fins.", "--doc-id", "fish", "--namespace", "notes",
                    "--config", str(config)], check=True, env=_env(), capture_output=True, timeout=600)
    port = _free_port()
    process = subprocess.Popen([KBFLOW, "mcp", "--config", str(config), "--namespace", "notes", "--read-only",
                                "--http", f"127.0.0.1:{port}"], env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
                time.sleep(0.3)

        async def session() -> None:
            async with Client(f"http://127.0.0.1:{port}/mcp", read_timeout_seconds=300) as client:
                tools = {tool.name for tool in (await client.list_tools()).tools}
                assert tools == {"search", "ask", "stats", "list_namespaces"}
                hits = _data(await client.call_tool("search", {"query": "which animal grows back its fins"}))
                assert (hits if isinstance(hits, list) else [hits])[0]["source_path"] == "text:fish"
                other = await client.call_tool("stats", {"namespace": "default"})
                assert other.is_error and "not served" in other.content[0].text
                hit = (hits if isinstance(hits, list) else [hits])[0]
                own = await client.read_resource(f"kbflow://notes/{hit['doc_id']}")
                assert "Zebrafish regrow their fins." in own.contents[0].text
                refused = None
                try:  # a namespace this server does not serve: refused, whatever the document
                    await client.read_resource(f"kbflow://default/{hit['doc_id']}")
                except Exception as exc:  # noqa: BLE001 - the SDK raises the server's error for a failed read
                    refused = str(exc)
                assert refused and "not served" in refused

        anyio.run(session)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert data.is_dir()


def test_the_stdio_server_exits_cleanly_when_its_stdin_closes_after_a_search(tmp_path):
    """A client closes stdin when it is done: the server must then exit at once with status 0. After a search the
    interpreter's teardown used to abort inside the model's native threads ("terminate called without an active
    exception", SIGABRT), which a client sees as a crash or waits out before killing it."""
    config = _config(tmp_path)
    subprocess.run([KBFLOW, "ingest", str(CASES / "docs"), "--config", str(config)], env=_env(), check=True,
                   capture_output=True, timeout=300)
    server = subprocess.Popen([KBFLOW, "mcp", "--config", str(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(tmp_path))

    def call(message: dict) -> dict | None:
        server.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
        server.stdin.flush()
        return json.loads(server.stdout.readline()) if "id" in message else None

    call({"id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                                      "clientInfo": {"name": "test", "version": "1"}}})
    call({"method": "notifications/initialized"})
    found = call({"id": 2, "method": "tools/call", "params": {"name": "search", "arguments": {"query": "backups"}}})
    assert not found["result"]["isError"] and found["result"]["structuredContent"]["hits"], found
    server.stdin.close()
    try:
        status = server.wait(timeout=60)  # a hang fails here, not a figure: how fast is `kbflow bench`'s business
    finally:
        server.kill()
    error = server.stderr.read()
    assert status == 0 and "terminate called" not in error, (status, error[-2000:])


def test_the_stdio_server_answers_initialize_only_once_a_search_is_ready(tmp_path):
    """Ready means ready: ``initialize`` is answered after the model and the table are loaded, so a client's first
    search is as fast as the rest. Held at the end of its warm-up, the server answers nothing; let go, it says on
    stderr that it is ready and answers."""
    config, marker = _config(tmp_path), tmp_path / "warming"
    subprocess.run([KBFLOW, "ingest", str(CASES / "docs"), "--config", str(config)], env=_env(), check=True,
                   capture_output=True, timeout=300)
    server = subprocess.Popen([KBFLOW, "mcp", "--config", str(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=str(tmp_path),
                              env=_env(KBFLOW_FAILPOINTS="mcp.warm_up.done:pause(120)",
                                       KBFLOW_FAILPOINTS_MARKER=str(marker)))
    try:
        server.stdin.write(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}) + "\n")
        server.stdin.flush()
        deadline = time.monotonic() + 240
        while not marker.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the server never reached the end of its warm-up"
        waiting, _, _ = select.select([server.stdout], [], [], 2.0)
        assert not waiting, f"initialize answered while the model was still loading: {server.stdout.readline()}"
        marker.unlink()
        answer = json.loads(server.stdout.readline())
        assert answer["result"]["serverInfo"]["name"], answer
        assert "kbflow mcp: ready" in server.stderr.readline()
    finally:
        server.kill()
        server.wait()
