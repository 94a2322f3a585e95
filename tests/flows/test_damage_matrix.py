"""The damage matrix (tests/flows/damage_matrix.py): every file and folder an ingest leaves × every damage kind ×
LanceDB and Qdrant's local mode. For each case: no command prints a traceback (every error is kbflow's, naming the
file and the fix); verify names what is damaged, or the damage is harmless (every command answers and a search sees
the undamaged store); verify --repair heals it (an unreadable file: once the access its message names is given
back); the next ingest restores exactly the undamaged store, with 0 texts embedded wherever the vector cache or the
store still held the vector; and the outcome is the one docs/bench/damage-matrix.json records (and docs/reliability.md
shows): a change of behaviour is a change of that file, made by ``python -m tests.flows.damage_matrix --write``."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from kbflow.search.tokens import TOKENIZER_VERSION
from tests.flows import damage_matrix as matrix
from tests.flows.damage_matrix import ROLES, case_id, cases

# with LanceDB, this folder holds both the store and the vector cache: every vector is embedded again
LOST_WITH = {"LanceDB folder"}
RECORDED = json.loads(matrix.RECORD.read_text())["results"] if matrix.RECORD.exists() else {}


def check(record: dict, stored_chunks: int) -> None:
    """The invariants of one case (see the module's docstring)."""
    name = case_id(record["store"], matrix.role_named(record["role"]), record["kind"])
    tracebacks = {command: record["messages"][command] for command, outcome in record["outcomes"].items()
                  if outcome == "traceback"}
    assert not tracebacks, (name, tracebacks)
    for command, outcome in record["outcomes"].items():
        message = record["messages"].get(command, "")
        if outcome != "ok" and not command.startswith("contents"):
            assert "kbflow verify --repair" in message or "permission denied" in message, (name, command, message)
    if record["kind"] == "unreadable":
        for command in matrix.COMMANDS:
            if record["outcomes"][command] == "AccessDenied":  # the path, and the command that gives access back
                assert "chmod u+rwX '" in record["messages"][command], (name, record["messages"][command])
    elif not record["verify_names"]:  # verify saw nothing: then nothing a reader sees was damaged
        stopped = [command for command in matrix.COMMANDS if record["outcomes"][command] != "ok"]
        assert not stopped and record["harmless"] and record["search_answers"], (name, stopped, record["messages"])
    else:
        role = matrix.role_named(record["role"])
        names = role.what if isinstance(role.what, tuple) else (role.what,)
        assert set(names) & set(record["verify_names"]), (name, record["verify_names"])
        assert record["repaired"], name
    assert record["healed"], (name, record["left_after_repair"])
    lost = record["role"] in LOST_WITH and record["store"] == "lancedb" and record["kind"] != "unreadable"
    expected = stored_chunks if lost else 0
    assert record["embedded_after"] == expected and record["failed_after"] == 0, (name, record["embedded_after"])
    assert record["ok_at_end"] and record["restored"], name
    assert record["bm25_terms"] == TOKENIZER_VERSION, (name, record["bm25_terms"])
    if record["kind"] == "folder":
        assert record["kept"], f"{name}: what was put in the folder was deleted, not set aside"


def _compare(record: dict) -> None:
    name = case_id(record["store"], matrix.role_named(record["role"]), record["kind"])
    assert name in RECORDED, f"{name} is not in {matrix.RECORD.name}: run `python -m tests.flows.damage_matrix --write`"
    assert matrix.summary(record) == RECORDED[name], (
        f"{name} behaves otherwise than {matrix.RECORD.name} records (and docs/reliability.md shows); if the change "
        "is meant, run `python -m tests.flows.damage_matrix --write`")


def make_tests(store: str) -> dict:
    """The case tests of one store, as a test module's names: each store's cases are a module of their own, so
    ``--dist loadfile`` runs the two stores' cases on different workers."""

    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        """The store's namespace, built once; each case damages copies of it."""
        from tests.conftest import CASES

        root = tmp_path_factory.mktemp(f"damage-matrix-{store}")
        docs = root / "docs"
        shutil.copytree(CASES / "docs", docs)
        return docs, matrix.build(root, docs, store)

    readable = [pytest.param(role.name, kind, id=case_id(store, role, kind))
                for each, role, kind in cases() if each == store and kind != "unreadable"]

    @pytest.mark.parametrize("role_name,kind", readable)
    def test_damage_is_named_healed_and_restored_with_nothing_embedded(built, tmp_path, role_name, kind):
        docs, (config, base, before) = built
        record = matrix.run_case(store, matrix.role_named(role_name), kind, config, base, docs, tmp_path, before)
        check(record, len(before["chunks"]))
        _compare(record)

    @pytest.mark.skipif(sys.platform != "linux", reason="setpriv drops root's power to read anything (Linux)")
    def test_an_unreadable_file_is_one_error_naming_it_and_the_command_that_gives_access_back(built, tmp_path):
        """Run in a child process without root's power to read anything (setpriv), so an unreadable file is one."""
        records = matrix.run_unreadable([store], tmp_path / "records.json")
        assert {record["role"] for record in records} == {role.name for role in ROLES if store in role.stores}
        for record in records:
            check(record, len(built[1][2]["chunks"]))
            _compare(record)

    def test_every_path_an_ingest_leaves_has_a_role_and_every_role_a_path(built):
        _docs, (_config, base, _before) = built
        paths = matrix.paths_of(base)
        unlisted = [path for path in paths if not any(role.matches(path) and store in role.stores for role in ROLES)]
        assert not unlisted, f"{store}: list these in damage_matrix.ROLES (each becomes its damage cases): {unlisted}"
        for role in ROLES:
            if store in role.stores:
                assert matrix.pick(role, base), (store, role.name)

    return {"built": built, **{name: value for name, value in locals().items() if name.startswith("test_")}}


globals().update(make_tests("lancedb"))  # Qdrant's: test_damage_matrix_qdrant.py


def test_the_docs_table_is_the_recorded_matrix():
    text = matrix.DOC.read_text()
    start, end = text.index(matrix.MARKS[0]) + len(matrix.MARKS[0]), text.index(matrix.MARKS[1])
    assert text[start:end].strip() == matrix.render(RECORDED), "run `python -m tests.flows.damage_matrix --write`"
    assert len(RECORDED) == sum(1 for _ in cases())
