"""A local copy of a LanceDB table that lives in a bucket, for searching it at local-disk speed.

Why: a search of a table in a bucket reads the hit rows' columns (text, paths) with ranged GETs into the data
files, one or more per hit, every query: seconds per query against an S3 server, where the same table on local
disk answers in milliseconds (docs/operations.md, Object storage).

How it stays correct: a Lance table's files are written once and never changed (data files, index files and
transaction files have unique names; a version is a new manifest under ``_versions/``), so a copy only needs the
files it lacks. Before every search the mirror asks the bucket for the table's newest manifest (one LIST request
of at most one key: Lance names manifests so that the newest sorts first) and compares its name and ETag with the
one it copied last; when they differ it lists the table, fetches the new files, removes the ones the bucket no
longer has (pruned versions), and opens the copy again. A search therefore never answers from a version older
than the newest one in the bucket when the search began, which includes every version a completed run wrote.

The copy lives under ``store.mirror_dir`` (default ``$XDG_CACHE_HOME/kbflow/mirror``), one folder per table URL;
deleting it costs one full download at the next search. Writes never go through it: they go to the bucket.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from kbflow.core import storage

if TYPE_CHECKING:
    from lancedb.table import Table

V2_MANIFEST = re.compile(r"^\d{20}\.manifest$")  # Lance's newer naming: u64::MAX - version, so newest sorts first
V1_MANIFEST = re.compile(r"^\d+\.manifest$")
ETAGS_FILE = "etags.json"  # beside the copy: the ETag of every file it holds whole
SYNC_ATTEMPTS = 5  # listings to retry while writers commit during the listing


def manifest_version(name: str) -> int:
    stem = int(name.split(".", 1)[0])
    return 2**64 - 1 - stem if V2_MANIFEST.match(name) else stem


def manifest_names(version: int) -> tuple[str, str]:
    """The file names version ``version``'s manifest may have under ``_versions/`` (the inverse of
    ``manifest_version``): Lance's newer naming, then its older one."""
    return f"{2**64 - 1 - version:020d}.manifest", f"{version}.manifest"


class TableMirror:
    def __init__(self, uri: str, table_name: str, mirror_dir: str | Path):
        self.table_url = f"{uri.rstrip('/')}/{table_name}.lance"
        self.table_name = table_name
        remote = storage.location(self.table_url)
        self.fs = remote.fs
        self.remote_path = remote.path.rstrip("/")  # bucket/prefix/table.lance
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
        digest = hashlib.sha256(f"{endpoint} {self.table_url}".encode("utf-8")).hexdigest()[:16]
        self.local_db = Path(mirror_dir) / digest
        self.local_table = self.local_db / f"{table_name}.lance"
        self._marker: tuple[str, str] | None = None  # (name, etag) of the newest manifest the copy holds
        self._etags: dict[str, str] = {}  # relative path -> ETag of every file copied
        self._table: Table | None = None
        self.syncs = 0  # how many times the copy was brought up to date (for tests and the benchmark)
        self._lock = threading.Lock()

    # --- the bucket ----------------------------------------------------------------------------------------
    def newest_manifest(self) -> tuple[str, str] | None:
        """(file name, ETag) of the table's newest manifest in the bucket; None when the table is not there."""
        versions = f"{self.remote_path}/_versions/"
        if "s3" in (self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)):
            bucket, _, prefix = versions.partition("/")
            reply = self.fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
            first = reply.get("Contents") or []
            if not first:
                return None
            name = first[0]["Key"].rsplit("/", 1)[-1]
            if V2_MANIFEST.match(name):
                return name, first[0]["ETag"]
        try:
            entries = self.fs.ls(versions, detail=True, refresh=True)
        except FileNotFoundError:
            return None
        manifests = [(e["name"].rsplit("/", 1)[-1], e) for e in entries]
        manifests = [(name, e) for name, e in manifests if V1_MANIFEST.match(name)]
        if not manifests:
            return None
        name, entry = max(manifests, key=lambda item: manifest_version(item[0]))
        return name, self._etag(entry)

    @staticmethod
    def _etag(entry: dict) -> str:
        return str(entry.get("ETag") or entry.get("etag") or f"{entry.get('size')}@{entry.get('LastModified')}")

    def _listing(self) -> dict[str, dict]:
        found = self.fs.find(self.remote_path, detail=True, refresh=True)
        prefix = self.remote_path + "/"
        return {name[len(prefix):]: entry for name, entry in found.items() if name.startswith(prefix)}

    # --- the copy ------------------------------------------------------------------------------------------
    def table(self):
        """The local copy's table at the bucket's newest version (synced first when the bucket moved on); None
        when the table is not in the bucket. One caller at a time: two searches of one store at once would
        otherwise both fetch into, and remove from, the same copy."""
        with self._lock:
            marker = self.newest_manifest()
            if marker is None:
                self._forget()
                return None
            if marker != self._marker or self._table is None:
                self._sync(marker)
            return self._table

    def _forget(self) -> None:
        self._table, self._marker, self._etags = None, None, {}
        (self.local_db / ETAGS_FILE).unlink(missing_ok=True)
        shutil.rmtree(self.local_table, ignore_errors=True)

    def _sync(self, marker: tuple[str, str]) -> None:
        for _ in range(SYNC_ATTEMPTS):
            listing = self._listing()
            manifests = [rel for rel in listing if rel.startswith("_versions/") and V1_MANIFEST.match(rel[10:])]
            if not manifests:  # dropped between the two requests
                self._forget()
                return
            newest = max(manifests, key=lambda rel: manifest_version(rel[10:]))
            listed = (newest[10:], self._etag(listing[newest]))
            if listed == marker:
                break
            marker = listed  # a writer committed during the listing: its files may be listed only in part
        else:
            raise RuntimeError(f"the table {self.table_url} changed during each of {SYNC_ATTEMPTS} listings; "
                               "search again when its writer has finished")
        self._fetch(listing)
        import lancedb

        self._table = lancedb.connect(str(self.local_db)).open_table(self.table_name)
        self._marker = marker
        self.syncs += 1

    def _fetch(self, listing: dict[str, dict]) -> None:
        """Copy the files the copy lacks (or holds in another content: a manifest of a table dropped and written
        again), then remove those the bucket no longer has."""
        if not self._etags:  # a copy left by an earlier process: files it recorded as whole, with their ETags
            self._etags = self._recorded()
        for rel, entry in sorted(listing.items()):
            etag = self._etag(entry)
            target = self.local_table / rel
            if self._etags.get(rel) == etag and target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}{storage.TMP_SUFFIX}")
            try:
                self.fs.get_file(f"{self.remote_path}/{rel}", str(partial))
                os.replace(partial, target)
            finally:
                partial.unlink(missing_ok=True)
            self._etags[rel] = etag
        for rel in set(self._etags) - set(listing):
            (self.local_table / rel).unlink(missing_ok=True)
            del self._etags[rel]
        storage.write_bytes_atomic(self.local_db / ETAGS_FILE, json.dumps(self._etags).encode("utf-8"),
                                   durable=False)

    def _recorded(self) -> dict[str, str]:
        try:
            return json.loads((self.local_db / ETAGS_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or torn: every file is fetched again
            return {}
