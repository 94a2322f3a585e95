"""`kbflow bench convert --structure DIR`: how much of a page's structure survives printing it to PDF.

DIR holds HTML pages, each beside the PDF a browser printed from it (``scripts/print_structure_pages.py``
makes such a set from documentation tarballs), in one folder per documentation set. The HTML's conversion is
the ground truth; each PDF engine's conversion is scored against it:

- headings: recall and precision of heading texts (a heading is any Markdown ``#`` line outside code blocks,
  compared by its letters and digits, whatever its level);
- table cells: recall of the HTML's table cells among the PDF's table cells, and their precision (each compared
  by its letters and digits, so spacing and inline markup do not count; a cell of a table the HTML does not
  have, or two cells run together, counts against precision);
- words: recall and precision of words (letters, digits and underscores; each Chinese character a word), links'
  targets left out;

each a count of matches over the whole set (multisets: a cell found twice counts once), with the same per set.
Speed is pages per CPU second of this process, every PDF converted once by each engine, one at a time.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path

from kbflow.bench.common import machine
from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_file, converter_fingerprint
from kbflow.core.errors import ConfigError

LINK_RE = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
KEY_RE = re.compile(r"[\W_]+")
WORD_RE = re.compile(r"[A-Za-z0-9_]+|[\u3400-\u9fff]")
SEPARATOR_RE = re.compile(r"^\|[\s:|-]+\|$")
CELL_SPLIT_RE = re.compile(r"(?<!\\)\|")
ENGINES = ("pdfium", "markitdown")


def _key(text: str) -> str:
    return KEY_RE.sub("", LINK_RE.sub(r"\1", text)).lower()


def structure_of(markdown: str) -> dict[str, Counter]:
    """Heading keys, table-cell keys and words of a Markdown text."""
    headings: Counter[str] = Counter()
    cells: Counter[str] = Counter()
    fence = ""
    for line in markdown.splitlines():
        stripped = line.strip()
        if fence:
            fence = "" if stripped.startswith(fence) else fence  # a code block's lines are neither
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        heading = re.match(r"#{1,6}\s+(.*)", stripped)
        if heading and _key(heading.group(1)):
            headings[_key(heading.group(1))] += 1
        elif stripped.startswith("|") and stripped.endswith("|") and len(stripped) > 1 \
                and not SEPARATOR_RE.match(stripped):
            for cell in CELL_SPLIT_RE.split(stripped[1:-1]):
                if _key(cell):
                    cells[_key(cell)] += 1
    words = Counter(word.lower() for word in WORD_RE.findall(LINK_RE.sub(r"\1", markdown)))
    return {"headings": headings, "cells": cells, "words": words}


def _ratio(found: int, total: int) -> float | None:
    return round(found / total, 4) if total else None


def score(truth: dict[str, Counter], got: dict[str, Counter]) -> dict:
    """Matches and totals: heading and word matches both ways, cells as recall."""
    matched = {kind: sum((truth[kind] & got[kind]).values()) for kind in truth}
    return {"headings_true": sum(truth["headings"].values()), "headings_found": sum(got["headings"].values()),
            "headings_matched": matched["headings"], "cells_true": sum(truth["cells"].values()),
            "cells_found": sum(got["cells"].values()), "cells_matched": matched["cells"],
            "words_true": sum(truth["words"].values()), "words_found": sum(got["words"].values()),
            "words_matched": matched["words"]}


def summarise(counts: dict) -> dict:
    return {"heading_recall": _ratio(counts["headings_matched"], counts["headings_true"]),
            "heading_precision": _ratio(counts["headings_matched"], counts["headings_found"]),
            "cell_recall": _ratio(counts["cells_matched"], counts["cells_true"]),
            "cell_precision": _ratio(counts["cells_matched"], counts["cells_found"]),
            "word_recall": _ratio(counts["words_matched"], counts["words_true"]),
            "word_precision": _ratio(counts["words_matched"], counts["words_found"])}


def _add(total: dict, counts: dict) -> None:
    for key, value in counts.items():
        total[key] = total.get(key, 0) + value


def page_pairs(folder: Path) -> list[tuple[Path, Path]]:
    pairs = [(html, html.with_suffix(".pdf")) for html in sorted(folder.rglob("*.htm*"))
             if html.with_suffix(".pdf").is_file()]
    if not pairs:
        raise ConfigError(f"--structure {str(folder)!r} holds no HTML page with a PDF beside it (page.html and "
                          "page.pdf); make such a set with scripts/print_structure_pages.py")
    return pairs


def bench_structure(folder: Path, out_file: Path, options: ConvertConfig | None = None,
                    engines: tuple[str, ...] = ENGINES) -> dict:
    import pypdfium2 as pdfium

    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(f"--structure {str(folder)!r} is not a folder")
    options = options or ConvertConfig()
    pairs = page_pairs(folder)
    unknown = [name for name in engines if name not in ENGINES]
    if unknown:
        raise ConfigError(f"--engines: {', '.join(unknown)} unknown; choose from {', '.join(ENGINES)}")
    configs = {name: options.model_copy(update={"pdf_engine": name, "ocr": False}) for name in engines}
    totals: dict[str, dict] = {name: {} for name in engines}
    by_set: dict[str, dict[str, dict]] = {}
    cpu = {name: 0.0 for name in engines}
    pages_total, per_page = 0, []
    for html, pdf in pairs:
        truth = structure_of(convert_file(str(html), html.name, options).markdown)
        document = pdfium.PdfDocument(str(pdf))
        pages = len(document)
        document.close()
        pages_total += pages
        row = {"page": str(html.relative_to(folder)), "pdf_pages": pages}
        for name, engine in configs.items():
            started = time.process_time()
            markdown = convert_file(str(pdf), pdf.name, engine).markdown
            cpu[name] += time.process_time() - started
            counts = score(truth, structure_of(markdown))
            _add(totals[name], counts)
            _add(by_set.setdefault(html.relative_to(folder).parts[0], {}).setdefault(name, {}), counts)
            row[name] = summarise(counts)
        per_page.append(row)
    result = {
        "folder": str(folder), "machine": machine(), "pages": len(pairs), "pdf_pages": pages_total,
        "converter": {name: converter_fingerprint(engine) for name, engine in configs.items()},
        "engines": {name: {**summarise(totals[name]), **totals[name], "cpu_s": round(cpu[name], 3),
                           "pdf_pages_per_cpu_s": round(pages_total / cpu[name], 2) if cpu[name] else None}
                    for name in engines},
        "sets": {name: {engine: {**summarise(counts), **counts} for engine, counts in engines_.items()}
                 for name, engines_ in sorted(by_set.items())},
        "per_page": per_page,
    }
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    plot(result, out_file.with_suffix(".png"))
    return result


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = ["heading_recall", "heading_precision", "cell_recall", "cell_precision", "word_recall",
                "word_precision"]
    fig, ax = plt.subplots(figsize=(9, 4))
    engines = list(result["engines"])
    width = 0.8 / len(engines)
    for i, name in enumerate(engines):
        values = [result["engines"][name][m] or 0 for m in measures]
        ax.bar([x + i * width for x in range(len(measures))], values, width, label=name)
    ax.set_xticks([x + width * (len(engines) - 1) / 2 for x in range(len(measures))], measures, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title(f"structure of {result['pages']} browser-printed pages ({result['pdf_pages']} PDF pages)")
    ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
