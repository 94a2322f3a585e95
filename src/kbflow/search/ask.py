"""`ask`: an answer grounded in retrieved chunks, with numbered citations to source path and heading."""

from __future__ import annotations

import re

from kbflow.core.errors import ConfigError
from kbflow.search.agentic import Agent
from kbflow.search.citations import source_label
from kbflow.search.searcher import Searcher
from kbflow.stores import Hit, SearchFilter

SYSTEM = (
    "You answer questions using only the numbered sources given. Cite every claim with the source numbers in "
    "square brackets, like [1] or [2][3]. If the sources do not contain the answer, say \"I don't know\" and that "
    "the sources do not answer it. Answer in the language of the question."
)
CITATION = re.compile(r"\[(\d+)\]")


def build_messages(question: str, hits: list[Hit]) -> list[dict]:
    sources = "\n\n".join(f"[{n}] {source_label(hit)}\n{hit.text}" for n, hit in enumerate(hits, 1))
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Sources:\n\n{sources}\n\nQuestion: {question}"}]


def pack(chat, question: str, hits: list[Hit]) -> list[Hit]:
    """The best-ranked hits whose prompt leaves the answer its ``max_tokens`` in the model's window, measured by
    the model's own tokenizer (a chat model that can count: the local one). Others get every hit."""
    if not hasattr(chat, "count_tokens"):
        return hits
    budget = chat.window - chat.config.max_tokens
    kept = list(hits)
    while kept and chat.count_tokens(build_messages(question, kept)) > budget:
        kept.pop()
    if hits and not kept:
        raise ConfigError(f"the question with even the best source needs more than {budget} tokens of the model's "
                          f"{chat.window}-token window once {chat.config.max_tokens} are kept for the answer: raise "
                          "search.llm.context_tokens or lower search.llm.max_tokens")
    return kept


def ask(searcher: Searcher, question: str, mode: str | None = None, where: SearchFilter | None = None,
        expand: str | None = None, context_chunks: int | None = None, on_token=None, agentic: bool = False) -> dict:
    """Retrieve, then ask the chat model. Citations are checked: numbers that name no source are reported.
    ``on_token`` receives the answer as the model writes it (piece by piece from a local model). Sources that do
    not fit a local model's window are left out, best-ranked first kept, and counted in ``sources_left_out``.

    ``agentic``: the question chooses the retrieval (``kbflow.search.agentic``: one search, parallel searches
    of a comparison, several hops, a rewritten query) in bounded rounds; the result adds ``strategy``, ``trace``
    and ``planner`` (calls, prompt tokens)."""
    chat = searcher.chat  # fails first, and clearly, when no LLM is configured
    limit = context_chunks or searcher.config.search.llm.context_chunks
    extra: dict = {}
    if agentic:
        if expand is not None:
            raise ConfigError("ask --agentic writes its own search queries: drop --expand")
        agent = Agent(searcher, mode, where)
        strategy, retrieved = agent.retrieve(question, limit)
        extra = {"strategy": strategy, "trace": agent.trace,
                 "planner": {"calls": agent.calls, "prompt_tokens": agent.prompt_tokens}}
    else:
        retrieved = searcher.search(question, mode=mode, limit=limit, where=where, expand=expand)
    hits = pack(chat, question, retrieved)
    sources = [{"n": n, "doc_id": hit.doc_id, "source_path": hit.source_path, "heading_path": hit.heading_path, "chunk_id": hit.chunk_id,
                "score": round(hit.score, 6)} for n, hit in enumerate(hits, 1)]
    if not hits:
        return {"question": question, "answer": None, "sources": [], "cited": [], "unknown_citations": [],
                "sources_left_out": 0,
                "message": f"no chunk of namespace {searcher.namespace!r} matches the question; nothing was asked",
                **extra}
    answer = chat.complete(build_messages(question, hits), on_token=on_token)
    numbers = sorted({int(n) for n in CITATION.findall(answer)})
    return {"question": question, "answer": answer, "sources": sources,
            "cited": [n for n in numbers if 1 <= n <= len(hits)],
            "unknown_citations": [n for n in numbers if not 1 <= n <= len(hits)],
            "sources_left_out": len(retrieved) - len(hits), **extra}
