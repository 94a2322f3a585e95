"""The import graph of kbflow (``src/kbflow``, ``flows/`` as ``kbflow.flows``, ``tasks/`` as ``kbflow.tasks``) has no
cycles, its lower layers never reach up, and no module uses another module's private name.

Every import counts, a function-level one included: an import moved into a function to dodge a cycle is still a
dependency, and still a cycle. The layers, from the bottom:

1. foundation: ``errors``, ``config``, ``resolve``, ``schemas``, ``storage``, ``urls``, ``model_ids``,
   ``environment``, ``failpoints``, ``retry`` and the other single modules that import nothing above them;
2. ``kbflow.state`` (manifest, lock, snapshots, healing) and ``kbflow.stores`` (LanceDB, Qdrant, the vector
   cache): they know files, tables and models' ids, never the stages that fill them;
3. the stages: ``convert``, ``chunk``, ``embed``, ``graph``, ``search``;
4. ``kbflow.engine`` and ``evaluate``: the ingest and reembed runs over the stages, and the retrieval scores a
   reembed's quality check reads. How a stage or an ingest runs (Prefect task, flow run or plain call) is handed to
   them (a runner, an ingest callable), so they never import the entry points;
5. the entry points: ``orchestrate`` (engine in process or Prefect flow run), ``api``, ``kb``, ``verify``,
   ``cli``, ``mcp_*``, ``kbflow.tasks`` and ``kbflow.flows`` (Prefect), ``kbflow.bench``.

The layer rules asserted below are the ones that have been broken before; the cycle test catches the rest of what
matters (a lower layer reaching up and being reached back).
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
    ("kbflow.mcp_server", "_tool_manager"), ("kbflow.mcp_server", "_tools"),
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


LAYER_RULES = [
    # (modules, what they must never import)
    (("kbflow.state", "kbflow.stores", "kbflow.storage", "kbflow.config", "kbflow.errors", "kbflow.schemas"),
     ("kbflow.sources", "kbflow.convert", "kbflow.chunk", "kbflow.embed", "kbflow.graph", "kbflow.search", "kbflow.engine",
      "kbflow.api", "kbflow.kb", "kbflow.cli", "kbflow.evaluate", "kbflow.verify", "kbflow.tasks", "kbflow.flows")),
    (("kbflow.engine", "kbflow.evaluate"),
     ("kbflow.orchestrate", "kbflow.api", "kbflow.kb", "kbflow.cli", "kbflow.tasks", "kbflow.flows",
      "kbflow.mcp_server", "kbflow.mcp_http", "kbflow.bench")),
]


def test_lower_layers_never_import_upper_ones():
    graph = import_graph()
    offenders = [f"{name} imports {target}" for lower, upper in LAYER_RULES for name, targets in sorted(graph.items())
                 if _within(name, lower) for target in sorted(targets) if _within(target, upper)]
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
