import html
import re
import zipfile

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch, convert_file, decode_text
from kbflow.core.errors import ConversionError
from kbflow.convert.scan import scan
from tests.conftest import CASES


def test_html_keeps_content_and_drops_navigation():
    markdown = convert_file(str(CASES / "docs" / "tutorial-concepts.html"), "x").markdown
    assert markdown.lstrip().startswith("## 2.2.\xa0Concepts")  # the page's own heading comes first
    assert "Prev" not in markdown and "Home" not in markdown
    assert "relational database management system" in " ".join(markdown.split())


def docx_paragraphs(path) -> list[tuple[str, str, bool]]:
    """(style, text, plain) of each paragraph, straight from the file's WordprocessingML, not through any converter;
    plain: no link and no run formatting (bold, italic, character styles), so its Markdown is its text as is."""
    xml = zipfile.ZipFile(path).read("word/document.xml").decode("utf-8")
    paragraphs = []
    for paragraph in re.findall(r"<w:p[ >].*?</w:p>", xml, re.S):
        text = html.unescape("".join(re.findall(r"<w:t(?: [^>]*)?>([^<]*)</w:t>", paragraph)))
        style = re.search(r'<w:pStyle w:val="([^"]+)"', paragraph)
        plain = "<w:hyperlink" not in paragraph and "<w:rPr" not in paragraph
        if text.strip():
            paragraphs.append((style.group(1) if style else "", text, plain))
    return paragraphs


def test_office_and_pdf_formats_yield_their_text():
    docx = CASES / "formats" / "debian-handbook-zh-sect.rights-management.docx"
    lines = convert_file(str(docx), "x").markdown.splitlines()
    paragraphs = docx_paragraphs(docx)
    headings = [(int(style[-1]), text) for style, text, _ in paragraphs if re.fullmatch(r"Heading\d", style)]
    assert headings[0] == (2, "9.3.\xa0管理权限") and len(headings) == 3  # what the file holds (checked by eye too)
    for level, text in headings:  # every Word heading is a Markdown heading of the same level, word for word
        assert "#" * level + " " + text in lines, (level, text)
    plain_body = [text for style, text, plain in paragraphs if style == "BodyText" and plain]
    assert len(plain_body) == 7 and plain_body[0].startswith("Linux 是一个典型的多用户系统")
    for text in plain_body:  # a plain body paragraph is one Markdown line, whole
        assert text in lines, text
    assert "MVCC" in convert_file(str(CASES / "formats" / "pg-mvcc-intro.docx"), "x").markdown
    assert "crazy ones" in convert_file(str(CASES / "formats" / "crazyones.pdf"), "x").markdown.lower()


@pytest.mark.parametrize("name,needle", [("broken.pdf", "not a valid PDF"), ("empty.docx", "empty file"),
                                         ("random.xlsx", "not a valid XLSX")])
def test_bad_files_fail_with_a_clear_message(name, needle):
    with pytest.raises(ConversionError, match=needle):
        convert_file(str(CASES / "bad" / name), f"bad/{name}")


def test_batch_records_failures_and_keeps_going():
    sources = scan([CASES / "bad" / name for name in ("broken.pdf", "empty.docx", "random.xlsx")] +
                   [CASES / "docs" / "search.md"], "ns", ["*"], [".*"])
    table = convert_batch(sources)
    status = dict(zip(table.column("source_path").to_pylist(), table.column("status").to_pylist()))
    assert status == {"broken.pdf": "failed", "empty.docx": "failed", "random.xlsx": "failed", "search.md": "ok"}


def test_text_decoding_records_the_encoding():
    assert decode_text("héllo".encode("utf-8"), "x") == ("héllo", "utf-8")
    assert decode_text(b"\xef\xbb\xbfhi", "x") == ("hi", "utf-8-sig")
    text, encoding = decode_text("数据库备份与恢复，每天晚上自动执行。".encode("gb18030"), "x")
    assert text == "数据库备份与恢复，每天晚上自动执行。" and encoding.lower() in {"gb18030", "gbk", "gb2312"}


def test_scan_ids_are_stable_and_relative(tmp_path):
    first = scan([CASES / "docs"], "ns", ["*"], [".*"])
    again = scan([str(CASES / "docs") + "/"], "ns", ["*"], [".*"])
    assert [s.doc_id for s in first] == [s.doc_id for s in again]
    assert all(s.source_path.startswith("docs/") for s in first)
    assert scan([CASES / "docs"], "other", ["*"], [".*"])[0].doc_id != first[0].doc_id


def test_process_pool_gives_the_same_rows_as_in_process():
    sources = scan([CASES / "docs", CASES / "bad" / "broken.pdf"], "ns", ["*"], [".*"])
    in_process = convert_batch(sources, ConvertConfig(workers=1))
    pooled = convert_batch(sources, ConvertConfig(workers=2))
    assert pooled.to_pylist() == in_process.to_pylist()


def test_html_page_furniture_goes_but_an_article_header_stays(tmp_path):
    page = tmp_path / "page.html"
    page.write_text("<html><body><header>Site banner</header><nav>Home | About</nav>"
                    "<script>fetch('http://example.invalid')</script>"
                    "<article><header><h1>Real title</h1></header><p>Body text.</p></article>"
                    "<footer>Copyright</footer></body></html>")
    markdown = convert_file(str(page), "page.html").markdown
    assert "# Real title" in markdown and "Body text." in markdown
    for furniture in ("Site banner", "Home | About", "fetch(", "Copyright"):
        assert furniture not in markdown
