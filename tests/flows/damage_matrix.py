"""The damage matrix: every file and folder an ingest leaves in a data dir × every way an operator's bad day damages
one, on LanceDB and on Qdrant's local mode.

A path's *role* says what it is (``ROLES``, matched against the data dir an ingest left: a file no role names fails
``test_every_path_an_ingest_leaves_has_a_role``, so a case is added by listing a path). Each role × damage kind is
one case, run by ``run_case`` on a copy of a freshly built namespace; its outcome (what each command did, what
verify named, what repair did, what the next ingest embedded) is checked against the invariants in
test_damage_matrix.py and recorded in docs/bench/damage-matrix.json, from which docs/reliability.md's damage table
is generated (``python -m tests.flows.damage_matrix --write``).

Run as a module under dropped capabilities (``--unreadable``), it runs the unreadable cases, which root could
otherwise read anyway."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import stat
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

DOCS = 4  # tests/cases/docs
STORES = ("lancedb", "qdrant")
QUERY = "how do I restore a backup"
ANSWER = "docs/backups.md"
# damage kinds: for a file, and for a folder
FILE_KINDS = ("emptied", "cut", "scrambled", "deleted", "folder", "unreadable", "wrong-shape", "wrong-types")
FOLDER_KINDS = ("emptied", "deleted", "file", "unreadable")
KEPT = "whatever was put there is kept"


@dataclass(frozen=True)
class Role:
    """Files or folders of one kind: ``pattern`` relative to the data dir (``*`` within one name); ``pick`` which one
    a case damages when several match (``newest`` by name for LanceDB version manifests, whose names count down)."""

    name: str
    pattern: str
    folder: bool = False
    pick: str = "middle"
    what: str | tuple[str, ...] = ""  # the verify check (or checks) that names its damage
    stores: tuple[str, ...] = STORES
    # what the file is, for the docs table
    about: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        if self.folder:
            return FOLDER_KINDS
        shaped = self.pattern.endswith((".json", ".parquet"))  # a file whose shape a reader checks
        return tuple(kind for kind in FILE_KINDS
                     if (kind != "wrong-shape" or shaped) and (kind != "wrong-types" or self.pattern.endswith(".json")))

    def matches(self, relative: str) -> bool:
        return re.fullmatch(re.escape(self.pattern).replace(r"\*", "[^/]*"), relative) is not None


STATE = "state/default"
RUN = "runs/default/*"
CONVERTED = "prefect/results/kbflow-convert"


def _table(prefix: str, table: str, what: str, about: str, stores=STORES) -> list[Role]:
    """The files of one LanceDB table."""
    return [
        Role(f"{prefix} table", f"lancedb/{table}", True, what=what, stores=stores, about=about),
        Role(f"{prefix} data folder", f"lancedb/{table}/data", True, what=what, stores=stores),
        Role(f"{prefix} data file", f"lancedb/{table}/data/*.lance", what=what, stores=stores),
        Role(f"{prefix} versions folder", f"lancedb/{table}/_versions", True, what=what, stores=stores),
        Role(f"{prefix} newest version", f"lancedb/{table}/_versions/*.manifest", pick="newest", what=what,
             stores=stores),
        Role(f"{prefix} older version", f"lancedb/{table}/_versions/*.manifest", pick="oldest", what=what,
             stores=stores),
        Role(f"{prefix} version hint", f"lancedb/{table}/_versions/latest_version_hint.json", what=what,
             stores=stores),
        Role(f"{prefix} transactions folder", f"lancedb/{table}/_transactions", True, what=what, stores=stores),
        Role(f"{prefix} transaction", f"lancedb/{table}/_transactions/*.txn", what=what, stores=stores),
    ]


ROLES: list[Role] = [
    Role("state folder", "state", True, what="namespace.json", about="every namespace's state"),
    Role("namespace state folder", STATE, True, what="namespace.json", about="the namespace's state"),
    Role("manifest", f"{STATE}/manifest.parquet", what="manifest.parquet",
         about="what each document is, where it came from and which chunks it holds"),
    Role("model record", f"{STATE}/namespace.json", what="namespace.json",
         about="the namespace's embedding model and dimension"),
    Role("last run record", f"{STATE}/last_run.json", what="last_run.json", about="the last run's summary"),
    Role("chunk plans folder", f"{STATE}/chunk-plans", True, what="chunk-plans",
         about="where each document's chunk boundaries are kept, so an edit re-chunks only its neighbourhood"),
    Role("chunk plans shard", f"{STATE}/chunk-plans/*", True, what="chunk-plans"),
    Role("chunk plan", f"{STATE}/chunk-plans/*/*.json", what="chunk-plans"),
    Role("run snapshots folder", "runs", True, what="run-snapshots", about="each run's Parquet snapshots"),
    Role("namespace runs folder", "runs/default", True, what="run-snapshots"),
    Role("run folder", RUN, True, what="run-snapshots"),
    Role("run plan", f"{RUN}/plan.parquet", what="run-snapshots"),
    Role("run failures", f"{RUN}/failures.parquet", what="run-snapshots"),
    Role("run stage folder", f"{RUN}/*", True, what="run-snapshots"),
    Role("run stage part", f"{RUN}/*/part-*.parquet", what="run-snapshots"),
    Role("Prefect folder", "prefect", True, what="conversion-cache", about="Prefect's result files"),
    Role("Prefect results folder", "prefect/results", True, what="conversion-cache"),
    Role("conversion cache folder", CONVERTED, True, what="conversion-cache",
         about="each file's Markdown by content, so an unchanged file is never converted again"),
    Role("conversion cache shard", f"{CONVERTED}/*", True, what="conversion-cache"),
    Role("conversion cache entry", f"{CONVERTED}/*/*.json", what="conversion-cache"),
    Role("LanceDB folder", "lancedb", True, what=("store", "vector-cache"),
         about="LanceDB tables: the store (with Qdrant, only the vector cache)"),
    *_table("store", "chunks_default.lance", "store", "the namespace's chunks, vectors and search indexes",
            stores=("lancedb",)),
    Role("store indexes folder", "lancedb/chunks_default.lance/_indices", True, what=("index", "store"),
         stores=("lancedb",)),
    Role("store index", "lancedb/chunks_default.lance/_indices/*", True, what="index", stores=("lancedb",),
         pick="all"),
    Role("store index metadata", "lancedb/chunks_default.lance/_indices/*/metadata.lance", what="index",
         stores=("lancedb",), pick="all"),
    Role("store index documents", "lancedb/chunks_default.lance/_indices/*/part_*_docs.lance", what="index",
         stores=("lancedb",), pick="all"),
    Role("store index postings", "lancedb/chunks_default.lance/_indices/*/part_*_invert.lance", what="index",
         stores=("lancedb",), pick="all"),
    Role("store index terms", "lancedb/chunks_default.lance/_indices/*/part_*_tokens.lance", what="index",
         stores=("lancedb",), pick="all"),
    *_table("vector cache", "vectors_*.lance", "vector-cache",
            "every text's vector by model and text, so no text is embedded twice"),
    Role("Qdrant folder", "qdrant", True, what="store", stores=("qdrant",), about="Qdrant local mode's files"),
    Role("Qdrant lock", "qdrant/.lock", what="store", stores=("qdrant",)),
    Role("Qdrant meta", "qdrant/meta.json", what="store", stores=("qdrant",)),
    Role("Qdrant collections folder", "qdrant/collection", True, what="store", stores=("qdrant",)),
    Role("Qdrant collection", "qdrant/collection/kbflow_default", True, what="store", stores=("qdrant",)),
    Role("Qdrant collection file", "qdrant/collection/kbflow_default/storage.sqlite", what="store",
         stores=("qdrant",)),
]


def role_named(name: str) -> Role:
    [role] = [role for role in ROLES if role.name == name]
    return role


def cases():
    """(store, role, kind) for every case: each role of each store × its damage kinds."""
    for store in STORES:
        for role in ROLES:
            if store in role.stores:
                for kind in role.kinds:
                    yield store, role, kind


def paths_of(data: Path) -> list[str]:
    """Every file and folder under ``data``, relative, in POSIX form."""
    return sorted(path.relative_to(data).as_posix() for path in data.rglob("*"))


def pick(role: Role, data: Path) -> list[str]:
    """The paths (relative to ``data``) a case of ``role`` damages: one of those that match, or all of them."""
    found = [relative for relative in paths_of(data)
             if role.matches(relative) and (data / relative).is_dir() == role.folder]
    assert found, f"no {role.pattern} in {data}"
    if role.pick == "all":  # a search index is kept in several generations: damage the live one, whichever it is
        return found
    if role.pick == "newest":  # LanceDB names versions counting down: the smallest number is the newest
        return [min(found, key=lambda name: int(Path(name).stem))]
    if role.pick == "oldest":
        return [max(found, key=lambda name: int(Path(name).stem))]
    return [found[len(found) // 2]]


def damage(path: Path, kind: str) -> None:
    """Damage ``path`` the way ``kind`` says."""
    if kind == "unreadable":
        path.chmod(0)
    elif path.is_dir():
        if kind == "emptied":
            for child in list(path.iterdir()):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        elif kind == "deleted":
            shutil.rmtree(path)
        elif kind == "file":
            shutil.rmtree(path)
            path.write_text("a file where a folder belongs\n")
        else:
            raise AssertionError(kind)
    elif kind == "emptied":
        path.write_bytes(b"")
    elif kind == "cut":
        path.write_bytes(path.read_bytes()[:path.stat().st_size // 2])
    elif kind == "scrambled":  # a third of the bytes overwritten (a bad sector, a broken copy)
        scrambled = bytearray(path.read_bytes())
        shuffle = random.Random(1)
        for _ in range(max(1, len(scrambled) // 3)):
            scrambled[shuffle.randrange(len(scrambled))] = shuffle.randrange(256)
        path.write_bytes(bytes(scrambled))
    elif kind == "deleted":
        path.unlink()
    elif kind == "folder":  # a folder where the file belongs (someone's mkdir, a bad restore)
        path.unlink()
        path.mkdir()
        (path / "kept.txt").write_text(KEPT)
    elif kind == "wrong-types":  # the same JSON object, each value of another type (a hand edit, another tool)
        original = json.loads(path.read_text())
        other = {str: 5, int: "abc", float: "abc", bool: "yes", list: {"a": 1}, dict: ["a"], type(None): [1]}
        changed = ({key: other[type(value)] for key, value in original.items()} if isinstance(original, dict)
                   else {"unexpected": original})
        path.write_text(json.dumps(changed))
    elif kind == "wrong-shape":  # valid JSON or Parquet, of another shape
        if path.suffix == ".json":
            path.write_text(json.dumps([{"dimension": "abc", "model_id": 5}, "unexpected"]))
        else:
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"unexpected": [1, 2, 3]}), path)
    else:
        raise AssertionError(kind)


def config_for(folder: Path, store: str) -> Path:
    config = folder / f"{store}.yaml"
    lines = ["flow:", "  doc_batch: 1", "  lock_wait_s: 1"]  # a store commit per document: several data files
    if store == "qdrant":
        lines += ["store:", "  kind: qdrant"]  # local mode under <data_dir>/qdrant
    config.write_text("\n".join(lines) + "\n")
    return config


def build(folder: Path, docs: Path, store: str) -> tuple[Path, Path, dict]:
    """A namespace of the test documents in ``folder``; returns its config, data dir and contents."""
    from kbflow import api

    config = config_for(folder, store)
    data = folder / f"base-{store}"
    summary = api.ingest([str(docs)], config=config, data_dir=data)
    assert summary["documents"]["new"] == DOCS and summary["documents"]["failed"] == 0, summary
    return config, data, contents(config, data)


def contents(config: Path, data: Path) -> dict:
    """What a search sees: every stored chunk (id, document, text), sorted, and the manifest's documents."""
    from kbflow import api
    from kbflow.core.errors import StateDamaged
    from kbflow.state.manifest import NamespaceState
    from kbflow.stores import open_store
    from kbflow.stores.errors import access_errors

    cfg = api.resolve_config(config, data)
    state = NamespaceState(data, "default")
    with access_errors():  # this test's own look, not a command: an unreadable file reads as an error like theirs
        meta = state.meta()
        if meta is None:  # no model record: this look cannot open the store (the commands say why)
            raise StateDamaged(f"no namespace.json in {state.root}")
        rows = open_store(cfg, state.store_namespace(), meta["dimension"]).rows(["chunk_id", "doc_id", "text"])
        documents = state.read_manifest().column("doc_id").to_pylist()
    return {"chunks": sorted(rows.to_pylist(), key=lambda row: row["chunk_id"]), "documents": sorted(documents)}


def _attempt(record: dict, command: str, call):
    """Run one command; record "ok", the KbflowError's type (what the CLI prints as one line), or a traceback."""
    from kbflow.core.errors import KbflowError

    try:
        result = call()
    except KbflowError as exc:
        record["outcomes"][command] = type(exc).__name__
        record["messages"][command] = str(exc)
        return None
    except Exception as exc:  # noqa: BLE001 - the matrix records what would have been a traceback
        record["outcomes"][command] = "traceback"
        record["messages"][command] = f"{type(exc).__name__}: {exc}"
        return None
    record["outcomes"][command] = "ok"
    return result


def run_case(store: str, role: Role, kind: str, config: Path, base: Path, docs: Path, work: Path,
             before: dict) -> dict:
    """Damage a copy of ``base`` and run every command over it; returns what each did."""
    from datetime import timedelta

    from kbflow import api
    from kbflow.ops.prune import prune
    from kbflow.state.manifest import NamespaceState

    record: dict = {"store": store, "role": role.name, "kind": kind, "outcomes": {}, "messages": {}}
    copies = {}
    record["paths"] = pick(role, base)
    for name in ("data", "plain"):
        copies[name] = work / name
        shutil.copytree(base, copies[name], symlinks=True)
        for relative in record["paths"]:
            damage(copies[name] / relative, kind)
    data, plain = copies["data"], copies["plain"]
    try:
        _attempt(record, "stats", lambda: api.stats("default", config, data))
        hits = _attempt(record, "search", lambda: api.search(QUERY, config=config, data_dir=data))
        record["search_answers"] = bool(hits) and hits[0].source_path == ANSWER
        _attempt(record, "namespaces", lambda: api.namespaces(config, data))
        damaged_contents = _attempt(record, "contents-before", lambda: contents(config, data))
        record["harmless"] = damaged_contents == before  # what a search sees is untouched (before any repair)
        found = _attempt(record, "verify", lambda: api.verify("default", config, data))
        record["verify_names"] = sorted({f["check"] for f in found["findings"]}) if found else []
        ingested = _attempt(record, "ingest", lambda: api.ingest([str(docs)], config=config, data_dir=plain))
        record["ingest_embedded"] = ingested["chunks"]["embedded"] if ingested else None
        with warnings.catch_warnings():  # LanceDB warns that no older version is kept: none is wanted here
            warnings.simplefilter("ignore", UserWarning)
            _attempt(record, "prune", lambda: prune(api.resolve_config(config, plain), keep_runs=1,
                                                    versions_older_than=timedelta(0)))
        _attempt(record, "clear", lambda: api.clear("default", config, plain))
        repaired = _attempt(record, "repair", lambda: api.verify("default", config, data, repair=True))
        record["repaired"] = sorted((repaired or {}).get("repaired") or {})
        if kind == "unreadable":  # repair cannot give access back: the operator runs the command it names
            for relative in record["paths"]:
                (data / relative).chmod(stat.S_IRWXU)
            repaired = _attempt(record, "repair-again", lambda: api.verify("default", config, data, repair=True))
        healed = _attempt(record, "verify-after", lambda: api.verify("default", config, data))
        record["healed"] = bool(healed and healed["ok"])
        record["left_after_repair"] = [f"{f['check']}: {f['detail']}" for f in healed["findings"]] if healed else []
        rerun = _attempt(record, "ingest-after", lambda: api.ingest([str(docs)], config=config, data_dir=data))
        record["embedded_after"] = rerun["chunks"]["embedded"] if rerun else None
        record["failed_after"] = rerun["documents"]["failed"] if rerun else None
        final = _attempt(record, "verify-end", lambda: api.verify("default", config, data))
        record["ok_at_end"] = bool(final and final["ok"])
        now = _attempt(record, "contents", lambda: contents(config, data))
        record["restored"] = now == before
        # what an operator put where a file belongs is set aside, never deleted
        record["kept"] = any(path.read_text() == KEPT for path in data.rglob("kept.txt"))
        meta = NamespaceState(data, "default").meta() if record["ok_at_end"] else None
        record["bm25_terms"] = meta.get("bm25_terms") if meta else None  # a rewritten record names the rows' terms
    finally:  # the copies go with the test's tmp folder: let it remove them
        for copy in copies.values():
            for relative in record["paths"]:
                damaged = copy / relative
                if damaged.exists() and not damaged.is_symlink():
                    damaged.chmod(stat.S_IMODE(damaged.lstat().st_mode) | stat.S_IRWXU)
    return record


COMMANDS = ("stats", "search", "namespaces", "verify", "ingest", "prune", "clear")  # run on the damaged copies
RECORD = Path(__file__).resolve().parents[2] / "docs" / "bench" / "damage-matrix.json"
DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
MARKS = ("<!-- damage-matrix: generated by `python -m tests.flows.damage_matrix --write`; do not edit -->",
         "<!-- damage-matrix end -->")
SHORT = {"emptied": "emptied", "cut": "cut in half", "scrambled": "scrambled", "deleted": "deleted",
         "folder": "a folder in its place", "file": "a file in its place", "unreadable": "unreadable",
         "wrong-shape": "wrong shape", "wrong-types": "wrong types"}


def case_id(store: str, role: Role, kind: str) -> str:
    return f"{store}/{role.name}/{kind}"


def verdict(record: dict) -> str:
    """One word for the docs table: what the damage costs an operator."""
    stopped = [command for command in COMMANDS if record["outcomes"].get(command) != "ok"]
    if record["kind"] == "unreadable":
        return "chmod" if stopped or record["verify_names"] else "harmless"
    if not stopped and not record["verify_names"]:
        return "harmless"
    return f"repaired, {record['embedded_after']} embedded" if record["embedded_after"] else "repaired"


def summary(record: dict) -> dict:
    """What a case did, as recorded in docs/bench/damage-matrix.json and checked against it."""
    return {"verdict": verdict(record),
            "stops": [command for command in COMMANDS if record["outcomes"].get(command) != "ok"],
            "verify": record["verify_names"], "repaired": record["repaired"],
            "embedded_after": record["embedded_after"]}


def render(recorded: dict) -> str:
    """The docs table: a row per file or folder, a column per damage kind, each cell the cases' verdicts."""
    kinds = [kind for kind in ("emptied", "cut", "scrambled", "deleted", "folder", "file", "unreadable",
                               "wrong-shape", "wrong-types")]
    lines = ["| File or folder (under the data dir) | " + " | ".join(SHORT[kind] for kind in kinds) + " |",
             "|---|" + "---|" * len(kinds)]
    for role in ROLES:
        cells = []
        for kind in kinds:
            found = {store: recorded[case_id(store, role, kind)]["verdict"] for store in role.stores
                     if case_id(store, role, kind) in recorded}
            if not found:
                cells.append("")
            elif len(set(found.values())) == 1:
                cells.append(next(iter(found.values())))
            else:
                cells.append("; ".join(f"{store}: {verdict}" for store, verdict in found.items()))
        where = role.pattern + ("/" if role.folder else "")
        lines.append(f"| `{where}` ({role.name}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write(records: list[dict], machine: str) -> None:
    """docs/bench/damage-matrix.json from ``records``, and the table in docs/reliability.md from it."""
    recorded = {case_id(record["store"], role_named(record["role"]), record["kind"]): summary(record)
                for record in records}
    totals: dict[str, int] = {}
    for entry in recorded.values():
        word = entry["verdict"].split(",")[0]
        totals[word] = totals.get(word, 0) + 1
    RECORD.write_text(json.dumps({
        "command": "python -m tests.flows.damage_matrix --write", "machine": machine,
        "what": "every file and folder an ingest of tests/cases/docs leaves (doc_batch 1) x every damage kind, on "
                "LanceDB and Qdrant local mode; per case the commands that stopped with an error (never a "
                "traceback), the checks verify named, what verify --repair did and what the next ingest embedded",
        "cases": len(recorded), "verdicts": dict(sorted(totals.items())), "results": recorded}, indent=1) + "\n")
    text = DOC.read_text()
    start, end = text.index(MARKS[0]), text.index(MARKS[1])
    DOC.write_text(text[:start] + MARKS[0] + "\n" + render(recorded) + "\n" + text[end:])


def run_all(only: list[str], unreadable: bool, root: Path) -> list[dict]:
    """Run the matching cases in this process, each on a fresh copy of a namespace built once per store."""
    import tempfile

    from tests.conftest import CASES

    docs = root / "docs"
    if not docs.exists():
        shutil.copytree(CASES / "docs", docs)
    built: dict = {}
    records = []
    for store, role, kind in cases():
        if (kind == "unreadable") != unreadable or only and not {store, role.name, kind} & set(only):
            continue
        if store not in built:
            built[store] = build(Path(tempfile.mkdtemp(dir=root)), docs, store)
        config, base, before = built[store]
        records.append(run_case(store, role, kind, config, base, docs, Path(tempfile.mkdtemp(dir=root)), before))
        print(case_id(store, role, kind), verdict(records[-1]), file=sys.stderr, flush=True)
    return records


def run_unreadable(only: list[str], out: Path) -> list[dict]:
    """The unreadable cases in a child process that root's power to read anything is dropped from (setpriv)."""
    import subprocess

    command = [sys.executable, "-m", "tests.flows.damage_matrix", str(out), "--unreadable", *only]
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def main(argv: list[str]) -> None:
    """``python -m tests.flows.damage_matrix --write``: run every case, write docs/bench/damage-matrix.json and the
    docs table. ``python -m tests.flows.damage_matrix OUT.json [--unreadable] [STORE|ROLE|KIND ...]``: run the
    matching cases (the readable ones, or the unreadable ones) and write their records to OUT.json."""
    import platform
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="damage-matrix-"))
    try:
        if argv[:1] == ["--write"]:
            records = run_all([], False, root) + run_unreadable([], root / "unreadable.json")
            model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                          if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
                else platform.processor()
            write(records, f"{model}, {os.cpu_count()} cores, {platform.system()}")
            return
        out, rest = Path(argv[0]), argv[1:]
        records = run_all([word for word in rest if not word.startswith("--")], "--unreadable" in rest, root)
        out.write_text(json.dumps(records, indent=1))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
