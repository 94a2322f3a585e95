"""Check that every figure the docs cite from a benchmark JSON is in that JSON.

The convention (docs/benchmarks.md, "How a figure cites its JSON"): a figure is written with a link to the JSON it
comes from right after it, e.g. ``warm `add_text` 0.27 s ([overhead.json](bench/overhead.json))``, or in a table
row whose last cell is nothing but such links (a "source" column). For every link to a ``.json`` file in README.md
and docs/*.md, this script takes the numbers written just before the link (back to the previous link, the start of
the paragraph, list item or table cell, a ``;``, a parenthesis or the end of a sentence; a sentence wrapped over
several lines is read as one), or every number of a source-column row but its first cell (the row's name), and looks
each one up among the numbers of the JSON file at the precision it is written with: ``0.27`` matches 0.272 but not
0.1 or 0.28. A link's fragment narrows the lookup to the numbers under those keys, at any depth
(``bench/overhead.json#add_text_warm_median_s``, ``#p50_ms,rows``), so a figure cannot pass on an unrelated number of
the file. A percentage also matches a share (``91.5 %`` ↔ 0.915); a time, size or count may be written in
another unit (``1.4 s`` ↔ 1396 ms, ``14.7 GB`` ↔ bytes, ``12.8k``, ``1M``); a signed difference may be in points
(``+2.2`` ↔ 0.022). Units themselves are not checked. Numbers in `inline code`, dotted versions (``15.18.1``) and names
(``p50``, ``nDCG@10``, ``e5``, ``384-d``, ``1.5B``) are not figures.

    .venv/bin/python scripts/check_figures.py            # exit 1, listing each figure not found
    .venv/bin/python scripts/check_figures.py --list     # every figure checked, and where it was found

Only the standard library; tests/unit/test_docs.py runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK_RE = re.compile(r"!?\[([^\]]*)\]\(([^)\s]+)\)")
FENCE_RE = re.compile(r"^(```|~~~)")
CODE_RE = re.compile(r"`[^`]*`")
# a number: not glued to a name (p50, e5, nDCG@10, v4, 15.18.0), with thousands separators, decimals and a k/M suffix
NUMBER_RE = re.compile(
    r"(?<![\w.@/#^])(?<![A-Za-z_]-)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?!\.\d)(?![\w]*\d)([kM](?![A-Za-z]))?"
    r"(\s?(?:%|ms\b|s\b|KB\b|MB\b|GB\b|TB\b|×|x\b))?")
BOUNDARY_RE = re.compile(r"[|;()]|\.\s|\.$|\]\([^)]*\)")
_BYTES = tuple(sorted({base ** power for base in (1000, 1024) for power in range(-4, 5)}))
# a JSON number times one of these may be what is written: a share as a percentage, seconds as ms, bytes as GB
SCALES = {"%": (1, 100), "ms": (1, 1000, 0.001), "s": (1, 1000, 0.001),
          "KB": _BYTES, "MB": _BYTES, "GB": _BYTES, "TB": _BYTES}


@dataclass
class Figure:
    doc: Path
    line: int
    text: str  # as written
    value: float
    tolerance: float
    unit: str
    json_paths: list[tuple[Path, str]]  # (file, its link's fragment: the keys the figure is under, or "")


def docs_to_check(repo: Path = REPO) -> list[Path]:
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def json_numbers(path: Path, keys: str = "") -> list[float]:
    """Every number in the JSON file; with ``keys`` (a link's fragment, ``#add_text_warm_median_s`` or
    ``#p50_ms,recall@10``) only the numbers under a key of that name, at any depth."""
    wanted = {key for key in keys.split(",") if key}
    found: list[float] = []

    def walk(node, inside: bool):
        if isinstance(node, bool):
            return
        if isinstance(node, (int, float)):
            if inside and math.isfinite(node):
                found.append(float(node))
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, inside or key in wanted)
        elif isinstance(node, list):
            for value in node:
                walk(value, inside)

    walk(json.loads(path.read_text(encoding="utf-8")), not wanted)
    if wanted and not found:
        raise KeyError(f"{path.name} has no number under {keys!r}")
    return found


def figures_before(span: str) -> list[tuple[str, float, float, str]]:
    """(as written, value, tolerance, unit) of each number in the span."""
    span = CODE_RE.sub(" ", span)
    out = []
    for match in NUMBER_RE.finditer(span):
        after = span[match.end():match.end() + 2]
        if not (match.group(3) or match.group(4)) and (after[:1].isalpha() or re.match(r"-[A-Za-z]", after)):
            continue  # a name such as 1.5B, 3D or 384-d, not a figure
        whole, decimals, suffix, unit = match.group(1), match.group(2) or "", match.group(3) or "", match.group(4)
        value = float(whole.replace(",", "") + ("." + decimals if decimals else ""))
        tolerance = 0.5 * 10 ** -len(decimals) + 1e-9
        if suffix:
            scale = 1000 if suffix == "k" else 1_000_000
            value, tolerance = value * scale, tolerance * scale
        unit = (unit or "").strip()
        sign = span[max(match.start() - 1, 0):match.start()]
        if sign in ("+", "-", "\u2212") and not span[max(match.start() - 2, 0):match.start() - 1].isalnum():
            unit = unit or "points"  # a signed difference: +2.2 points may be a JSON share of 0.022
        out.append((match.group(0).strip(), value, tolerance, unit))
    return out


def _span_before(line: str, start: int) -> str:
    text = line[:start].rstrip()
    if text.endswith("("):
        text = text[:-1]
    cut = 0
    for boundary in BOUNDARY_RE.finditer(text):
        cut = boundary.end()
    return text[cut:]


def _json_target(doc: Path, target: str) -> tuple[Path, str] | None:
    target, _, fragment = target.partition("#")
    if not target.endswith(".json") or "://" in target:
        return None
    return (doc.parent / target).resolve(), fragment


def collect(repo: Path = REPO) -> tuple[list[Figure], list[str]]:
    """Every cited figure, and the problems that are not about a figure (a cited JSON that does not exist).

    Two forms: a link right after the figure it cites, and a table row whose last cell holds nothing but links
    to JSON files (a "source" column), which cites every number in the row's cells but the first (the row's
    name)."""
    figures: list[Figure] = []
    problems: list[str] = []
    for doc in docs_to_check(repo):
        for number, line in logical_lines(doc.read_text(encoding="utf-8")):
            where = f"{doc.relative_to(repo)}:{number}"
            cited = [(link, _json_target(doc, link.group(2))) for link in LINK_RE.finditer(line)]
            cited = [(link, path) for link, path in cited if path is not None]
            missing = [path for _, (path, _keys) in cited if not path.is_file()]
            problems += [f"{where}: cites {path.relative_to(repo) if path.is_relative_to(repo) else path}, "
                         "which does not exist" for path in missing]
            if not cited or missing:
                continue
            source_cells = _source_cells(line, doc)
            if source_cells is not None:
                cells, paths = source_cells
                for cell in cells[1:]:  # the first cell names the row
                    figures += [Figure(doc, number, *found, paths) for found in figures_before(cell)]
                continue
            for link, path in cited:
                figures += [Figure(doc, number, *found, [path])
                            for found in figures_before(_span_before(line, link.start()))]
    return figures, problems


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each paragraph, list item and table row outside code fences: a sentence wrapped
    over several lines is one text, so a figure and the link after it may sit on different lines."""
    out: list[tuple[int, str]] = []
    current: list[str] = []
    start = 0
    in_fence = False

    def flush():
        if current:
            out.append((start, " ".join(part.strip() for part in current)))
            current.clear()

    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if FENCE_RE.match(stripped):
            flush()
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        if not stripped or stripped.startswith(("|", "#", "<", "![")):
            flush()
            if stripped.startswith("|"):
                out.append((number, stripped))
            continue
        if re.match(r"([*+-]|\d+\.)\s", stripped):  # a list item starts a text of its own
            flush()
        if not current:
            start = number
        current.append(line)
    flush()
    return out


def _source_cells(line: str, doc: Path) -> tuple[list[str], list[Path]] | None:
    """A table row with a cell of nothing but JSON links: (the other cells, those JSON files)."""
    if not line.lstrip().startswith("|"):
        return None
    cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
    links = list(LINK_RE.finditer(cells[-1]))
    if links and not LINK_RE.sub("", cells[-1]).strip(" ,/·"):
        paths = [_json_target(doc, link.group(2)) for link in links]
        if all(paths):
            return cells[:-1], paths
    return None


def found_in(figure: Figure, numbers: list[float]) -> bool:
    if figure.unit == "points":
        return any(abs(abs(number) * scale - figure.value) <= figure.tolerance
                   for number in numbers for scale in (1, 100))
    scales = SCALES.get(figure.unit, (1, 1000, 0.001) if figure.unit in ("", "×", "x") and figure.value >= 1000
                        else (1,))
    return any(abs(number * scale - figure.value) <= figure.tolerance for number in numbers for scale in scales)


def check(repo: Path = REPO) -> tuple[list[Figure], list[str]]:
    """(figures checked, problems); no problems means every cited figure is in its JSON."""
    figures, problems = collect(repo)
    cache: dict[tuple[Path, str], list[float]] = {}
    for figure in figures:
        where = f"{figure.doc.relative_to(repo)}:{figure.line}"
        cited = ", ".join(str(path.relative_to(repo)) + (f"#{keys}" if keys else "")
                          for path, keys in figure.json_paths)
        try:
            numbers = [n for target in figure.json_paths
                       for n in cache.setdefault(target, json_numbers(*target))]
        except KeyError as exc:
            problems.append(f"{where}: cites {cited}: {exc.args[0]}")
            continue
        if not found_in(figure, numbers):
            problems.append(f"{where}: {figure.text!r} is not in {cited} (at the precision written)")
    return figures, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every figure checked")
    args = parser.parse_args(argv)
    figures, problems = check()
    if args.list:
        for figure in figures:
            print(f"{figure.doc.relative_to(REPO)}:{figure.line}: {figure.text} <- "
                  f"{', '.join(path.name + (f'#{keys}' if keys else '') for path, keys in figure.json_paths)}")
    for problem in problems:
        print(problem, file=sys.stderr)
    print(f"{len(figures)} figures checked against their JSON, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
