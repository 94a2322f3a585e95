"""`ask --agentic` (issue 21.3): the round logic, driven by scripted replies of a real OpenAI-compatible HTTP server
on 127.0.0.1 (kbflow.testing.fake_services), over a real ingest of tests/cases/docs; and once end to end with a real
GGUF model run in-process by llama.cpp (the tiny model of tests/tiny_gguf.py, whose every reply is "OK [1]")."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from kbflow import KnowledgeBase
from kbflow.testing.fake_services import FakeServices
from kbflow.core.errors import ConfigError
from tests.conftest import CASES


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    root = tmp_path_factory.mktemp("agentic")
    shutil.copytree(CASES / "docs", root / "docs")
    config_file = root / "kb.yaml"
    config_file.write_text(yaml.safe_dump({"data_dir": str(root / "data")}))
    kb = KnowledgeBase(namespace="docs", config=config_file)
    assert kb.add_document(root / "docs")["documents"]["failed"] == 0
    return kb


@pytest.fixture(scope="module")
def llm():
    """One server for the module: the knowledge base keeps its chat client (and so the server's URL)."""
    with FakeServices(key="test-key") as service, pytest.MonkeyPatch.context() as patch:
        patch.setenv("OPENAI_BASE_URL", service.url + "/v1")
        patch.setenv("OPENAI_API_KEY", service.key)
        yield service


def script(plan: dict | str, checks: list[dict | str], answer: str = "Stop the server and copy the files [1]."):
    """A responder: the plan reply, then one check reply per round, then the answer; it records every prompt."""
    seen: list[tuple[str, str]] = []
    queue = list(checks)

    def respond(messages):
        system, user = messages[0]["content"], messages[-1]["content"]
        if system.startswith("You plan searches"):
            seen.append(("plan", user))
            return plan if isinstance(plan, str) else json.dumps(plan)
        if system.startswith("You decide whether"):
            seen.append(("check", user))
            reply = queue.pop(0)
            return reply if isinstance(reply, str) else "Here it is:\n```json\n" + json.dumps(reply) + "\n```"
        seen.append(("answer", user))
        return answer

    return respond, seen


def _searches(result) -> list[list[str]]:
    return [[s["query"] for s in step["searches"]] for step in result["trace"] if step["step"] == "search"]


def test_a_simple_question_is_one_round_that_holds_plain_asks_evidence(kb, llm):
    llm.chat_responder, seen = script({"clear": True, "strategy": "single", "queries": ["restore backup"]},
                                      [{"decision": "done"}])
    result = kb.ask("How do I restore a backup?", agentic=True)
    assert result["strategy"] == "single" and _searches(result) == [["How do I restore a backup?", "restore backup"]]
    assert [kind for kind, _ in seen] == ["plan", "check", "answer"]
    assert result["sources"][0]["source_path"] == "docs/backups.md" and result["cited"] == [1]
    assert "[1] docs/backups.md" in seen[1][1]  # the check saw the evidence, cut to snippets
    assert result["planner"]["calls"] == 2 and result["planner"]["prompt_tokens"] > 0
    plain = kb.ask("How do I restore a backup?")  # plain ask: no trace, the same answer path
    assert "trace" not in plain and plain["cited"] == [1]
    agentic_ids = {source["chunk_id"] for source in result["sources"]}
    assert {source["chunk_id"] for source in plain["sources"]} <= agentic_ids  # the rounds only add evidence


def test_a_comparison_searches_each_side_in_parallel_as_one_round(kb, llm):
    llm.chat_responder, _ = script({"clear": True, "strategy": "compare",
                                    "queries": ["backup retention", "search filters"]}, [{"decision": "done"}])
    result = kb.ask("How do backup retention and search filters differ?", agentic=True)
    step = [s for s in result["trace"] if s["step"] == "search"]
    question = "How do backup retention and search filters differ?"
    assert len(step) == 1 and step[0]["parallel"]
    assert _searches(result) == [[question, "backup retention", "search filters"]]
    first = [search["hits"][0]["chunk_id"] for search in step[0]["searches"]]  # each search's best hit...
    assert [source["chunk_id"] for source in result["sources"][:len(set(first))]] == list(dict.fromkeys(first))
    assert {s["source_path"] for s in result["sources"][:3]} == {"docs/backups.md", "docs/search.md"}  # ...first


def test_a_multi_hop_question_searches_again_for_what_the_first_round_found(kb, llm):
    llm.chat_responder, seen = script({"clear": True, "strategy": "multi_hop", "queries": ["backup every night"]},
                                      [{"decision": "next", "query": "check the logs after the restart"},
                                       {"decision": "done"}])
    result = kb.ask("What must I check after bringing back the nightly thing?", agentic=True)
    assert _searches(result) == [["What must I check after bringing back the nightly thing?", "backup every night"],
                                 ["check the logs after the restart"]]
    assert [kind for kind, _ in seen] == ["plan", "check", "check", "answer"]
    decisions = [s.get("decision") for s in result["trace"] if s["step"] == "check"]
    assert decisions == ["next", "done"]
    # the answer's sources: every search's best hit first, the last hop's included, then every search's second...
    searches = [search["hits"] for step in result["trace"] if step["step"] == "search" for search in step["searches"]]
    order = []
    for rank in range(max(len(hits) for hits in searches)):
        order += [hits[rank]["chunk_id"] for hits in searches if rank < len(hits)]
    assert [source["chunk_id"] for source in result["sources"]] == list(dict.fromkeys(order))  # at its best place
    assert searches[-1][0]["chunk_id"] in [source["chunk_id"] for source in result["sources"][:3]]


def test_nothing_useful_rewrites_the_query_and_the_rounds_are_bounded(kb, llm):
    llm.chat_responder, _ = script({"clear": False, "strategy": "single", "queries": ["zyx qwv"]},
                                   [{"decision": "rewrite", "query": "restore a backup"}, {"decision": "done"}])
    result = kb.ask("the thing with the files?", agentic=True)
    assert _searches(result) == [["the thing with the files?", "zyx qwv"], ["restore a backup"]]
    assert "unclear question" in result["trace"][0]["decision"]
    assert any(s.get("why") == "nothing useful found: the query rewritten" for s in result["trace"])

    bounded = KnowledgeBase(namespace="docs", config=kb.config.model_copy(
        update={"search": kb.config.search.model_copy(update={"agentic": kb.config.search.agentic.model_copy(
            update={"max_rounds": 2})})}))
    llm.chat_responder, seen = script({"strategy": "multi_hop", "queries": ["backups"]},
                                      [{"decision": "next", "query": f"hop {n}"} for n in range(5)])
    result = bounded.ask("a question that never ends", agentic=True)
    assert len(_searches(result)) == 2 and result["trace"][-1] == {
        "step": "stop", "why": "search.agentic.max_rounds (2) reached"}
    assert [kind for kind, _ in seen] == ["plan", "check", "answer"]

    tight = KnowledgeBase(namespace="docs", config=kb.config.model_copy(
        update={"search": kb.config.search.model_copy(update={"agentic": kb.config.search.agentic.model_copy(
            update={"max_planner_prompt_tokens": 500})})}))
    llm.chat_responder, seen = script({"strategy": "multi_hop", "queries": ["backups"]}, [])
    result = tight.ask("How do I restore a backup?", agentic=True)
    assert result["trace"][-1]["step"] == "stop" and "max_planner_prompt_tokens (500" in result["trace"][-1]["why"]
    assert [kind for kind, _ in seen] == ["plan", "answer"] and result["planner"]["prompt_tokens"] <= 500


def test_a_reply_that_is_not_the_json_asked_for_is_recorded_and_the_question_searched_as_it_is(kb, llm):
    llm.chat_responder, _ = script("I think you should search for backups.", ["no idea"])
    result = kb.ask("How do I restore a backup?", agentic=True)
    plan = result["trace"][0]
    assert plan["error"] == "the reply is not the JSON object asked for"
    assert plan["decision"] == "search the question as it is, in one round (no usable plan)"
    assert _searches(result) == [["How do I restore a backup?"]]
    assert result["trace"][-1]["decision"] == "done (no usable decision in the reply)"
    with pytest.raises(ConfigError, match="drop --expand"):
        kb.ask("How do I restore a backup?", agentic=True, expand="mqe")


def test_agentic_ask_end_to_end_with_a_gguf_model_in_process(kb, tmp_path):
    from tests.tiny_gguf import build

    model = build(tmp_path / "tiny.gguf")
    local = KnowledgeBase(namespace="docs", config=kb.config.model_copy(update={"search": kb.config.search.model_copy(
        update={"llm": kb.config.search.llm.model_copy(update={"kind": "local", "model_path": str(model),
                                                                "context_tokens": 2048, "max_tokens": 16})})}))
    result = local.ask("How do I restore a backup?", agentic=True)
    assert result["answer"].startswith("OK") and result["cited"] == [1]
    assert result["trace"][0]["error"] == "the reply is not the JSON object asked for"  # the tiny model says "OK"
    assert _searches(result) == [["How do I restore a backup?"]] and result["planner"]["calls"] == 2
    assert result["planner"]["prompt_tokens"] > 0  # counted by the model's own tokenizer
