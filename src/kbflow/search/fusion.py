"""Merging ranked lists of hits: reciprocal rank fusion, weighted min-max fusion, and min-max fusion whose BM25
share is set per query, by how much the BM25 list agrees with the vector list (``trusted``, the default) or by how
far BM25's best hit stands out of its own list compared with the vector list's (``standout``).

Each hit keeps its input scores in ``Hit.extra`` ("vector", "bm25") and its ranks ("vector_rank", "bm25_rank"),
so a caller can see why a hit ranks where it does.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from kbflow.stores.base import Hit


def _merge(lists: dict[str, list[Hit]]) -> dict[str, Hit]:
    merged: dict[str, Hit] = {}
    for name, hits in lists.items():
        for rank, hit in enumerate(hits, 1):
            kept = merged.setdefault(hit.chunk_id, replace(hit, extra=dict(hit.extra)))
            for key, value in hit.extra.items():  # what a later list knows of the hit (graph search: its path)
                kept.extra.setdefault(key, value)
            kept.extra[name] = hit.score
            kept.extra[f"{name}_rank"] = rank
    return merged


def rrf(lists: dict[str, list[Hit]], k: int = 60) -> list[Hit]:
    """score = Σ 1 / (k + rank) over the lists holding the hit (rank from 1); ties keep first-seen order."""
    merged = _merge(lists)
    for hit in merged.values():
        hit.score = sum(1.0 / (k + hit.extra[f"{name}_rank"]) for name in lists if f"{name}_rank" in hit.extra)
    return sorted(merged.values(), key=lambda hit: -hit.score)


def min_max(scores: list[float]) -> list[float]:
    """Scaled to 0..1 within the list; a list of equal scores scales to all 1."""
    if not scores:
        return []
    low, high = min(scores), max(scores)
    return [1.0 if high == low else (s - low) / (high - low) for s in scores]


def weighted(lists: dict[str, list[Hit]], weights: dict[str, float]) -> list[Hit]:
    """score = Σ weight · min-max(score) over the lists; a hit missing from a list gets 0 from it."""
    unknown = set(lists) - set(weights)
    if unknown:
        raise ValueError(f"no weight for {sorted(unknown)}")
    merged = _merge(lists)
    scaled = {name: dict(zip((h.chunk_id for h in hits), min_max([h.score for h in hits])))
              for name, hits in lists.items()}
    for hit in merged.values():
        hit.score = sum(weights[name] * scaled[name].get(hit.chunk_id, 0.0) for name in lists)
    return sorted(merged.values(), key=lambda hit: -hit.score)


def overlap(first: list[Hit], second: list[Hit], top: int = 10) -> float:
    """The share of the first ``top`` places of ``first`` whose chunk is also in the first ``top`` of ``second``."""
    if top <= 0:
        return 0.0
    return len({h.chunk_id for h in first[:top]} & {h.chunk_id for h in second[:top]}) / top


def bm25_share(vector: list[Hit], bm25: list[Hit], base: float, floor: float, full_at: float = 0.3) -> float:
    """BM25's share of a min-max fusion for one query: ``base`` when at least ``full_at`` of the two lists' first
    ten chunks are the same, falling linearly to ``floor`` x ``base`` when they share none.

    Why agreement: min-max scaling maps every list's top hit to 1.0 whatever its confidence, so a BM25 list that
    matched a question's incidental words ranks its confidently wrong top hits level with the vector list's right
    ones. When the words point somewhere the meaning does not (no chunk in common), BM25 is heard less; when they
    agree, it is what breaks the vector list's ties."""
    trust = min(1.0, overlap(vector, bm25) / full_at) if full_at > 0 else 1.0
    return _scaled_share(base, floor, trust)


def _scaled_share(base: float, floor: float, trust: float) -> float:
    """``base`` at full trust (1), ``floor`` x ``base`` at none (0), linear in between."""
    return base * (floor + (1.0 - floor) * trust)


def _fused_with_share(vector: list[Hit], bm25: list[Hit], share: float) -> list[Hit]:
    """Weighted min-max fusion with BM25 at ``share`` and the vector list at the rest; the share is recorded in
    each hit's ``extra['bm25_share']``."""
    fused = weighted({"vector": vector, "bm25": bm25}, {"vector": 1.0 - share, "bm25": share})
    for hit in fused:
        hit.extra["bm25_share"] = round(share, 4)
    return fused


def trusted(lists: dict[str, list[Hit]], vector_weight: float = 0.5, floor: float = 0.2) -> list[Hit]:
    """Weighted min-max fusion of a ``vector`` and a ``bm25`` list with BM25's share set per query by
    ``bm25_share`` (base 1 - ``vector_weight``); the shares used are in each hit's ``extra['bm25_share']``."""
    vector, bm25 = lists.get("vector", []), lists.get("bm25", [])
    return _fused_with_share(vector, bm25, bm25_share(vector, bm25, 1.0 - vector_weight, floor))


def standout_of(scores: list[float], top: int = 10) -> float:
    """How far a list's best score stands out of the next ``top`` - 1, in units of the whole list's spread
    (population standard deviation); 0 for a list shorter than 3 or with equal scores."""
    if len(scores) < 3:
        return 0.0
    spread = statistics.pstdev(scores)
    return (scores[0] - statistics.fmean(scores[1:top])) / spread if spread else 0.0


def standout_share(vector: list[Hit], bm25: list[Hit], base: float, floor: float) -> float:
    """BM25's share of a min-max fusion for one query: ``base`` when BM25's best hit stands out of its list at
    least as far as the vector list's best hit does of its own, falling linearly with the ratio of the two
    standouts to ``floor`` x ``base`` (a BM25 list whose top does not stand out at all).

    Why: min-max scaling maps every list's top hit to 1.0 whatever its confidence. A BM25 list whose first scores
    are close together matched a question's common words about equally everywhere; its top hit is a guess, and
    at full share that guess ranks level with the vector list's best. A standout is measured in the list's own
    units, so BM25's and cosine scores compare without calibration. A vector list that stands out by 0 (flat,
    or too short to tell) leaves BM25 its full share."""
    sv = standout_of([h.score for h in vector])
    sb = standout_of([h.score for h in bm25])
    ratio = min(1.0, max(0.0, sb / sv)) if sv > 0 else 1.0
    return _scaled_share(base, floor, ratio)


def standout(lists: dict[str, list[Hit]], vector_weight: float = 0.5, floor: float = 0.4) -> list[Hit]:
    """Weighted min-max fusion of a ``vector`` and a ``bm25`` list with BM25's share set per query by
    ``standout_share`` (base 1 - ``vector_weight``); the share used is in each hit's ``extra['bm25_share']``."""
    vector, bm25 = lists.get("vector", []), lists.get("bm25", [])
    return _fused_with_share(vector, bm25, standout_share(vector, bm25, 1.0 - vector_weight, floor))
