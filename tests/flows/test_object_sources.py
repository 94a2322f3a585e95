"""Sources in object storage (issue 19.1): `kbflow ingest s3://bucket/prefix/` against a real S3 endpoint on
127.0.0.1 (moto's server, started here on a free port) through the real clients (s3fs/botocore, boto3 to set up),
with credentials and endpoint from the standard AWS environment variables."""

from __future__ import annotations

import io
import zipfile

import pytest

from kbflow import api
from kbflow.config import ConvertConfig
from kbflow.convert.scan import scan
from kbflow.core.errors import ConfigError
from tests.conftest import CASES
from tests.flows.conftest import _free_port, store_of

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")


def _tree(root) -> dict[str, bytes]:
    """The documents both sides hold: the case docs, a subfolder, an excluded folder, and a ZIP of two notes."""
    files = {f"docs/{path.name}": path.read_bytes() for path in sorted((CASES / "docs").iterdir())}
    files["docs/guides/nested.md"] = b"# Nested\n\nA guide one folder down, about vacuum and autovacuum.\n"
    files["docs/.git/config"] = b"[core]\n"  # excluded by the default convert.exclude, as locally
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("notes/a.md", "# A\n\nArchived note about WAL archiving.\n")
        zipped.writestr("notes/b.txt", "Archived plain text about replication slots.\n")
    files["docs/archive.zip"] = archive.getvalue()
    return files


def _upload(client, bucket, files: dict[str, bytes], prefix: str = "") -> None:
    for key, data in files.items():
        client.put_object(Bucket=bucket, Key=prefix + key, Body=data)


def _write_local(root, files: dict[str, bytes]):
    for key, data in files.items():
        target = root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root / "docs"


def _identity(sources):
    return [(s.source_path, s.doc_id, s.source_sha256, s.size, s.mime, s.member, s.unreadable) for s in sources]


def test_an_s3_prefix_scans_like_the_same_local_folder(s3, tmp_path):
    client, bucket = s3
    files = _tree(tmp_path)
    _upload(client, bucket, files, prefix="team/")
    local = _write_local(tmp_path / "local", files)
    options = ConvertConfig()
    remote = scan([f"s3://{bucket}/team/docs/"], "ns", options.include, options.exclude)
    assert _identity(remote) == _identity(scan([local], "ns", options.include, options.exclude))
    paths = [s.source_path for s in remote]
    assert "docs/guides/nested.md" in paths and "docs/archive.zip!/notes/a.md" in paths
    assert not any(".git" in path for path in paths)
    assert all(s.abs_path.startswith(f"s3://{bucket}/team/docs/") for s in remote)
    assert all(s.mtime > 0 for s in remote)


def test_ingest_from_s3_is_incremental_and_stores_what_a_local_ingest_stores(s3, tmp_path, counting):
    client, bucket = s3
    files = _tree(tmp_path)
    _upload(client, bucket, files)
    url = f"s3://{bucket}/docs"
    first = api.ingest([url], data_dir=tmp_path / "data")
    assert first["documents"]["failed"] == 0 and first["documents"]["new"] == 7  # 4 cases + nested + 2 members
    api.ingest([str(_write_local(tmp_path / "local", files))], data_dir=tmp_path / "local-data")
    columns = ["chunk_id", "doc_id", "source_path", "text", "embed_sha256"]
    assert store_of(tmp_path / "data").rows(columns).to_pylist() == \
        store_of(tmp_path / "local-data").rows(columns).to_pylist()

    counting.texts_embedded = 0
    again = api.ingest([url], data_dir=tmp_path / "data")
    assert again["documents"] == {"new": 0, "changed": 0, "same_text": 0, "unchanged": 7, "removed": 0, "failed": 0}
    assert counting.texts_embedded == 0

    edited = files["docs/backups.md"].replace(b"Keep seven daily backups", b"Keep ten daily backups")
    assert edited != files["docs/backups.md"]
    client.put_object(Bucket=bucket, Key="docs/backups.md", Body=edited)
    client.delete_object(Bucket=bucket, Key="docs/search.md")
    update = api.ingest([url], data_dir=tmp_path / "data")
    assert update["documents"] == {"new": 0, "changed": 1, "same_text": 0, "unchanged": 5, "removed": 1, "failed": 0}
    assert counting.texts_embedded == 1
    texts = store_of(tmp_path / "data").rows(["source_path", "text"]).to_pylist()
    assert any("ten daily" in row["text"] for row in texts) and not any("seven daily" in row["text"] for row in texts)
    assert not any(row["source_path"] == "docs/search.md" for row in texts)


def test_an_s3_url_with_nothing_under_it_is_refused_not_read_as_everything_deleted(s3, tmp_path, counting):
    client, bucket = s3
    _upload(client, bucket, _tree(tmp_path))
    api.ingest([f"s3://{bucket}/docs/"], data_dir=tmp_path / "data")
    with pytest.raises(ConfigError, match="holds no objects"):
        api.ingest([f"s3://{bucket}/dcos/"], data_dir=tmp_path / "data")
    assert store_of(tmp_path / "data").rows(["doc_id"]).num_rows > 0


def test_kbflow_convert_reads_an_s3_prefix(s3, tmp_path):
    from typer.testing import CliRunner

    from kbflow.cli.main import app

    client, bucket = s3
    _upload(client, bucket, _tree(tmp_path))
    result = CliRunner().invoke(app, ["convert", f"s3://{bucket}/docs/", "--out", str(tmp_path / "md"), "--json"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "md" / "docs" / "guides" / "nested.md.md").read_text().startswith("# Nested")


def test_an_unreachable_store_keeps_its_documents_and_records_why(tmp_path, monkeypatch):
    """The store goes down between two runs: nothing is removed, the run says why."""
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for name, value in {"AWS_ACCESS_KEY_ID": "kbflow-test-key", "AWS_SECRET_ACCESS_KEY": "kbflow-test-secret",
                        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_MAX_ATTEMPTS": "1"}.items():
        monkeypatch.setenv(name, value)
    try:
        client = boto3.client("s3")
        client.create_bucket(Bucket="going-down")
        _upload(client, "going-down", _tree(tmp_path))
        first = api.ingest(["s3://going-down/docs/"], data_dir=tmp_path / "data")
    finally:
        server.stop()
    # a stopped werkzeug server may still answer on a kept-alive connection: the next run is as a fresh process's
    # (no cached client, so no open connection) against the endpoint, where nothing listens any more
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    stored = store_of(tmp_path / "data").rows(["chunk_id", "text"]).to_pylist()
    summary = api.ingest(["s3://going-down/docs/"], data_dir=tmp_path / "data")
    assert summary["documents"] == {"new": 0, "changed": 0, "same_text": 0, "unchanged": 0, "removed": 0, "failed": 0}
    [failure] = summary["failures"]
    assert (failure["stage"], failure["error_type"], failure["source_path"]) == ("scan", "UnreadableFolder", "docs")
    assert f"its {first['documents']['new']} stored documents are kept" in failure["message"]
    assert "kbflow-test-secret" not in str(summary)
    assert store_of(tmp_path / "data").rows(["chunk_id", "text"]).to_pylist() == stored
