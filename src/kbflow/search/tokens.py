"""Words for BM25: jieba segmentation for Chinese, lower-cased words for the rest, the same at index and query time.

The store keeps each chunk's words as one space-joined string (``text_tokens``), so a whitespace tokenizer
(LanceDB full-text index) or a term-frequency sparse vector (Qdrant) sees Chinese words, not whole sentences.
Bump ``TOKENIZER_VERSION`` when this changes: stored tokens of an older version no longer match queries.
"""

from __future__ import annotations

import logging
import re
import threading

TOKENIZER_VERSION = "jieba-0.42.1-search-lower-1"

_WORD = re.compile(r"[^\W_]", re.UNICODE)  # a token needs a letter, digit or CJK character; punctuation is dropped
_lock = threading.Lock()
_ready = False


def _jieba():
    global _ready
    import jieba

    with _lock:
        if not _ready:
            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()  # loads the packaged dictionary once (about a second)
            _ready = True
    return jieba


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``; Chinese runs are cut by jieba's search mode (long words and their parts)."""
    jieba = _jieba()
    return [token for token in (t.strip().lower() for t in jieba.cut_for_search(text)) if token and _WORD.search(token)]


def tokens_text(text: str) -> str:
    """The stored form: words joined by single spaces."""
    return " ".join(words(text))
