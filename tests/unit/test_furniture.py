"""Document furniture dropped from PDFs at conversion: tables of contents with dot leaders, running headers and
footers, page numbers, back-of-book indexes; on a real PDF (tests/cases/pdf: pages of the Debian Reference) and
rule by rule on lines."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_file
from kbflow.convert.furniture import drop_contents, drop_furniture, drop_index, drop_running_lines
from tests.conftest import CASES

EXCERPT = CASES / "pdf" / "debian-reference-excerpt.pdf"


@pytest.fixture(scope="module")
def markdown() -> str:
    return convert_file(str(EXCERPT), "pdf/debian-reference-excerpt.pdf", ConvertConfig()).markdown


def test_the_table_of_contents_goes_and_the_headings_it_listed_stay_in_the_body(markdown):
    assert not re.search(r"(\. ){4,}", markdown)  # no dot leaders
    assert "Contents" not in markdown and "1.3.1 Customization of MC" not in markdown  # listed, not in these pages
    assert "### 1.1.4 The root shell prompt" in markdown  # the body's heading (its number's depth), which the contents listed


def test_running_headers_and_page_numbers_go(markdown):
    assert "Debian Reference" not in markdown and "/ 233" not in markdown
    assert not [line for line in markdown.splitlines() if re.fullmatch(r"[ivxlcdm\d]+", line.strip())]


def test_the_back_of_book_index_goes_and_the_text_it_pointed_to_stays(markdown):
    assert "Index" not in markdown and "account, root, 2, 3" not in markdown and "\nX\n" not in markdown
    assert "Type root at the character based login prompt." in markdown
    assert "Table 1.1: List of interesting text-mode program packages" in markdown
    assert markdown.rstrip().endswith("# apt-get install package_name")  # the last body page, to its end


@dataclass
class L:
    text: str


def page(*texts: str) -> list[L]:
    return [L(text) for text in texts]


def texts(pages) -> list[list[str]]:
    return [[line.text for line in lines] for lines in pages]


def test_a_dot_leader_line_in_body_text_stays_and_a_contents_page_goes_whole():
    body = page("Install the server first.", "Step 1 . . . . . . . . . 5", "Then start it on port 5432")
    contents = page("Contents", "1 Tutorials 1", "1.1 Console basics . . . . . . 1", "1.2 Files ......... 7",
                    "1.3 Shells · · · · · · 9")
    assert texts(drop_contents([body, contents])) == [[line.text for line in body], []]


def test_a_page_number_goes_only_at_a_pages_edge_and_a_number_in_the_text_stays():
    pages = [page("12", "The answer is", "42", "and more text", "- 13 -"), page("Page 3", "body", "xiv")]
    assert texts(drop_running_lines(pages)) == [["The answer is", "42", "and more text"], ["body"]]


def test_lines_repeated_at_the_top_of_most_pages_go_and_a_closing_brace_stays():
    topics = ["links", "pipes", "sockets", "devices", "signals"]
    pages = [page(f"Manual {n} / 9", f"About {topic}", "}") for n, topic in enumerate(topics, 1)]
    assert texts(drop_running_lines(pages)) == [[f"About {topic}", "}"] for topic in topics]


def test_index_entries_go_only_from_an_index_title_on():
    references = page("References", "Smith, 2004", "Jones, 1999", "Aoki, 2021")  # entry-shaped, no index title
    index = page("Index", "A", "apt-get, 1, 12-14", "aptitude, 3", "B", "backup, 40")
    more = page("shell, 2", "su, 3", "sudo, 3, 9")
    after = page("Colophon", "Set in DejaVu, 10 pt")
    assert texts(drop_index([references, index, more, after])) == [
        [line.text for line in references], [], [], [line.text for line in after]]


def test_all_rules_together_on_a_small_book():
    chapters = ["Start", "Middle", "Details", "End"]
    contents = page("Book i", "Contents", *(f"{n} {title} . . . . . . {n}" for n, title in enumerate(chapters, 1)))
    body = [page(f"Book {n}", title, f"Real text about {title.lower()}.", str(n)) for n, title in enumerate(chapters, 1)]
    index = page("Book 5", "Index", "details, 3", "end, 4", "start, 1")
    assert texts(drop_furniture([contents, *body, index])) == [
        [], *([title, f"Real text about {title.lower()}."] for title in chapters), []]
