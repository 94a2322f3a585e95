"""`kbflow bench convert` on a tiny real corpus: per-format figures, the PDF comparison, WER, JSON and plot."""

from __future__ import annotations

import json
import shutil

from typer.testing import CliRunner

from kbflow.cli.main import app
from tests.conftest import CASES


def test_bench_convert_writes_json_and_plot(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("crazyones.pdf", "iris.csv", "conf-onlyperson.wav"):
        shutil.copy(CASES / "formats" / name, corpus / name)
    shutil.copy(CASES / "formats" / "conf-onlyperson.txt", corpus / "transcripts.txt")
    out = tmp_path / "bench" / "convert.json"
    result = CliRunner().invoke(app, ["bench", "convert", "--corpus", str(corpus), "--pdf", str(corpus / "crazyones.pdf"),
                                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert set(report["formats"]) == {"pdf", "csv", "wav", "txt"} and report["failures"] == []
    assert all(entry["cpu_s"] > 0 and entry["files_per_cpu_s"] > 0 for entry in report["formats"].values())
    speed = report["pdf_speedup"]
    assert speed["file"] == "crazyones.pdf" and speed["pdfium_text"]["words"] > 100
    assert report["quality"]["asr"]["conf-onlyperson.wav"]["words"] == 9
    assert 0 <= report["quality"]["asr_corpus_wer"] <= 0.6
    assert out.with_suffix(".png").stat().st_size > 10_000
