"""Scan sources: walk files and folders (local, or objects under an fsspec URL), hash bytes, give every file a
stable document id."""

from __future__ import annotations

import errno
import fnmatch
import hashlib
import mimetypes
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Sequence

from kbflow.convert.archive import MEMBER_SEP, ZIP_SUFFIXES, ArchiveLimits, member_escapes, open_archive, read_member
from kbflow.convert.objects import is_url, list_objects, modified, sha256_object, sha256_stream, url_of
from kbflow.core.errors import ConfigError, ConversionError



@dataclass(frozen=True)
class SourceFile:
    doc_id: str
    source_path: str  # stable and relative: '<root folder name>/<path inside it>'
    abs_path: str
    source_sha256: str
    size: int
    mtime: float
    mime: str
    member: str | None = None  # inside a ZIP archive (abs_path): the member's path; its bytes are read in memory
    unreadable: str | None = None  # why the file could not be read at scan time (a symlink loop, ...): fails at convert
    location: str | None = None  # where it really is (kbflow.sources.local.location_of), once its identity is settled


@dataclass(frozen=True)
class UnreadableFolder:
    """A folder the scan could not list: its documents are not gone, only out of sight, so none is removed."""

    source_path: str  # relative, like a SourceFile's ('docs/private'); documents under it start with it + '/'
    reason: str

    def holds(self, source_path: str) -> bool:
        return source_path == self.source_path or source_path.startswith(self.source_path.rstrip("/") + "/")


def doc_id_for(namespace: str, source_path: str) -> str:
    """Stable per (namespace, relative source path): the same file keeps its id across runs and machines."""
    return hashlib.sha256(f"{namespace}\x00{source_path}".encode()).hexdigest()[:32]


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return sha256_stream(handle)


def _excluded(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in patterns)


def iter_files(sources: list[str | Path], include: list[str], exclude: list[str],
               unreadable: list[UnreadableFolder] | None = None, skip: Sequence[Path] = ()):
    """Yield (file path, base folder) for every file under the sources, recursively, in a stable order.

    Symlinked folders are not followed, so a symlink loop cannot trap the walk; a symlink that leads nowhere
    (a loop, a missing target) is yielded too, so that it is reported instead of silently skipped. A folder that
    cannot be listed (permissions, an I/O error) is appended to ``unreadable``; without that list it is an error:
    a walk must never pass off an unreadable folder as an empty one. A folder in ``skip`` (real paths: the run's
    data dir) is never entered, so a data dir inside an ingested folder is not read as documents.
    """
    skipped = {str(Path(folder).resolve()) for folder in skip}
    for source in sources:
        root = Path(source).expanduser()
        if not root.exists() and not root.is_symlink():
            raise ConfigError(f"source {str(source)!r} does not exist: pass an existing file or folder")
        if root.is_symlink() and not root.exists():
            yield root.absolute(), root.absolute().parent
            continue
        root = root.resolve()
        if root.is_file():
            yield root, root.parent
            continue

        def on_error(error: OSError, base: Path = root.parent) -> None:
            folder = Path(error.filename or root)
            found = UnreadableFolder(folder.relative_to(base).as_posix(), error.strerror or str(error))
            if unreadable is None:
                raise ConfigError(f"cannot list folder {str(folder)!r}: {found.reason}; fix its permissions or "
                                  "exclude it") from None
            unreadable.append(found)

        for folder, dirnames, filenames in os.walk(root, followlinks=False, onerror=on_error):
            # the walk starts at a real path and follows no link: a folder's joined path is its real path
            dirnames[:] = sorted(d for d in dirnames if not _excluded(d, exclude)
                                 and not (skipped and os.path.join(folder, d) in skipped))
            for name in sorted(filenames):
                if _excluded(name, exclude) or not any(fnmatch.fnmatch(name, p) for p in include):
                    continue
                path = Path(folder) / name
                if path.is_file() or (path.is_symlink() and not path.exists()):
                    yield path, root.parent


def _unreadable_source(path: Path, source_path: str, namespace: str) -> SourceFile | None:
    """A source for a link that cannot be read (its conversion fails with the reason), or None if readable."""
    try:
        path.stat()
        return None
    except OSError as exc:
        target = os.readlink(path) if path.is_symlink() else ""
        reason = ("symlink loop" if exc.errno == errno.ELOOP
                  else "broken symlink" if path.is_symlink() else "unreadable file")
        digest = hashlib.sha256(f"{reason}\x00{target}".encode()).hexdigest()
        return SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path=str(path),
                          source_sha256=digest, size=0, mtime=0.0, mime="inode/symlink",
                          unreadable=f"{reason} (-> {target!r}): {exc.strerror}; fix the link or remove it")


def _refused_link(path: Path, source_path: str, namespace: str) -> SourceFile:
    """A symlink whose target lies outside the folders the caller may read: listed (so it is reported), never
    read; the message does not say where it points."""
    digest = hashlib.sha256(f"refused link\x00{source_path}".encode()).hexdigest()
    return SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path=str(path),
                      source_sha256=digest, size=0, mtime=0.0, mime="inode/symlink",
                      unreadable="refused: a symlink that leads outside the folders this caller may read; it was "
                                 "not read (replace the link with the file, or ask the operator to allow its folder)")


def archive_members(path: Path | str, source_path: str, namespace: str, limits: ArchiveLimits,
                    include: list[str], exclude: list[str], mtime: float | None = None) -> list[SourceFile] | None:
    """One source per file member of a ZIP archive (a local path or an object's URL, then with its ``mtime``);
    None when the archive as a whole is refused (then the archive itself becomes a source whose conversion fails
    with the reason)."""
    try:
        archive, members = open_archive(str(path), source_path, limits)
    except ConversionError:
        return None
    found = []
    mtime = Path(path).stat().st_mtime if mtime is None else mtime
    with archive:
        for info in members:
            parts = info.filename.replace("\\", "/").split("/")
            escapes = member_escapes(info.filename)  # always listed, so that it is reported (never read)
            if not escapes and (any(_excluded(part, exclude) for part in parts if part) or
                                not any(fnmatch.fnmatch(parts[-1], p) for p in include)):
                continue
            member_path = f"{source_path}{MEMBER_SEP}{info.filename}"
            if escapes:  # never read: its conversion reports it
                digest = hashlib.sha256(f"escaping member\x00{info.filename}".encode()).hexdigest()
            else:
                try:
                    digest = hashlib.sha256(read_member(archive, info, member_path)).hexdigest()
                except ConversionError:
                    digest = hashlib.sha256(f"unreadable member\x00{info.CRC}".encode()).hexdigest()
            found.append(SourceFile(
                doc_id=doc_id_for(namespace, member_path), source_path=member_path, abs_path=str(path),
                source_sha256=digest, size=info.file_size, mtime=mtime,
                mime=mimetypes.guess_type(parts[-1])[0] or "application/octet-stream", member=info.filename))
    return found


def scan(sources: Sequence[str | Path], namespace: str, include: list[str], exclude: list[str],
         archive_limits: ArchiveLimits | None = None,
         unreadable_folders: list[UnreadableFolder] | None = None,
         confine: Callable[[Path], bool] | None = None, skip: Sequence[Path] = ()) -> list[SourceFile]:
    """Hash every source file. Relative paths start at each source's own folder name, so the same
    folder ingested from another working directory keeps its ids. ZIP archives are listed member by member.
    A source that is a URL (``s3://bucket/prefix/``) is scanned in object storage the same way (``_scan_url``).

    A file that cannot be read becomes a source whose conversion fails with the reason (one failure row; the
    other files go on). A folder that cannot be listed goes to ``unreadable_folders`` (see ``iter_files``).
    ``confine`` (the trust boundary's ``SourcePolicy.contains``) is asked about every symlinked file before it is
    hashed: one that leads out of the allowed folders is never read and fails with the reason. ``skip``: folders
    never entered (``iter_files``)."""
    limits = archive_limits or ArchiveLimits(max_total_bytes=500_000_000, max_members=10_000)
    found: dict[str, SourceFile] = {}
    for url in [source for source in sources if is_url(source)]:
        found.update(_scan_url(str(url), namespace, limits, include, exclude, unreadable_folders))
    local = [source for source in sources if not is_url(source)]
    for path, base in iter_files(local, include, exclude, unreadable_folders, skip):
        source_path = path.relative_to(base).as_posix()
        if confine is not None and path.is_symlink() and not confine(path):
            found[source_path] = _refused_link(path, source_path, namespace)
            continue
        unreadable = _unreadable_source(path, source_path, namespace)
        if unreadable is not None:
            found[source_path] = unreadable
            continue
        try:
            if path.suffix.lower() in ZIP_SUFFIXES:
                members = archive_members(path, source_path, namespace, limits, include, exclude)
                if members is not None:
                    found.update((member.source_path, member) for member in members)
                    continue
            stat = path.stat()
            digest = sha256_file(path)
        except OSError as exc:
            found[source_path] = _failed_read(path, source_path, namespace, exc)
            continue
        mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        found[source_path] = SourceFile(
            doc_id=doc_id_for(namespace, source_path),
            source_path=source_path,
            abs_path=str(path),
            source_sha256=digest,
            size=stat.st_size,
            mtime=stat.st_mtime,
            mime=mime,
        )
    return [found[key] for key in sorted(found)]


def _scan_url(url: str, namespace: str, limits: ArchiveLimits, include: list[str], exclude: list[str],
              unreadable: list[UnreadableFolder] | None) -> dict[str, SourceFile]:
    """Sources for the objects under a URL, by the local walk's rules: source paths start at the URL's last
    segment, ``exclude`` applies to every folder below it and to names, ``include`` to names; a listing that fails
    (refused, or the store unreachable) makes the whole URL an unreadable folder: its stored documents are kept,
    none is removed, and the run records why."""
    try:
        fs, base, objects = list_objects(url)
    except ConfigError:
        raise
    except Exception as exc:  # refused (PermissionError), unreachable (the client's own errors): out of sight
        folder = UnreadableFolder(posixpath.basename(url.split("://", 1)[1].rstrip("/")), str(exc) or type(exc).__name__)
        if unreadable is None:
            raise ConfigError(f"cannot list {url!r}: {folder.reason}; check the credentials and the bucket's "
                              "permissions, or exclude it") from None
        unreadable.append(folder)
        return {}
    found: dict[str, SourceFile] = {}
    for path in sorted(objects):
        source_path = path[len(base) + 1:] if base else path
        parts = source_path.split("/")
        if any(_excluded(part, exclude) for part in parts[1:-1]) or _excluded(parts[-1], exclude) or \
                not any(fnmatch.fnmatch(parts[-1], p) for p in include):
            continue
        info, location = objects[path], url_of(fs, path)
        if posixpath.splitext(path)[1].lower() in ZIP_SUFFIXES:
            members = archive_members(location, source_path, namespace, limits, include, exclude, modified(info))
            if members is not None:
                found.update((member.source_path, member) for member in members)
                continue
        try:
            digest = sha256_object(fs, path)
        except OSError as exc:
            found[source_path] = _failed_read(location, source_path, namespace, exc)
            continue
        found[source_path] = SourceFile(
            doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path=location,
            source_sha256=digest, size=int(info.get("size") or 0), mtime=modified(info),
            mime=mimetypes.guess_type(parts[-1])[0] or "application/octet-stream")
    return found


def _failed_read(path: Path | str, source_path: str, namespace: str, exc: OSError) -> SourceFile:
    """A file that exists but cannot be read: listed (so its stored version is kept, not removed), failing at
    convert with the reason. Its hash stands for the failure, so a stored document counts as changed and stays
    as it was when the conversion fails."""
    reason = f"unreadable file: {exc.strerror or exc}"
    return SourceFile(doc_id=doc_id_for(namespace, source_path), source_path=source_path, abs_path=str(path),
                      source_sha256=hashlib.sha256(f"{reason}\x00{source_path}".encode()).hexdigest(), size=0,
                      mtime=0.0, mime="application/octet-stream",
                      unreadable=f"{reason}; fix its permissions (it must be readable by the user running kbflow) "
                                 "or exclude it with convert.exclude")
