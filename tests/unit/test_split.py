import pytest

from kbflow.chunk.split import NAV_ITEM_SHARE, NAV_OWN_TEXT, Block, is_navigation, split_markdown

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


def test_a_link_in_a_heading_is_its_text_in_the_heading_path():
    blocks = split_markdown('# [`glob`](#module-glob "glob: Unix shell style pathname pattern expansion.") — Unix '
                            'style pathname pattern expansion\n\n## See [![i](i.png)](x.html)\xa0 [there](<a b.html>)\n'
                            'text\n')
    assert blocks[0].heading_path == ["`glob` — Unix style pathname pattern expansion"]
    assert blocks[-1].heading_path[-1] == "See i there"


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


OWN_WORDS = "| described with plenty of words here | more words of its own here |"  # 50 own word characters


@pytest.mark.parametrize("kind, text, navigation", [
    # own text exactly at the limit and exactly as long as the linked text (24 word characters each): navigation
    ("paragraph", "[abcdefghijklmnopqrstuvwx](u) abcdefghijklmnopqrstuvwx", True),
    ("paragraph", "[abcdefghijklmnopqrstuvw](u) abcdefghijklmnopqrstuvwx", False),  # one linked character less
    ("paragraph", "[abcdefghijklmnopqrstuvwxyz](u) abcdefghijklmnopqrstuvwxy", False),  # own text one over the limit
    # a paragraph never goes to the per-item rule, even when most of its |-separated parts are bare links
    ("paragraph", "[Alpha](a) | [Beta](b) | [Gamma](c) | described with plenty of words here", False),
    # lists and tables: navigation when at least 60 % of the items are links with at most 3 own characters;
    # 3 of 5 is exactly 60 %, and the |---| separator row is not an item
    ("table", f"| [Alpha](a) | [Beta](b) |\n|---|---|\n| [Gamma](c) abc |\n{OWN_WORDS}", True),
    ("table", f"| [Alpha](a) | [Beta](b) |\n|---|---|\n| [Gamma](c) abcd |\n{OWN_WORDS}", False),  # 4 own
    ("table", f"| [Alpha](a) | [Beta](b) |\n|---|---|\n| ok |\n{OWN_WORDS}", False),  # 'ok' has no link
    ("list", "* [Alpha](a)\n* [Beta](b)\n* described with plenty of words here", True),  # 2 of 3
    ("list", "* [Alpha](a) and some words\n* [Beta](b)\n* described with plenty of words here", False),  # 1 of 3
    ("list", "* [Alpha](a)\n* described with plenty of words here", False),  # fewer than 3 items
    ("heading", "[Alpha](a)", False),  # only paragraphs, lists and tables can be navigation
])
def test_navigation_rule_at_its_boundaries(kind, text, navigation):
    assert (NAV_OWN_TEXT, NAV_ITEM_SHARE) == (24, 0.6)  # the cases below are counted against these
    assert is_navigation(kind, text) is navigation


def test_setext_headings_and_a_loose_list_by_hand():
    text = "Part one\ncontinued\n=====\n\nBody text.\n\nSub\n---\nMore.\n"
    #       0        9         19    24 26        36 38   42  46
    assert split_markdown(text) == [
        Block("heading", 0, 24, ["Part one continued"]),  # two lines of title, '=' makes level 1
        Block("paragraph", 26, 36, ["Part one continued"]),
        Block("heading", 38, 45, ["Part one continued", "Sub"]),  # '-' makes level 2, a child of level 1
        Block("paragraph", 46, 51, ["Part one continued", "Sub"]),  # right below the underline, no blank line
    ]
    loose = "- item one\n\n  still item one\n\n- item two\nafter\n"  # blank lines inside, a lazy last line
    assert split_markdown(loose) == [Block("list", 0, 46, [])]


def test_a_fence_inside_a_list_item_after_a_blank_line_is_code_and_later_fences_keep_their_pairs():
    """The Python manual's pattern: a list item's example fenced and indented into the item after a blank line.
    Taken into the list, its closing fence opened a block, and every later pair was read back to front: the
    comment lines of the next code example became headings (chunks of a lone '#')."""
    markdown = ("5. String representations are unusual for negative values. For example:\n\n"
                "   ```\n   >>> timedelta(hours=-5)\n   datetime.timedelta(days=-1, seconds=68400)\n   ```\n\n"
                "Some prose.\n\n"
                "```\n# US DST Rules\n#\n# This is a simplified set of rules\nDSTSTART = 1\n```\n\nMore prose.\n")
    blocks = split_markdown(markdown)
    kinds = [block.kind for block in blocks]
    assert "heading" not in kinds, [(b.kind, markdown[b.char_start:b.char_end]) for b in blocks]
    code = [markdown[b.char_start:b.char_end] for b in blocks if b.kind == "code"]
    assert len(code) == 2 and code[1].startswith("```\n# US DST Rules") and code[1].rstrip().endswith("```")
    assert code[0].strip().startswith("```") and ">>> timedelta" in code[0]
