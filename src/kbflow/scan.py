"""Scan sources: walk files and folders, hash bytes, give every file a stable document id."""

from __future__ import annotations

import fnmatch
import hashlib
import mimetypes
import os
from dataclasses import dataclass
from pathlib import Path

from kbflow.errors import ConfigError

HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class SourceFile:
    doc_id: str
    source_path: str  # stable and relative: '<root folder name>/<path inside it>'
    abs_path: str
    source_sha256: str
    size: int
    mtime: float
    mime: str


def doc_id_for(namespace: str, source_path: str) -> str:
    """Stable per (namespace, relative source path): the same file keeps its id across runs and machines."""
    return hashlib.sha256(f"{namespace}\x00{source_path}".encode()).hexdigest()[:32]


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(HASH_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _excluded(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def iter_files(sources: list[str | Path], include: list[str], exclude: list[str]):
    """Yield (file path, base folder) for every file under the sources, recursively, in a stable order.

    Symlinked folders are not followed, so a symlink loop cannot trap the walk.
    """
    for source in sources:
        root = Path(source).expanduser()
        if not root.exists():
            raise ConfigError(f"source {str(source)!r} does not exist: pass an existing file or folder")
        root = root.resolve()
        if root.is_file():
            yield root, root.parent
            continue
        for folder, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not _excluded(d, exclude))
            for name in sorted(filenames):
                if _excluded(name, exclude) or not any(fnmatch.fnmatch(name, p) for p in include):
                    continue
                path = Path(folder) / name
                if path.is_file():
                    yield path, root.parent


def scan(sources: list[str | Path], namespace: str, include: list[str], exclude: list[str]) -> list[SourceFile]:
    """Hash every source file. Relative paths start at each source's own folder name, so the same
    folder ingested from another working directory keeps its ids."""
    found: dict[str, SourceFile] = {}
    for path, base in iter_files(sources, include, exclude):
        source_path = path.relative_to(base).as_posix()
        stat = path.stat()
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        found[source_path] = SourceFile(
            doc_id=doc_id_for(namespace, source_path),
            source_path=source_path,
            abs_path=str(path),
            source_sha256=sha256_file(path),
            size=stat.st_size,
            mtime=stat.st_mtime,
            mime=mime,
        )
    return [found[key] for key in sorted(found)]
