"""Structure recovered from PDFs printed by a real browser (tests/cases/pdf/tables.pdf, made by make_tables.py
from tables.html with headless Chromium) and from a real manual (the Debian Reference excerpt): tables, ruled
and unruled, as Markdown tables; headings from the outline or from section numbers; code and menus left alone.
"""

from __future__ import annotations

import json

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_file
from tests.conftest import CASES

PDFS = CASES / "pdf"


def converted(name: str) -> str:
    return convert_file(str(PDFS / name), f"pdf/{name}", ConvertConfig()).markdown


@pytest.fixture(scope="module")
def outlined() -> str:
    return converted("tables.pdf")


def table_lines(markdown: str) -> list[str]:
    return [line for line in markdown.splitlines() if line.startswith("| ")]


def test_a_ruled_table_over_three_pages_is_one_table_with_its_caption_and_one_header(outlined):
    rows = table_lines(outlined)
    assert rows.count("| Service | Port | Protocol | Notes |") == 1  # the header Chromium repeats on each page
    services = [row for row in rows if row.startswith("| svc-")]
    assert len(services) == 70 and services[0] == "| svc-01 | 7001 | tcp | Serves requests |"
    assert ("| svc-30 | 7030 | udp | Replicates the write-ahead log to the standby servers of the cluster, one stream "
            "per standby |") in services  # a cell wrapped over two lines is one cell
    table = outlined[outlined.index("Table 2.1. Service ports"):]
    assert table.startswith("Table 2.1. Service ports\n\n| Service | Port |")  # the caption right above it
    block = table[table.index("| Service"):].split("\n\n")[0].splitlines()
    assert len(block) == 72  # header, rule and 70 rows in one block: no page break splits it


def test_an_unruled_table_keeps_its_columns_and_a_wrapped_cell_beside_a_centred_one(outlined):
    rows = table_lines(outlined[outlined.index("2.2 Unruled options"):])
    assert rows[0] == "| Option | Meaning |" and rows[2] == "| --all | Check every port of every service. |"
    verbose = next(row for row in rows if "Print each port" in row)
    # the option sits centred beside five lines of description, which PDFium gives before and after it
    assert verbose.startswith("| -- verbose | Print each port as it is checked,")
    assert verbose.endswith("stands out in the output of a long run. |")
    assert "| --quiet | Print nothing but failures. |" in rows


def test_code_whose_comments_line_up_is_not_a_table(outlined):
    assert "check --all # every service\ncheck --quiet # failures only" in outlined
    assert not [row for row in table_lines(outlined) if "check --" in row]


def test_headings_come_from_the_outline_and_a_menu_under_a_heading_stays_text(outlined):
    headings = [line for line in outlined.splitlines() if line.startswith("#")]
    assert headings == ["# Port Guide", "## 1 Overview", "## 2 Services", "### 2.1 Ruled ports table",
                        "### 2.2 Unruled options", "## 3 Where next"]
    assert "\nNext topic\n" in outlined  # over two links to other pages: a site's menu, not a section


def test_without_an_outline_section_numbers_give_the_levels():
    headings = [line for line in converted("tables-plain.pdf").splitlines() if line.startswith("#")]
    assert headings == ["# Port Guide", "# 1 Overview", "# 2 Services", "## 2.1 Ruled ports table",
                        "## 2.2 Unruled options", "# 3 Where next"]


def test_a_latex_table_ruled_without_outer_borders_gets_its_header_and_its_caption_moved_above_it():
    markdown = converted("debian-reference-excerpt.pdf")
    rows = table_lines(markdown)
    assert rows[0] == "| package | popcon | size | description |" and len(rows) == 9
    assert "| vim | V:97, I:390 | 3570 | Unix text editor Vi IMproved, a programmers text editor (standard version) |" \
        in rows  # the name centred beside a description on two lines
    assert "Table 1.1: List of interesting text-mode program packages\n\n| package |" in markdown
    assert len([line for line in markdown.splitlines() if line.startswith("| ---")]) == 1  # no prose became a table


def test_structure_scores_count_headings_cells_and_words_outside_code():
    from kbflow.bench.structure import score, structure_of, summarise

    truth = structure_of("# Ports\n\n| Service | Port |\n| --- | --- |\n| `svc-1` | 7001 |\n\n```\n# not a heading\n```\n")
    assert dict(truth["headings"]) == {"ports": 1} and dict(truth["cells"]) == {"service": 1, "port": 1, "svc1": 1,
                                                                              "7001": 1}
    got = structure_of("# Ports\n\nService Port\n\n| svc 1 | 7001 |\n| --- | --- |\n| extra | cell |\n")
    result = summarise(score(truth, got))
    assert result["heading_recall"] == 1.0 and result["cell_recall"] == 0.5 and result["cell_precision"] == 0.5


def test_bench_convert_structure_scores_a_printed_page_against_its_html(tmp_path):
    """`kbflow bench convert --structure` over a folder holding tables.html beside tables.pdf."""
    from typer.testing import CliRunner

    from kbflow.cli.main import app

    pages = tmp_path / "pages" / "guide"
    pages.mkdir(parents=True)
    for name in ("tables.html", "tables.pdf"):
        (pages / name).write_bytes((PDFS / name).read_bytes())
    out = tmp_path / "structure.json"
    result = CliRunner().invoke(app, ["bench", "convert", "--structure", str(tmp_path / "pages"), "--engines",
                                      "pdfium", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    written = json.loads(out.read_text())
    pdfium = written["engines"]["pdfium"]
    assert pdfium["cells_true"] == 4 * 71 + 2 * 5 and pdfium["cell_recall"] >= 0.95
    # the HTML keeps "Next topic" over its two links as a heading; the PDF conversion takes it for a menu
    assert pdfium["heading_recall"] == round(6 / 7, 4) and pdfium["heading_precision"] == 1.0
    assert written["sets"]["guide"]["pdfium"]["cells_matched"] == pdfium["cells_matched"]
    assert written["machine"]["cpu_count"] and out.with_suffix(".png").is_file()
