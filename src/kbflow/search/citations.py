"""How a retrieved chunk is named where an answer cites it: plain ``ask`` and agentic ``ask`` label their
sources the same way, so a citation reads alike whichever retrieved it."""

from __future__ import annotations

from kbflow.stores import Hit


def source_label(hit: Hit) -> str:
    """'path § Heading > Subheading' (just the path for a chunk outside any heading)."""
    heading = " > ".join(hit.heading_path)
    return hit.source_path + (f" § {heading}" if heading else "")
