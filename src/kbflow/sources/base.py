"""The Source registry: what a kind of source is, and how a source string finds its kind.

A kind is one module (``kbflow.sources.local``, ``objects``, ``web``, ``upload``, ``text``) that registers one
``SourceKind`` here. It decides, once for every door (CLI, API, MCP, a Run form, a backfill):

* **identity**: the source path a document is stored under (its ``doc_id`` is a hash of namespace and source
  path), and the ``prefix`` that keeps inline uploads and texts in their own space;
* **confinement**: what someone else's source may reach (``confine``, over ``kbflow.core.trust.SourcePolicy``);
* **fetch**: how its bytes are read; **change**: how a changed document is told from an unchanged one.

``identity``, ``confinement``, ``fetch`` and ``change`` are also the words docs/architecture.md prints for each
kind (``kinds_table``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kbflow.core.trust import SourcePolicy


@dataclass(frozen=True)
class SourceKind:
    name: str
    # the manifest's 'origin' of its documents: 'file' documents are the ones an ingest removes when they are no
    # longer among its sources; uploads and texts stay until replaced or cleared
    origin: str
    prefix: str  # every source path of the kind starts with it ('' for paths and URLs)
    claims: Callable[[str], bool]  # whether a source string (a path, a URL) is of this kind
    normalise: Callable[[str], str]  # the spelling the scan reads (a file:// URL becomes its path)
    confine: Callable[[str, SourcePolicy], str]  # what someone else's source may be read as, or SourceRefused
    identity: str
    confinement: str
    fetch: str
    change: str


KINDS: dict[str, SourceKind] = {}


def register(kind: SourceKind) -> SourceKind:
    """Add a kind; a later kind with the same name replaces the earlier one (a test's toy kind)."""
    KINDS[kind.name] = kind
    return kind


def _never(_source: str) -> bool:
    return False


def kind_of(source: str) -> SourceKind:
    """The kind a source string belongs to: the first registered kind that claims it."""
    for kind in KINDS.values():
        if kind.claims(source):
            return kind
    raise LookupError(f"no source kind claims {source!r}")  # the local kind claims every path: a bug if reached


def origin_of(source_path: str) -> str:
    """The manifest origin of a stored source path: the kind whose prefix it carries, else a file's."""
    for kind in KINDS.values():
        if kind.prefix and source_path.startswith(kind.prefix):
            return kind.origin
    return "file"


def normalise(source: str) -> str:
    return kind_of(source).normalise(source)


def confine(source: str, policy: SourcePolicy) -> str:
    """What a source someone else sent may be read as (its real path, or its URL), refused otherwise; the one
    check every door that takes outside input calls before anything is read."""
    return kind_of(source).confine(source, policy)


claims_nothing = _never  # for kinds that arrive as job fields (uploads, texts), never as a source string


def confine_url(source: str, policy: SourcePolicy) -> str:
    """Someone else's URL, allowed only under a prefix (``SourcePolicy.check_url``): the object and web kinds."""
    return policy.check_url(source).url


def not_a_source(source: str, _policy: SourcePolicy) -> str:
    """The confinement of kinds that claim no source string (uploads, texts): never called."""
    raise LookupError(f"{source!r} is not read from a source")
