"""`kbflow convert`: the Markdown the pipeline would see, written file by file for a person to inspect."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kbflow.convert.archive import MEMBER_SEP, ArchiveLimits
from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch
from kbflow.core.errors import ConfigError
from kbflow.convert.scan import scan


def markdown_path(out_dir: Path, source_path: str) -> Path:
    """``<out>/<source path>.md``; an archive member goes under a folder named ``<archive>!``. Never outside ``out``."""
    relative = source_path.replace(MEMBER_SEP, "!/") + ".md"
    target = (out_dir / relative).resolve()
    root = out_dir.resolve()
    if root != target and root not in target.parents:
        raise ConfigError(f"{source_path}: its output path would leave {str(out_dir)!r}; not written")
    return target


def convert_to_folder(paths: Sequence[str | Path], out_dir: str | Path, options: ConvertConfig | None = None) -> dict:
    """Convert every file under ``paths`` and write its Markdown under ``out_dir``; returns a summary with the
    failures (path, error type, message)."""
    options = options or ConvertConfig()
    out_dir = Path(out_dir)
    limits = ArchiveLimits(int(options.zip_max_total_mb * 1e6), options.zip_max_members)
    sources = scan([str(p) for p in paths], "convert", options.include, options.exclude, limits)
    table = convert_batch(sources, options)
    written, failures = [], []
    for row in table.to_pylist():
        if row["status"] != "ok":
            failures.append({"source_path": row["source_path"], "error_type": row["error"].split(":", 1)[0],
                             "message": row["error"]})
            continue
        target = markdown_path(out_dir, row["source_path"])
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(row["markdown"], encoding="utf-8")
        written.append({"source_path": row["source_path"], "markdown_path": str(target),
                        "converter": row["converter"].rsplit(":", 1)[-1], "encoding": row["encoding"],
                        "chars": len(row["markdown"])})
    return {"files": len(sources), "converted": len(written), "failed": len(failures), "written": written,
            "failures": failures}
