"""Objects in object storage under an fsspec URL (``s3://bucket/prefix/``, ``gs://…``, ``memory://…``).

Identity: ``<last segment of the URL>/<key below it>``, as a folder's files are named. Confinement: someone
else's URL only under an allowed prefix (``--allow-source``, ``deploy.source_roots``)."""

from __future__ import annotations

from kbflow.convert.web import is_web
from kbflow.sources.base import SourceKind, confine_url, register
from kbflow.core.trust import is_file_url
from kbflow.core.urls import is_url


def _claims(source: str) -> bool:
    return is_url(source) and not is_file_url(source) and not is_web(source)


OBJECTS = register(SourceKind(
    name="object", origin="file", prefix="", claims=_claims, normalise=str, confine=confine_url,
    identity="the key below the URL's last segment, prefixed with that segment (`prefix/guide/a.md`)",
    confinement="someone else's URL: under an allowed prefix (scheme, bucket, then the path on a segment "
                "boundary)",
    fetch="read through fsspec with the environment's credentials (ZIP members in memory)",
    change="SHA-256 of the bytes"))
