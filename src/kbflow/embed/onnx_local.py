"""The fast CPU path for a sentence-transformers BERT model: int8 ONNX run by onnxruntime.

The ONNX file is exported once, offline, from the model folder's own weights (torch.onnx, then onnxruntime's
dynamic int8 quantisation of the MatMul weights) into ``<cache_dir>/<model sha256>-v<EXPORT_VERSION>/``, on first
use, written to a temporary name and renamed so a crash never leaves half a file. Mean pooling and L2
normalisation are done here, as the model's Pooling/Normalize modules do. The int8 model's vectors differ from
fp32 ones, so it has its own ``model_id`` (``onnx-int8:...``) and its own cache table; ``kbflow bench embed``
reports its cosine to fp32 on real text (kept only while >= 0.99).
"""

from __future__ import annotations

from typing import cast

import hashlib
import os
import threading
import uuid
from pathlib import Path

import numpy as np

from kbflow.embed.local import LocalEmbedder, read_model_json
from kbflow.runtime.environment import user_cache_dir
from kbflow.core.errors import ConfigError
from kbflow.core.extras import require
from kbflow.config import embedders as sections

EXPORT_VERSION = 1


def default_cache_dir() -> Path:
    return user_cache_dir() / "onnx"


def weights_sha256(model_dir: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("pytorch_model.bin"))
    if not files:
        raise ConfigError(f"model folder {str(model_dir)!r} holds no *.safetensors or pytorch_model.bin to export")
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def export_int8(model_dir: Path, target: Path) -> Path:
    """Export ``model_dir``'s transformer to ONNX and quantise it to int8 at ``target`` (atomic)."""
    import torch

    feature = "embedder.backend 'onnx' (the int8 export)"
    require("onnx", feature)  # torch.onnx.export and onnxruntime's quantize_dynamic write the graph with it
    AutoModel = require("transformers", feature).AutoModel
    from onnxruntime.quantization import QuantType, quantize_dynamic

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    bert = AutoModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()

    class LastHiddenState(torch.nn.Module):
        """Embeddings then encoder, with the additive padding mask built here: tracing BertModel.forward itself
        folds its mask logic into constants for the example batch, and padded tokens then leak into attention."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            hidden = self.model.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
            additive = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * torch.finfo(hidden.dtype).min
            return self.model.encoder(hidden, attention_mask=additive).last_hidden_state

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_fp32 = target.with_name(f".{uuid.uuid4().hex}.fp32.onnx")
    tmp_int8 = target.with_name(f".{uuid.uuid4().hex}.int8.onnx")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = torch.ones((2, 8), dtype=torch.long)
    try:
        with torch.no_grad():
            torch.onnx.export(LastHiddenState(bert), (example, example, torch.zeros_like(example)), str(tmp_fp32),
                              input_names=names, output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                              dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names + ["last_hidden_state"]})
        # per-channel weight scales: per-tensor int8 left MiniLM at cosine 0.81-0.95 to fp32, per-channel at ~0.99
        quantize_dynamic(str(tmp_fp32), str(tmp_int8), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True)
        os.replace(tmp_int8, target)
    finally:
        for leftover in (tmp_fp32, tmp_int8):
            leftover.unlink(missing_ok=True)
    return target


def ensure_int8_model(model_dir: Path, cache_dir: Path | None = None) -> Path:
    """The int8 ONNX file for ``model_dir``, exported on first use (keyed by the weights' sha256)."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    target = cache_dir / f"{weights_sha256(model_dir)[:24]}-v{EXPORT_VERSION}" / "model-int8.onnx"
    if not target.is_file():
        export_int8(model_dir, target)
    return target


class OnnxInt8Embedder(LocalEmbedder):
    """Same folder, tokenizer, limits and prefixes as ``LocalEmbedder``; int8 ONNX inference."""

    @classmethod
    def from_section(cls, c: sections.OnnxEmbedder) -> OnnxInt8Embedder:  # type: ignore[override]
        return cls(c.model_path, batch_size=c.batch_size, cache_dir=c.onnx_cache_dir, threads=c.threads,
                   query_prefix=c.query_prefix or "", passage_prefix=c.passage_prefix or "")

    backend = "onnx-int8"

    def __init__(self, model_path: str | None = None, batch_size: int = 64, cache_dir: str | None = None,
                 threads: int | None = None, query_prefix: str = "", passage_prefix: str = ""):
        super().__init__(model_path, batch_size, "cpu", query_prefix, passage_prefix)
        self.model_id = self.model_id.replace(";dim=", f"+export-v{EXPORT_VERSION};dim=", 1)
        pooling = cast(dict, read_model_json(self.model_dir / "1_Pooling" / "config.json")) \
            if (self.model_dir / "1_Pooling" / "config.json").is_file() else {}
        if not pooling.get("pooling_mode_mean_tokens") or any(
                value for key, value in pooling.items() if key.startswith("pooling_mode_") and key != "pooling_mode_mean_tokens"):
            raise ConfigError(f"embedder.backend 'onnx' supports mean-pooling models only; {str(self.model_dir)!r} "
                              "pools otherwise. Use embedder.backend 'local' for it")
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.threads = threads
        self._session = None
        self._tokenizer = None
        self._session_lock = threading.Lock()

    def _load(self):
        with self._session_lock:
            if self._session is None:
                import onnxruntime
                from tokenizers import Tokenizer

                path = ensure_int8_model(self.model_dir, self.cache_dir)
                options = onnxruntime.SessionOptions()
                if self.threads:
                    options.intra_op_num_threads = self.threads
                self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
                tokenizer.no_truncation()  # over-long texts are refused before, never cut here
                tokenizer.enable_padding()
                self._tokenizer = tokenizer
        return self._session

    def _encode(self, texts: list[str], is_query: bool) -> np.ndarray:
        session = self._load()
        tokenizer = self._tokenizer
        if tokenizer is None:  # _load sets it
            raise RuntimeError("kbflow: the ONNX embedder's tokenizer was not loaded")
        prefix = self.query_prefix if is_query else self.passage_prefix
        texts = [prefix + text for text in texts] if prefix else texts
        order = np.argsort([len(text) for text in texts])  # similar lengths together: less padding
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), self.batch_size):
            index = order[start:start + self.batch_size]
            encodings = tokenizer.encode_batch([texts[i] for i in index])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            types = np.array([e.type_ids for e in encodings], dtype=np.int64)
            with self._encode_lock:  # as for torch: one forward pass at a time, it uses every core itself
                hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types})[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out[index] = pooled
        return out
