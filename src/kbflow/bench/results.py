"""What every `kbflow bench` command ends with: its result as JSON and a plot beside it (PNG, same name)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


def save(result: dict, out_file: str | Path, draw: Callable[[dict, Path], Path] | None = None) -> dict:
    """Write ``result`` to ``out_file`` (the plot ``draw`` makes goes beside it, named in ``result["plot"]``)."""
    out_file = Path(out_file)
    out_file.parent.mkdir(parents=True, exist_ok=True)
    if draw is not None:
        result["plot"] = str(draw(result, out_file.with_suffix(".png")))
    out_file.write_text(json.dumps(result, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return result
