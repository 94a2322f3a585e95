"""Rerankers and the chat client: a real tiny CrossEncoder, and 127.0.0.1 servers speaking DashScope's and
OpenAI's wire formats, faults included."""

import time

import numpy as np
import pytest

from kbflow.config import LlmConfig, RerankConfig
from kbflow.core.errors import ConfigError, PermanentError, TransientError
from kbflow.search import fusion
from kbflow.search.llm import ChatClient, LlmNotConfigured
from kbflow.search.rerank import CrossEncoderReranker, DashScopeReranker, get_reranker
from kbflow.stores import Hit
from kbflow.testing.fake_services import FakeServices, overlap_score

PASSAGES = ["备份数据库的命令是 pg_dump", "the tar archive format", "恢复时先停止服务器", "ssh remote login"]


@pytest.fixture
def service():
    with FakeServices(key="test-key") as running:
        yield running


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory):
    """A randomly initialised one-layer BERT cross-encoder (no reranker can be downloaded here), saved to disk."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from kbflow.embed.local import packaged_model_dir

    folder = tmp_path_factory.mktemp("cross-encoder")
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_model_dir()))
    torch.manual_seed(7)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_cross_encoder_scores_and_order_follow_the_model(tiny_cross_encoder):
    from sentence_transformers import CrossEncoder

    reranker = get_reranker(RerankConfig(model_path=str(tiny_cross_encoder)))
    assert isinstance(reranker, CrossEncoderReranker)
    query = "如何备份数据库"
    scores = reranker.scores(query, PASSAGES)
    direct = CrossEncoder(str(tiny_cross_encoder), local_files_only=True).predict([(query, p) for p in PASSAGES])
    assert np.allclose(scores, direct, atol=1e-6) and len(set(np.round(scores, 6))) == len(PASSAGES)
    from kbflow.search.searcher import Searcher

    hits = [Hit(f"c{i}", "d", "s.md", [], 1.0 - i / 10, text) for i, text in enumerate(PASSAGES)]
    searcher = Searcher.__new__(Searcher)
    searcher._reranker = reranker
    ranked = searcher.rerank(query, hits)
    assert [h.text for h in ranked] == [PASSAGES[i] for i in np.argsort(-np.asarray(direct))]
    assert [h.extra["fused"] for h in ranked] == [1.0 - int(h.chunk_id[1:]) / 10 for h in ranked]


def test_rerank_without_a_model_names_the_setting():
    with pytest.raises(ConfigError, match="search.rerank.model_path"):
        get_reranker(RerankConfig())
    with pytest.raises(ConfigError, match="not a model folder"):
        get_reranker(RerankConfig(model_path="/nonexistent"))


def dashscope(service, monkeypatch, **overrides):
    monkeypatch.setenv("DASHSCOPE_API_KEY", service.key)
    config = RerankConfig(kind="dashscope", connection={"base_url": service.url, "timeout_s": 1.0, **overrides})
    return get_reranker(config)


def test_dashscope_scores_map_back_to_passages(service, monkeypatch):
    reranker = dashscope(service, monkeypatch)
    assert isinstance(reranker, DashScopeReranker)
    query = "备份 数据库 pg_dump"
    assert reranker.scores(query, PASSAGES) == [overlap_score(query, p) for p in PASSAGES]
    body = service.requests[-1]["body"]
    assert body["model"] == "gte-rerank-v2" and body["input"] == {"query": query, "documents": PASSAGES}


def test_dashscope_batches_over_500_documents(service, monkeypatch):
    reranker = dashscope(service, monkeypatch)
    passages = [f"doc {i} {'tar' if i % 7 == 0 else 'zip'}" for i in range(1203)]
    scores = reranker.scores("tar", passages)
    assert [len(r["body"]["input"]["documents"]) for r in service.requests] == [500, 500, 203]
    assert scores == [overlap_score("tar", p) for p in passages]


def test_dashscope_retries_429_and_5xx_honouring_retry_after(service, monkeypatch):
    reranker = dashscope(service, monkeypatch, retries=3)
    service.script = [(429, 0.3), (503,)]
    started = time.perf_counter()
    assert reranker.scores("tar", PASSAGES) == [overlap_score("tar", p) for p in PASSAGES]
    assert time.perf_counter() - started >= 0.3 and len(service.requests) == 3


def test_dashscope_gives_up_after_retries_and_on_timeouts(service, monkeypatch):
    reranker = dashscope(service, monkeypatch, retries=1)
    service.script = [(500,), (500,)]
    with pytest.raises(TransientError, match="500 InternalError"):
        reranker.scores("tar", PASSAGES)
    service.script = [("sleep", 1.5), ("sleep", 1.5)]
    with pytest.raises(TransientError, match="timeout"):
        reranker.scores("tar", PASSAGES)


def test_dashscope_bad_key_fails_at_once_without_leaking_it(service, monkeypatch):
    monkeypatch.setenv("DASHSCOPE_API_KEY", "sk-wrong-secret")
    reranker = get_reranker(RerankConfig(kind="dashscope", connection={"base_url": service.url, "retries": 3}))
    with pytest.raises(PermanentError, match="DASHSCOPE_API_KEY") as caught:
        reranker.scores("tar", PASSAGES)
    assert "sk-wrong-secret" not in str(caught.value) and "InvalidApiKey" in str(caught.value)
    assert len(service.requests) == 1
    monkeypatch.delenv("DASHSCOPE_API_KEY")
    with pytest.raises(ConfigError, match="DASHSCOPE_API_KEY"):
        get_reranker(RerankConfig(kind="dashscope"))


def chat_client(service, monkeypatch, connection=None, **overrides):
    monkeypatch.setenv("OPENAI_BASE_URL", service.url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", service.key)
    return ChatClient(LlmConfig(connection={"timeout_s": 1.0, **(connection or {})}, **overrides))


def test_chat_client_speaks_openai_chat_completions(service, monkeypatch):
    service.chat_responder = lambda messages: f"echo: {messages[-1]['content']}"
    client = chat_client(service, monkeypatch, model="qwen-plus")
    assert client.complete([{"role": "user", "content": "你好"}]) == "echo: 你好"
    body = service.requests[-1]["body"]
    assert body["model"] == "qwen-plus" and body["messages"] == [{"role": "user", "content": "你好"}]
    assert body["temperature"] == 0.0 and body["max_tokens"] == 800


def test_chat_client_faults(service, monkeypatch):
    client = chat_client(service, monkeypatch, connection={"retries": 2})
    service.script = [(429, 0), (502,)]
    assert client.complete([{"role": "user", "content": "x"}]) == "ok"
    service.script = [(400,)]
    with pytest.raises(PermanentError, match="400"):
        client.complete([{"role": "user", "content": "x"}])
    service.chat_responder = lambda messages: "   "
    with pytest.raises(PermanentError, match="empty answer"):
        client.complete([{"role": "user", "content": "x"}])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-bad-secret")
    with pytest.raises(PermanentError, match="OPENAI_API_KEY") as caught:
        ChatClient(LlmConfig(connection={"retries": 3})).complete([{"role": "user", "content": "x"}])
    assert "sk-bad-secret" not in str(caught.value)


def test_no_llm_configured_names_the_variables(monkeypatch):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(LlmNotConfigured, match="OPENAI_BASE_URL and OPENAI_API_KEY"):
        ChatClient(LlmConfig())


def test_rrf_and_weighted_fusion_arithmetic():
    def hits(*pairs):
        return [Hit(cid, "d", "s", [], score, cid) for cid, score in pairs]

    lists = {"vector": hits(("a", 0.9), ("b", 0.8), ("c", 0.1)), "bm25": hits(("c", 12.0), ("a", 3.0))}
    fused = fusion.rrf(lists, k=60)
    assert [h.chunk_id for h in fused] == ["a", "c", "b"]
    assert fused[0].score == pytest.approx(1 / 61 + 1 / 62) and fused[2].score == pytest.approx(1 / 62)
    assert fused[0].extra == {"vector": 0.9, "vector_rank": 1, "bm25": 3.0, "bm25_rank": 2}
    weighted = fusion.weighted(lists, {"vector": 0.5, "bm25": 0.5})
    scores = {h.chunk_id: h.score for h in weighted}
    assert scores == pytest.approx({"a": 0.5, "b": 0.5 * 0.875, "c": 0.5})
    assert fusion.min_max([2.0, 2.0]) == [1.0, 1.0]


def test_the_connection_base_url_wins_over_the_variable(service, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")  # nothing listens there
    monkeypatch.setenv("KBFLOW_TEST_CHAT_KEY", service.key)
    service.chat_responder = lambda messages: "from the configured endpoint"
    client = ChatClient(LlmConfig(connection={"base_url": service.url + "/v1", "api_key_env": "KBFLOW_TEST_CHAT_KEY"}))
    assert client.complete([{"role": "user", "content": "x"}]) == "from the configured endpoint"
    assert service.requests[-1]["auth"] == f"Bearer {service.key}"
