"""`kbflow mcp` driven by the official TypeScript MCP SDK (tests/agents/ts_client, pinned in its package-lock.json)
over stdio: the tools' output schemas, structured results the SDK itself checks against them, kbflow's own words
for a bad argument, a document resource and the prompt. Needs Node.js and npm (it installs the SDK from the npm
registry into a temporary folder); skipped where Node.js is absent."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent / "ts_client"
KBFLOW = str(Path(sys.executable).with_name("kbflow"))

pytestmark = pytest.mark.skipif(shutil.which("node") is None or shutil.which("npm") is None,
                                reason="Node.js and npm are not installed: the TypeScript client cannot run")


def test_the_typescript_sdk_reads_typed_results_a_document_and_the_prompt(tmp_path):
    client = tmp_path / "client"
    client.mkdir()
    for name in ("package.json", "package-lock.json", "client.mjs"):
        shutil.copyfile(HERE / name, client / name)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=client, check=True,
                   capture_output=True, timeout=600)
    config = tmp_path / "kb.yaml"  # the suite's model (MiniLM)
    config.write_text(yaml.safe_dump({"data_dir": str(tmp_path / "data"), "embedder": {"backend": "local"}}))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PREFECT_API", "KBFLOW_FAIL"))}
    done = subprocess.run(["node", "client.mjs", KBFLOW, str(config), str(tmp_path)], cwd=client, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["outputSchemas"] == dict.fromkeys(
        ["search", "ask", "add_text", "add_document", "stats", "list_namespaces"], True)
    assert seen["added"]["documents"]["new"] == 1 and seen["added"]["failures"] == []
    assert seen["hits"][0]["source_path"] == "text:tea" and "80 degrees" in seen["hits"][0]["text"]
    assert seen["stats"]["documents"] == 1 and seen["namespaces"]["result"][0]["namespace"] == "default"
    assert seen["bad"]["isError"] and "argument 'limit'" in seen["bad"]["text"]  # kbflow's words, the limit named
    assert seen["document"].startswith("<!-- text:tea") and "80 degrees" in seen["document"]
    assert seen["prompts"] == ["answer_with_citations"]
