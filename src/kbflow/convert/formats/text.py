"""Text-like files: plain text and Markdown as they are, source code and data as fenced blocks, CSV as a table.

Decoding stops at the first encoding that works and says which one it was (BOM, strict UTF-8, UTF-16 by its
zero bytes, then charset_normalizer over the encodings people actually send us).
"""

from __future__ import annotations

import codecs
import re
from pathlib import PurePosixPath

from kbflow.config import ConvertConfig
from kbflow.convert.formats.base import Format, Markdown
from kbflow.core.errors import ConversionError

TEXT_SUFFIXES = {".md", ".markdown", ".txt", ".rst", ".text", ".log", ".tex", ".org", ".adoc"}
DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".xml": "xml", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
                 ".ini": "ini", ".cfg": "ini"}
CODE_SUFFIXES = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".jsx": "jsx", ".ts": "typescript",
    ".tsx": "tsx", ".go": "go", ".rs": "rust", ".java": "java", ".kt": "kotlin", ".scala": "scala", ".c": "c",
    ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".cxx": "cpp", ".hpp": "cpp", ".cs": "csharp", ".rb": "ruby",
    ".php": "php", ".swift": "swift", ".sh": "bash", ".bash": "bash", ".zsh": "zsh", ".ps1": "powershell",
    ".sql": "sql", ".r": "r", ".lua": "lua", ".pl": "perl", ".hs": "haskell", ".ex": "elixir", ".erl": "erlang",
    ".css": "css", ".scss": "scss", ".vue": "vue", ".dart": "dart", ".m": "objectivec", ".jl": "julia",
    ".proto": "protobuf", ".dockerfile": "dockerfile", ".mk": "makefile", ".cmake": "cmake", ".gradle": "groovy",
}
CODE_NAMES = {"dockerfile": "dockerfile", "makefile": "makefile", "cmakelists.txt": "cmake"}
CSV_SUFFIXES = {".csv": ",", ".tsv": "\t"}
# candidates after UTF-8/UTF-16 fail: Chinese (GB18030 covers GBK/GB2312), Traditional Chinese, Western, a few more
DETECT_ENCODINGS = ["gb18030", "big5", "cp1252", "latin_1", "shift_jis", "euc_jp", "euc_kr", "cp1251"]
BOMS = [(codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")]


def decode_text(data: bytes, source: str) -> tuple[str, str]:
    """Decode text bytes; stop at the first decoding that works and say which one it was."""
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return data.decode(encoding), encoding
    utf16 = _utf16_without_bom(data)  # before UTF-8: zero bytes are valid UTF-8, but no text is made of them
    if utf16 is not None:
        return data.decode(utf16), utf16
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    if b"\x00" in data[:8192]:
        raise ConversionError(f"{source}: binary data, not text (it holds zero bytes); remove the file or exclude it "
                              "with convert.exclude")
    from charset_normalizer import from_bytes  # installed with markitdown

    best = from_bytes(data, cp_isolation=DETECT_ENCODINGS).best()
    if best is None:
        raise ConversionError(f"{source}: bytes are not text in any known encoding; remove the file or convert it "
                              "to UTF-8")
    return str(best), best.encoding


def _utf16_without_bom(data: bytes) -> str | None:
    """'utf-16-le'/'utf-16-be' when every other byte of mostly-ASCII text is zero, else None."""
    sample = data[:4096]
    if len(sample) < 4 or len(sample) % 2:
        return None
    even_zero = sample[0::2].count(0) / (len(sample) / 2)
    odd_zero = sample[1::2].count(0) / (len(sample) / 2)
    for encoding, ratio in (("utf-16-le", odd_zero), ("utf-16-be", even_zero)):
        if ratio > 0.3:
            try:
                data.decode(encoding)
                return encoding
            except UnicodeDecodeError:
                pass
    return None


def check_lines(text: str, source: str, max_line_chars: int) -> None:
    """Refuse text with a line longer than the limit: minified bundles and data dumps are not prose."""
    longest = max((len(line) for line in text.splitlines()), default=0) if len(text) > max_line_chars else 0
    if longest > max_line_chars:
        raise ConversionError(
            f"{source}: a line of {longest:,} characters, longer than convert.max_line_chars ({max_line_chars:,}): "
            "minified code or a data dump? Exclude it with convert.exclude, reformat it with line breaks, or raise "
            "the limit"
        )


def fenced(text: str, language: str) -> str:
    """``text`` as one fenced code block, the fence longer than any backtick run inside."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text.rstrip()}\n{fence}\n"


def code_language(name: str) -> str | None:
    lower = name.lower().rsplit("/", 1)[-1]
    if lower in CODE_NAMES:
        return CODE_NAMES[lower]
    suffix = "." + lower.rsplit(".", 1)[-1] if "." in lower else ""
    return CODE_SUFFIXES.get(suffix) or DATA_SUFFIXES.get(suffix)


def csv_table(text: str, delimiter: str) -> str:
    """A Markdown table: first row as the header, pipes escaped, short rows padded."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    if not rows:
        return ""
    width = max(len(row) for row in rows)

    def line(cells: list[str]) -> str:
        cells = [cell.replace("|", "\\|").replace("\n", " ") for cell in cells] + [""] * (width - len(cells))
        return "| " + " | ".join(cells) + " |"

    return "\n".join([line(rows[0]), "| " + " | ".join(["---"] * width) + " |"] + [line(r) for r in rows[1:]]) + "\n"


def escape_line(text: str) -> str:
    """A body line that would read as a Markdown heading (a shell root prompt '# cmd') is escaped (PDF text and
    OCR lines)."""
    return "\\" + text if text.lstrip().startswith("#") else text


def _convert(data: bytes, name: str, source: str, options: ConvertConfig) -> Markdown:
    """Text, CSV, code and data files; anything else that decodes as text is text."""
    text, encoding = decode_text(data, source)
    check_lines(text, source, options.max_line_chars)
    suffix = PurePosixPath(name).suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return Markdown(text, "text", encoding)
    if suffix in CSV_SUFFIXES:
        return Markdown(csv_table(text, CSV_SUFFIXES[suffix]), "csv", encoding)
    language = code_language(name)
    if language is not None:
        return Markdown(fenced(text, language), f"code-{language}", encoding)
    if "\x00" in text or sum(not (c.isprintable() or c.isspace()) for c in text[:4096]) > 40:
        raise ConversionError(f"{source}: unsupported format {suffix or '(no suffix)'} with binary content; "
                              "exclude it with convert.exclude")
    return Markdown(text, "text", encoding)


FORMATS = [Format("text", frozenset({*TEXT_SUFFIXES, *CSV_SUFFIXES, *CODE_SUFFIXES, *DATA_SUFFIXES}), _convert,
                  lambda options: f"text+line<={options.max_line_chars}",
                  content_types={"text/plain": ".txt", "text/markdown": ".md", "text/csv": ".csv",
                                 "application/json": ".json"}, fallback=True)]
