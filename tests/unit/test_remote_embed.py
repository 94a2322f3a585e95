"""DashScope and OpenAI-compatible backends against a real HTTP server on 127.0.0.1 (kbflow.testing.fake_services)."""

from __future__ import annotations

import numpy as np
import pytest

from kbflow.config.embedders import embedder_config
from kbflow.embed.ratelimit import RateLimiter
from kbflow.embed.registry import build_embedder
from kbflow.core.http import parse_retry_after
from kbflow.core.errors import AuthError, ConfigError, EmbeddingError, PermanentError, TransientError
from kbflow.testing.fake_services import FakeServices, text_vector

KEY = "sk-test-secret"


@pytest.fixture
def server():
    with FakeServices(key=KEY, max_batch=10, dimension=64, slow_s=2.5) as running:  # "slow": past the 1 s timeout
        yield running


TEST_KEY = {"api_key_env": "KBFLOW_TEST_KEY"}


def make(kind: str, server: FakeServices, monkeypatch, connection: dict | None = None, **extra):
    monkeypatch.setenv("KBFLOW_TEST_KEY", KEY)
    path = "/api/v1" if kind == "dashscope" else "/v1"
    link = {"base_url": server.url + path, "api_key_env": "KBFLOW_TEST_KEY", "timeout_s": 1.0, **(connection or {})}
    if kind == "dashscope":
        config = embedder_config(backend="dashscope", model="text-embedding-v4", dimension=64, connection=link, **extra)
    else:
        config = embedder_config(backend="openai", model="bge-m3", dimension=64, max_batch=10, connection=link,
                                 **extra)
    return build_embedder(config)


BOTH = pytest.mark.parametrize("kind", ["dashscope", "openai"])


@BOTH
def test_batches_capped_ordered_and_normalised(kind, server, monkeypatch):
    embedder = make(kind, server, monkeypatch)
    texts = [f"text number {i}" for i in range(25)]
    vectors = embedder.embed_documents(texts)
    assert vectors.shape == (25, 64)
    assert [len(r["texts"]) for r in server.requests] == [10, 10, 5]  # never over the provider's 10
    # the server answers in reverse order: the client must put each vector back at its text's index
    assert np.allclose(vectors, np.array([text_vector(t, 64) for t in texts]), atol=1e-6)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert KEY not in embedder.model_id


def test_dashscope_query_and_passage_are_marked(server, monkeypatch):
    embedder = make("dashscope", server, monkeypatch)
    embedder.embed_query("what is MVCC")
    embedder.embed_documents(["MVCC keeps old row versions"])
    assert [r["body"]["parameters"]["text_type"] for r in server.requests] == ["query", "document"]
    assert server.requests[0]["body"]["parameters"]["dimension"] == 64
    assert "text_type" in embedder.model_id


def test_openai_prefixes_are_sent_and_in_the_model_id(server, monkeypatch):
    embedder = make("openai", server, monkeypatch, query_prefix="query: ", passage_prefix="passage: ")
    embedder.embed_query("what is MVCC")
    embedder.embed_passages(["MVCC keeps old row versions"])
    assert [r["texts"][0] for r in server.requests] == ["query: what is MVCC", "passage: MVCC keeps old row versions"]
    assert "'query: '" in embedder.model_id and "'passage: '" in embedder.model_id


@BOTH
def test_429_is_transient_with_retry_after(kind, server, monkeypatch):
    server.script = ["429"]
    embedder = make(kind, server, monkeypatch, {"retries": 0})
    with pytest.raises(TransientError) as caught:
        embedder.embed_documents(["a"])
    assert caught.value.retry_after == 1.0
    assert "429" in str(caught.value)


@BOTH
def test_a_throttled_request_is_sent_again_after_retry_after(kind, server, monkeypatch):
    server.script = ["429", "429"]
    embedder = make(kind, server, monkeypatch, {"retries": 3, "retry_backoff_s": 0.01})
    vectors = embedder.embed_documents(["a", "b"])
    assert vectors.shape == (2, 64)
    times = [request["at"] for request in server.requests]
    assert len(times) == 3 and embedder.requests_sent == 3 and embedder.retries == 2  # counted at the server
    assert all(later - earlier >= 1.0 for earlier, later in zip(times, times[1:]))  # Retry-After: 1, twice
    assert server.served == {"a": 1, "b": 1}


@BOTH
@pytest.mark.parametrize("behaviour", ["500", "slow"])
def test_server_error_and_timeout_are_transient(kind, behaviour, server, monkeypatch):
    server.script = [behaviour]
    embedder = make(kind, server, monkeypatch, {"retries": 0})
    with pytest.raises(TransientError):
        embedder.embed_documents(["a"])
    assert embedder.embed_documents(["a"]).shape == (1, 64)  # the next attempt goes through


@BOTH
def test_retries_stop_at_the_time_budget(kind, server, monkeypatch):
    server.script = ["500"] * 50  # a server down for longer than the budget
    embedder = make(kind, server, monkeypatch, {"retries": 50, "retry_backoff_s": 0.2, "retry_budget_s": 1.0})
    with pytest.raises(TransientError):
        embedder.embed_documents(["a"])
    times = [request["at"] for request in server.requests]
    assert 2 <= len(times) < 10 and times[-1] - times[0] <= 1.0  # no try starts after the budget


@BOTH
def test_bad_key_is_permanent_and_never_echoed(kind, server, monkeypatch):
    embedder = make(kind, server, monkeypatch)
    server.key = "sk-the-right-one"
    with pytest.raises(AuthError) as caught:
        embedder.embed_documents(["a"])
    assert len(server.requests) == 1  # a refused key is not retried
    assert "API key" in str(caught.value) and KEY not in str(caught.value)


@BOTH
def test_batch_over_the_servers_limit_is_permanent(kind, server, monkeypatch):
    server.max_batch = 3
    embedder = make(kind, server, monkeypatch)
    with pytest.raises(PermanentError, match="larger than 3"):
        embedder.embed_documents([f"t{i}" for i in range(5)])


@BOTH
def test_wrong_dimension_reply_is_refused(kind, server, monkeypatch):
    server.response_dimension = 32
    embedder = make(kind, server, monkeypatch)
    with pytest.raises(EmbeddingError, match="dimension"):
        embedder.embed_documents(["a", "b"])


def test_config_errors_name_the_fix(server, monkeypatch):
    monkeypatch.delenv("KBFLOW_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="KBFLOW_NO_SUCH_KEY"):
        build_embedder(embedder_config(backend="dashscope", connection={"api_key_env": "KBFLOW_NO_SUCH_KEY"}))
    monkeypatch.setenv("KBFLOW_TEST_KEY", KEY)
    with pytest.raises(ConfigError, match="limit of 10"):
        build_embedder(embedder_config(backend="dashscope", connection=TEST_KEY, max_batch=64))
    with pytest.raises(ConfigError, match="not offered"):
        build_embedder(embedder_config(backend="dashscope", connection=TEST_KEY, model="text-embedding-v3",
                                       dimension=2048))
    with pytest.raises(ConfigError, match="embedder.dimension"):
        build_embedder(embedder_config(backend="openai", model="m", connection={"base_url": server.url + "/v1"}))


def test_retry_after_forms():
    assert parse_retry_after("7") == 7.0
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert 0 <= parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") < 1  # a date in the past: no wait


def test_rate_limiter_spreads_requests_and_tokens():
    now = [0.0]
    sleeps: list[float] = []

    def sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    limiter = RateLimiter(requests_per_minute=60, tokens_per_minute=600, clock=lambda: now[0], sleep=sleep)
    assert limiter.acquire(5) == 0  # the first request passes at once
    limiter.acquire(5)  # one request per second
    assert now[0] == pytest.approx(1.0)
    limiter.acquire(30)  # next request slot at t=2; 30 tokens need a full bucket (10 tokens) and leave it at -20
    assert now[0] == pytest.approx(2.0)
    limiter.acquire(1)  # 10 tokens/s: from -20 to 1 takes 2.1 s
    assert now[0] == pytest.approx(4.1, abs=0.01)
    assert limiter.waited_s == pytest.approx(sum(sleeps))


def test_dashscope_requests_go_where_the_sdk_variable_points_unless_the_config_says(server, monkeypatch):
    monkeypatch.setenv("KBFLOW_TEST_KEY", KEY)
    monkeypatch.setenv("DASHSCOPE_HTTP_BASE_URL", server.url + "/api/v1")  # a proxy or regional endpoint
    embedder = build_embedder(embedder_config(backend="dashscope", model="text-embedding-v4", dimension=64,
                                              connection={**TEST_KEY, "timeout_s": 2.0}))
    assert embedder.embed_documents(["via the environment"]).shape == (1, 64)
    assert server.requests[-1]["texts"] == ["via the environment"]
    # the config's own endpoint wins over the variable
    with FakeServices(key=KEY) as other:
        chosen = build_embedder(embedder_config(backend="dashscope", model="text-embedding-v4", dimension=64,
                                                connection={**TEST_KEY, "base_url": other.url, "timeout_s": 2.0}))
        chosen.embed_documents(["via the config"])
        assert other.requests[-1]["path"].startswith("/api/v1/") and len(server.requests) == 1
    monkeypatch.delenv("DASHSCOPE_HTTP_BASE_URL")
    assert build_embedder(embedder_config(backend="dashscope", connection=TEST_KEY)).base_url == \
        "https://dashscope.aliyuncs.com/api/v1"
