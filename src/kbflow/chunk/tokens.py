"""Token counting with the embedding model's own tokenizer, batched.

Counts exclude special tokens; ``special_tokens`` says how many the model adds ([CLS] and [SEP] for BERT),
so a chunk fits when ``count + special_tokens <= max_tokens``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

BATCH = 256


class TokenCounter(Protocol):
    name: str
    max_tokens: int

    @property
    def special_tokens(self) -> int:
        """Tokens the model adds to every text (its special tokens and the passage prefix)."""
        ...

    def count(self, texts: list[str]) -> list[int]: ...

    def cut(self, text: str, max_tokens: int) -> int:
        """Largest character index ``i`` such that ``text[:i]`` holds at most ``max_tokens`` tokens (and ``i > 0``)."""
        ...


class OffsetTokenCounter(TokenCounter, Protocol):
    """A counter that also gives each token's character span (``HFTokenCounter``): the chunker sums counts from
    them where a counter is ``additive_at_whitespace``."""

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]: ...


@dataclass
class HFTokenCounter:
    """Exact counts from a Hugging Face ``tokenizer.json`` (the file a sentence-transformers model ships)."""

    tokenizer_file: Path
    max_tokens: int
    name: str = ""
    special_tokens: int = 2

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.special_tokens = self._tokenizer.num_special_tokens_to_add(is_pair=False)
        if not self.name:
            self.name = f"hf:{Path(self.tokenizer_file).parent.name}"
        # same ids without character offsets, which counting never reads (tokenizers >= 0.21)
        self._encode_batch = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        self.additive_at_whitespace = additive_at_whitespace(json.loads(Path(self.tokenizer_file).read_text("utf-8")))

    def count(self, texts: list[str]) -> list[int]:
        counts: list[int] = []
        for start in range(0, len(texts), BATCH):
            encodings = self._encode_batch(texts[start : start + BATCH], add_special_tokens=False)
            counts.extend(len(encoding.ids) for encoding in encodings)
        return counts

    def token_offsets(self, texts: list[str]) -> list[list[tuple[int, int]]]:
        """Each text's tokens as (start, end) character offsets, specials excluded."""
        spans: list[list[tuple[int, int]]] = []
        for start in range(0, len(texts), BATCH):
            spans.extend(encoding.offsets for encoding in
                         self._tokenizer.encode_batch(texts[start:start + BATCH], add_special_tokens=False))
        return spans

    def cut(self, text: str, max_tokens: int) -> int:
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        if len(offsets) <= max_tokens:
            return len(text)
        # end of the last token that fits; never zero, so a caller always makes progress
        return max(offsets[max(max_tokens, 1) - 1][1], 1)


def additive_at_whitespace(tokenizer: dict) -> bool:
    """Whether ``count(a + w + b) == count(a) + count(b)`` for every ``a``, ``b`` and run ``w`` of spaces, tabs and
    line ends, for the tokenizer described by this ``tokenizer.json``: true of BERT's WordPiece pipeline, whose
    normaliser maps each character on its own (control characters dropped, CJK padded, accents stripped,
    lowercased), whose pre-tokenizer cuts at whitespace (and punctuation) before the model sees a word, and whose
    model reads each word alone; and only when no added token holds whitespace (it could match across the join).
    The same pre-tokenizer splits off every punctuation mark, so counts add up after one as well (the chunker
    relies on both: ``kbflow.chunk.chunker._count_from_offsets``).
    Anything else (SentencePiece's Metaspace, byte-level BPE) is not assumed additive: its chunks are counted."""
    normalizer, pre_tokenizer, model = (tokenizer.get(key) or {} for key in ("normalizer", "pre_tokenizer", "model"))
    return (normalizer.get("type") == "BertNormalizer" and pre_tokenizer.get("type") == "BertPreTokenizer"
            and model.get("type") == "WordPiece"
            and not any(re.search(r"\s", token.get("content", "")) for token in tokenizer.get("added_tokens") or []))


CJK_RE = re.compile(r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
PIECE_RE = re.compile(
    r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"  # one CJK char
    r"|[A-Za-z]{1,4}"  # a word piece of at most four letters
    r"|\d{1,3}"  # digits in groups of three
    r"|[^\sA-Za-z\d]"  # each punctuation mark or symbol
)


@dataclass
class EstimateTokenCounter:
    """A documented estimate for remote models whose tokenizer we cannot run: every CJK character is one token,
    letters count one token per four (a word-piece-like rule: 'identifier.call(a,b)' is 10, not 1), digits one
    per three, each punctuation mark one. It over-counts English slightly, which keeps chunks under the limit."""

    max_tokens: int
    name: str = "estimate-cjk-v1"
    special_tokens: int = 0

    def count(self, texts: list[str]) -> list[int]:
        return [len(PIECE_RE.findall(text)) for text in texts]

    def cut(self, text: str, max_tokens: int) -> int:
        end = 0
        for index, match in enumerate(PIECE_RE.finditer(text)):
            if index >= max_tokens:
                break
            end = match.end()
        return max(end, 1) if text else 0
