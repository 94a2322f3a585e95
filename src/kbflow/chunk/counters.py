"""Token counters for backends whose tokenizer is not a Hugging Face ``tokenizer.json``.

The chunker needs ``count`` (tokens without specials), ``special_tokens`` (what the model adds: [CLS]/[SEP],
<s>/</s>, and the passage prefix when the backend puts one in front) and ``cut`` (a character index where a
token budget ends). A tokenizer that only counts gets ``cut`` by bisection over character positions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, cast

if TYPE_CHECKING:
    from kbflow.chunk.tokens import OffsetTokenCounter, TokenCounter


def bisect_cut(count_one: Callable[[str], int], text: str, max_tokens: int) -> int:
    """Largest ``i`` with ``count_one(text[:i]) <= max_tokens`` (at least 1 for a non-empty text).

    Token counts of prefixes grow with the prefix (up to tokenizer merges at the cut), so bisection finds the
    cut in log2(len(text)) calls."""
    if not text:
        return 0
    if count_one(text) <= max_tokens:
        return len(text)
    low, high = 1, len(text)  # count_one(text[:high]) > max_tokens
    while high - low > 1:
        middle = (low + high) // 2
        if count_one(text[:middle]) <= max_tokens:
            low = middle
        else:
            high = middle
    return low


@dataclass
class FunctionTokenCounter:
    """Counts with ``count_one(text)`` (tokens without specials); ``cut`` by bisection."""

    name: str
    max_tokens: int
    special_tokens: int
    count_one: Callable[[str], int]

    def count(self, texts: list[str]) -> list[int]:
        return [self.count_one(text) for text in texts]

    def cut(self, text: str, max_tokens: int) -> int:
        return bisect_cut(self.count_one, text, max_tokens)


@dataclass
class PrefixedCounter:
    """Another counter, with the tokens of a fixed passage prefix ('passage: ') counted as special tokens, so
    ``count(text) + special_tokens`` is what the model reads for ``prefix + text``."""

    inner: TokenCounter
    prefix_tokens: int

    def __post_init__(self) -> None:
        self.name = f"{self.inner.name}+prefix{self.prefix_tokens}"
        self.max_tokens = self.inner.max_tokens
        self.special_tokens = self.inner.special_tokens + self.prefix_tokens
        self.additive_at_whitespace = getattr(self.inner, "additive_at_whitespace", False)

    def count(self, texts: list[str]) -> list[int]:
        return self.inner.count(texts)

    def cut(self, text: str, max_tokens: int) -> int:
        return self.inner.cut(text, max_tokens)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        # only asked of a counter whose inner one has offsets (the chunker checks for them first)
        return cast("OffsetTokenCounter", self.inner).token_offsets(texts)


def count_key(text: str) -> str:
    """A counted text's key in a ``MemoCounter``: the head of its SHA-256, as a chunk's ``embed_sha256`` starts."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass
class MemoCounter:
    """Another counter, remembering each text's count by its hash: a text counted once (this run, or in a memo
    kept from the last run) is never tokenized again; and, for the chunker, how each block too long for one chunk
    was split. Both are pure functions of the text and the tokenizer, so a memo is only ever filled by one
    tokenizer (``name``) and reuse gives the same counts."""

    inner: TokenCounter
    memo: dict[str, int] = field(default_factory=dict)
    splits: dict[str, list] = field(default_factory=dict)  # a long block's units (kbflow.chunk.chunker.split_long_many)

    def __post_init__(self) -> None:
        self.name = self.inner.name
        self.max_tokens = self.inner.max_tokens
        self.special_tokens = self.inner.special_tokens
        self.additive_at_whitespace = getattr(self.inner, "additive_at_whitespace", False)
        self.tokenized = 0  # texts the inner counter was asked for

    def count(self, texts: list[str]) -> list[int]:
        keys = [count_key(text) for text in texts]
        missing = {key: text for key, text in zip(keys, texts) if key not in self.memo}
        if missing:
            self.memo.update(zip(missing, self.inner.count(list(missing.values()))))
            self.tokenized += len(missing)
        return [self.memo[key] for key in keys]

    def cut(self, text: str, max_tokens: int) -> int:
        return self.inner.cut(text, max_tokens)

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        self.tokenized += len(texts)
        # only asked of a counter whose inner one has offsets (the chunker checks for them first)
        return cast("OffsetTokenCounter", self.inner).token_offsets(texts)
