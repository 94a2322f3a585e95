"""Sources in object storage: any fsspec URL (``s3://bucket/prefix/``, ``gs://``, ``az://``, ``memory://``...).

A URL source is scanned like a local folder: its objects are listed recursively, each is hashed from its bytes,
and its source path starts at the URL's last path segment, so ``s3://bucket/manuals/`` and a local folder named
``manuals`` give the same source paths and document ids. Credentials, endpoint and region come from the client
library's standard environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``,
``AWS_DEFAULT_REGION`` for S3); kbflow never reads, logs or stores them.

Local paths do not come through here: the local walk keeps its symlink and permission semantics (``scan.py``).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
from datetime import datetime

from kbflow.core.errors import ConfigError
from kbflow.core.urls import filesystem, is_url

HASH_CHUNK = 1 << 20


def url_of(fs, path: str) -> str:
    return fs.unstrip_protocol(path)


def read_bytes(location: str) -> bytes:
    """The bytes of a local file or of an object."""
    if not is_url(location):
        with open(location, "rb") as handle:
            return handle.read()
    fs, path = filesystem(location)
    return fs.cat_file(path)


def zip_source(location: str):
    """What ``zipfile.ZipFile`` opens: a local path as itself, an object's bytes in memory."""
    return io.BytesIO(read_bytes(location)) if is_url(location) else location


def sha256_stream(handle) -> str:
    """SHA-256 of what a binary file object holds, read in ``HASH_CHUNK`` blocks (local files and objects alike)."""
    digest = hashlib.sha256()
    while block := handle.read(HASH_CHUNK):
        digest.update(block)
    return digest.hexdigest()


def sha256_object(fs, path: str) -> str:
    with fs.open(path, "rb", block_size=HASH_CHUNK) as handle:
        return sha256_stream(handle)


def modified(info: dict) -> float:
    """An object's modification time as a POSIX timestamp (0.0 when the store does not say)."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def list_objects(url: str) -> tuple[object, str, dict[str, dict]]:
    """(file system, base path, {object path: info}) for every object under ``url`` (or the one object it names).
    Source paths are the object paths relative to ``base``. A URL with nothing under it is a ConfigError (a typo
    must not read as 'every document was deleted'); a failed listing raises the client's own error."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    fs.invalidate_cache()  # fsspec keeps listings per file system instance: a re-run must see the store as it is
    if fs.isfile(root):
        return fs, posixpath.dirname(root), {root: fs.info(root)}
    found = fs.find(root, detail=True, withdirs=False)
    if not found:
        raise ConfigError(f"source {url!r} holds no objects (or does not exist): check the bucket and prefix")
    return fs, posixpath.dirname(root), found
