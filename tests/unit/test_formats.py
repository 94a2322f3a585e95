"""Every format on real files from tests/cases: real OCR, real speech recognition, real PDF text extraction."""

from __future__ import annotations

import io

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch, convert_bytes, convert_file
from kbflow.convert.formats.html import SECTION_BREAK
from kbflow.convert.scan import scan
from kbflow.bench.textmetrics import cer, wer
from tests.conftest import CASES

FORMATS = CASES / "formats"


def converted(name: str, **options):
    return convert_file(str(FORMATS / name), f"formats/{name}", ConvertConfig(**options))


def test_every_file_of_the_real_set_converts_with_its_content():
    sources = scan([FORMATS], "ns", ["*"], [".*"])
    rows = {row["source_path"].split("/", 1)[1]: row for row in convert_batch(sources).to_pylist()}
    assert sorted(rows) == sorted(p.name for p in FORMATS.iterdir())
    failed = {name: row["error"] for name, row in rows.items() if row["status"] != "ok"}
    assert failed == {}
    md = {name: row["markdown"] for name, row in rows.items()}
    assert "权限" in md["debian-handbook-zh-sect.rights-management.docx"]  # the Chinese DOCX keeps its Chinese
    assert "MVCC" in md["pg-mvcc-intro.docx"]
    assert "crazy ones" in md["crazyones.pdf"].lower()
    assert "你好世界" in md["multilang.pdf"] and "Привет, мир" in md["multilang.pdf"]
    for sheet in ("## arts", "## other"):  # the XLSX's sheet names become headings
        assert sheet in md["deaths.xlsx"]
    assert "David Bowie" in md["deaths.xlsx"]
    assert "Calibre Quick Start Guide" in md["calibre-quick-start-eng.epub"]
    assert "relational database management system" in " ".join(md["pg-tutorial-concepts.pptx"].split()).lower()
    assert md["iris.csv"].startswith("| 150 | 4 | setosa |") and md["iris.csv"].count("\n") == 152
    assert md["reuters-crude-00016.xml"].startswith("```xml\n") and "PHILADELPHIA PORT CLOSED" in md["reuters-crude-00016.xml"]
    assert "管理权限" in md["debian-handbook-zh-rights.html"]
    assert rows["conf-onlyperson.txt"]["encoding"] == "utf-8" and rows["iris.csv"]["encoding"] == "utf-8"
    assert rows["pg-mvcc-intro.docx"]["encoding"] is None
    paths = {name: row["converter"].rsplit(":", 1)[1] for name, row in rows.items()}
    assert paths["crazyones.pdf"] == "pdf-pdfium"  # a page with a text layer is not OCR'd
    assert paths["conf-onlyperson.wav"] == "audio-whisper"  # auto without a DashScope key


@pytest.mark.parametrize("backend, bound", [("whisper", 0.1), ("pocketsphinx", 0.6)])
def test_speech_is_transcribed_offline_with_a_bounded_word_error_rate(backend, bound):
    reference = (FORMATS / "conf-onlyperson.txt").read_text().split(":", 1)[1]
    result = converted("conf-onlyperson.wav", audio_backend=backend)
    error_rate = wer(reference, result.markdown)
    print(f"conf-onlyperson.wav {backend} WER {error_rate:.2f}: {result.markdown.strip()!r}")
    assert result.converter.endswith(f":audio-{backend}")
    assert error_rate <= bound
    assert "currently the only person" in result.markdown


def _linn_top(fraction: float) -> bytes:
    """The top of the real linn.png scan (OCR of the whole page takes over a minute on two shared cores)."""
    from PIL import Image

    with Image.open(CASES / "ocr" / "linn.png") as image:
        image = image.convert("RGB")
        width, height = image.size
        crop = image.crop((0, 0, width, int(height * fraction)))
    buffer = io.BytesIO()
    crop.save(buffer, "PNG")
    return buffer.getvalue()


def test_ocr_of_a_real_scan_has_a_bounded_character_error_rate():
    markdown = convert_bytes(_linn_top(0.25), "linn-top.png", "ocr/linn-top.png").markdown
    truth_lines = (CASES / "ocr" / "linn.txt").read_text().splitlines()
    truth = "\n".join(truth_lines[: truth_lines.index("per disk!") + 1])
    rate = cer(truth, markdown)
    print(f"linn.png (top quarter) CER {rate:.3f}")
    assert rate < 0.10
    assert "The LinnSequencer" in markdown and "polyphonic" in markdown


def test_a_pdf_page_without_text_is_ocrd(tmp_path):
    from PIL import Image

    scan_pdf = tmp_path / "scanned.pdf"
    with Image.open(io.BytesIO(_linn_top(0.08))) as image:  # an image-only PDF page, as a scanner makes it
        image.save(scan_pdf, "PDF", resolution=300)
    result = convert_file(str(scan_pdf), "scanned.pdf")
    assert result.converter.endswith(":pdf-pdfium+ocr")
    assert "LinnSequencer" in result.markdown.replace(" ", "")


def test_pdf_fast_path_keeps_headings_and_paragraphs():
    markdown = converted("crazyones.pdf").markdown
    assert markdown.startswith("# The Crazy Ones\n\n## October 14, 1998\n\n")
    markitdown = converted("crazyones.pdf", pdf_engine="markitdown")
    assert markitdown.converter.endswith(":markitdown.pdf")
    assert len("".join(markdown.split())) >= 0.95 * len("".join(markitdown.markdown.split()))


@pytest.mark.parametrize("encoding,text", [
    ("utf-8", "Plain UTF-8 — naïve café 中文"),
    ("utf-8-sig", "UTF-8 with a byte order mark: 数据库"),
    ("utf-16", "UTF-16 with a BOM: 数据库备份与恢复"),
    ("utf-16-le", "UTF-16 without a BOM, mostly ASCII text here"),
    ("gb18030", "数据库备份与恢复，每天晚上自动执行。请检查日志文件，确认备份成功。"),
    ("big5", "資料庫備份與還原，每天晚上自動執行。請檢查記錄檔，確認備份成功。"),
    ("latin-1", "Café crème brûlée à la française, déjà vu, Größe über Maß."),
])
def test_text_encodings_are_detected_and_recorded(encoding, text):
    result = convert_bytes(text.encode(encoding), "note.txt", "note.txt")
    assert result.markdown == text
    expected = {"latin-1": {"cp1252", "latin_1", "iso8859_1"}, "gb18030": {"gb18030"}, "big5": {"big5"}}
    assert result.encoding.replace("-", "_") in {e.replace("-", "_") for e in expected.get(encoding, {encoding})}


def test_source_code_is_a_fenced_block_with_its_language():
    code = 'def hello():\n    return "```"\n'
    result = convert_bytes(code.encode(), "hello.py", "src/hello.py")
    assert result.markdown == '````python\ndef hello():\n    return "```"\n````\n'
    assert convert_bytes(b'{"a": 1}', "data.json", "data.json").markdown.startswith("```json\n")


def test_html_keeps_headings_and_marks_section_boundaries():
    page = ("<html><body><nav>Home</nav><article><h1>Title</h1><p>Intro.</p>"
            "<section><p>Untitled part one.</p></section><section><h2>Named part</h2><p>Two.</p></section>"
            "<section><p>Untitled part three.</p></section><p>Closing words.</p></article></body></html>")
    markdown = convert_bytes(page.encode(), "page.html", "page.html").markdown
    assert "Home" not in markdown
    lines = markdown.splitlines()
    assert lines.count(SECTION_BREAK) == 3  # before part one, before part three, and after it (closing words)
    for i, line in enumerate(lines):
        if line == SECTION_BREAK:
            assert lines[i - 1] == "" and lines[i + 1] == ""
            assert not lines[i + 2].startswith("#")  # a section that opens with a heading needs no break
    assert "## Named part" in markdown and markdown.startswith("# Title")


def test_ocr_reads_simplified_chinese():
    """The Chinese line of a real PDF, rendered to pixels (no CJK font is needed on the machine) and OCR'd."""
    import pypdfium2 as pdfium

    from kbflow.convert.formats.ocr import ocr_text
    from kbflow.convert.formats.pdf import render_page

    document = pdfium.PdfDocument(str(FORMATS / "multilang.pdf"))
    page, dpi = document[0], 150
    textpage = page.get_textpage()
    start = textpage.get_text_range().index("你好世界")
    boxes = [textpage.get_charbox(start + i) for i in range(4)]
    scale, height = dpi / 72, page.get_height()
    left, right = min(b[0] for b in boxes) * scale, max(b[2] for b in boxes) * scale
    top, bottom = (height - max(b[3] for b in boxes)) * scale, (height - min(b[1] for b in boxes)) * scale
    pixels = render_page(page, dpi)[int(top) - 20:int(bottom) + 20, max(int(left) - 40, 0):int(right) + 40]
    assert "你好世界" in ocr_text(pixels, 2000)


def test_pdf_lines_become_headings_by_size_and_a_root_prompt_stays_text():
    from kbflow.convert.formats.pdf import Line, lines_to_markdown
    from kbflow.convert.furniture import drop_running_lines

    def page(number: int, topic: str) -> list[Line]:
        return [Line(f"Manual {number} / 9", 800, 810, 10.0), Line(f"1.{number} {topic}", 760, 772, 14.0),
                Line(f"Body text about {topic} that wraps", 740, 750, 10.0), Line(f"onto a {topic} line.", 728, 738, 10.0),
                Line(f"# chown {topic.lower()} foo", 690, 700, 10.0)]

    pages = drop_running_lines([page(n, topic) for n, topic in enumerate(["Links", "Pipes", "Sockets", "Devices"], 1)])
    markdown = lines_to_markdown(pages)[0]
    assert markdown == "## 1.1 Links\n\nBody text about Links that wraps\nonto a Links line.\n\n\\# chown links foo"


def test_html_site_banner_and_logo_links_go():
    markdown = converted("debian-handbook-zh-rights.html").markdown
    assert markdown.startswith("## 9.3") and "管理权限" in markdown.splitlines()[0]
    assert "Download the ebook" not in markdown and "image_left.png" not in markdown


def test_html_permalinks_go_and_real_links_stay():
    """A documentation generator's permalinks (Sphinx's pilcrow after every heading and definition, here a real
    page of the Python 3.11 manual; MkDocs', Docusaurus' hash links) are not content; links with text stay."""
    markdown = convert_file(str(FORMATS.parent / "sphinx" / "fnmatch.html"), "sphinx/fnmatch.html",
                            ConvertConfig()).markdown
    assert "¶" not in markdown and "Permalink to this" not in markdown
    assert "[ ]" not in markdown  # the theme's menu toggle, a checkbox: it was a chunk of its own on every page
    assert "\nfnmatch.fnmatch(*filename*, *pattern*)\n:   Test whether" in markdown  # the definition, bare
    assert "[`fnmatchcase()`](#fnmatch.fnmatchcase \"fnmatch.fnmatchcase\")" in markdown  # a link with text stays
    assert "[Lib/fnmatch.py](https://github.com/python/cpython/tree/3.11/Lib/fnmatch.py)" in markdown
    from kbflow.convert.formats.html import convert_html

    page = ("<main><h2>Install<a class='headerlink' href='#install' title='Permalink'>¶</a></h2>"
            "<h3 id='x'>Use<a href='#x' class='hash-link' aria-label='Direct link'>\u200b</a></h3>"
            "<h4 id='y'>Tune <a href='#y'>#</a></h4><h5><a class='headerlink' href='#c'>Configuration</a></h5>"
            "<p>See <a href='#install'>installing</a>, "
            "<a href='#y'><img src='i.png' alt='icon'></a> and <a href='other.html#a'>¶</a>.</p></main>")
    assert convert_html(page.encode(), "p.html", 200)[0] == (
        "## Install\n\n### Use\n\n#### Tune\n\n##### [Configuration](#c)\n\nSee [installing](#install), "
        "[![icon](i.png)](#y) and "
        "[¶](other.html#a).\n")



def test_html_form_controls_go_and_a_task_lists_checkboxes_stay():
    from kbflow.convert.formats.html import convert_html

    page = ("<ul><li><input type='checkbox' checked disabled> done</li><li><input type='checkbox' disabled> todo</li>"
            "</ul><p>Search <input type='text' name='q'> <input type='checkbox'> <button>Go</button> "
            "<select><option>3.11</option></select> end</p>")
    lines = convert_html(page.encode(), "p.html", 200)[0].splitlines()
    assert lines[:2] == ["* [x]  done", "* [ ]  todo"] and lines[3].split() == ["Search", "end"]


_HTML_EDGES = [
    "<p>No html or body element, a fragment</p><p>second   paragraph\n\n\n\nwith gaps</p>",
    "<html><head><title>T</title><style>p{}</style></head><body><h2>Head <a href='x.html'>link</a></h2>"
    "<pre><code>SELECT 1;\n\n\n\n  -- trailing   \nEND;</code></pre><p>text &amp; entities &lt;ok&gt; &#x4e2d;</p>"
    "<!-- a comment --><table><tr><th>a</th><th>b</th></tr><tr><td>1</td><td><p>cell</p><p>two</p></td></tr></table>"
    "<ul><li>one<li>two<ul><li>nested</li></ul></ul><dl><dt><code>term</code></dt><dd>definition</dd></dl>"
    "<a href='javascript:alert(1)'>js</a> <img src='data:image/png;base64,AAAA' alt='pic'><br/>after break"
    "<section><p>untitled section</p></section><section><h3>titled</h3>body</section>tail text</body></html>",
    "<body>  <p>  leading spaces  </p>\t<div><div><span>deep</span> <b>bold</b><i> italic </i></div></div></body>",
]


@pytest.mark.parametrize("page", ["tutorial-concepts.html", "debian-handbook-zh-rights.html", *_HTML_EDGES])
def test_html_markdown_is_markitdowns_of_the_cleaned_page(page):
    """The converter walks its cleaned soup with markitdown's own markdownify options instead of serialising
    the soup and having markitdown parse it again: the Markdown must be the same, byte for byte."""
    from markitdown import MarkItDown, StreamInfo

    from kbflow.convert.formats.html import clean_soup, markitdown_markdown

    if page.endswith(".html"):
        page = next(CASES.rglob(page)).read_text(encoding="utf-8")
    via_markitdown = MarkItDown().convert_stream(io.BytesIO(str(clean_soup(page)).encode("utf-8")),
                                                 stream_info=StreamInfo(extension=".html", charset="utf-8"))
    assert markitdown_markdown(clean_soup(page), "page.html") == via_markitdown.text_content


def _reference_depth_probe(limit: int):
    """The depth rule as a parse of its own (how pages were checked before the check moved into the one parse):
    the reference the in-parse check must agree with."""
    from html.parser import HTMLParser

    from kbflow.convert.formats import html

    class Probe(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=False)
            self.stack: list[str] = []

        def handle_starttag(self, tag, attrs):
            html._open_tag(self.stack, tag, limit)

        def handle_endtag(self, tag):
            html._close_tag(self.stack, tag)

    return Probe()


def _refused(check, text: str) -> bool:
    from kbflow.convert.formats.html import _TooDeep
    from kbflow.core.errors import ConversionError

    try:
        check(text)
    except (_TooDeep, ConversionError):
        return True
    return False


def test_the_depth_check_inside_the_parse_refuses_exactly_what_a_parse_of_its_own_refused():
    """Random markup of the cases that make nesting differ (void and self-closed elements, <p>/<li> siblings left
    open, end tags with no match or closing several, script text that looks like tags, comments) and real pages,
    at several limits: the in-parse check refuses a page exactly when the separate probe does, and the tree it
    builds is Beautiful Soup's html.parser tree."""
    import random

    from bs4 import BeautifulSoup

    from kbflow.convert.formats.html import _parse

    rng = random.Random(5)
    pieces = ["<div>", "</div>", "<p>", "</p>", "<li>", "<ul>", "</ul>", "<br>", "<br/>", "<img src=x>", "<span/>",
              "<b>", "</b>", "</i>", "<td>", "<tr>", "<table>", "</table>", "text ", "<script>if (a<b) {'<div>'}"
              "</script>", "<!-- <div> -->", "<section>", "</section>", "<x-y>", "</x-y>", "<spacer>", "&amp;"]
    pages = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 60))) for _ in range(400)]
    pages += [path.read_text(encoding="utf-8") for path in sorted(CASES.rglob("*.html"))]
    for limit in (2, 4, 7, 12, 30):
        for page in pages:
            expected = _refused(lambda text: _reference_depth_probe(limit).feed(text), page)
            assert _refused(lambda text: _parse(text, "page.html", limit), page) == expected, (limit, page[:200])
    for page in pages[:100]:
        assert str(_parse(page, "page.html", 400)) == str(BeautifulSoup(page, "html.parser"))


def test_the_cheaper_tag_answers_make_the_same_markdown_as_beautiful_soups_own(monkeypatch):
    """The tag class the HTML converter parses into answers ``find_parent(name)`` by walking up and ``decomposed``
    from a class attribute, and the cleaning pass collects the sectioning elements in its one walk. Random markup
    of what those answers decide (<pre> and <code> around links and blocks, sections and articles with and without
    headings, dropped navigation, furniture, classes, ids, roles, form controls, permalinks) and the real pages
    convert to the same Markdown as with Beautiful Soup's own Tag, and the sections are what ``find_all`` finds."""
    import random

    from bs4.element import Tag

    from kbflow.convert.formats import html

    rng = random.Random(11)
    pieces = ["<pre>", "</pre>", "<code>", "</code>", "<a href='#x'>¶</a>", "<a href='/p'>link</a>", "<a href=x><img "
              "src=i></a>", "<section>", "</section>", "<article>", "</article>", "<h2>Title</h2>", "<p>", "</p>",
              "<div class='sidebar'>", "<div id='nav'>", "<div role='navigation'>", "</div>", "<nav>", "</nav>",
              "<header>", "</header>", "<footer>", "</footer>", "<main>", "</main>", "<input type=checkbox>",
              "<li>", "<ul>", "</ul>", "<table><tr><td>", "</td></tr></table>", "text\n  more ", "<b>", "</b>",
              "<script>x</script>", "<br>", "<kbd>", "</kbd>", "<blockquote>", "</blockquote>"]
    pages = ["<html><body>" + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 80))) for _ in range(300)]
    pages += [path.read_text(encoding="utf-8") for path in sorted(CASES.rglob("*.htm*"))]
    ours = [html.finish_markdown(html.markitdown_markdown(html.clean_soup(page, "page.html"), "page.html"))
            for page in pages]

    marked = html._mark_section_boundaries

    def sections_as_find_all_finds(soup, sections):
        found = soup.find_all(html.SECTIONING)
        assert len(sections) == len(found) and all(a is b for a, b in zip(sections, found))
        marked(soup, sections)

    monkeypatch.setattr(html, "_tag_class", lambda: Tag)
    monkeypatch.setattr(html, "_mark_section_boundaries", sections_as_find_all_finds)
    for page, markdown in zip(pages, ours):
        soup = html.clean_soup(page, "page.html")
        assert type(soup.find("body") or soup.find(True)) is Tag  # the reference is Beautiful Soup's own
        assert html.finish_markdown(html.markitdown_markdown(soup, "page.html")) == markdown, page[:300]
    assert len(pages) > 300 and sum("```" in markdown for markdown in ours) > 30  # the cases were met


def test_an_html_page_converts_without_importing_the_markitdown_package():
    """markitdown's package imports every converter it has (pandas, magika's ONNX model: ~2 s); an HTML page needs
    its markdownify class alone, so a conversion worker that meets only pages never pays for the rest. The
    Markdown is markitdown's own (test_html_markdown_is_markitdowns_of_the_cleaned_page)."""
    import subprocess
    import sys

    code = ("import sys; from kbflow.convert.converters import convert_bytes; "
            "md = convert_bytes(b'<h1>Title</h1><p>Some <b>bold</b> text</p>', 'a.html', 'a.html').markdown; "
            "print(repr(md), 'markitdown' in sys.modules, 'magika' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["'#", "Title\\n\\nSome", "**bold**", "text\\n'", "False", "False"], out
