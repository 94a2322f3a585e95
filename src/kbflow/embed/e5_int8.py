"""The ``e5`` backend's ``int8`` precision: the same dequantised weights, converted once to a CTranslate2 model and
run with int8 matrix products.

CTranslate2 quantises each weight matrix per output row and each activation per token (one scale per row of the
product's input), so no scale is shared between the texts of a batch, unlike onnxruntime's dynamic int8 (one
scale per tensor). What is left is rounding: the float parts (attention, softmax) round differently for another
padded width, and an int8 rounding step turns that into a cosine change of ~5e-4. So a text is padded to a width
that depends on its own length only (``width``: the next multiple of ``WIDTH_STEP``), and a batch holds texts of
one width: a text's vector is then the same, bit for bit, alone or in any batch (tests/unit/test_e5.py).

The converted model is kept in ``<cache_dir>/<weights sha256>-ct2-v<CONVERT_VERSION>/`` (default
$XDG_CACHE_HOME/kbflow/e5-int8), written on first use into a temporary folder and renamed, with ``kbflow.json``
(the sha256 of every file) written before the rename: a folder without it, or whose files do not match it, is
damaged, and is rebuilt.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from kbflow.embed.q4 import dequantise, file_sha256
from kbflow.runtime.environment import user_cache_dir
from kbflow.core.errors import EmbeddingError
from kbflow.core.extras import require

CONVERT_VERSION = 1  # bump when the conversion, WIDTH_STEP or the padding changes what a vector is
WIDTH_STEP = 16  # padded widths: multiples of 16 tokens (measured: 8, 16, 32 run within 10% of each other)
MANIFEST = "kbflow.json"
FEATURE = "embedder.precision 'int8' of backend 'e5'"
log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    return user_cache_dir() / "e5-int8"


def width(length: int) -> int:
    """The padded width of a text of ``length`` tokens: a function of its own length only (module docstring)."""
    return -(-length // WIDTH_STEP) * WIDTH_STEP


def _sha256(path: Path) -> str:
    return file_sha256(path)


def build_spec(model):
    """The CTranslate2 encoder spec of a ``Q4Model`` (q4.read_q4_file), weights dequantised exactly as the torch
    engine does; token type 0 folded into the positions (e5 gives every token type 0)."""
    from ctranslate2.specs import common_spec, transformer_spec

    H, t = model.hidden, model.tensors
    encoder = transformer_spec.TransformerEncoderSpec(model.layers, model.heads, pre_norm=False,
                                                      activation=common_spec.Activation.GELU,  # exact erf GELU
                                                      layernorm_embedding=True)
    spec = transformer_spec.TransformerEncoderModelSpec(encoder)
    encoder.scale_embeddings = False
    encoder.embeddings[0].weight = dequantise(t["emb.word"], H)
    encoder.position_encodings.encodings = t["emb.pos"].reshape(-1, H) + t["emb.type"].reshape(-1, H)[0]
    encoder.layernorm_embedding.gamma, encoder.layernorm_embedding.beta = t["emb.ln.w"], t["emb.ln.b"]
    for n, layer in enumerate(encoder.layer):
        p = f"l{n}."
        attention, ffn = layer.self_attention, layer.ffn
        attention.linear[0].weight = np.concatenate([dequantise(t[p + name], H) for name in ("q.w", "k.w", "v.w")])
        attention.linear[0].bias = np.concatenate([t[p + "q.b"], t[p + "k.b"], t[p + "v.b"]])
        attention.linear[1].weight, attention.linear[1].bias = dequantise(t[p + "ao.w"], H), t[p + "ao.b"]
        attention.layer_norm.gamma, attention.layer_norm.beta = t[p + "aln.w"], t[p + "aln.b"]
        ffn.linear_0.weight, ffn.linear_0.bias = dequantise(t[p + "fi.w"], H), t[p + "fi.b"]
        ffn.linear_1.weight, ffn.linear_1.bias = dequantise(t[p + "fo.w"], model.ffn), t[p + "fo.b"]
        ffn.layer_norm.gamma, ffn.layer_norm.beta = t[p + "oln.w"], t[p + "oln.b"]
    tokens = [f"<{i}>" for i in range(model.vocab)]  # ids go in, never pieces: names only need to be distinct
    spec.register_vocabulary(tokens)
    spec.config.layer_norm_epsilon = model.eps
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = (
        tokens[model.unk], tokens[model.bos], tokens[model.eos])
    return spec


def convert(model, weights_sha256: str, target: Path) -> Path:
    """Write the int8 CTranslate2 model of ``model`` at ``target`` (a folder), atomically."""
    ctranslate2 = require("ctranslate2", FEATURE)
    spec = build_spec(model)
    spec.validate()
    spec.optimize(quantization="int8")
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        building.mkdir()
        spec.save(str(building))
        manifest = {"weights_sha256": weights_sha256, "convert_version": CONVERT_VERSION,
                    "ctranslate2": ctranslate2.__version__,
                    "files": {p.name: _sha256(p) for p in sorted(building.iterdir())}}
        (building / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        if target.exists():  # damaged (checked by the caller): set aside, then replaced
            aside = target.with_name(f".{target.name}.{uuid.uuid4().hex}.damaged")
            os.replace(target, aside)
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.replace(building, target)
        except OSError:
            if not damage(target):  # another process finished the same conversion first: use its folder
                return target
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
    return target


def damage(folder: Path) -> str | None:
    """What is wrong with a cache entry (None: intact): a missing manifest or file, or a file whose sha256 is
    not the one recorded when it was written."""
    try:
        recorded = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"no readable {MANIFEST} ({type(exc).__name__})"
    for name in ("model.bin", "config.json", "vocabulary.json"):
        if name not in recorded:
            return f"{MANIFEST} lists no {name}"
    for name, sha256 in recorded.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if _sha256(path) != sha256:
            return f"{name} does not match its sha256 in {MANIFEST}"
    return None


def ensure_model(model_loader, weights_sha256: str, cache_dir: str | Path | None = None) -> Path:
    """The converted model's folder for these weights, converted on first use and rebuilt if damaged.
    ``model_loader()`` gives the ``Q4Model`` (read only when a conversion is needed)."""
    cache_dir = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    target = cache_dir / f"{weights_sha256[:24]}-ct2-v{CONVERT_VERSION}"
    if target.exists():
        problem = damage(target)
        if problem is None:
            return target
        log.warning("e5 int8 model cache %s is damaged (%s); rebuilding it", target, problem)
    return convert(model_loader(), weights_sha256, target)


class Int8Engine:
    """The forward pass on CTranslate2 int8: mean-pooled vectors of a batch padded to one ``width``."""

    def __init__(self, folder: Path, threads: int | None):
        ctranslate2 = require("ctranslate2", FEATURE)
        self.ctranslate2 = ctranslate2
        try:
            self.encoder = ctranslate2.Encoder(str(folder), device="cpu", compute_type="int8",
                                               intra_threads=threads or 0)
        except (RuntimeError, ValueError) as exc:
            raise EmbeddingError(f"CTranslate2 cannot load the e5 int8 model in {folder}: {exc}; delete that folder "
                                 "and kbflow converts it again on next use") from exc

    def __call__(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Mean-pooled (not yet normalised) vectors of ``ids[B, W]`` (every row padded to the same ``width``)."""
        lengths = mask.sum(axis=1).astype(np.int32)
        StorageView = self.ctranslate2.StorageView
        output = self.encoder.forward_batch(StorageView.from_array(np.ascontiguousarray(ids, dtype=np.int32)),
                                            StorageView.from_array(lengths))
        hidden = np.array(output.last_hidden_state)  # [B, W, H]; rows past a text's length are not its tokens
        weights = mask[..., None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / weights.sum(axis=1)
