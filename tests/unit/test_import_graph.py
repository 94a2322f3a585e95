"""The import graph of kbflow (``src/kbflow``, ``flows/`` as ``kbflow.flows``, ``tasks/`` as ``kbflow.tasks``) has no
cycles, its lower layers never reach up, and no module uses another module's private name.

Every import counts, a function-level one included: an import moved into a function to dodge a cycle is still a
dependency, and still a cycle. The folders of ``src/kbflow`` are the layers, from the bottom (``RANKS`` below):
``core``; ``runtime`` and ``config``; ``state`` and ``stores``; the stages (``sources``, ``convert``, ``chunk``,
``embed``, ``graph``, ``search``); ``engine``; ``ops``; the entry points (``cli``, ``mcp``, ``api``, ``kb``,
``orchestrate``, ``kbflow.flows``, ``kbflow.tasks``); the lab (``bench``, ``testing``). A module imports only its
own layer's folders and lower ones; how a stage or an ingest runs (Prefect task, flow run or plain call) is handed
to the engine (a runner, an ingest callable), so it never imports the entry points.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ((REPO / "src" / "kbflow", "kbflow"), (REPO / "flows", "kbflow.flows"), (REPO / "tasks", "kbflow.tasks"))

# modules not checked for private names, each with its reason; keep this short
PRIVATE_NAMES_ALLOWED_IN: set[str] = set()
# other libraries' private names that a module uses because the library offers no public way: (module, name)
THIRD_PARTY_PRIVATE_NAMES = {
    # Prefect (3.9) sets a RunnerDeployment's Run form schema from the flow's signature and has no public setter;
    # `kbflow serve` offers the configs folder's names as a drop-down in it
    ("kbflow.flows.deployments", "_parameter_openapi_schema"),
    # markitdown's HTML conversion applied to an already parsed page (a test holds the result equal to
    # markitdown's own conversion of the same page)
    ("kbflow.convert.formats.html", "_CustomMarkdownify"),
    # torch: whether the kernel grants the AMX tiles and oneDNN runs bf16, which decide e5's precision
    ("kbflow.embed.e5", "_C"), ("kbflow.embed.e5", "_cpu"), ("kbflow.embed.e5", "_init_amx"),
    ("kbflow.embed.e5", "_is_mkldnn_bf16_supported"),
    # torch: oneDNN's product with its bias and GELU or sum fused in, the op torch.compile emits for these patterns
    # (bf16 on AMX; a test holds its vectors to torch's own linear, gelu and sum)
    ("kbflow.embed.e5", "_linear_pointwise"),
    # torch's only plain int8 x int8 -> int32 product (its quantized tensor ops are deprecated): `kbflow bench
    # embed`'s int8 probe, the ceiling an int8 model is measured against
    ("kbflow.bench.embed", "_int_mm"),
    # the MCP SDK (2.3) builds each tool from a function and has no hook for the tool class: `kbflow mcp` swaps in
    # its own Tool subclass, which reports bad arguments in kbflow's words (a test drives it over stdio)
    ("kbflow.mcp.server", "_tool_manager"), ("kbflow.mcp.server", "_tools"),
}
# private names of other libraries' public API (namedtuple methods carry an underscore to avoid field names)
PUBLIC_UNDERSCORE_NAMES = {"_replace", "_asdict", "_fields", "_make", "_exit"}  # namedtuple API; os._exit


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the distribution."""
    found = {}
    for root, prefix in ROOTS:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((prefix, *parts))] = path
    return found


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imported_from(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of ``from X import ...`` (relative imports resolved against ``package``)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kbflow modules that ``name`` imports anywhere in its text; ``from pkg import sub`` is the submodule."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in known}
        elif isinstance(node, ast.ImportFrom):
            module = _imported_from(node, _package_of(name, path))
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    found.add(f"{module}.{alias.name}")
                elif module in known:
                    found.add(module)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    inside = set(component)
    return "; ".join(f"{name} -> {', '.join(sorted(graph[name] & inside))}" for name in component)


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_import_graph_has_no_cycles():
    graph = import_graph()
    assert len(graph) > 100 and "kbflow.flows.ingest" in graph["kbflow.api"] | graph["kbflow.flows.reembed"] | {
        target for targets in graph.values() for target in targets}
    found = [_describe(component, graph) for component in cycles(graph)]
    assert not found, "import cycles:\n" + "\n".join(found)


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


# The folders of src/kbflow (and flows/, tasks/) from the bottom: a module may import its own folder, any folder of
# a lower rank, and a folder of its own rank only where that rank is one layer of several folders (the state and
# the stores know each other's files; the stages call each other's helpers). Every module must be in a folder
# listed here, so a new folder needs a rule before its first test run passes.
RANKS = {
    "core": 0,                     # errors, locations, HTTP, retries, extras, schemas, model ids, the trust boundary
    "runtime": 1, "config": 1,     # the process a run lives in; the typed configuration
    "state": 2, "stores": 2,       # manifests, locks, snapshots, healing; LanceDB, Qdrant, the vector cache
    "sources": 3, "convert": 3, "chunk": 3, "embed": 3, "graph": 3, "search": 3,  # the stages
    "engine": 4,                   # ingest and reembed over the stages, the evaluator, processes' recipes
    "ops": 5,                      # verify, prune, deploy, report
    "entry": 6,                    # cli, mcp, api, kb, orchestrate, flows, tasks: what users and Prefect call
    "lab": 7,                      # bench, testing: never imported by the product (but `kbflow bench` from cli)
}
SHARED_RANKS = {2, 3, 6}
ENTRY = {"kbflow", "kbflow.api", "kbflow.kb", "kbflow.orchestrate", "kbflow.__main__"}
ENTRY_FOLDERS = {"cli", "mcp", "flows", "tasks"}
LAB_FOLDERS = {"bench", "testing"}
# the one reach into the lab: `kbflow bench` is a subcommand of the cli (imported when it runs)
LAB_IMPORTS_ALLOWED = {("cli", "bench")}


def folder_of(name: str) -> str:
    """The rule folder of a module: its folder under kbflow, 'entry' or 'lab' for those groups."""
    if name in ENTRY:
        return "entry"
    folder = name.split(".")[1]
    return "entry" if folder in ENTRY_FOLDERS else "lab" if folder in LAB_FOLDERS else folder


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    offenders = []
    for name, targets in sorted(graph.items()):
        source = folder_of(name)
        for target in sorted(targets):
            into = folder_of(target)
            if into == source or RANKS[into] < RANKS[source] or (RANKS[into] == RANKS[source] in SHARED_RANKS):
                continue
            if (name.split(".")[1], target.split(".")[1]) in LAB_IMPORTS_ALLOWED:
                continue
            offenders.append(f"{name} ({source}) imports {target} ({into})")
    return offenders


def test_every_module_has_a_layer():
    """A flat module at the root (other than the public entry points) or a new folder has no rank: give it one."""
    unplaced = [name for name in modules() if folder_of(name) not in RANKS]
    assert not unplaced, f"modules outside every layer folder: {unplaced}"


def test_the_layer_check_sees_an_upward_import():
    assert upward_imports({"kbflow.core.trust": {"kbflow.convert.objects"}, "kbflow.convert.web": {"kbflow.core.trust"},
                           "kbflow.stores.x": {"kbflow.state.y"}, "kbflow.engine.z": {"kbflow.bench.w"},
                           "kbflow.cli.main": {"kbflow.bench.cli"}, "kbflow.ops.verify": {"kbflow.api"}}) == [
        "kbflow.core.trust (core) imports kbflow.convert.objects (convert)",
        "kbflow.engine.z (engine) imports kbflow.bench.w (lab)",
        "kbflow.ops.verify (ops) imports kbflow.api (entry)"]


def test_lower_layers_never_import_upper_ones():
    offenders = upward_imports(import_graph())
    assert not offenders, "\n".join(offenders)


def _defined_private_names(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, assignments, arguments, attributes set on ``self`` or
    ``cls`` (setting another object's private attribute is using it)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) \
                and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def private_names_used(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str]]:
    """``from x import _y`` and ``something._y`` where ``_y`` is not defined in this module (``self._y`` and an
    object of this module's own class reading its private attribute are the module's own business), each as
    (the private name, where and how it is used)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    where = path.relative_to(REPO) if path.is_relative_to(REPO) else path.name
    own = _defined_private_names(tree)
    used = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            module = _imported_from(node, _package_of(name, path))
            used += [(alias.name, f"{where}:{node.lineno}: from {module} import {alias.name}")
                     for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")
                     and f"{module}.{alias.name}" not in known]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if node.attr in own or node.attr in PUBLIC_UNDERSCORE_NAMES:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            used.append((node.attr, f"{where}:{node.lineno}: {ast.unparse(node)}"))
    return used


def test_the_private_name_check_sees_both_forms(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from kbflow.api import _config\nfrom kbflow import api\n\n\nclass Own:\n    _mine = 1\n\n"
                      "    def read(self, other):\n        return self._x, other._mine, api._config, other._db\n")
    found = sorted(line.split(": ", 1)[1] for _name, line in private_names_used("sample", sample, {}))
    assert found == ["api._config", "from kbflow.api import _config", "other._db"]


def test_no_module_uses_another_modules_private_names():
    known = modules()
    offenders = [line for name, path in known.items() if not _within(name, tuple(PRIVATE_NAMES_ALLOWED_IN))
                 for private, line in private_names_used(name, path, known)
                 if (name, private) not in THIRD_PARTY_PRIVATE_NAMES]
    assert not offenders, "\n".join(offenders)
