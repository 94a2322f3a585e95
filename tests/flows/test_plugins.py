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


TOY_BACKEND = '''
import hashlib
import re
from typing import ClassVar, Literal

import numpy as np
from pydantic import Field

from kbflow.chunk.counters import FunctionTokenCounter
from kbflow.config.embedders import EmbedderSection
from kbflow.embed.base import BaseEmbedder


class ToySection(EmbedderSection):
    """Hashed word counts (the section is the registry entry: settings, builder, model-id prefix)."""

    backend: Literal["toy"] = Field(description="toy")
    builder: ClassVar[str] = "toyembed:ToyEmbedder"
    model_id_prefixes: ClassVar[tuple[str, ...]] = ("toy",)
    buckets: int = Field(512, ge=8)


class ToyEmbedder(BaseEmbedder):
    def __init__(self, buckets):
        self.model_id, self.dimension, self.max_tokens, self.max_batch = f"toy:words-{buckets}", buckets, 400, 64
        words = lambda text: len(re.findall(r"\\w+", text))
        self._counter = FunctionTokenCounter("toy-words", self.max_tokens, 0, words)

    @classmethod
    def from_section(cls, section):
        return cls(section.buckets)

    def token_counter(self):
        return self._counter

    def _encode(self, texts, is_query):
        out = np.zeros((len(texts), self.dimension), np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\\w+", text.lower()) or ["empty"]:
                out[row, int(hashlib.sha256(word.encode()).hexdigest(), 16) % self.dimension] += 1.0
        return out


SECTION = ToySection
'''


def _kbflow(*args: str, env: dict, cwd: Path) -> dict:
    import json
    import subprocess

    done = subprocess.run([sys.executable, "-m", "kbflow.cli", *args, "--json"], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return json.loads(done.stdout)


def _toy_setup(plugins: Path, tmp_path: Path, config_text: str) -> tuple[Path, list[str], dict]:
    """Two small documents, a config file, and the arguments and environment of a kbflow process that sees the
    plugins folder as an installed package would be seen."""
    import os

    from tests.flows.conftest import subprocess_env

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "kiln.md").write_text("# Kiln\n\nThe kiln fires celadon glaze at 1280 degrees.\n")
    (docs / "garden.md").write_text("# Garden\n\nTomatoes want sun and water every morning.\n")
    config = tmp_path / "toy.yaml"
    config.write_text(config_text)
    env = subprocess_env(PYTHONPATH=os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]))
    return docs, ["--data-dir", str(tmp_path / "kb"), "--config", str(config)], env


def test_an_embedding_backend_from_one_module_ingests_and_searches_and_travels_to_worker_processes(
        plugins, tmp_path, own_backend):
    """A new kbflow process (the config union is built when kbflow.config is first imported) finds the plugin's
    section: its config validates, its embedder embeds an ingest run on the processes runner (the embedder goes to
    the workers as its section and is built there), the namespace records its model id, and a search finds."""
    install_plugin(plugins, "toyembed", TOY_BACKEND, group="kbflow.embedders")
    docs, kb, env = _toy_setup(plugins, tmp_path, "embedder:\n  backend: toy\n  buckets: 256\nrunner:\n  kind: processes\n")
    env.pop("KBFLOW__EMBEDDER__BACKEND", None)  # the suite's MiniLM pin would override the config's backend
    summary = _kbflow("ingest", str(docs), *kb, env=env, cwd=tmp_path)
    assert summary["documents"]["new"] == 2 and summary["documents"]["failed"] == 0, summary
    meta = __import__("json").loads((tmp_path / "kb" / "state" / "default" / "namespace.json").read_text())
    assert meta["model_id"] == "toy:words-256" and meta["dimension"] == 256
    found = _kbflow("search", "celadon glaze kiln", *kb, "--mode", "vector", "--limit", "1", env=env, cwd=tmp_path)
    assert found[0]["source_path"].endswith("kiln.md"), found
    # the section with another setting is another model: the namespace's recorded one is named, not mixed in
    other = tmp_path / "other.yaml"
    other.write_text("embedder:\n  backend: toy\n  buckets: 128\n")
    import subprocess

    done = subprocess.run([sys.executable, "-m", "kbflow.cli", "search", "glaze", "--data-dir", str(tmp_path / "kb"),
                           "--config", str(other)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and "toy:words-256" in done.stderr and "embedder.backend: toy" in done.stderr, \
        done.stderr[-2000:]


def test_a_backend_plugin_that_does_not_load_is_one_error_naming_it(plugins, tmp_path):
    import os
    import subprocess

    install_plugin(plugins, "toybadembed", "import no_such_package_anywhere\n", group="kbflow.embedders")
    env = {**os.environ, "PYTHONPATH": str(plugins)}
    done = subprocess.run([sys.executable, "-m", "kbflow.cli", "stats", "--data-dir", str(tmp_path / "kb")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "embedding backend plugin 'toybadembed'" in done.stderr and "ModuleNotFoundError" in done.stderr


TOY_STORE = '''
import fnmatch
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kbflow.core.schemas import store_schema
from kbflow.stores.base import Hit
from kbflow.stores.kinds import StoreKind


class ToyStore:
    """Every chunk of a namespace in one Parquet file, rewritten whole (atomically) by each write; exact searches."""

    concurrent_reads = False
    defer_vector_index = False

    def __init__(self, folder, namespace, dimension):
        self.folder, self.namespace, self.dimension = Path(folder), namespace, dimension
        self.path = self.folder / f"{namespace}.parquet"
        self.settings = {}

    def _read(self):
        return pq.read_table(self.path) if self.path.exists() else store_schema(self.dimension).empty_table()

    def _write(self, table):
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".partial")
        pq.write_table(table.cast(store_schema(self.dimension)), partial)
        partial.replace(self.path)

    def present(self):
        return self.path.exists()

    exists = present

    def unreadable(self):
        try:
            self._read()
        except Exception as exc:
            return f"{self.path} cannot be read: {exc}"
        return None

    def index_damage(self):
        return None

    def rebuild_indexes(self):
        return {}

    def restore_readable(self):
        return None

    def refresh_indexes(self, force_vector=False, skip_vector=False, between_batches=False):
        return {}

    def searches(self):
        return self

    def replace_documents(self, doc_ids, rows):
        table = self._read()
        kept = table.filter(pc.invert(pc.is_in(table["doc_id"], pa.array(doc_ids, pa.string()))))
        self._write(pa.concat_tables([kept, rows.select(kept.schema.names).cast(kept.schema)]))
        return rows.num_rows

    def delete_documents(self, doc_ids):
        table = self._read()
        kept = table.filter(pc.invert(pc.is_in(table["doc_id"], pa.array(doc_ids, pa.string()))))
        self._write(kept)
        return table.num_rows - kept.num_rows

    def upsert(self, rows):
        table = self._read()
        kept = table.filter(pc.invert(pc.is_in(table["chunk_id"], rows["chunk_id"])))
        self._write(pa.concat_tables([kept, rows.select(kept.schema.names).cast(kept.schema)]))

    def _rows(self, where):
        rows = self._read().to_pylist()
        if where:
            rows = [row for row in rows
                    if (not where.source_glob or fnmatch.fnmatch(row["source_path"], where.source_glob))
                    and list(row["heading_path"] or [])[:len(where.heading_prefix)] == list(where.heading_prefix)
                    and (not where.doc_ids or row["doc_id"] in where.doc_ids)
                    and (not where.chunk_ids or row["chunk_id"] in where.chunk_ids)]
        return rows

    @staticmethod
    def _hits(rows, scores, limit):
        order = sorted(range(len(rows)), key=lambda i: -scores[i])[:limit]
        return [Hit(rows[i]["chunk_id"], rows[i]["doc_id"], rows[i]["source_path"], rows[i]["heading_path"] or [],
                    float(scores[i]), rows[i]["text"]) for i in order]

    def search_vector(self, vector, limit, where=None, exact=False):
        rows = self._rows(where)
        if not rows:
            return []
        return self._hits(rows, np.array([row["vector"] for row in rows], np.float32) @ vector, limit)

    def search_text(self, query_words, limit, where=None):
        rows = self._rows(where)
        words = [(row["text_tokens"] or "").split() for row in rows]
        average = sum(map(len, words)) / max(len(words), 1)
        holding = Counter(word for terms in words for word in set(terms))
        scores = []
        for terms in words:
            counts, score = Counter(terms), 0.0
            for word in query_words:
                if counts[word]:
                    idf = math.log(1 + (len(rows) - holding[word] + 0.5) / (holding[word] + 0.5))
                    score += idf * counts[word] * 2.2 / (counts[word] + 1.2 * (0.25 + 0.75 * len(terms) / average))
            scores.append(score)
        return [hit for hit in self._hits(rows, scores, limit) if hit.score > 0]

    def stats(self):
        table = self._read()
        return {"rows": table.num_rows, "documents": len(set(table["doc_id"].to_pylist())),
                "bytes": self.size_bytes(), "indexes": {}}

    def rows(self, columns=None):
        table = self._read().sort_by("chunk_id")
        return table.select(columns) if columns else table

    def document_rows(self, doc_id, columns):
        table = self._read()
        return table.filter(pc.equal(table["doc_id"], doc_id)).select(columns)

    def count(self):
        return self._read().num_rows

    def chunk_ids(self):
        return self._read().select(["chunk_id", "doc_id"])

    def size_bytes(self):
        return self.path.stat().st_size if self.path.exists() else 0

    def clear(self):
        self.path.unlink(missing_ok=True)


def _open(config, namespace, dimension, for_search):
    return ToyStore(Path(config.data_dir) / "toystore", namespace, dimension)


def _arrive(folder, namespace, dimension):
    return ToyStore(folder, namespace, dimension)


KIND = StoreKind("toystore", _open, travels=(ToyStore, lambda store: (_arrive, (str(store.folder), store.namespace,
                                                                                   store.dimension))))
'''


def test_a_store_kind_from_one_module_holds_an_ingest_that_searches_find(plugins, tmp_path):
    """A new process accepts ``store.kind: toystore`` once the plugin is installed; an ingest on the processes runner
    writes its chunks there (and nothing to LanceDB's table), hybrid and filtered searches read them, an update
    replaces a changed document's chunks, and `kbflow verify` finds the namespace consistent."""
    install_plugin(plugins, "toystore", TOY_STORE, group="kbflow.stores")
    docs, kb, env = _toy_setup(plugins, tmp_path, "store:\n  kind: toystore\nrunner:\n  kind: processes\n")
    summary = _kbflow("ingest", str(docs), *kb, env=env, cwd=tmp_path)
    assert summary["documents"]["new"] == 2 and summary["documents"]["failed"] == 0, summary
    assert (tmp_path / "kb" / "toystore" / "default.parquet").is_file()
    assert not (tmp_path / "kb" / "lancedb" / "chunks_default.lance").exists()  # the vector cache lives there alone
    found = _kbflow("search", "celadon glaze", *kb, "--limit", "1", env=env, cwd=tmp_path)
    assert found[0]["source_path"].endswith("kiln.md"), found
    only = _kbflow("search", "water", *kb, "--source", "*garden.md", "--mode", "bm25", env=env, cwd=tmp_path)
    assert only and all(hit["source_path"].endswith("garden.md") for hit in only), only
    (docs / "kiln.md").write_text("# Kiln\n\nThe kiln now fires stoneware at 1300 degrees.\n")
    update = _kbflow("ingest", str(docs), *kb, env=env, cwd=tmp_path)
    assert update["documents"]["changed"] == 1, update
    found = _kbflow("search", "stoneware", *kb, "--mode", "bm25", env=env, cwd=tmp_path)
    assert found and "1300 degrees" in found[0]["text"] and all("celadon" not in hit["text"] for hit in found)
    verified = _kbflow("verify", *kb, env=env, cwd=tmp_path)
    assert verified["ok"] is True, verified
