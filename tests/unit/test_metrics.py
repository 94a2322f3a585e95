import math

import pytest

from kbflow.engine.evaluate import mrr_at, ndcg_at, recall_at, score_run


def test_metrics_against_a_hand_computed_example():
    ranked = ["a", "x", "b", "y"]
    relevant = {"a": 1, "b": 1, "c": 1}
    # DCG = 1/log2(2) + 1/log2(4) = 1.5 ; IDCG = 1 + 1/log2(3) + 1/log2(4) = 2.1309...
    assert ndcg_at(ranked, relevant, 10) == pytest.approx(1.5 / (1 + 1 / math.log2(3) + 0.5))
    assert recall_at(ranked, relevant, 2) == pytest.approx(1 / 3)
    assert recall_at(ranked, relevant, 10) == pytest.approx(2 / 3)
    assert mrr_at(["x", "y", "b"], relevant, 10) == pytest.approx(1 / 3)
    assert mrr_at(["x"] * 10 + ["a"], relevant, 10) == 0.0


def test_graded_gains_and_means():
    assert ndcg_at(["b", "a"], {"a": 2, "b": 1}, 10) == pytest.approx((1 + 2 / math.log2(3)) / (2 + 1 / math.log2(3)))
    scores = score_run({"q1": ["a"], "q2": ["z"]}, {"q1": {"a": 1}, "q2": {"b": 1}})
    assert scores == {"ndcg@10": 0.5, "recall@10": 0.5, "recall@100": 0.5, "mrr@10": 0.5}
