"""How a term is keyed in the graph: the one normalisation that the structural extractor (``extract``), the LLM
extractor (``llm_extract``) and the query side (``expand``) all match on."""

from __future__ import annotations

import re

DOTTED_RE = re.compile(r"(?<=\w)\.(?=\w)")


def term_key(text: str) -> str:
    """A term as queries are matched against it: lowercase; '_', '-' and a '.' between two word characters
    (os.path.join, Path.stat) as spaces; single spaces."""
    return " ".join(DOTTED_RE.sub(" ", re.sub(r"[_\-]+", " ", text.lower())).split())
