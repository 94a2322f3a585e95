"""An extension is one module: a format from a temporary module, installed the way a plugin package installs it
(an entry point in its distribution's metadata), is found by the registry and converts in a real ingest, whose
chunks a search then finds; nothing else in kbflow is touched. Its fingerprint joins the converter fingerprint, so
installing or removing it re-plans stored documents; a broken plugin is one error naming it."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from kbflow import api
from kbflow.config import ConvertConfig
from kbflow.convert.converters import converter_fingerprint, format_fingerprint
from kbflow.convert.formats import registry
from kbflow.core.errors import ConfigError

TOY_FORMAT = '''
from kbflow.convert.formats.base import Format, Markdown


def convert(data, name, source, options):
    """key = value lines as a Markdown table"""
    rows = [line.split("=", 1) for line in data.decode("utf-8").splitlines() if "=" in line]
    table = ["| key | value |", "| --- | --- |", *(f"| {k.strip()} | {v.strip()} |" for k, v in rows)]
    return Markdown("# Settings\\n\\n" + "\\n".join(table) + "\\n", "toy")


FORMATS = [Format("toy", frozenset({".toy"}), convert, lambda options: "toy-v1",
                  content_types={"application/x-toy": ".toy"})]
'''


def install_plugin(root: Path, module: str, source: str, group: str = "kbflow.formats") -> None:
    """``module`` on the path with a distribution that declares it in ``group``, as pip would leave it."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{module}_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{module} = {module}\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A folder on sys.path for plugin modules; the registry reads the installed plugins again before and after."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    registry.registry.cache_clear()
    yield root
    for name in [name for name in sys.modules if name.startswith("toy")]:
        del sys.modules[name]
    registry.registry.cache_clear()


def test_a_format_from_one_module_converts_in_an_ingest_and_its_chunks_are_found(plugins, tmp_path):
    before = converter_fingerprint(ConvertConfig())
    install_plugin(plugins, "toyformat", TOY_FORMAT)
    registry.registry.cache_clear()
    assert converter_fingerprint(ConvertConfig()) == before + "+toy[toy-v1]"  # stored documents are re-planned
    assert format_fingerprint(ConvertConfig(), "a.toy").endswith("+toy-v1")
    assert registry.content_type_suffixes()["application/x-toy"] == ".toy"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kiln.toy").write_text("kiln_temperature = 1280 degrees\nglaze = celadon\n")
    (docs / "notes.md").write_text("# Notes\n\nNothing about pottery here.\n")
    summary = api.ingest([str(docs)], data_dir=tmp_path / "kb")
    assert summary["documents"]["failed"] == 0 and summary["documents"]["new"] == 2, summary
    hits = api.search("kiln temperature celadon glaze", data_dir=tmp_path / "kb", limit=1)
    assert hits and hits[0].source_path.endswith("kiln.toy") and "| kiln_temperature | 1280 degrees |" in hits[0].text


def test_without_the_plugin_the_file_is_text_again(plugins):
    assert registry.format_for("a.toy", ConvertConfig()).name == "text"


def test_a_plugin_that_does_not_load_or_claims_a_taken_suffix_is_one_error_naming_it(plugins):
    install_plugin(plugins, "toybroken", "import no_such_package_anywhere\n")
    with pytest.raises(ConfigError, match="format plugin 'toybroken' .*does not load.*ModuleNotFoundError"):
        registry.registry()
    (plugins / "toybroken.py").write_text(TOY_FORMAT.replace('"toy", frozenset({".toy"})', '"markdown2", frozenset({".md"})'))
    sys.modules.pop("toybroken", None)
    registry.registry.cache_clear()
    with pytest.raises(ConfigError, match="formats 'text' and 'markdown2' both take .md files"):
        registry.registry()
