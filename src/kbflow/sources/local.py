"""Local files and folders, however they are written: a relative or absolute path, through '..' or a symlinked
folder, or a ``file://`` URL.

Identity: ``<folder name>/<path inside it>`` for the files of a folder, the file's name for a file given alone;
then ``settle_identities`` makes one identity per file in a namespace: a file whose real path ends in a source
path the namespace already holds keeps that path, so ``kbflow ingest docs/`` and ``kbflow add-document
docs/a.md`` (or the absolute path, or ``file:///…/docs/a.md``) name one document.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pyarrow as pa

from kbflow.convert.archive import MEMBER_SEP
from kbflow.convert.scan import SourceFile, doc_id_for
from kbflow.sources.base import SourceKind, register
from kbflow.core.trust import SourcePolicy, file_path, is_file_url
from kbflow.core.urls import is_url


def _claims(source: str) -> bool:
    return is_file_url(source) or not is_url(source)


def _normalise(source: str) -> str:
    return file_path(source) if is_file_url(source) else source


def _confine(source: str, policy: SourcePolicy) -> str:
    return str(policy.check_path(_normalise(source)))


LOCAL = register(SourceKind(
    name="local", origin="file", prefix="", claims=_claims, normalise=_normalise, confine=_confine,
    identity="the path inside the folder it was given as (`docs/guide/a.md`); a path the namespace already "
             "holds for the same real file wins, however the file was named",
    confinement="someone else's path: its real path (symlinks and `..` followed) under a `--root`, a "
                "`file://` prefix or a `deploy.source_roots` folder; a folder walk reads no link leading out or "
                "nowhere",
    fetch="read from disk (ZIP members in memory)",
    change="SHA-256 of the bytes"))


def location_of(source: SourceFile) -> str | None:
    """Where a scanned file really is: its real path (every symlink resolved; a ZIP member after its archive's),
    or an object's URL. The manifest keeps it, so the same file is found again however it is named next time."""
    if not source.abs_path:
        return None
    file_part, sep, member = source.source_path.partition(MEMBER_SEP)
    where = source.abs_path if is_url(source.abs_path) else os.path.realpath(source.abs_path)
    return where + sep + member


def tails(source: SourceFile) -> list[str]:
    """The source paths a scanned local file could be known by, longest first: the trailing parts of where it
    was found (its own source path among them), each with the ZIP member part it has."""
    file_part, sep, member = source.source_path.partition(MEMBER_SEP)
    parts = [part for part in Path(source.abs_path).parts if part not in ("/", "")]
    given = file_part.split("/")
    if is_url(source.abs_path) or parts[-len(given):] != given:  # an object key: no tails of its own
        return [source.source_path]
    return ["/".join(parts[start:]) + sep + member for start in range(len(parts))]


def settle_identities(scanned: list[SourceFile], manifest: pa.Table, namespace: str,
                      add_only: bool) -> tuple[list[SourceFile], list[dict]]:
    """(the scanned files, each under the one identity it has in the namespace, with its ``location``; the stored
    duplicates to remove).

    A file takes the longest source path the namespace holds for it: a stored file document at its location
    (``location_of``: ``kbflow ingest docs/`` then ``add-document docs/a.md``, by any spelling, is one document),
    or, for a document stored before locations were kept, one at a tail of its path (``tails``). A path that
    another scanned file has as its own, or took first, is not taken. Without any, it keeps the path the scan gave
    it (a file of the same relative name from elsewhere is then the same document, the later one). The other
    stored documents at the same location (or older ones at another tail with the same bytes) are duplicates an
    earlier version made: with ``add_only`` they are returned to be removed (a full ingest removes them anyway,
    as they are not among its sources)."""
    rows = [row for row in manifest.select(["doc_id", "source_path", "origin", "source_sha256", "location"])
            .to_pylist() if row["origin"] == "file"]
    held = {row["source_path"]: row for row in rows}
    at: dict[str, list[str]] = {}  # location -> the source paths stored for it
    for row in rows:
        if row["location"]:
            at.setdefault(row["location"], []).append(row["source_path"])
    own = {source.source_path: source for source in scanned}
    claimed: set[str] = set()
    settled, duplicates = [], []
    for source in scanned:
        where = location_of(source)
        mine = list(at.get(where or "", []))
        mine += [path for path in tails(source) if path in held and not held[path]["location"]
                 and (path == source.source_path or held[path]["source_sha256"] == source.source_sha256)]
        mine.sort(key=len, reverse=True)
        chosen = next((path for path in mine if path not in claimed
                       and own.get(path, source) is source), source.source_path)
        claimed.add(chosen)
        settled.append(replace(source, source_path=chosen, doc_id=doc_id_for(namespace, chosen), location=where))
        if add_only:
            duplicates += [held[path] for path in mine if path != chosen]
    unique = {row["doc_id"]: row for row in duplicates if row["source_path"] not in claimed}
    return settled, list(unique.values())
