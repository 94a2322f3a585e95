"""HTML to Markdown that keeps the document's structure and drops the page's furniture.

- h1-h6 stay headings; every ``section``/``article`` boundary that is not already followed by a heading becomes a
  thematic break line ``* * *`` (blank lines around it), which the split stage treats as a hard chunk boundary.
- Navigation, page-level headers/footers, scripts, styles and embedded objects are removed before conversion; nothing
  is executed or fetched.
- Form controls are removed (inputs, buttons, selects: a theme's menu toggle became a "[ ]" chunk on every page of
  the Python manual), except a task list's checkbox.
- Permalinks are removed: the "¶" or "#" a documentation generator (Sphinx, MkDocs, Docusaurus...) puts after every
  heading and definition, linking to itself. Kept, they were link markup in every heading path the model reads
  before a chunk ("Methods[¶](#methods "Permalink to this heading")") and a self-link per definition in the graph.
- Nesting deeper than ``convert.html_max_depth`` is refused while parsing, before the converter (recursive) sees
  the tree.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format, Markdown
from kbflow.core.errors import ConversionError
from kbflow.core.extras import package_version

HTML_SUFFIXES = {".html", ".htm", ".xhtml"}
# page furniture that is not content: navigation bars, headers and footers, scripts (never run or fetched)
HTML_DROP_TAGS = ("script", "style", "noscript", "nav", "iframe", "object", "embed", "template", "svg", "canvas",
                  "button", "select")
HTML_PAGE_FURNITURE = ("header", "footer")  # dropped at page level; inside an article they may hold its title
HTML_DROP_CLASSES = re.compile(r"\b(navheader|navfooter|navigation|docnav|breadcrumbs?|sidebar|skip-?link)\b", re.I)
HTML_DROP_IDS = re.compile(r"^(banner|navbar|nav|sidebar|breadcrumbs?|site-(header|footer|nav))$", re.I)
HTML_DROP_ROLES = ("navigation", "banner", "contentinfo")  # ARIA landmarks of the site, not the document
HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
HTML_VERSION = "2"  # bump when the Markdown made of the same page changes (2: permalinks, form controls removed)
PERMALINK_TEXTS = {"¶", "#", "§", "🔗", "\u200b", ""}  # what such a link shows (Docusaurus: a zero-width space)
SECTIONING = ("section", "article")
SECTION_BREAK = "* * *"
_MARKER = "KBFLOWSECTIONBREAKMARKER"
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
_SELF_CLOSING_SIBLINGS = {"p", "li", "dt", "dd", "tr", "td", "th", "option"}


class _TooDeep(Exception):
    pass


def _open_tag(stack: list[str], tag: str, limit: int) -> None:
    """Nesting as a browser would build it: void elements hold nothing, and a <p>, <li>... closes an open sibling
    of its own name; deeper than ``limit`` is refused."""
    if tag in _VOID:
        return
    if tag in _SELF_CLOSING_SIBLINGS and stack and stack[-1] == tag:
        stack.pop()
    stack.append(tag)
    if len(stack) > limit:
        raise _TooDeep


def _close_tag(stack: list[str], tag: str) -> None:
    """An end tag closes up to its match; one with no open match is ignored."""
    if tag in stack:
        while stack and stack.pop() != tag:
            pass


@lru_cache(maxsize=None)
def _depth_limited_builder(limit: int):
    """A Beautiful Soup tree builder (html.parser) whose parser counts nesting on the tag events the tokenizer gives
    it (``_open_tag``, ``_close_tag``): the depth is checked in the one parse the page needs, not in a parse of its
    own before it. The end tags Beautiful Soup sends itself after an empty element's start are not the page's and
    are not counted. Made once per limit, not per page."""
    from bs4.builder._htmlparser import BeautifulSoupHTMLParser, HTMLParserTreeBuilder

    class DepthLimitedParser(BeautifulSoupHTMLParser):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.stack: list[str] = []
            self.inside_start = False

        def handle_starttag(self, tag, attrs, handle_empty_element=True):
            _open_tag(self.stack, tag, limit)
            self.inside_start = True
            try:
                super().handle_starttag(tag, attrs, handle_empty_element)
            finally:
                self.inside_start = False

        def handle_endtag(self, tag, check_already_closed=True):
            if not self.inside_start:
                _close_tag(self.stack, tag)
            super().handle_endtag(tag, check_already_closed)

    class DepthLimitedBuilder(HTMLParserTreeBuilder):
        def feed(self, markup):
            super().feed(markup, _parser_class=DepthLimitedParser)

    return DepthLimitedBuilder


@lru_cache(maxsize=None)
def _tag_class():
    """Beautiful Soup's Tag, two of its answers made cheap, the same answers (a test holds the pages' Markdown
    equal to a parse with Beautiful Soup's Tag):

    * ``find_parent(name)`` for a bare tag name is a walk up the parents. markdownify asks every tag it converts
      (and markitdown every link) whether it sits inside a ``<pre>``; Beautiful Soup answers each time by building
      a filter and matching it against every ancestor, about a quarter of a page's conversion. Any other query
      goes to Beautiful Soup's own.
    * ``decomposed`` of a live tag reads a class attribute. Beautiful Soup reads ``_decomposed``, which only a
      decomposed tag has, so on any other its ``__getattr__`` searched the tag's whole subtree for a
      ``<_decomposed>`` element, which no parser makes (a tag name starts with a letter)."""
    from bs4.element import Tag

    class ParentWalkingTag(Tag):
        _decomposed = False  # decompose() sets True on the element itself

        def find_parent(self, name=None, attrs={}, string=None, **kwargs):  # noqa: B006 - Beautiful Soup's signature
            if not isinstance(name, str) or attrs or string is not None or kwargs:
                return super().find_parent(name, attrs, string, **kwargs)
            parent = self.parent
            while parent is not None:
                if parent.name == name:
                    return parent
                parent = parent.parent
            return None

    return ParentWalkingTag


def _parse(text: str, source: str, max_depth: int):
    """The page's tree; nesting deeper than ``max_depth`` is refused as the parser reaches it."""
    from bs4 import BeautifulSoup  # installed with markitdown
    from bs4.element import Tag

    try:
        return BeautifulSoup(text, builder=_depth_limited_builder(max_depth)(), element_classes={Tag: _tag_class()})
    except _TooDeep:
        raise ConversionError(
            f"{source}: HTML nested more than {max_depth} elements deep (convert.html_max_depth); such markup is "
            "generated or malicious. Fix the page's markup, or exclude it with convert.exclude"
        ) from None


def _first_content(element):
    """The first child element with content, skipping whitespace-only text."""
    for child in element.children:
        if getattr(child, "name", None) is None:
            if str(child).strip():
                return child
            continue
        return child
    return None


def _starts_with_heading(element) -> bool:
    node = element
    while node is not None and getattr(node, "name", None) is not None:
        if node.name in HEADINGS:
            return True
        if node.name in ("header", "hgroup", "div", "section", "article") or node.name in ("a",):
            node = _first_content(node)
            continue
        return False
    return False


def _mark_section_boundaries(soup, sections: list) -> None:
    """Break markers around each of ``sections`` (the page's sectioning elements, in document order) that does
    not open with a heading, or is not followed by one."""
    for element in sections:
        if not _starts_with_heading(element):
            element.insert_before(_marker(soup))
        following = element.next_sibling
        while following is not None and getattr(following, "name", None) is None and not str(following).strip():
            following = following.next_sibling
        if following is not None and not (getattr(following, "name", None) in SECTIONING or
                                          _starts_with_heading(following)):
            element.insert_after(_marker(soup))


def _marker(soup):
    tag = soup.new_tag("p")
    tag.string = _MARKER
    return tag


def _inside(element, names) -> bool:
    """Whether an ancestor of ``element`` is one of the tags ``names`` (``find_parent`` without its matcher)."""
    parent = element.parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.parent
    return False


def _furniture_classes(element) -> bool:
    """``find_all(class_=HTML_DROP_CLASSES)``'s test: a class that matches, or the class list joined by spaces."""
    classes = element.get("class")
    if classes is None:
        return False
    if isinstance(classes, str):
        return HTML_DROP_CLASSES.search(classes) is not None
    return any(HTML_DROP_CLASSES.search(c) for c in classes) or \
        (len(classes) != 1 and HTML_DROP_CLASSES.search(" ".join(classes)) is not None)


def _permalink(link) -> bool:
    """A link to a place on the same page (``href="#…"``) that shows only a pilcrow, a hash, a section sign, a link
    symbol or nothing, and holds no image: a documentation generator's permalink (Sphinx's and MkDocs' ``¶``,
    Docusaurus' zero-width space, an icon font's empty link). A link with words stays, whatever its class."""
    href = link.get("href")
    if not isinstance(href, str) or not href.startswith("#") or link.find("img") is not None:
        return False
    return link.get_text(strip=True) in PERMALINK_TEXTS


def clean_soup(text: str, source: str = "page", max_depth: int = 200):
    """The parsed page (refused past ``max_depth`` levels of nesting), its content only, with section boundaries
    marked.

    One walk over the tree finds every candidate; the rules then apply in order (markup that is never content,
    page furniture, navigation classes, logo links and permalinks, navigation ids, ARIA landmarks, form inputs),
    each skipping what an earlier one removed: the same result as one ``find_all`` per rule, in a third of the
    time."""
    from bs4 import Tag  # installed with markitdown

    soup = _parse(text, source, max_depth)
    drop, furniture, classed, links, ids, roles, inputs, sections = [], [], [], [], [], [], [], []
    for element in soup.descendants:
        if not isinstance(element, Tag):
            continue
        name = element.name
        if name in SECTIONING:
            sections.append(element)
        if name in HTML_DROP_TAGS:
            drop.append(element)
        elif name in HTML_PAGE_FURNITURE:
            furniture.append(element)
        elif name == "a":
            links.append(element)
        elif name == "input":
            inputs.append(element)
        if element.attrs:
            if _furniture_classes(element):
                classed.append(element)
            element_id = element.get("id")
            # a str: only class-like attributes come back as lists
            if isinstance(element_id, str) and HTML_DROP_IDS.search(element_id) is not None:
                ids.append(element)
            if element.get("role") in HTML_DROP_ROLES:
                roles.append(element)
    content = SECTIONING + ("main",)
    for element in drop:
        if not element.decomposed:
            element.decompose()
    for element in furniture:
        if not element.decomposed and not _inside(element, content):
            element.decompose()
    for element in classed:
        if not element.decomposed:
            element.decompose()
    for element in links:
        if element.decomposed:
            continue
        if element.find("img") is not None and not element.get_text(strip=True) and not _inside(element, content):
            element.decompose()  # a logo: an image link with no text, outside the document's content
        elif _permalink(element):
            element.decompose()
    for element in ids + roles:
        if not element.decomposed:
            element.decompose()
    for element in inputs:  # form controls ("[ ]" for a theme's menu toggle, a search box) are not content; a task
        # list's checkbox is ("[x] done")
        if not element.decomposed and not (element.get("type") == "checkbox" and _inside(element, ("li",))):
            element.decompose()
    _mark_section_boundaries(soup, [element for element in sections if not element.decomposed])
    return soup


@lru_cache(maxsize=None)
def _markitdown_markdownify():
    """markitdown's markdownify converter class (``markitdown.converters._markdownify``, which imports only the
    standard library and markdownify). Where markitdown is not imported yet, its file is run as a module of its own
    instead of through the ``markitdown`` package, whose ``__init__`` imports every converter it has (pandas,
    magika's ONNX model, ...): 2.1 s in each conversion worker, for a class an HTML page needs alone."""
    import importlib.util
    import sys

    imported = sys.modules.get("markitdown.converters._markdownify")
    if imported is not None:
        return imported._CustomMarkdownify
    package = importlib.util.find_spec("markitdown")  # finds the package's folder without running its __init__
    if package is None or package.origin is None:
        raise ConversionError("markitdown is not installed; reinstall kbflow (`pip install kbflow`)")
    spec = importlib.util.spec_from_file_location(
        "kbflow.convert.formats._markitdown_markdownify", Path(package.origin).parent / "converters" / "_markdownify.py")
    if spec is None or spec.loader is None:
        raise ConversionError(f"markitdown's HTML converter is missing from {Path(package.origin).parent}; reinstall "
                              "markitdown (`pip install --force-reinstall markitdown`)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._CustomMarkdownify


def markitdown_markdown(soup, source: str) -> str:
    """What markitdown's HTML converter makes of ``soup``, without serialising it and parsing it again: the
    same steps (markdownify with markitdown's options on the body, then its line normalisation), half the time
    of a page's conversion. A test holds it equal to ``markitdown.convert_stream`` on the serialised soup."""
    body = soup.find("body")
    try:
        text = _markitdown_markdownify()().convert_soup(body if body else soup).strip()
    except RecursionError:  # markitdown would fall back to plain text; the depth check exists to prevent this
        raise ConversionError(f"{source}: HTML too deeply nested to convert; lower convert.html_max_depth so such "
                              "pages are refused before parsing, or exclude the page with convert.exclude") from None
    text = "\n".join(line.rstrip() for line in re.split(r"\r?\n", text))
    return re.sub(r"\n{3,}", "\n\n", text)


def finish_markdown(markdown: str) -> str:
    """Markers become ``* * *`` lines; repeated breaks and breaks at the very start or end go."""
    lines = markdown.splitlines()
    out: list[str] = []
    for line in lines:
        if line.strip() == _MARKER:
            while out and not out[-1].strip():
                out.pop()
            if out and out[-1] != SECTION_BREAK:
                out += ["", SECTION_BREAK, ""]
            continue
        out.append(line)
    while out and out[-1].strip() in ("", SECTION_BREAK):
        out.pop()
    return "\n".join(out) + "\n"


def convert_html(data: bytes, source: str, max_depth: int) -> tuple[str, str]:
    """(markdown, encoding) of an HTML page."""
    from kbflow.convert.formats.text import decode_text

    text, encoding = _decode_html(data, source, decode_text)
    return finish_markdown(markitdown_markdown(clean_soup(text, source, max_depth), source)), encoding


def _decode_html(data: bytes, source: str, decode_text) -> tuple[str, str]:
    """A declared charset (meta tag) wins when it decodes the bytes; otherwise detection."""
    head = data[:4096].decode("ascii", "ignore")
    declared = re.search(r"""<meta[^>]+charset\s*=\s*["']?([A-Za-z0-9_.:-]+)""", head, re.I)
    if declared and not data.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        name = declared.group(1).lower()
        name = "gb18030" if name in ("gb2312", "gbk") else name
        try:
            return data.decode(name), name
        except (LookupError, UnicodeDecodeError):
            pass
    return decode_text(data, source)


def _convert(data: bytes, name: str, source: str, options: ConvertConfig) -> Markdown:
    markdown, encoding = convert_html(data, source, options.html_max_depth)
    return Markdown(markdown, "html", encoding)


def _fingerprint(options: ConvertConfig) -> str:
    return f"html-v{HTML_VERSION}+markitdown@{package_version('markitdown')}+depth<={options.html_max_depth}"


FORMATS = [Format("html", frozenset(HTML_SUFFIXES), _convert, _fingerprint,
                  content_types={"text/html": ".html", "application/xhtml+xml": ".html"})]
