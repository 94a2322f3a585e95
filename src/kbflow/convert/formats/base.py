"""What an input format declares, in one place: a module under ``kbflow.convert.formats`` (or a plugin's module,
found by its ``kbflow.formats`` entry point) defines ``FORMATS``, a list of ``Format``. The registry
(``kbflow.convert.formats.registry``) collects them, and everything that depends on the formats is derived from
it: which path converts a file, the conversion cache's key for one file, the converter fingerprint every stored
document records, and the content types a fetched body is read by."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kbflow.config import ConvertConfig


class Markdown(NamedTuple):
    """A format's output: the Markdown, the path it took (recorded after the converter fingerprint, e.g.
    ``pdf-pdfium+ocr``) and the text encoding it decoded, for text formats."""
    text: str
    path: str
    encoding: str | None = None


@dataclass(frozen=True)
class Format:
    """One input format.

    ``convert(data, name, source, options)`` turns a file's bytes into Markdown or raises ``ConversionError``
    naming ``source`` and the fix; ``fingerprint(options)`` names everything its output depends on (its version,
    the packages and options it uses): a change re-converts its files, and only its files."""
    name: str
    suffixes: frozenset[str]  # lower-case, with the dot: ".pdf"
    convert: Callable[[bytes, str, str, ConvertConfig], Markdown]
    fingerprint: Callable[[ConvertConfig], str]
    # a fetched body of one of these content types is converted as the file suffix it maps to
    content_types: Mapping[str, str] = field(default_factory=dict)
    # the options under which this format takes its suffixes (two formats may share a suffix under other options)
    applies: Callable[[ConvertConfig], bool] | None = None
    # the format of a file no other format claims (exactly one: text, which refuses binary content)
    fallback: bool = False

    def takes(self, suffix: str, options: ConvertConfig) -> bool:
        return suffix in self.suffixes and (self.applies is None or self.applies(options))
