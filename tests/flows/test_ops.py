"""Operations under real Prefect: the data dir stays bounded, `kbflow prune` compacts, backfill over namespaces."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timedelta, timezone

import lancedb
import pytest
from typer.testing import CliRunner

from kbflow.flows.backfill import BackfillFailed, backfill
from kbflow.flows.ingest import ingest
from kbflow import api
from kbflow.cli.main import app
from kbflow.ops.deploy import BackfillRequest
from kbflow.core.storage import location, tree_bytes
from tests.flows.conftest import snapshot


def _versions(data_dir, table="chunks_default") -> int:
    return len(lancedb.connect(str(data_dir / "lancedb")).open_table(table).list_versions())


def test_data_dir_stops_growing_across_noop_runs(docs_dir, tmp_path, counting):
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nflow:\n  keep_runs: 1\n", encoding="utf-8")
    data = tmp_path / "data"
    ingest(sources=[str(docs_dir)], config_path=str(config))
    versions = _versions(data)
    sizes = []
    for _ in range(4):
        summary = ingest(sources=[str(docs_dir)], config_path=str(config))
        assert summary["documents"]["unchanged"] == 4 and summary["chunks"]["embedded"] == 0
        sizes.append(tree_bytes(location(data)))
    assert len(list((data / "runs" / "default").iterdir())) == 1
    assert _versions(data) == versions  # a no-op run writes no store version
    # once keep_runs is reached, a no-op run only rewrites fixed-size state (last_run.json, the lock)
    assert max(sizes[1:]) - min(sizes[1:]) <= 512, sizes


def test_prune_keeps_newest_runs_compacts_tables_and_keeps_contents(docs_dir, tmp_path, counting):
    data = tmp_path / "data"
    ingest(sources=[str(docs_dir)], data_dir=str(data))
    for edit in range(3):  # each edit: one store commit, one cache append, one more run folder
        with (docs_dir / "backups.md").open("a", encoding="utf-8") as handle:
            handle.write(f"\n\nAppendix {edit}: restore drills run every quarter, edit {edit}.\n")
        ingest(sources=[str(docs_dir)], data_dir=str(data))
    before = snapshot(data)
    assert _versions(data) >= 4 and len(list((data / "runs" / "default").iterdir())) == 4

    result = CliRunner().invoke(app, ["prune", "--keep-runs", "1", "--versions-older-than-hours", "0",
                                      "--data-dir", str(data), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["runs_removed"]["default"]) == 3
    assert report["tables"]["chunks_default"]["versions_after"] == 1 == _versions(data)
    assert all(table["versions_after"] == 1 for table in report["tables"].values())
    assert report["bytes_after"] < report["bytes_before"]
    assert snapshot(data) == before  # same rows, same manifest
    again = ingest(sources=[str(docs_dir)], data_dir=str(data))
    assert again["documents"]["unchanged"] == 4 and again["store"]["count"] == len(before[0])


def test_backfill_runs_namespaces_apart_and_names_the_failed_one(docs_dir, tmp_path, counting, monkeypatch):
    monkeypatch.setenv("KBFLOW_CONFIGS_DIR", str(tmp_path))  # a deployed run reads configs from this folder only
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\ndeploy:\n  schedules:\n"
                      f"    - {{namespace: bf-ok, sources: [{docs_dir}]}}\n"
                      f"    - {{namespace: bf-missing, sources: [{tmp_path / 'gone'}]}}\n", encoding="utf-8")
    with pytest.raises(BackfillFailed, match=r"\['bf-missing'\] failed .*does not exist"):
        backfill(BackfillRequest(config=str(config), concurrency=2))
    assert api.stats("bf-ok", config)["documents"] == 4

    tomorrow = datetime.now(timezone.utc) + timedelta(days=1)
    outcomes = backfill(BackfillRequest(config=str(config), namespaces=["bf-ok"], changed_since=tomorrow))
    assert outcomes["bf-ok"]["status"] == "skipped"
    rebuilt = backfill(BackfillRequest(config=str(config), namespaces=["bf-ok"], rebuild=True))
    assert rebuilt["bf-ok"]["status"] == "ok" and "'changed': 4" in rebuilt["bf-ok"]["detail"]  # forced


def test_request_with_failed_documents_ends_failed_and_lists_them_in_an_artifact(tmp_path, monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from kbflow.flows.ingest_request import DocumentsFailed, ingest_request
    from kbflow.ops.deploy import IngestRequest
    from tests.conftest import CASES

    monkeypatch.setenv("KBFLOW_CONFIGS_DIR", str(tmp_path))
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\ndeploy:\n  source_roots: [{tmp_path}]\n", encoding="utf-8")
    bad = tmp_path / "bad"  # three of tests/cases/bad (the whole bad-input set has its own tests)
    bad.mkdir()
    for name in ("broken.pdf", "empty.docx", "random.xlsx"):
        shutil.copy(CASES / "bad" / name, bad / name)
    request = IngestRequest(namespace="bad-files", sources=[str(bad)], config=str(config))
    with pytest.raises(DocumentsFailed, match=r"3 failure\(s\) \(convert; 3 document\(s\)\) in namespace 'bad-files'"):
        ingest_request(request)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=["kbflow-bad-files-failures", "kbflow-bad-files-run-summary"])))
    latest = {artifact.key: artifact.data for artifact in sorted(artifacts, key=lambda a: a.created)}
    page = latest["kbflow-bad-files-failures"]
    assert "3 failure(s)" in page and all(name in page for name in ("broken.pdf", "empty.docx", "random.xlsx"))
    assert {"group": "documents", "item": "failed", "value": 3} in json.loads(latest["kbflow-bad-files-run-summary"])


def test_deployments_come_from_the_config_and_a_bad_cron_names_its_entry(tmp_path):
    from kbflow.flows.deployments import build_deployments, deployment_names
    from kbflow.config import load_config
    from kbflow.core.errors import ConfigError

    config = tmp_path / "kb.yaml"
    config.write_text("deploy:\n  schedules:\n    - {namespace: a, cron: '15 1 * * *', timezone: Europe/Berlin}\n"
                      "    - {namespace: b, sources: [x]}\n", encoding="utf-8")
    deployments = build_deployments(load_config(config), str(config))
    assert deployment_names(deployments) == ["kbflow-ingest-request/nightly-a", "kbflow-ingest-request/nightly-b",
                                             "kbflow-ingest-request/on-demand", "kbflow-backfill/backfill",
                                             "kbflow-reembed/reembed"]
    nightly_a = deployments[0]
    assert nightly_a.schedules[0].schedule.cron == "15 1 * * *"
    assert nightly_a.schedules[0].schedule.timezone == "Europe/Berlin"
    assert nightly_a.parameters == {"request": {"namespace": "a", "sources": [], "config": str(config)}}
    assert deployments[1].parameters["request"]["sources"] == ["x"]

    config.write_text("deploy:\n  schedules:\n    - {namespace: a}\n    - {namespace: b, cron: 'every night'}\n")
    with pytest.raises(ConfigError, match=r"deploy.schedules\[1\] \(b\): cron 'every night'"):
        build_deployments(load_config(config), str(config))


def test_a_run_form_reads_only_under_the_source_roots_and_configs_from_the_configs_folder(tmp_path, monkeypatch):
    """A Run form (or the API behind it) is someone else: its sources, its config file and a symlink planted in
    an allowed folder are checked before anything is read."""
    from kbflow.ops.deploy import IngestRequest
    from kbflow.flows.ingest_request import ingest_request
    from kbflow.core.trust import SourceRefused

    configs, docs, private = tmp_path / "configs", tmp_path / "docs", tmp_path / "private"
    for folder in (configs, docs, private):
        folder.mkdir()
    (docs / "tea.md").write_text("# Tea\n\nGreen tea is brewed at 80 degrees.\n")
    (private / "notes.md").write_text("# Notes\n\nthe launch code is swordfish-4471\n")
    (docs / "planted.md").symlink_to(private / "notes.md")
    monkeypatch.setenv("KBFLOW_CONFIGS_DIR", str(configs))
    (configs / "team.yaml").write_text(f"data_dir: {tmp_path / 'data'}\nsources: [{docs}]\n"
                                       "embedder: {backend: local}\n")
    (tmp_path / "elsewhere.yaml").write_text(f"data_dir: {tmp_path / 'data'}\nsources: [{private}]\n")

    for sources in ([str(private)], [str(private / "notes.md")], [str(docs / ".." / "private")], ["/etc"]):
        with pytest.raises(SourceRefused, match="deploy.source_roots"):
            ingest_request(IngestRequest(namespace="team", sources=sources, config="team"))
    with pytest.raises(SourceRefused, match="configs folder"):
        ingest_request(IngestRequest(namespace="team", config=str(tmp_path / "elsewhere.yaml")))
    assert not (tmp_path / "data" / "state" / "team").exists()  # refused before anything was read or written

    from kbflow.flows.ingest_request import DocumentsFailed

    with pytest.raises(DocumentsFailed, match="1 failure"):  # the planted link: a failure, never read
        ingest_request(IngestRequest(namespace="team", config="team"))
    assert api.stats("team", configs / "team.yaml")["documents"] == 1
    hits = api.search("launch code", "team", config=configs / "team.yaml", limit=10)
    assert all("swordfish" not in hit.text for hit in hits)
