"""A config as every operation takes it (a ``KbConfig``, a YAML file or config name, or None for the defaults),
with a data dir that overrides the config's: resolved once, by the API, ``KnowledgeBase``, the CLI and the
evaluator alike."""

from __future__ import annotations

from pathlib import Path

from kbflow.config import KbConfig, load_config
from kbflow.core.errors import DATA_DIR_IN_USE, ConfigError
from kbflow.core.extras import check_config
from kbflow.core.urls import is_url


def resolve_config(config: KbConfig | str | Path | None, data_dir: str | Path | None) -> KbConfig:
    """``config`` loaded (or copied) with ``data_dir`` in place of its own when given; a data dir that is a file
    is refused."""
    if isinstance(config, KbConfig):
        cfg = config.model_copy(update={"data_dir": data_dir if is_url(str(data_dir)) else Path(data_dir)}) \
            if data_dir else config
    else:
        cfg = load_config(config, data_dir=data_dir)
    check_data_dir(cfg)
    check_config(cfg)  # a backend the config selects whose extra is missing: one line now, not mid-run
    return cfg


def check_data_dir(config: KbConfig) -> None:
    """A data dir that exists must be a folder (one that does not is created by the first write)."""
    path = config.data_dir
    if not is_url(str(path)):
        DATA_DIR_IN_USE.set(str(path))  # where a permission error that names no path is looked for
    if not is_url(str(path)) and Path(path).exists() and not Path(path).is_dir():
        raise ConfigError(f"data dir {str(path)!r} is a file, not a folder: kbflow keeps its stores, state and run "
                          "snapshots in a folder; pass a folder (created if missing) with --data-dir or the config's "
                          "data_dir")
