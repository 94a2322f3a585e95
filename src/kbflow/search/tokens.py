"""Words for BM25: jieba segmentation for Chinese, lower-cased words for the rest, the same at index and query time.

The store keeps each chunk's words as one space-joined string (``text_tokens``), so a whitespace tokenizer
(LanceDB full-text index) or a term-frequency sparse vector (Qdrant) sees Chinese words, not whole sentences.
Bump ``TOKENIZER_VERSION`` when this changes: stored tokens of an older version no longer match queries.
"""

from __future__ import annotations

import logging
import re
import threading
from functools import lru_cache

TOKENIZER_VERSION = "jieba-0.42.1-search-lower-1"

_WORD = re.compile(r"[^\W_]", re.UNICODE)  # a token needs a letter, digit or CJK character; punctuation is dropped
# jieba.cut's own block pattern (jieba 0.42.1 ``re_han_default``): it segments each maximal run of these characters
# on its own and yields every other character alone, so a text's words are its blocks' words in order. Blocks
# repeat (English words, identifiers), so each distinct block is segmented once: the same words, ~10x less jieba.
_BLOCK = re.compile("([\u4E00-\u9FD5a-zA-Z0-9+#&\\._%\\-]+)", re.U)
_MEMO_BLOCK_CHARS = 64  # longer blocks (long CJK runs, URLs) rarely repeat: segmented without the memo
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


def _jieba_words(text: str) -> list[str]:
    """The definition: jieba's search-mode segmentation of ``text``, lower-cased, without non-words."""
    jieba = _jieba()
    return [token for token in (t.strip().lower() for t in jieba.cut_for_search(text)) if token and _WORD.search(token)]


@lru_cache(maxsize=200_000)
def _block_words(block: str) -> tuple[str, ...]:
    return tuple(_jieba_words(block))


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``; Chinese runs are cut by jieba's search mode (long words and their parts).

    Equal to ``_jieba_words(text)`` (a property test checks it): jieba cuts ``text`` at the edges of ``_BLOCK``
    runs, segments each run alone and yields each other character as itself."""
    found: list[str] = []
    for block in _BLOCK.split(text):
        if not block:
            continue
        if _BLOCK.match(block):
            found.extend(_block_words(block) if len(block) <= _MEMO_BLOCK_CHARS else _jieba_words(block))
        else:
            found.extend(token for token in (c.strip().lower() for c in block) if token and _WORD.search(token))
    return found


def tokens_text(text: str) -> str:
    """The stored form: words joined by single spaces."""
    return " ".join(words(text))
