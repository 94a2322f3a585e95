"""`ask --agentic`: the question decides how to retrieve, in bounded rounds, before the answer is written.

1. **Assess and plan** (one chat call): is the question clear, and which strategy fits: ``single`` (one fact: one
   search), ``compare`` (one search per side, run in parallel as one round), ``multi_hop`` (a first fact leads to
   the next search). An unclear question is searched as the planner's best reading of it, and the trace says so.
2. **Rounds**: each round searches (the namespace's search mode) and adds its best ``evidence_per_round`` hits to
   the evidence (the first round also searches the question as asked, for the hits plain ``ask`` would use, so the
   evidence holds plain ask's and the rounds can only add to it); then one chat call looks at the evidence and
   decides: ``done``, ``next`` (the next search of a multi-hop question) or ``rewrite`` (nothing useful was found:
   the same need, other words). At most
   ``max_rounds`` rounds, and the planning calls together stay under ``max_planner_prompt_tokens``.
3. **Answer**: the evidence, every search's best hits first (rank 1 of each search, then rank 2, ...), answered and
   cited exactly as plain ``ask`` does; when a local model's window cannot hold it all, each search's weakest hits
   are left out first, never a whole later hop.

Every planning reply must be the JSON asked for. A reply that is not is recorded in the trace with what was done
instead (the question searched as it is, or the rounds ended), never passed over in silence. The trace (every
call's decision, every search's query and hits) is returned with the answer (``--json``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from kbflow.search.citations import source_label
from kbflow.search.llm import parse_reply
from kbflow.stores import Hit, SearchFilter

STRATEGIES = ("single", "compare", "multi_hop")
SNIPPET_CHARS = 400

PLAN = (
    "You plan searches of a documentation knowledge base before a question is answered. Reply with one JSON object "
    "and nothing else:\n"
    '{"clear": true or false, "strategy": "single" or "compare" or "multi_hop", "queries": ["search query", ...]}\n'
    "single: the question asks one thing; queries = one search query.\n"
    "compare: the question compares or contrasts things; queries = one search query per thing compared.\n"
    "multi_hop: the answer needs a first fact to find a second one (what something is called or depends on, then "
    "what that does); queries = the first search only.\n"
    "clear = false when the question is ambiguous or underspecified; queries = your best reading of it.\n"
    "Write search queries in the language of the documents' words, short, without question words."
)
CHECK = (
    "You decide whether the evidence found so far answers a question. Reply with one JSON object and nothing else:\n"
    '{"decision": "done"} when the evidence answers the question;\n'
    '{"decision": "next", "query": "..."} when it holds a first fact and another search is needed for the rest;\n'
    '{"decision": "rewrite", "query": "..."} when nothing in it is useful: the same need in other words.'
)


def _hit_row(hit: Hit) -> dict:
    return {"chunk_id": hit.chunk_id, "source_path": hit.source_path, "heading_path": hit.heading_path,
            "score": round(float(hit.score), 6)}


def _evidence_text(evidence: list[Hit]) -> str:
    return "\n\n".join(f"[{n}] {source_label(hit)}\n{hit.text[:SNIPPET_CHARS]}" for n, hit in enumerate(evidence, 1))


class Agent:
    """The rounds of one question (``retrieve``), over a searcher and its chat model."""

    def __init__(self, searcher, mode: str | None, where: SearchFilter | None):
        self.searcher = searcher
        self.chat = searcher.chat
        self.settings = searcher.config.search.agentic
        self.mode = mode
        self.where = where
        self.trace: list[dict] = []
        self.prompt_tokens = 0
        self.calls = 0
        self._place: dict[str, tuple[int, int]] = {}  # chunk id -> (its best rank in a search, that search)
        self._searches = 0

    def _tokens(self, messages: list[dict]) -> int:
        if hasattr(self.chat, "count_tokens"):
            return self.chat.count_tokens(messages)
        return sum(len(m["content"]) for m in messages) // 4 + 4 * len(messages)  # an estimate: no tokenizer here

    def _plan_call(self, step: str, system: str, user: str) -> tuple[dict | None, str | None]:
        """(parsed reply, None), or (None, why no call was made) when the token budget would be passed."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        tokens = self._tokens(messages)
        if self.prompt_tokens + tokens > self.settings.max_planner_prompt_tokens:
            return None, (f"stopped: this {step} call's {tokens} prompt tokens would pass "
                          f"search.agentic.max_planner_prompt_tokens ({self.settings.max_planner_prompt_tokens}; "
                          f"{self.prompt_tokens} used)")
        self.prompt_tokens += tokens
        self.calls += 1
        reply = self.chat.complete(messages, temperature=0.0, max_tokens=self.settings.planner_tokens,
                                   limit_name="search.agentic.planner_tokens")
        parsed = parse_reply(reply)
        entry = {"step": step, "prompt_tokens": tokens, "reply": reply[:500]}
        if parsed is None:
            entry["error"] = "the reply is not the JSON object asked for"
        self.trace.append(entry)
        return parsed, None

    def _search(self, queries: list[str], evidence: dict[str, Hit], round_no: int, why: str,
                first_limit: int | None = None) -> None:
        """One round: its searches (in parallel when there are several), their best hits added to the evidence
        (``first_limit``: how many the first query adds, when not ``evidence_per_round``)."""
        per_round = self.settings.evidence_per_round
        limits = [first_limit or per_round] + [per_round] * (len(queries) - 1)

        def one(index: int) -> list[Hit]:
            return self.searcher.search(queries[index], mode=self.mode, limit=limits[index], where=self.where)

        if len(queries) > 1:
            with ThreadPoolExecutor(max_workers=min(4, len(queries)), thread_name_prefix="kbflow-agentic") as pool:
                results = list(pool.map(one, range(len(queries))))
        else:
            results = [one(0)]
        for index, hits in enumerate(results):
            for rank, hit in enumerate(hits):  # a chunk several searches found takes its best place
                evidence.setdefault(hit.chunk_id, hit)
                place = (rank, self._searches + index)
                self._place[hit.chunk_id] = min(self._place.get(hit.chunk_id, place), place)
        self._searches += len(results)
        searches = [{"query": query, "hits": [_hit_row(hit) for hit in hits]} for query, hits in zip(queries, results)]
        self.trace.append({"step": "search", "round": round_no, "why": why, "parallel": len(queries) > 1,
                           "searches": searches})

    def retrieve(self, question: str, plain_hits: int) -> tuple[str, list[Hit]]:
        """(strategy, evidence). The first round also searches the question as it is, for the ``plain_hits`` hits
        plain ``ask`` would use: the evidence holds plain ask's, and the rounds can only add. The evidence is ordered
        by rank across the searches: every search's best hit, then every search's second... (searches in the order
        they ran), so every side of a comparison and every hop is in the first places, and a local model's full
        window (``ask.pack`` keeps the first hits that fit) drops each search's weakest hits, not the last hop."""
        plan, stopped = self._plan_call("plan", PLAN, f"Question: {question}")
        if stopped:
            self.trace.append({"step": "plan", "why": stopped})
        planned = plan or {}
        strategy = planned.get("strategy")
        queries = [q.strip() for q in planned.get("queries", []) if isinstance(q, str) and q.strip()]
        if strategy not in STRATEGIES or not queries:
            self.trace[-1]["decision"] = "search the question as it is, in one round (no usable plan)"
            strategy, queries = "single", [question]
        else:
            if planned.get("clear") is False:
                self.trace[-1]["decision"] = f"unclear question: searched as the planner's reading {queries[0]!r}"
            if strategy != "compare":
                queries = queries[:1]
            queries = queries[:4]
        evidence: dict[str, Hit] = {}
        why = f"strategy {strategy}"
        for round_no in range(1, self.settings.max_rounds + 1):
            if round_no == 1:  # the question as asked first: what plain ask would have
                self._search([question] + [q for q in queries if q != question], evidence, 1,
                             why + ", with the question as asked", first_limit=plain_hits)
            else:
                self._search(queries, evidence, round_no, why)
            if round_no == self.settings.max_rounds:
                self.trace.append({"step": "stop", "why": f"search.agentic.max_rounds ({self.settings.max_rounds}) "
                                                          "reached"})
                break
            check, stopped = self._plan_call(
                "check", CHECK, f"Question: {question}\n\nEvidence:\n\n{_evidence_text(list(evidence.values()))}")
            if stopped:
                self.trace.append({"step": "stop", "why": stopped})
                break
            decision = (check or {}).get("decision")
            query = (check or {}).get("query")
            if decision in ("next", "rewrite") and isinstance(query, str) and query.strip():
                self.trace[-1]["decision"] = decision
                queries, why = [query.strip()], ("the next hop" if decision == "next" else
                                                 "nothing useful found: the query rewritten")
                continue
            self.trace[-1]["decision"] = "done" if decision == "done" else "done (no usable decision in the reply)"
            break
        return strategy, sorted(evidence.values(), key=lambda hit: self._place[hit.chunk_id])
