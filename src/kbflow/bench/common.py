"""What several `kbflow bench` modules share: the corpus argument (a folder or a tar archive), the process's
peak memory, an ingest phase's line in a result, and the comparison of an updated store with a fresh one."""

from __future__ import annotations

import os
import platform
import resource
import tarfile
from pathlib import Path

from kbflow.config import load_config
from kbflow.runtime.environment import cpu_info
from kbflow.core.errors import ConfigError


def check_corpus(corpus: Path, flag: str = "--corpus") -> str:
    """Before any work: ``corpus`` is a folder or a tar archive; returns the name its documents' source paths will
    start with (the folder's name, or the archive's single top folder)."""
    corpus = Path(corpus)
    if corpus.is_dir():
        return corpus.name
    if not corpus.is_file() or not tarfile.is_tarfile(corpus):
        raise ConfigError(f"{flag} {str(corpus)!r} is neither a folder nor a tar archive; pass one (e.g. "
                          "../shared/corpora/postgresql-15.18-html.tar.xz in this workplace)")
    with tarfile.open(corpus) as archive:
        tops = {Path(name).parts[0] for name in archive.getnames() if Path(name).parts}
    return tops.pop() if len(tops) == 1 else corpus.name


def corpus_dir(corpus: Path, into: Path) -> Path:
    """A folder as is; a tarball unpacked (its single top folder, so two versions share source paths)."""
    corpus = Path(corpus)
    check_corpus(corpus)
    if corpus.is_dir():
        return corpus
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(corpus) as archive:
        archive.extractall(into, filter="data")
    entries = [p for p in into.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else into


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (Linux reports ru_maxrss in KB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# what decides a model's speed
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def machine() -> dict:
    """The cores a result was measured on: CPU model, logical CPUs, the instruction-set flags that matter for
    inference (from /proc/cpuinfo on Linux), and the 1-minute load average now."""
    info = cpu_info()
    model = info.get("model name") or platform.processor() or platform.machine()
    flags = set(info.get("flags", "").split())
    return {"cpu": model, "cpu_count": os.cpu_count(), "cpu_flags": [f for f in CPU_FLAGS if f in flags],
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def phase_row(name: str, wall: float, summary: dict, peak_rss_mb: float | None) -> dict:
    """A phase's line in the result, from the run summary it produced."""
    return {"phase": name, "wall_s": round(wall, 3), "texts_embedded": summary["chunks"]["embedded"],
            "chunks_reused": summary["chunks"]["reused"], "chunks_written": summary["chunks"]["written"],
            "chunks_deleted": summary["chunks"]["deleted"],
            "store_count": summary["store"]["count"], "documents": summary["documents"],
            "stage_seconds": summary["seconds"], "run_id": summary["run_id"], "peak_rss_mb": peak_rss_mb}


# what a row holds apart from its ids (doc ids hash the namespace): equal in an updated store and a fresh one
CONTENT_COLUMNS = ["source_path", "ordinal", "heading_path", "text", "text_tokens", "char_start", "char_end",
                   "n_tokens", "embed_sha256", "vector"]


def same_store(config, data_dir: Path, namespace_a: str, namespace_b: str, dimension: int) -> bool:
    """Whether two namespaces hold the same rows (every column but the ids), row for row."""
    from kbflow.stores.factory import open_store

    cfg = load_config(config, data_dir=data_dir)
    tables = [open_store(cfg, namespace, dimension).rows(CONTENT_COLUMNS).sort_by([("source_path", "ascending"),
                                                                                    ("ordinal", "ascending")])
              for namespace in (namespace_a, namespace_b)]
    return tables[0].equals(tables[1])
