"""Whether a location is a URL (object storage through fsspec) rather than a local path, and the fsspec file system
that reads one. Sources (``kbflow.convert.objects``), the data dir (``kbflow.core.storage``) and the lease lock
(``kbflow.state.object_lock``) all ask these two questions."""

from __future__ import annotations

from kbflow.core.errors import ConfigError
from kbflow.core.extras import require


def is_url(source: object) -> bool:
    """True for a string with a scheme (``s3://bucket/kb``, ``memory://x``); a path is never one."""
    return isinstance(source, str) and "://" in source


def filesystem(url: str):
    """(fsspec file system, path without the protocol) of a URL; a missing client library is a ConfigError."""
    import fsspec

    if url.startswith(("s3://", "s3a://")):
        require("s3fs", f"source {url!r}")
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:
        raise ConfigError(f"source {url!r}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"source {url!r} is not a URL kbflow can read ({exc}); pass a local path or an fsspec URL "
                          "such as s3://bucket/prefix/") from None
