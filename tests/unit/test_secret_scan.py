"""Credentials are held back at conversion: planted keys of each kind caught, examples and prose not, the
secret itself never in a message, a row or a snapshot."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from kbflow import api
from kbflow.config import ConvertConfig
from kbflow.convert.converters import convert_batch
from kbflow.convert.scan import scan
from kbflow.convert.secrets import find_secrets

# built at run time, so that no scanner flags this test file itself
AWS_ID = "AKIA" + "4Q7XK2P9WJ3LM8RT"
AWS_SECRET = "q3N8vXr2Lk9Pz7Tb" + "1Wc5Hd4Jf6Mg0Ys8Ua2Ee9Ri"
PLANTED = {
    "AWS Access Key": f"[default]\naws_access_key_id = {AWS_ID}\n",
    "AWS Secret Access Key": f"[default]\naws_secret_access_key = {AWS_SECRET}\n",
    "Private Key": "-----BEGIN " + "OPENSSH PRIVATE KEY-----\n" + "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n",
    "GitHub Token": "token: ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5\n",
    "Slack Token": "SLACK=xoxb-" + "123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx\n",
    "Stripe Access Key": "stripe = sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc\n",
    "OpenAI Token": "OPENAI_API_KEY=sk-" + "proj-Ab3De5Gh7Jk9Lm1No3Pq5Rs7T3BlbkFJ" + "Uv9Wx1Yz3Ab5Cd7Ef9Gh1\n",
}
NOT_SECRETS = [
    "The AWS example key AKIAIOSFODNN7EXAMPLE is used throughout the AWS docs.",
    "A PEM file starts with -----BEGIN RSA PRIVATE KEY----- followed by base64 lines.",
    "Connect with postgresql://user:secret@localhost/otherdb?connect_timeout=10",
    "Set api_key = <your key here> in the file.",
    "The token is a random string such as xxxxxxxxxxxxxxxxxxxxxxxx.",
]


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_a_planted_key_of_each_kind_is_found_with_its_line(rule):
    text = "# Notes\n\nsome prose\n" + PLANTED[rule]
    found = find_secrets(text)
    assert rule in {finding.rule for finding in found}, found
    assert min(finding.line for finding in found if finding.rule == rule) >= 4


def test_examples_and_prose_are_not_hits():
    assert find_secrets("\n".join(NOT_SECRETS)) == []


def test_a_file_with_a_secret_is_a_failure_that_names_the_rule_and_line_never_the_secret(tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "credentials.ini").write_text(PLANTED["AWS Access Key"] + PLANTED["AWS Secret Access Key"])
    (folder / "fine.md").write_text("# Fine\n\nNothing secret here.\n")
    rows = {row["source_path"]: row for row in convert_batch(scan([str(folder)], "ns", ["*"], []),
                                                             ConvertConfig()).to_pylist()}
    bad = rows["docs/credentials.ini"]
    assert bad["status"] == "failed" and bad["markdown"] is None
    assert "AWS Access Key on line" in bad["error"] and "secret_scan_allow" in bad["error"]
    assert AWS_ID not in bad["error"] and AWS_SECRET not in bad["error"]
    assert rows["docs/fine.md"]["status"] == "ok"
    allowed = convert_batch(scan([str(folder)], "ns", ["*"], []),
                            ConvertConfig(secret_scan_allow=["docs/cred*"])).to_pylist()
    assert all(row["status"] == "ok" for row in allowed)
    off = convert_batch(scan([str(folder)], "ns", ["*"], []), ConvertConfig(secret_scan=False)).to_pylist()
    assert all(row["status"] == "ok" for row in off)


def test_an_ingest_keeps_the_secret_out_of_the_store_and_every_snapshot(tmp_path, real_embedder):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "deploy.md").write_text("# Deploy\n\nUse the key below.\n\n" + PLANTED["GitHub Token"])
    (folder / "guide.md").write_text("# Guide\n\nBrew tea at 80 degrees.\n")
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nembedder:\n  backend: local\n")
    summary = api.ingest([str(folder)], config=config)
    assert summary["documents"]["failed"] == 1 and summary["store"]["count"] >= 1
    (failure,) = summary["failures"]
    assert failure["source_path"] == "docs/deploy.md" and "GitHub Token on line" in failure["message"]
    token = PLANTED["GitHub Token"].split()[1]
    parquets, records = list((tmp_path / "data").rglob("*.parquet")), list((tmp_path / "data").rglob("*.json"))
    assert len(parquets) > 3 and records  # snapshots, manifest, run records: the checks below read something
    for parquet in parquets:
        assert token not in str(pq.read_table(parquet).to_pylist()), parquet
    assert not any(token in path.read_text(errors="ignore") for path in records)
    assert all(hit.source_path != "docs/deploy.md" for hit in api.search("key", config=config, limit=10))


def test_a_conversion_cached_while_the_scan_was_off_is_scanned_when_it_is_served(tmp_path):
    """Fresh conversions are scanned where they are made (a conversion worker); one served from the conversion
    cache is scanned as it is served, since the scan may have been off, or its rules older, when it was cached."""
    from kbflow.convert.cache import ConversionCache

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "deploy.md").write_text("# Deploy\n\n" + PLANTED["GitHub Token"])
    sources = scan([folder], "ns", ["*"], [])
    cache = ConversionCache(tmp_path / "cache")
    assert convert_batch(sources, ConvertConfig(secret_scan=False), cache).column("status").to_pylist() == ["ok"]
    rows = convert_batch(sources, ConvertConfig(), cache).to_pylist()
    assert [(row["status"], row["markdown"]) for row in rows] == [("failed", None)]
    assert "GitHub Token" in rows[0]["error"]


def test_a_document_stored_before_the_scan_leaves_the_store_when_it_is_scanned(tmp_path, real_embedder):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "deploy.md").write_text("# Deploy\n\nUse the key below.\n\n" + PLANTED["Slack Token"])
    (folder / "guide.md").write_text("# Guide\n\nBrew tea at 80 degrees.\n")
    unscanned = tmp_path / "off.yaml"
    unscanned.write_text(f"data_dir: {tmp_path / 'data'}\nembedder:\n  backend: local\nconvert:\n  secret_scan: false\n")
    assert api.ingest([str(folder)], config=unscanned)["documents"]["new"] == 2
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nembedder:\n  backend: local\n")
    summary = api.ingest([str(folder)], config=config, force=True)
    assert summary["documents"]["failed"] == 1 and summary["chunks"]["deleted"] >= 1
    assert api.stats(config=config)["documents"] == 1
    token = PLANTED["Slack Token"].split("=", 1)[1].strip()
    assert all(token not in hit.text for hit in api.search("key", config=config, limit=10))


def test_a_text_added_with_a_secret_is_refused_like_a_file(tmp_path, real_embedder):
    config = tmp_path / "kb.yaml"
    config.write_text(f"data_dir: {tmp_path / 'data'}\nembedder:\n  backend: local\n")
    summary = api.add_text("Deploy with " + PLANTED["GitHub Token"], "deploy-note", config=config)
    assert summary["documents"]["failed"] == 1 and "GitHub Token on line 1" in summary["failures"][0]["message"]
    assert "ghp_" not in str(summary)
    assert api.add_text("Brew tea at 80 degrees.", "tea", config=config)["documents"]["new"] == 1
