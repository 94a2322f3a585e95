import pytest

from kbflow.chunk.split import split_markdown

DOC = """# Guide

Intro line one
line two.

```python
# a comment, not a heading
x = 1
```

Setext Title
============

| a | b |
|---|---|
| 1 | 2 |

- item one
- item two

## Deeper
text
"""


def test_blocks_kinds_headings_and_offsets():
    blocks = split_markdown(DOC)
    kinds = [(b.kind, b.heading_path) for b in blocks]
    assert kinds == [
        ("heading", ["Guide"]),
        ("paragraph", ["Guide"]),
        ("code", ["Guide"]),
        ("heading", ["Setext Title"]),
        ("table", ["Setext Title"]),
        ("list", ["Setext Title"]),
        ("heading", ["Setext Title", "Deeper"]),
        ("paragraph", ["Setext Title", "Deeper"]),
    ]
    code = blocks[2]
    assert DOC[code.char_start:code.char_end].startswith("```python\n# a comment")
    for block in blocks:
        assert DOC[block.char_start:block.char_end].strip()


def test_heading_inside_fence_is_not_a_heading():
    blocks = split_markdown("~~~\n# not a heading\n~~~\n\nafter\n")
    assert [b.kind for b in blocks] == ["code", "paragraph"]
    assert all(b.heading_path == [] for b in blocks)


def test_unclosed_fence_runs_to_end_and_terminates():
    text = "```\ncode\n# still code\n"
    blocks = split_markdown(text)
    assert [b.kind for b in blocks] == ["code"]
    assert text[blocks[0].char_start:blocks[0].char_end] == "```\ncode\n# still code"


def test_heading_levels_pop_correctly():
    blocks = split_markdown("# A\n## B\n### C\n## D\ntext\n")
    assert blocks[-1].heading_path == ["A", "D"]


def test_thematic_break_is_a_boundary_block_and_dashes_after_text_stay_setext():
    text = "# A\n\none\n\n* * *\n\ntwo\n---\n\n___\n\n- item\n"
    blocks = split_markdown(text)
    assert [b.kind for b in blocks] == ["heading", "paragraph", "break", "heading", "break", "list"]
    assert blocks[3].heading_path == ["A", "two"]
    assert text[blocks[2].char_start:blocks[2].char_end] == "* * *"


def test_break_interrupts_paragraph_and_list():
    blocks = split_markdown("para line\n***\n- a\n- b\n* * *\nafter\n")
    assert [b.kind for b in blocks] == ["paragraph", "break", "list", "break", "paragraph"]


def test_heading_whitespace_is_normalised_non_breaking_spaces_included():
    blocks = split_markdown("# 第\u00a06\u00a0章  维护和更新：APT 工具\n\ntext\n")
    assert blocks[-1].heading_path == ["第 6 章 维护和更新：APT 工具"]


@pytest.mark.parametrize("text, navigation", [
    ("| [Prev](a.html) | [Up](b.html) | [Next](c.html) |\n| --- | --- | --- |", True),
    ("* [**上一页**](a.html)\n* Debian 管理员手册\n* [**下一页**](b.html)", True),
    ("1. [Introduction](intro.html)\n2. [Installing the software](install.html)\n3. [Tuning](tune.html)", True),
    ("→ <https://www.debian.org/devel/people>", True),
    ("Use [DROP INDEX](sql-dropindex.html) to remove an index.", False),  # a sentence with a link in it
    ("* apt keeps the packages current and resolves dependencies\n* [apt(8)](apt.html) has the details", False),
    ("Plain text, no links at all, however short.", False),
    ("```\n[a](b) [c](d) [e](f)\n```", False),  # code is code
])
def test_navigation_is_links_with_little_text_of_their_own(text, navigation):
    blocks = [block for block in split_markdown(text + "\n") if block.kind != "heading"]
    assert (blocks[0].kind == "navigation") is navigation, blocks
