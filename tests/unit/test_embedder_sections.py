"""The embedder section holds one backend's settings (a model per backend), a remote provider's connection in
``embedder.connection``; configs written flat, as configs/default.yaml once was, load and mean the same, with one
warning line naming each old key and its new one."""

from pathlib import Path

import pytest

from kbflow.config import embedders as sections
from kbflow.config import load_config, load_config_with_origins
from kbflow.config.show import effective_settings
from kbflow.core.errors import ConfigError

FLAT_DEFAULT = Path(__file__).parents[1] / "cases" / "config" / "flat-default.yaml"
FLAT = """embedder:
  backend: dashscope
  model: text-embedding-v3
  dimension: 512
  api_key_env: MY_DASHSCOPE_KEY
  base_url: https://dashscope-intl.aliyuncs.com/api/v1
  timeout_s: 30
  retries: 2
  retry_backoff_s: 1.5
  threads: 4
  task_batch: 100
"""
NEW = """embedder:
  backend: dashscope
  model: text-embedding-v3
  dimension: 512
  task_batch: 100
  connection:
    api_key_env: MY_DASHSCOPE_KEY
    base_url: https://dashscope-intl.aliyuncs.com/api/v1
    timeout_s: 30
    retries: 2
    retry_backoff_s: 1.5
"""


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch, own_backend):
    monkeypatch.setattr(sections, "_warned", set())


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_flat_section_loads_as_the_sections_and_says_so_once(tmp_path, capsys):
    flat, new = _write(tmp_path, "flat.yaml", FLAT), _write(tmp_path, "new.yaml", NEW)
    assert load_config(flat).embedder == load_config(new).embedder
    config = load_config(flat).embedder
    assert (config.connection.api_key_env, config.connection.timeout_s, config.connection.retries) == \
        ("MY_DASHSCOPE_KEY", 30, 2)
    assert config.retry_backoff_s == 1.5  # the embed stage's own retry follows the provider's
    warned = capsys.readouterr().err.splitlines()
    assert len(warned) == 1, warned  # once per process, for every load and every key
    assert "embedder.timeout_s -> embedder.connection.timeout_s" in warned[0]
    assert "embedder.api_key_env -> embedder.connection.api_key_env" in warned[0]
    assert "dropped (backend 'dashscope' never read them) embedder.threads;" in warned[0]
    assert warned[0].endswith("(docs/configuration.md#embedder-backend-dashscope)")
    load_config(new)
    assert capsys.readouterr().err == ""  # the new shape is silent


def test_flat_keys_from_the_environment_move_too_and_keep_their_source(tmp_path, monkeypatch, capsys):
    path = _write(tmp_path, "new.yaml", NEW)
    monkeypatch.setenv("KBFLOW__EMBEDDER__TIMEOUT_S", "12")
    config, origins = load_config_with_origins(path)
    assert config.embedder.connection.timeout_s == 12
    shown = effective_settings(config, origins)
    assert shown["embedder.connection.timeout_s"] == {"value": 12.0, "source": "environment",
                                                      "from": "KBFLOW__EMBEDDER__TIMEOUT_S"}
    assert shown["embedder.connection.retries"]["source"] == "file"
    assert "embedder.timeout_s -> embedder.connection.timeout_s" in capsys.readouterr().err
    # the other way round: the file's flat key loses to the variable of its new name
    monkeypatch.delenv("KBFLOW__EMBEDDER__TIMEOUT_S")
    monkeypatch.setenv("KBFLOW__EMBEDDER__CONNECTION__TIMEOUT_S", "7")
    shown = effective_settings(*load_config_with_origins(_write(tmp_path, "flat.yaml", FLAT)))
    assert shown["embedder.connection.timeout_s"] == {"value": 7.0, "source": "environment",
                                                      "from": "KBFLOW__EMBEDDER__CONNECTION__TIMEOUT_S"}
    assert shown["embedder.connection.retries"] == {"value": 2, "source": "file", "from": str(tmp_path / "flat.yaml")}


def test_the_old_generated_default_yaml_loads_as_the_defaults(capsys):
    """A config copied from configs/default.yaml as it was (all 25 embedder settings flat) is today's defaults,
    except the settings whose defaults moved since, which that file writes out (and so keeps): two of search's,
    and e5's precision (fp32 written; the default is now auto)."""
    old, today = load_config(FLAT_DEFAULT).model_dump(), load_config(None, sources=["data/sample"]).model_dump()
    assert (old["search"].pop("fusion"), old["search"].pop("bm25_floor")) == ("weighted", 0.2)
    assert (today["search"].pop("fusion"), today["search"].pop("bm25_floor")) == ("trusted", 0.8)
    assert (old["embedder"].pop("precision"), today["embedder"].pop("precision")) == ("fp32", "auto")
    assert old == today
    assert "dropped (backend 'auto' never read them) embedder.model," in capsys.readouterr().err


def test_each_backend_takes_only_its_own_settings(tmp_path):
    with pytest.raises(ConfigError, match="embedder.local.connection"):
        load_config(_write(tmp_path, "a.yaml", "embedder:\n  backend: local\n  connection: {timeout_s: 5}\n"))
    with pytest.raises(ConfigError, match="embedder.e5.batch_sise"):
        load_config(_write(tmp_path, "b.yaml", "embedder:\n  backend: e5\n  batch_sise: 5\n"))
    with pytest.raises(ConfigError, match="embedder.dashscope.connection.timeout"):
        load_config(_write(tmp_path, "c.yaml", "embedder:\n  backend: dashscope\n  connection: {timeout: 5}\n"))
    with pytest.raises(ConfigError, match="'e5' always uses 'query: ' and 'passage: '; remove embedder.query_prefix"):
        load_config(_write(tmp_path, "d.yaml", "embedder:\n  backend: e5\n  query_prefix: 'q: '\n"))
    with pytest.raises(ConfigError, match="embedder"):
        load_config(_write(tmp_path, "e.yaml", "embedder:\n  backend: word2vec\n"))
    assert not hasattr(load_config(None).embedder, "connection")  # auto is local: no provider to reach


OLD_SERVICES = """convert:
  dashscope_api_key_env: MY_ASR_KEY
  dashscope_timeout_s: 300
search:
  rerank:
    kind: dashscope
    dashscope_url: https://dashscope-intl.aliyuncs.com/api/v1/services/rerank/text-rerank/text-rerank
    retries: 1
  llm:
    base_url_env: MY_CHAT_URL
    api_key_env: MY_CHAT_KEY
    timeout_s: 20
"""


def test_flat_service_settings_move_into_their_connections(tmp_path, monkeypatch, capsys):
    """Speech recognition, the reranker and the chat model share the embedder's connection model; their old flat
    keys load and mean what they meant."""
    monkeypatch.setenv("MY_CHAT_URL", "http://chat.internal:8000/v1")
    config = load_config(_write(tmp_path, "old.yaml", OLD_SERVICES))
    asr, rerank, llm = config.convert.dashscope, config.search.rerank.connection, config.search.llm.connection
    assert (asr.api_key_env, asr.timeout_s, asr.retries) == ("MY_ASR_KEY", 300, 3)
    assert (rerank.base_url, rerank.retries, rerank.timeout_s) == ("https://dashscope-intl.aliyuncs.com/api/v1", 1, 30)
    assert (llm.base_url, llm.api_key_env, llm.timeout_s) == ("http://chat.internal:8000/v1", "MY_CHAT_KEY", 20)
    err = capsys.readouterr().err
    assert "convert.dashscope_timeout_s -> convert.dashscope.timeout_s" in err
    assert "search.llm.base_url_env -> search.llm.connection.base_url" in err
    written_new = load_config(_write(tmp_path, "new.yaml", "search:\n  llm:\n    connection: {timeout_s: 20}\n"))
    assert written_new.search.llm.connection.timeout_s == 20 and capsys.readouterr().err == ""
    with pytest.raises(ConfigError, match="search.rerank.connection.base_url"):
        load_config(_write(tmp_path, "bad.yaml", "search:\n  rerank:\n    dashscope_url: https://proxy.example/rr\n"))
