"""ZIP archives read in place: members are listed and read into memory, never extracted to disk.

A member's source path is ``<archive source path>!/<member path>``. An archive that is unsafe as a whole
(too large uncompressed, too many members, unreadable) is refused whole; a member whose path would escape
the archive (``../../x``, an absolute path) is refused alone and its bytes are never read.
"""

from __future__ import annotations

import posixpath
import zipfile
from dataclasses import dataclass

from kbflow.convert.objects import zip_source
from kbflow.core.errors import ConversionError

MEMBER_SEP = "!/"
ZIP_SUFFIXES = {".zip"}


@dataclass(frozen=True)
class ArchiveLimits:
    max_total_bytes: int
    max_members: int


def member_escapes(name: str) -> bool:
    """True when extracting ``name`` would land outside the archive's folder."""
    normalized = name.replace("\\", "/")
    if normalized.startswith("/") or (len(normalized) > 1 and normalized[1] == ":"):
        return True
    return ".." in posixpath.normpath(normalized).split("/") or ".." in normalized.split("/")


def open_archive(path: str, source_path: str, limits: ArchiveLimits) -> tuple[zipfile.ZipFile, list[zipfile.ZipInfo]]:
    """Open and check an archive as a whole; the file members (folders left out). Raises ConversionError."""
    try:
        archive = zipfile.ZipFile(zip_source(path))  # an object's bytes are read into memory
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ConversionError(
            f"{source_path}: not a readable ZIP archive ({exc}); repair or re-create it, or exclude it with convert.exclude"
        ) from exc
    members = [info for info in archive.infolist() if not info.is_dir()]
    total = sum(info.file_size for info in members)
    if len(members) > limits.max_members:
        archive.close()
        raise ConversionError(
            f"{source_path}: ZIP archive has {len(members)} members, more than convert.zip_max_members "
            f"({limits.max_members}); unpack it into a folder, or raise the limit"
        )
    if total > limits.max_total_bytes:
        archive.close()
        raise ConversionError(
            f"{source_path}: ZIP archive would unpack to {total / 1e6:,.0f} MB, more than convert.zip_max_total_mb "
            f"({limits.max_total_bytes / 1e6:,.0f} MB): a ZIP bomb or a very large archive; remove it, or unpack it "
            "and ingest the folder"
        )
    return archive, members


def read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source_path: str) -> bytes:
    """The member's bytes, at most its declared size (a header that lies about the size is refused)."""
    if member_escapes(info.filename):
        raise ConversionError(
            f"{source_path}: member path escapes the archive ({info.filename!r}); it was not read or written "
            "anywhere. Re-create the archive with relative paths, or remove the member"
        )
    try:
        with archive.open(info) as handle:
            data = handle.read(info.file_size + 1)
    except RuntimeError as exc:  # zipfile's error for an encrypted member
        raise ConversionError(
            f"{source_path}: encrypted ZIP member ({exc}); unpack it with its password and ingest the files"
        ) from exc
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise ConversionError(
            f"{source_path}: ZIP member is corrupt or uses an unsupported compression ({exc}); re-create the archive"
        ) from exc
    if len(data) > info.file_size:
        raise ConversionError(
            f"{source_path}: ZIP member holds more bytes than its header declares; the archive is corrupt or "
            "malicious. Re-create it"
        )
    return data


def split_member_path(source_path: str) -> tuple[str, str]:
    """('archive source path', 'member path') of a member's source path."""
    archive_path, member = source_path.split(MEMBER_SEP, 1)
    return archive_path, member
