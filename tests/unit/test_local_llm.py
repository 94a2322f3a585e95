"""`search.llm.kind: local`: a GGUF model run in-process by llama.cpp (xllamacpp). The model is built by the test
(tests/tiny_gguf.py: zero attention, one-hot embeddings, a greedy answer of "OK [1]"), so what is checked is the
wiring, not the answer: chat template, tokenizer counts, streaming, stops, packing sources into the window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kbflow import api
from kbflow.config import KbConfig, LlmConfig
from kbflow.core.errors import ConfigError, PermanentError
from kbflow.search.ask import build_messages
from kbflow.search.llm import LlmNotConfigured
from kbflow.search.local_llm import LocalChat
from tests.tiny_gguf import ANSWER, build


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_the_answer_streams_piece_by_piece_and_prompts_are_counted_by_the_models_tokenizer(model):
    chat = LocalChat(LlmConfig(kind="local", model_path=str(model), context_tokens=1024, max_tokens=32, threads=1))
    pieces: list[str] = []
    messages = [{"role": "user", "content": "How many backups?"}]
    assert chat.complete(messages, on_token=pieces.append) == ANSWER
    assert len(pieces) == len(ANSWER) and "".join(pieces) == ANSWER  # one byte-level token at a time
    # ChatML framing (three special tokens) + byte-level BPE: every other byte of the rendered prompt is one token
    plain = "user\nHow many backups?\nassistant\n"
    assert chat.count_tokens(messages) == 3 + len(plain.encode())
    assert chat.count_tokens([{"role": "user", "content": "数据库"}]) == \
        chat.count_tokens([{"role": "user", "content": "abc"}]) + 6  # 9 UTF-8 bytes against 3

    # 3 tokens is below what a config may ask (16): built unchecked, to reach the mid-answer stop with this model
    short = LocalChat(LlmConfig.model_construct(kind="local", model_path=str(model), context_tokens=1024,
                                                max_tokens=3, threads=1))
    with pytest.raises(PermanentError, match="stopped at search.llm.max_tokens"):
        short.complete(messages)


def test_a_missing_or_wrong_model_file_is_a_clear_error(tmp_path):
    with pytest.raises(LlmNotConfigured, match="model_path is empty"):
        LocalChat(LlmConfig(kind="local"))
    with pytest.raises(ConfigError, match="cannot be read"):
        LocalChat(LlmConfig(kind="local", model_path=str(tmp_path / "none.gguf")))
    (tmp_path / "model.bin").write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ConfigError, match="not a GGUF file"):
        LocalChat(LlmConfig(kind="local", model_path=str(tmp_path / "model.bin")))


def _kb(tmp_path: Path, model: Path, **llm) -> KbConfig:
    return KbConfig.model_validate({"data_dir": str(tmp_path / "data"), "embedder": {"backend": "local"},
                                    "search": {"llm": {"kind": "local", "model_path": str(model), "threads": 1,
                                                       "context_tokens": 1024, "max_tokens": 32, **llm}}})


def test_ask_packs_the_best_sources_into_the_window_and_keeps_the_citation_contract(tmp_path, model):
    config = _kb(tmp_path, model)
    for n in range(6):
        api.add_text(f"Backup note {n}: keep {n + 3} daily backups of the database and test a restore every "
                     f"week; copies older than {n + 10} days are removed by the nightly job on host db{n}.",
                     doc_id=f"note-{n}", config=config)
    result = api.ask("How many daily backups are kept?", config=config)
    assert result["answer"] == ANSWER and result["cited"] == [1] and result["unknown_citations"] == []
    given = len(result["sources"])
    assert 0 < given < 6 and result["sources_left_out"] == 6 - given  # the window held only some
    hits = api.search("How many daily backups are kept?", config=config, limit=6)
    chat = LocalChat(config.search.llm)
    question = "How many daily backups are kept?"
    budget = chat.window - config.search.llm.max_tokens
    assert [s["chunk_id"] for s in result["sources"]] == [h.chunk_id for h in hits[:given]]  # best first
    assert chat.count_tokens(build_messages(question, hits[:given])) <= budget
    assert chat.count_tokens(build_messages(question, hits[:given + 1])) > budget  # as many as fit

    with pytest.raises(ConfigError, match="raise search.llm.context_tokens"):
        api.ask(question, config=_kb(tmp_path, model, max_tokens=900))


def test_kbflow_ask_streams_a_local_answer_with_its_sources(tmp_path, model):
    config_file = tmp_path / "kb.yaml"
    config_file.write_text(yaml.safe_dump(_kb(tmp_path, model).model_dump(mode="json")))
    kbflow = str(Path(sys.executable).with_name("kbflow"))
    subprocess.run([kbflow, "add-text", "Keep seven daily backups.", "--doc-id", "b", "--config", str(config_file)],
                   check=True, capture_output=True, timeout=600)
    shown = subprocess.run([kbflow, "ask", "How many backups?", "--config", str(config_file)], capture_output=True,
                           text=True, timeout=600)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(ANSWER) and "[1] text:b" in shown.stdout
    as_json = subprocess.run([kbflow, "ask", "How many backups?", "--config", str(config_file), "--json"],
                             capture_output=True, text=True, timeout=600)
    assert json.loads(as_json.stdout)["answer"] == ANSWER


def test_bench_llm_measures_each_model_in_one_run_and_checks_arguments_first(tmp_path, model):
    from kbflow.bench.llm import bench_llm
    from tests.conftest import CASES

    # the test model reads bytes as tokens in a 2,048-token window: a short answer budget leaves room for sources
    config = KbConfig.model_validate({"embedder": {"backend": "local"}, "search": {"llm": {"max_tokens": 64}}})
    with pytest.raises(ConfigError, match="not a GGUF file"):  # before any ingest
        bench_llm(CASES / "docs", [CASES / "docs" / "backups.md"], tmp_path / "llm.json", config)
    result = bench_llm(CASES / "docs", [model], tmp_path / "llm.json", config, ["How are backups kept?"],
                       ["What is the boiling point of nitrogen?"], threads=1)
    run = result["models"]["tiny.gguf"]
    assert run["errors"] == 0 and run["answered_with_citation"] == 1 and run["unanswerable_said_unknown"] == 0
    first = run["runs"][0]
    assert first["answer"] == ANSWER and first["answer_tokens"] == len(ANSWER) + 1  # and the end-of-turn token
    assert first["prompt_tokens"] > 100 and first["generation_tokens_per_s"] > 0
    assert json.loads((tmp_path / "llm.json").read_text())["ingest"]["chunks"] > 0
    assert (tmp_path / "llm.png").is_file()
