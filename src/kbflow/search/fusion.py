"""Merging ranked lists of hits: reciprocal rank fusion and weighted min-max fusion.

Each hit keeps its input scores in ``Hit.extra`` ("vector", "bm25") and its ranks ("vector_rank", "bm25_rank"),
so a caller can see why a hit ranks where it does.
"""

from __future__ import annotations

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
