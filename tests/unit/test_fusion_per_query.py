"""Min-max fusion with BM25's share set per query: by how far BM25's best hit stands out of its list compared
with the vector list's (``fusion.standout``, the default) and by its agreement with the vector list
(``fusion.trusted``). Expected values are worked out by hand from the inputs."""

from __future__ import annotations

import statistics

import pytest

from kbflow.search import fusion
from kbflow.stores.base import Hit


def hits(*pairs):
    return [Hit(chunk_id, "d", "s", [], score, chunk_id) for chunk_id, score in pairs]


def ranked(n: int, prefix: str, top: float):
    return hits(*((f"{prefix}{i}", top - i) for i in range(n)))


def test_disjoint_lists_hear_bm25_at_its_floor():
    """BM25's words point where the meaning does not: its top hit, level with the vector's under plain min-max,
    falls behind the vector list's first hits."""
    vector, bm25 = ranked(10, "v", 10.0), ranked(10, "b", 30.0)
    plain = fusion.weighted({"vector": vector, "bm25": bm25}, {"vector": 0.5, "bm25": 0.5})
    assert plain[0].score == plain[1].score == pytest.approx(0.5)  # v0 and b0 tie: each list's top scales to 1
    fused = fusion.trusted({"vector": vector, "bm25": bm25}, vector_weight=0.5, floor=0.2)
    share = 0.5 * 0.2  # no chunk in common: the floor's share of the base
    assert fused[0].extra["bm25_share"] == pytest.approx(share)
    assert fused[0].chunk_id == "v0" and fused[0].score == pytest.approx(1 - share)
    # v_i scores 0.9 (9 - i) / 9 = 0.1 (9 - i) and b0 0.1: b0 comes after v0..v7 (v8 ties it)
    order = [h.chunk_id for h in fused]
    assert order[:8] == [f"v{i}" for i in range(8)] and order.index("b0") in (8, 9)


def test_agreeing_lists_fuse_as_plain_min_max():
    """Three of the first ten in common (full_at = 0.3): the full base share, the same order and scores as
    weighted min-max at equal weights."""
    vector = hits(*((c, 10.0 - i) for i, c in enumerate("abcdefghij")))
    bm25 = hits(*((c, 20.0 - i) for i, c in enumerate("xyzabcuvwq")))
    assert fusion.overlap(vector, bm25) == pytest.approx(0.3)
    fused = fusion.trusted({"vector": vector, "bm25": bm25}, vector_weight=0.5, floor=0.2)
    plain = fusion.weighted({"vector": vector, "bm25": bm25}, {"vector": 0.5, "bm25": 0.5})
    assert [(h.chunk_id, round(h.score, 9)) for h in fused] == [(h.chunk_id, round(h.score, 9)) for h in plain]
    assert fused[0].extra["bm25_share"] == 0.5


def test_share_falls_linearly_with_agreement():
    vector = ranked(10, "v", 10.0)
    one_shared = hits(("v0", 5.0), *((f"b{i}", 4.0 - i) for i in range(9)))
    # one of ten in common: trust 0.1 / 0.3 = 1/3 -> base x (floor + (1 - floor) / 3)
    assert fusion.bm25_share(vector, one_shared, 0.5, 0.2) == pytest.approx(0.5 * (0.2 + 0.8 / 3))
    assert fusion.bm25_share(vector, [], 0.5, 0.2) == pytest.approx(0.1)
    assert fusion.bm25_share(vector, vector, 0.6, 0.0) == pytest.approx(0.6)


def test_search_fusion_trusted_is_what_hybrid_uses():
    from kbflow.config import SearchConfig
    from kbflow.search.searcher import fuse

    vector, bm25 = ranked(10, "v", 10.0), ranked(10, "b", 30.0)
    fused = fuse({"vector": vector, "bm25": bm25}, SearchConfig(fusion="trusted", bm25_floor=0.4))
    assert fused[0].chunk_id == "v0" and fused[0].extra["bm25_share"] == pytest.approx(0.5 * 0.4)


def test_standout_is_the_distance_of_the_best_score_from_the_next_nine_in_the_lists_spread():
    scores = [10.0, 4.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    expected = (10.0 - statistics.fmean(scores[1:10])) / statistics.pstdev(scores)
    assert fusion.standout_of(scores) == pytest.approx(expected)
    assert fusion.standout_of([5.0, 5.0, 5.0]) == 0.0 and fusion.standout_of([9.0, 1.0]) == 0.0


def test_a_bm25_list_whose_best_does_not_stand_out_is_heard_at_its_floor():
    """BM25's first scores level (a guess among many equal matches), the vector's best well ahead of the rest:
    BM25 keeps only the floor's part of its share, so its top hit no longer ranks level with the vector's."""
    vector = hits(("v0", 0.9), *((f"v{i}", 0.5 - 0.01 * i) for i in range(1, 12)))
    flat = hits(*((f"b{i}", 7.0) for i in range(11)), ("b11", 6.0))
    assert fusion.standout_of([h.score for h in flat]) == 0.0 < fusion.standout_of([h.score for h in vector])
    fused = fusion.standout({"vector": vector, "bm25": flat}, vector_weight=0.5, floor=0.4)
    assert fused[0].extra["bm25_share"] == pytest.approx(0.5 * 0.4)
    assert fused[0].chunk_id == "v0" and fused[0].score == pytest.approx(1 - 0.2)


def test_a_bm25_list_that_stands_out_as_far_as_the_vector_list_gets_its_full_share():
    vector, bm25 = ranked(12, "v", 12.0), ranked(12, "b", 40.0)  # same shape: equal standouts
    fused = fusion.standout({"vector": vector, "bm25": bm25}, vector_weight=0.5, floor=0.4)
    plain = fusion.weighted({"vector": vector, "bm25": bm25}, {"vector": 0.5, "bm25": 0.5})
    assert [(h.chunk_id, round(h.score, 9)) for h in fused] == [(h.chunk_id, round(h.score, 9)) for h in plain]
    assert fused[0].extra["bm25_share"] == 0.5


def test_the_standout_share_falls_linearly_with_the_ratio_of_standouts():
    vector = hits(*((f"v{i}", s) for i, s in enumerate([10.0, 4.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0])))
    bm25 = hits(*((f"b{i}", s) for i, s in enumerate([6.0, 5.0, 4.0, 3.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0])))
    sv, sb = fusion.standout_of([h.score for h in vector]), fusion.standout_of([h.score for h in bm25])
    assert 0 < sb < sv
    assert fusion.standout_share(vector, bm25, 0.5, 0.4) == pytest.approx(0.5 * (0.4 + 0.6 * sb / sv))
    assert fusion.standout_share(vector, [], 0.5, 0.4) == pytest.approx(0.2)  # no BM25 list: the floor
    assert fusion.standout_share(bm25, vector, 0.5, 0.4) == pytest.approx(0.5)  # BM25 stands out further: capped
    assert fusion.standout_share([], bm25, 0.6, 0.0) == pytest.approx(0.6)  # no vector standout to compare with


def test_search_fusion_standout_is_what_hybrid_uses_when_configured():
    from kbflow.config import SearchConfig
    from kbflow.search.searcher import fuse

    vector = hits(("v0", 0.9), *((f"v{i}", 0.5 - 0.01 * i) for i in range(1, 12)))
    flat = hits(*((f"b{i}", 7.0) for i in range(11)), ("b11", 6.0))
    fused = fuse({"vector": vector, "bm25": flat}, SearchConfig(fusion="standout", bm25_floor=0.4))
    assert fused[0].chunk_id == "v0" and fused[0].extra["bm25_share"] == pytest.approx(0.2)


def test_the_default_hybrid_is_trusted_fusion_at_floor_0_8():
    """The default chosen by the fusion study (docs/retrieval.md): BM25 disjoint from the vector list keeps 0.8
    of its half share."""
    from kbflow.config import SearchConfig
    from kbflow.search.searcher import fuse

    settings = SearchConfig()
    assert (settings.fusion, settings.bm25_floor, settings.vector_weight) == ("trusted", 0.8, 0.5)
    fused = fuse({"vector": ranked(10, "v", 10.0), "bm25": ranked(10, "b", 30.0)}, settings)
    assert fused[0].extra["bm25_share"] == pytest.approx(0.5 * 0.8)
