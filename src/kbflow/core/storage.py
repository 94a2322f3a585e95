"""The data dir as a local folder or an object-storage prefix (``s3://bucket/kb``): where a location is, the few
writes whose atomicity kbflow's state relies on, and LanceDB connections to either.

A local location is a ``pathlib.Path`` and behaves exactly as it always did (temp file, fsync, rename). A URL is a
``UPath`` (universal-pathlib over fsspec) with the same ``/``, ``read_text``, ``exists``, ``iterdir``, ``rglob``;
there a whole-object PUT is the atomic write (a reader sees the old object or the new one, never half), so no temp
object is needed. Credentials and endpoint come from the client's standard environment (``AWS_*`` for S3), never
from kbflow.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from kbflow.core.errors import StateDamaged
from kbflow.core.urls import is_url
from kbflow.core.extras import require

TMP_SUFFIX = ".tmp-kbflow"


def location(path: str | Path):
    """``path`` as a ``Path`` (local) or a ``UPath`` (an object-storage URL)."""
    if isinstance(path, Path):
        return path
    if is_url(str(path)):
        url = str(path)
        UPath = require("upath", f"data dir {url!r}").UPath
        if url.startswith(("s3://", "s3a://")):
            require("s3fs", f"data dir {url!r}")
        # other processes (LanceDB's own client, other workers) write here too: s3fs must not answer from a listing
        # it cached earlier
        return UPath(url, use_listings_cache=False) if url.startswith(("s3://", "s3a://")) else UPath(url)
    return Path(path)


def is_remote(path) -> bool:
    return not isinstance(path, Path)


def write_bytes_atomic(path, data: bytes, durable: bool = True) -> None:
    """Replace the file or object at ``path`` by ``data``; a crash leaves the old content or the new, never half.
    ``durable``: fsync before the rename (state and snapshots); caches that a torn file only costs a miss skip it."""
    if is_remote(path):
        path.write_bytes(data)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}{TMP_SUFFIX}")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_cache_entry(path, data: bytes) -> None:
    """``write_bytes_atomic`` for a cache entry (a conversion, a chunk plan), without fsync. An entry that cannot be
    written because something of the wrong kind stands in its place (a folder where it belongs, a file where its
    folder does) costs the next run this work again, not this run its document: a warning names the path and the
    repair."""
    try:
        write_bytes_atomic(path, data, durable=False)
    except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
        import logging

        logging.getLogger("kbflow").warning("cache entry %s not written (%s); `kbflow verify --repair` moves what "
                                            "stands in its place aside", path, exc.strerror or exc)


def remove_tree(path) -> None:
    """Remove a folder or every object under a prefix; nothing there is not an error."""
    if is_remote(path):
        if path.exists():
            path.fs.rm(path.path, recursive=True)
        return
    shutil.rmtree(path, ignore_errors=True)


def tree_bytes(path) -> int:
    """Bytes under a folder or a prefix."""
    if is_remote(path):
        return int(path.fs.du(path.path)) if path.exists() else 0
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                pass
    return total


def storage_options(uri: str) -> dict[str, str]:
    """LanceDB's client reads credentials, region and endpoint from the same environment; the one thing it refuses
    by default is a plain-http endpoint (a local S3 server such as MinIO, or moto in the tests): an
    ``AWS_ENDPOINT_URL`` that says ``http://`` is that permission."""
    if not is_url(uri):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return {"allow_http": "true"} if uri.startswith(("s3://", "s3a://")) and endpoint.startswith("http://") else {}


def lance_connect(uri: str | Path):
    """A LanceDB connection to a local folder (created first) or an object-storage URL."""
    import lancedb

    uri = str(uri)
    if is_url(uri):
        return lancedb.connect(uri, storage_options=storage_options(uri))
    folder = Path(uri)
    if folder.exists() and not folder.is_dir():
        raise StateDamaged(f"{uri!r} is a file where the LanceDB folder (the store and the vector cache) belongs; run "
                           "`kbflow verify --repair`: it moves the file aside, and the next `kbflow ingest` writes "
                           "every document again", uri)
    folder.mkdir(parents=True, exist_ok=True)
    return lancedb.connect(uri)
