"""One way in: every document enters kbflow through a Source.

A source kind is one module here that registers itself (``base.register``): ``local`` (files and folders, a
``file://`` URL), ``objects`` (object storage), ``web`` (http(s) pages), ``upload`` (inline content, fetched
pages), ``text`` (texts with a caller's id). Each decides a document's identity, its confinement, how its bytes
are fetched and how change is detected (``base.SourceKind``). Every door (the CLI, the Python API, MCP, a Run form,
a backfill) hands its sources to ``kind_of``/``confine``, and the engine's plan settles each scanned file's
identity (``local.settle_identities``) before anything is converted.
"""

from kbflow.sources.base import KINDS, SourceKind, confine, kind_of, normalise, origin_of, register
from kbflow.sources import local, objects, web, upload, text  # noqa: E402

KIND_MODULES = (local, objects, web, upload, text)  # each registered its kind when imported, in this order

__all__ = ["KINDS", "SourceKind", "confine", "kind_of", "normalise", "origin_of", "register", "kinds_table"]


def kinds_table() -> str:
    """The registered kinds as the Markdown table docs/architecture.md shows (a test keeps them equal)."""
    rows = ["| kind | identity | confinement | fetch | change |", "|---|---|---|---|---|"]
    rows += [f"| `{kind.name}` | {kind.identity} | {kind.confinement} | {kind.fetch} | {kind.change} |"
             for kind in KINDS.values()]
    return "\n".join(rows)
