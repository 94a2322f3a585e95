"""The distribution lists every package of the tree (setuptools cannot find the mapped flows/ and tasks/ folders,
so pyproject.toml lists them all), and nothing in the code reaches for sys.path."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_lists_exactly_the_packages_of_the_tree():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    in_tree = {".".join(init.parent.relative_to(REPO / "src").parts) for init in (REPO / "src").rglob("__init__.py")}
    in_tree |= {"kbflow.flows", "kbflow.tasks"}
    assert set(setuptools["packages"]) == in_tree
    assert setuptools["package-dir"] == {"": "src", "kbflow.flows": "flows", "kbflow.tasks": "tasks"}
    assert all((REPO / folder / "__init__.py").is_file() for folder in ("flows", "tasks"))


def test_no_module_edits_sys_path():
    sources = [*(REPO / "src").rglob("*.py"), *(REPO / "flows").glob("*.py"), *(REPO / "tasks").glob("*.py")]
    offenders = [str(path.relative_to(REPO)) for path in sources
                 if re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*=", path.read_text(encoding="utf-8"))]
    assert offenders == []


def test_no_undefined_or_unused_names():
    """pyflakes over everything: an undefined name on an error path (it happened: `kbflow serve` without a server)
    is found before a user meets it."""
    from pyflakes.api import checkPath
    from pyflakes.reporter import Reporter
    import io

    out = io.StringIO()
    files = [*(REPO / "src").rglob("*.py"), *(REPO / "flows").glob("*.py"), *(REPO / "tasks").glob("*.py"),
             *(REPO / "tests").rglob("*.py"), *(REPO / "scripts").glob("*.py"),
             *(REPO / "research").glob("*.py")]
    problems = sum(checkPath(str(path), Reporter(out, out)) for path in files)
    assert problems == 0, out.getvalue()


def test_the_engine_and_its_stages_never_import_prefect():
    """Prefect is the orchestration layer (kbflow.flows, kbflow.tasks, and kbflow.orchestrate's choice of how a
    write runs): nothing the engine or a stage is made of imports it, so the engine runs without it."""
    import ast

    package = REPO / "src" / "kbflow"
    offenders = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] == "orchestrate.py":
            continue  # the one module that picks a flow run or the engine
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(REPO)}: {name}" for name in names if name.split(".")[0] == "prefect"]
    assert len(list(package.rglob("*.py"))) > 40 and offenders == []


PRODUCT_MODULES = ["kbflow", "kbflow.api", "kbflow.cli", "kbflow.kb", "kbflow.core.http", "kbflow.mcp.server",
                   "kbflow.mcp.http", "kbflow.engine.ingest", "kbflow.engine.reembed", "kbflow.stores.factory",
                   "kbflow.search.searcher", "kbflow.search.ask", "kbflow.search.agentic", "kbflow.flows.ingest"]


def test_the_product_path_never_imports_the_benchmarks_or_the_test_services():
    """The lab lives beside the product: importing what a user runs (the command, the API, the engine, stores,
    search, the MCP server, the flow) loads no benchmark module and no stand-in service; the one bench module it
    loads is the command-line registration of `kbflow bench`, whose commands import their modules when run."""
    import subprocess
    import sys

    code = (f"import importlib, sys\nfor name in {PRODUCT_MODULES!r}: importlib.import_module(name)\n"
            "print('\\n'.join(sorted(sys.modules)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    lab = [name for name in loaded.stdout.split()
           if name.startswith(("kbflow.testing", "kbflow.bench.")) and name != "kbflow.bench.cli"]
    assert "kbflow.cli" in loaded.stdout.split() and lab == []
