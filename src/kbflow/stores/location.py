"""Where the LanceDB tables live: a local folder, or an object-storage URL (``s3://bucket/kb/lancedb``).

LanceDB reads and writes object storage natively (its commits are atomic there too). Credentials, region and
endpoint come from the client's standard environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``); kbflow never reads, logs or stores them. The one setting derived here:
a plain-http endpoint (a local S3 server such as MinIO, or moto in the tests) is refused by LanceDB unless
allowed, and an ``AWS_ENDPOINT_URL`` that says ``http://`` is that permission.
"""

from __future__ import annotations

import os
from pathlib import Path

from kbflow.convert.objects import filesystem, is_url


def storage_options(uri: str) -> dict[str, str]:
    if not is_url(uri):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    return {"allow_http": "true"} if uri.startswith(("s3://", "s3a://")) and endpoint.startswith("http://") else {}


def connect(uri: str | Path):
    """A LanceDB connection to ``uri``; a local folder is created first."""
    import lancedb

    uri = str(uri)
    if is_url(uri):
        return lancedb.connect(uri, storage_options=storage_options(uri))
    Path(uri).mkdir(parents=True, exist_ok=True)
    return lancedb.connect(uri)


def size_bytes(uri: str | Path) -> int:
    """Bytes under a local folder or an object-storage prefix; 0 when there is nothing."""
    uri = str(uri)
    if is_url(uri):
        fs, path = filesystem(uri)
        return int(fs.du(path)) if fs.exists(path) else 0
    folder = Path(uri)
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0


def exists(uri: str | Path) -> bool:
    uri = str(uri)
    if is_url(uri):
        fs, path = filesystem(uri)
        return fs.exists(path)
    return Path(uri).is_dir()
