"""One way in: a document's identity, and what the secret scan reads, do not depend on the door it came through.

Every pair of doors (the CLI's ingest of a folder and add-document of a file, relative or absolute, through '..',
a symlinked folder or a file:// URL, the Python API and KnowledgeBase) names one file once; an inline upload
lives in its own space; a namespace that an earlier version filled twice is healed without re-embedding."""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kbflow import api
from kbflow.kb import KnowledgeBase
from kbflow.state.manifest import NamespaceState
from tests.flows.conftest import store_of

TOKEN = "ghp_" + "Zq7" * 12  # a GitHub token's shape


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """tmp/docs/{a.md, sub/b.md}, tmp/link -> docs, and the working directory at tmp."""
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# Alpha\n\nAlpine tea is brewed at eighty degrees.\n")
    (docs / "sub" / "b.md").write_text("# Beta\n\nBeta coffee is brewed at ninety-three degrees.\n")
    (tmp_path / "link").symlink_to(docs)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# each door adds docs/a.md (the folder doors add docs/sub/b.md as well); the API functions run the same engine the
# CLI commands run (tests/flows/test_cli.py checks the commands wrap them)
DOORS = {
    "ingest docs": lambda root, data: api.ingest(["docs"], data_dir=data),
    "ingest /abs/docs": lambda root, data: api.ingest([str(root / "docs")], data_dir=data),
    "ingest file://docs": lambda root, data: api.ingest([f"file://{root}/docs"], data_dir=data),
    "add docs/a.md": lambda root, data: api.add_document("docs/a.md", data_dir=data),
    "add /abs/a.md": lambda root, data: api.add_document(str(root / "docs" / "a.md"), data_dir=data),
    "add sub/../a.md": lambda root, data: api.add_document("docs/sub/../a.md", data_dir=data),
    "add link/a.md": lambda root, data: api.add_document("link/a.md", data_dir=data),
    "add file://a.md": lambda root, data: api.add_document(f"file://{root}/docs/a.md", data_dir=data),
    "kb.add_document": lambda root, data: KnowledgeBase(data_dir=data).add_document(root / "docs" / "a.md"),
}
FOLDER_DOORS = {"ingest docs", "ingest /abs/docs", "ingest file://docs"}


@pytest.mark.parametrize("second", sorted(DOORS))
@pytest.mark.parametrize("first", sorted(DOORS))
def test_every_pair_of_doors_names_a_file_once(first, second, folder, counting):
    data = folder / "data"
    DOORS[first](folder, data)
    embedded = counting.texts_embedded
    summary = DOORS[second](folder, data)
    assert summary["documents"]["new"] == (1 if second in FOLDER_DOORS and first not in FOLDER_DOORS else 0)
    # only a file the first door did not add is embedded (each of these files is one chunk)
    assert counting.texts_embedded - embedded == summary["documents"]["new"], "a stored text was embedded again"
    files = 2 if first in FOLDER_DOORS or second in FOLDER_DOORS else 1
    manifest = NamespaceState(data, "default").read_manifest()
    assert manifest.num_rows == files, manifest.column("source_path").to_pylist()
    assert all(manifest.column("location").to_pylist()), "every file document records where it is"
    texts = store_of(data).rows().column("text").to_pylist()
    assert sum("Alpine tea" in text for text in texts) == 1


def test_an_upload_lives_in_its_own_space_and_never_takes_a_files_identity(folder, counting):
    data = folder / "data"
    api.ingest(["docs"], data_dir=data)
    kb = KnowledgeBase(data_dir=data)
    kb.add_upload("a.md", b"# Uploaded\n\nAn uploaded note about oolong.\n")
    paths = sorted(NamespaceState(data, "default").read_manifest().column("source_path").to_pylist())
    assert paths == ["docs/a.md", "docs/sub/b.md", "upload:a.md"]
    hits = kb.search("Alpine tea brewed", limit=10)
    assert [hit.source_path for hit in hits if "Alpine tea" in hit.text] == ["docs/a.md"]
    # a full ingest of the folder keeps the upload (it is not one of the folder's files) ...
    assert api.ingest(["docs"], data_dir=data)["documents"]["removed"] == 0
    # ... and the same name replaces it
    assert kb.add_upload("a.md", b"# Uploaded\n\nA second note, on pu-erh.\n")["documents"]["changed"] == 1
    refused = pytest.raises(Exception, kb.add_upload, "../a.md", b"x")
    assert "plain file name" in str(refused.value)


def test_refused_inline_content_is_never_written(folder, counting):
    data = folder / "data"
    api.ingest(["docs"], data_dir=data)
    with pytest.raises(Exception) as refused:
        api.add_upload("deploy.md", f"# Deploy\n\ntoken {TOKEN}\n".encode(), data_dir=data)
    assert "GitHub Token" in str(refused.value) and TOKEN not in str(refused.value)
    assert not list((data / "mcp-inbox").rglob("deploy.md"))
    assert not _holds(data, TOKEN)


def _holds(data: Path, value: str) -> list[str]:
    """Every file under the data dir whose bytes (or, for Parquet, whose decoded values) contain ``value``."""
    found = []
    for path in data.rglob("*"):
        if not path.is_file():
            continue
        raw = path.read_bytes()
        if value.encode() in raw:
            found.append(str(path))
        elif path.suffix == ".parquet" and value in json.dumps(pq.read_table(path).to_pylist(), default=str):
            found.append(str(path))
    return found


def _docx_with(text: str) -> bytes:
    from xml.sax.saxutils import escape

    source = Path(__file__).parents[1] / "cases" / "formats" / "pg-mvcc-intro.docx"
    out = io.BytesIO()
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as copy:
        for info in original.infolist():
            data = original.read(info.filename)
            if info.filename == "word/document.xml":
                data = data.replace(b"<w:body>", f"<w:body><w:p><w:r><w:t>{escape(text)}</w:t></w:r></w:p>"
                                    .encode(), 1)
            copy.writestr(info, data)
    return out.getvalue()


def test_a_token_in_html_docx_or_a_name_never_reaches_the_store_a_snapshot_or_the_cache(folder, counting):
    """The issue's cases end to end: the token, escaped by the converters, and a token in a file name."""
    docs = folder / "docs"
    (docs / "page.html").write_text(f"<html><body><h1>Deploy</h1><p>Use {TOKEN} to push.</p></body></html>")
    (docs / "notes.docx").write_bytes(_docx_with(f"Push token: {TOKEN}"))
    (docs / f"{TOKEN}.md").write_text("# Harmless\n\nNothing secret inside.\n")
    data = folder / "data"
    summary = api.ingest(["docs"], data_dir=data)
    failed = {failure["source_path"]: failure["message"] for failure in summary["failures"]}
    assert set(failed) == {"docs/page.html", "docs/notes.docx", "docs/[redacted].md"}, failed
    assert all("credentials" in message and TOKEN not in message for message in failed.values())
    assert _holds(data, TOKEN) == [] and TOKEN not in json.dumps(summary)


def test_a_namespace_an_earlier_version_filled_twice_heals_without_re_embedding(folder, counting, monkeypatch):
    """Before identities were settled, `ingest docs/` then `add-document docs/a.md` stored a.md twice ('docs/a.md'
    and 'a.md'), and manifests kept no locations. That version is reproduced by turning the settling off and
    clearing the recorded locations; this version then heals it: add-document removes the duplicate, and a full
    ingest leaves one document per file, with 0 texts embedded."""
    import kbflow.engine.ingest as engine

    data = folder / "data"
    settle = engine.settle_identities
    monkeypatch.setattr(engine, "settle_identities", lambda scanned, *args: (scanned, []))
    api.ingest(["docs"], data_dir=data)
    api.add_document("docs/a.md", data_dir=data)
    state = NamespaceState(data, "default")
    pq.write_table(state.read_manifest().drop(["location"]), state.manifest_path)  # as an older version wrote it
    assert sorted(state.read_manifest().column("source_path").to_pylist()) == ["a.md", "docs/a.md", "docs/sub/b.md"]
    monkeypatch.setattr(engine, "settle_identities", settle)
    embedded = counting.texts_embedded

    healed = api.add_document("docs/a.md", data_dir=data)
    assert healed["documents"]["removed"] == 1
    assert sorted(state.read_manifest().column("source_path").to_pylist()) == ["docs/a.md", "docs/sub/b.md"]
    again = api.ingest(["docs"], data_dir=data)
    assert again["documents"]["unchanged"] == 2 and again["documents"]["removed"] == 0
    assert counting.texts_embedded == embedded
    assert all(state.read_manifest().column("location").to_pylist())  # recorded for the unchanged documents too
    texts = store_of(data).rows().column("text").to_pylist()
    assert sum("Alpine tea" in text for text in texts) == 1


def test_two_folders_with_the_same_file_names_stay_two_documents(tmp_path, counting, monkeypatch):
    """Settling identities never merges two different files: team1/README.md and team2/README.md stay apart
    even when the namespace already holds a README.md."""
    monkeypatch.chdir(tmp_path)
    for team in ("team1", "team2"):
        (tmp_path / team).mkdir()
        (tmp_path / team / "README.md").write_text(f"# {team}\n\nThe {team} handbook.\n")
    data = tmp_path / "data"
    api.add_document("team1/README.md", data_dir=data)
    api.ingest(["team1", "team2"], data_dir=data)
    paths = sorted(NamespaceState(data, "default").read_manifest().column("source_path").to_pylist())
    assert paths == ["README.md", "team2/README.md"]
    assert len(set(os.path.realpath(p) for p in
                   NamespaceState(data, "default").read_manifest().column("location").to_pylist())) == 2


def test_a_name_holding_a_credential_stored_by_an_earlier_version_is_withdrawn(folder, counting, monkeypatch):
    """An earlier version stored docs/<token>.md under its name; the next run removes it, whatever it was asked to
    do, and a text's id is scanned like a name."""
    import kbflow.engine.ingest as engine

    data = folder / "data"
    (folder / "docs" / f"{TOKEN}.md").write_text("# Harmless\n\nNothing secret inside.\n")
    monkeypatch.setattr(engine, "refuse_secret_names", lambda scanned, *args: scanned)
    api.ingest(["docs"], data_dir=data)
    state = NamespaceState(data, "default")
    pq.write_table(state.read_manifest().drop(["location"]), state.manifest_path)  # as an older version wrote it
    monkeypatch.undo()
    (folder / "docs" / f"{TOKEN}.md").unlink()
    (folder / "other.md").write_text("# Other\n\nAn unrelated note.\n")
    summary = api.add_document(folder / "other.md", data_dir=data)
    assert summary["documents"]["removed"] == 1
    assert TOKEN not in json.dumps(state.read_manifest().to_pylist())
    assert not any(TOKEN in text for text in store_of(data).rows().column("source_path").to_pylist())
    with pytest.raises(Exception) as refused:
        api.add_text("a note", TOKEN, data_dir=data)
    assert "GitHub Token" in str(refused.value) and TOKEN not in str(refused.value)


def test_a_data_dir_inside_an_ingested_folder_is_never_read_as_documents(folder, counting):
    """`kbflow ingest . --data-dir ./kb`: the run's own state, snapshots and tables are not documents, and the next
    run finds nothing changed (before, it stored the lock file and every snapshot's JSON as documents)."""
    data = folder / "docs" / "kb"
    first = api.ingest(["docs"], data_dir=data)
    assert first["documents"]["new"] == 2, first
    again = api.ingest(["docs"], data_dir=data)
    assert again["documents"]["new"] == again["documents"]["changed"] == 0, again
    stored = {row["source_path"] for row in NamespaceState(data, "default").read_manifest().to_pylist()}
    assert stored == {"docs/a.md", "docs/sub/b.md"}, stored
