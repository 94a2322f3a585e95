"""Text-layer PDF conversion speed before and after structure recovery (tables, outline headings), in one run.

    python research/pdf_structure_speed.py OUT.json REF PDF_OR_FOLDER...

REF is the git commit whose ``src/kbflow/convert/formats/pdf.py`` is the converter before (its file is loaded
as a module of its own beside the installed kbflow, whose other modules it imports); the converter after is
the installed one. Each converts every PDF once to warm up, then five times, the two taking turns; the best of
each is kept, as CPU seconds of this process (OCR off, so only the text layer is read).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kbflow.bench.common import machine
from kbflow.convert.formats.pdf import convert_pdf


def _before(ref: str):
    source = subprocess.run(["git", "show", f"{ref}:src/kbflow/convert/formats/pdf.py"], check=True,
                            capture_output=True, text=True).stdout
    folder = Path(tempfile.mkdtemp())
    (folder / "pdf_before.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("pdf_before", folder / "pdf_before.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["pdf_before"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.convert_pdf


def _cpu(convert, datas: list[bytes]) -> float:
    started = time.process_time()
    for data in datas:
        convert(data, "x.pdf", "KBFLOW_PDF_PASSWORDS", False, 150, 2000)
    return time.process_time() - started


def _best_cpu(before, after, datas: list[bytes], repeats: int = 5) -> tuple[float, float]:
    """Best CPU time of each over ``repeats`` rounds, the two taking turns within a round (a shared machine's
    slow spells then fall on both)."""
    _cpu(before, datas), _cpu(after, datas)  # warm up
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        times[0].append(_cpu(before, datas))
        times[1].append(_cpu(after, datas))
    return min(times[0]), min(times[1])


def main(out: Path, ref: str, paths: list[str]) -> dict:
    import pypdfium2 as pdfium

    files = sorted(f for p in map(Path, paths) for f in ([p] if p.is_file() else p.rglob("*.pdf")))
    datas = [f.read_bytes() for f in files]
    pages = sum(len(pdfium.PdfDocument(d)) for d in datas)
    before, after = _best_cpu(_before(ref), convert_pdf, datas)
    result = {"machine": machine(), "files": len(files), "pages": pages, "before_ref": ref,
              "before_pages_per_cpu_s": round(pages / before, 1), "after_pages_per_cpu_s": round(pages / after, 1),
              "after_over_before_cpu": round(after / before, 3),
              "paths": [str(p) for p in paths]}
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:]), indent=2))
