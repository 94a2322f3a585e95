"""Terms for BM25, the same at index and query time: jieba segmentation for Chinese, lower-cased words for the rest,
then English stop words left out and English words stemmed (Snowball's English stemmer).

The store keeps each chunk's terms as one space-joined string (``text_tokens``), so a whitespace tokenizer
(LanceDB full-text index) or a term-frequency sparse vector (Qdrant) sees Chinese words, not whole sentences, and
both stores see the same terms. Stemming lets a question's "connections" find a passage's "connection"; it gained
7-9 nDCG@10 points on BM25 alone on the English dev sets (docs/retrieval.md). Chinese words pass through unchanged.

Bump ``TOKENIZER_VERSION`` when this changes: stored terms of an older version no longer match queries, so the
namespace records which version its rows were written with (``namespace.json``: ``bm25_terms``) and a search asks
in that version's terms (``terms_function``) until the next ingest rewrites the rows.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import re
import sys
import threading
from functools import lru_cache
from pathlib import Path

from kbflow.core.errors import ConfigError

TOKENIZER_VERSION = "jieba-0.42.1-search-lower+en-stop-snowball-3.1.1"
WORDS_VERSION = "jieba-0.42.1-search-lower-1"  # the version before: words only; namespaces without a record have it

_WORD = re.compile(r"[^\W_]", re.UNICODE)  # a token needs a letter, digit or CJK character; punctuation is dropped
# jieba.cut's own block pattern (jieba 0.42.1 ``re_han_default``): it segments each maximal run of these characters
# on its own and yields every other character alone, so a text's words are its blocks' words in order. Blocks
# repeat (English words, identifiers), so each distinct block is segmented once: the same words, ~10x less jieba.
_BLOCK = re.compile("([\u4E00-\u9FD5a-zA-Z0-9+#&\\._%\\-]+)", re.U)
_MEMO_BLOCK_CHARS = 64  # longer blocks (long CJK runs, URLs) rarely repeat: segmented without the memo
# A block of these characters only (no Chinese, no '+', '#', '&'): jieba's dictionary holds no word of two or more
# of them (checked when it loads), so its graph of the block has single characters only, the whole block goes to
# its HMM segmenter's non-Chinese rule, and that splits it with this pattern (jieba.finalseg.re_skip); search mode
# adds no part-words (none is in the dictionary). Such blocks are most of an English text's.
_PLAIN_BLOCK = re.compile(r"[a-zA-Z0-9._%\-]+")
# jieba 0.42.1's non-Chinese rule (``finalseg.re_skip``) and the sha256 of the dictionary it ships, which holds no
# word of two or more plain characters (tests hold both to the installed jieba): with that dictionary on disk and
# jieba loaded by nobody, a plain block is split as above without loading jieba, which takes about a second. An
# English-only query or ingest then never loads it.
_RE_SKIP = re.compile(r"([a-zA-Z0-9]+(?:\.\d+)?%?)")
PACKAGED_DICTIONARY_SHA256 = "7197c3211ddd98962b036cdf40324d1ea2bfaa12bd028e68faa70111a88e12a8"
_lock = threading.Lock()
_ready = False
_plain_split = None  # jieba.finalseg.re_skip once the dictionary is known to allow it; None: every block to jieba


def _jieba():
    global _ready, _plain_split
    import jieba

    with _lock:
        if not _ready:
            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()  # loads the packaged dictionary once (about a second)
            from jieba import finalseg

            plain_words = any(frequency and len(word) > 1 and _PLAIN_BLOCK.fullmatch(word)
                              for word, frequency in jieba.dt.FREQ.items() if word.isascii())
            _plain_split = None if plain_words else finalseg.re_skip
            _ready = True
    return jieba


def _kept(pieces) -> list[str]:
    """``pieces`` stripped and lower-cased, without the empty ones and those with no letter, digit or CJK character."""
    return [token for token in (piece.strip().lower() for piece in pieces) if token and _WORD.search(token)]


def _jieba_words(text: str) -> list[str]:
    """The definition: jieba's search-mode segmentation of ``text``, lower-cased, without non-words."""
    return _kept(_jieba().cut_for_search(text))


@lru_cache(maxsize=1)
def _packaged_dictionary() -> bool:
    """Whether the installed jieba's dictionary is the one known to hold no plain word (read, not loaded)."""
    spec = importlib.util.find_spec("jieba")
    if spec is None or not spec.submodule_search_locations:
        return False
    try:
        data = (Path(list(spec.submodule_search_locations)[0]) / "dict.txt").read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == PACKAGED_DICTIONARY_SHA256


def _segment(block: str) -> list[str]:
    """``_jieba_words`` of one ``_BLOCK`` run; a plain one (``_PLAIN_BLOCK``) split as jieba would, without it."""
    if _PLAIN_BLOCK.fullmatch(block):
        if not _ready and "jieba" not in sys.modules and _packaged_dictionary():
            return _kept(_RE_SKIP.split(block))  # nobody loaded jieba, so nobody added words to its dictionary
        _jieba()
        if _plain_split is not None:
            return _kept(_plain_split.split(block))
    return _jieba_words(block)


@lru_cache(maxsize=200_000)
def _block_words(block: str) -> tuple[str, ...]:
    return tuple(_segment(block))


def words(text: str) -> list[str]:
    """Lower-cased words of ``text``; Chinese runs are cut by jieba's search mode (long words and their parts).

    Equal to ``_jieba_words(text)`` (a property test checks it): jieba cuts ``text`` at the edges of ``_BLOCK``
    runs, segments each run alone and yields each other character as itself."""
    found: list[str] = []
    parts = _BLOCK.split(text)  # gap, block, gap, ..., gap: the pattern's one group puts blocks at odd places
    for index, part in enumerate(parts):
        if index % 2:
            found.extend(_block_words(part) if len(part) <= _MEMO_BLOCK_CHARS else _segment(part))
        elif part and _WORD.search(part):  # most gaps are spaces and punctuation: no word in them
            found.extend(_kept(part))  # each character of the gap alone, as jieba yields it
    return found


# English stop words: NLTK's English list (as LanceDB's full-text index uses with ``remove_stop_words``); words()
# splits at apostrophes, so its "don't" forms never occur and are left out
ENGLISH_STOP_WORDS = frozenset("""
a about above after again against ain all am an and any are aren as at be because been before being below between
both but by can couldn d did didn do does doesn doing don down during each few for from further had hadn has hasn
have haven having he her here hers herself him himself his how i if in into is isn it its itself just ll m ma me
mightn more most mustn my myself needn no nor not now o of off on once only or other our ours ourselves out over own
re s same shan she should shouldn so some such t than that the their theirs them themselves then there these they
this those through to too under until up ve very was wasn we were weren what when where which while who whom why
will with won wouldn y you your yours yourself yourselves
""".split())
_ENGLISH = re.compile(r"[a-z]+")
_stemmer_lock = threading.Lock()
_stemmer = None


@lru_cache(maxsize=200_000)
def _stem(word: str) -> str:
    """Snowball's English stem of a lower-case ASCII word; any other word as it is."""
    global _stemmer
    if not _ENGLISH.fullmatch(word):
        return word
    with _stemmer_lock:  # a Snowball stemmer object keeps state between calls: one caller at a time
        if _stemmer is None:
            # the pure-Python stemmer of the installed snowballstemmer, whose version TOKENIZER_VERSION records:
            # snowballstemmer.stemmer() hands out PyStemmer's C stemmer instead wherever PyStemmer is importable,
            # which bundles its own (possibly other) Snowball release
            from snowballstemmer.english_stemmer import EnglishStemmer

            _stemmer = EnglishStemmer()
        return _stemmer.stemWord(word)


def _terms_of(found: list[str] | tuple[str, ...]) -> list[str]:
    return [_stem(word) for word in found if word not in ENGLISH_STOP_WORDS]


@lru_cache(maxsize=200_000)
def _block_terms(block: str) -> tuple[str, ...]:
    return tuple(_terms_of(_segment(block)))


def terms(text: str) -> list[str]:
    """BM25's terms of ``text``: its ``words`` without English stop words, English words stemmed.

    A text whose words all lie in ``_BLOCK`` runs (no letter between them: most texts) is the concatenation of its
    blocks' terms, each distinct block's found once: one lookup per block instead of a stop-word test and a stem
    lookup per word (a property test holds it to the definition)."""
    parts = _BLOCK.split(text)
    if _WORD.search("".join(parts[0::2])) is not None:  # a word outside the blocks (Cyrillic, accents): in order
        return _terms_of(words(text))
    return [term for block in parts[1::2]
            for term in (_block_terms(block) if len(block) <= _MEMO_BLOCK_CHARS else _terms_of(_segment(block)))]


def terms_function(version: str | None):
    """The query terms that match rows written under tokenizer ``version`` (None: a namespace written before the
    version was recorded, so ``WORDS_VERSION``)."""
    if version in (None, WORDS_VERSION):
        return words
    if version == TOKENIZER_VERSION:
        return terms
    raise ConfigError(f"the namespace's rows hold BM25 terms of an unknown BM25 tokenizer version {version!r} "
                      f"(this kbflow writes {TOKENIZER_VERSION!r}): a newer kbflow wrote them. Upgrade kbflow, or "
                      "run `kbflow ingest` over the namespace's sources to rewrite them in this version's terms")


def stored_terms_version(chunkers: list[str]) -> str | None:
    """The tokenizer version every document was chunked with (from their chunker fingerprints, which end with
    ``words=<version>``), or None when they differ or one has no fingerprint (re-planned on the next ingest)."""
    versions = {chunker.rpartition(":words=")[2] if ":words=" in chunker else None for chunker in chunkers}
    return versions.pop() if len(versions) == 1 else None


def tokens_text(text: str) -> str:
    """The stored form: terms joined by single spaces."""
    return " ".join(terms(text))
