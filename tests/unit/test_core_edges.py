"""Edges of the pure core that mutation testing (docs/mutation.md) found no test holding: fusion's order and
inputs, metric cut-offs and zero grades, the deletion guard on an empty namespace, bisection against brute force.
Expected values are worked out by hand here."""

from __future__ import annotations

import math

import pytest

from kbflow.chunk.counters import bisect_cut
from kbflow.engine.plan import Plan, check_deletion_guard
from kbflow.core.errors import ConfigError, DeletionGuardError
from kbflow.engine.evaluate import ndcg_at, recall_at, score_run
from kbflow.search import fusion
from kbflow.stores.base import Hit


def hits(*pairs):
    return [Hit(chunk_id, "d", "s", [], score, chunk_id) for chunk_id, score in pairs]


def test_weighted_fusion_is_best_first_and_leaves_its_inputs_alone():
    lists = {"vector": hits(("a", 0.2), ("b", 0.9), ("c", 0.5)), "bm25": hits(("c", 4.0), ("d", 1.0))}
    fused = fusion.weighted(lists, {"vector": 0.5, "bm25": 0.5})
    # by hand: vector scaled a 0, b 1, c 3/7; bm25 scaled c 1, d 0 -> c 0.5*3/7+0.5, b 0.5, a 0, d 0
    assert [h.chunk_id for h in fused][:2] == ["c", "b"]
    assert [h.score for h in fused] == sorted((h.score for h in fused), reverse=True)
    assert fused[0].score == pytest.approx(0.5 * 3 / 7 + 0.5)
    assert all(h.extra == {} for h in lists["vector"] + lists["bm25"])  # the inputs keep their own (empty) extra
    with pytest.raises(ValueError, match="no weight for"):
        fusion.weighted(lists, {"vector": 1.0})


def test_rrf_default_constant_is_60():
    fused = fusion.rrf({"vector": hits(("a", 1.0)), "bm25": hits(("a", 1.0))})
    assert fused[0].score == pytest.approx(2 / 61)


def test_metrics_cut_at_their_depth_and_ignore_zero_grades():
    ranked = [f"x{i}" for i in range(10)] + ["hit"]  # the relevant document at rank 11
    assert ndcg_at(ranked, {"hit": 1}, 10) == 0.0
    assert ndcg_at(ranked, {"hit": 1}, 11) == pytest.approx(1 / math.log2(12))
    assert recall_at(ranked, {"hit": 1}, 10) == 0.0 and recall_at(ranked, {"hit": 1}, 11) == 1.0
    # a grade-0 label is not relevant: it neither counts in the ideal list nor as a found document
    assert recall_at(["zero", "hit"], {"hit": 1, "zero": 0}, 1) == 0.0
    assert ndcg_at(["hit"], {"hit": 1, "zero": 0}, 10) == 1.0
    assert ndcg_at(["a"], {"a": 0}, 10) == 0.0 and recall_at(["a"], {"a": 0}, 10) == 0.0
    run = score_run({"q1": ranked}, {"q1": {"hit": 1}, "q2": {"z": 0}})  # q2 has no positive label: left out
    assert run["recall@100"] == 1.0 and run["recall@10"] == 0.0 and run["mrr@10"] == 0.0
    assert score_run({}, {"q1": {"a": 1}}) == {"ndcg@10": 0.0, "recall@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    with pytest.raises(ConfigError, match="no positive label"):
        score_run({"q": ["a"]}, {"q": {"a": 0}})


def test_deletion_guard_on_an_empty_namespace_and_at_its_threshold():
    removed = Plan(removed=[{"doc_id": f"d{i}"} for i in range(3)])
    check_deletion_guard(removed, stored_documents=0, max_fraction=0.3, allow_mass_delete=False)  # nothing to lose
    check_deletion_guard(removed, stored_documents=10, max_fraction=0.3, allow_mass_delete=False)  # 30%: allowed
    with pytest.raises(DeletionGuardError, match="3 of 9 documents"):
        check_deletion_guard(removed, stored_documents=9, max_fraction=0.3, allow_mass_delete=False)
    check_deletion_guard(removed, stored_documents=9, max_fraction=0.3, allow_mass_delete=True)


@pytest.mark.parametrize("budget", [0, 1, 2, 3, 5, 8, 13, 40])
def test_bisect_cut_equals_brute_force(budget):
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa"
    count = lambda piece: len(piece.split())  # noqa: E731  words as tokens: grows with the prefix
    fitting = [i for i in range(1, len(text) + 1) if count(text[:i]) <= budget]
    assert bisect_cut(count, text, budget) == (max(fitting) if fitting else 1)
    assert bisect_cut(count, "", budget) == 0
