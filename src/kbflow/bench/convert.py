"""`kbflow bench convert`: conversion speed per format, the PDF fast path against MarkItDown, and OCR/ASR quality
where ground truth sits beside the files (``<image stem>.txt``; ``transcripts.txt`` with ``stem: text`` lines).

Every file is converted in this process, one at a time (workers=1), so the figures are per-core throughput.
"""

from __future__ import annotations

import json
import platform
import time
from collections import defaultdict
from pathlib import Path, PurePosixPath

from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch, convert_file, converter_fingerprint
from kbflow.core.errors import ConfigError
from kbflow.convert.formats.audio import AUDIO_SUFFIXES
from kbflow.convert.formats.ocr import IMAGE_SUFFIXES
from kbflow.convert.scan import scan
from kbflow.bench.textmetrics import cer, word_errors


def _format_of(source_path: str) -> str:
    suffix = PurePosixPath(source_path.split("!/")[-1]).suffix.lower()
    return suffix[1:] if suffix else "(none)"


def _per_format(corpus: Path, options: ConvertConfig) -> tuple[dict, dict, list[dict]]:
    sources = scan([corpus], "bench", options.include, options.exclude)
    stats: dict[str, dict] = defaultdict(lambda: {"files": 0, "failed": 0, "bytes": 0, "seconds": 0.0, "cpu_s": 0.0,
                                                  "chars": 0})
    markdown: dict[str, str] = {}
    failures = []
    for source in sources:
        started, cpu_started = time.perf_counter(), time.process_time()
        row = convert_batch([source], options).to_pylist()[0]
        seconds = time.perf_counter() - started
        entry = stats[_format_of(source.source_path)]
        entry["files"] += 1
        entry["bytes"] += source.size
        entry["seconds"] += seconds
        entry["cpu_s"] += time.process_time() - cpu_started
        if row["status"] == "ok":
            entry["chars"] += len(row["markdown"])
            markdown[source.abs_path if source.member is None else source.source_path] = row["markdown"]
        else:
            entry["failed"] += 1
            failures.append({"source_path": source.source_path, "message": row["error"][:300]})
    for entry in stats.values():
        entry["seconds"], entry["cpu_s"] = round(entry["seconds"], 6), round(entry["cpu_s"], 6)
        entry["files_per_s"] = round(entry["files"] / entry["seconds"], 3) if entry["seconds"] else None
        entry["mb_per_s"] = round(entry["bytes"] / 1e6 / entry["seconds"], 3) if entry["seconds"] else None
        entry["files_per_cpu_s"] = round(entry["files"] / entry["cpu_s"], 3) if entry["cpu_s"] else None
        entry["mb_per_cpu_s"] = round(entry["bytes"] / 1e6 / entry["cpu_s"], 3) if entry["cpu_s"] else None
    return dict(sorted(stats.items())), markdown, failures


def _visible_chars(text: str) -> int:
    return sum(1 for c in text if not c.isspace())


def _text_measures(text: str) -> dict:
    """Visible characters, the same without Markdown table rules and pipes (MarkItDown draws tables, PDFium keeps
    cells as text), and words (pdfminer glues words together where PDFium keeps the space)."""
    import re

    without_tables = re.sub(r"\|[ :-]*(?=\|)|\||^-{3,}$", "", text, flags=re.M)
    return {"chars": _visible_chars(text), "chars_without_table_markup": _visible_chars(without_tables),
            "words": len(text.split())}


def pdf_speedup(pdf: Path, repeats: int = 1) -> dict:
    """PDFium text path (OCR off, so both read only the text layer) against MarkItDown's pdfminer path.

    Wall time and this process's CPU time (user + system): on a shared machine the CPU time is the fair figure."""
    timings: dict[str, float] = {}
    cpu: dict[str, float] = {}
    texts: dict[str, str] = {}
    for engine in ("pdfium", "markitdown"):
        options = ConvertConfig(pdf_engine=engine, ocr=False)
        for _ in range(repeats):
            started, cpu_started = time.perf_counter(), time.process_time()
            converted = convert_file(str(pdf), pdf.name, options)
            elapsed, cpu_elapsed = time.perf_counter() - started, time.process_time() - cpu_started
            timings[engine] = min(timings.get(engine, elapsed), elapsed)
            cpu[engine] = min(cpu.get(engine, cpu_elapsed), cpu_elapsed)
        texts[engine] = converted.markdown
    with_ocr_started = time.process_time()
    convert_file(str(pdf), pdf.name, ConvertConfig())
    with_ocr_cpu = time.process_time() - with_ocr_started
    middle = len(texts["pdfium"]) // 2
    return {"file": pdf.name, "mb": round(pdf.stat().st_size / 1e6, 2),
            "pdfium_s": round(timings["pdfium"], 3), "markitdown_s": round(timings["markitdown"], 3),
            "pdfium_cpu_s": round(cpu["pdfium"], 3), "markitdown_cpu_s": round(cpu["markitdown"], 3),
            "speedup": round(timings["markitdown"] / timings["pdfium"], 2),
            "speedup_cpu": round(cpu["markitdown"] / cpu["pdfium"], 2),
            "pdfium_default_with_ocr_cpu_s": round(with_ocr_cpu, 3),
            "pdfium_text": _text_measures(texts["pdfium"]), "markitdown_text": _text_measures(texts["markitdown"]),
            "pdfium_sample": texts["pdfium"][middle:middle + 400],
            "markitdown_sample": texts["markitdown"][len(texts["markitdown"]) // 2:][:400]}


def quality(corpus: Path, markdown: dict[str, str]) -> dict:
    """OCR character error rate per image with a ``.txt`` twin; corpus WER over audio listed in transcripts.txt."""
    ocr = {}
    for path_str, text in markdown.items():
        path = Path(path_str)
        truth = path.with_suffix(".txt")
        if path.suffix.lower() in IMAGE_SUFFIXES and truth.exists():
            ocr[path.name] = round(cer(truth.read_text(encoding="utf-8"), text), 4)
    asr, errors, total = {}, 0, 0
    for transcripts in corpus.rglob("transcripts.txt"):
        refs = dict(line.split(":", 1) for line in transcripts.read_text(encoding="utf-8").splitlines() if ":" in line)
        for stem, reference in refs.items():
            audio = next((p for p in transcripts.parent.iterdir()
                          if p.stem == stem.strip() and p.suffix.lower() in AUDIO_SUFFIXES), None)
            if audio is None or str(audio) not in markdown:
                continue
            reference = reference.replace("(simple tone sound plays)", "")  # a stage direction, not speech
            e, n = word_errors(reference, markdown[str(audio)])
            asr[audio.name] = {"wer": round(e / max(n, 1), 4), "words": n, "hypothesis": markdown[str(audio)].strip()}
            errors, total = errors + e, total + n
    return {"ocr_cer": ocr, "asr": asr, "asr_corpus_wer": round(errors / total, 4) if total else None}


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    formats = list(result["formats"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    left.barh(formats, [result["formats"][f]["bytes"] / 1e6 / max(result["formats"][f]["cpu_s"], 1e-6)
                        for f in formats], color="#4c72b0")
    left.set_xscale("log")
    left.set_xlabel("MB per CPU second (one process, log scale)")
    left.set_title("conversion throughput per format")
    pdf = result.get("pdf_speedup")
    if pdf:
        right.bar(["PDFium text path", "MarkItDown (pdfminer)"], [pdf["pdfium_cpu_s"], pdf["markitdown_cpu_s"]],
                  color=["#55a868", "#c44e52"])
        right.set_ylabel("CPU seconds")
        right.set_title(f"{pdf['file']}: {pdf['speedup_cpu']}x less CPU\n"
                        f"({pdf['pdfium_text']['words']:,} vs {pdf['markitdown_text']['words']:,} words)")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def bench_convert(corpus: Path, out_file: Path, pdf: Path | None = None, options: ConvertConfig | None = None) -> dict:
    corpus = Path(corpus)
    if not corpus.is_dir():
        raise ConfigError(f"--corpus {str(corpus)!r} is not a folder")
    options = options or ConvertConfig()
    started = time.perf_counter()
    formats, markdown, failures = _per_format(corpus, options)
    pdf = pdf or next(iter(sorted(corpus.rglob("debian-reference.en.pdf"))), None)
    result = {
        "corpus": str(corpus), "machine": f"{platform.machine()}, {platform.python_version()}",
        "converter": converter_fingerprint(options), "workers": 1,
        "formats": formats, "failures": failures,
        "quality": quality(corpus, markdown),
        "pdf_speedup": pdf_speedup(Path(pdf)) if pdf else None,
    }
    result["total_s"] = round(time.perf_counter() - started, 1)
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    plot(result, out_file.with_suffix(".png"))
    return result
