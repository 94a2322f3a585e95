"""What every `kbflow bench` command ends with: its result as JSON and a plot beside it (PNG, same name)."""

from __future__ import annotations

import json
from contextlib import contextmanager
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


@contextmanager
def panels(png: Path, columns: int = 2, size: tuple[float, float] = (10, 4), title: str | None = None):
    """``(figure, axes)`` of a plot with ``columns`` panels side by side, written to ``png`` and closed on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, columns, figsize=size)
    try:
        yield figure, axes
        if title:
            figure.suptitle(title)
        figure.tight_layout()
        png.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(png, dpi=110)
    finally:
        plt.close(figure)
