"""Bad input gets one clear failure row each and loses nothing: the other files are converted.

Small bad files live in tests/cases/bad/; big or odd ones (12 MB line, ZIP bomb, deep HTML, symlink loop) are made
here at run time rather than committed.
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile

import pytest
from typer.testing import CliRunner

from kbflow.cli.main import app
from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch
from kbflow.core.errors import ConfigError
from kbflow.engine.rows import conversion_failures
from kbflow.convert.scan import scan
from tests.conftest import CASES

# source path (inside the test folder) -> words the failure message must hold (what went wrong, and the fix)
EXPECTED_FAILURES = {
    "bad/broken.pdf": ["not a valid PDF", "re-export"],
    "bad/empty.docx": ["empty file (0 bytes)", "remove it"],
    "bad/encrypted.pdf": ["encrypted PDF", "convert.pdf_passwords_env", "or remove the file"],
    "bad/malformed.epub": ["corrupt or truncated EPUB", "re-export"],
    "bad/random-bytes.docx": ["not a valid DOCX file", "re-export"],
    "bad/random-bytes.pdf": ["not a valid PDF file (no %PDF header)"],
    "bad/random.xlsx": ["not a valid XLSX file"],
    "bad/truncated.docx": ["corrupt or truncated DOCX"],
    "bad/zip-slip.zip!/../../x": ["member path escapes the archive", "not read or written anywhere"],
    "bad/one-line.txt": ["longer than convert.max_line_chars", "Exclude it"],
    "bad/deep.html": ["nested more than 200 elements deep", "convert.html_max_depth"],
    "bad/bomb.zip": ["ZIP bomb", "convert.zip_max_total_mb"],
    "bad/loop-a.md": ["symlink loop", "fix the link or remove it"],
    "bad/loop-b.md": ["symlink loop", "fix the link or remove it"],
}
EXPECTED_OK = {"bad/名字 with spaces.md": "文件名里有空格和中文", "bad/zip-slip.zip!/docs/inside.md": "Inside the archive"}


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    """tests/cases/bad plus the generated cases."""
    folder = tmp_path_factory.mktemp("in") / "bad"
    shutil.copytree(CASES / "bad", folder)
    (folder / "one-line.txt").write_bytes(b"x" * (12 * 1024 * 1024))  # 12 MB, no line break
    depth = 5000
    (folder / "deep.html").write_text("<html><body>" + "<div>" * depth + "deep" + "</div>" * depth + "</body></html>")
    with zipfile.ZipFile(folder / "bomb.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        with archive.open("zeros.txt", "w", force_zip64=True) as member:  # 520 MB of zeros, ~2 MB compressed
            block = b"\0" * (1 << 20)
            for _ in range(520):
                member.write(block)
    os.symlink("loop-b.md", folder / "loop-a.md")
    os.symlink("loop-a.md", folder / "loop-b.md")
    return folder


@pytest.fixture(scope="module")
def bad_rows(bad_dir):
    sources = scan([bad_dir], "ns", ["*"], [".*"])
    return convert_batch(sources, ConvertConfig())


def test_each_bad_file_is_one_failure_row_with_a_message_naming_the_fix(bad_rows):
    failures = {failure.source_path: failure.to_dict() for failure in conversion_failures(bad_rows)}
    assert sorted(failures) == sorted(EXPECTED_FAILURES)
    for path, words in EXPECTED_FAILURES.items():
        row = failures[path]
        assert row["error_type"] == "ConversionError", row
        assert path.split("!/")[0] in row["message"]  # the message names the file
        for word in words:
            assert word in row["message"], (path, row["message"])


def test_the_good_files_among_them_are_converted(bad_rows):
    ok = {row["source_path"]: row["markdown"] for row in bad_rows.to_pylist() if row["status"] == "ok"}
    assert sorted(ok) == sorted(EXPECTED_OK)
    for path, needle in EXPECTED_OK.items():
        assert needle in ok[path]


def test_an_escaping_zip_member_is_never_written(bad_dir, tmp_path):
    out = tmp_path / "deep" / "er" / "out"
    result = CliRunner().invoke(app, ["convert", str(bad_dir / "zip-slip.zip"), "--out", str(out), "--json"])
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert [f["source_path"] for f in summary["failures"]] == ["zip-slip.zip!/../../x"]
    written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["deep/er/out/zip-slip.zip!/docs/inside.md.md"]
    assert not (tmp_path / "deep" / "x").exists() and not (tmp_path / "x").exists()


def test_the_pdf_password_comes_from_the_environment(monkeypatch):
    from kbflow.convert.converters import convert_file

    monkeypatch.setenv("KBFLOW_PDF_PASSWORDS", "wrong-one\nkbflow-secret")
    markdown = convert_file(str(CASES / "bad" / "encrypted.pdf"), "bad/encrypted.pdf").markdown
    assert "crazy ones" in markdown.lower()


def test_kbflow_convert_exits_1_and_lists_every_failure(bad_dir, tmp_path):
    result = CliRunner().invoke(app, ["convert", str(bad_dir), "--out", str(tmp_path / "md"), "--json"])
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["failed"] == len(EXPECTED_FAILURES) and summary["converted"] == len(EXPECTED_OK)
    assert (tmp_path / "md" / "bad" / "名字 with spaces.md.md").read_text(encoding="utf-8").startswith("# 名字")


def test_nul_characters_leave_every_documents_text_and_every_query(tmp_path, monkeypatch):
    """The e5 tokenizer reads a text only up to its first NUL: a chunk holding one was embedded up to it and
    counted as that short. NULs carry no text (a browser drops them; UTF-16 read as 8-bit text has one after every
    letter), so a page's, a literal text's and a cached conversion's Markdown lose them, and so does a query."""
    from kbflow import api
    from kbflow.convert.cache import ConversionCache
    from kbflow.convert.converters import text_documents
    from kbflow.sources.text import text_sources

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "page.html").write_bytes(b"<html><body><h1>Restore</h1><p>Stop the server\x00 before restoring the "
                                     b"backup, then start it.</p></body></html>")
    sources = scan([docs], "t", ["*"], [])
    cache = ConversionCache(tmp_path / "cache")
    [page] = convert_batch(sources, ConvertConfig(workers=1), cache).to_pylist()
    assert page["status"] == "ok" and "Stop the server before restoring the backup" in page["markdown"]
    assert "\x00" not in page["markdown"]
    [cached] = [path for path in (tmp_path / "cache").rglob("*") if path.is_file()]  # as an older kbflow kept it
    stored = cached.read_bytes()
    assert b"server before" in stored
    cached.write_bytes(stored.replace(b"server before", b"server\\u0000 before"))
    [again] = convert_batch(sources, ConvertConfig(workers=1), cache).to_pylist()
    assert again["markdown"] == page["markdown"]

    text = "h\x00e\x00l\x00l\x00o\x00 world"  # UTF-16 read as Latin-1
    [literal] = text_documents(text_sources([{"doc_id": "note", "text": text}], "t"), {"text:note": text}).to_pylist()
    assert literal["markdown"] == "hello world"

    with pytest.raises(ConfigError, match="empty text"):
        api.add_text("\x00\x00 \x00", "nothing", data_dir=tmp_path / "data")

    monkeypatch.setenv("KBFLOW__EMBEDDER__BACKEND", "e5")  # the tokenizer that stops at a NUL
    api.add_text("Keep seven daily backups. " * 3 + "Restore them monthly to a scratch server.", "note",
                 data_dir=tmp_path / "data")
    api.add_text("Tea brews best at 80 degrees for three minutes.", "tea", data_dir=tmp_path / "data")
    plain = api.search("keep seven daily backups and restore them", data_dir=tmp_path / "data", mode="vector")
    with_nul = api.search("keep\x00 seven daily backups and restore them", data_dir=tmp_path / "data", mode="vector")
    assert [(hit.chunk_id, round(hit.score, 5)) for hit in with_nul] == [(hit.chunk_id, round(hit.score, 5))
                                                                         for hit in plain]
