"""Character and word error rates (Levenshtein distance over the reference length), for OCR and speech checks."""

from __future__ import annotations

import re


def edit_distance(reference: list | str, hypothesis: list | str) -> int:
    previous = list(range(len(hypothesis) + 1))
    for i, ref_item in enumerate(reference, 1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp_item in enumerate(hypothesis, 1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_item != hyp_item))
        previous = current
    return previous[-1]


def normalize_chars(text: str) -> str:
    """Whitespace collapsed to single spaces: layout is not what CER measures."""
    return " ".join(text.split())


def cer(reference: str, hypothesis: str) -> float:
    reference, hypothesis = normalize_chars(reference), normalize_chars(hypothesis)
    return edit_distance(reference, hypothesis) / max(len(reference), 1)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(edits, reference words): sum both over files for a corpus WER."""
    ref = words(reference)
    return edit_distance(ref, words(hypothesis)), len(ref)


def wer(reference: str, hypothesis: str) -> float:
    errors, total = word_errors(reference, hypothesis)
    return errors / max(total, 1)
