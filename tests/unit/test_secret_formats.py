"""The secret scan reads what a file says, whatever its format: every secret kind the scan knows, planted in every
format the converters read (HTML, DOCX, XLSX, PPTX, PDF, EPUB, CSV, code, a ZIP member) and in a file name, is
caught. Converters escape Markdown (``ghp\\_…`` from an HTML page, a DOCX or an XLSX); the scan must not be fooled
by it. The files are built from the real cases in tests/cases/formats (a secret written into them), or made here
with the formats' own libraries (openpyxl, python-pptx, PDFium)."""

from __future__ import annotations

import ctypes
import io
import random
import string
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kbflow.config import ConvertConfig
from kbflow.convert.archive import MEMBER_SEP
from kbflow.convert.converters import convert_batch
from kbflow.convert.scan import SourceFile
from kbflow.convert.secrets import find_secrets, redact, scan_text
from kbflow.sources.names import refuse_secret_names

CASES = Path(__file__).parents[1] / "cases" / "formats"
ALNUM = string.ascii_letters + string.digits


def _pick(rnd: random.Random, n: int, alphabet: str = ALNUM) -> str:
    while True:
        text = "".join(rnd.choice(alphabet) for _ in range(n))
        if "xampl" not in text.lower() and "your" not in text.lower():
            return text


def secrets_of(rnd: random.Random) -> dict[str, str]:
    """One realistic value per rule of the scan (random bodies in each rule's own shape)."""
    lower = string.ascii_lowercase + string.digits
    key_lines = "\n".join(_pick(rnd, 64, ALNUM + "+/") for _ in range(3))
    return {
        "AWS Access Key": "AKIA" + _pick(rnd, 16, string.ascii_uppercase + string.digits),
        "AWS Secret Access Key": "aws_secret_access_key = " + _pick(rnd, 40, ALNUM + "/+"),
        "Artifactory Credentials": "AKC" + _pick(rnd, 24),
        "Azure Storage Account access key": "AccountKey=" + _pick(rnd, 88, ALNUM + "+/"),
        "Discord Bot Token": "M" + _pick(rnd, 24) + "." + _pick(rnd, 6) + "." + _pick(rnd, 27),
        "GitHub Token": "ghp_" + _pick(rnd, 36),
        "GitLab Token": "glpat-" + _pick(rnd, 24),
        "Mailchimp Access Key": _pick(rnd, 32, lower) + "-us12",
        "NPM tokens": "//registry.npmjs.org/:_authToken=npm_" + _pick(rnd, 36),
        "OpenAI Token": "sk-" + _pick(rnd, 20) + "T3BlbkFJ" + _pick(rnd, 20),
        "Private Key": f"-----BEGIN RSA PRIVATE KEY-----\n{key_lines}\n-----END RSA PRIVATE KEY-----",
        "PyPI Token": "pypi-AgEIcHlwaS5vcmc" + _pick(rnd, 72),
        "SendGrid API Key": "SG." + _pick(rnd, 22) + "." + _pick(rnd, 43),
        "Slack Token": f"xoxb-{rnd.randint(10**9, 10**10)}-{rnd.randint(10**9, 10**10)}-{_pick(rnd, 24, lower)}",
        "Square OAuth Secret": "sq0csp-" + _pick(rnd, 43),
        "Stripe Access Key": "sk_live_" + _pick(rnd, 24),
        "Telegram Bot Token": f"{rnd.randint(10**8, 10**9 - 1)}:" + _pick(rnd, 35),
        "Twilio API Key": "AC" + _pick(rnd, 32, lower),
    }


# -- one file of each format holding ``lines`` ----------------------------------------------------------------------

def _html(lines: list[str]) -> bytes:
    body = "".join(f"<p>{line}</p>" if "\n" not in line else f"<pre>{line}</pre>" for line in lines)
    return f"<html><head><title>Deploy</title></head><body><h1>Deployment notes</h1>{body}</body></html>".encode()


def _rewrite_zip(source: Path, member: str, change) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as copy:
        for info in original.infolist():
            data = original.read(info.filename)
            copy.writestr(info, change(data) if info.filename == member else data)
    return out.getvalue()


def _docx(lines: list[str]) -> bytes:
    from xml.sax.saxutils import escape

    runs = "".join(f'<w:p><w:r><w:t xml:space="preserve">{escape(part)}</w:t></w:r></w:p>'
                   for line in lines for part in line.split("\n"))
    return _rewrite_zip(CASES / "pg-mvcc-intro.docx", "word/document.xml",
                        lambda xml: xml.replace(b"<w:body>", b"<w:body>" + runs.encode(), 1))


def _xlsx(lines: list[str]) -> bytes:
    import openpyxl

    book = openpyxl.load_workbook(CASES / "deaths.xlsx")
    sheet = book.worksheets[0]
    for row, line in enumerate(lines, sheet.max_row + 1):
        sheet.cell(row=row, column=1, value="credential")
        sheet.cell(row=row, column=2, value=line)
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def _pptx(lines: list[str]) -> bytes:
    from pptx import Presentation
    from pptx.util import Inches

    deck = Presentation(str(CASES / "pg-tutorial-concepts.pptx"))
    slide = deck.slides.add_slide(deck.slide_layouts[6 if len(deck.slide_layouts) > 6 else -1])
    box = slide.shapes.add_textbox(Inches(0.5), Inches(0.5), Inches(9), Inches(5)).text_frame
    box.text = "\n".join(lines)
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def _pdf(lines: list[str]) -> bytes:
    import pypdfium2 as pdfium
    import pypdfium2.raw as raw

    pdf = pdfium.PdfDocument.new()
    page = pdf.new_page(1400, 800)
    font = raw.FPDFText_LoadStandardFont(pdf.raw, b"Helvetica")
    for number, line in enumerate(part for line in ["Deployment notes", *lines] for part in line.split("\n")):
        text = raw.FPDFPageObj_CreateTextObj(pdf.raw, font, 9.0)
        wide = (line + "\x00").encode("utf-16-le")
        buffer = ctypes.create_string_buffer(wide, len(wide))
        raw.FPDFText_SetText(text, ctypes.cast(buffer, ctypes.POINTER(raw.FPDF_WCHAR)))
        raw.FPDFPageObj_Transform(text, 1, 0, 0, 1, 20, 770 - 12 * number)
        raw.FPDFPage_InsertObject(page.raw, text)
    raw.FPDFPage_GenerateContent(page.raw)
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def _epub(lines: list[str]) -> bytes:
    from xml.sax.saxutils import escape

    with zipfile.ZipFile(CASES / "calibre-quick-start-eng.epub") as book:
        chapter = next(name for name in book.namelist() if name.endswith((".html", ".xhtml"))
                       and b"<body" in book.read(name))
    paragraphs = "".join(f"<p>{escape(line)}</p>" if "\n" not in line else f"<pre>{escape(line)}</pre>"
                         for line in lines).encode()
    return _rewrite_zip(CASES / "calibre-quick-start-eng.epub", chapter,
                        lambda html: html.replace(b"</body>", paragraphs + b"</body>", 1))


def _csv(lines: list[str]) -> bytes:
    import csv

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["setting", "value"])
    writer.writerows(["credential", line] for line in lines)
    return out.getvalue().encode()


def _code(lines: list[str]) -> bytes:
    return ("# deployment settings\n" + "".join(f'SETTING_{n} = """{line}"""\n' for n, line in enumerate(lines)))\
        .encode()


def _zip_member(lines: list[str]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("notes/deploy.md", "# Deploy\n\n" + "\n\n".join(lines) + "\n")
    return out.getvalue()


FORMATS = {"page.html": _html, "notes.docx": _docx, "sheet.xlsx": _xlsx, "slides.pptx": _pptx, "scan.pdf": _pdf,
           "book.epub": _epub, "table.csv": _csv, "settings.py": _code, "bundle.zip": _zip_member}


def _sources(folder: Path) -> list[SourceFile]:
    from kbflow.convert.scan import scan

    return scan([folder], "t", ["*"], [])


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), filler=st.sampled_from(["", "Rotate this before Friday.", "备注：请勿外传。"]))
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_secret_kind_is_caught_in_every_format(name, seed, filler, tmp_path_factory):
    """One file per (format, secret kind), each holding only that secret among ordinary text: every file fails
    with SecretFound naming the kind, and no converted text reaches the row."""
    kinds = secrets_of(random.Random(seed))
    folder = tmp_path_factory.mktemp("planted")
    for number, (kind, value) in enumerate(kinds.items()):
        sub = folder / f"k{number:02d}"
        sub.mkdir()
        lines = [line for line in ("Deploy with the key below.", filler, value) if line]
        (sub / name).write_bytes(FORMATS[name](lines))
    rows = convert_batch(_sources(folder), ConvertConfig(workers=1)).to_pylist()
    kinds_by_folder = {f"k{number:02d}": kind for number, kind in enumerate(kinds)}
    assert len(rows) == len(kinds)
    for row in rows:
        kind = kinds_by_folder[row["source_path"].split("/")[1]]
        assert row["status"] == "failed" and row["markdown"] is None, (kind, name, row["error"])
        assert row["error"].startswith("SecretFound") and kind in row["error"], (kind, name, row["error"])


def test_the_scan_reads_text_with_markdown_escapes_undone():
    assert scan_text("token ghp\\_abc \\*x\\* a\\\\b") == "token ghp_abc *x* a\\b"
    token = "ghp_" + "aB3" * 12
    escaped = token.replace("_", "\\_")
    assert find_secrets(escaped) == [] and [f.rule for f in find_secrets(scan_text(escaped))] == ["GitHub Token"]


@pytest.mark.parametrize("kind", ["AWS Access Key", "GitHub Token", "GitLab Token", "OpenAI Token", "PyPI Token",
                                  "SendGrid API Key", "Slack Token", "Stripe Access Key", "Twilio API Key",
                                  "Mailchimp Access Key", "Square OAuth Secret"])
def test_a_secret_in_a_file_or_member_name_is_refused_and_shown_redacted(kind, tmp_path):
    """A name holding a credential never reaches the plan, the manifest or a failure message unredacted."""
    value = secrets_of(random.Random(7))[kind]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / f"{value}.md").write_text("# Harmless\n\nNothing secret in the text.\n")
    with zipfile.ZipFile(docs / "bundle.zip", "w") as archive:
        archive.writestr(f"keys/{value}.txt", "plain text")
    refused = refuse_secret_names(_sources(docs), "t", ConvertConfig())
    assert sorted(source.source_path for source in refused) == sorted(
        ["docs/[redacted].md", f"docs/bundle.zip{MEMBER_SEP}keys/[redacted].txt"]), [s.source_path for s in refused]
    assert all(source.unreadable and kind in source.unreadable and value not in source.unreadable
               for source in refused)
    rows = convert_batch(refused, ConvertConfig(workers=1)).to_pylist()
    assert all(row["status"] == "failed" and value not in row["error"] for row in rows)
    assert redact(f"a/{value}/b")[0] == "a/[redacted]/b"
