"""`kbflow config show`: each setting's effective value, labelled with the source that won (default < file <
environment < flag), through the same loader every command uses."""

import json
import os

from typer.testing import CliRunner

from kbflow.cli.main import app
from kbflow.config import load_config, load_config_with_origins
from kbflow.config.show import effective_settings


def _show(path=None, **overrides):
    return effective_settings(*load_config_with_origins(path, **overrides))


def test_each_source_wins_over_the_ones_before_it_and_is_labelled(tmp_path, monkeypatch):
    monkeypatch.delenv("KBFLOW_DATA_DIR", raising=False)
    path = tmp_path / "c.yaml"
    path.write_text("namespace: from-file\nsearch:\n  mode: bm25\n  limit: 7\n  llm:\n    model: qwen-plus\n"
                    "chunking:\n  overlap_tokens: 10\n")
    monkeypatch.setenv("KBFLOW__SEARCH__LIMIT", "9")
    monkeypatch.setenv("KBFLOW__NAMESPACE", "from-env")
    monkeypatch.setenv("KBFLOW__FLOW__KEEP_RUNS", "3")
    shown = _show(path, namespace="from-flag")
    assert shown["search.mode"] == {"value": "bm25", "source": "file", "from": str(path)}
    assert shown["search.llm.model"] == {"value": "qwen-plus", "source": "file", "from": str(path)}
    assert shown["search.limit"] == {"value": 9, "source": "environment", "from": "KBFLOW__SEARCH__LIMIT"}
    assert shown["flow.keep_runs"] == {"value": 3, "source": "environment", "from": "KBFLOW__FLOW__KEEP_RUNS"}
    assert shown["namespace"] == {"value": "from-flag", "source": "flag", "from": "--namespace"}
    assert shown["search.rerank.candidates"] == {"value": 50, "source": "default", "from": None}
    # what it shows is what the commands run with
    config = load_config(path, namespace="from-flag")
    assert (config.search.limit, config.search.mode, config.namespace) == (9, "bm25", "from-flag")
    assert _show(path)["namespace"] == {"value": "from-env", "source": "environment", "from": "KBFLOW__NAMESPACE"}


def test_every_setting_is_listed_once_and_defaults_are_labelled_default(monkeypatch):
    for name in [name for name in os.environ if name.upper().startswith("KBFLOW")]:
        monkeypatch.delenv(name)
    shown = _show()
    assert {setting["source"] for setting in shown.values()} == {"default"}
    assert len(shown) > 100 and "deploy.schedules" in shown and "embedder.backend" in shown


def test_data_dir_precedence_kbflow_data_dir_then_the_field_variable_then_the_flag(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("data_dir: from-file\n")
    monkeypatch.setenv("KBFLOW_DATA_DIR", "from-data-dir-var")
    assert _show(path)["data_dir"] == {"value": "from-data-dir-var", "source": "environment", "from": "KBFLOW_DATA_DIR"}
    monkeypatch.setenv("KBFLOW__DATA_DIR", "from-field-var")
    assert _show(path)["data_dir"] == {"value": "from-field-var", "source": "environment", "from": "KBFLOW__DATA_DIR"}
    assert _show(path, data_dir="s3://b/kb")["data_dir"] == {"value": "s3://b/kb", "source": "flag", "from": "--data-dir"}


def test_a_variable_that_sets_a_whole_section_replaces_the_files_labels_in_it(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("search:\n  rerank:\n    candidates: 20\n    batch_size: 8\n")
    monkeypatch.setenv("KBFLOW__SEARCH__RERANK", "{candidates: 30}")
    shown = _show(path)
    assert shown["search.rerank.candidates"] == {"value": 30, "source": "environment", "from": "KBFLOW__SEARCH__RERANK"}
    assert shown["search.rerank.batch_size"] == {"value": 32, "source": "default", "from": None}


def test_the_command_prints_names_values_and_sources_never_a_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("DASHSCOPE_API_KEY", "sk-do-not-print-me")
    monkeypatch.setenv("KBFLOW__STORE__QDRANT_LOCATION", "https://admin:hunter2@qdrant.example:6333")
    path = tmp_path / "c.yaml"
    path.write_text("search:\n  mode: bm25\n")
    result = CliRunner().invoke(app, ["config", "show", "--config", str(path), "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f'search.mode = "bm25"  # file {path}' in lines
    assert f'data_dir = "{tmp_path}"  # flag --data-dir' in lines
    assert 'convert.dashscope.timeout_s = 120.0  # default' in lines
    assert ('store.qdrant_location = "https://admin:***@qdrant.example:6333"  '
            '# environment KBFLOW__STORE__QDRANT_LOCATION') in lines
    assert "sk-do-not-print-me" not in result.output and "hunter2" not in result.output

    result = CliRunner().invoke(app, ["config", "show", "--config", str(path), "--json"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)["settings"]
    assert settings["search.mode"] == {"value": "bm25", "source": "file", "from": str(path)}
    assert "hunter2" not in result.output


def test_a_bad_config_is_one_line_naming_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("search:\n  mode: sideways\n")
    result = CliRunner().invoke(app, ["config", "show", "--config", str(path)])
    assert result.exit_code == 2
    assert "search.mode" in result.output and "Traceback" not in result.output
